from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CkptState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CKPT_STATE_UNSPECIFIED: _ClassVar[CkptState]
    CKPT_STATE_PENDING: _ClassVar[CkptState]
    CKPT_STATE_COMMITTING: _ClassVar[CkptState]
    CKPT_STATE_COMMITTED: _ClassVar[CkptState]
    CKPT_STATE_ABORTED: _ClassVar[CkptState]
    CKPT_STATE_DELETING: _ClassVar[CkptState]
CKPT_STATE_UNSPECIFIED: CkptState
CKPT_STATE_PENDING: CkptState
CKPT_STATE_COMMITTING: CkptState
CKPT_STATE_COMMITTED: CkptState
CKPT_STATE_ABORTED: CkptState
CKPT_STATE_DELETING: CkptState

class Checkpoint(_message.Message):
    __slots__ = ("id", "job", "step", "world_size", "directory", "state", "meta", "created_at", "updated_at", "committed_at", "ranks_committed", "nbytes", "pinned", "reason", "owner")
    class MetaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    RANKS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    id: str
    job: str
    step: int
    world_size: int
    directory: str
    state: CkptState
    meta: _containers.ScalarMap[str, str]
    created_at: float
    updated_at: float
    committed_at: float
    ranks_committed: int
    nbytes: int
    pinned: bool
    reason: str
    owner: str
    def __init__(self, id: _Optional[str] = ..., job: _Optional[str] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., directory: _Optional[str] = ..., state: _Optional[_Union[CkptState, str]] = ..., meta: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., committed_at: _Optional[float] = ..., ranks_committed: _Optional[int] = ..., nbytes: _Optional[int] = ..., pinned: _Optional[bool] = ..., reason: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("rank", "index_digest", "nbytes", "committed_at")
    RANK_FIELD_NUMBER: _ClassVar[int]
    INDEX_DIGEST_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    rank: int
    index_digest: str
    nbytes: int
    committed_at: float
    def __init__(self, rank: _Optional[int] = ..., index_digest: _Optional[str] = ..., nbytes: _Optional[int] = ..., committed_at: _Optional[float] = ...) -> None: ...

class Retention(_message.Message):
    __slots__ = ("keep_last", "keep_every")
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    KEEP_EVERY_FIELD_NUMBER: _ClassVar[int]
    keep_last: int
    keep_every: int
    def __init__(self, keep_last: _Optional[int] = ..., keep_every: _Optional[int] = ...) -> None: ...

class BeginRequest(_message.Message):
    __slots__ = ("job", "step", "world_size", "meta", "retention")
    class MetaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    world_size: int
    meta: _containers.ScalarMap[str, str]
    retention: Retention
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., meta: _Optional[_Mapping[str, str]] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ...) -> None: ...

class BeginReply(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class CommitShardRequest(_message.Message):
    __slots__ = ("id", "rank", "index_digest", "nbytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    INDEX_DIGEST_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    rank: int
    index_digest: str
    nbytes: int
    def __init__(self, id: _Optional[str] = ..., rank: _Optional[int] = ..., index_digest: _Optional[str] = ..., nbytes: _Optional[int] = ...) -> None: ...

class CommitShardReply(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("id", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortReply(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetReply(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("job", "include_all")
    JOB_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ALL_FIELD_NUMBER: _ClassVar[int]
    job: str
    include_all: bool
    def __init__(self, job: _Optional[str] = ..., include_all: _Optional[bool] = ...) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ...) -> None: ...

class LatestRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class LatestReply(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("id", "force")
    ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    force: bool
    def __init__(self, id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteReply(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("id", "pinned")
    ID_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    id: str
    pinned: bool
    def __init__(self, id: _Optional[str] = ..., pinned: _Optional[bool] = ...) -> None: ...

class PinReply(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class SetRetentionRequest(_message.Message):
    __slots__ = ("job", "keep_last", "keep_every")
    JOB_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    KEEP_EVERY_FIELD_NUMBER: _ClassVar[int]
    job: str
    keep_last: int
    keep_every: int
    def __init__(self, job: _Optional[str] = ..., keep_last: _Optional[int] = ..., keep_every: _Optional[int] = ...) -> None: ...

class SetRetentionReply(_message.Message):
    __slots__ = ("retention",)
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    retention: Retention
    def __init__(self, retention: _Optional[_Union[Retention, _Mapping]] = ...) -> None: ...

class GetRetentionRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class GetRetentionReply(_message.Message):
    __slots__ = ("retention",)
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    retention: Retention
    def __init__(self, retention: _Optional[_Union[Retention, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class ListShardsRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListShardsReply(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    def __init__(self, shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ...) -> None: ...
