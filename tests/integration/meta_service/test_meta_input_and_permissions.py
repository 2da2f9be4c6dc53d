"""Bad input is INVALID_ARGUMENT with nothing written; permissions follow the token's user.

Status mapping for permissions (documented in meta.proto and services/meta/users.py):
EACCES and EPERM -> PERMISSION_DENIED, carrying the errno and path; UNAUTHENTICATED is
only for a missing or unknown token.
"""

from __future__ import annotations

import errno as E
import os

import grpc
import pytest
from metasvc import Meta

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.api.meta.v1 import meta_pb2_grpc
from fireflyer.core.errors import FsError, InvalidArgument, Unauthenticated
from fireflyer.meta import LayoutPolicy
from fireflyer.rpc import connect
from services.meta.users import UID_BASE, uid_for_name


async def _snapshot(meta: Meta) -> tuple[object, list[str]]:
    async with await meta.client(meta.tokens.admin) as m:
        return await m.statfs(), sorted(e.name for e in await m.listdir("/"))


BAD = [
    ("Mkdir", pb.MkdirRequest(path="", mode=0o755)),
    ("Mkdir", pb.MkdirRequest(path="rel/dir", mode=0o755)),
    ("Mkdir", pb.MkdirRequest(path="/bad\0name", mode=0o755)),
    ("Mkdir", pb.MkdirRequest(path="/m", mode=0o17777)),
    ("Mkdir", pb.MkdirRequest(path="/" + "x" * 256)),
    ("Mkdir", pb.MkdirRequest(path="/p", policy=pb.LayoutPolicy(chain_table_id=1, chunk_size=1000, stripe_size=1))),
    ("Create", pb.CreateRequest(path="/" + "a/" * 2100 + "f")),
    ("Create", pb.CreateRequest(path="/c", mode=0o644,
                                policy=pb.LayoutPolicy(chain_table_id=1, chunk_size=1 << 20, stripe_size=0))),
    ("Create", pb.CreateRequest(path="/c", request_id=b"x" * 65)),
    ("Rename", pb.RenameRequest(src="/", dst="relative")),
    ("Rename", pb.RenameRequest(src="", dst="/x")),
    ("Symlink", pb.SymlinkRequest(target="", link_path="/s")),
    ("Symlink", pb.SymlinkRequest(target="/t", link_path="s")),
    ("Link", pb.LinkRequest(existing="/", new_path="")),
    ("Readdir", pb.ReaddirRequest(path="/", limit=1_000_000)),
    ("Setattr", pb.SetattrRequest(path="/", mode=0o100000)),
    ("Unlink", pb.UnlinkRequest(path="no-slash")),
]


@pytest.mark.parametrize(("method", "request_msg"), BAD, ids=[f"{m}-{i}" for i, (m, _) in enumerate(BAD)])
async def test_bad_input_is_invalid_argument_and_writes_nothing(meta: Meta, method: str, request_msg: object
                                                                ) -> None:
    before = await _snapshot(meta)
    async with connect(meta.address, token=meta.tokens.admin) as ch:
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        with pytest.raises(InvalidArgument) as info:
            await getattr(stub, method)(request_msg)
    assert info.value.code == "INVALID_ARGUMENT"
    assert info.value.fields.get("errno") in (E.EINVAL, E.ENAMETOOLONG)
    assert await _snapshot(meta) == before


async def test_user_cannot_modify_admin_owned_dir_admin_can(meta: Meta) -> None:
    async with await meta.client(meta.tokens.admin) as admin, await meta.client(meta.tokens.alice) as alice:
        await admin.mkdir("/sys", 0o755)
        await admin.create("/sys/conf")
        for op in (alice.mkdir("/sys/x"), alice.create("/sys/y"), alice.unlink("/sys/conf"),
                   alice.rename("/sys/conf", "/sys/conf2"), alice.symlink("/t", "/sys/l")):
            with pytest.raises(FsError) as info:
                await op
            assert info.value.errno == E.EACCES and info.value.code == "PERMISSION_DENIED"
            assert info.value.fields["path"].startswith("/sys")
        with pytest.raises(FsError) as info:  # chmod of someone else's inode: EPERM
            await alice.setattr("/sys", mode=0o777)
        assert info.value.errno == E.EPERM and info.value.code == "PERMISSION_DENIED"
        # reading is allowed by 0755
        assert [e.name for e in await alice.listdir("/sys")] == ["conf"]
        assert (await alice.stat("/sys/conf")).uid == 0
        # admin (root) can, and nothing alice tried was written
        await admin.mkdir("/sys/x")
        await admin.rename("/sys/conf", "/sys/conf2")
        assert [e.name for e in await admin.listdir("/sys")] == ["conf2", "x"]


async def test_token_users_map_to_uids(meta: Meta) -> None:
    async with await meta.client(meta.tokens.admin) as admin, await meta.client(meta.tokens.alice) as alice, \
            await meta.client(meta.tokens.bob) as bob:
        await admin.mkdir("/home", 0o777)
        a = await alice.mkdir("/home/alice", 0o700)
        assert (a.uid, a.gid) == (1000, 1000)  # [meta.users]
        b = (await bob.create("/home/bob.txt")).inode
        assert b.uid == b.gid == uid_for_name("bob") >= UID_BASE  # derived from the name
        with pytest.raises(FsError) as info:  # 0700 keeps bob out of alice's directory
            await bob.listdir("/home/alice")
        assert info.value.errno == E.EACCES
        await alice.create("/home/alice/mine")
        with pytest.raises(FsError):
            await bob.unlink("/home/alice/mine")
        # the sticky bit is not set: bob may remove alice's file only where he can write the dir
        await alice.create("/home/shared.txt")
        await bob.unlink("/home/shared.txt")
        with pytest.raises(FsError) as info:  # chown is root's
            await alice.setattr("/home/alice", uid=2000)
        assert info.value.errno == E.EPERM
        # a policy on a directory alice owns
        await alice.set_dir_policy("/home/alice", LayoutPolicy(1, 1 << 20, 1))


async def test_missing_or_unknown_token_is_unauthenticated(meta: Meta) -> None:
    for token in ("", "not-a-token"):
        async with connect(meta.address, token=token) as ch:
            with pytest.raises(Unauthenticated):
                await meta_pb2_grpc.MetaServiceStub(ch).Stat(pb.StatRequest(path="/", follow=True))
    async with grpc.aio.insecure_channel(meta.address) as ch:  # and on the wire
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Create(pb.CreateRequest(path="/x", flags=os.O_CREAT))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
