"""``ff bench health --e2e``: on a running local cluster, from a fault to the task running again on
healthy nodes, against the checkpoint interval.

Each iteration: a 2-node run of ``docs/examples/hai_resumable.py`` saves every ``K`` steps
(``--save-every``, to a local directory) and steps; its seconds per step are measured from its log
(``step N`` lines); then one of its nodes is made slow (``--slow-file``, :mod:`fireflyer.hai.faults`)
and the clock runs from that write:

- **named**: the health service lists a ``c4.noncomm_slow`` incident naming that node for this task
  (C4 over the HFReduce telemetry);
- **ranks running**: the chain's new run has every rank running, on nodes without the victim (the
  service drained it; the scheduler requeued the run);
- **restart**: the new run's rank 0 printed the step it starts at (it loaded the checkpoint) -- the
  task is running again; ``restart_s / checkpoint_interval_s`` is the figure, where the interval is
  ``K`` x the seconds per step measured before the fault;
- **steps lost**: the step the slow run had reached minus the step the new run starts at;
- **back**: the fault removed (once the slow run is gone), the victim, drained by the incident, is
  validated and enabled at the scheduler again.

Beside them, ``first_startup_s``: the first run's time from its ranks running to its rank 0's start
line (process start and HFReduce init, no checkpoint to load), what ``restart_s - ranks_running_s``
is to be compared with.

The task is then stopped, so the cluster is left as found.  The cluster needs 3 enabled, idle nodes
(2 for the task, 1 to take the victim's place) and the health service (``ff up`` of deploy/local.toml).
Timestamps are this process's monotonic clock at the poll that saw each event (``poll_s`` apart; one
loop polls for all of them, within ``2 x timeout_s`` of the fault);
``named_at_service_s`` is the incident's own time (the service's wall clock, the same host here).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from fireflyer.core.errors import DeadlineExceeded, FailedPrecondition, NotFound

from ._poll import until
from .sched_preempt import EXAMPLE

__all__ = ["steps_done", "start_step", "summarize", "measure_e2e", "bench_health_e2e", "print_e2e", "KIND"]

#: the incident a slow node of a job becomes (fireflyer.health.c4, non-communication slow)
KIND = "c4.noncomm_slow"

_STEP = re.compile(r"^step (\d+) restart (\d+)\s*$", re.M)
_START = re.compile(r"^rank 0 start at step (\d+) restart (\d+)", re.M)
T = TypeVar("T")


def steps_done(log: str, restart: int) -> int | None:
    """Steps rank 0's log of the run with restart count ``restart`` has finished (``step N`` is the
    N-th step, from 0, printed after it), or None before its first step."""
    done = [int(m.group(1)) + 1 for m in _STEP.finditer(log) if int(m.group(2)) == restart]
    return max(done) if done else None


def start_step(log: str, restart: int) -> int | None:
    """The step the run with restart count ``restart`` starts at (what its checkpoint held), or None
    before rank 0 has loaded it."""
    got = [int(m.group(1)) for m in _START.finditer(log) if int(m.group(2)) == restart]
    return got[-1] if got else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over iterations of each figure, and the worst ratio."""
    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 3)
    return {"named_s_median": med("named_s"), "ranks_running_s_median": med("ranks_running_s"),
            "restart_s_median": med("restart_s"), "back_s_median": med("back_s"),
            "steps_lost_median": med("steps_lost"), "steps_lost_max": max(r["steps_lost"] for r in runs),
            "checkpoint_interval_s_median": med("checkpoint_interval_s"),
            "restart_over_interval_median": med("restart_over_interval"),
            "restart_over_interval_max": max(r["restart_over_interval"] for r in runs)}


async def _until(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float,
                 interval_s: float = 0.1) -> T:
    return await until(check, what, timeout_s, interval_s=interval_s, bench="health e2e benchmark",
                       hint="`ff task ls --all`, `ff health incidents` and `ff nodes`")


