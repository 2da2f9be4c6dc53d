"""``ff bench health``: the C4-style classifier on synthetic traces with injected faults.

For each size (default 64 and 1,024 virtual nodes) and each fault kind of
:mod:`fireflyer.health.synth` -- a delayed node, a slow link cell, a slow NIC row, a skipped
operation, a stalled connection -- ``--trials`` traces with a random victim and start op are
run through a fresh :class:`~fireflyer.health.c4.C4Detector`.  Finished ops are observed;
a hung op is polled every ``--poll-s`` simulated seconds from its start.  Scored:

- **recall**: trials whose fault was named with the right syndrome and node (or link);
- **precision**: right incidents / all incidents, those of the clean runs included;
- **detection delay**: ops from the fault's first op to the op that named it (1 = the first),
  and simulated seconds from the fault's op start to the evidence (hangs: to the poll);
- **clean**: ``--clean-ops`` fault-free noisy ops per size must give zero incidents;
- **time per op**: the classifier's ``observe`` per clean op, against the plain ``np.median``
  of the same op's arrival and transfer arrays in the same run (what scoring cannot be cheaper than).

Goals: precision and recall >= 0.99, a slow node named within 5 ops, a hang named within the op
deadline + 2 s, zero incidents on the clean ops.  The flash-cut policy's Table VIII replay
(:mod:`fireflyer.health.flashcut`) is reported alongside.  Deterministic: ``--seed``.

``--e2e`` measures on a running local cluster instead (:mod:`fireflyer.bench.health_e2e`): from a
node made slow under a 2-node task to the task running again on healthy nodes from its checkpoint,
against the checkpoint interval.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fireflyer.health.c4 import C4Config, C4Detector, Incident
from fireflyer.health.flashcut import replay_table_viii
from fireflyer.health.synth import FAULT_KINDS, HANG_KINDS, Fault, TraceSpec, expected, generate

from ._jsonout import STDOUT, add_json_option, emit

__all__ = ["run_trial", "fault_trials", "clean_run", "bench_health", "main"]

#: injected magnitudes: a node 0.1 s late (20 % of a 0.5 s step), a connection or NIC 3x slower
MAGNITUDE = {"delay": 0.1, "slow_cell": 3.0, "slow_row": 3.0, "skip": 0.0, "stall": 0.0}


def run_trial(spec: TraceSpec, fault: Fault, config: C4Config, poll_s: float) -> tuple[list[Incident], float]:
    """All incidents of one faulty trace, and the wall time (simulated) the fault began."""
    det = C4Detector(config)
    incidents: list[Incident] = []
    fault_t = 0.0
    for op in generate(spec, (fault,)):
        if op.seq == fault.start:
            fault_t = op.t0
        if op.complete:
            incidents += det.observe(op)
            continue
        for k in range(int((config.deadline_s + 10 * poll_s) / poll_s) + 1):
            got = det.poll(op, op.t0 + k * poll_s)
            incidents += got
            if got:
                break
    return incidents, fault_t


def fault_trials(nodes: int, trials: int, seed: int, config: C4Config, *, poll_s: float = 0.5,
                 warmup: int = 10, after: int = 20, magnitude: dict[str, float] | None = None) -> dict[str, Any]:
    """Per fault kind: detections, wrong incidents and delays over ``trials`` random traces."""
    mag = MAGNITUDE | (magnitude or {})
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for kind in FAULT_KINDS:
        found = wrong = 0
        d_ops: list[int] = []
        d_s: list[float] = []
        for i in range(trials):
            node = int(rng.integers(nodes))
            peer = int((node + rng.choice([1, -1, 2, -2])) % nodes)
            start = warmup + int(rng.integers(config.persist_n))
            fault = Fault(kind=kind, node=node, peer=peer, start=start, magnitude=mag[kind])
            spec = TraceSpec(nodes=nodes, ops=start + after, seed=seed * 100_003 + i * 7 + FAULT_KINDS.index(kind))
            incidents, fault_t = run_trial(spec, fault, config, poll_s)
            want = expected(fault)
            right = [x for x in incidents if x.key() == want]
            wrong += len(incidents) - len(right)
            if right:
                found += 1
                d_ops.append(right[0].seq - start + 1)
                d_s.append(right[0].at - fault_t)
        out[kind] = {
            "trials": trials, "detected": found, "wrong_incidents": wrong,
            "delay_ops_max": max(d_ops) if d_ops else None,
            "delay_ops_median": float(np.median(d_ops)) if d_ops else None,
            "delay_s_max": round(max(d_s), 3) if d_s else None,
            "delay_s_median": round(float(np.median(d_s)), 3) if d_s else None,
        }
    return out


def clean_run(nodes: int, ops: int, seed: int, config: C4Config) -> dict[str, Any]:
    """Incidents on ``ops`` fault-free ops, and the classifier's time per op against np.median."""
    det = C4Detector(config)
    incidents: list[Incident] = []
    t_cls = t_med = 0.0
    for op in generate(TraceSpec(nodes=nodes, ops=ops, seed=seed)):
        t = time.perf_counter()
        incidents += det.observe(op)
        t1 = time.perf_counter()
        np.median(op.arrival)
        np.median(op.edge_s)
        t_med += time.perf_counter() - t1
        t_cls += t1 - t
    return {"ops": ops, "incidents": len(incidents), "first": [_incident_brief(x) for x in incidents[:3]],
            "classifier_us_per_op": round(t_cls / ops * 1e6, 1), "median_us_per_op": round(t_med / ops * 1e6, 1),
            "classifier_over_median": round(t_cls / t_med, 2) if t_med else None}


