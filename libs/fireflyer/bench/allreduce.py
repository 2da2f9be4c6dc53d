"""``ff bench allreduce``: HFReduce against torch.distributed/Gloo and the loopback bound, in one run.

    ff bench allreduce --nodes 2 --local-ranks 4 --sizes 4,1M,16M,64M --dtype fp32 --vs gloo --json out.json

Per run, for every size:

- **ours**: the launcher (in-process, :class:`~fireflyer.hfreduce.launch.Launcher`)
  starts N workers and N*K ranks of :mod:`._rank` in HFReduce mode
  (zero-copy ``comm.empty`` buffers, warm-up, barrier, timed loop);
- **Gloo** (``--vs gloo``): the same N*K ranks, without workers, in Gloo mode
  (``GLOO_SOCKET_IFNAME=lo``, ``OMP_NUM_THREADS=1``, a torch tensor of the same
  dtype) -- the same ranks, so the ratio is like for like;
- **TCP congestion control**: the workers' links pick theirs (``FF_HFREDUCE_TCP_CONGESTION``,
  cubic or else reno by default: not the BBR some hosts default to, whose pacing costs
  CPU per byte on loopback); Gloo's sockets keep the system default.  The anchors below
  use what our links use, so they stay ceilings; the JSON's ``tcp_congestion`` says
  what each side had;
- **socket buffers**: the links fix SO_SNDBUF (``FF_HFREDUCE_SEND_BUF_SIZE``, 256K under the launcher) and
  Gloo's sockets auto-tune; the anchors' trials alternate between the links' buffers and
  the kernel's auto-tuning and keep the best, so they are ceilings for either (on the
  fifteenth VM the fixed buffer alone took the loopback anchor (4 pairs) from 3.5-4.3 to 5.4-6.2
  GB/s); the JSON's ``socket_buffers`` says what the links had;
- **placement** (``--cpu-bind``, default ``node``): both sides run under the same
  launcher plan, so rank r of either side is bound to the CPU share of node
  r // K (ours with that node's worker beside it), as ``ff launch`` binds; with
  ``none`` the scheduler places both;
- **the loopback bound** (nodes > 1, sizes >= 1 MiB): ``C`` is the aggregate
  throughput of ``nodes`` concurrent sender->receiver TCP pairs over loopback
  (raw ``sendall`` / ``recv_into``, threads in this process).  Any allreduce
  over n nodes moves 2(n-1)*S bytes between nodes in aggregate, so on one host
  whose copies share C, ``algbw <= C / (2(n-1))``; ``fraction_of_bound`` says
  how close ours gets.  C is the best of several short trials taken before and
  after the collectives (a ceiling: load from neighbours only lowers a trial);
- **the floor** (sizes >= 1 MiB, :mod:`._floor`): the time the bytes every
  allreduce must move take on this machine when moved as cheaply as possible --
  each node sends and receives 2(n-1)/n*S over loopback TCP and reads and writes
  each of its k ranks' buffers once -- measured with the benchmark's placement,
  best of the trials before and after the collectives.  ``fraction_of_floor``
  (floor / ours) says how close ours gets, and ``gloo_over_floor`` (Gloo's time /
  the floor) is the highest ratio to Gloo that any implementation moving those
  bytes could have reached in this run: a goal above it is out of this machine's reach;
- **the tree's flows** (nodes > 2, sizes >= 1 MiB, :mod:`.flows`): what loopback carries,
  in aggregate, for the flows a large op keeps busy -- every edge of both trees, both ways
  (twelve for 4 nodes against the bound's four pairs) -- stripped of the allreduce: a thread per
  flow end in a process per node, the links' congestion control and send buffer, ``sendall``
  / ``recv_into`` of one block at a time from and into buffers of the op's size (at most
  64 MiB), for a second, best of the trials before and after the collectives.
  ``fraction_of_tree_flows`` (ours' aggregate 2(n-1)*S/t over it) says how close ours came
  to the rate of its own pattern, and ``bound_over_tree_flows`` (C over it) how much more the
  bound's pairs carried: ``fraction_of_bound`` can reach at most about ``1 /
  bound_over_tree_flows`` for an allreduce over the double tree.  (With two nodes the trees'
  flows are the pair's, both ways.)
- **the ring reference** (nodes > 2, sizes >= 1 MiB, :mod:`.ringref`): a bare ring
  allreduce (reduce-scatter + allgather over the bound's own ``n`` flows, one float32 buffer
  per node, the workers' block as its piece, nothing of HFReduce's), best of the trials before
  and after the collectives.  ``ring_ref_fraction_of_bound`` is its share of the bound: how
  close the algorithm the bound describes gets to it on this machine, with nothing else to do.

``--runs N`` runs all of it N times back to back and reports each figure's median and range
(:mod:`._runs`).  The JSON's ``goals`` (:mod:`._goals`) judges the run -- or, with
``--runs``, the medians -- against the goals that apply to its shape; stderr says which were
missed.  Time per op is the max over ranks of each rank's mean.  ``algbw = S/t`` and
``busbw = algbw * 2(n-1)/n`` with n the total ranks (nccl-tests' definitions);
GB/s are 1e9 bytes per second.  The machine is shared and noisy: quote the
ratios, which are measured in the same run, rather than absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fireflyer.core.errors import FireFlyerError, Internal
from fireflyer.core.sizes import parse_size
from fireflyer.hfreduce import _blocks
from fireflyer.hfreduce.launch import Launcher, print_line
from fireflyer.hfreduce.launch_plan import LaunchOptions, node_cpus, worker_env
from fireflyer.hfreduce.settings import load_worker_settings
from fireflyer.wire.conn import congestion_of, set_congestion

from ._floor import Floor, SocketBuffers, loopback_capacity, measure_floor
from ._goals import goals, missed
from ._jsonout import add_json_option, emit
from ._runs import fmt_size, spread_lines, summarize_runs
from .flows import measure_flows, pattern_flows
from .ringref import measure_ring_ops

__all__ = ["main", "run_bench", "loopback_capacity", "busbw", "table_rows", "markdown_table", "RankResults"]

#: rank program (``python -m``), shared by both modes
_RANK_MODULE = "fireflyer.bench._rank"
_MIN_BOUND_BYTES = 1 << 20
#: the tree-flows anchor: seconds per trial, and the largest buffer per flow end (12 flows of
#: 4 nodes hold 24 of them)
_TREE_FLOW_SECONDS = 1.0
_TREE_FLOW_MAX_BUF = 64 << 20
#: the ring reference: timed ops per trial (after a warm-up); its op time is the median
_RING_REF_OPS = 3
_GB = 1e9

RankResults = dict[int, list[dict[str, Any]]]


def busbw(algbw: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce over ``n`` ranks."""
    return algbw * 2 * (n - 1) / n if n > 1 else algbw


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