async def _log(c: Any, chain: int, restart: int) -> str:
    return b"".join([d async for d in c.logs(chain, 0, restart=restart)]).decode(errors="replace")


async def _seconds_per_step(c: Any, chain: int, restart: int, window: int, timeout_s: float) -> tuple[float, int]:
    """Seconds per step of the healthy run, timed over ``window`` steps from a step boundary (the
    first poll that sees a new ``step`` line), and the steps done at the end."""
    async def done() -> int | None:
        return steps_done(await _log(c, chain, restart), restart)
    seen = await _until(done, "the run's first step", timeout_s)

    async def next_step() -> int | None:
        n = await done()
        return n if n is not None and n > seen else None
    a = await _until(next_step, "a step boundary", timeout_s, 0.02)
    t_a = time.monotonic()

    async def window_done() -> int | None:
        n = await done()
        return n if n is not None and n >= a + window else None
    b = await _until(window_done, f"{window} steps", timeout_s, 0.02)
    return (time.monotonic() - t_a) / (b - a), b


async def _one(c: Any, h: Any, tag: str, save_every: int, step_s: float, slow_s: float, timeout_s: float,
               poll_s: float) -> dict[str, Any]:
    from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb

    work = Path(tempfile.mkdtemp(prefix=f"ff-bench-health-{tag}-"))
    slow = work / "slow-node"
    cmd = [sys.executable, str(EXAMPLE), "--steps", "1000000", "--step-s", f"{step_s:g}",
           "--save-every", str(save_every), "--local", str(work / "ckpt"), "--name", f"bench-health-{tag}",
           "--slow-file", str(slow)]
    chain = 0
    try:
        # min_runtime_s 0: a drained node's run is stopped at once, as a real fault's would be
        chain = (await c.submit(pb.TaskSpec(name=f"bench-health-e2e-{tag}", nodes=2, priority="NORMAL",
                                            command=cmd, max_restarts=3, min_runtime_s=0.0))).chain_id

        # the first run: until it has saved once; timed too, from its ranks running to its rank 0's
        # start line (process start, HFReduce init, no checkpoint yet), to set the restart's own apart
        deadline = time.monotonic() + timeout_s
        first: Any = None
        first_ranks_t = first_start_t = None
        while True:
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"health e2e benchmark: the 2-node run did not step and save within "
                                       f"{timeout_s:g} s (task {chain}); see `ff task ls --all`", task=chain)
            r = (await c.get(chain)).runs[-1]
            if first_ranks_t is None and r.ranks and all(k.state == "running" for k in r.ranks):
                first_ranks_t, first = time.monotonic(), r
            if first is not None:
                log = await _log(c, chain, first.restart_count)
                if first_start_t is None and start_step(log, first.restart_count) is not None:
                    first_start_t = time.monotonic()
                if first_start_t is not None and f"rank 0 saved step {save_every}\n" in log:
                    break
            await asyncio.sleep(poll_s)
        spp, _ = await _seconds_per_step(c, chain, first.restart_count, max(2 * save_every, 10), timeout_s)

        victim = first.nodes[1]
        slow.write_text(f"{victim}\n{slow_s:g}\n")
        t0, w0 = time.monotonic(), time.time()
        at_fault = steps_done(await _log(c, chain, first.restart_count), first.restart_count) or 0

        # one loop watches every event, so each is timed by the first poll that sees it
        named_s = ranks_s = restart_s = back_s = None
        inc: Any = None
        moved: Any = None
        start = None
        drained = False
        deadline = t0 + 2 * timeout_s
        while restart_s is None or named_s is None or back_s is None:
            if time.monotonic() > deadline:
                missing = [w for w, v in (("named", named_s), ("ranks running", ranks_s), ("restart", restart_s),
                                          ("back in service", back_s)) if v is None]
                raise DeadlineExceeded(f"health e2e benchmark: after slowing {victim}, not within "
                                       f"{2 * timeout_s:g} s: {', '.join(missing)} (task {chain}); see "
                                       "`ff health incidents`, `ff task ls --all`, `ff nodes`", task=chain, node=victim)
            if named_s is None:
                inc = next((i for i in await h.incidents(node=victim)
                            if i.kind == KIND and i.job == str(chain) and i.node == victim), None)
                if inc is not None:
                    named_s = time.monotonic() - t0
            if ranks_s is None:
                r = (await c.get(chain)).runs[-1]
                if (r.restart_count > first.restart_count and r.ranks and victim not in r.nodes
                        and all(k.state == "running" for k in r.ranks)):
                    ranks_s, moved = time.monotonic() - t0, r
                    slow.unlink(missing_ok=True)  # the slow run is gone: the node "recovers"
            if moved is not None and restart_s is None:
                start = start_step(await _log(c, chain, moved.restart_count), moved.restart_count)
                if start is not None:
                    restart_s = time.monotonic() - t0
            if back_s is None:
                # back: drained (by the incident) and then enabled again once validation passed
                state = next((n.state for n in await c.nodes() if n.name == victim), "")
                drained = drained or state == "drained"
                if drained and state == "enabled":
                    back_s = time.monotonic() - t0
            await asyncio.sleep(poll_s)

        chain_now = await c.get(chain)
        slow_run = next(r for r in chain_now.runs if r.restart_count == first.restart_count)
        reached = steps_done(await _log(c, chain, first.restart_count), first.restart_count) or 0
        if start is None or ranks_s is None or moved is None:  # (the loop ends only once all are set)
            raise FailedPrecondition("health e2e benchmark: the restart was not observed", task=chain)
        if start <= 0:
            raise FailedPrecondition(f"health e2e benchmark: run {moved.id} started from step 0, not from a "
                                     "checkpoint", task=chain)
        interval = save_every * spp
        return {"task": chain, "victim": victim, "slow_nodes": list(first.nodes), "new_nodes": list(moved.nodes),
                "incident": inc.id, "incident_ops": _ops(inc.evidence_json),
                "slow_run_stop_reasons": list(slow_run.stop_reasons),
                "first_startup_s": round(first_start_t - first_ranks_t, 3) if first_start_t and first_ranks_t
                else None,
                "seconds_per_step": round(spp, 4), "checkpoint_interval_s": round(interval, 3),
                "named_s": round(named_s, 3), "named_at_service_s": round(inc.at - w0, 3),
                "ranks_running_s": round(ranks_s, 3), "restart_s": round(restart_s, 3),
                "back_s": round(back_s, 3), "step_at_fault": at_fault, "step_reached": reached,
                "start_step": start, "steps_lost": reached - start,
                "restart_over_interval": round(restart_s / interval, 3)}
    finally:
        slow.unlink(missing_ok=True)
        if chain:
            await _stop(c, chain, timeout_s)
        shutil.rmtree(work, ignore_errors=True)


