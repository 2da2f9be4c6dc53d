"""Property-based fuzz of meta's request validation at its entry point (issue 48 point 6).

Random protobuf requests (and random bytes as payloads) go through the wire endpoint's
handler into the servicer and the store (SQLite, no network), as a user.  Each call either
succeeds or raises a typed ``FireFlyerError``; where the oracle says a field is past its limit,
the error is ``FsInvalidArgument`` with that limit's errno and the field's name.
"""

from __future__ import annotations

import asyncio
import errno as E
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from meta_util import TABLES

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.core.errors import FireFlyerError
from fireflyer.kv import open_kv
from fireflyer.meta import FsInvalidArgument, MetaStore, limits
from fireflyer.rpc import Principal
from fireflyer.testing.kv import FAST_RETRY
from services.meta.servicer import MetaServicer
from services.meta.wire import MetaWireEndpoint

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ALICE = Principal("alice", frozenset({"user"}))
FILE = "/home/alice/f"


class _Rig:
    def __init__(self, tmp: Path) -> None:
        self.kv = open_kv(f"sqlite:///{tmp}/meta.db", **FAST_RETRY)
        MetaStore.init(self.kv)
        self.store = MetaStore(self.kv, tables=TABLES, alloc_block=64)
        self.pool = ThreadPoolExecutor(2)
        self.servicer = MetaServicer(self.store, users={}, pool=self.pool)
        self.wire = MetaWireEndpoint(self.servicer, authenticate=lambda token: ALICE, host="127.0.0.1")
        self.loop = asyncio.new_event_loop()
        self.call("WhoAmI", pb.WhoAmIRequest())  # makes /home/alice
        self.inode_id = pb.OpenReply.FromString(self.call("Create", pb.CreateRequest(path=FILE))).inode.id

    def call(self, op: str, msg: Any) -> bytes:
        return self.raw(op, msg.SerializeToString())

    def raw(self, op: str, payload: bytes) -> bytes:
        req = SimpleNamespace(op=op, payload=payload, principal=ALICE)
        return self.loop.run_until_complete(self.wire.handle(req))  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.close()
        self.pool.shutdown()
        self.kv.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[_Rig]:
    r = _Rig(tmp_path)
    yield r
    r.close()


def _outcome(rig: _Rig, op: str, msg: Any) -> FireFlyerError | None:
    try:
        rig.call(op, msg)
    except FireFlyerError as e:  # anything else fails the test
        return e
    return None


u64 = st.one_of(st.integers(min_value=0, max_value=2**64 - 1),
                st.sampled_from([0, 2**52, 2**52 + 1, 2**62, 2**64 - 1]))
doubles = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                    st.sampled_from([limits.MIN_TIME, limits.MAX_TIME, 1e300]))
i32 = st.one_of(st.integers(min_value=-(2**31), max_value=2**31 - 1),
                st.sampled_from([-1, 0, os.O_RDWR, os.O_WRONLY | os.O_TRUNC, 3, 1 << 30]))


@FUZZ
@given(length=u64)
def test_truncate_and_report_length(rig: _Rig, length: int) -> None:
    efbig = length > limits.max_file_size(1 << 20)  # the root policy's 1 MiB chunks
    for op, msg in (("Truncate", pb.TruncateRequest(path=FILE, length=length)),
                    ("ReportLength", pb.ReportLengthRequest(inode_id=rig.inode_id, length=length))):
        err = _outcome(rig, op, msg)
        if efbig:
            assert isinstance(err, FsInvalidArgument) and err.errno == E.EFBIG and err.fields["field"] == "length"
        else:
            assert err is None, err


@FUZZ
@given(atime=st.none() | doubles, mtime=st.none() | doubles)
def test_setattr_times(rig: _Rig, atime: float | None, mtime: float | None) -> None:
    def bad(t: float | None) -> bool:
        return t is not None and not (math.isfinite(t) and limits.MIN_TIME <= t <= limits.MAX_TIME)

    err = _outcome(rig, "Setattr", pb.SetattrRequest(path=FILE, atime=atime, mtime=mtime))
    if bad(atime) or bad(mtime):
        assert isinstance(err, FsInvalidArgument) and err.errno == E.EINVAL
        assert err.fields["field"] in {n for n, t in (("atime", atime), ("mtime", mtime)) if bad(t)}
    else:
        assert err is None, err


@FUZZ
@given(flags=i32, name=st.text(alphabet="ab", min_size=1, max_size=3))
def test_create_and_open_flags(rig: _Rig, flags: int, name: str) -> None:
    ok = flags >= 0 and flags & ~limits.KNOWN_OPEN_FLAGS == 0 and flags & os.O_ACCMODE != 3
    for op, msg in (("Create", pb.CreateRequest(path=f"/home/alice/{name}", flags=flags)),
                    ("Open", pb.OpenRequest(path=FILE, flags=flags))):
        err = _outcome(rig, op, msg)
        if not ok:
            assert isinstance(err, FsInvalidArgument) and err.errno == E.EINVAL and err.fields["field"] == "flags"
        else:  # valid flags may still fail as POSIX says
            assert err is None or err.errno in (E.EEXIST, E.ENOTDIR, E.EISDIR), err


@FUZZ
@given(depth=st.integers(min_value=1, max_value=2100), name=st.sampled_from(["a", "bb", "ééé"]),
       parents=st.booleans())
def test_mkdir_depth_and_length(rig: _Rig, depth: int, name: str, parents: bool) -> None:
    path = "/home/alice" + f"/{name}" * (depth - 2)
    size = len(path.encode())
    err = _outcome(rig, "Mkdir", pb.MkdirRequest(path=path, parents=parents))
    if size > limits.MAX_PATH or max(depth, 2) > limits.MAX_DEPTH:
        assert isinstance(err, FsInvalidArgument) and err.errno == E.ENAMETOOLONG, err
    else:
        assert err is None or err.errno in (E.EEXIST, E.ENOENT), err


@FUZZ
@given(op=st.sampled_from(["Create", "Truncate", "Setattr", "Mkdir", "ReportLength", "Open", "Rename", "Stat"]),
       payload=st.binary(max_size=64))
def test_random_payloads_never_raise_untyped_errors(rig: _Rig, op: str, payload: bytes) -> None:
    try:
        rig.raw(op, payload)
    except FireFlyerError:
        pass
