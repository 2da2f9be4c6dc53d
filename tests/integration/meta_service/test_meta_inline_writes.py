"""MetaServicer's inline mutations: on the event loop when the KV can commit at once, on
the pool (same result, exactly once) when it would have to wait."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.core.errors import FsError
from fireflyer.kv import open_kv
from fireflyer.meta import Caller, MetaStore, StaticChainTables
from fireflyer.rpc import auth
from services.meta.servicer import MetaServicer


@pytest.fixture
def servicer(tmp_path: Path):  # type: ignore[no-untyped-def]
    kv = open_kv(f"sqlite:///{tmp_path}/meta.db")
    MetaStore.init(kv)
    store = MetaStore(kv, tables=StaticChainTables({1: (1, tuple(range(1, 9)))}))
    store.mkdir(Caller(0, 0, admin=True), "/d", 0o777)
    pool = ThreadPoolExecutor(2)
    sv = MetaServicer(store, users={}, pool=pool, inline_writes=True)
    yield sv
    pool.shutdown()
    kv.close()


async def _as_user(coro_fn):  # type: ignore[no-untyped-def]
    auth._bind(auth.Principal("alice", frozenset({"user"})), "/test")
    return await coro_fn()


def test_inline_create_runs_on_the_loop_thread(servicer: MetaServicer) -> None:
    seen: list[str] = []
    create = servicer.store.create

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        return create(*a, **kw)

    servicer.store.create = spy  # type: ignore[method-assign]
    req = pb.CreateRequest(path="/d/f", mode=0o644, flags=os.O_CREAT | os.O_EXCL, request_id=os.urandom(16))
    reply = asyncio.run(_as_user(lambda: servicer.Create(req, None)))
    assert reply.created and seen == [threading.current_thread().name] and servicer.deferred == 0


def test_create_goes_to_the_pool_when_the_lock_is_held(servicer: MetaServicer, tmp_path: Path) -> None:
    holder = sqlite3.connect(f"{tmp_path}/meta.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another replica committing
    release = threading.Timer(0.1, lambda: (holder.rollback(), holder.close()))
    release.start()
    rid = os.urandom(16)
    req = pb.CreateRequest(path="/d/g", mode=0o644, flags=os.O_CREAT | os.O_EXCL, request_id=rid)
    try:
        reply = asyncio.run(_as_user(lambda: servicer.Create(req, None)))
    finally:
        release.join()
    assert reply.created and servicer.deferred == 1
    # the retry of the same request (same id) returns the first outcome, not EEXIST
    again = asyncio.run(_as_user(lambda: servicer.Create(req, None)))
    assert again.inode.id == reply.inode.id and again.created
    # a new request for the same name is refused as O_EXCL says
    req2 = pb.CreateRequest(path="/d/g", mode=0o644, flags=os.O_CREAT | os.O_EXCL, request_id=os.urandom(16))
    with pytest.raises(FsError) as info:
        asyncio.run(_as_user(lambda: servicer.Create(req2, None)))
    assert info.value.errno == 17  # EEXIST
