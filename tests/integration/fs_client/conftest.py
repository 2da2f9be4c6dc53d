"""One real cluster for the fs client tests: ``ff up`` with mgmtd, meta and three storage nodes.

Timing is short (mgmtd fails a node after 1.5 s, storage heartbeats every 0.3 s) and
meta's GC delay is 1 s, so the GC test waits seconds, not minutes.  Chain table 1 has
two 3-replica chains; the root layout is chunk 64 KiB, stripe 2, so every test crosses
chunk and stripe boundaries with small files.  Each test works in its own directory.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fireflyer.fs import FileSystem, connect
from fireflyer.storage.client_min import MgmtdRouting, StorageClient
from fireflyer.testing.cluster import LocalCluster, started_cluster

CLUSTER_TOML = """
[cluster]
ready_timeout_s = 30.0
stop_timeout_s = 5.0

[nats]
port = 0

[[service]]
name = "mgmtd"
module = "services.mgmtd"
replicas = 1
env = { FF_MGMTD_LEASE_S = "2", FF_MGMTD_RENEW_S = "0.5", FF_MGMTD_STEP_DOWN_MARGIN_S = "0.5", FF_MGMTD_HEARTBEAT_FAIL_INTERVAL_S = "1.5", FF_MGMTD_SCAN_INTERVAL_S = "0.2", FF_MGMTD_CHAIN_UPDATE_INTERVAL_S = "0.2", FF_GRACE_S = "1" }

[[service]]
name = "meta"
module = "services.meta"
replicas = 1
env = { FF_META_ROOT_CHUNK_SIZE = "65536", FF_META_ROOT_STRIPE_SIZE = "2", FF_META_GC_DELAY_S = "1", FF_META_GC_INTERVAL_S = "0.2", FF_META_ROUTING_REFRESH_S = "1", FF_GRACE_S = "1" }

[[service]]
name = "storage"
module = "services.storage"
replicas = 3
env = { FF_STORAGE_TARGET_COUNT = "2", FF_STORAGE_FSYNC = "false", FF_STORAGE_HEARTBEAT_INTERVAL_S = "0.3", FF_STORAGE_ROUTING_PULL_S = "0.3", FF_STORAGE_RESYNC_INTERVAL_S = "0.2", FF_STORAGE_CONNECT_TIMEOUT_S = "0.5", FF_STORAGE_FORWARD_TIMEOUT_S = "1.0", FF_STORAGE_INIT_CHAINS = "nodes=3,replicas=3,table=1", FF_GRACE_S = "1" }
"""


@pytest.fixture(scope="package")
def fs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("fsc") / "state"
    with started_cluster(CLUSTER_TOML, state) as cluster:
        cluster.wait_chains_serving(2)
        yield cluster


@pytest.fixture(scope="package")
def ffs(fs_cluster: LocalCluster) -> Iterator[FileSystem]:
    """A client with the user token."""
    fs = connect(state_dir=fs_cluster.state_dir)
    yield fs
    fs.close()


@pytest.fixture(scope="package")
def admin_fs(fs_cluster: LocalCluster) -> Iterator[FileSystem]:
    fs = connect(state_dir=fs_cluster.state_dir, token=fs_cluster.admin_token)
    yield fs
    fs.close()


@pytest.fixture(scope="package")
def service_storage(fs_cluster: LocalCluster) -> Iterator[StorageClient]:
    """A storage client with the storage service's own credential (role service: exempt from
    capabilities), to inspect chunks meta no longer grants anyone (an unlinked file's, GC)."""
    token = fs_cluster.service_token("storage")
    routing = MgmtdRouting(fs_cluster.addresses("mgmtd"), token=token)
    client = StorageClient(routing.get, token=token)
    yield client
    client.close()
    routing.close()


@pytest.fixture(scope="package")
def shared_root(admin_fs: FileSystem) -> str:
    """A world-writable directory (the root belongs to root; the client runs as a user)."""
    admin_fs.mkdir("/u", 0o777)
    admin_fs.chmod("/u", 0o777)
    return "/u"


@pytest.fixture
def workdir(ffs: FileSystem, shared_root: str) -> str:
    path = f"{shared_root}/t-{uuid.uuid4().hex[:10]}"
    ffs.mkdir(path)
    return path


@pytest.fixture
def local_dir(tmp_path: Path) -> Path:
    d = tmp_path / "local"
    d.mkdir()
    return d
