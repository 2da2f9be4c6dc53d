"""Every meta operation through the gRPC service: results, and failures as typed errors.

A failure must reach the client as ``FsError`` with the POSIX errno and the path,
and on the wire as the status its errno maps to (checked with a bare grpc channel
that has none of Fire-Flyer's client machinery).
"""

from __future__ import annotations

import errno as E
import os

import grpc
import pytest
from metasvc import Meta

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.core.errors import FsError
from fireflyer.meta import FileType, LayoutPolicy


async def expect_fs_error(coro, errno: int, path: str, code: str) -> FsError:  # type: ignore[no-untyped-def]
    with pytest.raises(FsError) as info:
        await coro
    err = info.value
    assert err.errno == errno, f"expected {E.errorcode[errno]}, got {err!r}"
    assert err.fields["path"] == path
    assert err.code == code
    return err


async def raw_code(meta: Meta, method: str, request: object) -> tuple[grpc.StatusCode, bytes | None]:
    """The bare status and Fire-Flyer error trailer of one call, without our interceptors."""
    async with grpc.aio.insecure_channel(meta.address) as ch:
        call = ch.unary_unary(f"/ff.meta.v1.MetaService/{method}", request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=lambda b: b)
        try:
            await call(request, metadata=(("authorization", f"Bearer {meta.tokens.admin}"),), timeout=10)
        except grpc.aio.AioRpcError as e:
            trailer = dict(e.trailing_metadata() or ()).get("ff-error-bin")
            return e.code(), trailer
    return grpc.StatusCode.OK, None


async def test_directories_files_and_listing(meta: Meta) -> None:
    async with await meta.client(meta.tokens.admin) as m:
        d = await m.mkdir("/a", 0o750)
        assert d.type is FileType.DIR and d.mode == 0o750 and d.uid == 0 and d.name == "a"
        assert (await m.mkdir("/a/b/c", parents=True)).name == "c"
        assert (await m.mkdir("/a/b", parents=True)).id == (await m.stat("/a/b")).id  # -p: existing is fine
        await expect_fs_error(m.mkdir("/a"), E.EEXIST, "/a", "ALREADY_EXISTS")
        await expect_fs_error(m.mkdir("/zz/y"), E.ENOENT, "/zz/y", "NOT_FOUND")

        res = await m.create("/a/f", 0o640)
        assert res.created and res.inode.type is FileType.FILE and res.inode.mode == 0o640
        assert res.inode.layout is not None and res.inode.layout.stripe_size == 4
        again = await m.create("/a/f")
        assert not again.created and again.inode.id == res.inode.id
        await expect_fs_error(m.create("/a/f", flags=os.O_CREAT | os.O_EXCL), E.EEXIST, "/a/f", "ALREADY_EXISTS")
        await expect_fs_error(m.create("/a/f/x"), E.ENOTDIR, "/a/f/x", "FAILED_PRECONDITION")
        await expect_fs_error(m.create("/a"), E.EISDIR, "/a", "FAILED_PRECONDITION")
        await expect_fs_error(m.mkdir("/a/f/sub"), E.ENOTDIR, "/a/f/sub", "FAILED_PRECONDITION")

        opened = await m.open("/a/f", os.O_RDWR)
        assert opened.inode.id == res.inode.id and not opened.created
        await expect_fs_error(m.open("/a/nope"), E.ENOENT, "/a/nope", "NOT_FOUND")

        for i in range(5):
            await m.create(f"/a/g{i}")
        page = await m.readdir("/a", limit=2)
        assert [e.name for e in page.entries] == ["b", "f"] and page.more
        page2 = await m.readdir("/a", after=page.next_after, limit=2)
        assert [e.name for e in page2.entries] == ["g0", "g1"]
        names = [e.name for e in await m.listdir("/a")]
        assert names == ["b", "f", "g0", "g1", "g2", "g3", "g4"]
        assert {e.type for e in await m.listdir("/a")} == {FileType.DIR, FileType.FILE}
        await expect_fs_error(m.readdir("/a/f"), E.ENOTDIR, "/a/f", "FAILED_PRECONDITION")
        await expect_fs_error(m.readdir("/nope"), E.ENOENT, "/nope", "NOT_FOUND")

        by_id = await m.stat_inode(res.inode.id)
        assert by_id.id == res.inode.id
        with pytest.raises(FsError) as info:
            await m.stat_inode(987654321)
        assert info.value.errno == E.ENOENT


async def test_rename_unlink_rmdir(meta: Meta) -> None:
    async with await meta.client(meta.tokens.admin) as m:
        await m.mkdir("/r/d1/inner", parents=True)
        await m.mkdir("/r/full/x", parents=True)
        f = await m.create("/r/f")
        await m.rename("/r/f", "/r/d1/f2")
        assert (await m.stat("/r/d1/f2")).id == f.inode.id
        await expect_fs_error(m.stat("/r/f"), E.ENOENT, "/r/f", "NOT_FOUND")
        await expect_fs_error(m.rename("/r/missing", "/r/y"), E.ENOENT, "/r/missing", "NOT_FOUND")
        with pytest.raises(FsError) as info:  # a directory into itself
            await m.rename("/r/d1", "/r/d1/inner/d1")
        assert info.value.errno == E.EINVAL and info.value.code == "INVALID_ARGUMENT"
        with pytest.raises(FsError) as info:  # over a non-empty directory
            await m.rename("/r/d1", "/r/full")
        assert info.value.errno in (E.ENOTEMPTY, E.EEXIST)

        await expect_fs_error(m.unlink("/r/d1"), E.EISDIR, "/r/d1", "FAILED_PRECONDITION")
        await m.unlink("/r/d1/f2")
        await expect_fs_error(m.unlink("/r/d1/f2"), E.ENOENT, "/r/d1/f2", "NOT_FOUND")
        await expect_fs_error(m.rmdir("/r/full"), E.ENOTEMPTY, "/r/full", "FAILED_PRECONDITION")
        await m.create("/r/file")
        await expect_fs_error(m.rmdir("/r/file"), E.ENOTDIR, "/r/file", "FAILED_PRECONDITION")
        await m.rmdir("/r/full/x")
        await m.rmdir("/r/full")
        assert [e.name for e in await m.listdir("/r")] == ["d1", "file"]


