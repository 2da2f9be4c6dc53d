from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "type", "address", "hostname", "status", "last_heartbeat", "registered_at", "tags", "owner")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    type: str
    address: str
    hostname: str
    status: str
    last_heartbeat: float
    registered_at: float
    tags: _containers.RepeatedScalarFieldContainer[str]
    owner: str
    def __init__(self, node_id: _Optional[str] = ..., type: _Optional[str] = ..., address: _Optional[str] = ..., hostname: _Optional[str] = ..., status: _Optional[str] = ..., last_heartbeat: _Optional[float] = ..., registered_at: _Optional[float] = ..., tags: _Optional[_Iterable[str]] = ..., owner: _Optional[str] = ...) -> None: ...

class TargetInfo(_message.Message):
    __slots__ = ("target_id", "node_id", "chain_id", "local_state", "public_state", "disk", "path")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_STATE_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    node_id: str
    chain_id: int
    local_state: str
    public_state: str
    disk: str
    path: str
    def __init__(self, target_id: _Optional[int] = ..., node_id: _Optional[str] = ..., chain_id: _Optional[int] = ..., local_state: _Optional[str] = ..., public_state: _Optional[str] = ..., disk: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ChainTarget(_message.Message):
    __slots__ = ("target_id", "public_state")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_STATE_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    public_state: str
    def __init__(self, target_id: _Optional[int] = ..., public_state: _Optional[str] = ...) -> None: ...

class Chain(_message.Message):
    __slots__ = ("chain_id", "version", "targets")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    version: int
    targets: _containers.RepeatedCompositeFieldContainer[ChainTarget]
    def __init__(self, chain_id: _Optional[int] = ..., version: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[ChainTarget, _Mapping]]] = ...) -> None: ...

class ChainTable(_message.Message):
    __slots__ = ("table_id", "version", "chain_ids", "desc")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    version: int
    chain_ids: _containers.RepeatedScalarFieldContainer[int]
    desc: str
    def __init__(self, table_id: _Optional[int] = ..., version: _Optional[int] = ..., chain_ids: _Optional[_Iterable[int]] = ..., desc: _Optional[str] = ...) -> None: ...

class RoutingInfo(_message.Message):
    __slots__ = ("version", "nodes", "targets", "chains", "chain_tables")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLES_FIELD_NUMBER: _ClassVar[int]
    version: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    targets: _containers.RepeatedCompositeFieldContainer[TargetInfo]
    chains: _containers.RepeatedCompositeFieldContainer[Chain]
    chain_tables: _containers.RepeatedCompositeFieldContainer[ChainTable]
    def __init__(self, version: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[TargetInfo, _Mapping]]] = ..., chains: _Optional[_Iterable[_Union[Chain, _Mapping]]] = ..., chain_tables: _Optional[_Iterable[_Union[ChainTable, _Mapping]]] = ...) -> None: ...

class GetRoutingInfoRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class GetRoutingInfoReply(_message.Message):
    __slots__ = ("changed", "routing")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    routing: RoutingInfo
    def __init__(self, changed: _Optional[bool] = ..., routing: _Optional[_Union[RoutingInfo, _Mapping]] = ...) -> None: ...

