"""Storage on the default local cluster: ``ff up`` (deploy/local.toml) creates chains by itself
(FF_STORAGE_INIT_CHAINS), and the minimal client writes and reads across chunk boundaries."""

from __future__ import annotations

import os

from fireflyer.storage.capability import READ, WRITE, CapabilityCache, Grantor, read_key_file
from fireflyer.storage.client_min import MgmtdRouting, StorageClient
from fireflyer.testing.cluster import LocalCluster


def test_storage_on_the_default_local_cluster(local_cluster: LocalCluster) -> None:
    local_cluster.wait_chains_serving(2)
    routing = MgmtdRouting(local_cluster.addresses("mgmtd"), token=local_cluster.user_token)
    try:
        # the capabilities meta would grant on open, signed with the cluster's key (ff up wrote it)
        grantor = Grantor(read_key_file(local_cluster.state_dir / "capability.key"))
        user = local_cluster.tokens.for_role("user").user  # type: ignore[union-attr]
        caps = CapabilityCache(lambda inode, mode, old: grantor.grant(inode=inode, mode=READ | WRITE, user=user))
        with StorageClient(routing.get, token=local_cluster.user_token, capabilities=caps) as client:
            data = os.urandom(3 * 65536 + 77)
            client.write_range(5, 1000, data, 65536, chain_of=lambda i: 1 + i % 2)
            assert client.read_range(5, 1000, len(data), 65536, chain_of=lambda i: 1 + i % 2) == data
    finally:
        routing.close()
