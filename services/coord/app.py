"""The coord service: settings (``FF_COORD_*``) and wiring onto the standard runtime.

    python -m services.coord        # FF_COORD_KV_URL=sqlite:///... (default <state_dir>/coord.db)

One replica serves a cluster: the rendezvous state lives in its memory and every
formed communicator in the KV, so a restarted coord (same KV) keeps answering
Get/List, continues generation numbers and keeps watching heartbeats of the
communicators it finds active (each member counted as seen at restart).
Liveness defaults: a heartbeat every 1 s, a member silent for 3 intervals gets
its communicator aborted.  Telemetry is consumed from
``ff.coord.v1.comm.*.telemetry`` in the queue group ``coord``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from fireflyer.api.coord.v1 import coord_pb2_grpc as pb_grpc
from fireflyer.bus import subjects
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import SettingsError
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.hfreduce.telemetry import TelemetryBatch
from fireflyer.kv import KV, aopen_kv

from .core import CoordCore, CoreConfig
from .metrics import CoordMetrics
from .servicer import SERVICE_NAME, CoordServicer
from .store import CoordStore

__all__ = ["CoordSection", "CoordSettings", "CoordService", "main", "TELEMETRY_PATTERN", "QUEUE_GROUP"]

TELEMETRY_PATTERN = subjects.pattern("coord", entity="comm", ident="*", event="telemetry")
QUEUE_GROUP = "coord"


class CoordSection(msgspec.Struct, frozen=True, kw_only=True):
    #: empty: sqlite:///<state_dir>/coord.db
    kv_url: str = ""
    heartbeat_interval_s: float = 1.0
    heartbeat_misses: int = 3
    #: after a coord restart, how much longer members of active communicators get to heartbeat again
    restart_grace_s: float = 10.0
    #: how long a Join waits for the other nodes when the request names no timeout
    join_timeout_s: float = 60.0
    sweep_interval_s: float = 0.1
    #: operations of telemetry kept per communicator
    keep_ops: int = 512


class CoordSettings(ServiceSettings, frozen=True, kw_only=True):
    coord: CoordSection = msgspec.field(default_factory=CoordSection)


def kv_url_for(settings: CoordSettings) -> str:
    return settings.coord.kv_url or f"sqlite:///{Path(settings.state_dir).absolute() / 'coord.db'}"


def core_config(settings: CoordSettings) -> CoreConfig:
    c = settings.coord
    for key in ("heartbeat_interval_s", "join_timeout_s", "sweep_interval_s"):
        if not getattr(c, key) > 0:
            raise SettingsError(f"coord.{key} must be positive, got {getattr(c, key)}", key=f"coord.{key}",
                                expected="float > 0")
    for key in ("heartbeat_misses", "keep_ops"):
        if getattr(c, key) < 1:
            raise SettingsError(f"coord.{key} must be >= 1, got {getattr(c, key)}", key=f"coord.{key}",
                                expected="int >= 1")
    return CoreConfig(heartbeat_interval_s=c.heartbeat_interval_s, heartbeat_misses=c.heartbeat_misses,
                      join_timeout_s=c.join_timeout_s, restart_grace_s=c.restart_grace_s,
                      sweep_interval_s=c.sweep_interval_s, keep_ops=c.keep_ops)


class CoordService(Service):
    """Fire-Flyer collective coordination service (coord)."""

    name = "coord"
    settings_type = CoordSettings

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.kv: KV | None = None
        self.core: CoordCore | None = None

    async def start(self, ctx: ServiceContext) -> None:
        settings: CoordSettings = self.settings  # type: ignore[assignment]
        cfg = core_config(settings)
        self.kv = await aopen_kv(kv_url_for(settings))
        self.core = CoordCore(cfg, store=CoordStore(self.kv), bus=ctx.bus, clock=ctx.clock, log=ctx.log,
                              metrics=CoordMetrics(ctx.metrics))
        loaded = await self.core.load()
        ctx.add_servicer(pb_grpc.add_CoordServiceServicer_to_server, CoordServicer(self.core), SERVICE_NAME)
        if ctx.bus is not None:
            await ctx.subscribe(TELEMETRY_PATTERN, self.core.on_telemetry, types=TelemetryBatch, queue=QUEUE_GROUP)
            # workers of a user's job publish in the user's namespace (fireflyer.bus.auth)
            await ctx.subscribe(subjects.owned_pattern(TELEMETRY_PATTERN), self.core.on_telemetry,
                                types=TelemetryBatch, queue=QUEUE_GROUP)
        ctx.spawn(self.core.sweep_loop(), name="coord-sweep")
        ctx.log.info("coord.starting", kv=kv_url_for(settings).split("@")[-1], loaded=loaded,
                     heartbeat_interval_s=cfg.heartbeat_interval_s, heartbeat_misses=cfg.heartbeat_misses)

    async def stop(self) -> None:
        if self.kv is not None:
            self.kv.close()


def main(argv: list[str] | None = None) -> int:
    return run_service(CoordService, argv)
