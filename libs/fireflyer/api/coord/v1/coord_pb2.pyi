from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CommState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMM_STATE_UNSPECIFIED: _ClassVar[CommState]
    COMM_STATE_FORMING: _ClassVar[CommState]
    COMM_STATE_ACTIVE: _ClassVar[CommState]
    COMM_STATE_ABORTED: _ClassVar[CommState]
    COMM_STATE_ENDED: _ClassVar[CommState]
COMM_STATE_UNSPECIFIED: CommState
COMM_STATE_FORMING: CommState
COMM_STATE_ACTIVE: CommState
COMM_STATE_ABORTED: CommState
COMM_STATE_ENDED: CommState

class JoinRequest(_message.Message):
    __slots__ = ("job", "name", "node", "zone", "local_world_size", "address", "nnodes", "world_size", "restart_count", "timeout_s", "expected_nodes")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NODES_FIELD_NUMBER: _ClassVar[int]
    job: str
    name: str
    node: str
    zone: str
    local_world_size: int
    address: str
    nnodes: int
    world_size: int
    restart_count: int
    timeout_s: float
    expected_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[str] = ..., name: _Optional[str] = ..., node: _Optional[str] = ..., zone: _Optional[str] = ..., local_world_size: _Optional[int] = ..., address: _Optional[str] = ..., nnodes: _Optional[int] = ..., world_size: _Optional[int] = ..., restart_count: _Optional[int] = ..., timeout_s: _Optional[float] = ..., expected_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node", "zone", "node_rank", "local_world_size", "first_rank", "address", "left", "last_seen_age_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    FIRST_RANK_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    zone: str
    node_rank: int
    local_world_size: int
    first_rank: int
    address: str
    left: bool
    last_seen_age_s: float
    def __init__(self, node: _Optional[str] = ..., zone: _Optional[str] = ..., node_rank: _Optional[int] = ..., local_world_size: _Optional[int] = ..., first_rank: _Optional[int] = ..., address: _Optional[str] = ..., left: _Optional[bool] = ..., last_seen_age_s: _Optional[float] = ...) -> None: ...

