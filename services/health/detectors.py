"""The health service's detectors: what it hears on NATS, turned into incidents for the core.

- **C4** (:class:`TelemetryDetector`): every HFReduce worker's op telemetry
  (``ff.coord.v1.comm.*.telemetry`` and the per-user ``ff.user.*.coord.v1.comm.*.telemetry``, in a
  queue group of its own, so coord still gets every batch) goes through a
  :class:`~fireflyer.health.c4feed.CommFeed` per communicator.  A communicator's node ranks are
  named from coord's view of it (``Get``: node rank -> node name, its job), fetched when its
  telemetry first arrives and again at each new generation (a restarted job).  An incident that
  names a node is reported to :meth:`~services.health.core.HealthCore.report_incident` as
  ``c4.<syndrome>`` blaming that node (drain, requeue, validate); one that names a link blames the
  link (recorded).  The job is the scheduler's chain id (``FF_JOB_ID`` of a scheduled task).
- **Node advice** (:class:`AdviceDetector`): a node agent's :class:`~fireflyer.health.events.NodeAdvice`
  (the Xid table's or the flash-cut policy's conclusion, ``ff.node.v1.node.*.advice``) becomes an
  incident: ``drain``, ``reboot_node``, ``reset_gpu`` and ``rma`` blame the node (a GPU that needs a
  reset or a return takes the node out of scheduling until it validates); ``restart_job`` blames the
  job (recorded); ``none`` is ignored.

I/O only; the judgement is in :mod:`fireflyer.health.c4` and :mod:`fireflyer.health.c4feed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fireflyer.coord.convert import CommView
from fireflyer.core.clock import Clock
from fireflyer.core.errors import FireFlyerError
from fireflyer.core.log import EventLogger
from fireflyer.health.c4 import C4Config, Incident
from fireflyer.health.c4feed import CommFeed
from fireflyer.health.events import NodeAdvice
from fireflyer.health.records import Blame, IncidentRecord
from fireflyer.hfreduce.telemetry import TelemetryBatch

__all__ = ["CommLookup", "TelemetryDetector", "AdviceDetector", "NODE_ADVICE"]

#: advice that takes the node out of scheduling (the rest is recorded or ignored)
NODE_ADVICE = ("drain", "reboot_node", "reset_gpu", "rma")

Report = Callable[[IncidentRecord], Awaitable[Any]]


class CommLookup(Protocol):
    async def get(self, comm: str) -> CommView: ...


class TelemetryDetector:
    """C4 over the telemetry stream; ``on_batch`` per message, ``loop`` for the deadlines."""

    def __init__(self, config: C4Config, *, lookup: CommLookup, report: Report, clock: Clock, log: EventLogger,
                 failed_grace_s: float = 3.0, stale_s: float = 60.0, forget_after_s: float = 600.0) -> None:
        self.config = config.validate()
        self.lookup = lookup
        self.report = report
        self.clock = clock
        self.log = log
        self.failed_grace_s = failed_grace_s
        self.stale_s = stale_s
        self.forget_after_s = forget_after_s
        self.feeds: dict[str, CommFeed] = {}
        self.views: dict[str, CommView] = {}
        self._last_heard: dict[str, float] = {}
        #: communicators coord does not know (static peers, or ended): not asked again until then
        self._unknown: dict[str, float] = {}
        self.incidents = 0

    async def on_batch(self, batch: TelemetryBatch, msg: Any = None) -> None:
        now = self.clock.monotonic()
        if not batch.records or self._unknown.get(batch.comm, 0.0) > now:
            return
        self._last_heard[batch.comm] = now
        generation = max(r.generation for r in batch.records)
        feed = self.feeds.get(batch.comm)
        if feed is None or generation > feed.generation:
            try:
                view = await self.lookup.get(batch.comm)
            except FireFlyerError as e:
                self._unknown[batch.comm] = now + 30.0
                self.log.debug("health.c4_comm_unknown", comm=batch.comm, error=str(e))
                return
            if generation > view.generation:  # coord has not seen this generation form: later
                return
            feed = CommFeed(batch.comm, view.nnodes, self.config, generation=view.generation,
                            failed_grace_s=self.failed_grace_s, stale_s=self.stale_s)
            self.feeds[batch.comm], self.views[batch.comm] = feed, view
        await self._report(batch.comm, feed.add(batch.node_rank, batch.records, now))

    async def tick(self) -> None:
        now = self.clock.monotonic()
        for comm, feed in list(self.feeds.items()):
            await self._report(comm, feed.tick(now))
            if now - self._last_heard.get(comm, now) > self.forget_after_s:
                self.feeds.pop(comm, None)
                self.views.pop(comm, None)
                self._last_heard.pop(comm, None)
        for comm in [c for c, until in self._unknown.items() if until <= now]:
            del self._unknown[comm]

    async def loop(self, interval_s: float = 0.5) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.tick()
            except Exception as e:  # noqa: BLE001 - one bad tick must not end detection
                self.log.warning("health.c4_tick_failed", error=repr(e))

    async def _report(self, comm: str, found: list[Incident]) -> None:
        view = self.views.get(comm)
        if not found or view is None:
            return
        names = {n.node_rank: n.node for n in view.nodes}
        task = int(view.job) if view.job.isdigit() else 0
        for inc in found:
            nodes = [names.get(r, f"rank{r}") for r in inc.nodes]
            evidence: dict[str, Any] = {"comm": comm, "generation": view.generation, "op": inc.seq,
                                        "ops": list(inc.ops), "syndrome": inc.syndrome, "action": inc.action,
                                        "node_ranks": list(inc.nodes), **{k: round(v, 6) for k, v in inc.scores.items()}}
            summary = f"{inc.detail} [{comm}; node ranks {', '.join(f'{r}={n}' for r, n in zip(inc.nodes, nodes, strict=True))}]"
            if inc.target == "link":
                recs = [IncidentRecord(kind=f"c4.{inc.syndrome}", blame=Blame.LINK, link="-".join(nodes),
                                       summary=summary, evidence=evidence, job=view.job, task=0)]
            else:
                recs = [IncidentRecord(kind=f"c4.{inc.syndrome}", blame=Blame.NODE, node=name, summary=summary,
                                       evidence=evidence, job=view.job, task=0) for name in nodes]
            for rec in recs:
                self.incidents += 1
                self.log.info("health.c4_incident", comm=comm, syndrome=inc.syndrome, node=rec.node, link=rec.link,
                              chain=task)
                try:
                    await self.report(rec)
                except FireFlyerError as e:
                    self.log.warning("health.c4_report_failed", comm=comm, error=str(e))


class AdviceDetector:
    """Node agents' advice -> incidents (module doc)."""

    def __init__(self, *, report: Report, log: EventLogger) -> None:
        self.report = report
        self.log = log

    async def on_advice(self, adv: NodeAdvice, msg: Any = None) -> None:
        if adv.action == "none" or not adv.node:
            return
        node_level = adv.action in NODE_ADVICE
        what = adv.pci or adv.interface
        rec = IncidentRecord(
            kind=f"{adv.source or 'node'}.{adv.action}", blame=Blame.NODE if node_level else Blame.JOB,
            node=adv.node if node_level else "",
            summary=f"{adv.node}{' ' + what if what else ''}: {adv.reason or adv.action}",
            evidence={"advice": adv.action, "source": adv.source, "pci": adv.pci, "interface": adv.interface,
                      "pid": adv.pid, "events": list(adv.evidence), "advised_at": adv.time, "agent_node": adv.node})
        try:
            await self.report(rec)
        except FireFlyerError as e:
            self.log.warning("health.advice_report_failed", node=adv.node, error=str(e))
