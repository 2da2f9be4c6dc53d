from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeLabels(_message.Message):
    __slots__ = ("name", "group", "zone", "cpus", "gpus", "address", "agent_address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    zone: str
    cpus: int
    gpus: int
    address: str
    agent_address: str
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., zone: _Optional[str] = ..., cpus: _Optional[int] = ..., gpus: _Optional[int] = ..., address: _Optional[str] = ..., agent_address: _Optional[str] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("labels", "started_at", "running_tasks")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    labels: NodeLabels
    started_at: float
    running_tasks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, labels: _Optional[_Union[NodeLabels, _Mapping]] = ..., started_at: _Optional[float] = ..., running_tasks: _Optional[_Iterable[str]] = ...) -> None: ...

class Rank(_message.Message):
    __slots__ = ("rank", "local_rank", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    env: _containers.ScalarMap[str, str]
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class HFReduceSpec(_message.Message):
    __slots__ = ("coord_addr", "peers", "listen", "chunk_size", "timeout_s")
    COORD_ADDR_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    LISTEN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    coord_addr: str
    peers: _containers.RepeatedScalarFieldContainer[str]
    listen: str
    chunk_size: str
    timeout_s: float
    def __init__(self, coord_addr: _Optional[str] = ..., peers: _Optional[_Iterable[str]] = ..., listen: _Optional[str] = ..., chunk_size: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class StartTaskRequest(_message.Message):
    __slots__ = ("task_id", "job_id", "command", "cwd", "user", "grace_s", "ranks", "env", "nnodes", "node_rank", "world_size", "restart_count", "master_addr", "master_port", "hfreduce")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    HFREDUCE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    job_id: str
    command: _containers.RepeatedScalarFieldContainer[str]
    cwd: str
    user: str
    grace_s: float
    ranks: _containers.RepeatedCompositeFieldContainer[Rank]
    env: _containers.ScalarMap[str, str]
    nnodes: int
    node_rank: int
    world_size: int
    restart_count: int
    master_addr: str
    master_port: int
    hfreduce: HFReduceSpec
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., cwd: _Optional[str] = ..., user: _Optional[str] = ..., grace_s: _Optional[float] = ..., ranks: _Optional[_Iterable[_Union[Rank, _Mapping]]] = ..., env: _Optional[_Mapping[str, str]] = ..., nnodes: _Optional[int] = ..., node_rank: _Optional[int] = ..., world_size: _Optional[int] = ..., restart_count: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., hfreduce: _Optional[_Union[HFReduceSpec, _Mapping]] = ...) -> None: ...

class RankStatus(_message.Message):
    __slots__ = ("rank", "pid", "state", "has_exit_code", "exit_code", "log")
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    rank: int
    pid: int
    state: str
    has_exit_code: bool
    exit_code: int
    log: str
    def __init__(self, rank: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., log: _Optional[str] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("task_id", "user", "state", "ranks", "suspend_requested", "worker_pid", "worker_restarts", "started_at", "ended_at")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    WORKER_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    user: str
    state: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankStatus]
    suspend_requested: bool
    worker_pid: int
    worker_restarts: int
    started_at: float
    ended_at: float
    def __init__(self, task_id: _Optional[str] = ..., user: _Optional[str] = ..., state: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[RankStatus, _Mapping]]] = ..., suspend_requested: _Optional[bool] = ..., worker_pid: _Optional[int] = ..., worker_restarts: _Optional[int] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ...) -> None: ...

class StartTaskReply(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ...) -> None: ...

class StopTaskRequest(_message.Message):
    __slots__ = ("task_id", "grace_s", "wait")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    grace_s: float
    wait: bool
    def __init__(self, task_id: _Optional[str] = ..., grace_s: _Optional[float] = ..., wait: _Optional[bool] = ...) -> None: ...

class StopTaskReply(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ...) -> None: ...

class SuspendRequest(_message.Message):
    __slots__ = ("task_id", "signal", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    signal: int
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., signal: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SuspendReply(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ...) -> None: ...

class TaskStatusRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class TaskStatusReply(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskInfo
    def __init__(self, task: _Optional[_Union[TaskInfo, _Mapping]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTasksReply(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class TailLogRequest(_message.Message):
    __slots__ = ("task_id", "rank", "offset", "follow")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    rank: int
    offset: int
    follow: bool
    def __init__(self, task_id: _Optional[str] = ..., rank: _Optional[int] = ..., offset: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("offset", "data", "eof")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    eof: bool
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class ValidateRequest(_message.Message):
    __slots__ = ("level", "baseline", "baseline_fraction", "inject", "plan_json", "spec_json")
    class BaselineEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class InjectEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    INJECT_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    level: int
    baseline: _containers.ScalarMap[str, float]
    baseline_fraction: float
    inject: _containers.ScalarMap[str, str]
    plan_json: bytes
    spec_json: bytes
    def __init__(self, level: _Optional[int] = ..., baseline: _Optional[_Mapping[str, float]] = ..., baseline_fraction: _Optional[float] = ..., inject: _Optional[_Mapping[str, str]] = ..., plan_json: _Optional[bytes] = ..., spec_json: _Optional[bytes] = ...) -> None: ...

class ValidateReply(_message.Message):
    __slots__ = ("report_json", "node")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    report_json: bytes
    node: str
    def __init__(self, report_json: _Optional[bytes] = ..., node: _Optional[str] = ...) -> None: ...
