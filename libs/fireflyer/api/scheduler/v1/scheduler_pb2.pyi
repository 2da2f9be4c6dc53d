from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskSpec(_message.Message):
    __slots__ = ("name", "user", "shared_group", "group", "nodes", "priority", "command", "zone", "task_type", "max_restarts", "grace_ack_s", "grace_final_s", "signal", "min_runtime_s", "watchdog_s", "whole_life_state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    SHARED_GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    GRACE_ACK_S_FIELD_NUMBER: _ClassVar[int]
    GRACE_FINAL_S_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    MIN_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_S_FIELD_NUMBER: _ClassVar[int]
    WHOLE_LIFE_STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    user: str
    shared_group: str
    group: str
    nodes: int
    priority: str
    command: _containers.RepeatedScalarFieldContainer[str]
    zone: str
    task_type: str
    max_restarts: int
    grace_ack_s: float
    grace_final_s: float
    signal: str
    min_runtime_s: float
    watchdog_s: float
    whole_life_state: int
    def __init__(self, name: _Optional[str] = ..., user: _Optional[str] = ..., shared_group: _Optional[str] = ..., group: _Optional[str] = ..., nodes: _Optional[int] = ..., priority: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., zone: _Optional[str] = ..., task_type: _Optional[str] = ..., max_restarts: _Optional[int] = ..., grace_ack_s: _Optional[float] = ..., grace_final_s: _Optional[float] = ..., signal: _Optional[str] = ..., min_runtime_s: _Optional[float] = ..., watchdog_s: _Optional[float] = ..., whole_life_state: _Optional[int] = ...) -> None: ...

class Rank(_message.Message):
    __slots__ = ("rank", "node", "state", "exit_code")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    state: str
    exit_code: int
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ..., state: _Optional[str] = ..., exit_code: _Optional[int] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("id", "chain_id", "restart_count", "whole_life_state", "chain_status", "queue_status", "slurm_state", "priority", "submitted_at", "started_at", "finished_at", "nodes", "stop_code", "stop_reasons", "suspend_code", "ranks", "reason", "reason_code", "held", "spec")
    ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    WHOLE_LIFE_STATE_FIELD_NUMBER: _ClassVar[int]
    CHAIN_STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_STATUS_FIELD_NUMBER: _ClassVar[int]
    SLURM_STATE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STOP_CODE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASONS_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_CODE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    id: int
    chain_id: int
    restart_count: int
    whole_life_state: int
    chain_status: str
    queue_status: str
    slurm_state: str
    priority: str
    submitted_at: float
    started_at: float
    finished_at: float
    nodes: _containers.RepeatedScalarFieldContainer[str]
    stop_code: int
    stop_reasons: _containers.RepeatedScalarFieldContainer[str]
    suspend_code: int
    ranks: _containers.RepeatedCompositeFieldContainer[Rank]
    reason: str
    reason_code: str
    held: bool
    spec: TaskSpec
    def __init__(self, id: _Optional[int] = ..., chain_id: _Optional[int] = ..., restart_count: _Optional[int] = ..., whole_life_state: _Optional[int] = ..., chain_status: _Optional[str] = ..., queue_status: _Optional[str] = ..., slurm_state: _Optional[str] = ..., priority: _Optional[str] = ..., submitted_at: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., nodes: _Optional[_Iterable[str]] = ..., stop_code: _Optional[int] = ..., stop_reasons: _Optional[_Iterable[str]] = ..., suspend_code: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[Rank, _Mapping]]] = ..., reason: _Optional[str] = ..., reason_code: _Optional[str] = ..., held: _Optional[bool] = ..., spec: _Optional[_Union[TaskSpec, _Mapping]] = ...) -> None: ...

