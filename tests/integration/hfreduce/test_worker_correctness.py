"""Correctness of real workers + forked ranks: every op and dtype over 1-5 nodes x 1-3 local ranks.

Each configuration starts ``n`` worker processes (chunk 1 KiB, so a 1001-element op is
several chunks and the 40000-element one is not a multiple of the chunk) and one
process that forks the ranks.  Checked: integers, max and min exact; float sums close
to a float64 reference (one rounding for the low-precision formats); broadcast bit
for bit (random bit patterns: NaN payloads, -0.0); identical bits on every rank; the
same bits across two runs; no shared-memory segment left behind.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from hfr_cluster import Cluster
from hfr_rank_prog import cases, input_for

from fireflyer.hfreduce.shm import list_segments

#: configurations that also run sizes 0/1/40000, the 16 MiB op and torch tensors
FULL = {(1, 3), (3, 2)}
CONFIGS = [(n, k) for n in range(1, 6) for k in range(1, 4)]


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _eps(dt: np.dtype) -> tuple[float, float]:
    fi = ml_dtypes.finfo(dt) if dt not in (np.float16, np.float32) else np.finfo(dt)
    return float(fi.eps), float(fi.smallest_subnormal)


def check_results(res: dict[int, dict[str, np.ndarray]], world: int, full: bool) -> None:
    for i, case in enumerate(cases(full)):
        kind, op, dtn, n, root = case
        dt = _dtype(dtn)
        inputs = [input_for(case, i, r, world) for r in range(world)]
        outs = [res[r][f"c{i}"].view(dt) for r in range(world)]
        what = f"case {i} {case}"
        if kind == "allgather":  # rank r's bytes at [r*n, (r+1)*n) on every rank, bit for bit
            want = b"".join(x.tobytes() for x in inputs)
            for r in range(world):
                assert outs[r].tobytes() == want, f"{what}: rank {r}"
            continue
        if kind == "reduce_scatter":
            # each rank's share: the bits of the allreduce's slice; and that slice checked below
            for r in range(world):
                assert outs[r].tobytes() == res[r][f"c{i}_allreduce"].tobytes(), f"{what}: rank {r} vs allreduce"
            got = np.concatenate(outs)
            n = n * world
        elif kind == "broadcast":
            for r in range(world):
                assert outs[r].tobytes() == inputs[world - 1].tobytes(), f"{what}: rank {r}"
            continue
        if kind == "reduce":
            dst = world - 1 if root == -2 else root
            for r in range(world):
                assert r == dst or outs[r].tobytes() == inputs[r].tobytes(), f"{what}: non-root {r} was modified"
            got = outs[dst]
        elif kind == "allreduce":
            for r in range(1, world):
                assert outs[r].tobytes() == outs[0].tobytes(), f"{what}: rank {r} differs from rank 0"
            got = outs[0]
        assert got.shape == (n,)
        if dt.kind in "iu":
            stack = np.stack(inputs).astype(np.int64) if n else np.zeros((world, 0), np.int64)
            ref = {"sum": stack.sum(0), "avg": np.floor_divide(stack.sum(0), world), "max": stack.max(0),
                   "min": stack.min(0)}[op]
            assert np.array_equal(got.astype(np.int64), ref), what
            continue
        stack = np.stack(inputs).astype(np.float64) if n else np.zeros((world, 0))
        if op in ("max", "min"):
            ref = stack.max(0) if op == "max" else stack.min(0)
            assert np.array_equal(got.astype(np.float64), ref), what
            continue
        ref = stack.sum(0) / (world if op == "avg" else 1)
        mag = np.abs(stack).sum(0) / (world if op == "avg" else 1)
        eps, tiny = _eps(dt)
        tol = (eps if dt != np.float32 else 0) * np.abs(ref) + 1e-6 * mag + tiny
        err = np.abs(got.astype(np.float64) - ref)
        assert np.all(err <= tol), f"{what}: max err {err.max()} (tol {tol[np.argmax(err - tol)]})"
    extra_checks(res, world)


def extra_checks(res: dict[int, dict[str, np.ndarray]], world: int) -> None:
    tri = world * (world + 1) // 2
    for r in range(world):
        z = res[r]["zero_copy"].view(np.float32)
        assert np.array_equal(z, np.arange(3001, dtype=np.float32) * world + world * (world - 1) // 2)
        assert np.all(res[r]["async_max"].view(np.int64) == world)
        if "torch_f32" in res[r]:
            assert np.array_equal(res[r]["torch_f32"].view(np.float32), np.arange(513, dtype=np.float32) * tri)
            bf = res[r]["torch_bf16"].view(ml_dtypes.bfloat16).astype(np.float32)
            assert np.all(bf == np.float32(ml_dtypes.bfloat16(tri / world)))
            assert np.all(res[r]["torch_copy"].view(np.float32) == world * (world - 1) // 2)


def run_matrix(nnodes: int, k: int, full: bool, env: dict[str, str] | None = None,
               algorithms: set[str] | None = None) -> dict[int, dict[str, np.ndarray]]:
    """Every rank's results; ``algorithms``: how rank 0's recent ops crossed the nodes (filled in)."""
    cluster = Cluster(nnodes, k, chunk="1k", env=env).start()
    world = nnodes * k
    out: dict[int, dict[str, np.ndarray]] = {}
    try:
        run = cluster.ranks("matrix", full=full, torch=full, timeout_s=120)
        outcomes = run.results()
        for r in range(world):
            if (run.out / f"rank{r}.npz").exists():
                with np.load(run.out / f"rank{r}.npz") as f:
                    out[r] = {key: f[key] for key in f.files}
    finally:
        codes = cluster.stop()
    assert sorted(outcomes) == list(range(world)), "\n".join(run.lines)
    bad = {r: o for r, o in outcomes.items() if not o["ok"]}
    assert not bad, bad
    assert codes == [0] * nnodes, codes
    if algorithms is not None:
        algorithms.update(outcomes[0]["algorithms"])
    if full:
        has_torch = all(o["torch"] for o in outcomes.values())
        if not has_torch and os.environ.get("CI"):
            pytest.fail("torch is not installed in CI (make setup installs it)")
        o = outcomes[0]
        assert o["phases"] == ["done"] and o["recent"] > 0
        assert {"arrivals", "local_reduce_s", "tree_s", "writeback_s", "stats", "phase"} <= set(o["record_fields"])
    return out


@pytest.mark.parametrize(("nnodes", "k"), CONFIGS, ids=[f"{n}nodes-{k}ranks" for n, k in CONFIGS])
def test_worker_allreduce_matrix(nnodes: int, k: int) -> None:
    full = (nnodes, k) in FULL
    res = run_matrix(nnodes, k, full)
    check_results(res, nnodes * k, full)
    assert list_segments() == []


RING_CONFIGS = [(3, 2), (4, 1), (5, 3)]


@pytest.mark.parametrize(("nnodes", "k"), RING_CONFIGS, ids=[f"{n}nodes-{k}ranks" for n, k in RING_CONFIGS])
def test_worker_allreduce_matrix_on_the_ring(nnodes: int, k: int) -> None:
    """``FF_HFREDUCE_ALGORITHM=ring``: the float32 and integer ops above the 1 KiB chunk go around
    the ring (the local ranks' buffers as the engine's inputs and mirrors); the rest, the trees."""
    full = (nnodes, k) == (3, 2)
    used: set[str] = set()
    res = run_matrix(nnodes, k, full, env={"FF_HFREDUCE_ALGORITHM": "ring"}, algorithms=used)
    check_results(res, nnodes * k, full)
    assert used == {"ring", "tree"}, used  # (the recent ops end with small ones: the barrier's, on the trees)
    assert list_segments() == []


def test_worker_same_bits_across_runs() -> None:
    a = run_matrix(2, 2, False)
    b = run_matrix(2, 2, False)
    for r in a:
        for key in a[r]:
            if key.startswith("c"):
                assert a[r][key].tobytes() == b[r][key].tobytes(), (r, key)
    assert list_segments() == []


def _ranks_ok(nnodes: int, k: int, mode: str, timeout_s: float = 60) -> dict[int, dict]:
    """Run rank program ``mode`` on a fresh ``nnodes`` x ``k`` cluster: every rank ends ok, every
    worker exits 0, no shared memory is left behind; the ranks' outcomes."""
    cluster = Cluster(nnodes, k, chunk="64k").start()
    try:
        res = cluster.ranks(mode, timeout_s=timeout_s).results()
    finally:
        codes = cluster.stop()
    assert sorted(res) == list(range(nnodes * k)) and all(o["ok"] for o in res.values()), res
    assert codes == [0] * nnodes
    assert list_segments() == []
    return res


