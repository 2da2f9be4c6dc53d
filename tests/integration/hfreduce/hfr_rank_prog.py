"""Rank programs for the HFReduce worker/client integration tests.

Run as a script, it imports the client once and forks one child per rank (so a test
with 15 ranks pays for one interpreter start); each child joins the communicator with
explicit arguments, runs ``--mode`` and writes ``<out>/rank<R>.json`` (outcome) and,
for ``matrix``, ``<out>/rank<R>.npz`` (every result).  The tests import :func:`cases`
and :func:`make_input` to compute the expected values.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

import ml_dtypes
import numpy as np

DTYPES = ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int32", "int64"]
OPS = ["sum", "avg", "max", "min"]
LARGE = 4 << 20  # float32 elements: 16 MiB
#: elements of a broadcast / reduce too large for the express path in any dtype (> 64 KiB of float8);
#: odd, so that the byte sizes of float16 and float8 are not whole int32 words (the padded path)
BEYOND_EXPRESS = 70_001
_op_t0 = [0.0]  # monotonic start of the op a fault test expects to fail


def _say(line: str) -> None:
    """One write per line: the forked ranks share one stdout pipe, and print() may split a line."""
    os.write(1, (line + "\n").encode())


def _mark() -> None:
    _op_t0[0] = time.monotonic()


def cases(full: bool) -> list[tuple[str, str, str, int, int]]:
    """(name, kind, op, dtype, count, root) cases, as tuples (kind, op, dtype, count, root)."""
    out: list[tuple[str, str, str, int, int]] = []
    sizes = [0, 1, 1001, 40000] if full else [1001]
    for dt in DTYPES:
        for op in OPS:
            for n in sizes:
                out.append(("allreduce", op, dt, n, -1))
    for n in ([0, 1] if not full else []):
        out.append(("allreduce", "sum", "float32", n, -1))
    for dt in DTYPES:
        for n in (1001, BEYOND_EXPRESS):  # the express path across nodes, then the engine's
            out.append(("broadcast", "sum", dt, n, -2))  # -2: the last rank
            out.append(("reduce", "sum", dt, n, 0))
    for dt in ("float32", "int32"):  # streamed: the root's node works in the root's buffer or apart from it
        out.append(("reduce", "avg", dt, BEYOND_EXPRESS, -2))
    if full:
        out.append(("allreduce", "sum", "float32", LARGE, -1))
    # the sharded-training pair; n is each rank's share (odd: not whole chunks, nor whole words)
    for dt in DTYPES:
        for n in ([0, 1, 333, BEYOND_EXPRESS] if full else [333]):
            out.append(("allgather", "sum", dt, n, -1))
        for op in OPS:
            out.append(("reduce_scatter", op, dt, 333, -1))
    for n in ((1, BEYOND_EXPRESS) if full else ()):  # one element each, and beyond the express size
        out.append(("reduce_scatter", "sum", "float32", n, -1))
        out.append(("reduce_scatter", "avg", "bfloat16", n, -1))
    return out


def input_for(case: tuple[str, str, str, int, int], index: int, rank: int, world: int) -> np.ndarray:
    """Rank ``rank``'s input of case ``index``: a reduce_scatter's has ``world`` shares."""
    kind, op, dt, n, root = case
    if kind == "reduce_scatter":
        return make_input((kind, op, dt, n * world, root), index, rank)
    return make_input(case, index, rank)


def make_input(case: tuple[str, str, str, int, int], index: int, rank: int) -> np.ndarray:
    kind, op, dt, n, _ = case
    rng = np.random.default_rng([index, rank])
    dtype = np.dtype(getattr(ml_dtypes, dt, None) or dt)
    if dtype.kind in "iu":
        return rng.integers(-1000, 1000, n).astype(dtype)
    if kind in ("broadcast", "allgather"):
        bits = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)  # any bits: NaN payloads, -0.0
        return bits.view(dtype)
    scale = 4.0 if dt.startswith("float8") else 100.0
    return (rng.standard_normal(n, dtype=np.float32) * scale).astype(dtype)


def _matrix(comm: Any, out: str, full: bool) -> dict[str, Any]:
    results: dict[str, np.ndarray] = {}
    for i, case in enumerate(cases(full)):
        kind, op, dt, n, root = case
        x = input_for(case, i, comm.rank, comm.world_size)
        if root == -2:
            root = comm.world_size - 1
        if kind in ("allgather", "reduce_scatter"):
            before = x.copy()
            res = np.empty(n * comm.world_size if kind == "allgather" else n, x.dtype)
            if kind == "allgather":
                assert comm.allgather(res, x) is res
            else:
                assert comm.reduce_scatter(res, x, op=op) is res
                # the allreduce of the same input, this rank's slice: the same bits (see the docstring)
                ref = before.copy()
                comm.allreduce(ref, op=op)
                results[f"c{i}_allreduce"] = ref[comm.rank * n:(comm.rank + 1) * n].view(np.uint8)
            assert x.tobytes() == before.tobytes(), f"case {i}: {kind} modified its input"
            results[f"c{i}"] = res.view(np.uint8)
            continue
        if kind == "allreduce":
            comm.allreduce(x, op=op)
        elif kind == "reduce":
            comm.reduce(x, root, op=op)
        else:
            comm.broadcast(x, root)
        results[f"c{i}"] = x.view(np.uint8)
    # zero copy, async, torch: float32 sum of rank+1 and index-dependent values
    z = comm.zeros(3001, "float32")
    z[:] = np.arange(3001, dtype=np.float32) + comm.rank
    w1 = comm.allreduce(z, op="sum", async_op=True)
    y = np.full(777, comm.rank + 1, dtype=np.int64)
    w2 = comm.allreduce(y, op="max", async_op=True)
    assert w2.wait(30) is y and w1.wait(30) is z and w1.is_completed() and w2.is_completed()
    results["zero_copy"] = np.array(z).view(np.uint8)
    results["async_max"] = y.view(np.uint8)
    torch = sys.modules.get("torch")  # imported before the fork with --torch (too slow per child)
    if torch is not None:
        t = torch.arange(513, dtype=torch.float32) * (comm.rank + 1)
        assert comm.allreduce(t) is t
        results["torch_f32"] = t.numpy().view(np.uint8).copy()
        tb = torch.full((2, 65), float(comm.rank + 1), dtype=torch.bfloat16)
        comm.allreduce(tb, op="avg")
        results["torch_bf16"] = tb.view(torch.int16).numpy().view(np.uint8).copy()
        tz = torch.from_numpy(comm.zeros(100, "float32")) + 0  # a copy: not in shm
        tz += comm.rank
        comm.allreduce(tz)
        results["torch_copy"] = tz.numpy().view(np.uint8).copy()
    comm.barrier()
    st = comm.status()
    np.savez(os.path.join(out, f"rank{comm.rank}.npz"), **results)
    return {"torch": torch is not None, "recent": len(st.recent), "phases": sorted({r.phase for r in st.recent}),
            "record_fields": sorted(st.recent[-1].__struct_fields__) if st.recent else [],
            # how the ops crossed the nodes (OpStats.algorithm; none on a single node)
            "algorithms": sorted({r.stats.algorithm for r in st.recent if r.stats is not None and r.stats.peers})}


def _run(mode: str, comm: Any, args: argparse.Namespace) -> dict[str, Any]:
    if mode == "matrix":
        return _matrix(comm, args.out, args.full)
    if mode == "stream":  # many small ops in flight at once, of every kind, then all waited for
        world, works = comm.world_size, []
        for i in range(1500):
            works.append((i, comm.allreduce(np.full(3, comm.rank + i, np.int64), async_op=True)))
            if i % 100 == 0:
                works.append((-i - 1, comm.broadcast(np.full(5, comm.rank * 10000 + i, np.float32), 0,
                                                     async_op=True)))
                works.append((None, comm.barrier(async_op=True)))
        for i, w in works:
            got = w.wait(60)
            if i is not None and i >= 0:
                assert np.all(got == sum(r + i for r in range(world))), (i, got)
            elif i is not None:
                assert np.all(got == -i - 1), (i, got)  # root 0's values
        info = comm.status().worker["comms"]["test/default"]
        return {"fast_ops": info["fast_ops"], "posted_ops": info["posted_ops"], "express_ops": info["express_ops"]}
    if mode == "barriers":  # rank r arrives r x 30 ms late at each barrier: nobody may leave before the last
        before = comm.status().worker["comms"]["test/default"]["express_ops"]
        late = []
        for _ in range(5):
            time.sleep(0.03 * comm.rank)
            arrived = time.time()
            comm.barrier()
            late.append((arrived, time.time()))
        info = comm.status().worker["comms"]["test/default"]
        return {"times": late, "express_ops": info["express_ops"] - before}
    if mode == "small_kinds":  # small broadcasts and reduces from every rank as root: the express path
        world, rank = comm.world_size, comm.rank
        before = comm.status().worker["comms"]["test/default"]["express_ops"]
        for root in range(world):
            # 3 float16 = 6 bytes, not whole int32 words; random bits: NaN payloads, -0.0
            bits = [np.random.default_rng([root, r]).integers(0, 256, 6, dtype=np.uint8) for r in range(world)]
            x = bits[rank].view(np.float16).copy()
            assert comm.broadcast(x, root) is x
            assert x.view(np.uint8).tobytes() == bits[root].tobytes(), (root, x)
            # a narrow float (float32 partials, one rounding) and avg: only the root's buffer changes
            y = np.full(5, rank + 1, ml_dtypes.bfloat16)
            comm.reduce(y, root, op="avg")
            want = (world + 1) / 2 if rank == root else rank + 1
            assert np.all(y == ml_dtypes.bfloat16(want)), (root, y)
            z = np.full(7, rank * 3, np.int64)
            comm.reduce(z, root, op="max")
            assert np.all(z == ((world - 1) * 3 if rank == root else rank * 3)), (root, z)
        info = comm.status().worker["comms"]["test/default"]
        return {"express_ops": info["express_ops"] - before}
    if mode == "ops":  # a few allreduces (a communicator after a failure still works)
        for _ in range(3):
            x = np.full(5000, comm.rank + 1, np.float32)
            comm.allreduce(x)
            assert np.all(x == comm.world_size * (comm.world_size + 1) / 2), x[:3]
        return {}
    if mode == "mismatch":
        n = 101 if comm.rank == args.victim else 100
        _mark()
        comm.allreduce(np.ones(n, np.float32))
        return {}
    if mode == "dtype_by_node":  # node 1's ranks reduce bfloat16, node 0's float32: same carried bytes
        dt = np.float32 if comm.node_rank == 0 else ml_dtypes.bfloat16
        _mark()
        comm.allreduce(np.ones(args.count, dt))
        return {}
    if mode == "count_by_node":  # node 1's ranks reduce one element more than node 0's
        _mark()
        comm.allreduce(np.ones(args.count + comm.node_rank, np.float32))
        return {}
    if mode == "bcast_count_by_node":  # node 1's ranks broadcast one element more than node 0's
        _mark()
        comm.broadcast(np.ones(args.count + comm.node_rank, np.float32), 0)
        return {}
    if mode == "bcast_f16_count_by_node":  # node 1's ranks broadcast one float16 more: the same int32 words
        _mark()
        comm.broadcast(np.ones(args.count + comm.node_rank, np.float16), 0)
        return {}
    if mode == "bcast_dtype_by_node":  # float16 on node 0, bfloat16 on node 1: the same bytes
        _mark()
        comm.broadcast(np.ones(args.count, np.float16 if comm.node_rank == 0 else ml_dtypes.bfloat16), 0)
        return {}
    if mode in ("bcast_root_by_node", "reduce_root_by_node"):  # each node names its own first rank as root
        root = comm.rank - comm.local_rank
        x = np.full(args.count, comm.rank + 1, np.float32)
        _mark()
        if mode == "bcast_root_by_node":
            comm.broadcast(x, root)
        else:
            comm.reduce(x, root)
        return {}
    if mode == "one_more_on_node1":  # node 1's ranks run one op more; node 0's close meanwhile
        comm.allreduce(np.ones(10, np.float32))
        if comm.node_rank == 1:
            _mark()
            comm.allreduce(np.ones(10, np.float32))
        return {}
    if mode == "sleep":
        comm.allreduce(np.ones(10, np.float32))
        if comm.rank == args.victim:
            time.sleep(args.sleep_s)
        _mark()
        comm.allreduce(np.ones(10, np.float32))
        return {}
    if mode == "sleep_allgather":  # as "sleep", with an allgather beyond the express size
        x = np.full(BEYOND_EXPRESS, comm.rank, np.float32)
        out = np.empty(BEYOND_EXPRESS * comm.world_size, np.float32)
        comm.allgather(out, x)
        assert np.array_equal(out, np.repeat(np.arange(comm.world_size, dtype=np.float32), BEYOND_EXPRESS))
        if comm.rank == args.victim:
            time.sleep(args.sleep_s)
        _mark()
        comm.allgather(out, x)
        return {}
    if mode == "gatherloop":  # large allgathers and reduce_scatters back to back until one fails
        n = LARGE // 4 // comm.world_size  # 4 MiB of output each
        x = comm.empty(n, np.float32)
        out = comm.empty(n * comm.world_size, np.float32)
        for i in range(100_000):
            x[...] = comm.rank + i
            _mark()
            comm.allgather(out, x)
            assert out[0] == i and out[-1] == comm.world_size - 1 + i, (i, out[0], out[-1])
            _mark()
            comm.reduce_scatter(x, out, op="max")
            assert x[0] == comm.rank + i and x[-1] == x[0], (i, x[0])  # (every rank gathered the same)
            if i == 2:
                _say(f"gathering rank={comm.rank}")
        return {}
    if mode == "victim":  # the victim never submits; the test kills it (or the worker)
        comm.allreduce(np.ones(10, np.float32))
        _say(f"submitting rank={comm.rank}")
        if comm.rank == args.victim:
            time.sleep(3600)
        _mark()
        comm.allreduce(np.ones(10, np.float32))
        return {}
    if mode == "bigloop":  # large (streamed) allreduces back to back until one fails
        x = comm.empty(LARGE // 2, np.float32)  # 8 MiB: each op streams for a while
        for i in range(100_000):
            x[...] = comm.rank + 1
            _mark()
            comm.allreduce(x)
            assert x[0] == comm.world_size * (comm.world_size + 1) / 2 and x[-1] == x[0], (x[0], x[-1])
            if i == 2:
                _say(f"streaming rank={comm.rank}")
        return {}
    if mode == "pause":  # one op, then wait for <out>/go (the test stops the worker meanwhile)
        comm.allreduce(np.ones(10, np.float32))
        _say(f"submitting rank={comm.rank}")
        while not os.path.exists(os.path.join(args.out, "go")):
            time.sleep(0.01)
        _mark()
        comm.allreduce(np.ones(10, np.float32))
        return {}
    if mode == "cuda":
        from numba import cuda

        x = np.arange(1001, dtype=np.float32) * (comm.rank + 1)
        d = cuda.to_device(x)
        assert comm.allreduce(d) is d
        got = d.copy_to_host()
        want = np.arange(1001, dtype=np.float32) * (comm.world_size * (comm.world_size + 1) // 2)
        b = cuda.to_device(np.full(33, comm.rank, np.int32))
        comm.broadcast(b, root=0)
        return {"ok_sum": bool(np.array_equal(got, want)), "bcast": b.copy_to_host().tolist()}
    raise SystemExit(f"unknown mode {mode}")


def _is_hfr(e: BaseException) -> bool:
    from fireflyer.hfreduce.errors import HFReduceError

    return isinstance(e, HFReduceError)


def child(args: argparse.Namespace, node: int, lr: int) -> int:
    from fireflyer import hfreduce

    rank = node * args.k + lr
    t0 = time.monotonic()
    outcome: dict[str, Any] = {"rank": rank, "ok": False}
    try:
        comm = hfreduce.init(rank=rank, world_size=args.nnodes * args.k, local_rank=lr, local_world_size=args.k,
                             node_rank=node, nnodes=args.nnodes, socket=args.socket.format(node=node),
                             job_id="test", name=args.name, timeout_s=args.timeout_s or None)
        try:
            outcome.update(_run(args.mode, comm, args))
            outcome["ok"] = True
        finally:
            outcome["elapsed"] = time.monotonic() - t0
            try:
                comm.close()
            except Exception:  # noqa: BLE001
                pass
    except BaseException as e:  # noqa: BLE001 - reported to the test
        outcome.update(kind=type(e).__name__, message=str(e), fields=getattr(e, "fields", {}),
                       elapsed=time.monotonic() - t0, op_elapsed=time.monotonic() - _op_t0[0],
                       hfreduce_error=_is_hfr(e), tb=traceback.format_exc()[-3000:])
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(outcome, f, default=str)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True, help="path template with {node}")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--nodes", default="", help="only ranks of these nodes (comma list)")
    p.add_argument("--mode", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="default")
    p.add_argument("--timeout-s", type=float, default=0.0, help="0: the worker's default")
    p.add_argument("--victim", type=int, default=-1)
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--count", type=int, default=1001)
    p.add_argument("--full", action="store_true")
    p.add_argument("--torch", action="store_true")
    args = p.parse_args()
    import fireflyer.hfreduce.client  # noqa: F401 - imported once, before forking

    if args.torch:
        try:
            import torch

            torch.set_num_threads(1)
        except ImportError:
            pass

    nodes = [int(x) for x in args.nodes.split(",")] if args.nodes else list(range(args.nnodes))
    pids = {}
    for node in nodes:
        for lr in range(args.k):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = child(args, node, lr)
                finally:
                    os._exit(code)
            pids[pid] = node * args.k + lr
            _say(f"rank {node * args.k + lr} pid={pid}")
    bad = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        bad |= status != 0
    return int(bad)


if __name__ == "__main__":
    sys.exit(main())
