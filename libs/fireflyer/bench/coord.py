"""``ff bench coord``: admit N joins, form the communicator, build the trees -- in memory and over gRPC.

    ff bench coord --nodes 1250 --zones 2 --json [--grpc-nodes N] [--channels 8]

Two measurements, reported separately because they answer different questions:

- ``state_machine``: the pure :class:`~fireflyer.coord.rendezvous.Rendezvous` admits
  N joins (zones round-robin), forms the generation (ranks + zone-aware double tree)
  and builds every node's tree view -- the coordinator's own cost;
- ``grpc``: a real ``python -m services.coord`` process (no NATS, auth off, SQLite KV in
  a temp dir) gets N concurrent ``Join`` calls from one asyncio loop over a few
  channels; the figure is first send to last reply (includes serializing N replies
  of N nodes each).  The anchor is N concurrent ``Heartbeat`` calls measured right
  after, on the same channels: ``ratio`` = join / heartbeat round.

Also printed: tree depth (with the ``ceil(log2 N)`` bound) and the number of
cross-zone node pairs, which must be ``zones - 1`` (1 for two zones).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from fireflyer.bench._jsonout import add_json_option, emit
from fireflyer.coord.layout import tree_views
from fireflyer.coord.model import JoinSpec
from fireflyer.coord.rendezvous import Rendezvous

__all__ = ["main", "bench_state_machine", "bench_grpc"]


def _specs(n: int, zones: int, job: str) -> list[JoinSpec]:
    return [JoinSpec(job=job, name="default", node=f"node{i}", zone=f"z{i % zones}" if zones > 1 else "",
                     local_world_size=8, address=f"10.{i // 250}.{i % 250}.1:7100", nnodes=n) for i in range(n)]


def bench_state_machine(n: int, zones: int) -> dict[str, Any]:
    rv = Rendezvous()
    specs = _specs(n, zones, "sm")
    t0 = time.perf_counter()
    out = None
    for s in specs:
        out = rv.join(s, 0.0, 60.0)
    t1 = time.perf_counter()
    assert out is not None and out.formed is not None
    rec = out.formed
    dt = rv.trees[rec.comm]
    depths = (dt.trees[0].depth(), dt.trees[1].depth())
    for m in rec.members:
        tree_views(dt, rec.members, m.node_rank, depths)
    t2 = time.perf_counter()
    return {"admit_and_form_s": t1 - t0, "tree_views_s": t2 - t1, "total_s": t2 - t0, "depth": rec.depth,
            "cross_zone_pairs": rec.cross_zone_pairs, "world_size": rec.world_size}


async def _grpc(address: str, n: int, zones: int, channels: int) -> dict[str, Any]:
    from fireflyer.coord.client import CoordClient

    clients = [CoordClient(address, token="") for _ in range(channels)]
    try:
        specs = _specs(n, zones, "grpc")
        t0 = time.perf_counter()
        results = await asyncio.gather(*[clients[i % channels].join(s, timeout_s=120.0)
                                         for i, s in enumerate(specs)])
        t1 = time.perf_counter()
        r0 = results[0]
        zone_of = {nd.node_rank: nd.zone for nd in r0.nodes}
        pairs = {frozenset((r.node_rank, t.parent)) for r in results for t in r.trees
                 if t.parent >= 0 and zone_of[t.parent] != zone_of[r.node_rank]}
        depth = max(t.depth for t in r0.trees)
        t2 = time.perf_counter()
        await asyncio.gather(*[clients[i % channels].heartbeat(r.comm, r.generation, specs[i].node)
                               for i, r in enumerate(results)])
        t3 = time.perf_counter()
        return {"nodes": n, "channels": channels, "join_all_s": t1 - t0, "heartbeat_round_s": t3 - t2,
                "ratio_join_to_heartbeat": (t1 - t0) / max(t3 - t2, 1e-9), "depth": depth,
                "cross_zone_pairs_seen_in_replies": len(pairs),
                "ranks_unique": sorted(r.node_rank for r in results) == list(range(n))}
    finally:
        for c in clients:
            await c.close()


def bench_grpc(n: int, zones: int, channels: int = 8) -> dict[str, Any]:
    from fireflyer.cluster.procs import free_ports
    from fireflyer.rpc import check_health

    port = free_ports(1)[0]
    with tempfile.TemporaryDirectory(prefix="ff-bench-coord-") as tmp:
        env = dict(os.environ, FF_NATS_URL="", FF_AUTH_ENABLED="false", FF_RPC_HOST="127.0.0.1",
                   FF_RPC_PORT=str(port), FF_STATE_DIR=tmp, FF_COORD_KV_URL=f"sqlite:///{tmp}/coord.db",
                   FF_LOG_LEVEL="warning", FF_RPC_MAX_MESSAGE_MB="256")
        proc = subprocess.Popen([sys.executable, "-m", "services.coord"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            address = f"127.0.0.1:{port}"

            async def run() -> dict[str, Any]:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if await check_health(address, timeout_s=1.0) == "SERVING":
                            break
                    except Exception:  # noqa: BLE001 - still starting
                        pass
                    if proc.poll() is not None or time.monotonic() > deadline:
                        err = proc.stderr.read().decode() if proc.stderr else ""
                        raise RuntimeError(f"coord did not start: {err[-2000:]}")
                    await asyncio.sleep(0.05)
                return await _grpc(address, n, zones, channels)

            return asyncio.run(run())
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ff bench coord", description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=1250)
    p.add_argument("--zones", type=int, default=2)
    p.add_argument("--grpc-nodes", type=int, default=None, help="joins over gRPC (default --nodes; 0 skips)")
    p.add_argument("--channels", type=int, default=8)
    add_json_option(p)
    ns = p.parse_args(argv)
    n = ns.nodes
    sm = bench_state_machine(n, ns.zones)
    gn = n if ns.grpc_nodes is None else ns.grpc_nodes
    grpc_res = bench_grpc(gn, ns.zones, ns.channels) if gn > 0 else None
    out = {"bench": "coord", "nodes": n, "zones": ns.zones, "depth": sm["depth"],
           "depth_bound": (n - 1).bit_length(), "cross_zone_pairs": sm["cross_zone_pairs"],
           "cross_zone_pairs_ok": sm["cross_zone_pairs"] == max(ns.zones - 1, 0) or ns.zones < 2,
           "state_machine": sm, "grpc": grpc_res, "git_sha": _git_sha(), "cpu_count": os.cpu_count()}
    return emit(ns.json, out, lambda: print(json.dumps(out, indent=2)))


if __name__ == "__main__":
    raise SystemExit(main())
