"""The checkpoint catalog's records, events and retention rule (msgspec Structs, pure code).

A checkpoint of a job at a step is written by ``world_size`` ranks, each one shard set plus
its ``rank<N>.index``, into one directory.  Its record moves

    pending ──(every rank committed)──► committing ──(manifest written)──► committed
       │                                                                      │
       └──(abort / abandoned / superseded)──► aborted          (delete) ──► deleting ──► gone

and only ``committed`` checkpoints are listed as usable: the manifest (``MANIFEST`` in the
directory) is written after every shard and before the record says committed, so a reader
that finds the manifest, or a committed record, never sees a partial checkpoint.
"""

from __future__ import annotations

import re
from enum import StrEnum

import msgspec

from fireflyer.bus.events import Event
from fireflyer.core.errors import InvalidArgument

__all__ = [
    "CkptState", "ShardCommit", "CheckpointRecord", "JobOwner", "CkptCaller", "RetentionPolicy", "Manifest", "CheckpointCommitted",
    "MANIFEST_NAME", "MANIFEST_FORMAT", "check_job", "retention_victims", "encode_manifest", "decode_manifest",
]

MANIFEST_NAME = "MANIFEST"
MANIFEST_FORMAT = 1
#: no '.': the job name is one token of the NATS subject ff.ckpt.v1.job.<job>.committed
_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


class CkptState(StrEnum):
    PENDING = "pending"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"
    DELETING = "deleting"


class ShardCommit(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's committed shard set: the digest of its index file and its tensor bytes."""

    rank: int
    index_digest: str
    nbytes: int
    committed_at: float = 0.0


class CheckpointRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    job: str
    step: int
    world_size: int
    #: the checkpoint's directory in the file system (3FS path, or relative to a local root)
    directory: str
    state: CkptState
    meta: dict[str, str] = {}
    created_at: float = 0.0
    #: the last Begin/CommitShard: an abandoned checkpoint is one idle past the timeout
    updated_at: float = 0.0
    committed_at: float = 0.0
    #: ranks committed so far, and their total tensor bytes
    ranks_committed: int = 0
    nbytes: int = 0
    pinned: bool = False
    #: why it was aborted
    reason: str = ""
    #: the user the job belongs to ("" in a catalog used without owners, e.g. a local root)
    owner: str = ""

    @property
    def committed(self) -> bool:
        return self.state is CkptState.COMMITTED


class JobOwner(msgspec.Struct, frozen=True, kw_only=True):
    """Who a job belongs to: the user who first saved to it (or first set its retention).
    Kept as long as the catalog knows the job, also after its last checkpoint is deleted, so
    that no one else can take the name over."""

    user: str
    since: float = 0.0


class CkptCaller(msgspec.Struct, frozen=True):
    """Who asks the catalog: the authenticated user and whether it is an admin (who may act on
    every job).  The checkpoint service builds it from the RPC's principal; a catalog used in
    one process without a service passes none and is not checked."""

    user: str
    admin: bool = False

    def may_act_on(self, owner: str) -> bool:
        return self.admin or self.user == owner


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Which committed checkpoints of a job to keep (the rest are deleted after each commit).

    Kept: the newest ``keep_last`` (0 keeps all), every checkpoint whose step is a multiple of
    ``keep_every`` (0: none on that account), and every pinned one."""

    keep_last: int = 3
    keep_every: int = 0

    def check(self) -> RetentionPolicy:
        if self.keep_last < 0 or self.keep_every < 0:
            raise InvalidArgument(f"retention keep_last ({self.keep_last}) and keep_every ({self.keep_every}) "
                                  "must be >= 0", keep_last=self.keep_last, keep_every=self.keep_every)
        return self


def retention_victims(committed: list[CheckpointRecord], policy: RetentionPolicy) -> list[CheckpointRecord]:
    """The committed checkpoints ``policy`` deletes (pure; oldest first)."""
    ordered = sorted((r for r in committed if r.committed), key=lambda r: (r.step, r.id))
    if policy.keep_last == 0:
        return []
    newest = {r.id for r in ordered[-policy.keep_last:]}
    return [
        r for r in ordered
        if r.id not in newest and not r.pinned and not (policy.keep_every and r.step % policy.keep_every == 0)
    ]


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """``MANIFEST``, written last: what a complete checkpoint holds."""

    id: str
    job: str
    step: int
    world_size: int
    meta: dict[str, str]
    shards: list[ShardCommit]
    committed_at: float
    format: int = MANIFEST_FORMAT


class CheckpointCommitted(Event, frozen=True, kw_only=True, tag="ckpt.committed.v1"):
    """Published on JetStream as ``ff.ckpt.v1.job.<job>.committed``; ``event_id`` is the
    checkpoint id, so a retried publish of one commit is stored once."""

    id: str
    job: str
    step: int
    world_size: int
    directory: str
    nbytes: int
    committed_at: float


def check_job(job: str) -> str:
    """A job name is used in paths and NATS subjects: letters, digits, ``_-``, at most 128."""
    if not isinstance(job, str) or not _JOB_RE.match(job):
        raise InvalidArgument(f"bad job name {job!r}: use 1-128 letters, digits, '_', '-' "
                              "(starting with a letter or digit)", job=str(job))
    return job


_manifest_dec = msgspec.json.Decoder(Manifest)


def encode_manifest(m: Manifest) -> bytes:
    return msgspec.json.encode(m)


def decode_manifest(data: bytes | bytearray | memoryview) -> Manifest:
    try:
        m = _manifest_dec.decode(data)
    except msgspec.DecodeError as e:
        raise InvalidArgument(f"not a checkpoint manifest: {e}") from e
    if m.format > MANIFEST_FORMAT:
        raise InvalidArgument(f"checkpoint manifest format {m.format} is newer than this client; upgrade fireflyer",
                              format=m.format)
    return m
