"""CRAQ as 3FS implements it: the replica's side of writes, updates and reads, free of I/O.

A :class:`Replica` owns one target's :class:`~fireflyer.storage.chunkstore.ChunkStore`.
The network is injected: ``chains(chain_id)`` returns this process's current view of a
chain (routing info from mgmtd) and ``forward(target, UpdateReq, payload)`` delivers an
update to a successor and returns its :class:`UpdateAck` (the service does it over the
data plane; tests call another ``Replica`` directly, or fail, or block).  The rules,
from research/3fs.md §3 "Write path":

1. clients write to the head only (:class:`NotHead` elsewhere); every request carries the
   chain version and a differing one is refused (:class:`ChainVersionMismatch`);
2. the payload CRC is verified before anything is applied, on every replica;
3. the head takes the chunk lock (all writes of a chunk are serialized there), re-checks
   the chain, and assigns ``u = v + 1``; successors require ``u == v + 1`` too, treat
   ``u <= v`` as an already-applied update (success), and answer a gap with
   :class:`VersionGap`, to which the predecessor responds with a full-chunk replace;
4. the update is applied copy-on-write as a pending version; its whole-chunk CRC goes
   with the forwarded update, so a successor refuses to commit different content
   (:class:`ChecksumMismatch`), and the predecessor compares the ack's CRC again;
5. forwarding retries with exponential backoff, re-reading the chain on every attempt:
   the successor may be removed (forward to the next), may be SYNCING (forward a
   full-chunk replace), or we may have become the tail (commit);
6. the tail commits first and acks; each predecessor commits on the ack;
7. client retries are deduplicated by (client, channel, seq) at the head.

A write whose forwarding gives up leaves its pending version *in doubt* at the head: it
may already be committed downstream.  The head never overwrites it with other content;
the next write of the chunk (or :meth:`Replica.resolve_pending`) first re-forwards it as a
full-chunk replace and commits it, so every version number names one content chain-wide.

Reads (research/3fs.md §3 "Read path") go to any SERVING replica; a pending version
answers :class:`NotCommitted` unless the request asks for a relaxed read.
"""

from __future__ import annotations

import collections
import enum
import random
import threading
import time
from collections.abc import Callable, Iterable

import msgspec

from fireflyer.core.clock import SYSTEM_CLOCK, Clock
from fireflyer.core.errors import Aborted, DeadlineExceeded, Unavailable
from fireflyer.core.log import get_logger
from fireflyer.mgmt.model import Chain, PublicState, TargetId

from .checksum import crc32c, verify_payload
from .chunkid import ChunkId
from .chunkstore import ChunkStore, PendingWrite
from .errors import (
    BadRequest,
    ChainVersionMismatch,
    ChecksumMismatch,
    NotHead,
    NotServing,
    StaleUpdate,
    VersionGap,
)

__all__ = [
    "UpdateKind",
    "WriteReq",
    "UpdateReq",
    "UpdateAck",
    "WriteAck",
    "ReadReq",
    "ReadReply",
    "RetryPolicy",
    "Replica",
    "Forward",
    "ChainSource",
    "WRITE_STATES",
    "successor_of",
    "choose_read_target",
]

log = get_logger(__name__)

Buffer = bytes | bytearray | memoryview
#: states that receive updates: serving, and the one syncing target (always after them)
WRITE_STATES = (PublicState.SERVING, PublicState.SYNCING)


class UpdateKind(enum.StrEnum):
    WRITE = "write"  # positional write onto the committed version
    REPLACE = "replace"  # the payload is the whole chunk (to a syncing target, after a gap, in-doubt retry)


class WriteReq(msgspec.Struct, frozen=True, kw_only=True):
    """Client -> head.  The payload travels beside the header (``length`` bytes)."""

    chain_id: int
    chain_ver: int
    chunk_id: ChunkId
    offset: int
    length: int
    chunk_size: int
    payload_crc: int
    client_id: str
    channel: int = 0
    seq: int = 0


class UpdateReq(msgspec.Struct, frozen=True, kw_only=True):
    """Predecessor -> successor; ``expected_crc``/``expected_length`` describe the whole chunk
    after the update, so the successor can refuse different content before committing."""

    chain_id: int
    chain_ver: int
    chunk_id: ChunkId
    kind: UpdateKind
    offset: int
    length: int
    chunk_size: int
    payload_crc: int
    update_ver: int
    expected_crc: int
    expected_length: int
    from_target: int
    client_id: str = ""
    channel: int = 0
    seq: int = 0


