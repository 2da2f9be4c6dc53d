"""Meta's side of storage permissions (issue 48 point 1): Open/Create return a chunk capability
for what the caller may do, GrantCapability renews one only for its holder, StatInode by id
needs the permission reaching the inode would, and hard links follow protected_hardlinks.
Raw gRPC stubs (the services' own door) and the client on both transports."""

from __future__ import annotations

import errno as E
import os
from pathlib import Path

import pytest
from metasvc import Meta, Tokens, in_process_meta

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.api.meta.v1 import meta_pb2_grpc
from fireflyer.core.errors import FsError, PermissionDenied, SettingsError
from fireflyer.rpc import connect
from fireflyer.storage.capability import READ, WRITE, CapabilityDenied, Keyring, decode, encode, sign


async def _alice_private(meta: Meta) -> tuple[int, bytes]:
    """alice's 0600 file in her 0700 directory: (inode id, the capability her open returned)."""
    async with await meta.client(meta.tokens.alice) as a:
        await a.whoami()  # makes /home/alice (0700)
        await a.mkdir("/home/alice/priv", 0o700)
        res = await a.create("/home/alice/priv/f", 0o600)
        return res.inode.id, res.capability


async def test_open_grants_what_the_caller_may_do(meta: Meta) -> None:
    inode, raw = await _alice_private(meta)
    cap = decode(raw)
    assert (cap.inode, cap.user, cap.mode) == (inode, "alice", READ | WRITE)
    async with await meta.client(meta.tokens.alice) as a:
        await a.setattr("/home/alice/priv/f", mode=0o400)
        ro = decode((await a.open("/home/alice/priv/f", os.O_RDONLY)).capability)
        assert ro.mode == READ  # the bits allow reading only
        assert (await a.open("/home/alice/priv", os.O_RDONLY)).capability == b""  # directories: none
    async with await meta.client(meta.tokens.admin) as root:
        assert decode((await root.open("/home/alice/priv/f", os.O_RDONLY)).capability).mode == READ | WRITE
    async with await meta.client(meta.tokens.bob) as b:
        with pytest.raises(FsError) as e:
            await b.open("/home/alice/priv/f", os.O_RDONLY)
        assert e.value.errno == E.EACCES


async def test_renewal_needs_the_holders_capability_and_current_permission(meta: Meta) -> None:
    inode, raw = await _alice_private(meta)
    async with await meta.client(meta.tokens.alice) as a:
        fresh = decode(await a.grant_capability(inode, READ | WRITE, raw))
        assert (fresh.inode, fresh.user, fresh.mode) == (inode, "alice", READ | WRITE)
        with pytest.raises(CapabilityDenied):  # no capability: a guessed id renews nothing
            await a.grant_capability(inode, READ, b"")
        await a.setattr("/home/alice/priv/f", mode=0o400)  # chmod revokes write at renewal
        assert decode(await a.grant_capability(inode, READ | WRITE, raw)).mode == READ
        await a.setattr("/home/alice/priv/f", mode=0)
        with pytest.raises(FsError) as e:
            await a.grant_capability(inode, READ, raw)
        assert e.value.errno == E.EACCES
    async with connect(meta.address, token=meta.tokens.bob) as ch:
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        for cap in (raw, encode(sign(Keyring(b"f" * 32), inode=inode, mode=READ, expires=2e9, user="bob"))):
            with pytest.raises(PermissionDenied):  # alice's capability; one forged with another key
                await stub.GrantCapability(pb.GrantCapabilityRequest(inode_id=inode, mode=READ, capability=cap))


async def test_stat_inode_by_id_needs_the_path_permission(meta: Meta) -> None:
    """The probe found alice's files by scanning inode ids; StatInode no longer answers bob."""
    inode, raw = await _alice_private(meta)
    async with connect(meta.address, token=meta.tokens.bob) as ch:
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        for cap in (b"", raw):  # her capability is hers, not bob's
            with pytest.raises(FsError) as e:
                await stub.StatInode(pb.StatInodeRequest(inode_id=inode, capability=cap))
            assert e.value.errno == E.EACCES
        with pytest.raises(FsError) as e:
            await stub.StatInode(pb.StatInodeRequest(inode_id=inode + 1_000_000))
        assert e.value.errno == E.ENOENT
    async with connect(meta.address, token=meta.tokens.alice) as ch:
        got = await meta_pb2_grpc.MetaServiceStub(ch).StatInode(pb.StatInodeRequest(inode_id=inode))
        assert got.inode.id == inode
    async with await meta.client(meta.tokens.admin) as root:
        assert (await root.stat_inode(inode)).id == inode
    # a file bob opened by path (shared through a searchable directory) he may stat by id
    async with await meta.client(meta.tokens.alice) as a:
        await a.setattr("/home/alice", mode=0o755)
        await a.create("/home/alice/shared", 0o644)
    async with await meta.client(meta.tokens.bob) as b:
        res = await b.open("/home/alice/shared", os.O_RDONLY)
        assert decode(res.capability).mode == READ
        assert (await b.stat_inode(res.inode.id, res.capability)).id == res.inode.id
        with pytest.raises(FsError):
            await b.stat_inode(res.inode.id)  # without it: refused (files keep no path back)


async def test_hard_links_to_files_the_caller_cannot_write_are_eperm(meta: Meta) -> None:
    async with await meta.client(meta.tokens.admin) as root:
        await root.mkdir("/shared", 0o777)
        await root.setattr("/shared", mode=0o777)
    async with await meta.client(meta.tokens.alice) as a:
        await a.create("/shared/alice-ro", 0o644)
        await a.create("/shared/alice-rw", 0o666)
    async with connect(meta.address, token=meta.tokens.bob) as ch:
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        with pytest.raises(FsError) as e:
            await stub.Link(pb.LinkRequest(existing="/shared/alice-ro", new_path="/shared/bob-link"))
        assert e.value.errno == E.EPERM
        got = await stub.Link(pb.LinkRequest(existing="/shared/alice-rw", new_path="/shared/bob-rw"))
        assert got.inode.nlink == 2
    async with await meta.client(meta.tokens.admin) as root:  # root-acting callers are exempt
        assert (await root.link("/shared/alice-ro", "/shared/root-link")).nlink == 2


async def test_a_missing_key_stops_meta_naming_the_setting(tmp_path: Path, tokens: Tokens) -> None:
    with pytest.raises(SettingsError) as e:
        async with in_process_meta(tmp_path / "state", tokens, FF_CAPABILITY_KEY_FILE=str(tmp_path / "nope")):
            pass
    assert e.value.fields["key"] == "capability_key_file"
