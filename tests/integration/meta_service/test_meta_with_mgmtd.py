"""Meta wired to a real mgmtd: chain tables from routing info, replicas found through heartbeats.

With ``FF_MGMTD_ADDR`` set, meta takes chain tables from mgmtd's routing info (no static
table), refreshes them when a create names a table it has not seen yet, and heartbeats
itself as a ``meta`` node so ``MetaClient.connect(mgmtd=...)`` finds it.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from metasvc import Tokens, meta_env

from fireflyer.core.errors import FsError
from fireflyer.fs import MetaClient
from fireflyer.meta import LayoutPolicy
from fireflyer.mgmt.client import MgmtdClient
from fireflyer.mgmt.edits import ChainSpec, TargetSpec
from fireflyer.mgmt.model import NodeType
from fireflyer.testing.poll import wait_for
from fireflyer.testing.services import ServiceProcess


@pytest.mark.slow
async def test_chain_tables_and_discovery_through_mgmtd(tmp_path: Path, tokens: Tokens) -> None:
    state = tmp_path / "state"
    mgmtd = ServiceProcess("services.mgmtd", state_dir=state, nats_url="", tokens_file=tokens.path,
                           instance="mgmtd-0", env={"FF_TOKEN": tokens.admin}).start()
    meta = None
    try:
        await mgmtd.wait_healthy(timeout_s=30)
        env = {**meta_env(state, tokens, f"sqlite:///{state / 'meta.db'}"), "FF_MGMTD_ADDR": mgmtd.address,
               "FF_TOKEN": tokens.service, "FF_META_HEARTBEAT_S": "0.2", "FF_META_ROUTING_REFRESH_S": "30"}
        meta = ServiceProcess("services.meta", state_dir=state, nats_url="", tokens_file=tokens.path,
                              instance="meta-0", env=env).start()
        await meta.wait_healthy(timeout_s=30)
        async with MgmtdClient(mgmtd.address, token=tokens.admin) as admin:
            async def meta_registered() -> bool:
                routing = await admin.get_routing(0)
                return routing is not None and any(n.type is NodeType.META and n.address == meta.address
                                                   for n in routing.nodes)

            await wait_for(meta_registered, timeout_s=20, interval_s=0.1, what="meta heartbeat in routing info")
            async with await MetaClient.connect(mgmtd=admin, token=tokens.admin) as fs:
                assert fs.addresses == [meta.address]  # discovered, not configured
                with pytest.raises(FsError) as info:  # the root policy's table 1 is not uploaded yet
                    await fs.create("/early")
                assert info.value.fields.get("table") == 1 and info.value.errno == errno.EINVAL
                await admin.create_chains([ChainSpec(chain_id=c, targets=(TargetSpec(target_id=100 + c,
                                                                                     node_id="s1"),))
                                           for c in (11, 12, 13, 14)])
                await admin.create_chain_table(7, [11, 12, 13, 14])
                # meta has not pulled since (refresh 30 s): the create asks for a refresh itself
                await fs.mkdir("/d", policy=LayoutPolicy(7, 1 << 20, 2))
                lay = (await fs.create("/d/f")).inode.layout
                assert lay is not None and lay.chain_table_id == 7 and lay.chain_table_version == 1
                assert len(lay.chains) == 2 and set(lay.chains) <= {11, 12, 13, 14}
    finally:
        if meta is not None:
            meta.stop(timeout_s=5)
        mgmtd.stop(timeout_s=5)