def _ops(evidence_json: str) -> list[int]:
    import json

    try:
        return [int(x) for x in json.loads(evidence_json or "{}").get("ops", [])]
    except (ValueError, TypeError, AttributeError):
        return []


async def _stop(c: Any, chain: int, timeout_s: float) -> None:
    if (await c.get(chain)).runs[-1].chain_status != "finished":
        try:
            await c.stop(chain)
        except FailedPrecondition:  # finished meanwhile
            pass

    async def finished() -> bool:
        return bool((await c.get(chain)).runs[-1].chain_status == "finished")
    await _until(finished, f"task {chain} stopping", timeout_s, 0.2)
    runs = {r.id for r in (await c.get(chain)).runs}

    # the chain is finished before its ranks' exits free the nodes: wait for that too (the next
    # iteration, or whoever runs next, finds the cluster idle)
    async def released() -> bool:
        return not any(n.task in runs for n in await c.nodes())
    await _until(released, f"task {chain}'s nodes released", timeout_s, 0.2)


async def measure_e2e(state_dir: str | None = None, *, iterations: int = 3, save_every: int = 5,
                      step_s: float = 0.1, slow_s: float = 0.6, timeout_s: float = 120.0,
                      poll_s: float = 0.1) -> dict[str, Any]:
    """The fault-to-restart figures on the cluster of ``state_dir``, ``iterations`` times (module doc)."""
    from fireflyer.health.client import HealthClient
    from fireflyer.sched.client import SchedClient

    if not EXAMPLE.is_file():
        raise NotFound(f"health e2e benchmark: {EXAMPLE} is missing (it runs from a source checkout)",
                       path=str(EXAMPLE))
    async with (SchedClient(None, state_dir=state_dir, role="user") as c,
                HealthClient(None, state_dir=state_dir, role="admin") as h):
        usable = [n for n in await c.nodes() if n.state == "enabled" and not n.lost]
        if len(usable) < 3:
            raise FailedPrecondition(f"health e2e benchmark: needs 3 enabled nodes (2 for the task, 1 to replace "
                                     f"the slow one), the cluster has {len(usable)}", nodes=len(usable))
        held = [n for n in usable if n.task]
        if held:
            raise FailedPrecondition(
                f"health e2e benchmark: the cluster is not idle ({held[0].name} holds run {held[0].task}); stop "
                "what runs first (`ff task ls`)", node=held[0].name)
        tag = f"{int(time.time())}"
        runs = []
        for i in range(iterations):
            runs.append(await _one(c, h, f"{tag}-{i}", save_every, step_s, slow_s, timeout_s, poll_s))
            print(f"iteration {i}: restart {runs[-1]['restart_s']} s, checkpoint interval "
                  f"{runs[-1]['checkpoint_interval_s']} s", file=sys.stderr, flush=True)
    return {"iterations": iterations, "nodes": len(usable), "save_every": save_every, "step_s": step_s,
            "slow_s": slow_s, "poll_s": poll_s, "runs": runs, **summarize(runs)}


