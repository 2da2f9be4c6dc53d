from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeHealth(_message.Message):
    __slots__ = ("name", "state", "reason", "since", "drained", "pending_level", "incident", "validation", "last_passed")
    class LastPassedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    PENDING_LEVEL_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    LAST_PASSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    reason: str
    since: float
    drained: bool
    pending_level: int
    incident: str
    validation: str
    last_passed: _containers.ScalarMap[int, float]
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., drained: _Optional[bool] = ..., pending_level: _Optional[int] = ..., incident: _Optional[str] = ..., validation: _Optional[str] = ..., last_passed: _Optional[_Mapping[int, float]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeHealth]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeHealth, _Mapping]]] = ...) -> None: ...

class CheckResult(_message.Message):
    __slots__ = ("check", "status", "summary", "evidence_json", "duration_s", "injected")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    INJECTED_FIELD_NUMBER: _ClassVar[int]
    check: str
    status: str
    summary: str
    evidence_json: str
    duration_s: float
    injected: str
    def __init__(self, check: _Optional[str] = ..., status: _Optional[str] = ..., summary: _Optional[str] = ..., evidence_json: _Optional[str] = ..., duration_s: _Optional[float] = ..., injected: _Optional[str] = ...) -> None: ...

class Validation(_message.Message):
    __slots__ = ("id", "node", "level", "trigger", "started_at", "finished_at", "status", "results", "not_run", "inject", "error", "requested_by")
    class NotRunEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class InjectEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    NOT_RUN_FIELD_NUMBER: _ClassVar[int]
    INJECT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    node: str
    level: int
    trigger: str
    started_at: float
    finished_at: float
    status: str
    results: _containers.RepeatedCompositeFieldContainer[CheckResult]
    not_run: _containers.ScalarMap[str, str]
    inject: _containers.ScalarMap[str, str]
    error: str
    requested_by: str
    def __init__(self, id: _Optional[str] = ..., node: _Optional[str] = ..., level: _Optional[int] = ..., trigger: _Optional[str] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., status: _Optional[str] = ..., results: _Optional[_Iterable[_Union[CheckResult, _Mapping]]] = ..., not_run: _Optional[_Mapping[str, str]] = ..., inject: _Optional[_Mapping[str, str]] = ..., error: _Optional[str] = ..., requested_by: _Optional[str] = ...) -> None: ...

class ValidateRequest(_message.Message):
    __slots__ = ("node", "level", "inject")
    class InjectEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    INJECT_FIELD_NUMBER: _ClassVar[int]
    node: str
    level: int
    inject: _containers.ScalarMap[str, str]
    def __init__(self, node: _Optional[str] = ..., level: _Optional[int] = ..., inject: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ValidateReply(_message.Message):
    __slots__ = ("validation", "node")
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    validation: Validation
    node: NodeHealth
    def __init__(self, validation: _Optional[_Union[Validation, _Mapping]] = ..., node: _Optional[_Union[NodeHealth, _Mapping]] = ...) -> None: ...

class Incident(_message.Message):
    __slots__ = ("id", "at", "kind", "blame", "node", "link", "summary", "evidence_json", "task", "job", "reporter", "actions")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    id: str
    at: float
    kind: str
    blame: str
    node: str
    link: str
    summary: str
    evidence_json: str
    task: int
    job: str
    reporter: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., at: _Optional[float] = ..., kind: _Optional[str] = ..., blame: _Optional[str] = ..., node: _Optional[str] = ..., link: _Optional[str] = ..., summary: _Optional[str] = ..., evidence_json: _Optional[str] = ..., task: _Optional[int] = ..., job: _Optional[str] = ..., reporter: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ...) -> None: ...

class ListIncidentsRequest(_message.Message):
    __slots__ = ("node", "limit")
    NODE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    node: str
    limit: int
    def __init__(self, node: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListIncidentsReply(_message.Message):
    __slots__ = ("incidents",)
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[Incident]
    def __init__(self, incidents: _Optional[_Iterable[_Union[Incident, _Mapping]]] = ...) -> None: ...

class GetIncidentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ReportIncidentRequest(_message.Message):
    __slots__ = ("incident",)
    INCIDENT_FIELD_NUMBER: _ClassVar[int]
    incident: Incident
    def __init__(self, incident: _Optional[_Union[Incident, _Mapping]] = ...) -> None: ...

class IncidentReply(_message.Message):
    __slots__ = ("incident",)
    INCIDENT_FIELD_NUMBER: _ClassVar[int]
    incident: Incident
    def __init__(self, incident: _Optional[_Union[Incident, _Mapping]] = ...) -> None: ...
