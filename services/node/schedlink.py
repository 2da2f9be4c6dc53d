"""The agent's side of the scheduler (``FF_SCHED_ADDR``): registration as heartbeat, and reports.

- **Register** (``NodeService.Register``, role service, the agent's own token) with the node's labels
  and this agent's gRPC address (where the scheduler calls StartTask, Suspend, StopTask, TailLog),
  every ``heartbeat_interval_s`` the scheduler answers with.  A follower replica answers NotPrimary
  naming the leader; :class:`~fireflyer.sched.client.SchedClient` follows it (and waits out a
  takeover).  A scheduler that does not answer is retried at the next beat; while the agent has
  never registered and the scheduler has been unreachable for less than ``startup_grace_s`` (agents
  and scheduler start together under ``ff up``) that is an info line, not a warning.
- **Report** (``NodeService.Report``) about every task the scheduler started here (task ids are the
  scheduler's run ids; one scheduler rank per node, the node rank): ``running`` once its processes
  run; what the runtime wrote beside the suspend flag (:mod:`fireflyer.node.runtime`: the
  acknowledgement, ``go_suspend``, the whole-life state), before the exit, so the chain's next run
  carries the state; the exit (succeeded when every process of the node exited 0, stopped when the
  scheduler stopped it, else failed, with the first non-zero exit code).  A report the scheduler
  refuses for good (the run is unknown or ended) is not sent again; one that finds no scheduler is
  sent again on the next pass.  A restarted agent reports its ended tasks once more: the scheduler
  ignores reports about runs that already ended.
- **Watchdog** (HAI's): a running task whose processes on this node have written no output for its
  watchdog time (``fireflyer.hai.set_watchdog_time``, else the task's ``FF_WATCHDOG_S``, 1800 s by
  default) is reported with stop code TIMEOUT and stopped; the scheduler stops its other nodes and
  does not requeue it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fireflyer.api.scheduler.v1 import scheduler_pb2 as spb
from fireflyer.core.errors import DeadlineExceeded, FireFlyerError, Unavailable
from fireflyer.mgmt.lease import NotPrimary
from fireflyer.node.model import TaskRecord
from fireflyer.node.runtime import read_ack, read_watchdog, read_whole_life_state

from .tasks import TaskManager

__all__ = ["SchedLink", "exit_report"]

#: the scheduler's StopCode.TIMEOUT (HAI's), the one stop code an agent reports
TIMEOUT = 512


def exit_report(rec: TaskRecord) -> tuple[str, int]:
    """The scheduler's view of an ended task on this node: (rank state, exit code)."""
    codes = [r.exit_code for r in rec.ranks]
    if codes and all(c == 0 for c in codes):
        return "succeeded", 0
    first = next((c for c in codes if c not in (0, None)), -1)
    return ("stopped" if rec.stop_requested else "failed"), int(first if first is not None else -1)