# -- running the ranks ---------------------------------------------------------------------------------------------

def _run_ranks(mode: str, nodes: int, local_ranks: int, sizes: list[int], dtype: str, *, target_s: float,
               chunk_size: str | None, timeout_s: float | None, deadline_s: float, cpu_bind: str = "node") -> RankResults:
    """Launch one job of the rank program; the size -> per-rank records it printed."""
    results: RankResults = {}
    lock = threading.Lock()

    def sink(source: str, stream: str, line: str) -> None:
        if stream == "stdout" and line.startswith("{") and '"ff_bench_rank"' in line:
            rec = json.loads(line)["ff_bench_rank"]
            with lock:
                results.setdefault(int(rec["requested_bytes"]), []).append(rec)
        else:
            print_line(source, "stderr", line)

    env = dict(os.environ)
    if mode == "gloo":  # the settings research/allreduce.md §2 measured Gloo with: loopback, one op thread
        env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    cmd = [sys.executable, "-m", _RANK_MODULE, "--mode", mode, "--sizes", ",".join(map(str, sizes)),
           "--dtype", dtype, "--target-s", f"{target_s:g}"]
    if mode == "gloo":  # the same ranks on the same CPUs (node by node); Gloo needs no HFReduce workers
        opts = LaunchOptions(nodes=nodes, local_ranks=local_ranks, cpu_bind=cpu_bind)
        launcher = Launcher(opts, cmd, sink=sink, env=env, start_workers=False, deadline_s=deadline_s)
    else:
        opts = LaunchOptions(nodes=nodes, local_ranks=local_ranks, chunk_size=chunk_size, timeout_s=timeout_s,
                             cpu_bind=cpu_bind)
        launcher = Launcher(opts, cmd, sink=sink, env=env, deadline_s=deadline_s)
    rc = launcher.run()
    if rc != 0:
        raise Internal(f"the {mode} benchmark ranks failed (exit code {rc}); their output is above",
                       mode=mode, exit_code=rc)
    return results


