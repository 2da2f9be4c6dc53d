"""NodeEngine ``allreduce(..., discard=True)``: a reduce's nodes leave their work buffer alone (engines in threads)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_util import close_all, make_engines, run_all
from test_engine import inputs, reference

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce.types import Fingerprint, OpStats

SENTINEL = 7


@pytest.mark.parametrize("n,root,op,dtype", [(2, 0, "sum", "float32"), (2, 1, "avg", "float32"),
                                              (3, 2, "max", "int32"), (5, 3, "sum", "float32"),
                                              (4, 0, "sum", "int64")])
def test_discarding_nodes_leave_work_alone_and_the_root_gets_the_allreduces_bits(n: int, root: int, op: str,
                                                                                 dtype: str) -> None:
    """The worker's streamed reduce: every node's ranks are the inputs, ``work`` is scratch that no
    node wants, and only the root's node has a mirror (the root rank's buffer).  The mirror gets
    the bits an allreduce of the same inputs gives, and no node's ``work`` is written."""
    k, count = 2, 20011
    dt = np.dtype(dtype)
    engines = make_engines(n, block_bytes=1024)
    try:
        ranks = [inputs(k, count, dt, seed=10 * i + root) for i in range(n)]
        before = [[r.copy() for r in node] for node in ranks]
        works = [np.full(count, SENTINEL, dt) for _ in range(n)]
        outs = [np.zeros(count, dt) for _ in range(n)]
        fp = Fingerprint("c", 0, op, dtype, count)
        res = run_all([lambda i=i: engines[i].allreduce(works[i], op, fp, inputs=ranks[i], discard=True, avg_divisor=n * k,
                                                        mirrors=[outs[i]] if i == root else [])
                       for i in range(n)], 30)
        assert all(isinstance(r, OpStats) and r.algorithm == "tree" for r in res), res
        assert all((w == SENTINEL).all() for w in works), "a discarding node wrote its work buffer"
        assert all(not o.any() for i, o in enumerate(outs) if i != root)
        for node, old in zip(ranks, before, strict=True):
            assert all(np.array_equal(r, o) for r, o in zip(node, old, strict=True)), "an input changed"
        # the allreduce of the same inputs into work buffers of their own: the same bits
        full = [np.zeros(count, dt) for _ in range(n)]
        fp1 = Fingerprint("c", 1, op, dtype, count)
        res = run_all([lambda i=i: engines[i].allreduce(full[i], op, fp1, inputs=ranks[i], avg_divisor=n * k)
                       for i in range(n)], 30)
        assert all(isinstance(r, OpStats) for r in res), res
        assert outs[root].tobytes() == full[0].tobytes()
        ref = reference([r for node in ranks for r in node], op)
        if dt.kind == "f":
            np.testing.assert_allclose(outs[root].astype(np.float64), ref, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(outs[root].astype(np.int64), ref)
    finally:
        close_all(engines)


def test_the_ring_ignores_discard_and_still_fills_the_mirrors() -> None:
    """Over the ring a node's pieces live in ``work``: ``discard`` cannot spare it, the result
    still reaches the mirrors."""
    n, k, count = 3, 2, 20011
    engines = make_engines(n, block_bytes=1024, ring_piece_bytes=4096, algorithm="ring")
    try:
        ranks = [inputs(k, count, np.dtype(np.float32), seed=40 + i) for i in range(n)]
        works = [np.zeros(count, np.float32) for _ in range(n)]
        outs = [np.zeros(count, np.float32) for _ in range(n)]
        fp = Fingerprint("c", 0, "sum", "float32", count)
        res = run_all([lambda i=i: engines[i].allreduce(works[i], "sum", fp, inputs=ranks[i], mirrors=[outs[i]],
                                                        discard=True) for i in range(n)], 30)
        assert all(isinstance(r, OpStats) and r.algorithm == "ring" for r in res), res
        assert all(o.tobytes() == outs[0].tobytes() for o in outs)
        ref = reference([r for node in ranks for r in node], "sum")
        np.testing.assert_allclose(outs[0].astype(np.float64), ref, rtol=1e-5, atol=1e-5)
    finally:
        close_all(engines)


def test_discard_is_refused_for_an_op_that_does_not_stream() -> None:
    engines = make_engines(2)
    try:
        small = np.zeros(16, np.float32)  # inline: not streamed
        with pytest.raises(InvalidArgument, match="discard"):
            engines[0].allreduce(small, "sum", Fingerprint("c", 0, "sum", "float32", 16), discard=True)
    finally:
        close_all(engines)
