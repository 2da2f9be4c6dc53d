"""``fireflyer.meta``: the 3FS metadata logic (inodes, directory entries, layouts,
permissions, GC queue) as a stateless library over ``fireflyer.kv``.

    from fireflyer.kv import open_kv
    from fireflyer.meta import Caller, MetaStore, StaticChainTables

    kv = open_kv("sqlite:///meta.db")
    MetaStore.init(kv)                                   # idempotent: root + allocator
    fs = MetaStore(kv, tables=StaticChainTables({1: (1, (1, 2, 3, 4))}))
    alice = Caller(uid=1000, gid=1000)
    fs.mkdir(Caller(0, 0, admin=True), "/home/alice", parents=True)
    fs.setattr(Caller(0, 0, admin=True), "/home/alice", uid=1000, gid=1000)
    r = fs.create(alice, "/home/alice/a.bin")           # OpenResult(inode, created=True)

Any number of ``MetaStore`` objects, in any number of processes, over one KV behave
as one serializable file system: every call is one KV transaction.  Key layout:
``keys``; inode ids: ``alloc``; layouts and the chain shuffle: ``layout``; path
rules: ``paths``; permission rules: ``perms``.
"""

from .model import (
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    ROOT_ID,
    Caller,
    ChainTableSource,
    DirEntry,
    FileType,
    FsInvalidArgument,
    GcItem,
    Inode,
    Layout,
    LayoutPolicy,
    OpenResult,
    ReaddirPage,
    StatFs,
    StaticChainTables,
    TruncateItem,
)
from .store import MetaStore

__all__ = [
    "MetaStore",
    "Caller",
    "ChainTableSource",
    "StaticChainTables",
    "DirEntry",
    "FileType",
    "FsInvalidArgument",
    "GcItem",
    "TruncateItem",
    "Inode",
    "Layout",
    "LayoutPolicy",
    "OpenResult",
    "ReaddirPage",
    "StatFs",
    "ROOT_ID",
    "MIN_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
]