class SchedLink:
    def __init__(self, manager: TaskManager, client: Any, *, agent_address: Callable[[], str], log: Any,
                 interval_s: float = 1.0, report_interval_s: float = 0.2, startup_grace_s: float = 30.0) -> None:
        self.manager = manager
        self.client = client  # a SchedClient (or anything with register_node / report)
        self.agent_address = agent_address
        self.log = log
        self.interval_s = interval_s
        self.report_interval_s = report_interval_s
        self._running_sent: set[str] = set()
        self._runtime_sent: dict[str, tuple[int | None, int | None]] = {}
        self._exit_sent: set[str] = set()
        self._registered = False
        self._ever_registered = False
        self._last_error = ""
        self.startup_grace_s = startup_grace_s
        self._started = time.monotonic()

    # -- registration ------------------------------------------------------------------------------------
    def registration(self) -> spb.RegisterNodeRequest:
        f = self.manager.facts
        return spb.RegisterNodeRequest(name=f.name, group=f.group, zone=f.zone, address=self.agent_address(),
                                       gpus=f.gpus, cpus=f.cpus)

    async def register_once(self) -> float:
        reply = await self.client.register_node(self.registration())
        if not self._registered:
            self.log.info("node.registered", node=self.manager.facts.name, address=self.agent_address())
            self._registered = self._ever_registered = True
        self._last_error = ""
        return float(reply.heartbeat_interval_s) or self.interval_s

    async def register_loop(self) -> None:
        while True:
            interval = self.interval_s
            try:
                interval = await self.register_once()
            except (FireFlyerError, OSError) as e:
                starting = (not self._ever_registered and isinstance(e, Unavailable)
                            and time.monotonic() - self._started < self.startup_grace_s)
                if starting:  # the scheduler is still starting: expected, and said once as info
                    if not self._last_error:
                        self.log.info("node.register_waiting", error=str(e))
                        self._last_error = "(starting)"
                elif str(e) != self._last_error:  # one line per new trouble, not one per beat
                    self.log.warning("node.register_failed", error=str(e))
                    self._last_error = str(e)
                self._registered = False
            await asyncio.sleep(interval)

    # -- reports -----------------------------------------------------------------------------------------
    async def _send(self, key: str, **fields: Any) -> bool:
        """True when the scheduler took it, or refused it for good (do not send it again)."""
        fields.setdefault("whole_life_state", -1)  # (0 would set it: -1 is "no change")
        try:
            await self.client.report(spb.ReportRequest(**fields))
            return True
        except (Unavailable, NotPrimary, DeadlineExceeded) as e:  # no scheduler, or a takeover: later
            self.log.warning("node.report_deferred", task=key, error=str(e))
            return False
        except FireFlyerError as e:  # an unknown or ended run, a rank that moved: nothing to retry
            self.log.warning("node.report_refused", task=key, error=str(e))
            return True

    async def report_once(self) -> None:
        node = self.manager.facts.name
        tasks = dict(self.manager.state.tasks)
        for task_id, rec in tasks.items():
            if not task_id.isdigit() or task_id in self._exit_sent:
                continue
            base = {"task_id": int(task_id), "rank": rec.spec.node_rank, "node": node}
            if not rec.state.ended and task_id not in self._running_sent:
                if await self._send(task_id, state="running", **base):
                    self._running_sent.add(task_id)
            d = self.manager.task_dir(task_id)
            runtime = (read_ack(d), read_whole_life_state(d))
            if runtime != (None, None) and runtime != self._runtime_sent.get(task_id):
                ack, wls = runtime
                if await self._send(task_id, suspend_code=ack or 0, whole_life_state=-1 if wls is None else wls,
                                    **base):
                    self._runtime_sent[task_id] = runtime
                    self.log.info("node.runtime_reported", task=task_id, suspend_code=ack, whole_life_state=wls)
            if not rec.state.ended and not rec.stop_requested and self._watchdog_due(rec, d):
                if await self._send(task_id, stop_code=TIMEOUT, **base):
                    self.log.warning("node.watchdog", task=task_id, node=node)
                    self.manager.stop(task_id)
            if rec.state.ended and self._runtime_sent.get(task_id, (None, None)) == runtime:
                state, code = exit_report(rec)
                if await self._send(task_id, state=state, exit_code=code, **base):
                    self._exit_sent.add(task_id)
        for gone in set(self._exit_sent) - set(tasks):  # the agent forgot it: so can we
            self._exit_sent.discard(gone)
            self._running_sent.discard(gone)
            self._runtime_sent.pop(gone, None)

    @staticmethod
    def _watchdog_due(rec: TaskRecord, task_dir: Path, now: float | None = None) -> bool:
        """No rank of the task on this node has written output for its watchdog time (the runtime's
        ``set_watchdog_time``, else the task's ``FF_WATCHDOG_S``)."""
        limit = read_watchdog(task_dir)
        if limit is None:
            try:
                limit = float(rec.spec.env.get("FF_WATCHDOG_S") or 0)
            except ValueError:
                limit = 0.0
        if not limit > 0:
            return False
        last = rec.started_at
        for r in rec.ranks:
            with contextlib.suppress(OSError):
                last = max(last, os.stat(r.log).st_mtime)
        return (time.time() if now is None else now) - last > limit

    async def report_loop(self) -> None:
        while True:
            try:
                await self.report_once()
            except Exception as e:  # noqa: BLE001 -- one bad pass must not end the reports
                self.log.error("node.report_pass_failed", error=repr(e))
            await asyncio.sleep(self.report_interval_s)
