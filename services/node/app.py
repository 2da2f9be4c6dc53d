"""The node agent: settings (``FF_AGENT_*``) and wiring onto the standard runtime.

    python -m services.node          # FF_INSTANCE=node-1 -> node "node1" on 127.0.0.2

One agent per machine.  Its labels (name, group, zone, CPU and GPU counts, data-plane
address) come from the settings; in the local cluster ``ff up`` runs one agent per
simulated node as instances ``node-<i>`` of one ``[[service]]`` entry, and an agent whose
instance is ``node-<i>`` (and whose settings name nothing else) is node ``node<i>``
on ``127.0.0.<i+1>`` -- the names and addresses ``ff launch`` gives its nodes -- in zone
``zones[i]`` of ``FF_AGENT_ZONES`` (``A,A,B``).  The agent's gRPC server stays where the
runtime puts it (``FF_RPC_HOST``); the address label is where its node's data plane
(the HFReduce worker) listens.

Every ``heartbeat_interval_s`` it publishes :class:`~fireflyer.node.events.NodeHeartbeat`
on ``ff.node.v1.node.<name>.heartbeat``; with ``FF_SCHED_ADDR`` it also registers with the
scheduler and reports the runs it hosts (:mod:`services.node.schedlink`).  When configured it
follows the kernel log for Xids (:mod:`services.node.kernlog`, ``FF_NODE_KMSG_*``) and watches
its network links (:mod:`services.node.linkmon`, ``FF_NODE_LINKMON`` / ``FF_NODE_SYSFS_ROOT``),
publishing :mod:`fireflyer.health.events`.  Tasks:
:mod:`services.node.tasks`.  Ranks run as
the agent's own OS user; the task's ``user`` decides who may read its logs and status.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.api.node.v1 import node_pb2_grpc as pb_grpc
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import SettingsError
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.hfreduce.launch_plan import node_address
from fireflyer.node.events import NodeHeartbeat, TaskExited, heartbeat_subject, task_exit_subject
from fireflyer.node.policy import RestartPolicy

from .kernlog import KernLogSettings, KernLogWatcher
from .linkmon import LinkMonitor, LinkMonSettings
from .metrics import NodeMetrics
from .schedlink import SchedLink
from .servicer import SERVICE_NAME, NodeAgentServicer
from .tasks import NodeFacts, TaskManager

__all__ = ["AgentSection", "AgentSettings", "NodeAgentService", "node_facts", "main"]

_INSTANCE = re.compile(r"^node-(\d+)$")


class AgentSection(msgspec.Struct, frozen=True, kw_only=True):
    #: node name; empty: node<i> for instance node-<i>, else the host name
    name: str = ""
    group: str = "default"
    #: this node's zone; empty: zones[i] for instance node-<i>
    zone: str = ""
    #: zones of the local cluster's nodes in instance order, comma separated (A,A,B)
    zones: str = ""
    #: 0: os.cpu_count()
    cpus: int = 0
    gpus: int = 0
    #: data-plane address; empty: 127.0.0.<i+1> for instance node-<i>, else 127.0.0.1
    address: str = ""
    heartbeat_interval_s: float = 1.0
    #: how often rank exits, stop deadlines and the HFReduce worker are checked
    poll_interval_s: float = 0.1
    #: command of the HFReduce worker before its arguments; empty: python -m fireflyer.hfreduce.worker
    worker_command: str = ""
    restart_base_s: float = 0.2
    restart_max_s: float = 10.0
    #: a worker that ran this long before dying starts its backoff over
    restart_stable_s: float = 30.0
    #: at a clean stop (SIGTERM), leave the tasks running for the next agent to adopt
    keep_tasks_on_exit: bool = False
    #: at a clean stop, the longest a task's SIGTERM -> SIGKILL grace may be
    shutdown_grace_s: float = 5.0
    #: register with the scheduler of FF_SCHED_ADDR (when set) and report the tasks it starts here
    register: bool = True
    #: where the workers' Unix sockets go (kept short: sun_path is 108 bytes); empty: a temp dir
    socket_dir: str = ""


class AgentSettings(ServiceSettings, frozen=True, kw_only=True):
    agent: AgentSection = msgspec.field(default_factory=AgentSection)


def node_facts(settings: AgentSettings, instance: str, env: dict[str, str]) -> NodeFacts:
    a = settings.agent
    for key in ("heartbeat_interval_s", "poll_interval_s", "restart_base_s", "restart_max_s"):
        if not getattr(a, key) > 0:
            raise SettingsError(f"agent.{key} must be positive, got {getattr(a, key)}", key=f"agent.{key}",
                                expected="float > 0")
    m = _INSTANCE.match(instance)
    index = int(m.group(1)) if m else None
    name = a.name or (f"node{index}" if index is not None else os.uname().nodename.split(".")[0])
    zones = [z.strip() for z in a.zones.split(",")] if a.zones else []
    zone = a.zone or (zones[index] if index is not None and index < len(zones) else "")
    address = a.address or (node_address(index) if index is not None else "127.0.0.1")
    state_dir = str(Path(settings.state_dir).absolute())
    socket_dir = a.socket_dir or str(Path(tempfile.gettempdir()) / (
        "ff-node-" + hashlib.sha256(f"{state_dir}/{name}".encode()).hexdigest()[:10]))
    return NodeFacts(name=name, group=a.group, zone=zone, cpus=a.cpus or os.cpu_count() or 1, gpus=a.gpus,
                     address=address, state_dir=state_dir, socket_dir=socket_dir,
                     worker_prefix=tuple(shlex.split(a.worker_command)), sched_addr=env.get("FF_SCHED_ADDR", ""),
                     worker_token=settings.token or "")


class NodeAgentService(Service):
    """Fire-Flyer node agent (node)."""

    name = "node"
    settings_type = AgentSettings

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.manager: TaskManager | None = None
        self.started_at = time.time()
        self._ctx: ServiceContext | None = None
        self._runner: asyncio.Task[None] | None = None
        self._sched: Any = None
        self.link: SchedLink | None = None
        self.linkmon: LinkMonitor | None = None

    async def start(self, ctx: ServiceContext) -> None:
        settings: AgentSettings = self.settings  # type: ignore[assignment]
        a = settings.agent
        self._ctx = ctx
        facts = node_facts(settings, ctx.instance, dict(os.environ))
        policy = RestartPolicy(base_s=a.restart_base_s, max_s=a.restart_max_s, stable_s=a.restart_stable_s)
        self.manager = TaskManager(facts, agent_env=dict(os.environ), restart=policy, publish=self._publish_exit,
                                   log=ctx.log)
        counts = self.manager.load()
        NodeMetrics(ctx.metrics, self.manager)
        ctx.add_servicer(pb_grpc.add_NodeAgentServicer_to_server,
                         NodeAgentServicer(self.manager, started_at=self.started_at,
                                           agent_address=lambda: ctx.server.address),
                         SERVICE_NAME)
        self._runner = ctx.spawn(self.manager.run(a.poll_interval_s), name="node-tasks")
        if ctx.bus is not None:
            ctx.spawn(self._heartbeat_loop(a.heartbeat_interval_s), name="node-heartbeat")
            self._start_health_watchers(ctx, facts.name)
        sched_addr = os.environ.get("FF_SCHED_ADDR", "")
        if sched_addr and a.register:
            from fireflyer.sched.client import SchedClient

            # the agent's own (service) token: Register and Report are the agents' calls
            self._sched = SchedClient(sched_addr, token=settings.token or "", timeout_s=5.0, leader_wait_s=5.0)
            self.link = SchedLink(self.manager, self._sched, agent_address=lambda: ctx.server.address, log=ctx.log,
                                  interval_s=a.heartbeat_interval_s)
            ctx.spawn(self._after_bind(ctx, self.link.register_loop), name="node-register")
            ctx.spawn(self._after_bind(ctx, self.link.report_loop), name="node-report")
        ctx.log.info("node.starting", node=facts.name, group=facts.group, zone=facts.zone, cpus=facts.cpus,
                     gpus=facts.gpus, address=facts.address, **counts)

    def _start_health_watchers(self, ctx: ServiceContext, node: str) -> None:
        """Kernel-log Xids and link flaps (FF_NODE_KMSG_*, FF_NODE_LINKMON / FF_NODE_SYSFS_ROOT; off unless set)."""
        env, publish = dict(os.environ), ctx.require_bus().publish
        kmsg = KernLogSettings.from_env(env)
        if kmsg is not None:
            ctx.spawn(KernLogWatcher(node, kmsg, publish, log=ctx.log).run(), name="node-kmsg")
        links = LinkMonSettings.from_env(env)
        if links is not None:
            self.linkmon = LinkMonitor(node, links, publish, log=ctx.log)
            ctx.spawn(self.linkmon.run(), name="node-linkmon")

    @staticmethod
    async def _after_bind(ctx: ServiceContext, loop: Any) -> None:
        while ctx.server.port == 0:  # the registration names the agent's address: wait until it is bound
            await asyncio.sleep(0.01)
        await loop()

    async def _publish_exit(self, ev: TaskExited) -> None:
        assert self._ctx is not None
        if self._ctx.bus is not None:
            await self._ctx.bus.publish(task_exit_subject(ev.node), ev)

    async def _heartbeat_loop(self, interval_s: float) -> None:
        assert self._ctx is not None and self.manager is not None
        f = self.manager.facts
        while True:
            try:
                await self._ctx.require_bus().publish(heartbeat_subject(f.name), NodeHeartbeat(
                    node=f.name, group=f.group, zone=f.zone, cpus=f.cpus, gpus=f.gpus, address=f.address,
                    agent_address=self._ctx.server.address, running_tasks=self.manager.running(),
                    started_at=self.started_at))
                if self.linkmon is not None:
                    self.linkmon.heartbeat_sent(time.time(), interval_s)
            except Exception as e:  # noqa: BLE001 -- NATS away: the next beat tries again
                self._ctx.log.warning("node.heartbeat_failed", error=repr(e))
            await asyncio.sleep(interval_s)

    async def stop(self) -> None:
        settings: AgentSettings = self.settings  # type: ignore[assignment]
        if self._runner is not None:  # shutdown watches the tasks itself from here on
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        if self.manager is not None:
            await self.manager.shutdown(keep_tasks=settings.agent.keep_tasks_on_exit,
                                        grace_cap_s=settings.agent.shutdown_grace_s,
                                        interval_s=settings.agent.poll_interval_s)
        if self._sched is not None:
            await self._sched.close()


def main(argv: list[str] | None = None) -> int:
    return run_service(NodeAgentService, argv)
