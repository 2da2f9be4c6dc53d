"""Issue 48 point 6 (meta half): the probe's raw calls against a real meta service, over gRPC
and over the wire endpoint, each refused with its errno and nothing written; and the CLI and
client tree walks survive what was stored before the limits existed (a time no calendar can
show, a tree deeper than Python's recursion limit).
"""

from __future__ import annotations

import asyncio
import errno as E
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from metasvc import Meta, Tokens, in_process_meta

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.api.meta.v1 import meta_pb2_grpc
from fireflyer.cli.main import main as ff_main
from fireflyer.core.errors import FsError, InvalidArgument
from fireflyer.meta import Inode, keys, limits
from fireflyer.rpc import connect
from fireflyer.wire.aio import AioConnection

Raw = Callable[[str, Any], Awaitable[Any]]


@pytest.fixture
async def svc(tmp_path: Path, tokens: Tokens) -> AsyncIterator[Meta]:
    async with in_process_meta(tmp_path / "state", tokens) as m:
        yield m


@pytest.fixture(params=["grpc", "wire"])
async def raw(request: pytest.FixtureRequest, svc: Meta) -> AsyncIterator[Raw]:
    """``raw(method, request)`` as alice, by the probe's route: a gRPC stub, or a bare wire
    connection sending the serialized request under the method's name."""
    if request.param == "grpc":
        async with connect(svc.address, token=svc.tokens.alice) as ch:
            stub = meta_pb2_grpc.MetaServiceStub(ch)

            async def grpc_call(method: str, msg: Any) -> Any:
                return await getattr(stub, method)(msg)

            yield grpc_call
        return
    host, port = svc.service.servicer.wire_address.rsplit(":", 1)
    conn = await AioConnection.connect(host, int(port), token=svc.tokens.alice)
    try:
        async def wire_call(method: str, msg: Any) -> Any:
            return await conn.request(method, msg.SerializeToString())

        yield wire_call
    finally:
        conn.close()


async def _refused(call: Awaitable[Any], errno: int, field: str) -> FsError:
    with pytest.raises(FsError) as info:
        await call
    assert isinstance(info.value, InvalidArgument) and info.value.code == "INVALID_ARGUMENT"
    assert info.value.errno == errno, info.value
    assert info.value.fields.get("field") == field, info.value.fields
    return info.value


async def _alice_file(svc: Meta) -> Inode:
    async with await svc.client(svc.tokens.alice) as alice:
        home = (await alice.whoami()).home
        await alice.create(f"{home}/f")
        await alice.truncate(f"{home}/f", 10)
        return await alice.stat(f"{home}/f")


async def test_truncate_and_report_length_past_the_layout_are_efbig(svc: Meta, raw: Raw) -> None:
    f = await _alice_file(svc)
    for length in (2**64 - 1, 2**62, (1 << 52) + 1):
        err = await _refused(raw("Truncate", pb.TruncateRequest(path="/home/alice/f", length=length)), E.EFBIG,
                             "length")
        assert err.fields["limit"] == 1 << 52 and "2**32 chunks" in err.message
        await _refused(raw("ReportLength", pb.ReportLengthRequest(inode_id=f.id, length=length)), E.EFBIG, "length")
    async with await svc.client(svc.tokens.alice) as alice:
        assert (await alice.stat("/home/alice/f")).length == 10


async def test_setattr_with_times_no_calendar_holds_is_einval(svc: Meta, raw: Raw) -> None:
    before = await _alice_file(svc)
    for t in (math.inf, -math.inf, math.nan, 1e300, limits.MAX_TIME * 2):
        for name in ("mtime", "atime"):
            await _refused(raw("Setattr", pb.SetattrRequest(path="/home/alice/f", **{name: t})), E.EINVAL, name)
    async with await svc.client(svc.tokens.alice) as alice:
        after = await alice.stat("/home/alice/f")
    assert (after.mtime, after.atime) == (before.mtime, before.atime)


async def test_create_and_open_with_unknown_flags_are_einval(svc: Meta, raw: Raw) -> None:
    await _alice_file(svc)
    for flags in (-1, 1 << 30, 3):
        await _refused(raw("Create", pb.CreateRequest(path="/home/alice/g", flags=flags)), E.EINVAL, "flags")
        await _refused(raw("Open", pb.OpenRequest(path="/home/alice/f", flags=flags)), E.EINVAL, "flags")
    async with await svc.client(svc.tokens.alice) as alice:
        assert sorted(e.name for e in await alice.listdir("/home/alice")) == ["f"]