def placement(nodes: int, cpu_bind: str, allowed: list[int]) -> str:
    """What the run's placement really was: ``node`` only if some node got CPUs of its own."""
    return "node" if cpu_bind == "node" and any(node_cpus(nodes, allowed)) else "none"


def _slowest(records: list[dict[str, Any]], world: int, mode: str, size: int) -> dict[str, Any]:
    if any("unsupported" in r for r in records):
        return {"unsupported": records[0].get("unsupported", "unsupported")}
    if len(records) != world:
        raise Internal(f"{mode}: {len(records)} of {world} ranks reported size {size}", mode=mode, size=size)
    return {"time_s": max(r["time_s"] for r in records), "size_bytes": records[0]["size_bytes"],
            "iters": records[0]["iters"]}


# -- the loopback anchor -------------------------------------------------------------------------------------------

def _best_floor(a: Floor, b: Floor) -> Floor:
    """Each part's best of two measurements (a ceiling of speed, as the loopback anchor)."""
    return Floor(net_s=min(a.net_s, b.net_s), mem_s=min(a.mem_s, b.mem_s), overlap=a.overlap)


def tcp_congestion(prefs: Sequence[str]) -> dict[str, str | None]:
    """Which TCP congestion control each side's connections use in this run: the workers'
    links and the anchors take the first of ``prefs`` the kernel allows; Gloo's sockets the
    system default (``net.ipv4.tcp_congestion_control``)."""
    try:
        system: str | None = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        system = None
    with socket.socket() as probe:
        ours = set_congestion(probe, prefs) or congestion_of(probe)
    return {"system": system, "hfreduce": ours, "anchors": ours, "gloo": system}


# -- the whole bench -----------------------------------------------------------------------------------------------

def _warm_block_loops() -> None:
    """Fill numba's cache with the streamed ops' block loops before any worker starts.

    Each worker compiles (or loads) them on a background thread at start-up.  Loaded from the
    cache that takes ~0.2 s, but after ``_blocks.py`` changed (an update, a checkout) numba
    compiles them again, ~15-20 s on a 2-core VM, and that ran inside the first timed size: a
    2-node 4-byte op measured 1.4 ms instead of ~0.2 ms once that way on the thirteenth VM.
    Done here, the workers find the cache filled.
    """
    t0 = time.perf_counter()
    _blocks.warm_up()
    took = time.perf_counter() - t0
    if took > 2.0:
        print(f"ff bench allreduce: compiled the HFReduce block loops in {took:.0f} s (once per update), "
              "before timing", file=sys.stderr, flush=True)