def _incident_brief(inc: Incident) -> dict[str, Any]:
    return {"syndrome": inc.syndrome, "target": inc.target, "nodes": inc.nodes, "link": inc.link, "seq": inc.seq}


def bench_health(sizes: Sequence[int], *, trials: int, clean_ops: Sequence[int], seed: int,
                 config: C4Config, poll_s: float = 0.5, magnitude: dict[str, float] | None = None) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    tp = fp = det = total = 0
    slow_delay: list[int] = []
    hang_delay: list[float] = []
    clean_incidents = 0
    for nodes, n_clean in zip(sizes, clean_ops, strict=True):
        t = time.perf_counter()
        faults = fault_trials(nodes, trials, seed, config, poll_s=poll_s, magnitude=magnitude)
        clean = clean_run(nodes, n_clean, seed + 1, config)
        results.append({"nodes": nodes, "faults": faults, "clean": clean,
                        "seconds": round(time.perf_counter() - t, 2)})
        clean_incidents += clean["incidents"]
        fp += clean["incidents"]
        for kind, r in faults.items():
            tp += r["detected"]
            fp += r["wrong_incidents"]
            det += r["detected"]
            total += r["trials"]
            if r["delay_ops_max"] is not None and kind not in HANG_KINDS:
                slow_delay.append(r["delay_ops_max"])
            if r["delay_s_max"] is not None and kind in HANG_KINDS:
                hang_delay.append(r["delay_s_max"])
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = det / total if total else 0.0
    summary = {"precision": round(precision, 4), "recall": round(recall, 4),
               "slow_delay_ops_max": max(slow_delay) if slow_delay else None,
               "hang_delay_s_max": max(hang_delay) if hang_delay else None,
               "clean_incidents": clean_incidents}
    goals = [
        {"goal": "precision", "value": summary["precision"], "target": 0.99, "met": precision >= 0.99},
        {"goal": "recall", "value": summary["recall"], "target": 0.99, "met": recall >= 0.99},
        {"goal": "slow named within 5 ops", "value": summary["slow_delay_ops_max"], "target": 5,
         "met": bool(slow_delay) and max(slow_delay) <= 5},
        {"goal": "hang named within deadline + 2 s", "value": summary["hang_delay_s_max"],
         "target": config.deadline_s + 2, "met": bool(hang_delay) and max(hang_delay) <= config.deadline_s + 2},
        {"goal": "no incident on clean ops", "value": clean_incidents, "target": 0, "met": clean_incidents == 0},
    ]
    return {"bench": "health", "seed": seed, "trials_per_fault": trials, "poll_s": poll_s,
            "magnitude": MAGNITUDE | (magnitude or {}),
            "config": {f: getattr(config, f) for f in config.__struct_fields__},
            "sizes": results, "summary": summary, "goals": goals, "flashcut": replay_table_viii()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ff bench health", description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--nodes", default="64,1024", help="virtual node counts, comma-separated (default 64,1024)")
    p.add_argument("--trials", type=int, default=20, help="traces per fault kind and size (default 20)")
    p.add_argument("--clean-ops", default="10000",
                   help="fault-free ops per size, one value or one per size (default 10000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--deadline-s", type=float, default=C4Config().deadline_s, help="op hang deadline (default 30)")
    p.add_argument("--delay-s", type=float, default=MAGNITUDE["delay"], help="how late the delayed node is (default 0.1)")
    p.add_argument("--slow-factor", type=float, default=MAGNITUDE["slow_cell"],
                   help="how much slower the slow cell and NIC row are (default 3)")
    p.add_argument("--poll-s", type=float, default=0.5, help="how often a hung op is polled (default 0.5)")
    live = p.add_argument_group("end to end on a running local cluster (instead of the synthetic traces): "
                                "fault -> the task running again, against the checkpoint interval")
    live.add_argument("--e2e", action="store_true", help="slow one node of a 2-node task and time its naming, "
                      "drain and restart from the checkpoint (the cluster must be idle, with 3 nodes)")
    live.add_argument("--state-dir", default=None, help="the cluster (default FF_STATE_DIR or .ff)")
    live.add_argument("--iterations", type=int, default=3, help="faults measured (default 3)")
    live.add_argument("--save-every", type=int, default=5, help="the task saves every K steps (default 5)")
    live.add_argument("--step-s", type=float, default=0.1, help="the task's seconds of work per step (default 0.1)")
    live.add_argument("--slow-s", type=float, default=0.6, help="seconds the fault adds to each step of the "
                      "victim (default 0.6)")
    live.add_argument("--timeout", type=float, default=120.0, help="seconds the first run may take to save, and (twice "
                      "this) the fault to be named, the task to restart and the node to be back (default 120)")
    add_json_option(p)
    ns = p.parse_args(argv)
    if ns.e2e:
        from fireflyer.bench.health_e2e import bench_health_e2e, print_e2e

        if ns.iterations < 1 or ns.save_every < 1 or ns.step_s <= 0 or ns.slow_s <= 0 or ns.timeout <= 0:
            p.error("--iterations and --save-every must be >= 1, --step-s, --slow-s and --timeout > 0")
        live_result = bench_health_e2e(ns.state_dir, iterations=ns.iterations, save_every=ns.save_every,
                                       step_s=ns.step_s, slow_s=ns.slow_s, timeout_s=ns.timeout)
        return emit(ns.json, live_result, lambda: print_e2e(live_result))
    try:
        sizes = [int(x) for x in ns.nodes.split(",") if x]
        clean = [int(x) for x in ns.clean_ops.split(",") if x]
    except ValueError:
        p.error("--nodes and --clean-ops take comma-separated integers")
    if len(clean) == 1:
        clean = clean * len(sizes)
    if len(clean) != len(sizes) or min(sizes, default=0) < 8 or ns.trials < 1 or min(clean) < 1:
        p.error("need --nodes >= 8 each, --trials >= 1, and --clean-ops >= 1 (one value, or one per size)")
    config = C4Config(deadline_s=ns.deadline_s)
    magnitude = {"delay": ns.delay_s, "slow_cell": ns.slow_factor, "slow_row": ns.slow_factor}
    result = bench_health(sizes, trials=ns.trials, clean_ops=clean, seed=ns.seed, config=config, poll_s=ns.poll_s,
                          magnitude=magnitude)

    def human() -> None:
        print(json.dumps(result, indent=2))

    if ns.json != STDOUT:
        missed = [g["goal"] for g in result["goals"] if not g["met"]]
        print(f"goals missed: {', '.join(missed) or 'none'}", file=sys.stderr)
    return emit(ns.json, result, human)


if __name__ == "__main__":
    raise SystemExit(main())
