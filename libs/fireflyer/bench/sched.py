"""``ff bench sched``: the scheduling decision at Fire-Flyer size, cycle after cycle.

    ff bench sched --json [--nodes 1250 --zones 2 --tasks 10000 --cycles 30 --scaling 100,1000,10000]

A seeded simulation drives :func:`fireflyer.sched.policy.decide` as the scheduler service will:
each cycle (one minute of simulated time) the runs that reached their end finish, the runs
preempted last cycle release their nodes and go back to the queue as their chain's next run, new
chains arrive to keep ``--tasks`` runs queued, then one decision is timed and applied (starts take
their nodes, preempted runs become releasing).  The workload mixes sizes (1 to 512 nodes, most of
them small, as on a shared cluster), HAI's priority levels (AUTO among them), 60 users in 6 shared
groups with a few quotas, and 1% drained nodes.

Anchor, measured in the same cycles on the same inputs: ordering the waiting runs by (priority,
submission, id), which any decision must at least do; ``ratio_to_sort`` = median cycle / that.

Reported: the decision's time per cycle (median, p95, max, and the first cycle that fills an empty
cluster), the share of enabled nodes held by runs after each decision while the queue is deep, and
the same for each queue depth of ``--scaling`` (how the cycle grows with the queue).  Goals (issue
49): at 10,000 queued runs, a cycle takes <= 100 ms (HAI ticks once a second) and >= 95% of the nodes
are busy.  Also timed: a preemption storm (every node runs an old 1-node LOW run when the queue of
HIGH runs arrives, so one cycle preempts the whole cluster).  ``--profile`` prints the decision's cProfile top functions to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from fireflyer.bench._jsonout import add_json_option, emit
from fireflyer.sched.model import (
    DRAINED,
    ENABLED,
    FINISHED,
    RUNNING,
    SCHEDULED,
    SUSPENDED,
    NodeView,
    Priority,
    Quota,
    SchedConfig,
    StopCode,
    SuspendCode,
    Task,
    TaskSpec,
)
from fireflyer.sched.policy import decide

__all__ = ["bench_sched", "simulate", "main", "GOAL_CYCLE_MS", "GOAL_BUSY"]

GOAL_CYCLE_MS = 100.0
GOAL_BUSY = 0.95
CYCLE_S = 60.0

#: (nodes, weight): most runs are small, a few are large, one in a few hundred spans a zone
_SIZES = ((1, 30), (2, 18), (4, 18), (8, 16), (16, 9), (32, 5), (64, 2.5), (128, 1), (256, 0.35), (512, 0.15))
_PRIOS = ((Priority.LOW, 18), (Priority.BELOW_NORMAL, 8), (Priority.UNDER_NORMAL, 4), (Priority.NORMAL, 36),
          (Priority.ABOVE_NORMAL, 10), (Priority.HIGH, 12), (Priority.VERY_HIGH, 4), (Priority.EXTREME_HIGH, 1),
          (Priority.AUTO, 7))


def _nodes(n: int, zones: int, rng: random.Random) -> list[NodeView]:
    names = [f"n{i:04d}" for i in range(n)]
    per = -(-n // zones)
    drained = set(rng.sample(names, n // 100))
    return [NodeView(name=x, zone=chr(ord("A") + i // per), state=DRAINED if x in drained else ENABLED,
                     reason="validator: GEMM below floor" if x in drained else "") for i, x in enumerate(names)]


class _Sim:
    """The cluster's state between decisions, as the scheduler service would keep it."""

    def __init__(self, nodes: int, zones: int, queued: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.nodes = {n.name: n for n in _nodes(nodes, zones, self.rng)}
        self.enabled = sum(1 for n in self.nodes.values() if n.state == ENABLED)
        self.queued = queued
        self.tasks: dict[int, Task] = {}
        self.ends: dict[int, float] = {}
        self.next_id = 1
        self.users = [f"user{i:02d}" for i in range(60)]
        self.quotas = [Quota(owner=f"team{g}", group="default", priority=p, max_nodes=m)
                       for g in range(6) for p, m in ((Priority.EXTREME_HIGH, 64), (Priority.VERY_HIGH, 256),
                                                      (Priority.HIGH, 512))]
        self.config = SchedConfig()
        self.now = 0.0

    def _new_chain(self) -> None:
        sizes, sw = zip(*_SIZES, strict=True)
        prios, pw = zip(*_PRIOS, strict=True)
        user = self.rng.choice(self.users)
        spec = TaskSpec(user=user, shared_group=f"team{int(user[4:]) % 6}", nodes=self.rng.choices(sizes, sw)[0],
                        priority=self.rng.choices(prios, pw)[0], command=("python", "train.py"))
        i = self.next_id
        self.next_id += 1
        self.tasks[i] = Task(id=i, chain_id=i, spec=spec, submitted_at=self.now)

    def prepare(self) -> None:
        """Everything that happens between two decisions."""
        for t in list(self.tasks.values()):
            if not t.running:
                continue
            if t.releasing:  # the agents stopped it: nodes free, the chain queued as its next run
                self._free(t)
                del self.tasks[t.id]
                nid = self.next_id
                self.next_id += 1
                self.tasks[nid] = Task(id=nid, chain_id=t.chain_id, spec=t.spec, submitted_at=t.submitted_at,
                                       restart_count=t.restart_count + 1, chain_status=SUSPENDED)
            elif self.ends[t.id] <= self.now:
                self._free(t)
                del self.tasks[t.id]
        waiting = sum(1 for t in self.tasks.values() if t.waiting)
        for _ in range(self.queued - waiting):
            self._new_chain()

    def _free(self, t: Task) -> None:
        for x in t.nodes:
            self.nodes[x] = msgspec.structs.replace(self.nodes[x], task=None)

    def apply(self, d: Any) -> None:
        for s in d.starts:
            t = self.tasks[s.task]
            self.tasks[s.task] = msgspec.structs.replace(t, chain_status=RUNNING, queue_status=SCHEDULED,
                                                         priority=s.priority, started_at=self.now, nodes=s.nodes)
            # runs last 5 minutes to 10 hours, log-uniform
            self.ends[s.task] = self.now + 300 * 120 ** self.rng.random()
            for x in s.nodes:
                self.nodes[x] = msgspec.structs.replace(self.nodes[x], task=s.task)
        for p in d.preempts:
            t = self.tasks[p.task]
            self.tasks[p.task] = msgspec.structs.replace(t, suspend_code=SuspendCode.SENT,
                                                         stop_code=StopCode.INTERRUPT)

    def busy(self) -> float:
        held = sum(1 for n in self.nodes.values() if n.task is not None and n.state == ENABLED)
        return held / self.enabled if self.enabled else 0.0


def simulate(nodes: int, zones: int, queued: int, cycles: int, seed: int = 0,
             profile: cProfile.Profile | None = None) -> dict[str, Any]:
    """Run ``cycles`` decisions with ``queued`` runs waiting; the figures of one queue depth."""
    sim = _Sim(nodes, zones, queued, seed)
    times: list[float] = []
    anchor: list[float] = []
    busy: list[float] = []
    depth: list[int] = []
    starts = preempts = 0
    for k in range(cycles):
        sim.now = k * CYCLE_S
        sim.prepare()
        tasks = [t for t in sim.tasks.values() if t.chain_status != FINISHED]
        depth.append(sum(1 for t in tasks if t.waiting))
        node_list = list(sim.nodes.values())
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        d = decide(tasks, node_list, sim.quotas, sim.now, sim.config)
        times.append((time.perf_counter() - t0) * 1000)
        if profile is not None:
            profile.disable()
        # the anchor: what any decision must at least do, order the waiting runs (same inputs)
        t0 = time.perf_counter()
        sorted((-int(t.spec.priority), t.submitted_at, t.id) for t in tasks if t.waiting)
        anchor.append((time.perf_counter() - t0) * 1000)
        sim.apply(d)
        starts += len(d.starts)
        preempts += len(d.preempts)
        busy.append(sim.busy())
    steady = times[1:] or times
    sort_ms = statistics.median(anchor[1:] or anchor)
    return {
        "tasks": queued,
        "cycles": cycles,
        "first_cycle_ms": round(times[0], 2),
        "cycle_ms_median": round(statistics.median(steady), 2),
        "cycle_ms_p95": round(sorted(steady)[max(0, int(len(steady) * 0.95) - 1)], 2),
        "cycle_ms_max": round(max(steady), 2),
        "anchor_sort_ms": round(sort_ms, 3),
        "ratio_to_sort": round(statistics.median(steady) / sort_ms, 1) if sort_ms > 0 else None,
        "busy_min": round(min(busy), 4),
        "busy_median": round(statistics.median(busy), 4),
        "queue_depth_min": min(depth),
        "starts": starts,
        "preempts": preempts,
    }


def preemption_storm(nodes: int, zones: int, queued: int, seed: int = 0, repeat: int = 3) -> dict[str, Any]:
    """The worst cycle we know: every enabled node runs an old 1-node LOW run, ``queued`` HIGH runs
    of 1 to 8 nodes arrive, and the decision preempts the whole cluster at once (median of
    ``repeat``)."""
    rng = random.Random(seed)
    node_list = _nodes(nodes, zones, rng)
    runs: list[Task] = []
    for i, n in enumerate(node_list):
        if n.state != ENABLED:
            continue
        spec = TaskSpec(user=f"user{i % 60:02d}", nodes=1, priority=Priority.LOW, command=("x",))
        runs.append(Task(id=1_000_000 + i, chain_id=1_000_000 + i, spec=spec, submitted_at=-10_000.0,
                         chain_status=RUNNING, queue_status=SCHEDULED, priority=Priority.LOW,
                         started_at=-7200.0 - i, nodes=(n.name,)))
        node_list[i] = msgspec.structs.replace(n, task=1_000_000 + i)
    for i in range(queued):
        spec = TaskSpec(user=f"user{i % 60:02d}", nodes=rng.choice((1, 1, 2, 4, 8)), priority=Priority.HIGH,
                        command=("x",))
        runs.append(Task(id=i + 1, chain_id=i + 1, spec=spec, submitted_at=float(i)))
    times = []
    d = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        d = decide(runs, node_list, [], 0.0)
        times.append((time.perf_counter() - t0) * 1000)
    assert d is not None
    return {"tasks": queued, "cycle_ms_median": round(statistics.median(times), 2), "preempts": len(d.preempts)}


def bench_sched(nodes: int = 1250, zones: int = 2, tasks: int = 10000, cycles: int = 30,
                scaling: Sequence[int] = (100, 300, 1000, 3000, 10000), scaling_cycles: int = 10,
                seed: int = 0, profile: bool = False) -> dict[str, Any]:
    prof = cProfile.Profile() if profile else None
    main_run = simulate(nodes, zones, tasks, cycles, seed, prof)
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue(), file=sys.stderr)
    table = [main_run if q == tasks and cycles >= scaling_cycles else simulate(nodes, zones, q, scaling_cycles, seed)
             for q in scaling]
    goals = [
        {"goal": f"cycle <= {GOAL_CYCLE_MS:g} ms at {tasks} queued (p95)", "value": main_run["cycle_ms_p95"],
         "target": GOAL_CYCLE_MS, "met": main_run["cycle_ms_p95"] <= GOAL_CYCLE_MS},
        {"goal": f">= {GOAL_BUSY:.0%} of nodes busy while the queue is deep (min over cycles)",
         "value": main_run["busy_min"], "target": GOAL_BUSY, "met": main_run["busy_min"] >= GOAL_BUSY},
    ]
    storm = preemption_storm(nodes, zones, tasks, seed)
    return {"bench": "sched", "nodes": nodes, "zones": zones, "cycle_s": CYCLE_S, "seed": seed,
            "run": main_run, "scaling": table, "preemption_storm": storm, "goals": goals,
            "cpu_count": os.cpu_count()}


