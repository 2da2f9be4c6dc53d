"""What the namespace can hold (fireflyer.meta.limits) and the store refusing the rest.

Issue 48 point 6: truncate / length reports to 2**64-1 and 2**62 were accepted (EFBIG now,
from the 32-bit chunk index), mtime +-inf/NaN was stored, ``flags=-1`` created a file and
``mkdir -p`` of 2,000 levels made a tree that broke recursive clients.
"""

from __future__ import annotations

import errno as E
import math
import os

import pytest
from meta_util import ADMIN, ALICE, dump

from fireflyer.core.errors import FsError, InvalidArgument
from fireflyer.kv import KV
from fireflyer.meta import MetaStore, limits
from fireflyer.storage.chunkid import MAX_INDEX

MiB = 1 << 20
F = "/home/alice/f"


def _errno(info: pytest.ExceptionInfo[FsError]) -> int:
    assert isinstance(info.value, InvalidArgument) and info.value.code == "INVALID_ARGUMENT"
    return info.value.errno


def test_chunk_index_limit_is_the_chunk_id_format() -> None:
    assert limits.MAX_CHUNK_INDEX == MAX_INDEX
    assert limits.max_file_size(MiB) == 1 << 52  # 4 PiB at 1 MiB chunks


@pytest.mark.parametrize("length", [2**64 - 1, 2**62, (1 << 52) + 1])
def test_truncate_past_what_the_layout_holds_is_efbig(fs: MetaStore, kv: KV, length: int) -> None:
    f = fs.create(ALICE, F).inode
    assert f.layout is not None and f.layout.chunk_size == MiB
    before = dump(kv)
    with pytest.raises(FsError) as info:
        fs.truncate(ALICE, F, length)
    assert _errno(info) == E.EFBIG
    assert info.value.fields["field"] == "length" and info.value.fields["limit"] == 1 << 52
    assert "2**32 chunks" in info.value.message and str(length) in info.value.message
    with pytest.raises(FsError) as info:
        fs.report_length(ALICE, f.id, length)
    assert _errno(info) == E.EFBIG
    assert dump(kv) == before


def test_truncate_to_exactly_the_largest_length_works(fs: MetaStore) -> None:
    f = fs.create(ALICE, F).inode
    assert fs.truncate(ALICE, F, 1 << 52).length == 1 << 52
    assert fs.report_length(ALICE, f.id, 1 << 52).length == 1 << 52


@pytest.mark.parametrize("length", [-1, -(2**64), 1.0, True, "5"])
def test_a_length_that_is_not_a_non_negative_int_is_einval(fs: MetaStore, length: object) -> None:
    f = fs.create(ALICE, F).inode
    for call in (lambda: fs.truncate(ALICE, F, length), lambda: fs.report_length(ALICE, f.id, length)):
        with pytest.raises(FsError) as info:
            call()  # type: ignore[no-untyped-call]
        assert _errno(info) == E.EINVAL and info.value.fields["field"] == "length"


@pytest.mark.parametrize("t", [math.inf, -math.inf, math.nan, 1e300, -1e300, 10**400, limits.MAX_TIME + 1,
                               limits.MIN_TIME - 1, "1", [1.0]])
def test_setattr_time_out_of_range_is_einval_and_writes_nothing(fs: MetaStore, kv: KV, t: object) -> None:
    fs.create(ALICE, F)
    before = dump(kv)
    for name in ("mtime", "atime"):
        with pytest.raises(FsError) as info:
            fs.setattr(ALICE, F, **{name: t})  # type: ignore[arg-type]
        assert _errno(info) == E.EINVAL and info.value.fields["field"] == name
        assert name in info.value.message
    assert dump(kv) == before


def test_setattr_times_at_the_limits_are_kept(fs: MetaStore) -> None:
    fs.create(ALICE, F)
    got = fs.setattr(ALICE, F, atime=limits.MIN_TIME, mtime=limits.MAX_TIME)
    assert (got.atime, got.mtime) == (limits.MIN_TIME, limits.MAX_TIME)
    assert fs.setattr(ALICE, F, mtime=-1.5).mtime == -1.5  # before 1970 is a time like any other


