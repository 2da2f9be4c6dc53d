from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE_TYPE_FILE: _ClassVar[FileType]
    FILE_TYPE_DIR: _ClassVar[FileType]
    FILE_TYPE_SYMLINK: _ClassVar[FileType]
FILE_TYPE_UNSPECIFIED: FileType
FILE_TYPE_FILE: FileType
FILE_TYPE_DIR: FileType
FILE_TYPE_SYMLINK: FileType

class LayoutPolicy(_message.Message):
    __slots__ = ("chain_table_id", "chunk_size", "stripe_size")
    CHAIN_TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_SIZE_FIELD_NUMBER: _ClassVar[int]
    chain_table_id: int
    chunk_size: int
    stripe_size: int
    def __init__(self, chain_table_id: _Optional[int] = ..., chunk_size: _Optional[int] = ..., stripe_size: _Optional[int] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ("chain_table_id", "chain_table_version", "chunk_size", "stripe_size", "chains")
    CHAIN_TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    chain_table_id: int
    chain_table_version: int
    chunk_size: int
    stripe_size: int
    chains: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chain_table_id: _Optional[int] = ..., chain_table_version: _Optional[int] = ..., chunk_size: _Optional[int] = ..., stripe_size: _Optional[int] = ..., chains: _Optional[_Iterable[int]] = ...) -> None: ...

class Inode(_message.Message):
    __slots__ = ("id", "type", "mode", "uid", "gid", "nlink", "length", "atime", "mtime", "ctime", "layout", "parent", "name", "target", "dir_policy")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ATIME_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DIR_POLICY_FIELD_NUMBER: _ClassVar[int]
    id: int
    type: FileType
    mode: int
    uid: int
    gid: int
    nlink: int
    length: int
    atime: float
    mtime: float
    ctime: float
    layout: Layout
    parent: int
    name: str
    target: str
    dir_policy: LayoutPolicy
    def __init__(self, id: _Optional[int] = ..., type: _Optional[_Union[FileType, str]] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., nlink: _Optional[int] = ..., length: _Optional[int] = ..., atime: _Optional[float] = ..., mtime: _Optional[float] = ..., ctime: _Optional[float] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[str] = ..., target: _Optional[str] = ..., dir_policy: _Optional[_Union[LayoutPolicy, _Mapping]] = ...) -> None: ...