async def test_links_truncate_setattr_statfs_policy(meta: Meta) -> None:
    async with await meta.client(meta.tokens.admin) as m:
        await m.mkdir("/l")
        f = await m.create("/l/f")
        s = await m.symlink("/l/f", "/l/s")
        assert s.type is FileType.SYMLINK and s.target == "/l/f"
        assert await m.readlink("/l/s") == "/l/f"
        assert (await m.stat("/l/s")).id == f.inode.id  # followed
        assert (await m.lstat("/l/s")).id == s.id  # not followed
        await expect_fs_error(m.readlink("/l/f"), E.EINVAL, "/l/f", "INVALID_ARGUMENT")
        await expect_fs_error(m.symlink("/x", "/l/s"), E.EEXIST, "/l/s", "ALREADY_EXISTS")

        h = await m.link("/l/f", "/l/h")
        assert h.id == f.inode.id and h.nlink == 2
        await expect_fs_error(m.link("/l", "/l2"), E.EPERM, "/l", "PERMISSION_DENIED")
        await expect_fs_error(m.link("/l/nope", "/l/h2"), E.ENOENT, "/l/nope", "NOT_FOUND")

        assert (await m.report_length(f.inode.id, 5000)).length == 5000
        assert (await m.report_length(f.inode.id, 100)).length == 5000  # never shrinks
        assert (await m.truncate("/l/f", 10)).length == 10
        await expect_fs_error(m.truncate("/l", 0), E.EISDIR, "/l", "FAILED_PRECONDITION")

        changed = await m.setattr("/l/f", mode=0o600, mtime=1_000_000.0)
        assert changed.mode == 0o600 and changed.mtime == 1_000_000.0
        await expect_fs_error(m.setattr("/l/nope", mode=0o600), E.ENOENT, "/l/nope", "NOT_FOUND")

        d = await m.set_dir_policy("/l", LayoutPolicy(1, 1 << 16, 2))
        assert d.dir_policy == LayoutPolicy(1, 1 << 16, 2)
        lay = (await m.create("/l/striped")).inode.layout
        assert lay is not None and (lay.chunk_size, lay.stripe_size, len(lay.chains)) == (1 << 16, 2, 2)
        assert (await m.set_dir_policy("/l", None)).dir_policy is None
        with pytest.raises(FsError) as info:
            await m.set_dir_policy("/l", LayoutPolicy(1, 1000, 2))  # not a power of two
        assert info.value.code == "INVALID_ARGUMENT"

        st = await m.statfs()
        assert st.symlinks == 1 and st.dirs >= 2 and st.inodes == st.files + st.dirs + st.symlinks


@pytest.mark.parametrize(("method", "request_msg", "code", "errno"), [
    ("Stat", pb.StatRequest(path="/missing", follow=True), grpc.StatusCode.NOT_FOUND, E.ENOENT),
    ("Mkdir", pb.MkdirRequest(path="/", mode=0o755), grpc.StatusCode.ALREADY_EXISTS, E.EEXIST),
    ("Rmdir", pb.RmdirRequest(path="/missing"), grpc.StatusCode.NOT_FOUND, E.ENOENT),
    ("Create", pb.CreateRequest(path="relative/x"), grpc.StatusCode.INVALID_ARGUMENT, E.EINVAL),
])
async def test_wire_status_and_trailer(meta: Meta, method: str, request_msg: object, code: grpc.StatusCode,
                                       errno: int) -> None:
    import msgspec

    got, trailer = await raw_code(meta, method, request_msg)
    assert got == code
    assert trailer is not None
    details = msgspec.json.decode(trailer)
    assert details["fields"]["errno"] == errno and details["fields"]["path"]


async def test_retried_mutation_with_the_same_request_id_returns_the_first_outcome(meta: Meta) -> None:
    """What failover relies on: a create that committed, resent with its id, is not EEXIST."""
    from fireflyer.api.meta.v1 import meta_pb2_grpc
    from fireflyer.rpc import connect

    async with connect(meta.address, token=meta.tokens.admin) as ch:
        stub = meta_pb2_grpc.MetaServiceStub(ch)
        req = pb.CreateRequest(path="/once", mode=0o644, flags=os.O_CREAT | os.O_EXCL, request_id=b"r" * 16)
        first = await stub.Create(req)
        second = await stub.Create(req)
        assert first.created and second.created and first.inode.id == second.inode.id
        with pytest.raises(FsError) as info:  # a new id is a new request
            await stub.Create(pb.CreateRequest(path="/once", flags=os.O_CREAT | os.O_EXCL, request_id=b"s" * 16))
        assert info.value.errno == E.EEXIST
        unlink = pb.UnlinkRequest(path="/once", request_id=b"u" * 16)
        await stub.Unlink(unlink)
        await stub.Unlink(unlink)  # not ENOENT
