"""The storage data-plane protocol: operations on :mod:`fireflyer.wire` and their headers.

Every storage operation is one wire request (``op`` below) whose ``meta`` is a msgspec
Struct from this module turned into builtins (:func:`to_meta` / :func:`from_meta`), with
bulk bytes in the frame's raw payload, never in the header (DESIGN.md §1).  Every I/O
names the *target* it addresses (a node may host several), the chain and the chain
version the sender believes in; a storage node refuses a version that differs from its
own view (``ChainVersionMismatch``: whoever is behind refreshes routing and retries).
Errors travel back as typed :class:`~fireflyer.core.errors.FireFlyerError` s (the wire
rebuilds the same class), per I/O inside batch replies (:class:`IoResult.error`).

======================  =================  =================================================
op                      sender -> target   meta / payload -> reply
======================  =================  =================================================
``stor.write``          client -> head     :class:`WriteMsg`, payload = data -> ``WriteAck``
``stor.batch_write``    client -> head(s)  :class:`BatchWriteMsg`, payloads concatenated ->
                                           :class:`BatchWriteReply` (one result per I/O)
``stor.update``         pred. -> succ.     :class:`UpdateMsg`, payload = data -> ``UpdateAck``
``stor.read``           client -> replica  :class:`ReadMsg` -> ``ReadReply`` meta + data
                                           (small, single reads; no request-to-send)
``stor.batch_read``     client -> replica  :class:`BatchReadMsg` -> :class:`BatchReadReady`
                                           (statuses and sizes only, no data)
``stor.rts_grant``      client -> replica  :class:`RtsGrant` -> payload = the batch's data
``stor.rts_cancel``     client -> replica  :class:`RtsGrant` -> {} (drop held data)
``stor.report_corrupt`` client -> replica  :class:`CorruptReport` -> {"corrupted": bool}: read
                                           data failed its CRC at the client; the replica
                                           verifies the chunk itself before acting on it
``stor.query_last``     meta -> replica    :class:`QueryLastMsg` -> :class:`LastChunk`
``stor.remove_range``   meta -> head       :class:`RemoveRangeMsg` -> {"removed": n}; the
                                           head forwards it down the chain before replying
``stor.dump_meta``      pred. -> syncing   :class:`TargetMsg` -> payload = msgpack
                                           ``list[ChunkMeta]`` (may exceed a header)
``stor.sync_replace``   pred. -> syncing   :class:`SyncReplaceMsg`, payload = whole chunk
``stor.sync_remove``    pred. -> syncing   :class:`SyncRemoveMsg`
``stor.sync_done``      pred. -> syncing   :class:`SyncDoneMsg`: the target reports
                                           up-to-date at its next heartbeat
``stor.space``          anyone -> node     {} -> :class:`SpaceReply`
======================  =================  =================================================

**Request-to-send (reads).**  3FS servers ask the client for a transmission token before
they RDMA-write read data, so a client reading from hundreds of servers never has more
than ``max_concurrent_transmission`` of them sending at once (incast control,
research/3fs.md §3).  On the wire that is two requests:

1. ``stor.batch_read``: the server prepares the batch and answers only
   :class:`BatchReadReady` — per-I/O status, lengths, versions, CRCs and a transfer id
   ``xfer``; the data stays on the server (bounded, expiring after ``rts_hold_s``, so a
   client that vanishes costs nothing for long): partial reads in memory with the CRC of
   their range, whole-chunk reads as the open version file with the CRC recorded at write
   time (sent with ``sendfile``; :mod:`~fireflyer.storage.chunkread`).  The client checks
   every I/O's bytes against its CRC; a mismatch is retried on another replica and
   reported to this one (``stor.report_corrupt``);
2. the client takes a send token from its :class:`~fireflyer.storage.client_min.SendLimiter`
   (default 64 in all, 8 per server), sends ``stor.rts_grant {xfer}`` and receives the
   data as the reply's payload straight into its buffer; it returns the token when the
   payload has landed.

So no byte of read data leaves a server that the client has not granted, and a client
never has more granted (sending) servers than it has tokens.  A client may also take the
token *first* and send ``stor.batch_read`` with ``send=True`` (its batches of one I/O do):
the grant is then implied, and the data is the payload of the ``BatchReadReady`` reply.  A batch whose I/Os all
failed or are empty has ``xfer == 0`` and needs no grant.

Writes need no token: the client is the sender and paces itself.  Batches are bounded
by :class:`BatchLimits` (default 128 I/Os or 4 MiB of payload) on both sides; a larger
batch is refused whole (``BadRequest``), nothing applied.

**Authorization.**  Client chunk ops (write, batch_write, read, batch_read, query_last,
report_corrupt and local reads) need the ``user`` role *and* a capability from meta
covering each chunk's inode, index and access (``caps``; :mod:`.capability`), unless
the caller has role ``service``.  Chain-internal and maintenance
ops (update, dump_meta, sync_*, remove_range) need ``service``: storage nodes and meta send
them with their own service credential (``FF_TOKEN`` from ``ff up``).  Whom a token is sent
to at all: :func:`trusted_peer`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from fireflyer.bus import subjects
from fireflyer.bus.events import Event
from fireflyer.core.errors import FireFlyerError, error_from_dict
from fireflyer.core.netaddr import split_address  # re-exported: storage callers import it from here

from .chunkid import ChunkId
from .craq import ReadReply, ReadReq, UpdateAck, UpdateReq, WriteAck, WriteReq
from .errors import BadRequest

__all__ = [
    "OP_WRITE",
    "OP_BATCH_WRITE",
    "OP_UPDATE",
    "OP_READ",
    "OP_BATCH_READ",
    "OP_RTS_GRANT",
    "OP_RTS_CANCEL",
    "OP_QUERY_LAST",
    "OP_REMOVE_RANGE",
    "OP_DUMP_META",
    "OP_SYNC_REPLACE",
    "OP_SYNC_REMOVE",
    "OP_SYNC_DONE",
    "OP_SPACE",
    "OP_REPORT_CORRUPT",
    "CorruptReport",
    "CLIENT_OPS",
    "BatchLimits",
    "WriteMsg",
    "BatchWriteMsg",
    "BatchWriteReply",
    "UpdateMsg",
    "ReadMsg",
    "BatchReadMsg",
    "IoResult",
    "BatchReadReady",
    "RtsGrant",
    "QueryLastMsg",
    "LastChunk",
    "RemoveRangeMsg",
    "TargetMsg",
    "SyncReplaceMsg",
    "SyncRemoveMsg",
    "SyncDoneMsg",
    "TargetSpace",
    "SpaceReply",
    "ChunkCorruptedEvent",
    "corrupted_subject",
    "WIRE_TAG",
    "wire_tag",
    "wire_address",
    "trusted_peer",
    "split_address",
    "to_meta",
    "from_meta",
    "error_of",
    "raise_if_error",
    "WriteAck",
    "UpdateAck",
    "ReadReply",
]

OP_WRITE = "stor.write"
OP_BATCH_WRITE = "stor.batch_write"
OP_UPDATE = "stor.update"
OP_READ = "stor.read"
OP_BATCH_READ = "stor.batch_read"
OP_RTS_GRANT = "stor.rts_grant"
OP_RTS_CANCEL = "stor.rts_cancel"
OP_QUERY_LAST = "stor.query_last"
OP_REMOVE_RANGE = "stor.remove_range"
OP_DUMP_META = "stor.dump_meta"
OP_SYNC_REPLACE = "stor.sync_replace"
OP_SYNC_REMOVE = "stor.sync_remove"
OP_SYNC_DONE = "stor.sync_done"
OP_SPACE = "stor.space"
OP_REPORT_CORRUPT = "stor.report_corrupt"

#: ops any user may call; everything else needs the admin role
CLIENT_OPS = frozenset({OP_WRITE, OP_BATCH_WRITE, OP_READ, OP_BATCH_READ, OP_RTS_GRANT, OP_RTS_CANCEL, OP_SPACE,
                        OP_QUERY_LAST, OP_REPORT_CORRUPT})

T = TypeVar("T")


class BatchLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Largest batch (3FS client traffic control: 128 I/Os or 4 MiB per batch)."""

    max_ios: int = 128
    max_bytes: int = 4 << 20

    def check(self, ios: int, nbytes: int, what: str) -> None:
        if ios < 1 or ios > self.max_ios or nbytes > self.max_bytes:
            raise BadRequest(
                f"{what} batch of {ios} I/Os / {nbytes} bytes is outside the limits "
                f"(1..{self.max_ios} I/Os, <= {self.max_bytes} bytes); split it",
                ios=ios, bytes=nbytes, max_ios=self.max_ios, max_bytes=self.max_bytes,
            )  # fmt: skip