class UpdateAck(msgspec.Struct, frozen=True, kw_only=True):
    chunk_id: ChunkId
    target_id: int
    update_ver: int
    commit_ver: int  # the replica's committed version after the update
    length: int
    crc: int  # of the replica's committed chunk
    stale: bool = False  # the update had already been applied


class WriteAck(msgspec.Struct, frozen=True, kw_only=True):
    chunk_id: ChunkId
    target_id: int
    chain_ver: int
    commit_ver: int
    length: int
    crc: int
    duplicate: bool = False  # answered from the dedupe cache


class ReadReq(msgspec.Struct, frozen=True, kw_only=True):
    chain_id: int
    chain_ver: int
    chunk_id: ChunkId
    offset: int = 0
    length: int = -1
    relaxed: bool = False  # 3FS ALLOW_READ_UNCOMMITTED


class ReadReply(msgspec.Struct, frozen=True, kw_only=True):
    chunk_id: ChunkId
    target_id: int
    version: int
    length: int
    crc: int  # of the returned bytes, for end-to-end checking
    uncommitted: bool = False


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Forwarding retries: exponential backoff, bounded by attempts and a deadline."""

    max_attempts: int = 8
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    deadline_s: float = 30.0


Forward = Callable[[TargetId, UpdateReq, Buffer], UpdateAck]
ChainSource = Callable[[int], Chain]
_RETRYABLE = (Unavailable, DeadlineExceeded, Aborted, ConnectionError, TimeoutError)


def successor_of(chain: Chain, target_id: TargetId) -> TargetId | None:
    """The next target after ``target_id`` that receives updates (serving or syncing)."""
    ids = chain.target_ids
    for t in chain.targets[ids.index(target_id) + 1 :]:
        if t.public_state in WRITE_STATES:
            return t.target_id
    return None


def choose_read_target(
    chain: Chain, rng: random.Random | None = None, exclude: Iterable[TargetId] = ()
) -> TargetId:
    """Load-balanced read target: a random serving replica not in ``exclude`` (3FS LoadBalance)."""
    skip = set(exclude)
    choices = [t for t in chain.serving() if t not in skip]
    if not choices:
        raise NotServing(
            f"chain {chain.chain_id} has no serving replica left to read from", chain=chain.chain_id
        )
    return (rng or random).choice(choices)


class Replica:
    """One target's CRAQ state machine; thread safe (one thread per request is fine)."""

    def __init__(
        self,
        target_id: TargetId,
        store: ChunkStore,
        *,
        chains: ChainSource,
        forward: Forward,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        clock: Clock = SYSTEM_CLOCK,
        dedupe_capacity: int = 4096,
    ) -> None:
        self.target_id = target_id
        self.store = store
        self._chains = chains
        self._forward = forward
        self.retry = retry
        self._sleep = sleep
        self._clock = clock
        self._dedupe: collections.OrderedDict[tuple[str, int], tuple[int, WriteAck]] = (
            collections.OrderedDict()
        )
        self._dedupe_capacity = dedupe_capacity
        self._dedupe_lock = threading.Lock()
        self._in_doubt: dict[ChunkId, WriteReq] = {}

    # -- chain checks -------------------------------------------------------------------

    def _chain(self, chain_id: int, got: int | None) -> Chain:
        chain = self._chains(chain_id)
        if got is not None and got != chain.version:
            raise ChainVersionMismatch(
                f"chain {chain_id} is at version {chain.version} on target {self.target_id}, request has {got}; "
                "the side that is behind must refresh routing info",
                chain=chain_id, target=self.target_id, expected=chain.version, got=got,
            )  # fmt: skip
        return chain

    def _state(self, chain: Chain) -> PublicState | None:
        return chain.state_of(self.target_id) if self.target_id in chain.target_ids else None

    def _require_state(self, chain: Chain, allowed: tuple[PublicState, ...]) -> PublicState:
        state = self._state(chain)
        if state not in allowed:
            raise NotServing(
                f"target {self.target_id} is {state or 'not a member'} in chain {chain.chain_id} v{chain.version}",
                chain=chain.chain_id, target=self.target_id, state=str(state),
            )  # fmt: skip
        assert state is not None
        return state

    # -- dedupe (3FS ReliableUpdate) ------------------------------------------------------

    def _dedupe_get(self, req: WriteReq) -> WriteAck | None:
        key = (req.client_id, req.channel)
        with self._dedupe_lock:
            entry = self._dedupe.get(key)
            if entry is None:
                return None
            seq, ack = entry
            if req.seq == seq:
                self._dedupe.move_to_end(key)
                return msgspec.structs.replace(ack, duplicate=True)
            if req.seq < seq:
                raise StaleUpdate(
                    f"request seq {req.seq} of client {req.client_id} channel {req.channel} is older than its "
                    f"latest {seq}; a channel carries one request at a time",
                    chunk=req.chunk_id.hex, target=self.target_id, committed=seq, update=req.seq,
                )  # fmt: skip
            return None

    def _dedupe_put(self, req: WriteReq, ack: WriteAck) -> None:
        with self._dedupe_lock:
            self._dedupe[(req.client_id, req.channel)] = (req.seq, ack)
            self._dedupe.move_to_end((req.client_id, req.channel))
            while len(self._dedupe) > self._dedupe_capacity:
                self._dedupe.popitem(last=False)

    # -- client write at the head ---------------------------------------------------------

    def handle_write(self, req: WriteReq, payload: Buffer) -> WriteAck:
        """Apply a client write at the head and replicate it down the chain; returns when
        every write-receiving replica has committed it."""
        if len(payload) != req.length:
            raise BadRequest(f"payload has {len(payload)} bytes, header says {req.length}", length=req.length)
        cid = req.chunk_id
        self._check_head(self._chain(req.chain_id, req.chain_ver), req)
        verify_payload(payload, req.payload_crc, chunk=cid.hex, target=self.target_id, chain=req.chain_id)
        if (hit := self._dedupe_get(req)) is not None:
            return hit
        with self.store.lock(cid):
            chain = self._chain(req.chain_id, req.chain_ver)  # 3FS step 3: re-check under the lock
            self._check_head(chain, req)
            if (hit := self._dedupe_get(req)) is not None:
                return hit
            self._resolve_locked(req.chain_id, cid)
            if (hit := self._dedupe_get(req)) is not None:  # the in-doubt write was this request
                return hit
            meta = self.store.meta(cid)
            u = (meta.committed_ver if meta else 0) + 1
            pw = self.store.prepare_write(
                cid, req.offset, payload, update_ver=u, chain_ver=chain.version,
                chunk_size=req.chunk_size, payload_crc=req.payload_crc,
            )  # fmt: skip
            self._in_doubt[cid] = req
            try:
                chain_ver = self._forward_and_commit(req.chain_id, req, UpdateKind.WRITE, payload, pw)
            except ChecksumMismatch:
                self._in_doubt.pop(cid, None)  # aborted: nothing is in doubt
                raise
            self._in_doubt.pop(cid, None)
            ack = WriteAck(
                chunk_id=cid, target_id=self.target_id, chain_ver=chain_ver, commit_ver=u,
                length=pw.length, crc=pw.crc,
            )  # fmt: skip
            self._dedupe_put(req, ack)
            return ack

    def _check_head(self, chain: Chain, req: WriteReq) -> None:
        if chain.head != self.target_id:
            raise NotHead(
                f"target {self.target_id} is not the head of chain {chain.chain_id} v{chain.version} "
                f"(head: {chain.head}); send writes to the head",
                chain=chain.chain_id, target=self.target_id, head=chain.head, chunk=req.chunk_id.hex,
            )  # fmt: skip

    def in_doubt(self) -> list[ChunkId]:
        """Chunks whose last write at this head gave up forwarding (retry with :meth:`resolve_pending`)."""
        return list(self._in_doubt)

    def resolve_pending(self, chain_id: int, chunk_id: ChunkId) -> bool:
        """Drive a pending version left by a failed forward to commit on the current chain."""
        with self.store.lock(chunk_id):
            chain = self._chain(chain_id, None)
            if chain.head != self.target_id:
                return False
            return self._resolve_locked(chain_id, chunk_id)

    def _resolve_locked(self, chain_id: int, cid: ChunkId) -> bool:
        meta = self.store.meta(cid)
        if meta is None or not meta.pending:
            return False
        pw = PendingWrite(cid, meta.pending_ver, meta.pending_length, meta.pending_crc)
        req = self._in_doubt.get(cid)
        log.info("craq.resolve_pending", target=self.target_id, chunk=str(cid), version=pw.update_ver)
        chain_ver = self._forward_and_commit(chain_id, req, UpdateKind.REPLACE, b"", pw)
        self._in_doubt.pop(cid, None)
        if req is not None:
            self._dedupe_put(
                req,
                WriteAck(
                    chunk_id=cid, target_id=self.target_id, chain_ver=chain_ver, commit_ver=pw.update_ver,
                    length=pw.length, crc=pw.crc,
                ),
            )  # fmt: skip
        return True

    # -- update from the predecessor ------------------------------------------------------

    def handle_update(self, req: UpdateReq, payload: Buffer) -> UpdateAck:
        """Apply an update forwarded by the predecessor, forward it on, commit after the ack."""
        cid = req.chunk_id
        if req.update_ver < 1 or len(payload) != req.length:
            raise BadRequest(
                f"bad update v{req.update_ver} with {len(payload)}/{req.length} payload bytes",
                chunk=cid.hex, update=req.update_ver,
            )  # fmt: skip
        chain = self._chain(req.chain_id, req.chain_ver)
        self._require_state(chain, WRITE_STATES)
        verify_payload(payload, req.payload_crc, chunk=cid.hex, target=self.target_id, chain=req.chain_id)
        with self.store.lock(cid):
            chain = self._chain(req.chain_id, req.chain_ver)
            state = self._require_state(chain, WRITE_STATES)
            force = state is PublicState.SYNCING and req.kind is UpdateKind.REPLACE
            meta = self.store.meta(cid)
            committed = meta.committed_ver if meta else 0
            if meta is not None and req.update_ver <= committed:
                same = req.update_ver == committed and meta.crc == req.expected_crc
                if not force or same:  # already applied (a retry, or overtaken): success (§3 step 4)
                    return UpdateAck(
                        chunk_id=cid, target_id=self.target_id, update_ver=req.update_ver,
                        commit_ver=committed, length=meta.length, crc=meta.crc, stale=True,
                    )  # fmt: skip
            pw = self.store.prepare_write(
                cid, req.offset, payload, update_ver=req.update_ver, chain_ver=chain.version,
                chunk_size=req.chunk_size, payload_crc=req.payload_crc,
                replace=req.kind is UpdateKind.REPLACE, force=force,
            )  # fmt: skip
            if pw.crc != req.expected_crc or pw.length != req.expected_length:
                self.store.abort_pending(cid)
                raise ChecksumMismatch(
                    f"chunk {cid} v{pw.update_ver} on target {self.target_id} would be {pw.length} bytes CRC32C "
                    f"{pw.crc:#010x}, predecessor {req.from_target} has {req.expected_length} bytes "
                    f"{req.expected_crc:#010x}: the replicas diverged",
                    chunk=cid.hex, target=self.target_id, chain=req.chain_id, expected=req.expected_crc,
                    got=pw.crc, what="chunk",
                )  # fmt: skip
            self._forward_and_commit(req.chain_id, req, req.kind, payload, pw)
            return UpdateAck(
                chunk_id=cid, target_id=self.target_id, update_ver=pw.update_ver, commit_ver=pw.update_ver,
                length=pw.length, crc=pw.crc,
            )  # fmt: skip

    # -- forwarding -----------------------------------------------------------------------

    def _forward_and_commit(
        self,
        chain_id: int,
        origin: WriteReq | UpdateReq | None,
        kind: UpdateKind,
        payload: Buffer,
        pw: PendingWrite,
    ) -> int:
        """Forward ``pw`` to the current successor (retrying, following chain changes), then
        commit locally; returns the chain version the commit recorded.  Caller holds the lock."""
        cid = pw.chunk_id
        policy = self.retry
        delay = policy.base_delay_s
        start = self._clock.monotonic()
        attempts = 0
        while True:
            chain = self._chain(chain_id, None)
            self._require_state(chain, WRITE_STATES)
            succ = successor_of(chain, self.target_id)
            if succ is None:  # we are the tail: commit first (§3 step 6)
                self.store.commit(cid, pw.update_ver, chain.version)
                return chain.version
            replace = kind is UpdateKind.REPLACE or chain.state_of(succ) is PublicState.SYNCING
            if replace:
                data: Buffer = self.store.read(cid, allow_uncommitted=True)
                off, plen, pcrc = 0, len(data), pw.crc
            else:
                assert origin is not None
                data, off, plen, pcrc = payload, origin.offset, origin.length, origin.payload_crc
            fwd = UpdateReq(
                chain_id=chain_id, chain_ver=chain.version, chunk_id=cid,
                kind=UpdateKind.REPLACE if replace else UpdateKind.WRITE, offset=off, length=plen,
                chunk_size=max(origin.chunk_size if origin else 0, pw.length, 1), payload_crc=pcrc,
                update_ver=pw.update_ver, expected_crc=pw.crc, expected_length=pw.length, from_target=self.target_id,
                client_id=origin.client_id if origin else "", channel=origin.channel if origin else 0,
                seq=origin.seq if origin else 0,
            )  # fmt: skip
            try:
                ack = self._forward(succ, fwd, data)
            except VersionGap:
                kind = UpdateKind.REPLACE  # the successor missed updates: send the whole chunk
                attempts += 1
                if attempts < policy.max_attempts:
                    continue
                raise
            except ChecksumMismatch as e:
                if e.fields.get("what") != "payload":  # diverged content: fatal for this update
                    self.store.abort_pending(cid)
                    raise
                err: Exception = e
            except _RETRYABLE as e:
                err = e
            else:
                if ack.commit_ver == pw.update_ver and (ack.crc != pw.crc or ack.length != pw.length):
                    self.store.abort_pending(cid)
                    raise ChecksumMismatch(
                        f"successor {succ} committed chunk {cid} v{pw.update_ver} as {ack.length} bytes CRC32C "
                        f"{ack.crc:#010x}, target {self.target_id} has {pw.length} bytes {pw.crc:#010x}",
                        chunk=cid.hex, target=self.target_id, chain=chain_id, expected=pw.crc, got=ack.crc,
                        what="chain",
                    )  # fmt: skip
                self.store.commit(cid, pw.update_ver, chain.version)
                return chain.version
            attempts += 1
            elapsed = self._clock.monotonic() - start
            log.warning(
                "craq.forward_failed", target=self.target_id, successor=succ, chunk=str(cid),
                attempt=attempts, error=repr(err),
            )  # fmt: skip
            if attempts >= policy.max_attempts or elapsed >= policy.deadline_s:
                raise Unavailable(
                    f"forwarding chunk {cid} v{pw.update_ver} from target {self.target_id} to {succ} failed "
                    f"{attempts} times ({err!r}); the write is in doubt, retry it",
                    chunk=cid.hex,
                    target=self.target_id,
                    chain=chain_id,
                    successor=succ,
                    attempts=attempts,
                ) from err
            self._sleep(delay)
            delay = min(delay * 2, policy.max_delay_s)

    # -- reads ----------------------------------------------------------------------------

    def check_read(self, req: ReadReq) -> None:
        """What a read requires before the store is touched: the request's chain version, and
        this target SERVING in it (for readers that fetch bytes themselves, e.g. ``read_for_send``)."""
        chain = self._chain(req.chain_id, req.chain_ver)
        self._require_state(chain, (PublicState.SERVING,))

    def handle_read(self, req: ReadReq) -> tuple[ReadReply, bytes]:
        """Serve a read if this target is SERVING; pending chunks answer :class:`NotCommitted`
        unless ``relaxed`` (then the pending content is returned, marked ``uncommitted``)."""
        self.check_read(req)
        data, version, uncommitted = self.store.read_versioned(
            req.chunk_id, req.offset, req.length, allow_uncommitted=req.relaxed
        )
        reply = ReadReply(
            chunk_id=req.chunk_id, target_id=self.target_id, version=version, length=len(data),
            crc=crc32c(data), uncommitted=uncommitted,
        )  # fmt: skip
        return reply, data
