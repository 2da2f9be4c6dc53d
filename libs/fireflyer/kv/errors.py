"""Errors of ``fireflyer.kv``, all under :class:`KVError` and under the core class with the same meaning.

Each class subclasses both ``KVError`` (so ``except KVError`` catches everything the
store raises) and the matching ``fireflyer.core.errors`` class (so the gRPC status
mapping and generic ``except Conflict`` handlers work unchanged).  Class names are
prefixed (``KVConflict``) because the core registry maps error kinds by class name,
and a second class called ``Conflict`` would shadow the core one for every decoder;
``Conflict`` and ``InvalidArgument`` are exported here as aliases for convenience.

Which errors ``KV.run`` retries:

- ``KVConflict`` and ``TransactionTooOld``: always (the transaction did not commit);
- ``KVUnavailable`` raised *before* commit: always (nothing was sent for commit);
- ``CommitUnknown``: only with an ``idempotency_key`` or ``idempotent=True``;
- ``KVTimeout`` and ``KVInvalidArgument``: never.

``KVWouldBlock`` (a ``KVTimeout``) is only raised inside :meth:`KV.nonblocking`: the
transaction would have had to wait (a lock held by another thread or process, a
retry with backoff) and was not applied; run it again outside the block.
"""

from __future__ import annotations

from fireflyer.core import errors as _core
from fireflyer.core.errors import Aborted, DeadlineExceeded, FireFlyerError, Unavailable

__all__ = [
    "KVError",
    "KVConflict",
    "Conflict",
    "CommitUnknown",
    "KVUnavailable",
    "TransactionTooOld",
    "KVTimeout",
    "KVWouldBlock",
    "KVInvalidArgument",
    "InvalidArgument",
]


class KVError(FireFlyerError):
    """Root of every error the KV store raises on purpose (no ``code`` of its own:
    the second base decides the status code)."""


class KVConflict(KVError, _core.Conflict):
    """The transaction conflicted with a concurrent commit and was not applied.

    Fields: ``key`` (a conflicting key, when the backend knows it), ``attempts``
    (set by ``KV.run`` when it gives up), ``injected`` (a test fault).
    """


class CommitUnknown(KVError, Unavailable):
    """The commit was sent but its outcome is unknown: it may or may not have applied.

    Retrying blindly could apply the transaction twice; ``KV.run`` only retries it
    with an ``idempotency_key`` (the retry finds the record) or ``idempotent=True``.
    """


class KVUnavailable(KVError, Unavailable):
    """The store cannot be reached or failed before commit; nothing was applied."""


class TransactionTooOld(KVError, Aborted):
    """The transaction's read snapshot is older than the store keeps conflict history
    for (SQLite: ``max_txn_age_s``); retrying with a fresh snapshot fixes it."""


class KVTimeout(KVError, DeadlineExceeded):
    """A deadline (``timeout_s`` or the lock wait) passed before the transaction committed."""


class KVWouldBlock(KVTimeout):
    """Inside :meth:`~fireflyer.kv.KV.nonblocking`: the transaction would have had to wait
    (for the write lock, or for a retry's backoff) and was not applied.  Nothing was
    written by the attempt; the caller runs it again where waiting is fine."""


class KVInvalidArgument(KVError, _core.InvalidArgument):
    """Bad input (not bytes, key or value too large, begin > end, system key); nothing written."""


Conflict = KVConflict
InvalidArgument = KVInvalidArgument
