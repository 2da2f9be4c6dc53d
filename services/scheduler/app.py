"""The scheduler service: settings (``FF_SCHEDULER_*``) and wiring onto the standard runtime.

    python -m services.scheduler     # FF_SCHEDULER_KV_URL=sqlite:///... or postgresql://...?schema=scheduler

Several replicas share one KV (a SQLite file on one host, PostgreSQL across hosts); one holds the
lease and runs the decision loop (``core``), all serve reads.  ``kv_url`` defaults to
``sqlite:///<state_dir>/scheduler.db``; ``node_id`` to the instance name (``scheduler-0`` under
``ff up``), which must differ between replicas.  The grace times, minimum runtime and default
quota are the cluster admin's defaults of :class:`fireflyer.sched.model.SchedConfig` (HAI's).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.api.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import FireFlyerError, SettingsError
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.kv import KV, aopen_kv
from fireflyer.mgmt.lease import LeaseConfig
from fireflyer.sched.agents import NodeAgents, UnwiredAgents
from fireflyer.sched.model import Priority, SchedConfig

from .core import CoreConfig, SchedCore
from .metrics import SchedulerMetrics
from .nodeclient import GrpcNodeAgents
from .servicer import NODE_SERVICE, QUOTA_SERVICE, TASK_SERVICE, NodeServicer, QuotaServicer, TaskServicer

__all__ = ["SchedulerSection", "SchedulerSettings", "SchedulerService", "kv_url_for", "core_config", "main"]


class SchedulerSection(msgspec.Struct, frozen=True, kw_only=True):
    #: the shared KV; empty: sqlite:///<state_dir>/scheduler.db
    kv_url: str = ""
    #: this replica's name in the lease; empty: the instance name
    node_id: str = ""
    #: host:port other processes reach this replica at; empty: the bound gRPC address
    advertise_address: str = ""
    lease_s: float = 10.0
    renew_s: float = 2.0
    step_down_margin_s: float = 2.0
    takeover_grace_s: float = 0.0
    #: the decision loop's period (HAI's beater ticks once a second); submits also wake it
    tick_s: float = 1.0
    #: how often node agents should call Register (their heartbeat)
    heartbeat_interval_s: float = 1.0
    #: an agent silent this long loses its node: its runs are requeued elsewhere (0: never)
    node_timeout_s: float = 30.0
    #: a start or stop that got no answer for this long is sent again
    resend_s: float = 10.0
    # the admin's defaults for the decision and the interrupt handshake (SchedConfig's)
    min_runtime_s: float = 900.0
    grace_ack_s: float = 5.0
    grace_final_s: float = 5.0
    grace_max_s: float = 3600.0
    #: nodes per (user, group, priority) where no quota entry applies; -1: no cap
    default_quota: int = -1
    allow_cross_zone: bool = True
    preempt_equal_priority: bool = False
    auto_fallback: str = "LOW"


class SchedulerSettings(ServiceSettings, frozen=True, kw_only=True):
    scheduler: SchedulerSection = msgspec.field(default_factory=SchedulerSection)


def kv_url_for(settings: SchedulerSettings) -> str:
    return settings.scheduler.kv_url or f"sqlite:///{Path(settings.state_dir).absolute() / 'scheduler.db'}"


def core_config(settings: SchedulerSettings, instance: str) -> CoreConfig:
    """Validated settings; a bad combination fails start-up naming the key (exit code 2)."""
    s = settings.scheduler
    try:
        lease = LeaseConfig(lease_s=s.lease_s, renew_s=s.renew_s, step_down_margin_s=s.step_down_margin_s,
                            takeover_grace_s=s.takeover_grace_s)
    except FireFlyerError as e:
        raise SettingsError(f"scheduler settings: {e}", key=f"scheduler.{e.fields.get('key') or 'lease_s'}") from e
    for key in ("tick_s", "heartbeat_interval_s", "grace_max_s", "resend_s"):
        if not getattr(s, key) > 0:
            raise SettingsError(f"scheduler.{key} must be positive, got {getattr(s, key)}", key=f"scheduler.{key}",
                                expected="float > 0")
    for key in ("grace_ack_s", "grace_final_s"):
        if not 0 <= getattr(s, key) <= s.grace_max_s:
            raise SettingsError(f"scheduler.{key} must be between 0 and grace_max_s ({s.grace_max_s:g}), got "
                                f"{getattr(s, key)}", key=f"scheduler.{key}", expected="float in [0, grace_max_s]")
    if s.min_runtime_s < 0:
        raise SettingsError(f"scheduler.min_runtime_s must be >= 0, got {s.min_runtime_s}",
                            key="scheduler.min_runtime_s", expected="float >= 0")
    try:
        fallback = Priority[s.auto_fallback.upper()]
    except KeyError:
        raise SettingsError(f"scheduler.auto_fallback {s.auto_fallback!r} is not a priority level",
                            key="scheduler.auto_fallback", expected="LOW ... EXTREME_HIGH") from None
    sched = SchedConfig(min_runtime_s=s.min_runtime_s, allow_cross_zone=s.allow_cross_zone,
                        preempt_equal_priority=s.preempt_equal_priority,
                        default_quota=None if s.default_quota < 0 else s.default_quota, auto_fallback=fallback,
                        grace_ack_s=s.grace_ack_s, grace_final_s=s.grace_final_s, grace_max_s=s.grace_max_s)
    if s.node_timeout_s < 0 or 0 < s.node_timeout_s <= s.heartbeat_interval_s:
        raise SettingsError(f"scheduler.node_timeout_s must be 0 (never) or longer than heartbeat_interval_s "
                            f"({s.heartbeat_interval_s:g}), got {s.node_timeout_s}", key="scheduler.node_timeout_s",
                            expected="0 or float > heartbeat_interval_s")
    return CoreConfig(node_id=s.node_id or instance, lease=lease, sched=sched, tick_s=s.tick_s,
                      heartbeat_interval_s=s.heartbeat_interval_s, node_timeout_s=s.node_timeout_s,
                      resend_s=s.resend_s)


class SchedulerService(Service):
    """Fire-Flyer HAI Platform scheduler (scheduler)."""

    name = "scheduler"
    settings_type = SchedulerSettings
    uses_bus = False

    def __init__(self, settings: Any, *, agents: NodeAgents | None = None) -> None:
        super().__init__(settings)
        self._own_agents = agents is None
        self.agents: NodeAgents = agents if agents is not None else UnwiredAgents()
        self.kv: KV | None = None
        self.core: SchedCore | None = None

    async def start(self, ctx: ServiceContext) -> None:
        settings: SchedulerSettings = self.settings  # type: ignore[assignment]
        cfg = core_config(settings, ctx.instance)
        if self._own_agents:
            # the real agents, called with this scheduler's own service token (never a user's)
            self.agents = GrpcNodeAgents(token=settings.token or "", coord_addr=os.environ.get("FF_COORD_ADDR", ""))
        self.kv = await aopen_kv(kv_url_for(settings))
        advertise = settings.scheduler.advertise_address
        self.core = SchedCore(cfg, kv=self.kv, agents=self.agents, clock=ctx.clock, log=ctx.log,
                              address=lambda: advertise or ctx.server.address)
        core = self.core
        SchedulerMetrics(ctx.metrics, is_leader=core.is_leader, view=lambda: core.queue_view)
        ctx.add_servicer(pb_grpc.add_TaskServiceServicer_to_server, TaskServicer(self.core), TASK_SERVICE)
        ctx.add_servicer(pb_grpc.add_NodeServiceServicer_to_server, NodeServicer(self.core), NODE_SERVICE)
        ctx.add_servicer(pb_grpc.add_QuotaServiceServicer_to_server, QuotaServicer(self.core), QUOTA_SERVICE)
        ctx.spawn(self._lease(ctx, self.core), name="scheduler-lease")
        ctx.log.info("scheduler.starting", node=cfg.node_id, kv=kv_url_for(settings).split("@")[-1],
                     lease_s=cfg.lease.lease_s, tick_s=cfg.tick_s, agents=type(self.agents).__name__)

    @staticmethod
    async def _lease(ctx: ServiceContext, core: SchedCore) -> None:
        while ctx.server.port == 0:  # the lease names the address: wait until the port is bound
            await asyncio.sleep(0.01)
        await core.lease_loop()

    async def stop(self) -> None:
        if self.core is not None:
            await self.core.release()
        if isinstance(self.agents, GrpcNodeAgents):
            await self.agents.close()
        if self.kv is not None:
            self.kv.close()


def main(argv: list[str] | None = None) -> int:
    return run_service(SchedulerService, argv)