class WriteMsg(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    target: int  # the head the client believes in
    req: WriteReq
    #: encoded capabilities (:mod:`.capability`) of a lone ``stor.write``; in a batch they
    #: travel once in :attr:`BatchWriteMsg.caps`
    caps: list[bytes] = []


class BatchWriteMsg(msgspec.Struct, frozen=True, kw_only=True):
    """Writes to chains whose heads live on this node; payloads follow in ``ios`` order."""

    ios: list[WriteMsg]
    #: capabilities covering every I/O's chunk (one per inode)
    caps: list[bytes] = []


class IoResult(msgspec.Struct, frozen=True, kw_only=True):
    """One I/O of a batch: ``error`` (``FireFlyerError.to_dict``) or the fields of its success."""

    error: dict[str, Any] | None = None
    length: int = 0
    version: int = 0
    crc: int = 0
    target: int = 0
    uncommitted: bool = False
    duplicate: bool = False


class BatchWriteReply(msgspec.Struct, frozen=True, kw_only=True):
    results: list[IoResult]


class UpdateMsg(msgspec.Struct, frozen=True, kw_only=True):
    target: int  # the successor addressed
    req: UpdateReq


class ReadMsg(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    target: int
    req: ReadReq
    #: capabilities of a lone ``stor.read``; a batch carries them in :attr:`BatchReadMsg.caps`
    caps: list[bytes] = []


class BatchReadMsg(msgspec.Struct, frozen=True, kw_only=True):
    ios: list[ReadMsg]
    #: the client already holds a send token for this server: send the data with the reply
    #: (``xfer`` 0) instead of holding it for a grant.  One round trip less per batch; a server
    #: that does not know the field answers as always and the client grants as always.
    send: bool = False
    #: capabilities covering every I/O's chunk (one per inode)
    caps: list[bytes] = []


class BatchReadReady(msgspec.Struct, frozen=True, kw_only=True):
    """Phase 1 of a batch read: statuses; the data (``total`` bytes) waits for ``stor.rts_grant``."""

    xfer: int  # 0: nothing to send
    total: int
    results: list[IoResult]


class RtsGrant(msgspec.Struct, frozen=True, kw_only=True):
    xfer: int


class CorruptReport(msgspec.Struct, frozen=True, kw_only=True):
    """A client received bytes of ``chunk_id`` from ``target`` that failed their CRC32C."""

    target: int
    chunk_id: ChunkId
    version: int = 0
    caps: list[bytes] = []


class QueryLastMsg(msgspec.Struct, frozen=True, kw_only=True):
    target: int
    chain_id: int
    chain_ver: int
    inode: int
    track: int | None = None
    caps: list[bytes] = []


class LastChunk(msgspec.Struct, frozen=True, kw_only=True):
    chunk_id: ChunkId | None = None
    length: int = 0


class RemoveRangeMsg(msgspec.Struct, frozen=True, kw_only=True):
    target: int
    chain_id: int
    chain_ver: int
    begin: ChunkId
    end: ChunkId


class TargetMsg(msgspec.Struct, frozen=True, kw_only=True):
    target: int
    chain_id: int
    chain_ver: int


class SyncReplaceMsg(msgspec.Struct, frozen=True, kw_only=True):
    target: int
    chain_id: int
    chain_ver: int
    chunk_id: ChunkId
    version: int  # the chunk's committed version at the predecessor
    chunk_chain_ver: int  # the chain version of that commit
    crc: int  # CRC32C of the payload (the whole chunk)


class SyncRemoveMsg(msgspec.Struct, frozen=True, kw_only=True):
    target: int
    chain_id: int
    chain_ver: int
    chunk_id: ChunkId


class SyncDoneMsg(msgspec.Struct, frozen=True, kw_only=True):
    target: int
    chain_id: int
    chain_ver: int
    sent: int = 0
    removed: int = 0


class TargetSpace(msgspec.Struct, frozen=True, kw_only=True):
    target: int
    chunks: int
    used_bytes: int
    free_bytes: int
    total_bytes: int
    corrupted: list[str] = []  # hex ids of chunks found corrupted and not yet repaired
    corrupt_reports: int = 0  # corruptions this target found since the process started


class SpaceReply(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    targets: list[TargetSpace]
    #: request-to-send observability: grants served, and the most in flight at once (counted
    #: until the server's send returns, so it may briefly overlap a client's next grant)
    grants_served: int = 0
    max_inflight_grants: int = 0
    #: short-circuit local read batches served (descriptors handed out; also counted in
    #: ``grants_served``: both are batches of read data this node released)
    local_served: int = 0


class ChunkCorruptedEvent(Event, tag="storage.chunk_corrupted.v1"):
    """A storage node found a chunk copy whose bytes fail their recorded CRC32C.

    Published on :func:`corrupted_subject`; the node also stops reading that copy, and
    (``repair_corrupt``) asks mgmtd to take the target out of service so resync replaces it.
    """

    node_id: str
    target: int
    chain_id: int
    chunk: str  # hex id
    message: str = ""


def corrupted_subject(target: int | None = None) -> str:
    """``ff.storage.v1.target.<id>.corrupted``; ``None``: the pattern for every target."""
    if target is None:
        return subjects.pattern("storage", entity="target", event="corrupted")
    return subjects.subject("storage", "target", target, "corrupted")


#: a storage node advertises its data-plane address in its heartbeat tags as ``wire=host:port``
WIRE_TAG = "wire="


def wire_tag(address: str) -> str:
    return f"{WIRE_TAG}{address}"


def wire_address(tags: tuple[str, ...] | list[str]) -> str | None:
    """The ``host:port`` a storage node's heartbeat tags advertise, or None."""
    for t in tags:
        if t.startswith(WIRE_TAG):
            return t[len(WIRE_TAG) :]
    return None


def trusted_peer(node: Any) -> bool:
    """Whether a storage client or node may send its token to ``node`` (a routing NodeInfo).

    **Whom a token goes to.**  Every data-plane connection opens with a hello carrying the
    caller's bearer token, so the question is which peers are trusted with it.  The answer is
    mgmtd's routing, and only the part of it that a service proved:

    - clients and storage nodes learn peers only from mgmtd (GetRoutingInfo over gRPC, to an
      address they were configured with, never one a peer handed them);
    - mgmtd registers a node only on a Heartbeat carrying a ``service``-role credential
      (users and admins are refused), records that credential's user as the node's ``owner``,
      and lets no other service user heartbeat as that node or claim its targets
      (:func:`fireflyer.mgmt.registry.check_owner`);
    - so a peer is trusted when routing lists it as a ``storage`` node with an owner: its
      address and ``wire=`` / ``local=`` tags came from a process holding a service
      credential.  A node without an owner (stored before owners existed) is skipped until its
      next heartbeat gives it one; a node of another kind (meta, an agent) never gets a
      storage op.

    A storage node talks to its peers with its own service credential (``FF_TOKEN`` from
    ``ff up``), never with a caller's token.  What this does not cover is a process that takes
    over a dead node's port before mgmtd fails the node; in a deployment that matters, TLS
    with service certificates closes it (out of scope for the local cluster).
    """
    return str(getattr(node, "type", "")) == "storage" and bool(getattr(node, "owner", ""))


def to_meta(msg: msgspec.Struct) -> dict[str, Any]:
    """A header struct as the wire's ``meta`` dict (bytes stay bytes: the header is msgpack)."""
    out = msgspec.to_builtins(msg, builtin_types=(bytes,))
    assert isinstance(out, dict)
    return out


def from_meta(meta: dict[str, Any], tp: type[T]) -> T:
    """Decode a ``meta`` dict; a malformed one is the sender's fault (``BadRequest``)."""
    try:
        return msgspec.convert(meta, tp)
    except msgspec.ValidationError as e:
        raise BadRequest(f"malformed {tp.__name__} header: {e}", type=tp.__name__) from None
    except FireFlyerError:
        raise  # e.g. a ChunkId out of range, raised by its own validation


def error_of(result: IoResult) -> FireFlyerError | None:
    """The typed error of one batch result, or None."""
    return None if result.error is None else error_from_dict(result.error)


def raise_if_error(result: IoResult) -> IoResult:
    err = error_of(result)
    if err is not None:
        raise err
    return result
