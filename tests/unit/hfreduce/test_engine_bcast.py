"""NodeEngine.broadcast: the root's bytes flooded over both trees, each edge once (``_bcast``)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from engine_util import close_all, make_engines, run_all

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce.errors import CollectiveTimeout, FingerprintMismatch, HFReduceError
from fireflyer.hfreduce.types import Fingerprint

CHUNK = 4096  # make_engines' chunk_bytes: a few chunks per tree below


def _fp(count: int, seq: int = 0, root: int = 0) -> Fingerprint:
    return Fingerprint("c", seq, "sum", "uint8", count, "broadcast", root)


def _bcast_all(engines, bufs, root_node: int, fps=None, on_finals=None, **kw):  # type: ignore[no-untyped-def]
    """Broadcast from node ``root_node`` on every engine at once; results or exceptions, in order.
    ``on_finals[i]`` gets node ``i``'s final ranges as ``(start, stop)`` tuples."""
    def call(i: int):  # type: ignore[no-untyped-def]
        fp = fps[i] if fps is not None else _fp(bufs[i].size)
        on_final = None if on_finals is None else (lambda a, b, f=on_finals[i]: f((a, b)))
        return lambda: engines[i].broadcast(bufs[i], fp, root=i == root_node, on_final=on_final, **kw)

    return run_all([call(i) for i in range(len(engines))], 30)


def _allreduce_all(engines, arrs, seq: int):  # type: ignore[no-untyped-def]
    def call(i: int):  # type: ignore[no-untyped-def]
        return lambda: engines[i].allreduce(arrs[i], "sum", Fingerprint("c", seq, "sum", "float32", arrs[i].size))

    return run_all([call(i) for i in range(len(engines))], 30)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_every_node_gets_the_roots_bytes_from_any_root_and_each_edge_carries_them_once(n: int) -> None:
    engines = make_engines(n, inline_bytes=1024)
    try:
        for seq, nbytes in enumerate([5 * CHUNK + 3, 1025, 7]):  # several chunks per tree, one, a sliver
            for root in range(n):
                rng = np.random.default_rng([n, seq, root])
                data = rng.integers(0, 256, nbytes, dtype=np.uint8)
                bufs = [data.copy() if i == root else np.full(nbytes, 0xEE, np.uint8) for i in range(n)]
                finals: list[list[tuple[int, int]]] = [[] for _ in range(n)]
                fp = _fp(nbytes, seq=seq * n + root, root=root)
                res = _bcast_all(engines, bufs, root, [fp] * n, on_finals=[f.append for f in finals])
                assert not [r for r in res if isinstance(r, BaseException)], res
                for i in range(n):
                    assert bufs[i].tobytes() == data.tobytes(), (n, nbytes, root, i)
                    # on_final covered every byte exactly once
                    got = np.zeros(nbytes, np.int64)
                    for lo, hi in finals[i]:
                        got[lo:hi] += 1
                    assert np.all(got == 1), (i, finals[i])
                # every node but the root received the buffer once; in all, (n - 1) buffers were sent,
                # where the allreduce-based broadcast sent about 2 (n - 1)
                sent = [sum(p.bytes_sent for p in r.peers.values()) for r in res]
                recv = [sum(p.bytes_received for p in r.peers.values()) for r in res]
                assert sum(sent) == (n - 1) * nbytes, (sent, recv)
                assert recv == [0 if i == root else nbytes for i in range(n)], recv
                assert sent[root] > 0
    finally:
        close_all(engines)


def test_a_broadcast_between_allreduces_and_back_to_back() -> None:
    engines = make_engines(3, inline_bytes=1024)
    try:
        n, size = 3, 20000
        for k in range(6):
            if k % 2:
                arrs = [np.full(size, i + 1, np.float32) for i in range(n)]
                res = _allreduce_all(engines, arrs, k)
                assert all(np.all(a == 6) for a in arrs), res
            else:
                data = np.arange(size, dtype=np.int32) * (k + 1)
                bufs = [data.copy() if i == k % n else np.zeros(size, np.int32) for i in range(n)]
                fps = [Fingerprint("c", k, "sum", "int32", size, "broadcast", k % n)] * n
                res = _bcast_all(engines, bufs, k % n, fps)
                assert not [r for r in res if isinstance(r, BaseException)], res
                assert all(np.array_equal(b, data) for b in bufs)
    finally:
        close_all(engines)