def _print(result: dict[str, Any]) -> None:
    r = result["run"]
    print(f"decision cycle, {result['nodes']} nodes in {result['zones']} zones, {r['tasks']} queued, "
          f"{r['cycles']} cycles: median {r['cycle_ms_median']} ms, p95 {r['cycle_ms_p95']} ms, "
          f"max {r['cycle_ms_max']} ms (first, empty cluster: {r['first_cycle_ms']} ms); busy min "
          f"{r['busy_min']:.1%}, median {r['busy_median']:.1%}; {r['starts']} starts, {r['preempts']} preemptions")
    print(f"{'queued':>8} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'first ms':>9} {'busy min':>9} "
          f"{'sort ms':>8} {'ratio':>6}")
    for row in result["scaling"]:
        print(f"{row['tasks']:>8} {row['cycle_ms_median']:>10} {row['cycle_ms_p95']:>8} {row['cycle_ms_max']:>8} "
              f"{row['first_cycle_ms']:>9} {row['busy_min']:>9.1%} {row['anchor_sort_ms']:>8} {row['ratio_to_sort']:>6}")
    st = result["preemption_storm"]
    print(f"preemption storm (every node runs an old LOW run, {st['tasks']} HIGH runs arrive): "
          f"{st['cycle_ms_median']} ms, {st['preempts']} preemptions in one cycle")
    for g in result["goals"]:
        print(f"{'met ' if g['met'] else 'MISSED'} {g['goal']}: {g['value']} (target {g['target']})")


