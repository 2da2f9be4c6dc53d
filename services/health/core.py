"""The health service's core: node states, incidents and validations, over ports to the scheduler,
the node agents and the bus (fakes in tests, gRPC and JetStream in the service).

Every state change goes through :func:`fireflyer.health.states.transition` inside one KV
transaction (the node's record and what it implies are written together); after the commit the
change is published as a :class:`~fireflyer.health.records.NodeVerdict` and its actions are
performed: drain or enable at the scheduler, or a validation started on the node agent.  Changes to
one node are serialized by a per-node lock, so an incident and a finishing validation never race.

:meth:`HealthCore.tick` (every ``tick_s``) drives what waits on the world: nodes the scheduler knows
appear here as healthy; a draining node whose run has left becomes drained (and its validation
starts); a drain that did not reach the scheduler is sent again; a drained node with a pending
validation (say, after a restart of this service) gets it; a healthy node whose last level-3 pass is
older than ``periodic_interval_s`` is drained without evicting its task, at most
``periodic_concurrency`` nodes at a time, and validated at level 3 once free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import msgspec

from fireflyer.core.clock import Clock
from fireflyer.core.errors import FireFlyerError, InvalidArgument, NotFound
from fireflyer.core.log import EventLogger
from fireflyer.health.checks import LEVELS, Baseline, LevelPlan, NodeReport, Status
from fireflyer.health.records import (
    Blame,
    IncidentRecord,
    NodeVerdict,
    ValidationRecord,
    ValidationTrigger,
    check_incident,
)
from fireflyer.health.states import (
    INCIDENT_LEVEL,
    PERIODIC_LEVEL,
    Action,
    ActionKind,
    Drain,
    Drained,
    HealthEvent,
    Incident,
    NodeHealth,
    NodeState,
    Transition,
    ValidationFailed,
    ValidationPassed,
    ValidationStarted,
    transition,
)
from fireflyer.kv import KV, Txn

from . import store

__all__ = ["SchedNode", "SchedPort", "AgentPort", "CoreConfig", "HealthCore", "plans_for"]


class SchedNode(msgspec.Struct, frozen=True, kw_only=True):
    """A node as the scheduler lists it."""

    name: str
    #: enabled | drained
    state: str
    #: the run holding it (0: free)
    task: int = 0
    #: the node agent's gRPC address
    address: str = ""


class SchedPort(Protocol):
    async def nodes(self) -> list[SchedNode]: ...

    async def set_state(self, name: str, state: str, reason: str, *, evict: bool) -> None: ...


class AgentPort(Protocol):
    async def validate(self, address: str, node: str, level: int, *, baseline: Baseline, inject: Mapping[str, str],
                       plan: LevelPlan | None, timeout_s: float) -> NodeReport: ...


class CoreConfig(msgspec.Struct, frozen=True, kw_only=True):
    tick_s: float = 1.0
    #: a healthy node is validated at level 3 this long after its last level-3 pass (0: never)
    periodic_interval_s: float = 7 * 86400.0
    #: at most this many nodes draining or validating before a periodic drain starts another
    periodic_concurrency: int = 1
    #: the level a node-blaming incident's validation runs at
    incident_level: int = INCIDENT_LEVEL
    baseline_fraction: float = 0.5
    #: the sizes of each level sent to the agents (None: the runner's own LEVELS)
    plans: dict[int, LevelPlan] | None = None
    #: how long the agent may take for one validation
    validate_timeout_s: float = 7200.0
    #: a node drained for an incident stays out at least this long before its rejoin validation, so
    #: the run it held is placed elsewhere first (a quick pass must not hand it straight back)
    quarantine_s: float = 60.0


class HealthCore:
    def __init__(self, cfg: CoreConfig, *, kv: KV, sched: SchedPort, agents: AgentPort, clock: Clock,
                 log: EventLogger, publish: Callable[[NodeVerdict], Awaitable[None] | None]) -> None:
        self.cfg = cfg
        self.kv = kv
        self.sched = sched
        self.agents = agents
        self.clock = clock
        self.log = log
        self._publish = publish
        self._locks: dict[str, asyncio.Lock] = {}
        #: validations started by the service itself (so that shutdown and tests can wait for them)
        self._running: dict[str, asyncio.Task[ValidationRecord]] = {}
        self._sched_nodes: dict[str, SchedNode] = {}

    def _lock(self, node: str) -> asyncio.Lock:
        return self._locks.setdefault(node, asyncio.Lock())

    # -- reads ------------------------------------------------------------------------------------------
    async def nodes(self) -> list[NodeHealth]:
        return await self.kv.arun(lambda t: store.load_nodes(t, snapshot=True))

    async def node(self, name: str) -> NodeHealth:
        h = await self.kv.arun(lambda t: store.load_node(t, name, snapshot=True))
        if h is None:
            raise NotFound(f"the health service knows no node {name!r}: `ff health nodes` lists them", node=name)
        return h

    async def incidents(self, node: str = "", limit: int = 0) -> list[IncidentRecord]:
        incs = await self.kv.arun(lambda t: store.load_incidents(t, snapshot=True))
        out = [i for i in reversed(incs) if not node or i.node == node or node in i.link.split("-")]
        return out[:limit] if limit > 0 else out

    async def incident(self, ident: str) -> IncidentRecord:
        inc = await self.kv.arun(lambda t: store.load_incident(t, ident, snapshot=True))
        if inc is None:
            raise NotFound(f"no incident {ident!r}: `ff health incidents` lists them", incident=ident)
        return inc

    async def validation(self, ident: str) -> ValidationRecord:
        v = await self.kv.arun(lambda t: store.load_validation(t, ident, snapshot=True))
        if v is None:
            raise NotFound(f"no validation {ident!r}", validation=ident)
        return v

    async def baseline(self, node: str) -> Baseline:
        b = await self.kv.arun(lambda t: store.load_baseline(t, node, snapshot=True))
        return b if b is not None else Baseline(fraction=self.cfg.baseline_fraction)

    # -- incidents --------------------------------------------------------------------------------------
    async def report_incident(self, inc: IncidentRecord, reporter: str = "") -> IncidentRecord:
        """Record an incident and act on it: one that blames a node makes it suspect, drains it at the
        scheduler (its running task stopped and requeued elsewhere) and, once drained, validates it at
        ``incident_level``; a pass enables it again.  Links and jobs are recorded (a link names two
        nodes, and which is at fault needs more than one report).  Returns the stored record; its
        ``actions`` grow as the service acts (``GetIncident`` shows them)."""
        check_incident(inc)
        task = inc.task
        if inc.blame is Blame.NODE and not task:
            with contextlib.suppress(FireFlyerError):  # (unknown is fine: the record says 0)
                task = next((n.task for n in await self.sched.nodes() if n.name == inc.node), 0)

        def save(t: Txn) -> IncidentRecord:
            rec = msgspec.structs.replace(inc, id=store.next_id(t, "inc"), at=inc.at or self.clock.time(),
                                          reporter=reporter or inc.reporter, task=task, actions=())
            store.save_incident(t, rec)
            return rec
        rec = await self.kv.arun(save)
        self.log.warning("health.incident", incident=rec.id, kind=rec.kind, blame=rec.blame.value, node=rec.node,
                         link=rec.link, task=rec.task, summary=rec.summary)
        if rec.blame is not Blame.NODE:
            await self._note(rec.id, f"recorded: it blames a {rec.blame.value}, no node is drained for it")
            return await self.incident(rec.id)
        why = f"incident {rec.id} ({rec.kind}): {rec.summary or 'no summary'}"
        async with self._lock(rec.node):
            h = await self._load_or_new(rec.node)
            if h.state not in (NodeState.HEALTHY, NodeState.SUSPECT):
                await self._note(rec.id, f"{rec.node} is already {h.state.value} ({h.reason}): nothing more to do")
                return await self.incident(rec.id)
            await self._apply(rec.node, Incident(incident=rec.id, reason=why))
            await self._apply(rec.node, Drain(reason=why, level=self.cfg.incident_level, evict=True))
        return await self.incident(rec.id)

    async def _note(self, incident: str, action: str) -> None:
        """Append one line to an incident's actions."""
        if not incident:
            return

        def fn(t: Txn) -> None:
            rec = store.load_incident(t, incident)
            if rec is not None:
                store.save_incident(t, msgspec.structs.replace(rec, actions=(*rec.actions, action)))
        await self.kv.arun(fn)

    # -- transitions ------------------------------------------------------------------------------------
    async def _load_or_new(self, name: str) -> NodeHealth:
        now = self.clock.time()

        def fn(t: Txn) -> NodeHealth:
            h = store.load_node(t, name)
            if h is None:
                h = NodeHealth(name=name, since=now, first_seen=now, reason="first seen")
                store.save_node(t, h)
            return h
        return await self.kv.arun(fn)

    async def _apply(self, name: str, event: HealthEvent) -> Transition:
        """One transition (the caller holds the node's lock): commit, publish, perform its actions."""
        now = self.clock.time()

        def fn(t: Txn) -> tuple[Transition, str]:
            h = store.load_node(t, name) or NodeHealth(name=name, since=now, first_seen=now)
            tr = transition(h, event, now)
            store.save_node(t, tr.health)
            return tr, h.incident
        tr, incident_before = await self.kv.arun(fn)
        h = tr.health
        self.log.info("health.transition", node=name, before=tr.before.value, after=tr.after.value, cause=tr.event,
                      reason=tr.reason, actions=[a.kind.value for a in tr.actions])
        verdict = NodeVerdict(node=name, before=tr.before.value, after=tr.after.value, cause=tr.event,
                              reason=tr.reason, actions=tuple(a.kind.value for a in tr.actions),
                              incident=h.incident or incident_before, validation=h.validation, at=now)
        try:
            out = self._publish(verdict)
            if out is not None:
                await out
        except FireFlyerError as e:  # the state stands; a verdict that cannot be queued is logged
            self.log.error("health.publish_failed", node=name, error=str(e))
        # (a pass clears the node's incident: its enable is still that incident's last action)
        incident = h.incident or incident_before
        if isinstance(event, Incident):
            await self._note(incident, f"{name} marked suspect")
        for action in tr.actions:
            await self._perform(name, action, incident)
        return tr

    async def _perform(self, name: str, action: Action, incident: str) -> None:
        if action.kind is ActionKind.VALIDATE:
            trigger = ValidationTrigger.PERIODIC if action.level == PERIODIC_LEVEL and not incident \
                else ValidationTrigger.REJOIN
            if incident and self.cfg.quarantine_s > 0:  # the tick starts it once the quarantine is over
                await self._note(incident, f"{name} drained and free; level-{action.level} validation after "
                                           f"{self.cfg.quarantine_s:g} s of quarantine")
                return
            self._spawn_validation(name, action.level, trigger, requested_by=f"health ({trigger.value})")
            await self._note(incident, f"{name} drained and free; level-{action.level} validation requested")
            return
        state = "drained" if action.kind is ActionKind.DRAIN else "enabled"
        # the run it holds now (a cached view may predate the run the incident is about)
        held = self._sched_nodes.get(name)
        if action.kind is ActionKind.DRAIN and action.evict:
            with contextlib.suppress(FireFlyerError):  # (away: the cached view will do for the note)
                held = next((n for n in await self._scheduler_nodes() if n.name == name), held)
        try:
            await self.sched.set_state(name, state, action.reason if state == "drained" else "", evict=action.evict)
        except FireFlyerError as e:  # a drain is sent again by the tick; an enable by the next validation
            self.log.warning("health.scheduler_failed", node=name, state=state, error=str(e))
            await self._note(incident, f"{state} {name} at the scheduler FAILED ({e}); retrying")
            return
        if state == "drained":
            evicted = f" (its run {held.task} stopped to be requeued elsewhere)" if action.evict and held and held.task \
                else ""
            await self._note(incident, f"drained {name} at the scheduler{evicted}")
        else:
            await self._note(incident, f"enabled {name} at the scheduler")

    # -- validation -------------------------------------------------------------------------------------
    def _spawn_validation(self, name: str, level: int, trigger: ValidationTrigger, *, requested_by: str) -> None:
        task = asyncio.create_task(self._validate_locked(name, level, trigger, {}, requested_by),
                                   name=f"health-validate-{name}")
        key = f"{name}/{id(task)}"
        self._running[key] = task
        task.add_done_callback(lambda t: self._done(key, t))

    def _done(self, key: str, task: asyncio.Task[ValidationRecord]) -> None:
        self._running.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("health.validation_crashed", task=key, error=repr(task.exception()))

    async def _validate_locked(self, name: str, level: int, trigger: ValidationTrigger, inject: Mapping[str, str],
                               requested_by: str) -> ValidationRecord:
        async with self._lock(name):
            return await self._validate(name, level, trigger, inject, requested_by)

    async def validate(self, name: str, level: int = 1, *, inject: Mapping[str, str] | None = None,
                       requested_by: str = "") -> tuple[ValidationRecord, NodeHealth]:
        """Validate ``name`` now (on demand) and return the record and the node's health after it.
        A healthy or suspect node is validated in service (drained if it fails); a drained one is
        enabled if it passes; a draining or validating one is refused (FAILED_PRECONDITION)."""
        if level not in LEVELS:
            raise InvalidArgument(f"level must be one of {sorted(LEVELS)}, got {level}", field="level")
        known = {n.name for n in await self._scheduler_nodes()}
        async with self._lock(name):
            if name not in known and await self.kv.arun(lambda t: store.load_node(t, name, snapshot=True)) is None:
                raise NotFound(f"no node {name!r}: `ff health nodes` lists them", node=name)
            await self._load_or_new(name)
            rec = await self._validate(name, level, ValidationTrigger.ON_DEMAND, inject or {}, requested_by)
        return rec, await self.node(name)

    async def _validate(self, name: str, level: int, trigger: ValidationTrigger, inject: Mapping[str, str],
                        requested_by: str) -> ValidationRecord:
        now = self.clock.time()
        vid = await self.kv.arun(lambda t: store.next_id(t, "val"))
        rec = ValidationRecord(id=vid, node=name, level=level, trigger=trigger, started_at=now, inject=dict(inject),
                               requested_by=requested_by)
        await self._apply(name, ValidationStarted(validation=vid, level=level))  # (refuses a busy node)
        await self.kv.arun(lambda t: store.save_validation(t, rec))
        incident = (await self.node(name)).incident
        base = await self.baseline(name)
        try:
            address = next((n.address for n in await self._scheduler_nodes() if n.name == name), "")
            if not address:
                raise NotFound(f"the scheduler knows no agent address for node {name}", node=name)
            plan = (self.cfg.plans or {}).get(level)
            report = await self.agents.validate(address, name, level, baseline=base, inject=inject, plan=plan,
                                                timeout_s=self.cfg.validate_timeout_s)
            rec = msgspec.structs.replace(rec, finished_at=self.clock.time(), status=report.status,
                                          results=tuple(report.results), not_run=dict(report.not_run))
        except FireFlyerError as e:
            rec = msgspec.structs.replace(rec, finished_at=self.clock.time(), status=Status.ERROR,
                                          error=f"the validation could not run on {name}: {e}")
        passed = rec.status is Status.PASS

        def save(t: Txn) -> None:
            store.save_validation(t, rec)
            if passed and not inject:  # the node's first good throughputs become its baseline
                old = store.load_baseline(t, name) or Baseline(fraction=self.cfg.baseline_fraction)
                new = _new_metrics(old, rec)
                if new:
                    store.save_baseline(t, name, old.with_values(new))
        await self.kv.arun(save)
        self.log.info("health.validated", node=name, validation=vid, validation_level=level, status=rec.status,
                      trigger=trigger.value, summary=rec.summary())
        await self._note(incident, f"validation {vid} (level {level}) {rec.status}: {rec.summary()}")
        if passed:
            await self._apply(name, ValidationPassed(validation=vid, level=level))
        else:
            await self._apply(name, ValidationFailed(validation=vid, level=level, reason=rec.summary()))
        return rec

    # -- the loop ---------------------------------------------------------------------------------------
    async def _scheduler_nodes(self) -> list[SchedNode]:
        nodes = await self.sched.nodes()
        self._sched_nodes = {n.name: n for n in nodes}
        return nodes

    async def tick(self) -> None:
        """One pass over the nodes (see the module doc)."""
        now = self.clock.time()
        sched = {n.name: n for n in await self._scheduler_nodes()}
        ours = {h.name: h for h in await self.nodes()}
        for name in sched.keys() - ours.keys():
            await self._load_or_new(name)
        ours = {h.name: h for h in await self.nodes()}
        busy = sum(1 for h in ours.values() if h.state in (NodeState.DRAINING, NodeState.VALIDATING))
        validating = {k.split("/")[0] for k in self._running}
        for name, h in sorted(ours.items()):
            s = sched.get(name)
            if h.state is NodeState.DRAINING and s is not None:
                if s.state != "drained":  # the drain did not reach the scheduler: send it again
                    async with self._lock(name):
                        await self._perform(name, Action(kind=ActionKind.DRAIN, reason=h.reason, evict=h.evict),
                                            h.incident)
                elif not s.task:
                    async with self._lock(name):
                        if (await self.node(name)).state is NodeState.DRAINING:
                            await self._apply(name, Drained())
            elif (h.state is NodeState.DRAINED and h.pending_level and name not in validating
                  and now - h.since >= (self.cfg.quarantine_s if h.incident else 0.0)):
                self._spawn_validation(name, h.pending_level, ValidationTrigger.REJOIN, requested_by="health (rejoin)")
            elif (h.state is NodeState.HEALTHY and self.cfg.periodic_interval_s > 0 and s is not None
                  and busy < self.cfg.periodic_concurrency
                  and now - max(h.last_passed.get(PERIODIC_LEVEL, 0.0), h.first_seen) >= self.cfg.periodic_interval_s):
                async with self._lock(name):
                    await self._apply(name, Drain(reason=f"periodic level-{PERIODIC_LEVEL} validation",
                                                  level=PERIODIC_LEVEL, evict=False))
                busy += 1

    async def loop(self) -> None:
        from fireflyer.core.patience import Patience

        # (the scheduler starts beside this service: a refusal is INFO at first, WARNING if it lasts)
        patience = Patience(self.log, "health.tick_failed")
        while True:
            try:
                await self.tick()
            except FireFlyerError as e:  # the scheduler away, a KV hiccup: the next tick tries again
                patience.failed(e, kind=e.kind)
            else:
                patience.ok()
            await asyncio.sleep(self.cfg.tick_s)

    async def idle(self, timeout_s: float = 30.0) -> None:
        """Wait until the validations the service started have finished (tests, shutdown)."""
        async with asyncio.timeout(timeout_s):
            while self._running:
                await asyncio.gather(*list(self._running.values()), return_exceptions=True)

    async def stop(self) -> None:
        for t in list(self._running.values()):
            t.cancel()
        await asyncio.gather(*list(self._running.values()), return_exceptions=True)