@pytest.mark.parametrize("what", ["allreduce", "root", "count", "two_roots"])
@pytest.mark.parametrize("n", [2, 4])
def test_nodes_that_disagree_on_a_broadcast_fail_everywhere_in_time(what: str, n: int) -> None:
    """Node ``bad`` runs an allreduce, names another root, broadcasts a different count, or also
    claims to hold the root: every node fails with an error (a mismatch naming both fingerprints
    where they differ), well before the deadline."""
    bad, root, size = n - 1, 0, 3 * CHUNK
    engines = make_engines(n, inline_bytes=1024, timeout_s=10)
    try:
        fns = []
        for i in range(n):
            b = np.zeros(size, np.uint8)
            fp = _fp(size)
            if i == bad and what == "allreduce":
                a = np.ones(size // 4, np.float32)
                fns.append(lambda e=engines[i], a=a: e.allreduce(a, "sum", Fingerprint("c", 0, "sum", "float32",
                                                                                       a.size)))
                continue
            if i == bad and what == "root":
                fp = _fp(size, root=1)
            if i == bad and what == "count":
                b, fp = np.zeros(size + 1, np.uint8), _fp(size + 1)
            holds = i == root or (i == bad and what == "two_roots")
            fns.append(lambda e=engines[i], b=b, fp=fp, h=holds: e.broadcast(b, fp, root=h, deadline_s=8))
        t0 = time.monotonic()
        res = run_all(fns, 20)
        assert time.monotonic() - t0 < 5, res
        assert all(isinstance(r, HFReduceError) for r in res), res
        if what != "two_roots":
            assert all(isinstance(r, FingerprintMismatch) for r in res), res
            for i in range(n - 1):
                assert res[i].peer == bad, (i, res[i])
        else:
            assert any("more than one node hold the root" in str(r) for r in res), res
        with pytest.raises(HFReduceError):  # the engines are dead afterwards
            engines[0].broadcast(np.zeros(size, np.uint8), _fp(size, seq=1), root=True)
    finally:
        close_all(engines)


def test_a_node_that_never_calls_is_named_within_the_deadline() -> None:
    n, sleeper, size = 4, 2, 3 * CHUNK
    engines = make_engines(n, inline_bytes=1024, timeout_s=10)
    try:
        deadline = 1.0
        fns = [None if i == sleeper else
               (lambda e=engines[i], r=i == 0: e.broadcast(np.zeros(size, np.uint8), _fp(size), root=r,
                                                            deadline_s=deadline)) for i in range(n)]
        t0 = time.monotonic()
        res = run_all(fns, deadline + 6)
        assert time.monotonic() - t0 < deadline + 2
        for i, r in enumerate(res):
            if i == sleeper:
                continue
            assert isinstance(r, HFReduceError), r
        named = [r for i, r in enumerate(res) if i != sleeper and isinstance(r, CollectiveTimeout)]
        assert named and all(r.peer == sleeper for r in named), res
        assert all(f"node {sleeper}" in str(r) for r in res if r is not None), res
        assert all("broadcast start phase" in str(r) for r in named), named  # (it never announced the op)
    finally:
        close_all(engines)


def test_bad_calls_are_refused_and_leave_the_engine_usable() -> None:
    engines = make_engines(2, inline_bytes=1024)
    try:
        with pytest.raises(InvalidArgument, match="broadcast's fingerprint"):
            engines[0].broadcast(np.zeros(10, np.uint8), Fingerprint("c", 0, "sum", "uint8", 10), root=True)
        with pytest.raises(InvalidArgument, match="writable 1-D"):
            engines[0].broadcast(np.zeros((2, 5), np.uint8), _fp(10), root=True)
        bufs = [np.arange(5000, dtype=np.uint8), np.zeros(5000, np.uint8)]
        res = _bcast_all(engines, bufs, 0)
        assert not [r for r in res if isinstance(r, BaseException)], res
        assert np.array_equal(bufs[1], np.arange(5000, dtype=np.uint8))
    finally:
        close_all(engines)
