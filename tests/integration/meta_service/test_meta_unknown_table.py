"""A create whose layout names a chain table this meta replica has not seen yet.

The servicer asks the routing follower for a refresh and retries once.  When mgmtd could
not be asked, the answer is Unavailable (the client fails over or retries), never "chain
table 1 does not exist", which is only said when mgmtd answered and lacks the table.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.core.errors import InvalidArgument, Unavailable
from fireflyer.kv import open_kv
from fireflyer.meta import Caller, MetaStore
from fireflyer.mgmt.model import ChainTable
from fireflyer.rpc import auth
from services.meta.chains import RoutedChainTables
from services.meta.servicer import MetaServicer


class _Follower:
    """Stands in for RoutingFollower.refresh_now: ``answers`` says whether mgmtd answered,
    ``brings_table`` whether its routing had table 1."""

    def __init__(self, tables: RoutedChainTables, *, answers: bool, brings_table: bool) -> None:
        self.tables, self.answers, self.brings_table, self.calls = tables, answers, brings_table, 0

    async def refresh_now(self) -> bool:
        self.calls += 1
        if self.answers and self.brings_table:
            self.tables.load([ChainTable(table_id=1, version=1, chain_ids=tuple(range(1, 9)))], routing_version=7)
        return self.answers


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetaStore]:
    kv = open_kv(f"sqlite:///{tmp_path}/meta.db")
    MetaStore.init(kv)
    s = MetaStore(kv, tables=RoutedChainTables())  # empty: routing not seen yet
    s.mkdir(Caller(0, 0, admin=True), "/d", 0o777)
    yield s
    kv.close()


def _create(store: MetaStore, follower: _Follower, name: str) -> pb.OpenReply:
    pool = ThreadPoolExecutor(1)
    sv = MetaServicer(store, users={}, pool=pool, on_unknown_table=follower.refresh_now)
    req = pb.CreateRequest(path=f"/d/{name}", mode=0o644, flags=os.O_CREAT | os.O_EXCL, request_id=os.urandom(16))

    async def call() -> pb.OpenReply:
        auth._bind(auth.Principal("alice", frozenset({"user"})), "/test")
        return await sv.Create(req, None)

    try:
        return asyncio.run(call())
    finally:
        pool.shutdown()


def test_create_succeeds_once_the_refresh_brings_the_table(store: MetaStore) -> None:
    follower = _Follower(store.tables, answers=True, brings_table=True)  # type: ignore[arg-type]
    reply = _create(store, follower, "a")
    assert reply.created and follower.calls == 1


def test_unreachable_mgmtd_is_unavailable_not_a_missing_table(store: MetaStore) -> None:
    follower = _Follower(store.tables, answers=False, brings_table=False)  # type: ignore[arg-type]
    with pytest.raises(Unavailable) as ei:
        _create(store, follower, "b")
    assert ei.value.fields["table"] == 1
    assert "mgmtd did not answer" in str(ei.value)
    assert follower.calls == 1


def test_a_table_mgmtd_does_not_have_is_invalid_argument(store: MetaStore) -> None:
    follower = _Follower(store.tables, answers=True, brings_table=False)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="chain table 1 does not exist"):
        _create(store, follower, "c")
    assert follower.calls == 1
