"""The 3FS storage data plane as libraries: chunk ids, the chunk store, CRAQ, resync.

- :mod:`~fireflyer.storage.chunkid`: 16-byte order-preserving chunk ids, offset/chain arithmetic.
- :mod:`~fireflyer.storage.chunkstore`: one target's chunks, copy-on-write versions, SQLite metadata.
- :mod:`~fireflyer.storage.craq`: the replica state machine (head writes, forwarding, commits, reads).
- :mod:`~fireflyer.storage.resync`: diff rules for a returning target and the driver that applies them.
- :mod:`~fireflyer.storage.checksum`: CRC32C.
- :mod:`~fireflyer.storage.errors`: typed errors.

Everything here is transport-agnostic (DESIGN.md §2): ``services/storage`` supplies the
network calls (forwarding, heartbeats, resync streaming) and the routing info.
"""

from .checksum import crc32c
from .chunkid import ChunkId, chain_for, chunk_of, file_range, split_range
from .chunkstore import ChunkMeta, ChunkState, ChunkStore, PendingWrite
from .craq import (
    ReadReply,
    ReadReq,
    Replica,
    RetryPolicy,
    UpdateAck,
    UpdateKind,
    UpdateReq,
    WriteAck,
    WriteReq,
    choose_read_target,
    successor_of,
)
from .errors import (
    BadRequest,
    ChainVersionMismatch,
    ChecksumMismatch,
    ChunkCorrupted,
    ChunkNotFound,
    NotCommitted,
    NotHead,
    NotServing,
    ResyncFatal,
    StaleUpdate,
    StorageError,
    VersionGap,
)
from .resync import Decision, ResyncPlan, ResyncStats, decide, diff, resync, run_resync

__all__ = [
    "crc32c",
    "ChunkId",
    "chain_for",
    "chunk_of",
    "file_range",
    "split_range",
    "ChunkMeta",
    "ChunkState",
    "ChunkStore",
    "PendingWrite",
    "ReadReply",
    "ReadReq",
    "Replica",
    "RetryPolicy",
    "UpdateAck",
    "UpdateKind",
    "UpdateReq",
    "WriteAck",
    "WriteReq",
    "choose_read_target",
    "successor_of",
    "BadRequest",
    "ChainVersionMismatch",
    "ChecksumMismatch",
    "ChunkCorrupted",
    "ChunkNotFound",
    "NotCommitted",
    "NotHead",
    "NotServing",
    "ResyncFatal",
    "StaleUpdate",
    "StorageError",
    "VersionGap",
    "Decision",
    "ResyncPlan",
    "ResyncStats",
    "decide",
    "diff",
    "resync",
    "run_resync",
]