class Chain(_message.Message):
    __slots__ = ("chain_id", "user", "name", "runs")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    user: str
    name: str
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    def __init__(self, chain_id: _Optional[int] = ..., user: _Optional[str] = ..., name: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("spec", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSpec
    request_id: str
    def __init__(self, spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class TaskReply(_message.Message):
    __slots__ = ("chain",)
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    chain: Chain
    def __init__(self, chain: _Optional[_Union[Chain, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("user", "include_finished", "limit")
    USER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    user: str
    include_finished: bool
    limit: int
    def __init__(self, user: _Optional[str] = ..., include_finished: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("chains",)
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[Chain]
    def __init__(self, chains: _Optional[_Iterable[_Union[Chain, _Mapping]]] = ...) -> None: ...

class TaskIdRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class UpdatePriorityRequest(_message.Message):
    __slots__ = ("id", "priority")
    ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    id: int
    priority: str
    def __init__(self, id: _Optional[int] = ..., priority: _Optional[str] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("id", "rank", "follow", "restart")
    ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    RESTART_FIELD_NUMBER: _ClassVar[int]
    id: int
    rank: int
    follow: bool
    restart: int
    def __init__(self, id: _Optional[int] = ..., rank: _Optional[int] = ..., follow: _Optional[bool] = ..., restart: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("run_id", "rank", "data")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    rank: int
    data: bytes
    def __init__(self, run_id: _Optional[int] = ..., rank: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "group", "zone", "address", "gpus", "cpus", "state", "reason", "task", "last_seen_at", "lost")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    zone: str
    address: str
    gpus: int
    cpus: int
    state: str
    reason: str
    task: int
    last_seen_at: float
    lost: bool
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., zone: _Optional[str] = ..., address: _Optional[str] = ..., gpus: _Optional[int] = ..., cpus: _Optional[int] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., task: _Optional[int] = ..., last_seen_at: _Optional[float] = ..., lost: _Optional[bool] = ...) -> None: ...

class NodeListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeListReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class SetNodeStateRequest(_message.Message):
    __slots__ = ("name", "state", "reason", "evict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    reason: str
    evict: bool
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., evict: _Optional[bool] = ...) -> None: ...

class NodeReply(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("name", "group", "zone", "address", "gpus", "cpus")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    zone: str
    address: str
    gpus: int
    cpus: int
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., zone: _Optional[str] = ..., address: _Optional[str] = ..., gpus: _Optional[int] = ..., cpus: _Optional[int] = ...) -> None: ...

class RegisterNodeReply(_message.Message):
    __slots__ = ("node", "heartbeat_interval_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    node: Node
    heartbeat_interval_s: float
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ..., heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("task_id", "rank", "node", "state", "exit_code", "suspend_code", "whole_life_state", "stop_code")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_CODE_FIELD_NUMBER: _ClassVar[int]
    WHOLE_LIFE_STATE_FIELD_NUMBER: _ClassVar[int]
    STOP_CODE_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    rank: int
    node: str
    state: str
    exit_code: int
    suspend_code: int
    whole_life_state: int
    stop_code: int
    def __init__(self, task_id: _Optional[int] = ..., rank: _Optional[int] = ..., node: _Optional[str] = ..., state: _Optional[str] = ..., exit_code: _Optional[int] = ..., suspend_code: _Optional[int] = ..., whole_life_state: _Optional[int] = ..., stop_code: _Optional[int] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Quota(_message.Message):
    __slots__ = ("owner", "group", "priority", "max_nodes", "expires_at")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    owner: str
    group: str
    priority: str
    max_nodes: int
    expires_at: float
    def __init__(self, owner: _Optional[str] = ..., group: _Optional[str] = ..., priority: _Optional[str] = ..., max_nodes: _Optional[int] = ..., expires_at: _Optional[float] = ...) -> None: ...

class QuotaGetRequest(_message.Message):
    __slots__ = ("owner",)
    OWNER_FIELD_NUMBER: _ClassVar[int]
    owner: str
    def __init__(self, owner: _Optional[str] = ...) -> None: ...

class QuotaSetRequest(_message.Message):
    __slots__ = ("quota", "remove")
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    quota: Quota
    remove: bool
    def __init__(self, quota: _Optional[_Union[Quota, _Mapping]] = ..., remove: _Optional[bool] = ...) -> None: ...

class QuotaListReply(_message.Message):
    __slots__ = ("quotas",)
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[Quota]
    def __init__(self, quotas: _Optional[_Iterable[_Union[Quota, _Mapping]]] = ...) -> None: ...

class QuotaUse(_message.Message):
    __slots__ = ("owner", "group", "priority", "used", "limit")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    owner: str
    group: str
    priority: str
    used: int
    limit: int
    def __init__(self, owner: _Optional[str] = ..., group: _Optional[str] = ..., priority: _Optional[str] = ..., used: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class QuotaUsedReply(_message.Message):
    __slots__ = ("used",)
    USED_FIELD_NUMBER: _ClassVar[int]
    used: _containers.RepeatedCompositeFieldContainer[QuotaUse]
    def __init__(self, used: _Optional[_Iterable[_Union[QuotaUse, _Mapping]]] = ...) -> None: ...
