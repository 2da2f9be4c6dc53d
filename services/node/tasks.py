"""The processes of the node agent: task ranks, their HFReduce worker, the state file.

Layout under ``<state_dir>/node/<node>/``::

    state.json                  every task this agent started (AgentState), rewritten atomically
    tasks/<task>/rank<R>.log    a rank's stdout and stderr
    tasks/<task>/hfreduce.log   the task's HFReduce worker on this node
    tasks/<task>/suspend        the suspend flag (fireflyer.node.suspend)

Each rank starts in a session of its own (its own process group, ``pgid == pid``), so a
signal to the group reaches whatever the rank forked, and a Ctrl-C or a SIGTERM to the agent
does not.  The state file records every rank's pid, process group and /proc start time:
an agent restarted after a crash (SIGKILL) adopts the ranks still running as the same
processes and reports the others lost (:func:`fireflyer.node.policy.classify_rank`).  An
adopted rank is not the new agent's child, so its exit code cannot be read: it is reported
as unknown.

On a clean stop (SIGTERM, ``ff down``) the agent stops every task it runs (SIGTERM, SIGKILL
after the task's grace, at most ``shutdown_grace_s``) unless ``keep_tasks_on_exit`` is set
(an agent upgrade that must not touch running work): a machine whose agent is told to go
leaves no orphans.  Only a crash of the agent leaves ranks running, and the next agent on
that state dir adopts them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.cluster.procs import observe
from fireflyer.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from fireflyer.node.env import inherited_env, rank_env
from fireflyer.node.events import TaskExited
from fireflyer.node.model import (
    AgentState,
    RankRecord,
    RankState,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerRecord,
    task_state_of,
)
from fireflyer.node.policy import (
    RestartPolicy,
    StopStep,
    classify_rank,
    due_signals,
    next_attempt,
    restart_delay,
    stop_plan,
    worker_argv,
)
from fireflyer.node.suspend import encode_flag
from fireflyer.telemetry import traceparent_env, tracer

__all__ = ["NodeFacts", "TaskManager", "KEEP_ENDED"]

_tracer = tracer("services.node")

#: ended tasks the agent still answers TaskStatus for
KEEP_ENDED = 256


class NodeFacts(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    group: str
    zone: str
    cpus: int
    gpus: int
    address: str
    state_dir: str
    socket_dir: str
    worker_prefix: tuple[str, ...] = ()
    sched_addr: str = ""
    worker_token: str = ""


class _Stop:
    def __init__(self, plan: tuple[StopStep, ...], began: float) -> None:
        self.plan, self.began, self.sent = plan, began, 0


class _Worker:
    """Runtime state of a task's HFReduce worker next to its record."""

    def __init__(self, popen: subprocess.Popen[bytes] | None, started: float) -> None:
        self.popen, self.started = popen, started
        self.attempt = 0
        self.restart_at: float | None = None


