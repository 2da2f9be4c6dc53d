"""The checkpoint catalog: records in ``fireflyer.kv``, data and manifests in a file system.

:class:`Catalog` is the whole commit protocol, synchronous and I/O-explicit, so it runs both
inside ``services/checkpoint`` (one thread per call) and in a training process that has no
service (a local root: SQLite KV + :class:`~fireflyer.ckpt.localfs.LocalFS`).  Several
processes may share one catalog: every state change is one serializable KV transaction.

Keys (``fireflyer.kv.keys`` tuples)::

    CKPT (id)               msgpack CheckpointRecord
    CKSH (id, rank)         msgpack ShardCommit
    CKJB (job, step, id)    b""   -- a job's checkpoints in step order
    CKPL (job)              msgpack RetentionPolicy
    CKOW (job)              msgpack JobOwner  -- who the job belongs to (kept after its last delete)

Owners: a job belongs to the user who first saved to it (``begin``) or set its retention.
Every method that reads or changes a job's checkpoints takes ``caller``
(:class:`~fireflyer.ckpt.model.CkptCaller`, which the checkpoint service builds from the
RPC's principal): only the owner or an admin may act, anyone else gets ``PermissionDenied``
naming the owner and nothing of the checkpoints.  A job recorded before owners existed
belongs to no one and only admins may act on it.  ``caller=None`` (a catalog used in one
process, with a local root) checks nothing.

Commit: ``commit_shard`` checks the rank's index file against the digest, records the shard
and, for the last rank, moves the record to ``committing`` -- one transaction, so exactly one
caller finishes the commit: it writes ``MANIFEST`` (every shard is already in place), then moves
the record to ``committed``, aborts older pending checkpoints of the job (superseded), calls
``on_committed`` (the service publishes the JetStream event) and applies retention.  A crash
between those steps leaves a ``committing`` or ``deleting`` record that :meth:`sweep` finishes;
a pending record idle past ``abandon_after_s`` is aborted and its directory removed.

Scale note: every ``commit_shard`` of one checkpoint updates its record (the rank counter),
so the commits of one checkpoint serialize in the KV; that is thousands of small transactions
per checkpoint, not per step, and ranks of different jobs never conflict.
"""

from __future__ import annotations

import errno as E
import hashlib
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from fireflyer.core.clock import Clock, SystemClock
from fireflyer.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    FsError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from fireflyer.core.ids import new_id
from fireflyer.core.log import get_logger
from fireflyer.kv import KV, Txn
from fireflyer.kv.keys import pack, prefix_range, unpack

from .index import index_name
from .model import (
    MANIFEST_NAME,
    CheckpointRecord,
    CkptCaller,
    CkptState,
    JobOwner,
    Manifest,
    RetentionPolicy,
    ShardCommit,
    check_job,
    encode_manifest,
    retention_victims,
)
from .private import make_private_dir
from .shard import CheckpointCorrupted

__all__ = ["Catalog", "CatalogFS", "index_digest", "index_name", "MAX_WORLD", "MAX_META_BYTES"]

log = get_logger(__name__)

MAX_WORLD = 1 << 20
MAX_META_BYTES = 64 << 10
#: aborted records kept per job (for ``ff ckpt ls --all``); older ones are forgotten
KEEP_ABORTED = 16

CKPT, CKSH, CKJB, CKPL, CKOW = b"CKPT", b"CKSH", b"CKJB", b"CKPL", b"CKOW"
_rec_dec = msgspec.msgpack.Decoder(CheckpointRecord)
_shard_dec = msgspec.msgpack.Decoder(ShardCommit)
_pol_dec = msgspec.msgpack.Decoder(RetentionPolicy)
_owner_dec = msgspec.msgpack.Decoder(JobOwner)
_enc = msgspec.msgpack.Encoder()


