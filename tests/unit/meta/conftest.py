"""Fixtures for the metadata tests: a fresh SQLite KV with an initialized file system."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from meta_util import ADMIN, ALICE, TABLES

from fireflyer.kv import KV, open_kv
from fireflyer.meta import MetaStore
from fireflyer.testing.kv import FAST_RETRY


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[KV]:
    store = open_kv(f"sqlite:///{tmp_path}/meta.db", **FAST_RETRY)
    yield store
    store.close()


@pytest.fixture
def fs(kv: KV) -> MetaStore:
    MetaStore.init(kv)
    store = MetaStore(kv, tables=TABLES, alloc_block=64)
    store.mkdir(ADMIN, "/home/alice", parents=True)
    store.setattr(ADMIN, "/home/alice", uid=ALICE.uid, gid=ALICE.gid)
    store.mkdir(ADMIN, "/tmp", 0o1777)
    return store
