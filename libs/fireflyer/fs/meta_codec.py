"""Protobuf <-> msgspec for the meta service, in one place for both ends.

``services/meta`` turns the library's msgspec models (``fireflyer.meta``) into
``ff.meta.v1`` messages; :class:`~fireflyer.fs.meta_client.MetaClient` turns
them back, so code on either side of the wire sees the same ``Inode``,
``DirEntry`` and ``ReaddirPage`` types and the generated ``*_pb2`` classes
stay at the edge (DESIGN.md §2).  Enums travel by *name* (``FILE``, ``DIR``,
``SYMLINK``), so the library may number them as it likes.
"""

from __future__ import annotations

from typing import Any

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.meta import DirEntry, FileType, Inode, Layout, LayoutPolicy, ReaddirPage, StatFs

__all__ = [
    "type_to_pb",
    "type_from_pb",
    "policy_to_pb",
    "policy_from_pb",
    "layout_to_pb",
    "layout_from_pb",
    "inode_to_pb",
    "inode_from_pb",
    "entry_to_pb",
    "page_to_pb",
    "page_from_pb",
    "statfs_to_pb",
    "statfs_from_pb",
]

_TYPE_TO_PB = {"FILE": pb.FILE_TYPE_FILE, "DIR": pb.FILE_TYPE_DIR, "SYMLINK": pb.FILE_TYPE_SYMLINK}
_TYPE_FROM_PB = {v: k for k, v in _TYPE_TO_PB.items()}


def type_to_pb(t: FileType) -> int:
    return _TYPE_TO_PB[t.name]


def type_from_pb(v: int) -> FileType:
    return FileType[_TYPE_FROM_PB[v]]


def policy_to_pb(p: LayoutPolicy) -> pb.LayoutPolicy:
    return pb.LayoutPolicy(chain_table_id=p.chain_table_id, chunk_size=p.chunk_size, stripe_size=p.stripe_size)


def policy_from_pb(p: pb.LayoutPolicy) -> LayoutPolicy:
    return LayoutPolicy(p.chain_table_id, p.chunk_size, p.stripe_size)


def layout_to_pb(lay: Layout) -> pb.Layout:
    return pb.Layout(chain_table_id=lay.chain_table_id, chain_table_version=lay.chain_table_version,
                     chunk_size=lay.chunk_size, stripe_size=lay.stripe_size, chains=list(lay.chains))


def layout_from_pb(lay: pb.Layout) -> Layout:
    return Layout(chain_table_id=lay.chain_table_id, chain_table_version=lay.chain_table_version,
                  chunk_size=lay.chunk_size, stripe_size=lay.stripe_size, chains=tuple(lay.chains))


def inode_to_pb(i: Inode) -> pb.Inode:
    msg = pb.Inode(id=i.id, type=type_to_pb(i.type), mode=i.mode, uid=i.uid, gid=i.gid, nlink=i.nlink,
                   length=i.length, atime=i.atime, mtime=i.mtime, ctime=i.ctime, parent=i.parent or 0,
                   name=i.name or "", target=i.target or "")
    if i.layout is not None:
        msg.layout.CopyFrom(layout_to_pb(i.layout))
    if i.dir_policy is not None:
        msg.dir_policy.CopyFrom(policy_to_pb(i.dir_policy))
    return msg


def inode_from_pb(m: pb.Inode) -> Inode:
    kw: dict[str, Any] = {
        "id": m.id, "type": type_from_pb(m.type), "mode": m.mode, "uid": m.uid, "gid": m.gid,
        "nlink": m.nlink, "length": m.length, "atime": m.atime, "mtime": m.mtime, "ctime": m.ctime,
        "layout": layout_from_pb(m.layout) if m.HasField("layout") else None,
        "parent": m.parent, "name": m.name, "target": m.target,
        "dir_policy": policy_from_pb(m.dir_policy) if m.HasField("dir_policy") else None,
    }
    return Inode(**kw)


def entry_to_pb(e: DirEntry) -> pb.DirEntry:
    return pb.DirEntry(name=e.name, inode_id=e.inode_id, type=type_to_pb(e.type))


def page_to_pb(page: ReaddirPage) -> pb.ReaddirReply:
    return pb.ReaddirReply(entries=[entry_to_pb(e) for e in page.entries], more=page.more,
                           next_after=page.next_after or "")


def page_from_pb(m: pb.ReaddirReply) -> ReaddirPage:
    entries = [DirEntry(name=e.name, inode_id=e.inode_id, type=type_from_pb(e.type)) for e in m.entries]
    return ReaddirPage(entries=tuple(entries), more=m.more, next_after=m.next_after)


def statfs_to_pb(s: StatFs) -> pb.StatfsReply:
    # many files near the largest length (2**58 bytes each) add up past what uint64 holds:
    # report the field's maximum rather than fail the call
    return pb.StatfsReply(inodes=s.inodes, files=s.files, dirs=s.dirs, symlinks=s.symlinks,
                          used_bytes=min(s.used_bytes, (1 << 64) - 1), gc_pending=s.gc_pending)


def statfs_from_pb(m: pb.StatfsReply) -> StatFs:
    return StatFs(inodes=m.inodes, files=m.files, dirs=m.dirs, symlinks=m.symlinks, used_bytes=m.used_bytes,
                  gc_pending=m.gc_pending)
