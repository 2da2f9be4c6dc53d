"""``fireflyer.kv``: an ordered byte-key store with serializable transactions.

    from fireflyer.kv import open_kv, keys

    kv = open_kv("sqlite:////var/lib/ff/meta.db")   # or postgresql://...?schema=meta
    def bump(txn):
        n = int.from_bytes(txn.get(b"n") or b"\\0", "big") + 1
        txn.set(b"n", n.to_bytes(8, "big"))
        return n
    kv.run(bump, idempotency_key=request_id)        # retried on conflict, applied once
    await kv.arun(bump)                             # from asyncio

Semantics and per-backend deviations: ``api`` (common), ``sqlite``, ``postgres``;
``opener`` picks the backend a URL names.
"""

from .api import (
    IDEM_PREFIX,
    KV,
    MAX_KEY_SIZE,
    MAX_TXN_BYTES,
    MAX_VALUE_SIZE,
    SYSTEM_PREFIX,
    KVStats,
    Txn,
)
from .errors import (
    CommitUnknown,
    Conflict,
    KVConflict,
    KVError,
    KVInvalidArgument,
    KVTimeout,
    KVUnavailable,
    KVWouldBlock,
    TransactionTooOld,
)
from .faults import CommitInfo, Fault, FaultInjector
from .opener import aopen_kv, open_kv

__all__ = [
    "KV",
    "Txn",
    "KVStats",
    "open_kv",
    "aopen_kv",
    "MAX_KEY_SIZE",
    "MAX_VALUE_SIZE",
    "MAX_TXN_BYTES",
    "SYSTEM_PREFIX",
    "IDEM_PREFIX",
    "KVError",
    "KVConflict",
    "Conflict",
    "CommitUnknown",
    "KVUnavailable",
    "TransactionTooOld",
    "KVTimeout",
    "KVWouldBlock",
    "KVInvalidArgument",
    "FaultInjector",
    "Fault",
    "CommitInfo",
]