class DirEntry(_message.Message):
    __slots__ = ("name", "inode_id", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    inode_id: int
    type: FileType
    def __init__(self, name: _Optional[str] = ..., inode_id: _Optional[int] = ..., type: _Optional[_Union[FileType, str]] = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ("path", "mode", "parents", "policy", "request_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    mode: int
    parents: bool
    policy: LayoutPolicy
    request_id: bytes
    def __init__(self, path: _Optional[str] = ..., mode: _Optional[int] = ..., parents: _Optional[bool] = ..., policy: _Optional[_Union[LayoutPolicy, _Mapping]] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class MkdirReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("path", "mode", "flags", "policy", "request_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    mode: int
    flags: int
    policy: LayoutPolicy
    request_id: bytes
    def __init__(self, path: _Optional[str] = ..., mode: _Optional[int] = ..., flags: _Optional[int] = ..., policy: _Optional[_Union[LayoutPolicy, _Mapping]] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class OpenRequest(_message.Message):
    __slots__ = ("path", "flags")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    path: str
    flags: int
    def __init__(self, path: _Optional[str] = ..., flags: _Optional[int] = ...) -> None: ...

class OpenReply(_message.Message):
    __slots__ = ("inode", "created", "capability")
    INODE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    created: bool
    capability: bytes
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ..., created: _Optional[bool] = ..., capability: _Optional[bytes] = ...) -> None: ...

class GrantCapabilityRequest(_message.Message):
    __slots__ = ("inode_id", "mode", "capability")
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    inode_id: int
    mode: int
    capability: bytes
    def __init__(self, inode_id: _Optional[int] = ..., mode: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class GrantCapabilityReply(_message.Message):
    __slots__ = ("capability",)
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    capability: bytes
    def __init__(self, capability: _Optional[bytes] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("path", "follow")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    path: str
    follow: bool
    def __init__(self, path: _Optional[str] = ..., follow: _Optional[bool] = ...) -> None: ...

class StatInodeRequest(_message.Message):
    __slots__ = ("inode_id", "capability")
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    inode_id: int
    capability: bytes
    def __init__(self, inode_id: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class StatReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class ReaddirRequest(_message.Message):
    __slots__ = ("path", "after", "limit")
    PATH_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    path: str
    after: str
    limit: int
    def __init__(self, path: _Optional[str] = ..., after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ReaddirReply(_message.Message):
    __slots__ = ("entries", "more", "next_after")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DirEntry]
    more: bool
    next_after: str
    def __init__(self, entries: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., more: _Optional[bool] = ..., next_after: _Optional[str] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("src", "dst", "request_id")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    request_id: bytes
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class RenameReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnlinkRequest(_message.Message):
    __slots__ = ("path", "request_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    request_id: bytes
    def __init__(self, path: _Optional[str] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class UnlinkReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RmdirRequest(_message.Message):
    __slots__ = ("path", "request_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    request_id: bytes
    def __init__(self, path: _Optional[str] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class RmdirReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SymlinkRequest(_message.Message):
    __slots__ = ("target", "link_path", "request_id")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LINK_PATH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    target: str
    link_path: str
    request_id: bytes
    def __init__(self, target: _Optional[str] = ..., link_path: _Optional[str] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class SymlinkReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class ReadlinkRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class ReadlinkReply(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("existing", "new_path", "request_id")
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    NEW_PATH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    existing: str
    new_path: str
    request_id: bytes
    def __init__(self, existing: _Optional[str] = ..., new_path: _Optional[str] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class LinkReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class TruncateRequest(_message.Message):
    __slots__ = ("path", "length", "request_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    length: int
    request_id: bytes
    def __init__(self, path: _Optional[str] = ..., length: _Optional[int] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class TruncateReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class SetattrRequest(_message.Message):
    __slots__ = ("path", "mode", "uid", "gid", "atime", "mtime", "owner", "request_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    ATIME_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    mode: int
    uid: int
    gid: int
    atime: float
    mtime: float
    owner: str
    request_id: bytes
    def __init__(self, path: _Optional[str] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., atime: _Optional[float] = ..., mtime: _Optional[float] = ..., owner: _Optional[str] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class SetattrReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class StatfsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatfsReply(_message.Message):
    __slots__ = ("inodes", "files", "dirs", "symlinks", "used_bytes", "gc_pending")
    INODES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    DIRS_FIELD_NUMBER: _ClassVar[int]
    SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GC_PENDING_FIELD_NUMBER: _ClassVar[int]
    inodes: int
    files: int
    dirs: int
    symlinks: int
    used_bytes: int
    gc_pending: int
    def __init__(self, inodes: _Optional[int] = ..., files: _Optional[int] = ..., dirs: _Optional[int] = ..., symlinks: _Optional[int] = ..., used_bytes: _Optional[int] = ..., gc_pending: _Optional[int] = ...) -> None: ...

class ReportLengthRequest(_message.Message):
    __slots__ = ("inode_id", "length")
    INODE_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    inode_id: int
    length: int
    def __init__(self, inode_id: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReportLengthReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class SetDirPolicyRequest(_message.Message):
    __slots__ = ("path", "policy", "request_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    policy: LayoutPolicy
    request_id: bytes
    def __init__(self, path: _Optional[str] = ..., policy: _Optional[_Union[LayoutPolicy, _Mapping]] = ..., request_id: _Optional[bytes] = ...) -> None: ...

class SetDirPolicyReply(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ...) -> None: ...

class EndpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndpointsReply(_message.Message):
    __slots__ = ("wire_address",)
    WIRE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    wire_address: str
    def __init__(self, wire_address: _Optional[str] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIReply(_message.Message):
    __slots__ = ("user", "roles", "home", "uid", "gid", "home_created")
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    HOME_CREATED_FIELD_NUMBER: _ClassVar[int]
    user: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    home: str
    uid: int
    gid: int
    home_created: bool
    def __init__(self, user: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., home: _Optional[str] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., home_created: _Optional[bool] = ...) -> None: ...