class CatalogFS(Protocol):
    """What the catalog needs of a file system (3FS's client and LocalFS both have it)."""

    def mkdir(self, path: str, mode: int = ..., *, parents: bool = ..., exist_ok: bool = ...) -> Any: ...
    def write_bytes(self, path: str, data: Any) -> int: ...
    def read_bytes(self, path: str, offset: int = ..., length: int | None = ...) -> bytes: ...
    def rmtree(self, path: str) -> None: ...


def index_digest(data: bytes | bytearray | memoryview) -> str:
    """The digest CommitShard carries: BLAKE2b-128 of the rank's index file, hex."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _rec_key(ckpt_id: str) -> bytes:
    return CKPT + pack((ckpt_id,))


def _job_key(rec: CheckpointRecord) -> bytes:
    return CKJB + pack((rec.job, rec.step, rec.id))


def _put(txn: Txn, rec: CheckpointRecord) -> CheckpointRecord:
    txn.set(_rec_key(rec.id), _enc.encode(rec))
    txn.set(_job_key(rec), b"")
    return rec


def _get(txn: Txn, ckpt_id: str, *, snapshot: bool = False) -> CheckpointRecord:
    raw = txn.get(_rec_key(ckpt_id), snapshot=snapshot) if isinstance(ckpt_id, str) and ckpt_id else None
    if raw is None:
        raise NotFound(f"no checkpoint {ckpt_id!r}", checkpoint=str(ckpt_id))
    return _rec_dec.decode(raw)


def _job_records(txn: Txn, job: str, *, snapshot: bool = True) -> list[CheckpointRecord]:
    out = []
    for k, _ in txn.get_range(*prefix_range(CKJB + pack((job,))), snapshot=snapshot):
        _job, _step, ckpt_id = unpack(k[len(CKJB):])
        raw = txn.get(_rec_key(str(ckpt_id)), snapshot=snapshot)
        if raw is not None:
            out.append(_rec_dec.decode(raw))
    return out


def _owner(txn: Txn, job: str, *, snapshot: bool = True) -> JobOwner | None:
    raw = txn.get(CKOW + pack((job,)), snapshot=snapshot)
    return None if raw is None else _owner_dec.decode(raw)


def _job_known(txn: Txn, job: str, *, snapshot: bool = True) -> bool:
    """Whether the catalog has anything of ``job`` (a checkpoint or a retention policy)."""
    return (txn.get(CKPL + pack((job,)), snapshot=snapshot) is not None
            or bool(txn.get_range(*prefix_range(CKJB + pack((job,))), limit=1, snapshot=snapshot)))


def _refuse(job: str, owner: JobOwner | None, caller: CkptCaller, action: str) -> PermissionDenied:
    if owner is None:
        return PermissionDenied(
            f"user {caller.user!r} may not {action} job {job!r}: the job was recorded before checkpoints "
            "had owners, so only an admin may act on it (ask one to delete it, or save under another job name)",
            job=job, user=caller.user, action=action)
    return PermissionDenied(
        f"user {caller.user!r} may not {action} job {job!r}: it belongs to user {owner.user!r}; only its "
        "owner or an admin may (save under a job name of your own)",
        job=job, user=caller.user, owner=owner.user, action=action)


def _check_owner(txn: Txn, job: str, caller: CkptCaller | None, action: str, *, claim_at: float | None = None,
                 snapshot: bool = True) -> str:
    """The job's owner ("" when none) once ``caller`` may ``action`` it, else PermissionDenied.
    With ``claim_at``, a job the catalog does not know yet becomes the caller's (the same
    transaction records it, so two users racing for one name cannot both get it)."""
    owner = _owner(txn, job, snapshot=snapshot)
    if caller is None:
        return owner.user if owner is not None else ""
    if owner is None:
        if not _job_known(txn, job, snapshot=snapshot):
            if claim_at is None:
                return ""  # nothing of it to protect (the caller gets NotFound or a default)
            owner = JobOwner(user=caller.user, since=claim_at)
            txn.set(CKOW + pack((job,)), _enc.encode(owner))
            return owner.user
        if caller.admin:
            return ""
        raise _refuse(job, None, caller, action)
    if not caller.may_act_on(owner.user):
        raise _refuse(job, owner, caller, action)
    return owner.user


def _forget(txn: Txn, rec: CheckpointRecord) -> None:
    txn.clear(_rec_key(rec.id))
    txn.clear(_job_key(rec))
    txn.clear_range(*prefix_range(CKSH + pack((rec.id,))))


class Catalog:
    """Checkpoint records and their commit protocol over ``kv`` and ``fs`` (see the module doc)."""

    def __init__(self, kv: KV, fs: CatalogFS, *, root: str = "/ckpt", clock: Clock | None = None,
                 abandon_after_s: float = 600.0, verify_index: bool = True, create_dirs: bool = True,
                 on_committed: Callable[[CheckpointRecord], None] | None = None) -> None:
        """``create_dirs=False``: ``begin`` leaves creating the directory to the ranks, so it is
        owned by the job's user (the service runs as admin; ranks present user tokens)."""
        if abandon_after_s <= 0:
            raise InvalidArgument(f"abandon_after_s must be positive, got {abandon_after_s}")
        self.kv = kv
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self.clock = clock or SystemClock()
        self.abandon_after_s = abandon_after_s
        self.verify_index = verify_index
        self.create_dirs = create_dirs
        self.on_committed = on_committed

    # -- begin / commit / abort ---------------------------------------------------------------
    def begin(self, job: str, step: int, world_size: int, meta: dict[str, str] | None = None, *,
              retention: RetentionPolicy | None = None, caller: CkptCaller | None = None) -> CheckpointRecord:
        """Open the checkpoint of ``job`` at ``step`` written by ``world_size`` ranks.

        Every rank may call it: the first creates the pending checkpoint, the others get the same
        one.  Refused: a step not after the job's newest committed one, a pending checkpoint of
        the same step with another world size, a job of another user (``PermissionDenied``; the
        first ``begin`` of a job makes it the caller's)."""
        check_job(job)
        if not isinstance(step, int) or step < 0:
            raise InvalidArgument(f"step must be an integer >= 0, got {step!r}", step=str(step))
        if not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD:
            raise InvalidArgument(f"world_size must be 1..{MAX_WORLD}, got {world_size!r}", world_size=str(world_size))
        meta = dict(meta or {})
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in meta.items()):
            raise InvalidArgument("checkpoint meta must map str to str", job=job)
        if sum(len(k) + len(v) for k, v in meta.items()) > MAX_META_BYTES:
            raise InvalidArgument(f"checkpoint meta is over {MAX_META_BYTES} bytes", job=job)
        if retention is not None:
            retention.check()
        now = self.clock.time()
        fresh_id = new_id("ckpt")

        def txn_fn(txn: Txn) -> tuple[CheckpointRecord, bool]:
            owner = _check_owner(txn, job, caller, "save into", claim_at=now, snapshot=False)
            if retention is not None:
                txn.set(CKPL + pack((job,)), _enc.encode(retention))
            recs = _job_records(txn, job, snapshot=False)
            done = [r for r in recs if r.state in (CkptState.COMMITTED, CkptState.COMMITTING)]
            newest = max(done, key=lambda r: r.step, default=None)
            if newest is not None and newest.step >= step:
                same = next((r for r in done if r.step == step), None)
                if same is not None:
                    raise AlreadyExists(f"job {job} already has a checkpoint at step {step} ({same.id})",
                                        job=job, step=step, checkpoint=same.id)
                raise FailedPrecondition(
                    f"step {step} goes backwards: job {job}'s newest checkpoint is at step {newest.step} "
                    f"({newest.id}); delete it first to save an older step",
                    job=job, step=step, latest_step=newest.step)
            same_step = next((r for r in recs if r.state is CkptState.PENDING and r.step == step), None)
            if same_step is not None:
                if same_step.world_size != world_size:
                    raise FailedPrecondition(
                        f"checkpoint {same_step.id} of job {job} at step {step} is being written by "
                        f"{same_step.world_size} ranks, this rank says {world_size}",
                        job=job, step=step, world_size=world_size, expected=same_step.world_size)
                return _put(txn, msgspec.structs.replace(same_step, updated_at=now)), False
            rec = CheckpointRecord(
                id=fresh_id, job=job, step=step, world_size=world_size, directory=self._directory(job, step, fresh_id),
                state=CkptState.PENDING, meta=meta, created_at=now, updated_at=now, owner=owner)
            return _put(txn, rec), True

        rec, created = self.kv.run(txn_fn)
        if created:
            if self.create_dirs:
                make_private_dir(self.fs, rec.directory)  # 0700, as the ranks make it in 3FS
            log.info("ckpt.begin", checkpoint=rec.id, job=job, step=step, world_size=world_size)
        return rec

    def _directory(self, job: str, step: int, ckpt_id: str) -> str:
        base = "" if self.root == "/" else self.root
        return f"{base}/{job}/step{step:010d}-{ckpt_id.rsplit('-', 1)[-1][-8:].lower()}"

    def commit_shard(self, ckpt_id: str, rank: int, digest: str, nbytes: int, *,
                     caller: CkptCaller | None = None) -> CheckpointRecord:
        """Record that ``rank`` wrote its shards and index (whose digest is ``digest``); the last
        rank's call commits the checkpoint and returns the committed record."""
        rec = self._get_as(ckpt_id, caller, "commit to")
        if not isinstance(rank, int) or not 0 <= rank < rec.world_size:
            raise InvalidArgument(f"rank {rank} is outside checkpoint {ckpt_id}'s world of {rec.world_size} ranks",
                                  checkpoint=ckpt_id, rank=str(rank), world_size=rec.world_size)
        if nbytes < 0:
            raise InvalidArgument(f"nbytes must be >= 0, got {nbytes}", checkpoint=ckpt_id)
        self._check_pending(rec)
        if self.verify_index:
            self._verify_index(rec, rank, digest)
        now = self.clock.time()

        def txn_fn(txn: Txn) -> CheckpointRecord:
            cur = _get(txn, ckpt_id)
            skey = CKSH + pack((ckpt_id, rank))
            old = txn.get(skey)
            if old is not None:
                prev = _shard_dec.decode(old)
                if prev.index_digest == digest:
                    return cur  # a retried CommitShard
                raise AlreadyExists(f"rank {rank} already committed a different shard to {ckpt_id}",
                                    checkpoint=ckpt_id, rank=rank)
            self._check_pending(cur)
            txn.set(skey, _enc.encode(ShardCommit(rank=rank, index_digest=digest, nbytes=nbytes, committed_at=now)))
            done = cur.ranks_committed + 1
            state = CkptState.COMMITTING if done == cur.world_size else CkptState.PENDING
            return _put(txn, msgspec.structs.replace(cur, ranks_committed=done, nbytes=cur.nbytes + nbytes,
                                                     state=state, updated_at=now))

        rec = self.kv.run(txn_fn)
        if rec.state is CkptState.COMMITTING and rec.ranks_committed == rec.world_size:
            rec = self._finish_commit(rec)
        return rec

    def _check_pending(self, rec: CheckpointRecord) -> None:
        if rec.state is not CkptState.PENDING:
            why = f": {rec.reason}" if rec.reason else ""
            raise FailedPrecondition(f"checkpoint {rec.id} is {rec.state.value}{why}; start a new one with Begin",
                                     checkpoint=rec.id, state=rec.state.value)

    def _verify_index(self, rec: CheckpointRecord, rank: int, digest: str) -> None:
        path = f"{rec.directory}/{index_name(rank)}"
        try:
            data = self.fs.read_bytes(path)
        except FsError as e:
            if e.errno in (E.ENOENT, E.ENOTDIR):
                raise FailedPrecondition(f"rank {rank}'s index {path} is missing: write the shards and the index "
                                         "before CommitShard", checkpoint=rec.id, rank=rank, path=path) from None
            raise
        got = index_digest(data)
        if got != digest:
            raise CheckpointCorrupted(f"rank {rank}'s index {path} has digest {got}, CommitShard says {digest}",
                                      checkpoint=rec.id, rank=rank, path=path)

    def _shards(self, ckpt_id: str) -> list[ShardCommit]:
        def txn_fn(txn: Txn) -> list[ShardCommit]:
            return [_shard_dec.decode(v) for _, v in txn.get_range(*prefix_range(CKSH + pack((ckpt_id,))),
                                                                   snapshot=True)]
        return self.kv.run(txn_fn)

    def _finish_commit(self, rec: CheckpointRecord) -> CheckpointRecord:
        now = self.clock.time()
        manifest = Manifest(id=rec.id, job=rec.job, step=rec.step, world_size=rec.world_size, meta=rec.meta,
                            shards=sorted(self._shards(rec.id), key=lambda s: s.rank), committed_at=now)
        self.fs.write_bytes(f"{rec.directory}/{MANIFEST_NAME}", encode_manifest(manifest))

        def txn_fn(txn: Txn) -> tuple[CheckpointRecord, list[CheckpointRecord] | None]:
            cur = _get(txn, rec.id)
            if cur.state is not CkptState.COMMITTING:
                return cur, None  # another process finished it
            done = _put(txn, msgspec.structs.replace(cur, state=CkptState.COMMITTED, committed_at=now, updated_at=now))
            superseded = []
            for r in _job_records(txn, rec.job, snapshot=False):
                if r.state is CkptState.PENDING and r.step < rec.step:
                    superseded.append(_put(txn, msgspec.structs.replace(
                        r, state=CkptState.ABORTED, reason=f"superseded by step {rec.step} ({rec.id})",
                        updated_at=now)))
            return done, superseded

        done, superseded = self.kv.run(txn_fn)
        if superseded is None:
            return done
        log.info("ckpt.committed", checkpoint=done.id, job=done.job, step=done.step, nbytes=done.nbytes)
        for r in superseded:
            self._remove_dir(r)
        if self.on_committed is not None:
            try:
                self.on_committed(done)
            except Exception:  # noqa: BLE001 -- the commit stands; the event is best-effort here
                log.exception("ckpt.on_committed_failed", checkpoint=done.id)
        self.apply_retention(done.job)
        return done

    def abort(self, ckpt_id: str, reason: str = "aborted by the client", *,
              caller: CkptCaller | None = None) -> CheckpointRecord:
        """Abort a pending checkpoint and remove its directory (the record stays, saying why)."""
        if caller is not None:
            self._get_as(ckpt_id, caller, "abort a checkpoint of")
        now = self.clock.time()

        def txn_fn(txn: Txn) -> CheckpointRecord:
            cur = _get(txn, ckpt_id)
            if cur.state is CkptState.ABORTED:
                return cur
            if cur.state is not CkptState.PENDING:
                raise FailedPrecondition(f"checkpoint {ckpt_id} is {cur.state.value}, only a pending one can be "
                                         "aborted (use Delete)", checkpoint=ckpt_id, state=cur.state.value)
            return _put(txn, msgspec.structs.replace(cur, state=CkptState.ABORTED, reason=reason, updated_at=now))

        rec = self.kv.run(txn_fn)
        self._remove_dir(rec)
        log.info("ckpt.aborted", checkpoint=rec.id, job=rec.job, step=rec.step, reason=rec.reason)
        self._prune_aborted(rec.job)
        return rec

    # -- reading --------------------------------------------------------------------------------
    def get(self, ckpt_id: str, *, caller: CkptCaller | None = None) -> CheckpointRecord:
        return self._get_as(ckpt_id, caller, "read a checkpoint of")

    def _get_as(self, ckpt_id: str, caller: CkptCaller | None, action: str) -> CheckpointRecord:
        def txn_fn(txn: Txn) -> CheckpointRecord:
            rec = _get(txn, ckpt_id, snapshot=True)
            if caller is not None:
                _check_owner(txn, rec.job, caller, action)
            return rec
        return self.kv.run(txn_fn)

    def owner(self, job: str) -> str:
        """The user ``job`` belongs to ("" when it has none)."""
        check_job(job)
        got = self.kv.run(lambda txn: _owner(txn, job))
        return got.user if got is not None else ""

    def list(self, job: str, *, include_all: bool = False, caller: CkptCaller | None = None) -> list[CheckpointRecord]:
        """A job's checkpoints in step order (committed only, unless ``include_all``)."""
        check_job(job)
        def txn_fn(txn: Txn) -> tuple[list[CheckpointRecord], bool]:
            _check_owner(txn, job, caller, "list")
            return _job_records(txn, job), txn.get(CKPL + pack((job,)), snapshot=True) is not None

        recs, has_policy = self.kv.run(txn_fn)
        if not recs and not has_policy:
            raise NotFound(f"unknown job {job!r}: it has no checkpoints", job=job)
        return [r for r in recs if include_all or r.committed]

    def latest(self, job: str, *, caller: CkptCaller | None = None) -> CheckpointRecord:
        recs = self.list(job, caller=caller)
        if not recs:
            raise NotFound(f"job {job} has no committed checkpoint yet", job=job)
        return recs[-1]

    def jobs(self, *, caller: CkptCaller | None = None) -> list[str]:
        """The jobs the catalog knows, by name; a non-admin ``caller`` gets only its own."""
        def txn_fn(txn: Txn) -> list[str]:
            owners = {str(unpack(k[len(CKOW):])[0]): _owner_dec.decode(v).user
                      for k, v in txn.get_range(*prefix_range(CKOW), snapshot=True)}
            seen: set[str] = set(owners)
            for k, _ in txn.get_range(*prefix_range(CKPL), snapshot=True):
                seen.add(str(unpack(k[len(CKPL):])[0]))
            for k, _ in txn.get_range(*prefix_range(CKJB), snapshot=True):
                seen.add(str(unpack(k[len(CKJB):])[0]))
            if caller is not None and not caller.admin:
                seen = {j for j in seen if owners.get(j) == caller.user}
            return sorted(seen)
        return self.kv.run(txn_fn)

    def shards(self, ckpt_id: str, *, caller: CkptCaller | None = None) -> list[ShardCommit]:
        self.get(ckpt_id, caller=caller)
        return sorted(self._shards(ckpt_id), key=lambda s: s.rank)

    # -- retention, pinning, deletion ----------------------------------------------------------
    def retention(self, job: str, *, caller: CkptCaller | None = None) -> RetentionPolicy:
        check_job(job)

        def txn_fn(txn: Txn) -> bytes | None:
            _check_owner(txn, job, caller, "read the retention of")
            return txn.get(CKPL + pack((job,)), snapshot=True)

        raw = self.kv.run(txn_fn)
        return RetentionPolicy() if raw is None else _pol_dec.decode(raw)

    def set_retention(self, job: str, policy: RetentionPolicy, *, caller: CkptCaller | None = None) -> RetentionPolicy:
        """Set ``job``'s retention policy (and apply it); a job the catalog does not know yet
        becomes the caller's."""
        check_job(job)
        policy.check()
        now = self.clock.time()

        def txn_fn(txn: Txn) -> None:
            _check_owner(txn, job, caller, "change the retention of", claim_at=now, snapshot=False)
            txn.set(CKPL + pack((job,)), _enc.encode(policy))

        self.kv.run(txn_fn)
        self.apply_retention(job)
        return policy

    def apply_retention(self, job: str) -> list[CheckpointRecord]:
        """Delete the committed checkpoints the job's policy no longer keeps; returns them."""
        policy = self.retention(job)
        victims = retention_victims(self.kv.run(lambda txn: _job_records(txn, job)), policy)
        for r in victims:
            try:
                self.delete(r.id)
            except (NotFound, FailedPrecondition):
                continue  # deleted or pinned meanwhile
        if victims:
            log.info("ckpt.retention", job=job, deleted=[r.step for r in victims], keep_last=policy.keep_last,
                     keep_every=policy.keep_every)
        return victims

    def pin(self, ckpt_id: str, pinned: bool = True, *, caller: CkptCaller | None = None) -> CheckpointRecord:
        def txn_fn(txn: Txn) -> CheckpointRecord:
            rec = _get(txn, ckpt_id)
            _check_owner(txn, rec.job, caller, "pin or unpin a checkpoint of", snapshot=False)
            return _put(txn, msgspec.structs.replace(rec, pinned=pinned))
        return self.kv.run(txn_fn)

    def delete(self, ckpt_id: str, *, force: bool = False, caller: CkptCaller | None = None) -> CheckpointRecord:
        """Delete a committed or aborted checkpoint: its directory, then its records.  A pinned one
        needs ``force``; a pending one is aborted first.  The files are removed with the catalog's
        own file-system rights (the service's), so the caller's ownership is checked first."""
        rec = self._get_as(ckpt_id, caller, "delete a checkpoint of")
        if rec.state is CkptState.PENDING:
            rec = self.abort(ckpt_id, "deleted")
        if rec.pinned and not force:
            raise FailedPrecondition(f"checkpoint {ckpt_id} is pinned; unpin it or delete with force",
                                     checkpoint=ckpt_id)
        if rec.state is CkptState.COMMITTING:
            raise FailedPrecondition(f"checkpoint {ckpt_id} is being committed; retry", checkpoint=ckpt_id)

        def mark(txn: Txn) -> CheckpointRecord:
            cur = _get(txn, ckpt_id)
            return _put(txn, msgspec.structs.replace(cur, state=CkptState.DELETING, updated_at=self.clock.time()))

        rec = self.kv.run(mark)
        self._remove_dir(rec)
        self.kv.run(lambda txn: _forget(txn, rec))
        log.info("ckpt.deleted", checkpoint=rec.id, job=rec.job, step=rec.step)
        return rec

    def _prune_aborted(self, job: str) -> None:
        def txn_fn(txn: Txn) -> None:
            aborted = [r for r in _job_records(txn, job, snapshot=False) if r.state is CkptState.ABORTED]
            for r in sorted(aborted, key=lambda r: r.updated_at)[:-KEEP_ABORTED]:
                _forget(txn, r)
        self.kv.run(txn_fn)

    def _remove_dir(self, rec: CheckpointRecord) -> None:
        try:
            self.fs.rmtree(rec.directory)
        except FsError as e:
            if e.errno not in (E.ENOENT, E.ENOTDIR):
                raise

    # -- recovery -------------------------------------------------------------------------------
    def sweep(self) -> list[CheckpointRecord]:
        """Abort abandoned pending checkpoints and finish interrupted commits and deletes; returns
        the records acted on.  Run periodically (the service does) and at start-up."""
        now = self.clock.time()

        def scan(txn: Txn) -> list[CheckpointRecord]:
            return [_rec_dec.decode(v) for _, v in txn.get_range(*prefix_range(CKPT), snapshot=True)]

        acted = []
        for rec in self.kv.run(scan):
            try:
                if rec.state is CkptState.PENDING and now - rec.updated_at > self.abandon_after_s:
                    acted.append(self.abort(rec.id, (
                        f"abandoned: no commit for {now - rec.updated_at:.0f}s (timeout {self.abandon_after_s:g}s); "
                        f"{rec.ranks_committed} of {rec.world_size} ranks had committed")))
                elif rec.state is CkptState.COMMITTING:
                    acted.append(self._finish_commit(rec))
                elif rec.state is CkptState.DELETING:
                    self._remove_dir(rec)
                    self.kv.run(lambda txn, rec=rec: _forget(txn, rec))
                    acted.append(rec)
            except (NotFound, FailedPrecondition):
                continue  # another process got there first
        return acted
