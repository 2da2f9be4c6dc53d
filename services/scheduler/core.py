"""One scheduler replica: the lease, the leader's decision loop, and every read and write.

Leader election is mgmtd's (:mod:`fireflyer.mgmt.lease`): every ``renew_s`` each replica runs one KV
transaction that extends its lease, takes over an expired one or follows the holder.  The leader
runs the decision loop, every ``tick_s`` and at once after a write that may change the decision
(a submit, a stop, a report, a drain):

1. one serializable transaction, which re-reads the lease (``ensure_primary``) so a deposed leader
   commits nothing: read the unfinished runs, nodes and quotas; mark runs whose stop is due
   (:func:`fireflyer.sched.lifecycle.stop_due`); call :func:`fireflyer.sched.policy.decide`; write
   its starts (runs on their nodes, nodes held), preemptions (suspend handshake SENT) and the
   waiting runs' reasons;
2. after the commit, the node actions through :class:`~fireflyer.sched.agents.NodeAgents`: start
   each rank, send the suspend flag to every node of a preempted run, stop runs.

A leader that dies between 1 and 2 loses no task: the new leader re-sends what the records say is
in flight (ranks still ``created``, interrupts not yet answered, stops not yet done) when it takes
over; agents take repeats as no-ops.  Writes (submit, stop, node and quota changes, agents'
reports) are leader-only and each is one transaction that checks the lease; a follower refuses them
with :class:`~fireflyer.mgmt.lease.NotPrimary` naming the leader, and the client retries there.
Reads are served by every replica from the KV.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace

from fireflyer.core.clock import Clock
from fireflyer.core.errors import (
    FailedPrecondition,
    FireFlyerError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from fireflyer.core.log import EventLogger
from fireflyer.kv import KV, Txn
from fireflyer.mgmt.lease import LeaseConfig, NotPrimary
from fireflyer.sched import lifecycle
from fireflyer.sched.agents import NodeAgents, NodeRef, RankLaunch
from fireflyer.sched.model import (
    DRAINED,
    ENABLED,
    RUNNING,
    Priority,
    Quota,
    RankState,
    SchedConfig,
    StopCode,
    SuspendCode,
    Task,
    TaskSpec,
    check_spec,
)
from fireflyer.sched.policy import decide
from fireflyer.sched.records import NodeRecord, RunRecord
from fireflyer.telemetry import extract, inject, tracer

from . import store
from .leader import Leadership
from .metrics import QueueView, queue_view

__all__ = ["CoreConfig", "Caller", "SchedCore", "Effects", "QuotaUse"]

_tracer = tracer("services.scheduler")
R = TypeVar("R")


class CoreConfig(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    lease: LeaseConfig
    sched: SchedConfig
    tick_s: float = 1.0
    heartbeat_interval_s: float = 1.0
    #: a node whose agent has not registered (heartbeated) for this long is lost: its runs stop
    #: with NODE_LOST and are requeued elsewhere, and it gets no work until it is back (0: never)
    node_timeout_s: float = 30.0
    #: a start or stop without an answer for this long is sent again
    resend_s: float = 10.0


class Caller(msgspec.Struct, frozen=True):
    """Who calls: a user name and whether it is an admin (admins see and change every task)."""

    user: str
    admin: bool = False


class QuotaUse(msgspec.Struct, frozen=True, kw_only=True):
    owner: str
    group: str
    priority: Priority
    used: int
    limit: int | None


class Effects(msgspec.Struct, kw_only=True):
    """Node actions a committed transaction asks for (performed after the commit)."""

    starts: list[tuple[RunRecord, list[int]]] = msgspec.field(default_factory=list)  # run, its ranks to start
    suspends: list[RunRecord] = msgspec.field(default_factory=list)
    stops: list[tuple[RunRecord, float]] = msgspec.field(default_factory=list)  # run, SIGTERM->SIGKILL grace

    def __bool__(self) -> bool:
        return bool(self.starts or self.suspends or self.stops)


def _check_owner(rec: RunRecord, caller: Caller, action: str) -> None:
    if not caller.admin and rec.user != caller.user:
        raise PermissionDenied(f"task {rec.task.chain_id} belongs to {rec.user}; {caller.user} may not {action} it "
                               f"(only its owner or an admin may)", task=rec.task.chain_id, owner=rec.user)


class SchedCore:
    """One replica's lease, decision loop (while leader) and the service's operations."""

    def __init__(self, cfg: CoreConfig, *, kv: KV, agents: NodeAgents, clock: Clock, log: EventLogger,
                 address: Callable[[], str]) -> None:
        self.cfg = cfg
        self.kv = kv
        self.agents = agents
        self.clock = clock
        self.log = log
        self._address = address
        self.leadership = Leadership(cfg.node_id, cfg.lease, kv=kv, clock=clock, log=log, address=address,
                                     on_lead=self._on_lead, on_lose=self._on_lose)
        self._lead_since = 0.0
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        #: when this leader last re-sent a run's start or stop (:meth:`_resend_stale`)
        self._resent: dict[int, float] = {}
        #: node actions in flight (so that shutdown and tests can wait for them)
        self._actions: set[asyncio.Task[None]] = set()
        #: the queue and nodes as the last decision cycle left them (metrics; None before the first)
        self.queue_view: QueueView | None = None

    @property
    def node_id(self) -> str:
        return self.cfg.node_id

    @property
    def address(self) -> str:
        return self._address()

    # -- leadership ---------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.leadership.is_leader()

    def not_leader(self) -> NotPrimary:
        return self.leadership.not_leader()

    async def lease_loop(self) -> None:
        await self.leadership.loop()

    async def _on_lead(self, term: int) -> None:
        # heartbeats sent to the old leader while it died were lost: count silence from now on
        self._lead_since = self.clock.time()
        self._resent.clear()
        # what a dead leader may have left half done: re-send it (agents take repeats as no-ops)
        effects = await self.kv.arun(lambda t: _in_flight(store.active_runs(t, snapshot=True), self.cfg.sched))
        self.log.info("scheduler.leader", node=self.node_id, term=term, address=self.address,
                      resend_starts=len(effects.starts), resend_suspends=len(effects.suspends),
                      resend_stops=len(effects.stops))
        if not self.is_leader():
            return
        self._perform(effects)
        self._loop_task = asyncio.create_task(self._decision_loop(), name="scheduler-decide")

    def _on_lose(self, reason: str) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._lead_since = 0.0

    def step_down(self, reason: str) -> None:
        self.leadership.step_down(reason)

    async def release(self) -> None:
        """On a clean stop: hand the lease on, and stop acting."""
        for t in list(self._actions):
            t.cancel()
        await self.leadership.release()

    def crash(self) -> None:
        """Stop acting at once without handing the lease on (a test's stand-in for SIGKILL)."""
        self.leadership.crash()
        for t in list(self._actions):
            t.cancel()

    # -- writes ---------------------------------------------------------------------------------
    async def mutate(self, fn: Callable[[Txn, float], R], *, wake: bool = True, idempotency_key: bytes | None = None,
                     result_type: Any = None) -> R:
        """Run ``fn(txn, now)`` in one transaction as the leader only (the lease re-read inside).

        With ``idempotency_key`` a retry of the same request (a client that lost the reply) gets the
        recorded result instead of a second change."""
        if not self.is_leader():
            raise self.not_leader()
        clock = self.clock

        def txn(t: Txn) -> R:
            now = clock.time()
            if not self.leadership.holds(store.load_lease(t), now):
                raise self.not_leader()
            return fn(t, now)

        if idempotency_key is not None:
            out = await self.kv.arun(txn, idempotency_key=idempotency_key, result_type=result_type)
        else:
            out = await self.kv.arun(txn)
        if wake:
            self._wake.set()
        return out

    # -- the decision loop ---------------------------------------------------------------------------
    async def _decision_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.tick_s):
                    await self._wake.wait()
            self._wake.clear()
            if not self.is_leader():
                self.step_down("lease expired before a decision")
                return
            try:
                effects = await self.mutate(self._cycle, wake=False)
            except NotPrimary:
                self.step_down("a cycle found another lease holder")
                return
            except FireFlyerError as e:
                self.log.warning("scheduler.cycle_failed", error=str(e), kind=e.kind)
                continue
            self._perform(effects)

    async def cycle_once(self) -> Effects:
        """One decision cycle now (tests); the node actions are started, not awaited."""
        effects = await self.mutate(self._cycle, wake=False)
        self._perform(effects)
        return effects

    def lost_nodes(self, nodes: Iterable[NodeRecord], now: float) -> dict[str, float]:
        """Nodes silent for longer than ``node_timeout_s`` (name -> seconds silent), as this leader sees it."""
        limit = self.cfg.node_timeout_s
        if limit <= 0:
            return {}
        return {n.name: now - n.last_seen_at for n in nodes
                if now - max(n.last_seen_at, self._lead_since) > limit}

    def _cycle(self, t: Txn, now: float) -> Effects:
        runs = store.active_runs(t)
        nodes = {n.name: n for n in store.load_nodes(t)}
        quotas = store.load_quotas(t)
        cfg = self.cfg.sched
        effects = Effects()
        by_id: dict[int, RunRecord] = {}
        lost = self.lost_nodes(nodes.values(), now)
        for rec in runs:
            for r in rec.task.ranks if rec.task.running else ():
                if r.node in lost and r.state not in lifecycle.TERMINAL:
                    why = (f"node {r.node} lost: its agent has not heartbeated for {lost[r.node]:.0f} s "
                           f"(node_timeout_s {self.cfg.node_timeout_s:g})")
                    self.log.warning("scheduler.node_lost", node=r.node, task=rec.id, silent_s=round(lost[r.node], 1))
                    rec = lifecycle.request_stop(rec, StopCode.NODE_LOST, now, why)
                    rec = self._apply_report(t, now, rec, r.rank, RankState.FAILED, -1, None, None)
                    nodes[r.node] = store.load_node(t, r.node) or nodes[r.node]
            if not rec.task.running and not rec.task.waiting:
                continue  # (it ended just now; its next run, if any, is decided next cycle)
            grace = lifecycle.stop_due(rec, now, cfg)
            if grace is not None:
                rec = msgspec.structs.replace(rec, stop_sent_at=now)
                store.save_run(t, rec)
                effects.stops.append((rec, grace))
            by_id[rec.id] = rec
        for rec in self._resend_stale(t, list(by_id.values()), now, effects):
            if rec.task.running:
                by_id[rec.id] = rec
            else:  # it ended (its next run, if any, is decided next cycle)
                del by_id[rec.id]
        backing_off = {r.id for r in by_id.values() if r.not_before is not None and r.not_before > now
                       and r.task.waiting}
        views = [n.view() if n.name not in lost else msgspec.structs.replace(
            n.view(), state=DRAINED, reason=f"agent silent for {lost[n.name]:.0f} s") for n in nodes.values()]
        d = decide([r.task for r in by_id.values() if not r.held and r.id not in backing_off], views, quotas, now,
                   cfg)
        for s in d.starts:
            rec = lifecycle.start(by_id[s.task], s, now)
            by_id[rec.id] = rec
            store.save_run(t, rec)
            for name in s.nodes:
                node = nodes[name]
                node.task = rec.id
                store.save_node(t, node)
            effects.starts.append((rec, list(range(len(s.nodes)))))
            self.log.info("scheduler.start", task=rec.id, chain=rec.task.chain_id, nodes=list(s.nodes),
                          priority=s.priority.name)
        for p in d.preempts:
            rec = lifecycle.interrupt(by_id[p.task], now, p.reason)
            by_id[rec.id] = rec
            store.save_run(t, rec)
            effects.suspends.append(rec)
            self.log.info("scheduler.preempt", task=p.task, for_task=p.for_task, reason=p.reason)
        waiting = {run_id: (reason.message, reason.code) for run_id, reason in d.waiting.items()}
        for run_id in backing_off:
            rec = by_id[run_id]
            assert rec.not_before is not None
            waiting[run_id] = (f"its last {rec.unschedulable} run(s) could not start; next try in "
                               f"{rec.not_before - now:.0f} s", "backoff")
        for run_id, (message, code) in waiting.items():
            rec = by_id[run_id]
            if rec.reason_code != code or (rec.reason != message and code != "backoff"):
                store.save_run(t, msgspec.structs.replace(rec, reason=message, reason_code=code))
        # (a retried transaction runs this again: the last run's view stands)
        self.queue_view = queue_view(
            (waiting[r.id][1] if r.id in waiting else "held" if r.held else "none"
             for r in by_id.values() if r.task.waiting),
            (n.view() if n.name not in lost else msgspec.structs.replace(n.view(), state=DRAINED)
             for n in nodes.values()))
        return effects

    def _resend_stale(self, t: Txn, runs: list[RunRecord], now: float, effects: Effects) -> list[RunRecord]:
        """Starts and stops that got no answer for ``resend_s`` go out again (a lost message, a commit
        whose outcome was unknown); agents take repeats as no-ops.  A run told to stop whose ranks
        never reported a start by then never ran there: those ranks count as stopped (so a run whose
        start was lost does not wait forever for their exit).  Returns the runs it changed."""
        every = self.cfg.resend_s
        seen = set()
        changed = []
        for rec in runs:
            task = rec.task
            if not task.running:
                continue
            seen.add(rec.id)
            last = max(self._resent.get(rec.id, 0.0), task.started_at or now, rec.stop_sent_at or 0.0)
            if now - last < every:
                continue
            if rec.stop_sent_at is not None:
                never_started = [r.rank for r in task.ranks if r.state == RankState.CREATED]
                for rank in never_started:
                    rec = self._apply_report(t, now, rec, rank, RankState.STOPPED, -1, None, None)
                if never_started:
                    changed.append(rec)
                if not rec.task.running:
                    continue
                effects.stops.append((rec, lifecycle.grace_final(rec, self.cfg.sched)))
            else:
                created = [r.rank for r in task.ranks if r.state == RankState.CREATED]
                if not created:
                    continue
                effects.starts.append((rec, created))
            self._resent[rec.id] = now
            self.log.info("scheduler.resend", task=rec.id, what="stop" if rec.stop_sent_at is not None else "start")
        for gone in set(self._resent) - seen:
            del self._resent[gone]
        return changed

    # -- node actions ------------------------------------------------------------------------------------
    def _perform(self, effects: Effects) -> None:
        if not effects:
            return
        task = asyncio.create_task(self._act(effects), name="scheduler-actions")
        self._actions.add(task)
        task.add_done_callback(self._actions.discard)

    async def idle(self, timeout_s: float = 10.0) -> None:
        """Wait until the node actions started so far have been sent (tests)."""
        async with asyncio.timeout(timeout_s):
            while self._actions:
                await asyncio.gather(*list(self._actions), return_exceptions=True)

    async def _act(self, effects: Effects) -> None:
        chains = {rec.task.chain_id for rec, _ in effects.starts}

        def read(t: Txn) -> tuple[list[NodeRecord], dict[int, str]]:
            return (store.load_nodes(t, snapshot=True),
                    {c: store.load_credential(t, c, snapshot=True) for c in chains})
        loaded, creds = await self.kv.arun(read)
        nodes = {n.name: n for n in loaded}

        def ref(name: str) -> NodeRef:
            n = nodes.get(name)
            return NodeRef(name=name, address=n.address if n else "")

        jobs = []
        for rec, ranks in effects.starts:
            t = rec.task
            master = ref(t.nodes[0]).address.rsplit(":", 1)[0] if t.nodes else ""
            for rank in ranks:
                launch = RankLaunch(task_id=t.id, chain_id=t.chain_id, restart_count=t.restart_count,
                                    whole_life_state=t.whole_life_state, user=t.spec.user, name=t.spec.name,
                                    rank=rank, nodes=t.nodes, master_address=master, command=t.spec.command,
                                    watchdog_s=t.spec.watchdog_s, signal=t.spec.signal,
                                    grace_s=lifecycle.grace_final(rec, self.cfg.sched), token=creds.get(t.chain_id, ""),
                                    traceparent=t.trace_context)
                jobs.append(self._start_rank(ref(t.nodes[rank]), launch))
        for rec in effects.suspends:
            for name in rec.task.nodes:
                jobs.append(self._try("suspend", rec.id, name, self.agents.suspend(ref(name), rec.id,
                                                                                  rec.task.spec.signal)))
        for rec, grace in effects.stops:
            for r in rec.task.ranks:
                if r.state not in lifecycle.TERMINAL:
                    jobs.append(self._try("stop", rec.id, r.node, self.agents.stop(ref(r.node), rec.id, grace)))
        await asyncio.gather(*jobs)

    async def _try(self, what: str, run_id: int, node: str, call: Any) -> None:
        try:
            await call
        except FireFlyerError as e:
            self.log.warning(f"scheduler.{what}_failed", task=run_id, node=node, error=str(e))

    async def _start_rank(self, node: NodeRef, launch: RankLaunch) -> None:
        # a child of the chain's submission: the StartTask call (and through it the agent's span and the
        # rank processes) join the trace the submit began, though this runs in the decision loop
        parent = extract({"traceparent": launch.traceparent}) if launch.traceparent else None
        span = _tracer.start_span("scheduler.start_rank", context=parent, attributes={
            "ff.task_id": launch.task_id, "ff.chain_id": launch.chain_id, "ff.rank": launch.rank,
            "ff.node": node.name, "ff.restart_count": launch.restart_count})
        try:
            with trace.use_span(span, end_on_exit=True):
                await self.agents.start(node, launch)
        except FireFlyerError as e:
            self.log.warning("scheduler.start_failed", task=launch.task_id, node=node.name, rank=launch.rank,
                             error=str(e))
            why = f"rank {launch.rank} could not start on {node.name}: {e}"
            with contextlib.suppress(FireFlyerError):
                await self.mutate(lambda t, now: self._start_failed(t, now, launch.task_id, launch.rank, why))

    def _start_failed(self, t: Txn, now: float, run_id: int, rank: int, why: str) -> None:
        rec = store.load_run(t, run_id)
        if rec is None or not rec.task.running:
            return
        rec = lifecycle.request_stop(rec, StopCode.UNSCHEDULABLE, now, why)
        self._apply_report(t, now, rec, rank, RankState.STOPPED, -1, None, None)

    # -- tasks ---------------------------------------------------------------------------------------------
    async def create(self, spec: TaskSpec, caller: Caller, request_id: str = "", credential: str = "") -> list[RunRecord]:
        """Queue a new chain.  ``credential`` (the submitter's token) is kept beside the chain and given
        to its ranks as FF_TOKEN (docs/scheduler.md, "The task's credential")."""
        if not caller.admin and spec.user != caller.user:
            raise PermissionDenied(f"{caller.user} may not submit tasks as {spec.user}", user=spec.user)
        if not caller.admin and spec.shared_group:
            raise PermissionDenied("only an admin may set a task's shared_group", field="shared_group")

        with _submit_span(spec) as span:
            traceparent = _traceparent(span)
            runs = await self._create(spec, caller, request_id, credential, traceparent)
            span.set_attribute("ff.task_id", runs[0].id)
        return runs

    async def _create(self, spec: TaskSpec, caller: Caller, request_id: str, credential: str,
                      traceparent: str) -> list[RunRecord]:
        def fn(t: Txn, now: float) -> list[RunRecord]:
            nodes = store.load_nodes(t)
            if not nodes:
                raise InvalidArgument("no node has registered with the scheduler yet, so no task can run: start "
                                      "the node agents (services/node) and see `ff nodes`", field="group")
            groups: dict[str, int] = defaultdict(int)
            for n in nodes:
                groups[n.group] += 1
            check_spec(spec, groups=groups, zones={n.zone for n in nodes}, config=self.cfg.sched)
            run_id = store.next_id(t)
            rec = RunRecord(task=Task(id=run_id, chain_id=run_id, spec=spec, submitted_at=now,
                                      whole_life_state=spec.whole_life_state, trace_context=traceparent),
                            reason="submitted; waiting for the next decision", reason_code="submitted")
            store.save_run(t, rec)
            if credential:
                store.save_credential(t, run_id, credential)
            return [rec]

        key = f"sched-create/{caller.user}/{request_id}".encode() if request_id else None
        runs = await self.mutate(fn, idempotency_key=key, result_type=list[RunRecord])
        self.log.info("scheduler.submitted", task=runs[0].id, user=spec.user, nodes=spec.nodes,
                      priority=spec.priority.name, group=spec.group)
        return runs

    async def chain(self, run_or_chain: int, caller: Caller) -> list[RunRecord]:
        def fn(t: Txn) -> list[RunRecord]:
            return self._chain_of(t, run_or_chain, caller, "see", snapshot=True)
        return await self.kv.arun(fn)

    @staticmethod
    def _chain_of(t: Txn, run_or_chain: int, caller: Caller, action: str, snapshot: bool = False) -> list[RunRecord]:
        rec = store.load_run(t, run_or_chain, snapshot=snapshot)
        if rec is None:
            raise NotFound(f"no task {run_or_chain}: `ff task ls` lists yours", task=run_or_chain)
        _check_owner(rec, caller, action)
        return store.chain_runs(t, rec.task.chain_id, snapshot=snapshot)

    async def list(self, caller: Caller, *, user: str = "", include_finished: bool = False,
                   limit: int = 0) -> list[list[RunRecord]]:
        if user and not caller.admin and user != caller.user:
            raise PermissionDenied(f"{caller.user} may not list the tasks of {user}", user=user)
        who = user or ("" if caller.admin else caller.user)

        def fn(t: Txn) -> list[list[RunRecord]]:
            chains: dict[int, list[RunRecord]] = defaultdict(list)
            for rec in store.all_runs(t):
                if not who or rec.user == who:
                    chains[rec.task.chain_id].append(rec)
            out = [sorted(runs, key=lambda r: r.id) for _, runs in sorted(chains.items(), reverse=True)]
            if not include_finished:
                out = [c for c in out if c[-1].task.chain_status != "finished"]
            return out[:limit] if limit > 0 else out

        return await self.kv.arun(fn)

    async def stop(self, run_or_chain: int, caller: Caller) -> list[RunRecord]:
        def fn(t: Txn, now: float) -> list[RunRecord]:
            runs = self._chain_of(t, run_or_chain, caller, "stop")
            cur = runs[-1]
            if cur.task.chain_status == "finished":
                raise FailedPrecondition(f"task {cur.task.chain_id} has already finished", task=cur.task.chain_id)
            stopped = lifecycle.request_stop(cur, StopCode.MANUAL_STOP, now, f"stopped by {caller.user}")
            store.save_run(t, stopped)
            if stopped.task.chain_status == "finished":
                store.clear_credential(t, cur.task.chain_id)
            return store.chain_runs(t, cur.task.chain_id)
        return await self.mutate(fn)

    async def suspend(self, run_or_chain: int, caller: Caller) -> list[RunRecord]:
        """HAI's suspend: a running run goes through the interrupt handshake and its chain's next run
        is held; a waiting run is held at once.  Resume releases the chain."""
        def fn(t: Txn, now: float) -> tuple[list[RunRecord], RunRecord | None]:
            runs = self._chain_of(t, run_or_chain, caller, "suspend")
            cur = runs[-1]
            if cur.task.chain_status == "finished":
                raise FailedPrecondition(f"task {cur.task.chain_id} has already finished", task=cur.task.chain_id)
            sent = None
            if cur.task.running:
                rec = lifecycle.interrupt(cur, now, f"suspended by {caller.user}", hold=True)
                sent = rec if rec.task.suspend_code != cur.task.suspend_code else None
            else:
                rec = msgspec.structs.replace(cur, held=True, reason=f"held by {caller.user}; `ff task resume` "
                                              "releases it", reason_code="held")
            store.save_run(t, rec)
            return store.chain_runs(t, cur.task.chain_id), sent

        runs, sent = await self.mutate(fn)
        if sent is not None:
            self._perform(Effects(suspends=[sent]))
        return runs

    async def resume(self, run_or_chain: int, caller: Caller) -> list[RunRecord]:
        def fn(t: Txn, now: float) -> list[RunRecord]:
            runs = self._chain_of(t, run_or_chain, caller, "resume")
            cur = runs[-1]
            if cur.task.chain_status == "finished" or not (cur.held or cur.hold_next):
                raise FailedPrecondition(f"task {cur.task.chain_id} is not suspended by a user (it is "
                                         f"{cur.task.chain_status}); only a suspended task can be resumed",
                                         task=cur.task.chain_id)
            store.save_run(t, msgspec.structs.replace(cur, held=False, hold_next=False,
                                                      reason=f"resumed by {caller.user}", reason_code="resumed"))
            return store.chain_runs(t, cur.task.chain_id)
        return await self.mutate(fn)

    async def update_priority(self, run_or_chain: int, priority: Priority, caller: Caller) -> list[RunRecord]:
        def fn(t: Txn, now: float) -> list[RunRecord]:
            runs = self._chain_of(t, run_or_chain, caller, "reprioritise")
            cur = runs[-1]
            if cur.task.chain_status == "finished":
                raise FailedPrecondition(f"task {cur.task.chain_id} has already finished", task=cur.task.chain_id)
            store.save_run(t, lifecycle.with_priority(cur, priority))
            return store.chain_runs(t, cur.task.chain_id)
        return await self.mutate(fn)

    async def logs(self, run_or_chain: int, rank: int, follow: bool, caller: Caller,
                   restart: int | None = None) -> tuple[int, AsyncIterator[bytes]]:
        runs = await self.chain(run_or_chain, caller)
        # the chain's id is also its first run's id: asked for the chain, show its newest run that
        # started (as `hai-cli logs` and `squeue` follow a requeued job); any later run by its own id;
        # ``restart`` picks one run of the chain by its restart count (the first run is restart 0)
        with_ranks = [r for r in runs if r.task.ranks]
        if restart is not None:
            picked = [r for r in runs if r.task.restart_count == restart]
            if not picked:
                raise NotFound(f"task {runs[0].task.chain_id} has no run with restart {restart} "
                               f"(it has restarts 0..{runs[-1].task.restart_count})", task=run_or_chain)
        elif run_or_chain == runs[0].task.chain_id:
            picked = with_ranks
        else:
            picked = [r for r in runs if r.id == run_or_chain]
        if not picked or not picked[-1].task.ranks:
            raise FailedPrecondition(f"task {run_or_chain} has not run yet: no logs", task=run_or_chain)
        rec = picked[-1]
        if not 0 <= rank < len(rec.task.ranks):
            raise InvalidArgument(f"rank {rank} is not a rank of run {rec.id} (it has {len(rec.task.ranks)})",
                                  field="rank")
        name = rec.task.ranks[rank].node
        node = await self.kv.arun(lambda t: store.load_node(t, name, snapshot=True))
        ref = NodeRef(name=name, address=node.address if node else "")
        return rec.id, self.agents.logs(ref, rec.id, rank, follow and rec.task.running)

    # -- node agents' calls ------------------------------------------------------------------------------
    async def register_node(self, node: NodeRecord, sender: str) -> NodeRecord:
        def fn(t: Txn, now: float) -> NodeRecord:
            old = store.load_node(t, node.name)
            if old is not None and old.registered_by and old.registered_by != sender:
                raise PermissionDenied(f"node {node.name} is registered by {old.registered_by}, not {sender}",
                                       node=node.name)
            new = msgspec.structs.replace(node, last_seen_at=now, registered_by=sender)
            if old is not None:  # the admin's state and the holder are the scheduler's, not the agent's
                new = msgspec.structs.replace(new, state=old.state, reason=old.reason, task=old.task)
            store.save_node(t, new)
            return new
        return await self.mutate(fn, wake=False)

    async def report(self, run_id: int, rank: int, node: str, state: RankState | None, exit_code: int | None,
                     suspend_code: SuspendCode | None, whole_life_state: int | None, sender: str = "",
                     timeout: bool = False) -> None:
        """A node agent's report about a rank on its node; only the agent that registered the node
        (its service user) may report about it.  ``timeout``: the rank's watchdog fired (no output for
        the task's watchdog time): the run stops as TIMEOUT, which is not requeued."""
        def fn(t: Txn, now: float) -> None:
            n = store.load_node(t, node)
            if n is not None and sender and n.registered_by and n.registered_by != sender:
                raise PermissionDenied(f"node {node} is registered by {n.registered_by}; {sender} may not report "
                                       "about its tasks", node=node)
            rec = store.load_run(t, run_id)
            if rec is None:
                raise NotFound(f"no run {run_id}", task=run_id)
            if not rec.task.running:
                return  # a late report about a run that already ended
            if not 0 <= rank < len(rec.task.ranks) or rec.task.ranks[rank].node != node:
                raise InvalidArgument(f"run {run_id} has no rank {rank} on node {node}", field="rank")
            if timeout and not rec.task.stop_code & StopCode.TIMEOUT:
                rec = lifecycle.request_stop(rec, StopCode.TIMEOUT, now, f"rank {rank} on {node} printed nothing for "
                                             f"its watchdog time ({rec.task.spec.watchdog_s:g} s or as the task set it)")
                self.log.warning("scheduler.watchdog", task=run_id, rank=rank, node=node)
            self._apply_report(t, now, rec, rank, state, exit_code, suspend_code, whole_life_state)
        await self.mutate(fn)

    def _apply_report(self, t: Txn, now: float, rec: RunRecord, rank: int, state: RankState | None,
                      exit_code: int | None, suspend_code: SuspendCode | None, whole_life_state: int | None
                      ) -> RunRecord:
        """Record one rank's report (and free its node when it ended); end the run when every rank
        has, making the chain's next run.  Returns the run as saved."""
        rec = lifecycle.report(rec, rank, state, exit_code, suspend_code, whole_life_state, now)
        if state in lifecycle.TERMINAL:
            name = rec.task.ranks[rank].node
            n = store.load_node(t, name)
            if n is not None and n.task == rec.id:
                n.task = None
                store.save_node(t, n)
        if lifecycle.all_ended(rec):
            done, nxt = lifecycle.finish(rec, now, 0)
            if nxt is not None:
                nxt.task.id = store.next_id(t)
                store.save_run(t, nxt)
            else:  # the chain has ended: its ranks' credential goes with it
                store.clear_credential(t, rec.task.chain_id)
            store.save_run(t, done)
            self.log.info("scheduler.run_ended", task=rec.id, chain=rec.task.chain_id,
                          stop_code=int(done.task.stop_code), requeued_as=nxt.id if nxt else None)
            return done
        store.save_run(t, rec)
        return rec

    # -- nodes ----------------------------------------------------------------------------------------------
    async def nodes(self) -> list[NodeRecord]:
        return await self.kv.arun(lambda t: store.load_nodes(t, snapshot=True))

    async def set_node_state(self, name: str, state: str, reason: str, caller: Caller, *,
                             evict: bool = False) -> NodeRecord:
        """Enable or drain a node.  A drained node gets no new run; the run holding it goes on (Slurm's
        drain) unless ``evict``: then it is stopped now with HOOK_RESTART (HAI's hardware hook), which
        requeues its chain (:func:`~fireflyer.sched.model.should_requeue`): the fault is the node's,
        not the task's, so the task runs again elsewhere rather than finishing."""
        if state not in (ENABLED, DRAINED):
            raise InvalidArgument(f"node state must be {ENABLED} or {DRAINED}, got {state!r}", field="state")
        if state == DRAINED and not reason.strip():
            raise InvalidArgument("draining a node needs a reason (--reason)", field="reason")
        if evict and state != DRAINED:
            raise InvalidArgument("evict only goes with draining a node", field="evict")

        def fn(t: Txn, now: float) -> tuple[NodeRecord, int | None]:
            n = store.load_node(t, name)
            if n is None:
                raise NotFound(f"no node {name!r}: `ff nodes` lists them", node=name)
            n.state = state
            n.reason = reason.strip() if state == DRAINED else ""
            store.save_node(t, n)
            evicted = None
            if evict and n.task is not None:
                rec = store.load_run(t, n.task)
                if rec is not None and rec.task.running and not rec.task.stop_code & StopCode.HOOK_RESTART:
                    store.save_run(t, lifecycle.request_stop(rec, StopCode.HOOK_RESTART, now,
                                                             f"node {name} drained by {caller.user}: {n.reason}; "
                                                             "requeued to run elsewhere"))
                    evicted = rec.id
            return n, evicted
        n, evicted = await self.mutate(fn)  # (the wake runs a cycle at once: it sends the stop)
        self.log.info("scheduler.node_state", node=name, state=state, reason=reason, by=caller.user,
                      evicted=evicted)
        return n

    # -- quotas ---------------------------------------------------------------------------------------------
    async def quotas(self, owner: str, caller: Caller) -> list[Quota]:
        qs = await self.kv.arun(lambda t: store.load_quotas(t, snapshot=True))
        if owner:
            return [q for q in qs if q.owner == owner]
        return qs if caller.admin else [q for q in qs if q.owner == caller.user]

    async def set_quota(self, q: Quota, remove: bool) -> list[Quota]:
        if not q.owner or not q.group:
            raise InvalidArgument("a quota names an owner (user or shared group) and a node group",
                                  field="owner" if not q.owner else "group")
        if q.priority == Priority.AUTO:
            raise InvalidArgument("a quota is per priority level; AUTO is not a level", field="priority")
        if q.max_nodes < 0:
            raise InvalidArgument(f"max_nodes must be >= 0, got {q.max_nodes}", field="max_nodes")

        def fn(t: Txn, now: float) -> list[Quota]:
            if remove:
                store.clear_quota(t, q.owner, q.group, int(q.priority))
            else:
                store.save_quota(t, q)
            return store.load_quotas(t)
        return await self.mutate(fn)

    async def used(self, owner: str, caller: Caller) -> list[QuotaUse]:
        def fn(t: Txn) -> tuple[list[RunRecord], list[Quota]]:
            return store.active_runs(t, snapshot=True), store.load_quotas(t, snapshot=True)
        runs, qs = await self.kv.arun(fn)
        now = self.clock.time()
        limits = {(q.owner, q.group, int(q.priority)): q.max_nodes for q in qs
                  if q.expires_at is None or q.expires_at > now}
        used: dict[tuple[str, str, int], int] = defaultdict(int)
        for rec in runs:
            t = rec.task
            if t.chain_status != RUNNING:
                continue
            level = int(t.priority if t.priority is not None else t.spec.priority)
            for who in (t.spec.user, t.spec.shared_group):
                if who:
                    used[(who, t.spec.group, level)] += len(t.nodes)
        keys = set(used) | set(limits)
        default = self.cfg.sched.default_quota
        out = [QuotaUse(owner=o, group=g, priority=Priority(p), used=used.get((o, g, p), 0),
                        limit=limits.get((o, g, p), default)) for o, g, p in sorted(keys)]
        if owner:
            return [u for u in out if u.owner == owner]
        return out if caller.admin else [u for u in out if u.owner == caller.user]