async def test_mkdir_p_of_2000_levels_is_enametoolong(svc: Meta, raw: Raw) -> None:
    await _alice_file(svc)
    err = await _refused(raw("Mkdir", pb.MkdirRequest(path="/home/alice" + "/a" * 1998, parents=True)),
                         E.ENAMETOOLONG, "path")
    assert err.fields["limit"] == limits.MAX_DEPTH and err.fields["value"] == 2000
    await _refused(raw("Stat", pb.StatRequest(path="/" + "a/" * 2049)), E.ENAMETOOLONG, "path")
    async with await svc.client(svc.tokens.alice) as alice:
        assert sorted(e.name for e in await alice.listdir("/home/alice")) == ["f"]


def _poke_times(svc: Meta, path: str, **times: float) -> None:
    """Store times directly in the KV, as a meta without the checks did."""
    store = svc.service.servicer.store
    from fireflyer.meta import Caller

    inode = store.lstat(Caller(0, 0, admin=True), path)

    def fn(txn: Any) -> None:
        txn.set(keys.inode_key(inode.id), msgspec.msgpack.encode(msgspec.structs.replace(inode, **times)))

    store.kv.run(fn)


async def test_ls_l_and_stat_print_a_bad_stored_time_raw(svc: Meta, capsys: pytest.CaptureFixture[str]) -> None:
    await _alice_file(svc)
    _poke_times(svc, "/home/alice", mtime=math.inf, atime=math.nan, ctime=-1e300)
    _poke_times(svc, "/home/alice/f", mtime=-math.inf)
    bob = ["--address", svc.address, "--token", svc.tokens.bob]
    capsys.readouterr()
    # another user's listing of the directory holding alice's home, and stat of it
    assert await asyncio.to_thread(ff_main, ["fs", "ls", "-l", "/home", *bob]) == 0
    assert await asyncio.to_thread(ff_main, ["fs", "stat", "/home/alice", *bob]) == 0
    out = capsys.readouterr().out
    assert " inf alice" in out and "mtime: inf" in out and "atime: nan" in out and "ctime: -1e+300" in out
    alice = ["--address", svc.address, "--token", svc.tokens.alice]
    assert await asyncio.to_thread(ff_main, ["fs", "ls", "-l", "/home/alice", *alice]) == 0
    assert await asyncio.to_thread(ff_main, ["fs", "stat", "--json", "/home/alice/f", *alice]) == 0
    out = capsys.readouterr().out
    assert " -inf f" in out and '"mtime":null' in out