@pytest.mark.parametrize(("nnodes", "k"), [(2, 1), (3, 2)], ids=["2nodes-1rank", "3nodes-2ranks"])
def test_small_ops_in_flight_by_the_thousand_are_posted_and_stay_in_order(nnodes: int, k: int) -> None:
    """1,500 small async allreduces (and broadcasts, barriers) in flight at once: the worker posts
    them (the thread that completes one releases its ranks and runs the next: no nesting, whatever
    the stream's length) and every result is right."""
    res = _ranks_ok(nnodes, k, "stream", timeout_s=120)
    for o in res.values():
        assert o["posted_ops"] > 1000, o
        # the allreduces (a third of the stream) take the express path: an exchange between two
        # nodes, up and down tree 0 beyond
        assert o["express_ops"] > 400, o


@pytest.mark.parametrize(("nnodes", "k"), [(2, 2), (3, 2)], ids=["2nodes-2ranks", "3nodes-2ranks"])
def test_small_broadcasts_and_reduces_take_the_express_path_from_any_root(nnodes: int, k: int) -> None:
    """Every rank in turn the root of a 6-byte float16 broadcast (random bits: not whole words), a
    bfloat16 avg reduce and an int64 max reduce: the right bits where they belong, the other ranks'
    buffers untouched by a reduce, and every op went express (an exchange between two nodes, up and
    down tree 0 beyond)."""
    res = _ranks_ok(nnodes, k, "small_kinds")
    assert all(o["express_ops"] == 3 * nnodes * k for o in res.values()), res


@pytest.mark.parametrize(("nnodes", "k"), [(2, 1), (3, 2)], ids=["2nodes-1rank", "3nodes-2ranks"])
def test_barriers_take_the_express_path_and_release_nobody_before_the_last_arrives(nnodes: int, k: int) -> None:
    """Five barriers, rank ``r`` arriving ``r`` x 30 ms late at each: every rank leaves each barrier
    after the last one arrived, and the barriers went express (an exchange of nothing between two
    nodes, up and down tree 0 beyond)."""
    res = _ranks_ok(nnodes, k, "barriers")
    world = nnodes * k
    for b in range(5):
        last_in = max(res[r]["times"][b][0] for r in range(world))
        for r in range(world):
            assert res[r]["times"][b][1] >= last_in, (b, r, res[r]["times"][b], last_in)
    assert all(o["express_ops"] == 5 for o in res.values()), res
