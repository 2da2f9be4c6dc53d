"""Shared pieces of the mgmtd integration tests (constants, the Replicas handle).

Timing is shrunk from 3FS's defaults (lease 60 s / renew 10 s / fail 60 s) to
lease 2 s, renew 0.5 s, step-down margin 0.5 s, fail interval 1.5 s, scan 0.2 s,
chain updater 0.2 s, so failover and failure detection take about two seconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fireflyer.mgmt.client import MgmtdClient, PrimaryInfo
from fireflyer.testing.poll import wait_for
from fireflyer.testing.services import ServiceProcess

MODULE = "services.mgmtd"
LEASE_S = 2.0
RENEW_S = 0.5
FAIL_S = 1.5

TIMING = {
    "FF_MGMTD_LEASE_S": str(LEASE_S),
    "FF_MGMTD_RENEW_S": str(RENEW_S),
    "FF_MGMTD_STEP_DOWN_MARGIN_S": "0.5",
    "FF_MGMTD_HEARTBEAT_FAIL_INTERVAL_S": str(FAIL_S),
    "FF_MGMTD_SCAN_INTERVAL_S": "0.2",
    "FF_MGMTD_CHAIN_UPDATE_INTERVAL_S": "0.2",
    "FF_GRACE_S": "1",
}


class Tokens:
    """The test's tokens file: an admin, a user, and two service credentials (svc-storage and
    svc-meta, role service: only services register nodes)."""

    def __init__(self, path: Path, admin: str, user: str, service: str, other_service: str) -> None:
        self.path, self.admin, self.user = path, admin, user
        self.service, self.other_service = service, other_service


class Replicas:
    """N mgmtd processes and an admin client that knows all of them."""

    def __init__(self, procs: list[ServiceProcess], tokens: Tokens) -> None:
        self.procs = procs
        self.tokens = tokens
        self.client = MgmtdClient([p.address for p in procs], token=tokens.admin, call_timeout_s=2.0)
        #: a storage node's credential, for heartbeats
        self.service_client = MgmtdClient([p.address for p in procs], token=tokens.service, call_timeout_s=2.0)

    def live(self) -> list[ServiceProcess]:
        return [p for p in self.procs if p.returncode is None]

    async def views(self) -> list[PrimaryInfo]:
        return list(await asyncio.gather(*(self.client.get_primary(p.address) for p in self.live())))

    async def wait_primary(self, timeout_s: float = 10.0) -> ServiceProcess:
        """Wait until exactly one live replica says it is primary and every one names it."""
        async def one() -> ServiceProcess | None:
            views = await self.views()
            primaries = [v for v in views if v.is_primary]
            if len(primaries) == 1 and all(v.primary == primaries[0].node for v in views):
                return next(p for p in self.live() if p.instance == primaries[0].node)
            return None

        return await wait_for(one, timeout_s=timeout_s, interval_s=0.05, what="exactly one mgmtd primary")
