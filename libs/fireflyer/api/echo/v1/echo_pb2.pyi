from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EchoRequest(_message.Message):
    __slots__ = ("text", "sleep_s", "publish_subject")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SLEEP_S_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    text: str
    sleep_s: float
    publish_subject: str
    def __init__(self, text: _Optional[str] = ..., sleep_s: _Optional[float] = ..., publish_subject: _Optional[str] = ...) -> None: ...

class EchoReply(_message.Message):
    __slots__ = ("text", "user", "trace_id", "roles")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    text: str
    user: str
    trace_id: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, text: _Optional[str] = ..., user: _Optional[str] = ..., trace_id: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("kind", "message", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    fields: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., fields: _Optional[_Mapping[str, str]] = ...) -> None: ...

class FailReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdminPingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdminPingReply(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: str
    def __init__(self, user: _Optional[str] = ...) -> None: ...