def _print_preempt(result: dict[str, Any]) -> None:
    r = result["preemption"]
    print(f"preemption on the local cluster ({r['nodes']} nodes; a {r['low_nodes']}-node LOW run saving through "
          f"fireflyer.ckpt, preempted by a {r['nodes']}-node HIGH run):")
    print(f"{'iter':>4} {'latency s':>10} {'save s':>7} {'goal s':>7} met")
    for i, row in enumerate(r["runs"]):
        print(f"{i:>4} {row['latency_s']:>10} {row['save_s']:>7} {row['goal_s']:>7} {'yes' if row['met'] else 'NO'}")
    for g in result["goals"]:
        print(f"{'met ' if g['met'] else 'MISSED'} {g['goal']}: {g['value']} s (target {g['target']} s)")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give numbers >= 1")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ff bench sched", description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--nodes", type=int, default=1250, help="nodes (default 1250, Fire-Flyer's)")
    p.add_argument("--zones", type=int, default=2, help="network zones (default 2)")
    p.add_argument("--tasks", type=int, default=10000, help="runs kept queued (default 10000)")
    p.add_argument("--cycles", type=int, default=30, help="decisions timed (default 30)")
    p.add_argument("--scaling", type=_ints, default=[100, 300, 1000, 3000, 10000],
                   help="queue depths of the growth table (default 100,300,1000,3000,10000)")
    p.add_argument("--scaling-cycles", type=int, default=10, help="decisions per depth of the table (default 10)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--profile", action="store_true", help="print the decision's cProfile top 25 to stderr")
    live = p.add_argument_group("preemption on a running local cluster (instead of the simulation)")
    live.add_argument("--preempt", action="store_true", help="measure HIGH submit -> its ranks running while a "
                      "LOW run checkpoints (the cluster must be idle)")
    live.add_argument("--state-dir", default=None, help="the cluster (default FF_STATE_DIR or .ff)")
    live.add_argument("--address", default=None, help="the scheduler replicas (comma separated) instead")
    live.add_argument("--iterations", type=int, default=3, help="preemptions measured (default 3)")
    live.add_argument("--timeout", type=float, default=120.0, help="seconds each step may take (default 120)")
    add_json_option(p)
    ns = p.parse_args(argv)
    if ns.preempt:
        from fireflyer.bench.sched_preempt import bench_preempt

        if ns.iterations < 1:
            p.error("--iterations must be >= 1")
        live_result = bench_preempt(ns.state_dir, ns.address, None, ns.iterations, ns.timeout)
        return emit(ns.json, live_result, lambda: _print_preempt(live_result))
    if min(ns.nodes, ns.zones, ns.tasks, ns.cycles, ns.scaling_cycles) < 1 or ns.zones > ns.nodes:
        p.error("--nodes, --zones, --tasks, --cycles, --scaling-cycles must be >= 1, and zones <= nodes")
    result = bench_sched(ns.nodes, ns.zones, ns.tasks, ns.cycles, ns.scaling, ns.scaling_cycles, ns.seed,
                         ns.profile)
    return emit(ns.json, result, lambda: _print(result))


if __name__ == "__main__":
    raise SystemExit(main())