def _new_metrics(old: Baseline, rec: ValidationRecord) -> dict[str, float]:
    """Throughputs of a passing run that the baseline does not have yet.  The baseline is the node's
    first good run's (not a moving average): a node that slowly degrades must not drag its own
    threshold down with it."""
    from fireflyer.health.checks import NodeReport, baseline_from

    measured = baseline_from(NodeReport(level=rec.level, status=Status.PASS, results=list(rec.results))).values
    return {k: v for k, v in measured.items() if k not in old.values}


def plans_for(sizes: str) -> dict[int, LevelPlan] | None:
    """``full``: the runner's own sizes (DCGM-like: seconds, minutes, hours); ``quick``: every level at
    sizes that take seconds on a laptop (the local cluster; each level keeps its pattern tests)."""
    if sizes == "full":
        return None
    if sizes == "quick":
        return {level: LevelPlan(cpu_n=2048, cpu_rounds=100, mem_bw_mib=16, mem_bw_repeats=2, pattern_mib=4,
                                 pattern_tests=p.pattern_tests, gemm_budget_bytes=16 << 20, allreduce_mib=1,
                                 allreduce_iters=1, storage_files=1, storage_mib=1)
                for level, p in LEVELS.items()}
    raise InvalidArgument(f"health.sizes must be full or quick, got {sizes!r}", field="sizes")

