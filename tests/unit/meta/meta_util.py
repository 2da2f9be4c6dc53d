"""Shared constants and helpers of the metadata unit tests."""

from __future__ import annotations

from fireflyer.kv import KV
from fireflyer.meta import Caller, StaticChainTables

ADMIN = Caller(0, 0, admin=True, user="admin")
ALICE = Caller(1000, 1000, user="alice")
BOB = Caller(1001, 1001, user="bob")
CAROL = Caller(1002, 2000, groups=(1000,), user="carol")  # in alice's group
TABLES = StaticChainTables({1: (1, (1, 2, 3, 4, 5, 6, 7, 8)), 2: (5, (21, 22))})


def dump(kv: KV) -> list[tuple[bytes, bytes]]:
    """Every user key, to check that failed calls wrote nothing."""
    return kv.run(lambda txn: txn.get_range(b"", b"\xff"), idempotent=True)