@pytest.mark.parametrize("flags", [-1, 1 << 30, 3, os.O_WRONLY | (1 << 25), -(2**40)])
def test_create_and_open_with_unknown_flags_are_einval(fs: MetaStore, kv: KV, flags: int) -> None:
    before = dump(kv)
    with pytest.raises(FsError) as info:
        fs.create(ALICE, F, flags=flags)
    assert _errno(info) == E.EINVAL and info.value.fields["field"] == "flags"
    with pytest.raises(FsError) as info:
        fs.open(ALICE, "/home/alice", flags)
    assert _errno(info) == E.EINVAL
    assert dump(kv) == before


def test_create_with_every_known_flag_works(fs: MetaStore) -> None:
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK
    assert fs.create(ALICE, F, flags=flags).created


def test_mkdir_p_of_2000_levels_is_enametoolong(fs: MetaStore, kv: KV) -> None:
    before = dump(kv)
    with pytest.raises(FsError) as info:
        fs.mkdir(ALICE, "/home/alice" + "/a" * 1998, parents=True)
    assert _errno(info) == E.ENAMETOOLONG
    assert info.value.fields["value"] == 2000 and info.value.fields["limit"] == limits.MAX_DEPTH
    assert dump(kv) == before


def test_depth_limit_applies_to_new_names_only(fs: MetaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    deepest = "/home/alice" + "/d" * (limits.MAX_DEPTH - 2)
    assert fs.mkdir(ALICE, deepest, parents=True).type.value == "dir"
    for make in (lambda p: fs.mkdir(ALICE, p), lambda p: fs.create(ALICE, p), lambda p: fs.symlink(ALICE, "/x", p),
                 lambda p: fs.link(ALICE, deepest.rsplit("/", 1)[0] + "/f", p),
                 lambda p: fs.rename(ALICE, deepest, p)):
        with pytest.raises(FsError) as info:
            make(deepest + "/x")
        assert _errno(info) == E.ENAMETOOLONG, make
    # a deeper tree made before the limit existed can still be looked up and removed
    monkeypatch.setattr(limits, "MAX_DEPTH", 10_000)
    fs.mkdir(ALICE, deepest + "/old/older", parents=True)
    monkeypatch.undo()
    assert fs.stat(ALICE, deepest + "/old/older").type.value == "dir"
    fs.rmdir(ALICE, deepest + "/old/older")


def test_path_and_name_limits_are_enametoolong(fs: MetaStore) -> None:
    with pytest.raises(FsError) as info:
        fs.stat(ALICE, "/" + "a/" * 2049)
    assert _errno(info) == E.ENAMETOOLONG and info.value.fields["limit"] == limits.MAX_PATH
    with pytest.raises(FsError) as info:
        fs.mkdir(ADMIN, "/" + "n" * 256)
    assert _errno(info) == E.ENAMETOOLONG and info.value.fields["limit"] == limits.MAX_NAME
    fs.mkdir(ADMIN, "/" + "n" * 255)


def test_statfs_used_bytes_past_uint64_is_reported_as_the_maximum() -> None:
    from fireflyer.fs.meta_codec import statfs_to_pb
    from fireflyer.meta import StatFs

    assert statfs_to_pb(StatFs(70, 70, 0, 0, 70 * (1 << 58), 0)).used_bytes == 2**64 - 1
    assert statfs_to_pb(StatFs(1, 1, 0, 0, 5, 0)).used_bytes == 5


def test_mkdir_p_names_the_ancestor_it_may_not_write(fs: MetaStore) -> None:
    with pytest.raises(FsError) as info:
        fs.mkdir(ALICE, "/srv/a/b", parents=True)
    assert info.value.errno == E.EACCES and "(write on /)" in info.value.message
    fs.mkdir(ADMIN, "/srv", 0o755)
    with pytest.raises(FsError) as info:
        fs.mkdir(ALICE, "/srv/a/b", parents=True)
    assert "(write on /srv)" in info.value.message