class TargetReport(_message.Message):
    __slots__ = ("target_id", "local_state", "disk", "path")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STATE_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    local_state: str
    disk: str
    path: str
    def __init__(self, target_id: _Optional[int] = ..., local_state: _Optional[str] = ..., disk: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "node_type", "address", "hostname", "tags", "targets")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_type: str
    address: str
    hostname: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    targets: _containers.RepeatedCompositeFieldContainer[TargetReport]
    def __init__(self, node_id: _Optional[str] = ..., node_type: _Optional[str] = ..., address: _Optional[str] = ..., hostname: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., targets: _Optional[_Iterable[_Union[TargetReport, _Mapping]]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("routing_version", "primary", "fail_interval_s")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    FAIL_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    primary: str
    fail_interval_s: float
    def __init__(self, routing_version: _Optional[int] = ..., primary: _Optional[str] = ..., fail_interval_s: _Optional[float] = ...) -> None: ...

class GetPrimaryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPrimaryReply(_message.Message):
    __slots__ = ("primary", "primary_address", "term", "expires_at", "node", "node_address", "is_primary")
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_PRIMARY_FIELD_NUMBER: _ClassVar[int]
    primary: str
    primary_address: str
    term: int
    expires_at: float
    node: str
    node_address: str
    is_primary: bool
    def __init__(self, primary: _Optional[str] = ..., primary_address: _Optional[str] = ..., term: _Optional[int] = ..., expires_at: _Optional[float] = ..., node: _Optional[str] = ..., node_address: _Optional[str] = ..., is_primary: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("routing_version", "nodes")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, routing_version: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class ListTargetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTargetsReply(_message.Message):
    __slots__ = ("routing_version", "targets")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    targets: _containers.RepeatedCompositeFieldContainer[TargetInfo]
    def __init__(self, routing_version: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[TargetInfo, _Mapping]]] = ...) -> None: ...

class ListChainsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListChainsReply(_message.Message):
    __slots__ = ("routing_version", "chains")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    chains: _containers.RepeatedCompositeFieldContainer[Chain]
    def __init__(self, routing_version: _Optional[int] = ..., chains: _Optional[_Iterable[_Union[Chain, _Mapping]]] = ...) -> None: ...

class ListChainTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListChainTablesReply(_message.Message):
    __slots__ = ("routing_version", "chain_tables")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLES_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    chain_tables: _containers.RepeatedCompositeFieldContainer[ChainTable]
    def __init__(self, routing_version: _Optional[int] = ..., chain_tables: _Optional[_Iterable[_Union[ChainTable, _Mapping]]] = ...) -> None: ...

class TargetSpec(_message.Message):
    __slots__ = ("target_id", "node_id", "disk", "path")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    node_id: str
    disk: str
    path: str
    def __init__(self, target_id: _Optional[int] = ..., node_id: _Optional[str] = ..., disk: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ChainSpec(_message.Message):
    __slots__ = ("chain_id", "targets")
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    chain_id: int
    targets: _containers.RepeatedCompositeFieldContainer[TargetSpec]
    def __init__(self, chain_id: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[TargetSpec, _Mapping]]] = ...) -> None: ...

class CreateChainsRequest(_message.Message):
    __slots__ = ("chains",)
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[ChainSpec]
    def __init__(self, chains: _Optional[_Iterable[_Union[ChainSpec, _Mapping]]] = ...) -> None: ...

class CreateChainsReply(_message.Message):
    __slots__ = ("routing_version", "chains")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    chains: _containers.RepeatedCompositeFieldContainer[Chain]
    def __init__(self, routing_version: _Optional[int] = ..., chains: _Optional[_Iterable[_Union[Chain, _Mapping]]] = ...) -> None: ...

class CreateChainTableRequest(_message.Message):
    __slots__ = ("table_id", "chain_ids", "desc")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    chain_ids: _containers.RepeatedScalarFieldContainer[int]
    desc: str
    def __init__(self, table_id: _Optional[int] = ..., chain_ids: _Optional[_Iterable[int]] = ..., desc: _Optional[str] = ...) -> None: ...

class CreateChainTableReply(_message.Message):
    __slots__ = ("routing_version", "table")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    table: ChainTable
    def __init__(self, routing_version: _Optional[int] = ..., table: _Optional[_Union[ChainTable, _Mapping]] = ...) -> None: ...

class OfflineTargetRequest(_message.Message):
    __slots__ = ("target_id",)
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    target_id: int
    def __init__(self, target_id: _Optional[int] = ...) -> None: ...

class OfflineTargetReply(_message.Message):
    __slots__ = ("routing_version", "chain")
    ROUTING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    routing_version: int
    chain: Chain
    def __init__(self, routing_version: _Optional[int] = ..., chain: _Optional[_Union[Chain, _Mapping]] = ...) -> None: ...
