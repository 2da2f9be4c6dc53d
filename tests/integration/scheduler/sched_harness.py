"""Scheduler replicas in-process, on a loop thread of their own, with fake node agents.

The replicas serve real gRPC on free ports (the production runtime, ``serve``), share one KV and
one :class:`~fireflyer.testing.schednodes.FakeNodeAgents` (the cluster's nodes), whose reports go
back through ``NodeService.Report`` with a service token.  Tests are plain functions: they run
coroutines on the harness loop (:meth:`SchedHarness.run`), call ``ff`` in their own thread, or dial
raw gRPC with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.core.config import AuthSettings, NatsSettings, RpcSettings, TelemetrySettings
from fireflyer.core.errors import FireFlyerError
from fireflyer.core.runtime import ServiceContext, serve
from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file
from fireflyer.sched.client import SchedClient
from fireflyer.testing.poll import wait_for
from fireflyer.testing.schednodes import FakeNodeAgents
from services.scheduler.app import SchedulerSection, SchedulerService, SchedulerSettings

T = TypeVar("T")

#: short times: a lease of 1.5 s, a decision every 0.1 s, no minimum runtime, 1 s grace times
TIMING = dict(lease_s=1.5, renew_s=0.2, step_down_margin_s=0.3, tick_s=0.1, min_runtime_s=0.0,
              grace_ack_s=1.0, grace_final_s=1.0)

USERS = {"alice": ["user"], "bob": ["user"], "root": ["admin"], "svc-node": ["service"], "svc-other": ["service"]}


class Tokens:
    def __init__(self, tmp: Path) -> None:
        self.by_user = {u: generate_token() for u in USERS}
        self.path = write_tokens_file(tmp / "tokens.json", [
            TokenEntry(token=self.by_user[u], user=u, roles=roles) for u, roles in USERS.items()])

    def __getitem__(self, user: str) -> str:
        return self.by_user[user]


class Replica:
    def __init__(self, service: SchedulerService, stop: asyncio.Event, task: asyncio.Task[None],
                 ctx: ServiceContext) -> None:
        self.service, self.stop, self.task, self.ctx = service, stop, task, ctx

    @property
    def core(self) -> Any:
        return self.service.core

    @property
    def address(self) -> str:
        return self.ctx.server.address


class SchedHarness:
    def __init__(self, tmp: Path, kv_url: str, tokens: Tokens, **section: Any) -> None:
        self.tmp, self.kv_url, self.tokens = tmp, kv_url, tokens
        self.section = {**TIMING, **section}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sched-harness", daemon=True)
        self.thread.start()
        self.replicas: list[Replica | None] = []
        self.agents: FakeNodeAgents = self.run(self._make_agents())
        self._clients: list[SchedClient] = []

    async def _make_agents(self) -> FakeNodeAgents:
        return FakeNodeAgents(report=self._report)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    # -- replicas -------------------------------------------------------------------------------------
    def start(self, n: int = 1) -> SchedHarness:
        for _ in range(n):
            self.run(self._start(len(self.replicas)))
        return self

    async def _start(self, i: int) -> None:
        settings = SchedulerSettings(
            instance=f"scheduler-{i}", state_dir=str(self.tmp), grace_s=0.5, nats=NatsSettings(url=""),
            rpc=RpcSettings(host="127.0.0.1", port=0), auth=AuthSettings(tokens_file=str(self.tokens.path)),
            telemetry=TelemetrySettings(enabled=False),
            scheduler=SchedulerSection(kv_url=self.kv_url, **self.section))
        service = SchedulerService(settings, agents=self.agents)
        stop = asyncio.Event()
        ready: asyncio.Future[ServiceContext] = self.loop.create_future()
        task = self.loop.create_task(serve(service, stop=stop, install_signals=False,
                                           ready=lambda ctx: ready.done() or ready.set_result(ctx)))
        done, _ = await asyncio.wait({task, ready}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        self.replicas.append(Replica(service, stop, task, ready.result()))

    def leader(self, timeout_s: float = 10.0) -> int:
        """The index of the replica that leads (waits for one)."""
        async def find() -> int | None:
            for i, r in enumerate(self.replicas):
                if r is not None and r.core.is_leader():
                    return i + 1  # (truthy)
            return None
        return self.run(wait_for(find, timeout_s=timeout_s, what="a scheduler leader")) - 1

    def crash(self, i: int) -> None:
        """Replica ``i`` stops acting at once and keeps its lease (as after SIGKILL), then goes away."""
        r = self.replicas[i]
        assert r is not None

        async def go() -> None:
            r.core.crash()
            r.stop.set()
            await r.task
        self.run(go())
        self.replicas[i] = None

    def addresses(self) -> list[str]:
        return [r.address for r in self.replicas if r is not None]

    def close(self) -> None:
        if not self.thread.is_alive():
            return

        async def go() -> None:
            for c in self._clients:
                await c.close()
            for r in self.replicas:
                if r is not None:
                    r.stop.set()
            await asyncio.gather(*(r.task for r in self.replicas if r is not None), return_exceptions=True)
            await self.agents.settle()
        try:
            self.run(go())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)

    # -- clients ---------------------------------------------------------------------------------------
    def client(self, user: str) -> SchedClient:
        c = SchedClient(self.addresses(), token=self.tokens[user], timeout_s=10.0)
        self._clients.append(c)
        return c

    async def _report(self, run: int, rank: int, node: str, state: str, code: int, suspend: int, wls: int) -> None:
        c = self._service_client()
        await c.report(pb.ReportRequest(task_id=run, rank=rank, node=node, state=state, exit_code=code,
                                        suspend_code=suspend, whole_life_state=wls))

    def _service_client(self) -> SchedClient:
        c = getattr(self, "_svc", None)
        if c is None or c.addresses != self.addresses() and set(c.addresses) != set(self.addresses()):
            c = self._svc = self.client("svc-node")
        return c

    def register(self, name: str, *, group: str = "default", zone: str = "A", address: str = "") -> pb.Node:
        req = pb.RegisterNodeRequest(name=name, group=group, zone=zone, address=address or f"127.0.0.9:{len(name)}",
                                     gpus=8, cpus=64)
        return self.run(self.client("svc-node").register_node(req)).node

    def heartbeat(self, *names: str, interval_s: float = 0.2) -> Callable[[], None]:
        """Register ``names`` every ``interval_s`` (their agents' heartbeats) until the returned stop()."""
        c = self.client("svc-node")
        known = {n.name: n for n in self.run(c.nodes())}

        async def beat() -> None:
            while True:
                for name in names:
                    n = known[name]
                    with contextlib.suppress(FireFlyerError):
                        await c.register_node(pb.RegisterNodeRequest(name=name, group=n.group, zone=n.zone,
                                                                     address=n.address))
                await asyncio.sleep(interval_s)

        task = asyncio.run_coroutine_threadsafe(beat(), self.loop)
        return lambda: task.cancel() and None

    def chain(self, task_id: int, user: str = "root") -> pb.Chain:
        return self.run(self.client(user).get(task_id))

    def wait_chain(self, task_id: int, predicate: Any, what: str, timeout_s: float = 15.0) -> pb.Chain:
        c = self.client("root")

        async def check() -> pb.Chain | None:
            chain = await c.get(task_id)
            return chain if predicate(chain) else None
        return self.run(wait_for(check, timeout_s=timeout_s, interval_s=0.05, what=what), timeout_s + 5)


def spec(*command: str, nodes: int = 1, priority: str = "NORMAL", group: str = "default", name: str = "",
         **kw: Any) -> pb.TaskSpec:
    return pb.TaskSpec(name=name, nodes=nodes, priority=priority, group=group, command=list(command or ["train"]),
                       **kw)
