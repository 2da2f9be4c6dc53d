"""The mgmtd service: settings (``FF_MGMTD_*``) and wiring onto the standard runtime.

    python -m services.mgmtd        # FF_MGMTD_KV_URL=sqlite:///... or postgresql://...?schema=mgmtd

Several replicas share one KV (SQLite file on one host, PostgreSQL across hosts); one
holds the lease and writes, all serve reads.  Defaults are 3FS's ``MgmtdConfig``
(lease 60 s renewed every 10 s, heartbeat fail interval 60 s checked every 10 s, chain
updater every 1 s; research/3fs.md §1); tests shrink them.  ``kv_url`` defaults to
``sqlite:///<state_dir>/mgmtd.db``; ``node_id`` to the instance name (``mgmtd-0`` under
``ff up``), which must differ between replicas.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.api.mgmtd.v1 import mgmtd_pb2_grpc as pb_grpc
from fireflyer.bus import subjects
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import FireFlyerError, SettingsError
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.kv import KV, aopen_kv
from fireflyer.mgmt.lease import LeaseConfig

from .loops import CoreConfig, MgmtdCore
from .servicer import SERVICE_NAME, MgmtdServicer

__all__ = ["MgmtdSection", "MgmtdSettings", "MgmtdService", "main"]


class MgmtdSection(msgspec.Struct, frozen=True, kw_only=True):
    #: the shared KV; empty: sqlite:///<state_dir>/mgmtd.db
    kv_url: str = ""
    #: names the routing subject ff.mgmtd.v1.routing.<cluster_id>.updated
    cluster_id: str = "local"
    #: this replica's name in the lease; empty: the instance name
    node_id: str = ""
    #: host:port other processes reach this replica at; empty: the bound gRPC address
    advertise_address: str = ""
    lease_s: float = 60.0
    renew_s: float = 10.0
    #: the primary stops acting this long before its lease ends (clock-skew margin)
    step_down_margin_s: float = 5.0
    #: a follower waits this long past a lease's end before taking over
    takeover_grace_s: float = 0.0
    heartbeat_fail_interval_s: float = 60.0
    scan_interval_s: float = 10.0
    chain_update_interval_s: float = 1.0


class MgmtdSettings(ServiceSettings, frozen=True, kw_only=True):
    mgmtd: MgmtdSection = msgspec.field(default_factory=MgmtdSection)


def kv_url_for(settings: MgmtdSettings) -> str:
    return settings.mgmtd.kv_url or f"sqlite:///{Path(settings.state_dir).absolute() / 'mgmtd.db'}"


def core_config(settings: MgmtdSettings, instance: str) -> CoreConfig:
    """Validated timing; a bad combination fails start-up naming the key (exit code 2)."""
    m = settings.mgmtd
    try:
        lease = LeaseConfig(lease_s=m.lease_s, renew_s=m.renew_s, step_down_margin_s=m.step_down_margin_s,
                            takeover_grace_s=m.takeover_grace_s)
        subjects.check_token("cluster_id", m.cluster_id)
    except FireFlyerError as e:
        raise SettingsError(f"mgmtd settings: {e}", key=f"mgmtd.{e.fields.get('key') or 'cluster_id'}") from e
    for key in ("heartbeat_fail_interval_s", "scan_interval_s", "chain_update_interval_s"):
        if not getattr(m, key) > 0:
            raise SettingsError(f"mgmtd.{key} must be positive, got {getattr(m, key)}", key=f"mgmtd.{key}",
                                expected="float > 0")
    return CoreConfig(node_id=m.node_id or instance, cluster_id=m.cluster_id, lease=lease,
                      fail_interval_s=m.heartbeat_fail_interval_s, scan_interval_s=m.scan_interval_s,
                      chain_update_interval_s=m.chain_update_interval_s)


class MgmtdService(Service):
    """Fire-Flyer 3FS cluster manager (mgmtd)."""

    name = "mgmtd"
    settings_type = MgmtdSettings

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.kv: KV | None = None
        self.core: MgmtdCore | None = None

    async def start(self, ctx: ServiceContext) -> None:
        settings: MgmtdSettings = self.settings  # type: ignore[assignment]
        cfg = core_config(settings, ctx.instance)
        self.kv = await aopen_kv(kv_url_for(settings))
        advertise = settings.mgmtd.advertise_address
        self.core = MgmtdCore(cfg, kv=self.kv, bus=ctx.bus, clock=ctx.clock, log=ctx.log,
                              address=lambda: advertise or ctx.server.address)
        ctx.add_servicer(pb_grpc.add_MgmtdServiceServicer_to_server, MgmtdServicer(self.core), SERVICE_NAME)
        # the lease loop's first pass runs once the server has bound its port (the address it advertises)
        ctx.spawn(self._lease(ctx, self.core), name="mgmtd-lease")
        ctx.log.info("mgmtd.starting", node=cfg.node_id, kv=kv_url_for(settings).split("@")[-1],
                     lease_s=cfg.lease.lease_s, renew_s=cfg.lease.renew_s)

    @staticmethod
    async def _lease(ctx: ServiceContext, core: MgmtdCore) -> None:
        while ctx.server.port == 0:
            await asyncio.sleep(0.01)
        await core.lease_loop()

    async def stop(self) -> None:
        if self.core is not None:
            await self.core.release()
        if self.kv is not None:
            self.kv.close()


def main(argv: list[str] | None = None) -> int:
    return run_service(MgmtdService, argv)