class TreeLinks(_message.Message):
    __slots__ = ("parent", "parent_address", "children", "child_addresses", "root", "depth")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    PARENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    CHILD_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    parent: int
    parent_address: str
    children: _containers.RepeatedScalarFieldContainer[int]
    child_addresses: _containers.RepeatedScalarFieldContainer[str]
    root: int
    depth: int
    def __init__(self, parent: _Optional[int] = ..., parent_address: _Optional[str] = ..., children: _Optional[_Iterable[int]] = ..., child_addresses: _Optional[_Iterable[str]] = ..., root: _Optional[int] = ..., depth: _Optional[int] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("comm", "generation", "node_rank", "first_rank", "world_size", "nodes", "trees", "heartbeat_interval_s", "heartbeat_misses", "cross_zone_pairs", "aborted_subject")
    COMM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    FIRST_RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TREES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MISSES_FIELD_NUMBER: _ClassVar[int]
    CROSS_ZONE_PAIRS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    comm: str
    generation: int
    node_rank: int
    first_rank: int
    world_size: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    trees: _containers.RepeatedCompositeFieldContainer[TreeLinks]
    heartbeat_interval_s: float
    heartbeat_misses: int
    cross_zone_pairs: int
    aborted_subject: str
    def __init__(self, comm: _Optional[str] = ..., generation: _Optional[int] = ..., node_rank: _Optional[int] = ..., first_rank: _Optional[int] = ..., world_size: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., trees: _Optional[_Iterable[_Union[TreeLinks, _Mapping]]] = ..., heartbeat_interval_s: _Optional[float] = ..., heartbeat_misses: _Optional[int] = ..., cross_zone_pairs: _Optional[int] = ..., aborted_subject: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("comm", "generation", "node")
    COMM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    comm: str
    generation: int
    node: str
    def __init__(self, comm: _Optional[str] = ..., generation: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("state", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: CommState
    reason: str
    def __init__(self, state: _Optional[_Union[CommState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("comm", "generation", "node")
    COMM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    comm: str
    generation: int
    node: str
    def __init__(self, comm: _Optional[str] = ..., generation: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: CommState
    def __init__(self, state: _Optional[_Union[CommState, str]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("comm", "generation", "node", "reason")
    COMM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    comm: str
    generation: int
    node: str
    reason: str
    def __init__(self, comm: _Optional[str] = ..., generation: _Optional[int] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortReply(_message.Message):
    __slots__ = ("state", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: CommState
    reason: str
    def __init__(self, state: _Optional[_Union[CommState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class Communicator(_message.Message):
    __slots__ = ("comm", "job", "name", "generation", "state", "reason", "culprit", "nnodes", "world_size", "restart_count", "nodes", "created_at", "formed_at", "ended_at", "depth", "cross_zone_pairs")
    COMM_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CULPRIT_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FORMED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    CROSS_ZONE_PAIRS_FIELD_NUMBER: _ClassVar[int]
    comm: str
    job: str
    name: str
    generation: int
    state: CommState
    reason: str
    culprit: str
    nnodes: int
    world_size: int
    restart_count: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    created_at: float
    formed_at: float
    ended_at: float
    depth: int
    cross_zone_pairs: int
    def __init__(self, comm: _Optional[str] = ..., job: _Optional[str] = ..., name: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[CommState, str]] = ..., reason: _Optional[str] = ..., culprit: _Optional[str] = ..., nnodes: _Optional[int] = ..., world_size: _Optional[int] = ..., restart_count: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., created_at: _Optional[float] = ..., formed_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., depth: _Optional[int] = ..., cross_zone_pairs: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("comm",)
    COMM_FIELD_NUMBER: _ClassVar[int]
    comm: str
    def __init__(self, comm: _Optional[str] = ...) -> None: ...

class GetReply(_message.Message):
    __slots__ = ("comm",)
    COMM_FIELD_NUMBER: _ClassVar[int]
    comm: Communicator
    def __init__(self, comm: _Optional[_Union[Communicator, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("comms",)
    COMMS_FIELD_NUMBER: _ClassVar[int]
    comms: _containers.RepeatedCompositeFieldContainer[Communicator]
    def __init__(self, comms: _Optional[_Iterable[_Union[Communicator, _Mapping]]] = ...) -> None: ...

class GetOpStatsRequest(_message.Message):
    __slots__ = ("comm", "last")
    COMM_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    comm: str
    last: int
    def __init__(self, comm: _Optional[str] = ..., last: _Optional[int] = ...) -> None: ...

class NodeOpStats(_message.Message):
    __slots__ = ("node_rank", "node", "ops", "arrival_lag_mean_s", "arrival_lag_max_s", "local_reduce_mean_s", "tree_mean_s", "writeback_mean_s", "last_arrivals")
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_LAG_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_LAG_MAX_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_REDUCE_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    TREE_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    WRITEBACK_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    LAST_ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    node_rank: int
    node: str
    ops: int
    arrival_lag_mean_s: float
    arrival_lag_max_s: float
    local_reduce_mean_s: float
    tree_mean_s: float
    writeback_mean_s: float
    last_arrivals: int
    def __init__(self, node_rank: _Optional[int] = ..., node: _Optional[str] = ..., ops: _Optional[int] = ..., arrival_lag_mean_s: _Optional[float] = ..., arrival_lag_max_s: _Optional[float] = ..., local_reduce_mean_s: _Optional[float] = ..., tree_mean_s: _Optional[float] = ..., writeback_mean_s: _Optional[float] = ..., last_arrivals: _Optional[int] = ...) -> None: ...

class EdgeStats(_message.Message):
    __slots__ = ("src", "dst", "ops", "transfer_mean_s", "transfer_max_s", "bytes_sent")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_MAX_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    src: int
    dst: int
    ops: int
    transfer_mean_s: float
    transfer_max_s: float
    bytes_sent: int
    def __init__(self, src: _Optional[int] = ..., dst: _Optional[int] = ..., ops: _Optional[int] = ..., transfer_mean_s: _Optional[float] = ..., transfer_max_s: _Optional[float] = ..., bytes_sent: _Optional[int] = ...) -> None: ...

class OpSummary(_message.Message):
    __slots__ = ("generation", "seq", "kind", "nbytes", "nodes_reported", "span_s", "last_node", "max_lag_s", "error")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    NODES_REPORTED_FIELD_NUMBER: _ClassVar[int]
    SPAN_S_FIELD_NUMBER: _ClassVar[int]
    LAST_NODE_FIELD_NUMBER: _ClassVar[int]
    MAX_LAG_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    generation: int
    seq: int
    kind: str
    nbytes: int
    nodes_reported: int
    span_s: float
    last_node: int
    max_lag_s: float
    error: str
    def __init__(self, generation: _Optional[int] = ..., seq: _Optional[int] = ..., kind: _Optional[str] = ..., nbytes: _Optional[int] = ..., nodes_reported: _Optional[int] = ..., span_s: _Optional[float] = ..., last_node: _Optional[int] = ..., max_lag_s: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class GetOpStatsReply(_message.Message):
    __slots__ = ("comm", "ops", "nodes", "edges", "recent", "dropped")
    COMM_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    comm: str
    ops: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeOpStats]
    edges: _containers.RepeatedCompositeFieldContainer[EdgeStats]
    recent: _containers.RepeatedCompositeFieldContainer[OpSummary]
    dropped: int
    def __init__(self, comm: _Optional[str] = ..., ops: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeOpStats, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[EdgeStats, _Mapping]]] = ..., recent: _Optional[_Iterable[_Union[OpSummary, _Mapping]]] = ..., dropped: _Optional[int] = ...) -> None: ...
