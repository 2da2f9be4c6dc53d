"""The health service: settings (``FF_HEALTH_*``) and wiring onto the standard runtime.

    python -m services.health        # FF_HEALTH_KV_URL=sqlite:///... (default <state_dir>/health.db)

It keeps each node's health state, baseline, validations and incidents in the KV; validates nodes
on their agents (``NodeAgent.Validate``) periodically (level 3, ``periodic_interval_s``, default
weekly), before a drained node rejoins (level 2) and on demand (``ff health validate``); acts on
incidents other detectors report (:meth:`~services.health.core.HealthCore.report_incident`, or the
``ReportIncident`` RPC): drains the blamed node at the scheduler (its run requeued elsewhere),
validates it once free and enables it again if it passes.  Drains and enables go through the
scheduler's ``NodeService.SetState`` with this service's own credential (``FF_TOKEN``, role
service); the scheduler and the agents are found through ``FF_SCHED_ADDR`` (``ff up`` passes it).

Every state change is published as a :class:`~fireflyer.health.records.NodeVerdict` on JetStream
subject ``ff.health.v1.node.<node>.verdict`` (stream ``FF_HEALTH``) through an outbox
(``<state_dir>/<instance>.outbox.db``), so a change made while NATS is away goes out once it is back.

Replicas: run one.  Several would share the KV (PostgreSQL) and take turns as the scheduler's do
(:mod:`services.scheduler.leader`, mgmtd's lease rules in :mod:`fireflyer.mgmt.lease`): every
replica serves ListNodes / ListIncidents / GetIncident from the KV, and only the lease holder runs
the tick loop, starts validations and performs drains, with every state change a KV transaction
that re-reads the lease, so a deposed replica commits nothing.  That lease is not wired here yet:
with one replica the per-node locks in the core are the only serialization needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.api.health.v1 import health_pb2_grpc as pb_grpc
from fireflyer.bus import subjects
from fireflyer.bus.outbox import Outbox
from fireflyer.coord.client import CoordClient
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import FireFlyerError, SettingsError
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.health.c4 import C4Config
from fireflyer.health.events import ADVICE_PATTERN, NodeAdvice
from fireflyer.health.records import STREAM, STREAM_SUBJECTS, IncidentRecord, NodeVerdict, verdict_subject
from fireflyer.health.states import INCIDENT_LEVEL
from fireflyer.hfreduce.telemetry import TelemetryBatch
from fireflyer.kv import KV, aopen_kv

from .core import CoreConfig, HealthCore, plans_for
from .detectors import AdviceDetector, TelemetryDetector
from .ports import GrpcAgents, GrpcSched
from .servicer import SERVICE_NAME, HealthServicer

#: where every HFReduce worker publishes its op telemetry (coord's subscription too)
TELEMETRY_PATTERN = subjects.pattern("coord", entity="comm", ident="*", event="telemetry")

__all__ = ["HealthSection", "HealthSettings", "HealthService", "kv_url_for", "core_config", "main"]


class HealthSection(msgspec.Struct, frozen=True, kw_only=True):
    #: empty: sqlite:///<state_dir>/health.db
    kv_url: str = ""
    #: how often the nodes are looked at (drains that finished, validations due)
    tick_s: float = 1.0
    #: a healthy node gets a level-3 validation this long after its last one (0: never)
    periodic_interval_s: float = 7 * 86400.0
    #: periodic drains start only while fewer nodes than this are draining or validating
    periodic_concurrency: int = 1
    #: the level an incident's validation runs at before the node rejoins
    incident_level: int = INCIDENT_LEVEL
    #: a throughput under this fraction of the node's baseline fails its check
    baseline_fraction: float = 0.5
    #: check sizes: full (the runner's DCGM-like levels: seconds, minutes, hours) or quick (seconds: local clusters)
    sizes: str = "full"
    #: how long one validation may run on the agent
    validate_timeout_s: float = 7200.0
    #: how long one attempt to publish a verdict waits for JetStream's ack (the outbox retries)
    publish_timeout_s: float = 2.0
    #: a node drained for an incident waits this long before its rejoin validation (its run goes elsewhere)
    quarantine_s: float = 60.0
    #: C4 over the HFReduce telemetry stream (services.health.detectors); off: no subscription
    c4_enabled: bool = True
    #: the hang deadline: HFReduce's op timeout (FF_HFREDUCE_TIMEOUT_S, 60 s by default)
    c4_deadline_s: float = 60.0
    #: a slow node must be an outlier in this many of the last ``c4_persist_n`` ops of its communicator
    #: (a slow compute step shows in the first collective after it: a DDP step of a few buckets and a
    #: suspend poll gives one lagging op in three or four)
    c4_persist_k: int = 3
    c4_persist_n: int = 12
    c4_z_threshold: float = 6.0
    c4_min_lag_excess_s: float = 0.05
    c4_two_node_min_lag_s: float = 0.25
    #: act on the node agents' Xid / flash-cut advice (ff.node.v1.node.*.advice)
    advice_enabled: bool = True


class HealthSettings(ServiceSettings, frozen=True, kw_only=True):
    health: HealthSection = msgspec.field(default_factory=HealthSection)


def kv_url_for(settings: HealthSettings) -> str:
    return settings.health.kv_url or f"sqlite:///{Path(settings.state_dir).absolute() / 'health.db'}"


def outbox_path(settings: HealthSettings, instance: str) -> Path:
    """``<state_dir>/<instance>.outbox.db``: verdicts not yet acked by JetStream."""
    return Path(settings.state_dir).absolute() / f"{instance}.outbox.db"


def c4_config(settings: HealthSettings) -> C4Config:
    """The C4 thresholds of the settings; a bad combination fails start-up naming the key."""
    h = settings.health
    try:
        return C4Config(deadline_s=h.c4_deadline_s, z_threshold=h.c4_z_threshold, persist_k=h.c4_persist_k,
                        persist_n=h.c4_persist_n, nic_spread_k=min(4, h.c4_persist_n),
                        min_lag_excess_s=h.c4_min_lag_excess_s, two_node_min_lag_s=h.c4_two_node_min_lag_s).validate()
    except FireFlyerError as e:
        raise SettingsError(str(e), key="health.c4_*", expected="deadline and z > 0, 1 <= persist_k <= persist_n") from e


def core_config(settings: HealthSettings) -> CoreConfig:
    """Validated settings; a bad value fails start-up naming the key."""
    h = settings.health
    if h.quarantine_s < 0:
        raise SettingsError(f"health.quarantine_s must be >= 0, got {h.quarantine_s}", key="health.quarantine_s",
                            expected="float >= 0")
    for key in ("tick_s", "validate_timeout_s", "publish_timeout_s"):
        if not getattr(h, key) > 0:
            raise SettingsError(f"health.{key} must be positive, got {getattr(h, key)}", key=f"health.{key}",
                                expected="float > 0")
    if h.periodic_interval_s < 0:
        raise SettingsError(f"health.periodic_interval_s must be >= 0, got {h.periodic_interval_s}",
                            key="health.periodic_interval_s", expected="float >= 0 (0: never)")
    if h.periodic_concurrency < 1:
        raise SettingsError(f"health.periodic_concurrency must be >= 1, got {h.periodic_concurrency}",
                            key="health.periodic_concurrency", expected="int >= 1")
    if h.incident_level not in (1, 2, 3):
        raise SettingsError(f"health.incident_level must be 1, 2 or 3, got {h.incident_level}",
                            key="health.incident_level", expected="1, 2 or 3")
    if not 0 < h.baseline_fraction <= 1:
        raise SettingsError(f"health.baseline_fraction must be in (0, 1], got {h.baseline_fraction}",
                            key="health.baseline_fraction", expected="float in (0, 1]")
    try:
        plans = plans_for(h.sizes)
    except FireFlyerError as e:
        raise SettingsError(str(e), key="health.sizes", expected="full or quick") from e
    return CoreConfig(tick_s=h.tick_s, periodic_interval_s=h.periodic_interval_s,
                      periodic_concurrency=h.periodic_concurrency, incident_level=h.incident_level,
                      baseline_fraction=h.baseline_fraction, plans=plans, validate_timeout_s=h.validate_timeout_s,
                      quarantine_s=h.quarantine_s)


class HealthService(Service):
    """Fire-Flyer health service (health)."""

    name = "health"
    settings_type = HealthSettings

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.kv: KV | None = None
        self.core: HealthCore | None = None
        self._sched: GrpcSched | None = None
        self._agents: GrpcAgents | None = None
        self._outbox: Outbox | None = None
        self._ctx: ServiceContext | None = None
        self._coord: CoordClient | None = None
        self.c4: TelemetryDetector | None = None
        self.advice: AdviceDetector | None = None

    async def start(self, ctx: ServiceContext) -> None:
        settings: HealthSettings = self.settings  # type: ignore[assignment]
        cfg = core_config(settings)
        self._ctx = ctx
        sched_addr = os.environ.get("FF_SCHED_ADDR", "")
        if not sched_addr:
            raise SettingsError("the health service needs the scheduler: set FF_SCHED_ADDR (ff up sets it)",
                                key="FF_SCHED_ADDR", expected="host:port[,host:port]")
        if ctx.bus is not None:
            await ctx.bus.ensure_stream(STREAM, STREAM_SUBJECTS)
            self._outbox = Outbox(ctx.bus, path=outbox_path(settings, ctx.instance),
                                  name=f"{ctx.instance}-verdicts", attempt_timeout_s=settings.health.publish_timeout_s)
            await self._outbox.start()
        else:
            ctx.log.warning("health.no_nats", note="verdicts are not published (nats.url is empty)")
        self.kv = await aopen_kv(kv_url_for(settings))
        token = settings.token or ""
        self._sched = GrpcSched(sched_addr, token=token)
        self._agents = GrpcAgents(token=token)
        self.core = HealthCore(cfg, kv=self.kv, sched=self._sched, agents=self._agents, clock=ctx.clock,
                               log=ctx.log, publish=self._publish)
        ctx.add_servicer(pb_grpc.add_HealthServiceServicer_to_server, HealthServicer(self.core), SERVICE_NAME)
        ctx.spawn(self.core.loop(), name="health-tick")
        await self._start_detectors(ctx, settings)
        ctx.log.info("health.starting", kv=kv_url_for(settings).split("@")[-1], sched=sched_addr,
                     periodic_interval_s=cfg.periodic_interval_s, sizes=settings.health.sizes)

    async def _start_detectors(self, ctx: ServiceContext, settings: HealthSettings) -> None:
        """Subscribe the C4 and advice detectors (their own queue group: coord keeps every batch)."""
        assert self.core is not None
        core = self.core
        if ctx.bus is None:
            return

        async def report(rec: IncidentRecord) -> Any:
            return await core.report_incident(rec, reporter="health")
        coord_addr = os.environ.get("FF_COORD_ADDR", "").split(",")[0]
        if settings.health.c4_enabled and coord_addr:
            self._coord = CoordClient(coord_addr, token=settings.token or None)
            self.c4 = TelemetryDetector(c4_config(settings), lookup=self._coord, report=report, clock=ctx.clock,
                                        log=ctx.log)
            for pat in (TELEMETRY_PATTERN, subjects.owned_pattern(TELEMETRY_PATTERN)):
                await ctx.subscribe(pat, self.c4.on_batch, types=TelemetryBatch, queue="health-c4")
            ctx.spawn(self.c4.loop(), name="health-c4")
        elif settings.health.c4_enabled:
            ctx.log.info("health.c4_off", reason="no coordination service (FF_COORD_ADDR) to name node ranks")
        if settings.health.advice_enabled:
            self.advice = AdviceDetector(report=report, log=ctx.log)
            await ctx.subscribe(ADVICE_PATTERN, self.advice.on_advice, types=NodeAdvice, queue="health-advice")

    def _publish(self, verdict: NodeVerdict) -> None:
        if self._outbox is not None:
            self._outbox.append(verdict_subject(verdict.node), verdict)

    async def stop(self) -> None:
        if self.core is not None:
            await self.core.stop()
        if self._outbox is not None:
            await self._outbox.stop(drain_s=2.0)
        for port in (self._sched, self._agents, self._coord):
            if port is not None:
                await port.close()
        if self.kv is not None:
            self.kv.close()


def main(argv: list[str] | None = None) -> int:
    return run_service(HealthService, argv)
