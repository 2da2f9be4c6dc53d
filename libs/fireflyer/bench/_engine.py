"""Micro-benchmark of the inter-node engine, with the loopback bound measured in the same run.

    python -m fireflyer.bench._engine --nodes 4 --size 64MiB --repeats 10

Each node runs in its own process (spawned: a fair share of the GIL and of the
two cores), all on 127.0.0.1.  Figures follow nccl-tests: ``algbw = S / t``,
``busbw = algbw * 2(n-1)/n``.  The *bound* is what loopback TCP can carry here:
``C`` is the aggregate throughput of n processes that each send to the next and
receive from the previous at once (the same full-duplex pattern, the same number
of copies per byte), and a double tree (like a ring) moves ``2(n-1) S`` bytes in
total, so ``algbw <= C / (2(n-1))``.  ``fraction`` is algbw over that bound.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import threading
import time
from typing import Any

import msgspec
import numpy as np

from fireflyer.cluster.procs import free_ports
from fireflyer.core.sizes import size_arg

__all__ = ["bench_engine", "loopback_capacity"]

_CTX = mp.get_context("spawn")


def _ring_node(rank: int, n: int, nbytes: int, ports: Any, barrier: Any, out: Any) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    ports[rank] = srv.getsockname()[1]
    barrier.wait()
    tx = socket.create_connection(("127.0.0.1", ports[(rank + 1) % n]))
    rx, _ = srv.accept()
    for s in (tx, rx):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = np.ones(4 << 20, dtype=np.uint8)
    rbuf = memoryview(np.empty(4 << 20, dtype=np.uint8))

    def send() -> None:
        left = nbytes
        view = memoryview(buf)
        while left > 0:
            left -= tx.send(view[:min(left, len(view))])

    def recv() -> None:
        left = nbytes
        while left > 0:
            got = rx.recv_into(rbuf[:min(left, len(rbuf))], 0, socket.MSG_WAITALL)
            if not got:
                raise ConnectionError("ring peer closed")
            left -= got

    barrier.wait()
    t0 = time.perf_counter()
    th = threading.Thread(target=send)
    th.start()
    recv()
    th.join()
    out.put((rank, time.perf_counter() - t0))
    tx.close()
    rx.close()
    srv.close()


def loopback_capacity(n: int, nbytes: int = 256 << 20) -> float:
    """Aggregate bytes/s of ``n`` processes each sending ``nbytes`` to the next at once (n >= 2)."""
    ports = _CTX.Array("i", n)
    barrier = _CTX.Barrier(n)
    out = _CTX.Queue()
    procs = [_CTX.Process(target=_ring_node, args=(r, n, nbytes, ports, barrier, out)) for r in range(n)]
    for p in procs:
        p.start()
    times = [out.get(timeout=120)[1] for _ in range(n)]
    for p in procs:
        p.join()
    return n * nbytes / max(times)


def _engine_node(rank: int, n: int, size_bytes: int, repeats: int, warmup: int, chunk_bytes: int,
                 dtype: str, ports: Any, barrier: Any, out: Any) -> None:
    from fireflyer.hfreduce.engine import NodeEngine
    from fireflyer.hfreduce.types import Fingerprint

    srv = socket.create_server(("127.0.0.1", 0))
    ports[rank] = srv.getsockname()[1]
    barrier.wait()
    addrs = [f"127.0.0.1:{ports[i]}" for i in range(n)]
    eng = NodeEngine(node_rank=rank, addresses=addrs, listen=srv, chunk_bytes=chunk_bytes, token="bench",
                     timeout_s=60)
    try:
        eng.start(30)
        dt = np.dtype(dtype)
        count = max(1, size_bytes // dt.itemsize)
        work = np.ones(count, dtype=dt)
        lat = []
        last = None
        for i in range(warmup + repeats):
            if i == warmup:
                barrier.wait()
                t_all = time.perf_counter()
            t0 = time.perf_counter()
            last = eng.allreduce(work, "sum", Fingerprint("bench", i, "sum", dt.name, count))
            if i >= warmup:
                lat.append(time.perf_counter() - t0)
        total = time.perf_counter() - t_all
        out.put((rank, total, lat, None, msgspec.to_builtins(last)))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out.put((rank, 0.0, [], repr(e), None))
    finally:
        barrier.wait()
        eng.close()


def _gloo_node(rank: int, n: int, size_bytes: int, repeats: int, warmup: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
        t = torch.ones(max(1, size_bytes // 4), dtype=torch.float32)
        lat = []
        for i in range(warmup + repeats):
            if i == warmup:
                dist.barrier()
                t_all = time.perf_counter()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= warmup:
                lat.append(time.perf_counter() - t0)
        out.put((rank, time.perf_counter() - t_all, lat, None, None))
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out.put((rank, 0.0, [], repr(e), None))


def gloo_reference(n: int, size_bytes: int, repeats: int, warmup: int = 2) -> dict[str, Any]:
    """The same allreduce (float32 sum) with torch.distributed's Gloo backend, one process per node."""
    port = free_ports(1)[0]  # outside the ephemeral range: the nodes' own connections cannot take it
    out = _CTX.Queue()
    procs = [_CTX.Process(target=_gloo_node, args=(r, n, size_bytes, repeats, warmup, port, out))
             for r in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in range(n)]
    for p in procs:
        p.join(30)
    return _summary(got, n, size_bytes, repeats)


