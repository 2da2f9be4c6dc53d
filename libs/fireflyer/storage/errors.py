"""Typed errors of the storage data plane (3FS status codes, research/3fs.md §3).

Each one carries fields a caller can act on: ``chunk`` (the chunk id in hex), ``target``,
``chain`` and the versions involved.  The families follow what a client should do:

- retry after refreshing routing info: :class:`ChainVersionMismatch`, :class:`NotHead`
  (:data:`RETRY_AFTER_REFRESH` is the whole set a client retries that way);
- back off and retry (or read relaxed): :class:`NotCommitted`, :class:`NotServing`;
- stop and report, the data is wrong somewhere: :class:`ChecksumMismatch`,
  :class:`ChunkCorrupted` (``DATA_LOSS``);
- fix the request: :class:`BadRequest`.
"""

from __future__ import annotations

from fireflyer.core.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    FireFlyerError,
    InvalidArgument,
    NotFound,
    Unavailable,
)

__all__ = [
    "StorageError",
    "NotHead",
    "NotServing",
    "ChainVersionMismatch",
    "NotCommitted",
    "ChecksumMismatch",
    "ChunkCorrupted",
    "StaleUpdate",
    "VersionGap",
    "ChunkNotFound",
    "BadRequest",
    "ResyncFatal",
    "RETRY_AFTER_REFRESH",
]


class StorageError(FireFlyerError):
    """Marker base: every error raised by ``fireflyer.storage`` on purpose."""


class NotHead(StorageError, FailedPrecondition):
    """A client write reached a target that is not the chain head (3FS: non-head rejects
    client writes).  Fields: ``chain``, ``target``, ``head``; refresh routing and resend."""


class NotServing(StorageError, Unavailable):
    """The target is not (or no longer) serving/syncing in its chain, so it may not read
    or take updates.  Fields: ``chain``, ``target``, ``state``; pick another replica."""


class ChainVersionMismatch(StorageError, Aborted):
    """The request's chain version differs from the target's view.  Fields: ``chain``,
    ``target``, ``expected`` (the target's), ``got`` (the request's).  Whoever is behind
    refreshes routing info; the request may then be retried."""


class NotCommitted(StorageError, Unavailable):
    """The chunk has a pending (uncommitted) version (3FS ``kChunkNotCommit``).  Fields:
    ``chunk``, ``target``, ``committed``, ``pending``.  Back off and retry, or read relaxed."""


class ChecksumMismatch(StorageError):
    """A CRC32C did not match: the payload against the sender's CRC, or a replica's
    resulting chunk checksum against its predecessor's.  Fields: ``chunk``, ``target``,
    ``expected``, ``got``, ``what``."""

    code = "DATA_LOSS"


class ChunkCorrupted(StorageError):
    """A chunk file does not match its recorded CRC32C (bit rot, torn write by hand).
    Fields: ``chunk``, ``target``, ``version``, ``expected``, ``got``.  The target's copy
    must be replaced from a healthy replica (take the target offline; resync repairs it)."""

    code = "DATA_LOSS"


class StaleUpdate(StorageError, Aborted):
    """An update's version is at or below what the target already committed (a retried
    or overtaken update).  CRAQ successors treat it as success (research/3fs.md §3 step 4).
    Fields: ``chunk``, ``target``, ``committed``, ``update``."""


class VersionGap(StorageError, FailedPrecondition):
    """An update skips versions (``update != committed + 1``): the target missed an
    earlier update.  Predecessors answer it by forwarding a full-chunk replace.
    Fields: ``chunk``, ``target``, ``committed``, ``update``."""


class ChunkNotFound(StorageError, NotFound):
    """No committed version of the chunk exists on this target.  Fields: ``chunk``, ``target``."""


class BadRequest(StorageError, InvalidArgument):
    """A malformed request: offset/length outside the chunk, negative sizes, a bad
    version.  Fields name the offending values."""


class ResyncFatal(StorageError, FailedPrecondition):
    """Resync found chunks with equal-or-stale chain versions but different checksums
    (research/3fs.md §3 "Recovery": fatal, forces the successor offline).  Fields:
    ``target`` and ``chunks`` (comma-separated hex ids)."""


#: what a storage client retries, with backoff, after refreshing its routing snapshot: the chain
#: moved on (a version newer than ours), another target heads it, a target or node is not serving
#: or not reachable (``NotServing`` and a node that came back on a new port are ``Unavailable``),
#: a call timed out.  One set for every path (writes, batch writes, length queries), so that no
#: path fails on a routing change that the others ride out.
RETRY_AFTER_REFRESH: tuple[type[FireFlyerError], ...] = (ChainVersionMismatch, NotHead, Unavailable,
                                                         DeadlineExceeded)