def _submit_span(spec: TaskSpec) -> Any:
    """The span a chain's trace hangs from: a child of the caller's span when the caller traces (``ff``
    with tracing on, the dashboard), else a new root.  Not a child of an unsampled SERVER span: a
    submit from a caller that does not trace would then be dropped with it (the sampler records such
    RPCs at a ratio), and the task's trace is worth keeping whole."""
    current = trace.get_current_span().get_span_context()
    context = None if current.is_valid and current.trace_flags.sampled else otel_context.Context()
    return _tracer.start_as_current_span("task.submit", context=context, attributes={
        "ff.user": spec.user, "ff.task_name": spec.name, "ff.nodes": spec.nodes})


def _traceparent(span: trace.Span) -> str:
    carrier: dict[str, str] = {}
    inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def _in_flight(runs: list[RunRecord], config: SchedConfig) -> Effects:
    """What a new leader re-sends: starts of ranks still ``created``, interrupts in the handshake,
    stops of runs told to stop."""
    e = Effects()
    for rec in runs:
        t = rec.task
        if not t.running:
            continue
        created = [r.rank for r in t.ranks if r.state == RankState.CREATED]
        if created and rec.stop_sent_at is None:
            e.starts.append((rec, created))
        if rec.stop_sent_at is not None:
            e.stops.append((rec, lifecycle.grace_final(rec, config)))
        elif t.suspend_code in (SuspendCode.SENT, SuspendCode.RECEIVED):
            e.suspends.append(rec)
    return e