def _free_port(host: str) -> int:
    import socket as _socket

    with _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class TaskManager:
    def __init__(self, facts: NodeFacts, *, agent_env: Mapping[str, str], restart: RestartPolicy,
                 publish: Callable[[TaskExited], Awaitable[None]], log: Any) -> None:
        self.facts = facts
        self.agent_env = dict(agent_env)
        self.restart = restart
        self.publish = publish
        self.log = log
        self.root = Path(facts.state_dir).absolute() / "node" / facts.name
        self.state_path = self.root / "state.json"
        self.state = AgentState(node=facts.name)
        self.popens: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self.stops: dict[str, _Stop] = {}
        self.workers: dict[str, _Worker] = {}
        self.changed = asyncio.Event()

    # -- persistence ---------------------------------------------------------------------------------------------

    def save(self) -> None:
        self._forget_old()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(self.state))
        os.replace(tmp, self.state_path)

    def _forget_old(self) -> None:
        """Keep at most :data:`KEEP_ENDED` ended and reported tasks (the newest); their logs stay on disk."""
        done = sorted((r.ended_at, t) for t, r in self.state.tasks.items() if r.state.ended and r.reported)
        for _, t in done[:max(0, len(done) - KEEP_ENDED)]:
            del self.state.tasks[t]

    def load(self) -> dict[str, int]:
        """Read the state file of a previous agent on this node and adopt what still runs."""
        counts = {"adopted": 0, "lost": 0}
        if not self.state_path.exists():
            return counts
        self.state = msgspec.json.decode(self.state_path.read_bytes(), type=AgentState)
        for rec in self.state.tasks.values():
            if rec.state.ended:
                continue
            for r in rec.ranks:
                was = r.state
                r.state = classify_rank(r, observe(r.pid))
                if was is RankState.RUNNING:
                    counts["adopted" if r.state is RankState.RUNNING else "lost"] += 1
                    self.log.info("node.rank_rediscovered", task=rec.spec.task_id, rank=r.rank, pid=r.pid,
                                  state=r.state.value)
            if rec.worker is not None:
                self.workers[rec.spec.task_id] = _Worker(None, time.monotonic())
                if not self._alive_pid(rec.worker.pid, rec.worker.start_ticks):
                    self._schedule_worker_restart(rec, why="not running after the agent restarted")
            if rec.state is TaskState.STOPPING:
                self.stops[rec.spec.task_id] = _Stop(stop_plan(rec.spec.grace_s), time.monotonic())
        self.save()
        return counts

    # -- paths ---------------------------------------------------------------------------------------------------

    def task_dir(self, task_id: str) -> Path:
        return self.root / "tasks" / task_id

    def suspend_path(self, task_id: str) -> Path:
        return self.task_dir(task_id) / "suspend"

    def socket_path(self, task_id: str) -> str:
        return str(Path(self.facts.socket_dir) / f"{task_id}.sock")

    # -- queries -------------------------------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskRecord:
        rec = self.state.tasks.get(task_id)
        if rec is None:
            raise NotFound(f"task {task_id!r} is not known on node {self.facts.name}: check the task id, or ask "
                           "the scheduler which nodes run it", task=task_id, node=self.facts.name)
        return rec

    def running(self) -> list[str]:
        return sorted(t for t, r in self.state.tasks.items() if not r.state.ended)

    def rank(self, task_id: str, rank: int) -> RankRecord:
        rec = self.get(task_id)
        for r in rec.ranks:
            if r.rank == rank:
                return r
        raise InvalidArgument(f"task {task_id} has no rank {rank} on node {self.facts.name} (it has "
                              f"{[r.rank for r in rec.ranks]})", field="rank", task=task_id, rank=rank)

    def worker_pid(self, task_id: str) -> int:
        rec = self.get(task_id)
        return rec.worker.pid if rec.worker is not None else 0

    # -- start ---------------------------------------------------------------------------------------------------

    def start(self, spec: TaskSpec) -> TaskRecord:
        old = self.state.tasks.get(spec.task_id)
        if old is not None and not old.state.ended:
            raise AlreadyExists(f"task {spec.task_id} already runs on node {self.facts.name}",
                                task=spec.task_id, node=self.facts.name)
        if spec.cwd and not Path(spec.cwd).is_dir():
            raise InvalidArgument(f"cwd {spec.cwd!r} of task {spec.task_id} is not a directory on node "
                                  f"{self.facts.name}", field="cwd", task=spec.task_id)
        tdir = self.task_dir(spec.task_id)
        tdir.mkdir(parents=True, exist_ok=True)
        self.suspend_path(spec.task_id).unlink(missing_ok=True)
        rec = TaskRecord(spec=spec, ranks=[], started_at=time.time())
        socket = ""
        if spec.hfreduce is not None:
            Path(self.facts.socket_dir).mkdir(parents=True, exist_ok=True)
            socket = self.socket_path(spec.task_id)
            self._start_worker(rec, socket)
        base = inherited_env(self.agent_env)
        try:
            for r in spec.ranks:
                env = rank_env(spec, r, base=base, node_name=self.facts.name, node_address=self.facts.address,
                               hfreduce_socket=socket, suspend_file=str(self.suspend_path(spec.task_id)),
                               sched_addr=self.facts.sched_addr)
                log_path = tdir / f"rank{r.rank}.log"
                # the rank joins the trace of the StartTask call (the task's submission): its own spans
                # are children of this one (fireflyer.telemetry.taskctx)
                with open(log_path, "wb") as out, _tracer.start_as_current_span(
                        "node.start_rank", attributes={"ff.task_id": spec.task_id, "ff.rank": r.rank,
                                                       "ff.node": self.facts.name}) as span:
                    env.update(traceparent_env())
                    try:
                        popen = subprocess.Popen(list(spec.command), env=env, cwd=spec.cwd or None,
                                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                 start_new_session=True)
                        span.set_attribute("ff.pid", popen.pid)
                    except OSError as e:
                        raise InvalidArgument(f"cannot start rank {r.rank} of task {spec.task_id} on node "
                                              f"{self.facts.name}: {spec.command[0]}: {e.strerror or e}",
                                              field="command", task=spec.task_id, rank=r.rank) from e
                seen = observe(popen.pid)
                self.popens[(spec.task_id, r.rank)] = popen
                rec.ranks.append(RankRecord(rank=r.rank, local_rank=r.local_rank, pid=popen.pid, pgid=popen.pid,
                                            start_ticks=seen.start_ticks if seen else None, log=str(log_path)))
        except BaseException:
            for r2 in rec.ranks:  # all or nothing: what started of the task goes again
                _killpg(r2.pgid, signal.SIGKILL)
                popen = self.popens.pop((spec.task_id, r2.rank), None)
                if popen is not None:
                    popen.wait()
            self._kill_worker(rec)
            raise
        self.state.tasks[spec.task_id] = rec
        self.save()
        self.log.info("node.task_started", task=spec.task_id, user=spec.user, ranks=[r.rank for r in rec.ranks],
                      pids=[r.pid for r in rec.ranks], hfreduce=spec.hfreduce is not None)
        self.changed.set()
        return rec

    # -- HFReduce worker -----------------------------------------------------------------------------------------

    def _start_worker(self, rec: TaskRecord, socket: str) -> None:
        spec = rec.spec
        assert spec.hfreduce is not None
        hf = spec.hfreduce
        if hf.coord_addr and not hf.listen:
            # the worker tells coord the address it was given, and its peers dial that: a port of 0
            # would reach nobody, so pick a free one on the node's address now (as ff launch does)
            hf = msgspec.structs.replace(hf, listen=f"{self.facts.address}:{_free_port(self.facts.address)}")
        argv = worker_argv(spec, hf, socket=socket, node_name=self.facts.name,
                           node_address=self.facts.address, zone=self.facts.zone, token=self.facts.worker_token,
                           prefix=self.facts.worker_prefix or None)
        log_path = self.task_dir(spec.task_id) / "hfreduce.log"
        env = {k: v for k, v in self.agent_env.items() if k not in ("TRACEPARENT", "TRACESTATE")}
        env.update(traceparent_env())  # its op spans join the task's trace (when it has one)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(log_path, "ab") as out:
            try:
                popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as e:
                raise FailedPrecondition(f"node {self.facts.name} cannot start its HFReduce worker {argv[0]}: "
                                         f"{e.strerror or e}; check FF_AGENT_WORKER_COMMAND",
                                         task=spec.task_id, node=self.facts.name) from e
        seen = observe(popen.pid)
        restarts = rec.worker.restarts if rec.worker is not None else 0
        rec.worker = WorkerRecord(pid=popen.pid, start_ticks=seen.start_ticks if seen else None, socket=socket,
                                  restarts=restarts, log=str(log_path))
        w = self.workers.get(spec.task_id)
        if w is None:
            self.workers[spec.task_id] = _Worker(popen, time.monotonic())
        else:
            w.popen, w.started, w.restart_at = popen, time.monotonic(), None

    def _worker_alive(self, rec: TaskRecord) -> bool:
        w = self.workers.get(rec.spec.task_id)
        if rec.worker is None or w is None:
            return False
        if w.popen is not None:
            return w.popen.poll() is None
        return self._alive_pid(rec.worker.pid, rec.worker.start_ticks)

    def _schedule_worker_restart(self, rec: TaskRecord, *, why: str) -> None:
        w = self.workers[rec.spec.task_id]
        ran = time.monotonic() - w.started
        w.attempt = next_attempt(w.attempt, ran, self.restart)
        delay = restart_delay(w.attempt, self.restart)
        w.restart_at = time.monotonic() + delay
        code = w.popen.poll() if w.popen is not None else None
        self.log.warning("node.worker_died", task=rec.spec.task_id, pid=rec.worker.pid if rec.worker else None,
                         exit_code=code, why=why, attempt=w.attempt, restart_in_s=round(delay, 3))

    def _supervise_worker(self, rec: TaskRecord, now: float) -> None:
        w = self.workers.get(rec.spec.task_id)
        if rec.worker is None or w is None or rec.state is not TaskState.RUNNING:
            return
        if w.restart_at is None:
            if not self._worker_alive(rec):
                self._schedule_worker_restart(rec, why="exited")
            return
        if now >= w.restart_at:
            rec.worker.restarts += 1
            try:
                self._start_worker(rec, rec.worker.socket)
            except FailedPrecondition as e:  # tried again after the next backoff step, one line per try
                w.attempt += 1
                w.restart_at = now + restart_delay(w.attempt, self.restart)
                self.log.error("node.worker_restart_failed", task=rec.spec.task_id, error=str(e), attempt=w.attempt)
                self.save()
                return
            self.log.warning("node.worker_restarted", task=rec.spec.task_id, pid=rec.worker.pid,
                             restarts=rec.worker.restarts, attempt=w.attempt)
            self.save()

    def _kill_worker(self, rec: TaskRecord) -> None:
        w = self.workers.pop(rec.spec.task_id, None)
        if rec.worker is None:
            return
        if w is not None and w.popen is not None:
            if w.popen.poll() is None:
                _killpg(w.popen.pid, signal.SIGKILL)
            w.popen.wait()
        elif self._alive_pid(rec.worker.pid, rec.worker.start_ticks):
            _killpg(rec.worker.pid, signal.SIGKILL)

    @staticmethod
    def _alive_pid(pid: int, ticks: int | None) -> bool:
        seen = observe(pid)
        return seen is not None and not seen.zombie and (ticks is None or seen.start_ticks == ticks)

    # -- stop and suspend ----------------------------------------------------------------------------------------

    def stop(self, task_id: str, grace_s: float | None = None) -> TaskRecord:
        rec = self.get(task_id)
        if rec.state.ended:
            return rec
        rec.stop_requested = True
        rec.state = TaskState.STOPPING
        grace = rec.spec.grace_s if grace_s is None or grace_s <= 0 else grace_s
        if task_id not in self.stops:
            self.stops[task_id] = _Stop(stop_plan(grace), time.monotonic())
            self.log.info("node.task_stopping", task=task_id, grace_s=grace)
        self.save()
        self._escalate(rec, time.monotonic())
        self.changed.set()
        return rec

    def suspend(self, task_id: str, sig: int = 0, reason: str = "") -> TaskRecord:
        rec = self.get(task_id)
        if rec.state.ended:
            return rec
        path = self.suspend_path(task_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode_flag(reason))
        os.replace(tmp, path)  # readers see the whole flag or none
        rec.suspend_requested = True
        if sig:
            for r in rec.ranks:
                if r.state is RankState.RUNNING:
                    _killpg(r.pgid, sig)
        self.save()
        self.log.info("node.task_suspend", task=task_id, signal=sig, reason=reason)
        return rec

    def _escalate(self, rec: TaskRecord, now: float) -> None:
        st = self.stops.get(rec.spec.task_id)
        if st is None:
            return
        due, st.sent = due_signals(st.plan, now - st.began, st.sent)
        for sig in due:
            targets = [r for r in rec.ranks if r.state is RankState.RUNNING]
            self.log.info("node.task_signal", task=rec.spec.task_id, signal=signal.Signals(sig).name,
                          ranks=[r.rank for r in targets])
            for r in targets:
                _killpg(r.pgid, sig)

    # -- watching ------------------------------------------------------------------------------------------------

    def _poll_rank(self, rec: TaskRecord, r: RankRecord) -> bool:
        """Update ``r`` if its process ended; True if it did."""
        popen = self.popens.get((rec.spec.task_id, r.rank))
        if popen is not None:
            code = popen.poll()
            if code is None:
                return False
            r.exit_code = code
            del self.popens[(rec.spec.task_id, r.rank)]
        elif self._alive_pid(r.pid, r.start_ticks):
            return False
        r.state = RankState.EXITED
        self.log.info("node.rank_exited", task=rec.spec.task_id, rank=r.rank, pid=r.pid, exit_code=r.exit_code)
        # what the rank forked may outlive it: its group goes with it
        _killpg(r.pgid, signal.SIGKILL)
        return True

    async def tick(self) -> None:
        now = time.monotonic()
        for rec in list(self.state.tasks.values()):
            try:
                await self._tick_task(rec, now)
            except Exception as e:  # noqa: BLE001 -- one task's trouble (a worker that cannot start) must not
                # stop the agent from watching the others; it is retried on the next tick
                self.log.error("node.task_tick_failed", task=rec.spec.task_id, error=repr(e))

    async def _tick_task(self, rec: TaskRecord, now: float) -> None:
        if rec.state.ended:
            if not rec.reported:  # its event could not be published before (NATS away): again
                await self._report(rec)
            return
        changed = False
        for r in rec.ranks:
            if r.state is RankState.RUNNING and self._poll_rank(rec, r):
                changed = True
        self._escalate(rec, now)
        new = task_state_of(rec.ranks, stop_requested=rec.stop_requested)
        if new.ended:
            rec.state, rec.ended_at = new, time.time()
            self.stops.pop(rec.spec.task_id, None)
            self._kill_worker(rec)
            self.log.info("node.task_ended", task=rec.spec.task_id, state=new.value,
                          exit_codes={str(r.rank): r.exit_code for r in rec.ranks})
            changed = True
        else:
            self._supervise_worker(rec, now)
        if changed:
            self.save()
            self.changed.set()
        if rec.state.ended:
            await self._report(rec)

    async def _report(self, rec: TaskRecord) -> None:
        ev = TaskExited(node=self.facts.name, task_id=rec.spec.task_id, state=rec.state.value,
                        exit_codes={str(r.rank): r.exit_code for r in rec.ranks},
                        suspend_requested=rec.suspend_requested)
        try:
            await self.publish(ev)
        except Exception as e:  # noqa: BLE001 -- NATS away: TaskStatus still answers; retried next tick
            self.log.warning("node.task_exit_publish_failed", task=rec.spec.task_id, error=repr(e))
            return
        rec.reported = True
        self.save()

    async def run(self, interval_s: float) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(interval_s)

    async def wait_ended(self, task_id: str, timeout_s: float) -> TaskRecord:
        deadline = time.monotonic() + timeout_s
        while True:
            rec = self.get(task_id)
            if rec.state.ended or time.monotonic() >= deadline:
                return rec
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                pass

    async def shutdown(self, *, keep_tasks: bool, grace_cap_s: float, interval_s: float) -> None:
        """At the agent's clean stop: stop every task (unless ``keep_tasks``) and wait for them."""
        if keep_tasks:
            self.log.info("node.keeping_tasks", tasks=self.running())
            return
        running = self.running()
        for t in running:
            rec = self.get(t)
            self.stop(t, min(rec.spec.grace_s, grace_cap_s) if rec.spec.grace_s > 0 else 0.0)
        deadline = time.monotonic() + grace_cap_s + 2.0
        while self.running() and time.monotonic() < deadline:
            await self.tick()
            await asyncio.sleep(interval_s)
        await self.tick()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