class _NoStorage:
    """Stands in for mgmtd routing and the storage client: tree walks touch only meta."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get(self) -> None:
        raise AssertionError("a tree walk asked for storage routing")

    def close(self) -> None:
        pass


@pytest.fixture
def meta_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """FileSystem (and the ``ff fs`` data verbs, du among them) without mgmtd or storage."""
    import fireflyer.fs.client as client

    monkeypatch.setattr(client, "MgmtdRouting", _NoStorage)
    monkeypatch.setattr(client, "StorageClient", _NoStorage)
    monkeypatch.setenv("FF_MGMTD_ADDR", "127.0.0.1:1")


#: a tree this deep, with the recursion limit at RECURSION_LIMIT while the walks run, breaks
#: any walk that recurses once per level (as a 2,000-level tree did at the default 1000), yet
#: keeps the test quick: each call resolves its whole path, so a full walk costs depth**2 reads
DEPTH = 500
RECURSION_LIMIT = 400


@pytest.fixture
def low_recursion_limit() -> Iterator[None]:
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(RECURSION_LIMIT)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


async def _deep_tree(svc: Meta, monkeypatch: pytest.MonkeyPatch) -> str:
    """/home/alice/deep/d/d/... DEPTH levels with a file at each of the last levels, made in the
    store directly with the depth limit lifted, as a meta before the limit could have."""
    from fireflyer.meta import Caller

    store = svc.service.servicer.store
    alice = Caller(1000, 1000, user="alice")
    await _alice_file(svc)
    top = "/home/alice/deep"
    with monkeypatch.context() as m:
        m.setattr(limits, "MAX_DEPTH", 10_000)
        leaf = store.mkdir(alice, top + "/d" * DEPTH, parents=True)
        assert leaf.type.value == "dir"
        path = top + "/d" * DEPTH
        for _ in range(3):
            store.create(alice, path + "/f")
            store.truncate(alice, path + "/f", 7)
            path = path.rsplit("/", 1)[0]
    return top


@pytest.mark.usefixtures("meta_only")
async def test_rm_r_and_du_s_of_a_tree_deeper_than_the_recursion_limit(svc: Meta, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       request: pytest.FixtureRequest) -> None:
    from fireflyer.fs.client import FileSystem
    from fireflyer.fs.fsspec_impl import FireFlyerFileSystem

    top = await _deep_tree(svc, monkeypatch)
    fs = await asyncio.to_thread(FileSystem, [svc.address], ["127.0.0.1:1"], svc.tokens.alice)
    request.getfixturevalue("low_recursion_limit")
    try:
        assert await asyncio.to_thread(fs.du, top) == 21
        spec = FireFlyerFileSystem(fs, skip_instance_cache=True)
        found = await asyncio.to_thread(spec.find, top)  # fsspec's find walks through our walk
        assert len(found) == 3 and all(p.endswith("/f") for p in found)
        assert max(p.split("/").count("d") for p in found) == DEPTH
    finally:
        await asyncio.to_thread(fs.close)
    where = ["--address", svc.address, "--token", svc.tokens.alice]
    capsys.readouterr()
    assert await asyncio.to_thread(ff_main, ["fs", "du", "-s", top, *where]) == 0
    assert capsys.readouterr().out.split() == ["21", top]
    assert await asyncio.to_thread(ff_main, ["fs", "rm", "-r", top, *where]) == 0
    async with await svc.client(svc.tokens.alice) as alice:
        assert sorted(e.name for e in await alice.listdir("/home/alice")) == ["f"]
        assert (await alice.statfs()).dirs < 10


@pytest.mark.usefixtures("meta_only")
async def test_filesystem_rmtree_of_a_tree_deeper_than_the_recursion_limit(svc: Meta,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    before = sys.getrecursionlimit()
    from fireflyer.fs.client import FileSystem

    top = await _deep_tree(svc, monkeypatch)
    fs = await asyncio.to_thread(FileSystem, [svc.address], ["127.0.0.1:1"], svc.tokens.alice)
    sys.setrecursionlimit(RECURSION_LIMIT)
    try:
        await asyncio.to_thread(fs.rmtree, top)
        assert not await asyncio.to_thread(fs.exists, top)
    finally:
        sys.setrecursionlimit(before)
        await asyncio.to_thread(fs.close)


async def test_fsspec_walk_gives_fsspecs_own_results_in_its_order(svc: Meta, meta_only: None) -> None:
    """The iterative walk against fsspec's recursive one on a small tree, every argument."""
    from fsspec.spec import AbstractFileSystem

    from fireflyer.fs.client import FileSystem
    from fireflyer.fs.fsspec_impl import FireFlyerFileSystem

    fs = await asyncio.to_thread(FileSystem, [svc.address], ["127.0.0.1:1"], svc.tokens.alice)
    try:
        def check() -> None:
            assert fs.whoami().home == "/home/alice"  # makes the home
            for d in ("/home/alice/t/a/x/y", "/home/alice/t/b", "/home/alice/t/a/z"):
                fs.mkdir(d, parents=True, exist_ok=True)
            for f in ("/home/alice/t/f1", "/home/alice/t/a/f2", "/home/alice/t/a/x/y/f3"):
                fs._call(fs.meta.create(f))
            spec = FireFlyerFileSystem(fs, skip_instance_cache=True)
            for kw in ({}, {"topdown": False}, {"maxdepth": 1}, {"maxdepth": 2, "topdown": False},
                       {"detail": True}, {"detail": True, "topdown": False, "maxdepth": 3}):
                ours = list(spec.walk("/home/alice/t", **kw))
                theirs = list(AbstractFileSystem.walk(spec, "/home/alice/t", **kw))
                assert ours == theirs, kw
            assert list(spec.walk("/home/alice/missing")) == []
            with pytest.raises(FileNotFoundError):
                list(spec.walk("/home/alice/missing", on_error="raise"))
            pruned = []
            for top, dirs, _files in spec.walk("/home/alice/t"):
                pruned.append(top)
                if "a" in dirs:
                    dirs.remove("a")
            assert pruned == ["/home/alice/t", "/home/alice/t/b"]

        await asyncio.to_thread(check)
    finally:
        await asyncio.to_thread(fs.close)
