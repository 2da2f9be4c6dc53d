"""Checkpoint files in 3FS belong to the job's owner (issue 48, point 3): ``ff up`` with a tokens
file of three callers (admin; alice and bob, users).  Alice's ranks save with her token: the job's
directory is hers and 0700, every shard and index file hers and 0600, so bob can neither list nor
read them through meta and the file client, nor remove her job's directory from the sticky
``/ckpt``; bob cannot save into her job; the admin and alice can read and delete."""

from __future__ import annotations

import errno as E
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fireflyer.ckpt import CheckpointManager
from fireflyer.ckpt.client import CheckpointClient
from fireflyer.ckpt.index import index_name
from fireflyer.ckpt.model import CkptState
from fireflyer.core.errors import FsError, PermissionDenied
from fireflyer.fs import connect
from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file
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
env = { FF_MGMTD_SCAN_INTERVAL_S = "0.2", FF_MGMTD_CHAIN_UPDATE_INTERVAL_S = "0.2", FF_GRACE_S = "1" }

[[service]]
name = "meta"
module = "services.meta"
replicas = 1
env = { FF_META_ROOT_CHUNK_SIZE = "262144", FF_META_ROOT_STRIPE_SIZE = "2", FF_META_ROUTING_REFRESH_S = "1", FF_GRACE_S = "1" }

[[service]]
name = "storage"
module = "services.storage"
replicas = 1
env = { FF_STORAGE_TARGET_COUNT = "2", FF_STORAGE_FSYNC = "false", FF_STORAGE_HEARTBEAT_INTERVAL_S = "0.3", FF_STORAGE_ROUTING_PULL_S = "0.3", FF_STORAGE_INIT_CHAINS = "nodes=1,replicas=1,table=1", FF_GRACE_S = "1" }

[[service]]
name = "checkpoint"
module = "services.checkpoint"
replicas = 1
env = { FF_CHECKPOINT_CHUNK_BYTES = "0", FF_CHECKPOINT_SWEEP_INTERVAL_S = "0.5", FF_GRACE_S = "1" }
"""

TOKENS = {"admin": generate_token(), "alice": generate_token(), "bob": generate_token()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("cko") / "state"
    # ff up keeps a valid tokens file it finds (a cluster's users are whoever the file lists)
    write_tokens_file(state / "tokens.json", [TokenEntry(token=TOKENS["admin"], user="admin", roles=["admin"]),
                                              TokenEntry(token=TOKENS["alice"], user="alice", roles=["user"]),
                                              TokenEntry(token=TOKENS["bob"], user="bob", roles=["user"])])
    with started_cluster(CLUSTER_TOML, state) as c:
        c.wait_chains_serving(2)
        yield c


def _state(seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(5000).astype(np.float32), "b": np.arange(seed + 3), "step": seed}


def _manager(cluster: LocalCluster, user: str, job: str) -> CheckpointManager:
    fs = connect(state_dir=cluster.state_dir, token=TOKENS[user])
    client = CheckpointClient(cluster.address("checkpoint"), token=TOKENS[user])
    return CheckpointManager(job, catalog=client, fs=fs, shard_bytes=64 << 10)


def _refused(fn, *errnos: int) -> FsError:  # type: ignore[no-untyped-def]
    with pytest.raises(FsError) as ei:
        fn()
    assert ei.value.errno in errnos, ei.value
    return ei.value


def test_alices_checkpoint_files_are_hers_alone(cluster: LocalCluster, tmp_path: Path) -> None:
    mgr = _manager(cluster, "alice", "alicejob")
    try:
        rec = mgr.save(1, _state(1), blocking=True).result()
        assert rec.state is CkptState.COMMITTED and rec.owner == "alice"
    finally:
        mgr.close()
    admin = connect(state_dir=cluster.state_dir, token=TOKENS["admin"])
    alice = connect(state_dir=cluster.state_dir, token=TOKENS["alice"])
    bob = connect(state_dir=cluster.state_dir, token=TOKENS["bob"])
    try:
        root = admin.stat("/ckpt")
        assert stat.S_IMODE(root.mode) == 0o1777  # anyone makes a job directory; no one removes another's
        job_dir = admin.stat("/ckpt/alicejob")
        alice_uid = alice.stat(rec.directory).uid
        assert job_dir.uid == alice_uid != 0 and stat.S_IMODE(job_dir.mode) == 0o700
        assert stat.S_IMODE(admin.stat(rec.directory).mode) == 0o700
        names = admin.ls(rec.directory)
        shards = [n for n in names if n.endswith(".bin")]
        assert shards and index_name(0) in names
        for name in [*shards, index_name(0)]:
            st = admin.stat(f"{rec.directory}/{name}")
            assert st.uid == alice_uid and stat.S_IMODE(st.mode) == 0o600, (name, oct(st.mode), st.uid)

        # bob: not through the directory, not by name, not by removing it
        _refused(lambda: bob.ls("/ckpt/alicejob"), E.EACCES)
        _refused(lambda: bob.ls(rec.directory), E.EACCES)
        _refused(lambda: bob.read_bytes(f"{rec.directory}/{shards[0]}"), E.EACCES)
        _refused(lambda: bob.read_bytes(f"{rec.directory}/{index_name(0)}"), E.EACCES)
        _refused(lambda: bob.rmtree("/ckpt/alicejob"), E.EACCES, E.EPERM)
        _refused(lambda: bob.rename("/ckpt/alicejob", "/ckpt/mine"), E.EACCES, E.EPERM)
        assert alice.exists(f"{rec.directory}/{shards[0]}")

        # the owner and the admin read them
        assert alice.read_bytes(f"{rec.directory}/{index_name(0)}") == admin.read_bytes(
            f"{rec.directory}/{index_name(0)}")
    finally:
        admin.close()
        alice.close()
        bob.close()

    # bob cannot save into alice's job (refused before anything is written)
    thief = _manager(cluster, "bob", "alicejob")
    try:
        with pytest.raises(PermissionDenied, match="belongs to user 'alice'"):
            thief.save(2, _state(2), blocking=True).result()
    finally:
        thief.close()
    # ... but into a job of his own, in the same /ckpt
    mine = _manager(cluster, "bob", "bobjob")
    try:
        assert mine.save(1, _state(1), blocking=True).result().owner == "bob"
    finally:
        mine.close()

    # alice loads hers; bob's delete is refused and leaves the files; alice's delete removes them
    mgr = _manager(cluster, "alice", "alicejob")
    try:
        got = mgr.load()
        assert np.array_equal(got["w"], _state(1)["w"])  # type: ignore[index]
    finally:
        mgr.close()
    with CheckpointClient(cluster.address("checkpoint"), token=TOKENS["bob"]) as c, \
            pytest.raises(PermissionDenied):
        c.delete(rec.id, force=True)
    with connect(state_dir=cluster.state_dir, token=TOKENS["admin"]) as fs:
        assert fs.exists(rec.directory)
        with CheckpointClient(cluster.address("checkpoint"), token=TOKENS["alice"]) as c:
            c.delete(rec.id)
        assert not fs.exists(rec.directory)