def run_bench(*, nodes: int, local_ranks: int, sizes: list[int], dtype: str = "fp32", vs: str | None = None,
              target_s: float = 0.5, chunk_size: str | None = None, timeout_s: float | None = None,
              deadline_s: float = 600.0, bound: bool = True, cpu_bind: str = "node",
              floor: bool = True) -> dict[str, Any]:
    """Run everything for every size; the JSON object (see the module docs)."""
    world = nodes * local_ranks
    if nodes > 1 and load_worker_settings().stream:
        _warm_block_loops()
    kw = {"target_s": target_s, "chunk_size": chunk_size, "timeout_s": timeout_s, "deadline_s": deadline_s,
          "cpu_bind": cpu_bind}
    # the anchor is taken before and after the collectives and the best kept: it is a ceiling, and a
    # neighbour's burst on this shared machine only ever lowers it
    anchor_sizes = sorted({s for s in sizes if s >= _MIN_BOUND_BYTES}) if bound and nodes > 1 else []
    floor_sizes = sorted({s for s in sizes if s >= _MIN_BOUND_BYTES}) if floor else []
    itemsize = 4 if dtype == "fp32" else 2
    # the settings as the launcher's workers will load them
    ws = load_worker_settings(env=worker_env(os.environ, local_ranks=local_ranks, nodes=nodes))
    cc = ws.congestion_prefs  # what the launched workers' links will use
    # the links' socket buffers, and the kernel's auto-tuning: the anchors take the best of both
    bufs: list[SocketBuffers] = list(dict.fromkeys([(ws.sock_buf_bytes, ws.send_buf_bytes), (None, None)]))

    def floor_of(s: int, b: SocketBuffers) -> Floor:
        return measure_floor(nodes, local_ranks, s // itemsize * itemsize, cpu_bind=cpu_bind, congestion=cc,
                             buffers=b)

    tree_sizes = anchor_sizes if nodes > 2 else []

    def tree_flows(s: int) -> float:
        piece = min(ws.block_bytes, s)
        return measure_flows(pattern_flows("tree", nodes), nodes, buf_bytes=max(piece, min(s, _TREE_FLOW_MAX_BUF)),
                             piece=piece, seconds=_TREE_FLOW_SECONDS, congestion=cc, buffers=bufs[0])

    def ring_ref(s: int) -> float:
        whole = s // (4 * nodes) * 4 * nodes  # (the ring's segments: a multiple of nodes float32s)
        ops = measure_ring_ops(nodes, whole, piece_bytes=min(ws.block_bytes, whole // nodes), ops=_RING_REF_OPS,
                               congestion=cc, buffers=bufs[0])
        return statistics.median(ops) * s / whole

    caps = {s: loopback_capacity(nodes, s, congestion=cc, buffers=bufs) for s in anchor_sizes}
    floors = {s: floor_of(s, bufs[0]) for s in floor_sizes}
    trees = {s: tree_flows(s) for s in tree_sizes}
    rings = {s: ring_ref(s) for s in tree_sizes}
    ours = _run_ranks("hfreduce", nodes, local_ranks, sizes, dtype, **kw)  # type: ignore[arg-type]
    gloo = _run_ranks("gloo", nodes, local_ranks, sizes, dtype, **kw) if vs == "gloo" else {}  # type: ignore[arg-type]
    caps = {s: max(c, loopback_capacity(nodes, s, congestion=cc, buffers=bufs)) for s, c in caps.items()}
    floors = {s: _best_floor(f, floor_of(s, bufs[-1])) for s, f in floors.items()}
    trees = {s: max(t, tree_flows(s)) for s, t in trees.items()}
    rings = {s: min(t, ring_ref(s)) for s, t in rings.items()}
    entries: list[dict[str, Any]] = []
    for size in sizes:
        o = _slowest(ours.get(size, []), world, "hfreduce", size)
        if "unsupported" in o:
            raise Internal(f"hfreduce does not support {dtype}: {o['unsupported']}")
        nbytes = o["size_bytes"]
        alg = nbytes / o["time_s"] / _GB
        e: dict[str, Any] = {"size_bytes": nbytes, "dtype": dtype, "nodes": nodes, "local_ranks": local_ranks,
                             "time_s": o["time_s"], "iters": o["iters"], "algbw_GBps": alg,
                             "busbw_GBps": busbw(alg, world), "gloo_time_s": None, "gloo_algbw_GBps": None,
                             "gloo_busbw_GBps": None, "ratio": None, "loopback_GBps": None, "bound_GBps": None,
                             "fraction_of_bound": None, "floor_time_s": None, "floor_net_s": None,
                             "floor_mem_s": None, "fraction_of_floor": None, "gloo_over_floor": None,
                             "tree_flows_GBps": None, "fraction_of_tree_flows": None, "bound_over_tree_flows": None,
                             "ring_ref_time_s": None, "ring_ref_fraction_of_bound": None}
        if vs == "gloo":
            g = _slowest(gloo.get(size, []), world, "gloo", size)
            if "unsupported" in g:
                e["gloo_note"] = f"Gloo cannot allreduce {dtype} here: {g['unsupported']}"
            else:
                galg = g["size_bytes"] / g["time_s"] / _GB
                e.update(gloo_time_s=g["time_s"], gloo_algbw_GBps=galg, gloo_busbw_GBps=busbw(galg, world),
                         ratio=alg / galg)
        if size in caps:
            cap = caps[size] / _GB
            e.update(loopback_GBps=cap, bound_GBps=cap / (2 * (nodes - 1)),
                     fraction_of_bound=alg / (cap / (2 * (nodes - 1))))
        if size in trees:
            tree = trees[size] / _GB
            e.update(tree_flows_GBps=tree, fraction_of_tree_flows=alg * 2 * (nodes - 1) / tree)
            if e["loopback_GBps"]:
                e["bound_over_tree_flows"] = e["loopback_GBps"] / tree
        if size in rings:
            e["ring_ref_time_s"] = rings[size]
            if e["bound_GBps"]:
                e["ring_ref_fraction_of_bound"] = nbytes / rings[size] / _GB / e["bound_GBps"]
        if size in floors:
            fl = floors[size]
            e.update(floor_time_s=fl.time_s, floor_net_s=fl.net_s, floor_mem_s=fl.mem_s,
                     fraction_of_floor=fl.time_s / o["time_s"])
            if e["gloo_time_s"]:
                e["gloo_over_floor"] = e["gloo_time_s"] / fl.time_s
        entries.append(e)
    result = {
        "bench": "allreduce",
        "nodes": nodes, "local_ranks": local_ranks, "world_size": world, "dtype": dtype, "vs": vs,
        "cpu_bind": placement(nodes, cpu_bind, sorted(os.sched_getaffinity(0))),
        "definitions": "algbw = bytes/time; busbw = algbw*2(n-1)/n (nccl-tests), n = total ranks; GB = 1e9 B; "
                       "bound = C/(2(nodes-1)), C = aggregate loopback TCP throughput of `nodes` concurrent pairs; "
                       "floor = time of the bytes every allreduce must move (each node: 2(nodes-1)/nodes*S sent and "
                       "received over loopback TCP, its local_ranks buffers read and written once), moved alone; "
                       "gloo_over_floor = the highest ratio to Gloo any implementation could reach in this run; "
                       "tree_flows = aggregate loopback TCP throughput of every edge of both trees both ways "
                       "(nodes > 2); fraction_of_tree_flows = 2(nodes-1)*algbw / tree_flows; "
                       "bound_over_tree_flows = C / tree_flows; ring_ref = a bare ring allreduce over the "
                       "bound's `nodes` flows (nodes > 2), ring_ref_fraction_of_bound = its algbw / bound",
        "results": entries,
        "goals": [],  # (filled below: the goals read from these results)
        "tcp_congestion": tcp_congestion(cc),
        "socket_buffers": {"links_buf_bytes": bufs[0][0], "links_send_buf_bytes": bufs[0][1],
                           "anchors": "best of the links' buffers and the kernel's auto-tuning"},
        "block_bytes": ws.block_bytes,  # a streamed op's block, as the launcher gave the workers
        # how the large ops crossed the nodes: "ring" (the launcher's on 3+ nodes;
        # the engine takes it for streamed dtypes only, so fp32 here) or "tree"
        "algorithm": ws.algorithm if nodes >= 3 and dtype == "fp32" else "tree",
        "git_sha": _git_sha(), "cpu_count": os.cpu_count(), "torch_version": _torch_version(),
        "python": platform.python_version(), "platform": sys.platform,
    }
    result["goals"] = goals(result)
    return result


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the printed table (also the README's)."""
    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    def t(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x * 1e6:.0f} us" if x < 1e-2 else f"{x * 1e3:.1f} ms"

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x * 100:.0f}%"

    def times(x: float | None) -> str:
        return "-" if not x else f"{x:.2f}x"

    head = ["size", "time", "algbw GB/s", "busbw GB/s", "gloo time", "gloo algbw", "ratio", "bound GB/s",
            "% of bound", "% of tree flows", "ring ref % of bound", "floor", "% of floor", "gloo / floor"]
    rows = []
    for e in result["results"]:
        rows.append([fmt_size(e["size_bytes"]), t(e["time_s"]), f(e["algbw_GBps"], ".3f"), f(e["busbw_GBps"], ".3f"),
                     t(e["gloo_time_s"]), f(e["gloo_algbw_GBps"], ".3f"), times(e["ratio"]),
                     f(e["bound_GBps"], ".3f"), pct(e["fraction_of_bound"]), pct(e.get("fraction_of_tree_flows")),
                     pct(e.get("ring_ref_fraction_of_bound")),
                     t(e.get("floor_time_s")), pct(e.get("fraction_of_floor")), times(e.get("gloo_over_floor"))])
    return head, rows


def _cc_caption(cc: dict[str, str | None] | None) -> str:
    if not cc:
        return ""
    return f"tcp {cc.get('hfreduce')} (ours, anchors) / {cc.get('gloo')} (Gloo, system default), "


def _buf_caption(bufs: dict[str, Any] | None) -> str:
    """What the links' socket buffers were (results from before ``socket_buffers`` existed: nothing)."""
    if not bufs:
        return ""
    if bufs.get("links_buf_bytes"):
        return f"SO_SNDBUF/SO_RCVBUF {fmt_size(bufs['links_buf_bytes'])} (ours), "
    send = bufs.get("links_send_buf_bytes")
    return f"SO_SNDBUF {fmt_size(send)} (ours), " if send else "socket buffers auto-tuned (ours), "


def _block_caption(block: int | None) -> str:
    """A streamed op's block in our workers (results from before ``block_bytes`` existed: nothing)."""
    return f"block {fmt_size(block)} (ours), " if block else ""


def _algorithm_caption(algorithm: str | None) -> str:
    """How our large ops crossed the nodes (results from before ``algorithm`` existed: nothing)."""
    return f"{algorithm} (ours), " if algorithm else ""


def markdown_table(result: dict[str, Any]) -> str:
    """The table as GitHub markdown (for the README), with the run's shape and anchors in a caption."""
    head, rows = table_rows(result)
    lines = [f"{result['nodes']} nodes x {result['local_ranks']} local ranks ({result['world_size']} ranks), "
             f"{result['dtype']}, {result['cpu_count']} CPUs, cpu-bind {result.get('cpu_bind', 'none')}, "
             f"torch {result['torch_version']}, {_cc_caption(result.get('tcp_congestion'))}"
             f"{_buf_caption(result.get('socket_buffers'))}{_block_caption(result.get('block_bytes'))}"
             f"{_algorithm_caption(result.get('algorithm'))}git {str(result['git_sha'])[:10]}"
             + (f", medians of {result['runs']} runs" if result.get("runs", 1) > 1 else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    head, rows = table_rows(result)
    title = (f"allreduce {result['dtype']}: {result['nodes']} nodes x {result['local_ranks']} local ranks "
             f"({result['world_size']} ranks)" + (" vs Gloo, same ranks" if result["vs"] else "")
             + f", cpu-bind {result.get('cpu_bind', 'none')}")
    table = Table(title=title)
    for h in head:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*r)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 120))  # a pipe or file: do not wrap the header
    console.print(table)
    for e in result["results"]:
        if e.get("gloo_note"):
            print(e["gloo_note"])


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="ff bench allreduce", description=doc.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2, help="simulated nodes (default 2)")
    p.add_argument("--local-ranks", type=int, default=1, help="ranks per node (default 1)")
    p.add_argument("--sizes", default="4,1M,16M,64M", help="comma list, K/M/G suffixes (default 4,1M,16M,64M)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--vs", choices=["gloo"], default=None, help="also run torch.distributed with this backend")
    add_json_option(p)
    p.add_argument("--target-s", type=float, default=0.5, help="timed seconds per size and side (default 0.5)")
    p.add_argument("--chunk-size", default=None, help="HFReduce pipeline chunk (default: the worker's)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="collective deadline of the workers (default 60)")
    p.add_argument("--no-bound", action="store_true", help="skip the loopback-bound anchor")
    p.add_argument("--no-floor", action="store_true", help="skip the floor anchor (the bytes every allreduce must move)")
    p.add_argument("--cpu-bind", choices=["node", "none"], default="node",
                   help="placement of both sides' ranks (and our workers), as ff launch --cpu-bind (default node)")
    p.add_argument("--markdown", action="store_true", help="print the table as GitHub markdown (for the README)")
    p.add_argument("--runs", type=int, default=1,
                   help="run the whole benchmark this many times back to back and report each figure's median "
                        "and range (default 1; the JSON keeps every run under per_run)")
    ns = p.parse_args(argv)
    if ns.runs < 1:
        p.error(f"--runs must be at least 1, got {ns.runs}")
    try:
        sizes = [parse_size(s, what="--sizes") for s in ns.sizes.split(",")]
        docs = []
        for i in range(ns.runs):
            if ns.runs > 1:
                print(f"ff bench allreduce: run {i + 1} of {ns.runs}", file=sys.stderr, flush=True)
            docs.append(run_bench(nodes=ns.nodes, local_ranks=ns.local_ranks, sizes=sizes, dtype=ns.dtype,
                                  vs=ns.vs, target_s=ns.target_s, chunk_size=ns.chunk_size,
                                  timeout_s=ns.timeout_s, bound=not ns.no_bound, cpu_bind=ns.cpu_bind,
                                  floor=not ns.no_floor))
        result = docs[0] if ns.runs == 1 else summarize_runs(docs)
    except FireFlyerError as e:
        print(f"ff bench allreduce: {e}", file=sys.stderr)
        return 1
    if result["goals"]:
        what = "the medians" if ns.runs > 1 else "this run"
        print(f"goals ({what}): " + "; ".join(f"{g['goal']} {g['value']:.2f} (>= {g['target']:g}) "
                                             f"{'met' if g['met'] else 'MISSED'}" for g in result["goals"])
              + f"; missed: {', '.join(missed(result['goals'])) or 'none'}", file=sys.stderr)
    return emit(ns.json, result, lambda: _print_result(ns, result))


def _print_result(ns: argparse.Namespace, result: dict[str, Any]) -> None:
    if ns.markdown:
        print(markdown_table(result))
    else:
        _print_table(result)
    if ns.runs > 1:
        print("\n".join(spread_lines(result)))


if __name__ == "__main__":
    raise SystemExit(main())
