"""Storage enforces file permissions (issue 48 point 1), end to end on an ``ff up`` cluster.

The probe: bob read and overwrote alice's 0600 file in her 0700 directory by chunk id with
only his user token, and found her files by scanning inode ids.  Now storage serves a chunk
only with meta's capability for it, StatInode by id checks permission, and a hard link to
someone else's file needs write access; alice's own I/O (read, write, truncate, batch, renewal
after expiry) works as before, with no capability in sight."""

from __future__ import annotations

import errno as E
import os
import stat
from collections.abc import Iterator

import pytest

from fireflyer.core.errors import FsError, PermissionDenied, Unauthenticated
from fireflyer.fs import FileSystem, connect
from fireflyer.storage import ChunkId, ReadReq
from fireflyer.storage.capability import READ, CapabilityDenied, decode
from fireflyer.storage.client_min import MgmtdRouting, StorageClient
from fireflyer.storage.protocol import OP_BATCH_READ, BatchReadMsg, ReadMsg, to_meta
from fireflyer.testing.cluster import LocalCluster, run_ff
from fireflyer.testing.poll import wait_until

CHUNK = 64 * 1024  # the cluster's root chunk size (conftest)


@pytest.fixture(scope="module")
def bob_token(fs_cluster: LocalCluster) -> str:
    env = {**fs_cluster.env, "FF_TOKEN": fs_cluster.admin_token}
    res = run_ff(["admin", "--state-dir", str(fs_cluster.state_dir), "users", "add", "bob-fsperm"], env=env,
                 timeout_s=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.splitlines()[1].strip()


@pytest.fixture(scope="module")
def bob_fs(fs_cluster: LocalCluster, bob_token: str) -> Iterator[FileSystem]:
    def accepted() -> bool:
        try:
            with connect(state_dir=fs_cluster.state_dir, token=bob_token) as fs:
                fs.whoami()
                # storage nodes re-read the tokens file on their own clocks: write and read one
                # chunk too, so the tests below do not race the reload
                fs.write_bytes(f"{fs.home}/.probe", b"probe")
                fs.read_bytes(f"{fs.home}/.probe")
        except Unauthenticated:  # the services reload the tokens file shortly
            return False
        return True

    wait_until(accepted, timeout_s=30.0, interval_s=0.3, what="services to accept bob's new token")
    fs = connect(state_dir=fs_cluster.state_dir, token=bob_token)
    yield fs
    fs.close()


@pytest.fixture
def alice_secret(ffs: FileSystem) -> tuple[str, int, bytes]:
    """alice's (the user token's user) 0600 file in a 0700 directory of her home."""
    home = ffs.home
    d = f"{home}/priv-{os.urandom(4).hex()}"
    ffs.mkdir(d, 0o700)
    data = os.urandom(2 * CHUNK + 99)
    path = f"{d}/secret"
    ffs.write_bytes(path, data, mode=0o600)
    return path, ffs.stat(path).id, data


def _bare_storage(fs_cluster: LocalCluster, token: str) -> tuple[MgmtdRouting, StorageClient]:
    routing = MgmtdRouting(fs_cluster.addresses("mgmtd"), token=token)
    return routing, StorageClient(routing.get, token=token, retry_deadline_s=2.0)


def test_bob_reads_and_writes_nothing_of_alice_by_chunk_id(fs_cluster: LocalCluster, ffs: FileSystem,
                                                            bob_fs: FileSystem, bob_token: str,
                                                            alice_secret: tuple[str, int, bytes]) -> None:
    path, inode_id, data = alice_secret
    layout = ffs.stat(path).layout
    assert layout is not None
    chain = layout.chain_of(0)
    routing, bare = _bare_storage(fs_cluster, bob_token)
    try:
        def refusal() -> CapabilityDenied | None:
            try:  # the probe's exact call
                got = bare.read(chain, ChunkId(inode_id, 0, 0))
            except CapabilityDenied as e:
                return e
            except Unauthenticated:  # this storage node has not re-read the tokens file yet
                return None
            raise AssertionError(f"bob read {len(got)} bytes of alice's chunk")

        # the fixture saw meta accept bob; each storage node re-reads the tokens file on its own clock
        denied = wait_until(refusal, timeout_s=30.0, interval_s=0.3, what="storage to know bob's token")
        assert denied.errno == E.EACCES and denied.fields["reason"] == "missing"
        with pytest.raises(PermissionError):
            bare.write(chain, ChunkId(inode_id, 0, 0), 0, b"bob was here", CHUNK)
    finally:
        bare.close()
        routing.close()
    # bob's capability for his own file, presented for alice's inode (raw wire request)
    mine = f"{bob_fs.home}/mine"
    bob_fs.write_bytes(mine, b"bob's")
    bob_fs.open(mine, "rb").close()
    bob_inode = bob_fs.stat(mine).id
    own_cap = bob_fs.capabilities.peek(bob_inode)
    assert decode(own_cap).user == "bob-fsperm"
    s = bob_fs.storage
    target = s.chain(chain).serving()[0]
    _, addr = s.address(target)
    msg = BatchReadMsg(ios=[ReadMsg(target=target, req=ReadReq(chain_id=chain, chain_ver=s.chain(chain).version,
                                                               chunk_id=ChunkId(inode_id, 0, 0)))],
                       caps=[own_cap], send=True)
    with pytest.raises(CapabilityDenied) as e:
        s._call(addr, OP_BATCH_READ, meta=to_meta(msg))
    assert e.value.fields["reason"] == "wrong_inode"
    # and through the file system: meta refuses the open, StatInode by id, and a renewal
    with pytest.raises(FsError) as fe:
        bob_fs.read_bytes(path)
    assert fe.value.errno == E.EACCES
    with pytest.raises(FsError) as fe:
        bob_fs._stat_inode(inode_id)
    assert fe.value.errno == E.EACCES
    with pytest.raises(PermissionDenied):
        bob_fs._call(bob_fs.meta.grant_capability(inode_id, READ, own_cap))
    assert ffs.read_bytes(path) == data  # untouched


def test_hard_link_to_alices_file_is_eperm(ffs: FileSystem, bob_fs: FileSystem, workdir: str) -> None:
    ffs.chmod(workdir, 0o777)
    ffs.write_bytes(f"{workdir}/readable", b"r", mode=0o644)
    with pytest.raises(FsError) as e:
        bob_fs._call(bob_fs.meta.link(f"{workdir}/readable", f"{workdir}/bob-link"))
    assert e.value.errno == E.EPERM


def test_alice_reads_writes_truncates_and_renews_transparently(ffs: FileSystem,
                                                               alice_secret: tuple[str, int, bytes]) -> None:
    path, inode_id, data = alice_secret
    assert ffs.read_bytes(path) == data
    with ffs.open(path, "r+b", buffering=0) as f:
        f.pwrite(b"#" * 10, CHUNK - 5)
        before = ffs.capabilities.peek(inode_id)
        ffs.capabilities.stale(inode_id)  # as after ten minutes: the next chunk op renews it first
        assert f.pread(10, CHUNK - 5) == b"#" * 10
        assert ffs.capabilities.peek(inode_id) != before
    [r] = ffs.batch_read([(path, 0, 16)])
    assert r.error is None and bytes(r.data) == data[:16]
    ffs.truncate(path, CHUNK + 1)
    assert ffs.read_bytes(path) == data[:CHUNK - 5] + b"#" * 6


def test_ff_up_keeps_a_private_capability_key(fs_cluster: LocalCluster) -> None:
    key = fs_cluster.state_dir / "capability.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(bytes.fromhex(key.read_text().split()[0])) == 32