def _summary(got: list[Any], n: int, size_bytes: int, repeats: int) -> dict[str, Any]:
    got.sort(key=lambda g: g[0])
    errors = [g[3] for g in got if g[3]]
    if errors:
        raise RuntimeError(f"benchmark node failed: {errors}")
    per_op = max(g[1] for g in got) / repeats
    lat = sorted(max(col) for col in zip(*(g[2] for g in got), strict=True))
    algbw = size_bytes / per_op / 1e9
    return {"time_s": per_op, "p50_us": statistics.median(lat) * 1e6,
            "p99_us": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e6,
            "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n if n > 1 else 0.0}


def bench_engine(n: int, size_bytes: int, repeats: int, *, warmup: int = 2, chunk_bytes: int = 4 << 20,
                 dtype: str = "float32", bound: bool = True, vs_gloo: bool = False) -> dict[str, Any]:
    """Allreduce ``size_bytes`` over ``n`` node processes ``repeats`` times; figures in a dict.

    Keys: ``time_s`` (mean per op, slowest node, back to back), ``p50_us``/``p99_us``
    (per-op latency on the slowest node), ``algbw_GBps``, ``busbw_GBps`` and, with
    ``bound``, ``loopback_C_GBps``, ``bound_algbw_GBps`` = C/(2(n-1)), ``fraction``;
    with ``vs_gloo``, ``gloo`` (the same figures for torch's Gloo, run right after).
    """
    ports = _CTX.Array("i", n)
    barrier = _CTX.Barrier(n)
    out = _CTX.Queue()
    procs = [_CTX.Process(target=_engine_node, args=(r, n, size_bytes, repeats, warmup, chunk_bytes, dtype,
                                                     ports, barrier, out)) for r in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in range(n)]
    for p in procs:
        p.join(30)
    res: dict[str, Any] = {"nodes": n, "size_bytes": size_bytes, "repeats": repeats, "chunk_bytes": chunk_bytes,
                           **_summary(got, n, size_bytes, repeats),
                           "last_op_stats": [g[4] for g in sorted(got, key=lambda g: g[0])]}
    algbw = res["algbw_GBps"]
    if bound and n > 1:
        cap = loopback_capacity(n, max(64 << 20, min(512 << 20, size_bytes * 4)))
        res["loopback_C_GBps"] = cap / 1e9
        res["bound_algbw_GBps"] = cap / (2 * (n - 1)) / 1e9
        res["fraction"] = algbw / res["bound_algbw_GBps"]
    if vs_gloo:
        res["gloo"] = gloo_reference(n, size_bytes, repeats, warmup)
        if n > 1 and bound:
            res["gloo"]["fraction"] = res["gloo"]["algbw_GBps"] / res["bound_algbw_GBps"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--size", type=size_arg, default=64 << 20)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--chunk", type=size_arg, default=4 << 20)
    ap.add_argument("--no-bound", action="store_true")
    ap.add_argument("--vs-gloo", action="store_true")
    ap.add_argument("--stats", action="store_true", help="print the last op's OpStats of every node")
    a = ap.parse_args()
    res = bench_engine(a.nodes, a.size, a.repeats, chunk_bytes=a.chunk, bound=not a.no_bound, vs_gloo=a.vs_gloo)
    if not a.stats:
        res.pop("last_op_stats")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
