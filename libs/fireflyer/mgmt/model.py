"""Records of the 3FS cluster manager (mgmtd): nodes, targets, chains, chain tables, the lease.

These are the values mgmtd stores in the KV (msgpack) and sends in routing info and
events, so every one is a frozen, keyword-only msgspec Struct with only plain fields
(no behaviour that depends on a process).  Enum values are the lower-case names 3FS
prints (``up-to-date``, ``lastsrv``), so records read well as JSON too.

Identifiers: nodes are named by strings (``"storage-1"``, ``"n3"``, the same names the
NATS subjects carry); targets, chains and chain tables by integers, as in 3FS, where a
chain table lists chain ids and a file layout stores indexes into it
(research/3fs.md §2 "File layout", §3 "Chain table").
"""

from __future__ import annotations

import enum

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = [
    "LocalState",
    "PublicState",
    "NodeType",
    "NodeStatus",
    "NodeInfo",
    "TargetInfo",
    "ChainTarget",
    "Chain",
    "ChainTable",
    "RoutingInfo",
    "LeaseRecord",
    "NodeId",
    "TargetId",
    "ChainId",
]

NodeId = str
TargetId = int
ChainId = int


class LocalState(enum.StrEnum):
    """What a storage service says about one of its targets (research/3fs.md §3).

    Known only to the service and mgmtd's memory; it is the *trigger* of a chain update.
    """

    #: alive and holding all committed data (a serving target, or a syncing one whose resync finished)
    UPTODATE = "up-to-date"
    #: alive, but its data is not known to be current (syncing or waiting)
    ONLINE = "online"
    #: service down (missed heartbeats) or storage medium failure
    OFFLINE = "offline"


class PublicState(enum.StrEnum):
    """A target's state in the chain table, distributed to services and clients (research/3fs.md §3)."""

    SERVING = "serving"  # reads and writes
    SYNCING = "syncing"  # writes only: recovering from its predecessor
    WAITING = "waiting"  # alive, recovery not started
    LASTSRV = "lastsrv"  # down, and it was the last serving replica: the chain waits for it
    OFFLINE = "offline"  # down or medium failure


class NodeType(enum.StrEnum):
    MGMTD = "mgmtd"
    META = "meta"
    STORAGE = "storage"
    NODE_AGENT = "node-agent"
    CLIENT = "client"


class NodeStatus(enum.StrEnum):
    """A node's standing in the registry.

    3FS marks a node ``HEARTBEAT_FAILED`` after ``heartbeat_fail_interval`` (research/3fs.md §1);
    ``DISABLED`` is an operator's decision and is never changed by heartbeats or scans.
    """

    ALIVE = "alive"
    HEARTBEAT_FAILED = "heartbeat-failed"
    DISABLED = "disabled"


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One service instance known to mgmtd (3FS's ``NODE`` records)."""

    node_id: NodeId
    type: NodeType
    address: str  # host:port of its gRPC endpoint
    hostname: str = ""
    status: NodeStatus = NodeStatus.ALIVE
    #: wall-clock seconds of the last heartbeat mgmtd accepted from it
    last_heartbeat: float = 0.0
    #: when it (re)joined: first heartbeat, or first heartbeat after a failure
    registered_at: float = 0.0
    tags: tuple[str, ...] = ()
    #: the service user whose credential registered it (``fireflyer.mgmt.registry``): only that
    #: user may heartbeat as this node, and clients send tokens only to nodes that have one
    owner: str = ""


class TargetInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One storage target (an SSD slot) as routing info shows it (3FS's ``TGIF`` records).

    ``public_state`` mirrors the target's entry in its chain; ``local_state`` is the last
    state its storage node reported (or OFFLINE once the node missed heartbeats).
    """

    target_id: TargetId
    node_id: NodeId
    chain_id: ChainId
    local_state: LocalState = LocalState.OFFLINE
    public_state: PublicState = PublicState.OFFLINE
    disk: str = ""  # device or disk index on the node
    path: str = ""  # the target's directory


class ChainTarget(msgspec.Struct, frozen=True, kw_only=True):
    target_id: TargetId
    public_state: PublicState


class Chain(msgspec.Struct, frozen=True, kw_only=True):
    """A CRAQ chain: targets ordered head..tail, and a version bumped on every change.

    Clients send writes to the head and carry ``version``; storage rejects a request with
    another version (research/3fs.md §3 "Write path"), which is why any change of states
    or order must bump it.
    """

    chain_id: ChainId
    version: int
    targets: tuple[ChainTarget, ...]

    def __post_init__(self) -> None:
        ids = [t.target_id for t in self.targets]
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"chain {self.chain_id} lists a target twice: {ids}", chain=self.chain_id)
        if self.version < 0:
            raise InvalidArgument(
                f"chain {self.chain_id} has a negative version {self.version}", chain=self.chain_id
            )

    @property
    def target_ids(self) -> tuple[TargetId, ...]:
        return tuple(t.target_id for t in self.targets)

    @property
    def states(self) -> tuple[PublicState, ...]:
        return tuple(t.public_state for t in self.targets)

    def serving(self) -> tuple[TargetId, ...]:
        """Targets that may serve reads, in chain order."""
        return tuple(t.target_id for t in self.targets if t.public_state is PublicState.SERVING)

    @property
    def head(self) -> TargetId | None:
        """The target that takes client writes: the first serving one (None: chain unavailable)."""
        s = self.serving()
        return s[0] if s else None

    def state_of(self, target_id: TargetId) -> PublicState:
        for t in self.targets:
            if t.target_id == target_id:
                return t.public_state
        raise KeyError(target_id)


class ChainTable(msgspec.Struct, frozen=True, kw_only=True):
    """An ordered set of chains that file layouts index into (3FS's ``CHIT`` records).

    A chain's own state changes do not change the table; ``version`` moves only when the
    list of chains does (an admin upload), because file layouts store (table id, version).
    """

    table_id: int
    version: int
    chain_ids: tuple[ChainId, ...]
    desc: str = ""


class RoutingInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Everything clients and services pull from mgmtd; ``version`` rises on every change.

    3FS clients and services pull it every 10 s (research/3fs.md §1), comparing versions.
    Collections are tuples sorted by id so equal content encodes to equal bytes.
    """

    version: int
    nodes: tuple[NodeInfo, ...] = ()
    targets: tuple[TargetInfo, ...] = ()
    chains: tuple[Chain, ...] = ()
    chain_tables: tuple[ChainTable, ...] = ()


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The primary-mgmtd lease, one record in the KV, rewritten in a transaction on every renewal.

    Times are the holder's wall clock (seconds since the epoch); other replicas compare
    them with their own clock, so the rules in :mod:`fireflyer.mgmt.lease` leave a skew margin.
    ``term`` rises by one on every change of holder (and when a holder re-acquires a lease
    it let lapse), so anything the primary writes can be fenced by term.
    """

    holder: NodeId
    address: str
    term: int
    acquired_at: float
    renewed_at: float
    expires_at: float