def bench_health_e2e(state_dir: str | None = None, *, iterations: int = 3, save_every: int = 5,
                     step_s: float = 0.1, slow_s: float = 0.6, timeout_s: float = 120.0) -> dict[str, Any]:
    result = asyncio.run(measure_e2e(state_dir, iterations=iterations, save_every=save_every, step_s=step_s,
                                     slow_s=slow_s, timeout_s=timeout_s))
    return {"bench": "health", "mode": "e2e", "e2e": result}


def print_e2e(result: dict[str, Any]) -> None:
    r = result["e2e"]
    print(f"fault -> task running again, on the local cluster ({r['nodes']} nodes; a 2-node run saving every "
          f"{r['save_every']} steps, one node slowed by {r['slow_s']:g} s a step):")
    print(f"{'iter':>4} {'victim':>7} {'named s':>8} {'ranks s':>8} {'restart s':>9} {'ckpt int s':>10} "
          f"{'ratio':>6} {'lost':>5} {'back s':>7} {'1st start s':>11}")
    for i, x in enumerate(r["runs"]):
        print(f"{i:>4} {x['victim']:>7} {x['named_s']:>8} {x['ranks_running_s']:>8} {x['restart_s']:>9} "
              f"{x['checkpoint_interval_s']:>10} {x['restart_over_interval']:>6} {x['steps_lost']:>5} "
              f"{x['back_s']:>7} {x['first_startup_s']:>11}")
    print("(seconds from the fault: named by C4, the new run's ranks running, its rank 0 resumed from the "
          "checkpoint, the victim enabled again; 1st start: the first run's ranks running -> its rank 0 started)")
    print(f"median: named {r['named_s_median']} s, ranks running {r['ranks_running_s_median']} s, restart "
          f"{r['restart_s_median']} s = {r['restart_over_interval_median']} x the checkpoint interval "
          f"({r['checkpoint_interval_s_median']} s); steps lost {r['steps_lost_median']} (max "
          f"{r['steps_lost_max']}); victim back in service after {r['back_s_median']} s")
