"""Every MetaStore call: success and error cases, permissions, flags, links and GC."""

from __future__ import annotations

import errno as E
import os
from collections.abc import Callable
from typing import Any

import pytest
from meta_util import ADMIN, ALICE, BOB, CAROL, TABLES, dump

from fireflyer.core.errors import FsError
from fireflyer.kv import KV
from fireflyer.meta import FileType, FsInvalidArgument, LayoutPolicy, MetaStore, TruncateItem


def err(code: int, fn: Callable[..., Any], *args: Any, **kw: Any) -> FsError:
    with pytest.raises(FsError) as ei:
        fn(*args, **kw)
    assert ei.value.errno == code, (E.errorcode[ei.value.errno], E.errorcode[code], ei.value)
    return ei.value


def names(fs: MetaStore, path: str) -> list[str]:
    return [e.name for e in fs.readdir(ADMIN, path, limit=10_000).entries]


def test_init_is_idempotent(kv: KV, fs: MetaStore) -> None:
    root = fs.stat(ADMIN, "/")
    assert root.type is FileType.DIR and root.uid == 0 and root.mode == 0o755
    before = dump(kv)
    assert MetaStore.init(kv) == root
    assert dump(kv) == before


def test_uninitialized_store_says_so(tmp_path: Any) -> None:
    from fireflyer.kv import open_kv

    with open_kv(f"sqlite:///{tmp_path}/x.db") as kv:
        e = err(E.ENOENT, MetaStore(kv, tables=TABLES).stat, ADMIN, "/")
        assert "init" in str(e)


def test_mkdir(fs: MetaStore) -> None:
    d = fs.mkdir(ALICE, "/home/alice/d", 0o700)
    assert d.type is FileType.DIR and d.uid == ALICE.uid and d.mode == 0o700 and d.name == "d"
    assert fs.stat(ALICE, "/home/alice/d") == d
    e = err(E.EEXIST, fs.mkdir, ALICE, "/home/alice/d")
    assert e.path == "/home/alice/d"
    err(E.EEXIST, fs.mkdir, ADMIN, "/")
    err(E.ENOENT, fs.mkdir, ALICE, "/home/alice/x/y")
    fs.create(ALICE, "/home/alice/f")
    err(E.ENOTDIR, fs.mkdir, ALICE, "/home/alice/f/y")
    err(E.EACCES, fs.mkdir, BOB, "/home/alice/b")
    err(E.EACCES, fs.mkdir, BOB, "/home/alice/d/x")  # no search on 0o700 dir
    # mkdir -p
    p = fs.mkdir(ALICE, "/home/alice/p/q/r", parents=True)
    assert fs.stat(ALICE, "/home/alice/p/q/r") == p
    assert fs.mkdir(ALICE, "/home/alice/p/q/r", parents=True) == p
    err(E.EEXIST, fs.mkdir, ALICE, "/home/alice/f", parents=True)
    err(E.ENOTDIR, fs.mkdir, ALICE, "/home/alice/f/z", parents=True)
    assert fs.mkdir(ALICE, "/home/alice/p/../s", parents=True).parent == fs.stat(ALICE, "/home/alice").id


def test_rmdir(fs: MetaStore) -> None:
    fs.mkdir(ALICE, "/home/alice/d")
    fs.create(ALICE, "/home/alice/d/f")
    err(E.ENOTEMPTY, fs.rmdir, ALICE, "/home/alice/d")
    err(E.ENOTDIR, fs.rmdir, ALICE, "/home/alice/d/f")
    err(E.ENOENT, fs.rmdir, ALICE, "/home/alice/nope")
    err(E.EBUSY, fs.rmdir, ADMIN, "/")
    err(E.EACCES, fs.rmdir, BOB, "/home/alice/d")
    fs.unlink(ALICE, "/home/alice/d/f")
    fs.rmdir(ALICE, "/home/alice/d")
    err(E.ENOENT, fs.stat, ALICE, "/home/alice/d")
    with pytest.raises(FsInvalidArgument):
        fs.rmdir(ALICE, "/home/alice/..")


def test_create_flags(fs: MetaStore) -> None:
    r = fs.create(ALICE, "/home/alice/f", 0o640)
    assert r.created and r.inode.nlink == 1 and r.inode.length == 0 and r.inode.mode == 0o640
    assert r.inode.layout is not None and r.inode.layout.stripe_size == 4
    again = fs.create(ALICE, "/home/alice/f")
    assert not again.created and again.inode == r.inode
    err(E.EEXIST, fs.create, ALICE, "/home/alice/f", flags=os.O_CREAT | os.O_EXCL)
    fs.report_length(ALICE, r.inode.id, 5000)
    t = fs.create(ALICE, "/home/alice/f", flags=os.O_CREAT | os.O_TRUNC | os.O_WRONLY)
    assert not t.created and t.inode.length == 0
    assert fs.truncate_pending() == [TruncateItem(r.inode.id, r.inode.layout, 0, t.inode.mtime)]
    fs.truncate_done(fs.truncate_pending())
    assert fs.truncate_pending() == []
    err(E.EISDIR, fs.create, ALICE, "/home/alice")
    err(E.EISDIR, fs.create, ADMIN, "/")
    err(E.ENOENT, fs.create, ALICE, "/home/alice/no/f")
    err(E.ENOTDIR, fs.create, ALICE, "/home/alice/f/g")
    err(E.EACCES, fs.create, BOB, "/home/alice/g")
    # an existing file is opened with its access mode checked
    err(E.EACCES, fs.create, BOB, "/home/alice/f", flags=os.O_CREAT | os.O_TRUNC)
    assert fs.create(CAROL, "/home/alice/f").inode.id == r.inode.id  # group r
    err(E.EACCES, fs.create, CAROL, "/home/alice/f", flags=os.O_CREAT | os.O_WRONLY)
    err(E.EACCES, fs.create, BOB, "/home/alice/f")  # other: no bits


def test_create_through_symlinks(fs: MetaStore) -> None:
    fs.symlink(ALICE, "target", "/home/alice/dangling")
    r = fs.create(ALICE, "/home/alice/dangling")
    assert r.created and fs.stat(ALICE, "/home/alice/target").id == r.inode.id
    assert fs.create(ALICE, "/home/alice/dangling").inode.id == r.inode.id
    err(E.EEXIST, fs.create, ALICE, "/home/alice/dangling", flags=os.O_CREAT | os.O_EXCL)
    err(E.ELOOP, fs.create, ALICE, "/home/alice/dangling", flags=os.O_CREAT | os.O_NOFOLLOW)


def test_open(fs: MetaStore) -> None:
    f = fs.create(ALICE, "/home/alice/f", 0o644).inode
    assert fs.open(BOB, "/home/alice/f").inode == f
    err(E.EACCES, fs.open, BOB, "/home/alice/f", os.O_WRONLY)
    err(E.EACCES, fs.open, BOB, "/home/alice/f", os.O_RDONLY | os.O_TRUNC)
    assert fs.open(ADMIN, "/home/alice/f", os.O_RDWR).inode == f
    err(E.ENOENT, fs.open, ALICE, "/home/alice/nope")
    assert fs.open(ALICE, "/home/alice/new", os.O_CREAT | os.O_WRONLY).created
    assert fs.open(ALICE, "/home/alice", os.O_RDONLY | os.O_DIRECTORY).inode.type is FileType.DIR
    err(E.EISDIR, fs.open, ALICE, "/home/alice", os.O_WRONLY)
    err(E.ENOTDIR, fs.open, ALICE, "/home/alice/f", os.O_RDONLY | os.O_DIRECTORY)
    fs.symlink(ALICE, "/home/alice/f", "/home/alice/l")
    assert fs.open(ALICE, "/home/alice/l").inode == f
    err(E.ELOOP, fs.open, ALICE, "/home/alice/l", os.O_RDONLY | os.O_NOFOLLOW)
    fs.setattr(ALICE, "/home/alice", mode=0o700)
    err(E.EACCES, fs.open, BOB, "/home/alice/f")


def test_stat_lstat_readlink_symlink(fs: MetaStore) -> None:
    d = fs.mkdir(ALICE, "/home/alice/d")
    f = fs.create(ALICE, "/home/alice/d/f").inode
    s = fs.symlink(ALICE, "d", "/home/alice/rel")
    assert s.type is FileType.SYMLINK and s.target == "d" and s.length == 1
    fs.symlink(ALICE, "/home/alice/d/f", "/home/alice/abs")
    fs.symlink(ALICE, "../../alice/d/../d", "/home/alice/d/up")
    assert fs.stat(ALICE, "/home/alice/rel") == d
    assert fs.lstat(ALICE, "/home/alice/rel") == s
    assert fs.stat(ALICE, "/home/alice/rel/f") == f  # intermediate component
    assert fs.stat(ALICE, "/home/alice/abs") == f
    assert fs.stat(ALICE, "/home/alice/d/up/f") == f
    assert fs.stat(ALICE, "/home/alice/d/../d/./f") == f
    assert fs.stat(ALICE, "/../home") == fs.stat(ALICE, "/home")
    assert fs.stat_inode(ALICE, f.id) == f  # the owner
    err(E.EACCES, fs.stat_inode, BOB, f.id)  # another user's file by id: only once opened
    assert fs.stat_inode(BOB, f.id, opened=True) == f
    err(E.ENOENT, fs.stat_inode, BOB, 99)
    assert fs.readlink(ALICE, "/home/alice/rel") == "d"
    err(E.EINVAL, fs.readlink, ALICE, "/home/alice/d")
    err(E.EEXIST, fs.symlink, ALICE, "x", "/home/alice/rel")
    err(E.EACCES, fs.symlink, BOB, "x", "/home/alice/x")
    err(E.ENOTDIR, fs.stat, ALICE, "/home/alice/d/f/x")
    fs.symlink(ALICE, "/home/alice/d/f", "/home/alice/tofile")
    err(E.ENOTDIR, fs.stat, ALICE, "/home/alice/tofile/x")


def test_eloop(fs: MetaStore) -> None:
    fs.symlink(ALICE, "b", "/home/alice/a")
    fs.symlink(ALICE, "a", "/home/alice/b")
    err(E.ELOOP, fs.stat, ALICE, "/home/alice/a")
    err(E.ELOOP, fs.stat, ALICE, "/home/alice/a/x")
    assert fs.lstat(ALICE, "/home/alice/a").target == "b"
    # a chain of exactly 40 links resolves, 41 is ELOOP
    fs.mkdir(ALICE, "/home/alice/c")
    for i in range(41):
        fs.symlink(ALICE, f"l{i + 1}" if i < 40 else "/home/alice", f"/home/alice/c/l{i}")
    assert fs.stat(ALICE, "/home/alice/c/l1").type is FileType.DIR
    err(E.ELOOP, fs.stat, ALICE, "/home/alice/c/l0")


def test_unlink_link_nlink_and_gc(fs: MetaStore) -> None:
    f = fs.create(ALICE, "/home/alice/f").inode
    fs.report_length(ALICE, f.id, 123)
    h = fs.link(ALICE, "/home/alice/f", "/home/alice/h")
    assert h.nlink == 2 and h.id == f.id
    assert fs.stat(ALICE, "/home/alice/h").nlink == 2
    fs.unlink(ALICE, "/home/alice/f")
    assert fs.stat(ALICE, "/home/alice/h").nlink == 1
    assert fs.gc_pending() == []
    fs.unlink(ALICE, "/home/alice/h")
    err(E.ENOENT, fs.stat_inode, ALICE, f.id)
    (item,) = fs.gc_pending()
    assert (item.inode_id, item.length, item.layout) == (f.id, 123, f.layout)
    fs.gc_done([f.id])
    assert fs.gc_pending() == []
    # errors
    fs.mkdir(ALICE, "/home/alice/d")
    err(E.EPERM, fs.link, ALICE, "/home/alice/d", "/home/alice/d2")
    fs.symlink(ALICE, "d", "/home/alice/s")
    err(E.EPERM, fs.link, ALICE, "/home/alice/s", "/home/alice/s2")
    err(E.EISDIR, fs.unlink, ALICE, "/home/alice/d")
    err(E.EISDIR, fs.unlink, ADMIN, "/")
    err(E.ENOENT, fs.unlink, ALICE, "/home/alice/nope")
    err(E.ENOENT, fs.link, ALICE, "/home/alice/nope", "/home/alice/x")
    g = fs.create(ALICE, "/home/alice/g").inode
    err(E.EEXIST, fs.link, ALICE, "/home/alice/g", "/home/alice/d")
    # protected hardlinks (checked before the parent's write bit, as Linux's linkat does)
    err(E.EPERM, fs.link, BOB, "/home/alice/g", "/home/alice/x")
    err(E.EACCES, fs.unlink, BOB, "/home/alice/g")
    fs.unlink(ALICE, "/home/alice/s")  # symlinks: no GC record
    assert [i.inode_id for i in fs.gc_pending()] == []
    assert fs.stat(ALICE, "/home/alice/g") == g


def test_protected_hardlinks(fs: MetaStore) -> None:
    """A hard link needs the target's owner, or read and write on it (Linux protected_hardlinks);
    root-acting callers are exempt.  Bob can write /tmp, so only this rule stops him."""
    fs.setattr(ALICE, "/home/alice", mode=0o755)
    fs.create(ALICE, "/home/alice/ro", 0o644)
    fs.create(ALICE, "/home/alice/rw", 0o666)
    err(E.EPERM, fs.link, BOB, "/home/alice/ro", "/tmp/ro")  # readable, not writable
    assert fs.link(BOB, "/home/alice/rw", "/tmp/rw").nlink == 2  # may read and write it
    assert fs.link(ALICE, "/home/alice/ro", "/tmp/ro-alice").nlink == 2  # the owner
    assert fs.link(ADMIN, "/home/alice/ro", "/tmp/ro-admin").nlink == 3  # root


def test_stat_inode_by_id(fs: MetaStore) -> None:
    """By id: the owner and root; a directory when its ancestors are searchable; another
    user's file only once opened (the servicer checked its capability)."""
    fs.mkdir(ALICE, "/home/alice/priv", 0o700)
    f = fs.create(ALICE, "/home/alice/priv/f", 0o644).inode
    sub = fs.mkdir(ALICE, "/home/alice/priv/sub", 0o755)
    pub = fs.mkdir(ALICE, "/tmp/pub", 0o755)
    assert fs.stat_inode(ALICE, f.id) == f and fs.stat_inode(ADMIN, f.id) == f
    err(E.EACCES, fs.stat_inode, BOB, f.id)
    err(E.EACCES, fs.stat_inode, BOB, sub.id)  # behind a 0700 directory
    assert fs.stat_inode(BOB, pub.id) == pub  # /, /tmp searchable


def test_sticky_tmp(fs: MetaStore) -> None:
    fs.create(ALICE, "/tmp/a")
    fs.create(BOB, "/tmp/b")
    err(E.EPERM, fs.unlink, BOB, "/tmp/a")
    err(E.EPERM, fs.rename, BOB, "/tmp/a", "/tmp/c")
    err(E.EPERM, fs.rename, BOB, "/tmp/b", "/tmp/a")  # replacing alice's file
    fs.rename(BOB, "/tmp/b", "/tmp/c")
    fs.unlink(ADMIN, "/tmp/a")
    fs.unlink(BOB, "/tmp/c")


def test_truncate_report_length(fs: MetaStore) -> None:
    f = fs.create(ALICE, "/home/alice/f").inode
    assert fs.report_length(ALICE, f.id, 100).length == 100
    assert fs.report_length(ALICE, f.id, 50).length == 100  # never shrinks
    assert fs.truncate(ALICE, "/home/alice/f", 4096).length == 4096
    assert fs.truncate_pending() == []  # growing needs nothing from storage
    assert fs.truncate(ALICE, "/home/alice/f", 10).length == 10
    assert [(i.inode_id, i.length) for i in fs.truncate_pending()] == [(f.id, 10)]
    err(E.EISDIR, fs.truncate, ALICE, "/home/alice", 0)
    err(E.EACCES, fs.truncate, BOB, "/home/alice/f", 0)
    err(E.EACCES, fs.report_length, BOB, f.id, 1000)
    err(E.ENOENT, fs.report_length, ALICE, 7777, 1)
    err(E.EISDIR, fs.report_length, ALICE, fs.stat(ALICE, "/home/alice").id, 1)
    with pytest.raises(FsInvalidArgument):
        fs.truncate(ALICE, "/home/alice/f", -1)
    with pytest.raises(FsInvalidArgument):
        fs.report_length(ALICE, f.id, -5)


def test_setattr_permissions(fs: MetaStore) -> None:
    f = fs.create(ALICE, "/home/alice/f", 0o600).inode
    assert fs.setattr(ALICE, "/home/alice/f", mode=0o644).mode == 0o644
    err(E.EPERM, fs.setattr, BOB, "/home/alice/f", mode=0o777)
    err(E.EPERM, fs.setattr, ALICE, "/home/alice/f", uid=BOB.uid)
    err(E.EPERM, fs.setattr, ALICE, "/home/alice/f", gid=5)
    err(E.EPERM, fs.setattr, BOB, "/home/alice/f", mtime=1.0)
    assert fs.setattr(ALICE, "/home/alice/f", uid=ALICE.uid).uid == ALICE.uid  # no change: allowed
    g = fs.setattr(ADMIN, "/home/alice/f", uid=BOB.uid, gid=7, atime=1.0, mtime=2.0)
    assert (g.uid, g.gid, g.atime, g.mtime, g.id) == (BOB.uid, 7, 1.0, 2.0, f.id)
    assert g.ctime >= f.ctime
    root_user = type(ALICE)(0, 0)  # uid 0 is root, without the admin flag
    assert fs.setattr(root_user, "/home/alice/f", uid=ALICE.uid).uid == ALICE.uid
    err(E.ENOENT, fs.setattr, ALICE, "/home/alice/nope", mode=0o600)


def test_readdir_paging(fs: MetaStore) -> None:
    fs.mkdir(ALICE, "/home/alice/big")
    want = sorted(f"f{i:03d}" for i in range(250))
    for n in want:
        fs.create(ALICE, f"/home/alice/big/{n}")
    got: list[str] = []
    after = ""
    pages = 0
    while True:
        page = fs.readdir(ALICE, "/home/alice/big", after=after, limit=64)
        got += [e.name for e in page.entries]
        pages += 1
        after = page.next_after
        if not page.more:
            break
    assert got == want and pages == 4
    page = fs.readdir(ALICE, "/home/alice/big", after="f100", limit=3)
    assert [e.name for e in page.entries] == ["f101", "f102", "f103"] and page.more
    assert fs.readdir(ALICE, "/home/alice/big", after="zzz").entries == ()
    assert len(fs.readdir(ALICE, "/home/alice/big").entries) == 128  # default limit
    assert all(e.type is FileType.FILE for e in page.entries)
    err(E.ENOTDIR, fs.readdir, ALICE, "/home/alice/big/f000")
    fs.setattr(ALICE, "/home/alice/big", mode=0o711)
    err(E.EACCES, fs.readdir, BOB, "/home/alice/big")
    assert fs.stat(BOB, "/home/alice/big/f001").type is FileType.FILE  # search still allowed


def test_rename(fs: MetaStore) -> None:
    h = "/home/alice"
    fs.mkdir(ALICE, f"{h}/a/b/c", parents=True)
    f = fs.create(ALICE, f"{h}/a/f").inode
    fs.rename(ALICE, f"{h}/a/f", f"{h}/g")
    assert fs.stat(ALICE, f"{h}/g") == f
    err(E.ENOENT, fs.stat, ALICE, f"{h}/a/f")
    # dir move updates the parent pointer
    fs.rename(ALICE, f"{h}/a/b", f"{h}/b2")
    b2 = fs.stat(ALICE, f"{h}/b2")
    assert b2.parent == fs.stat(ALICE, h).id and b2.name == "b2"
    assert fs.stat(ALICE, f"{h}/b2/c/..") == b2
    # loops
    err(E.EINVAL, fs.rename, ALICE, f"{h}/b2", f"{h}/b2/c/x")
    err(E.EINVAL, fs.rename, ALICE, f"{h}/b2", f"{h}/b2/x")
    err(E.ENOTEMPTY, fs.rename, ADMIN, f"{h}/b2/c", h)  # onto its non-empty ancestor
    with pytest.raises(FsInvalidArgument):
        fs.rename(ALICE, f"{h}/b2/c", f"{h}/b2/..")
    # same path, same inode: no-op
    fs.rename(ALICE, f"{h}/g", f"{h}/g")
    fs.link(ALICE, f"{h}/g", f"{h}/g2")
    fs.rename(ALICE, f"{h}/g", f"{h}/g2")
    assert fs.stat(ALICE, f"{h}/g").nlink == 2
    # file over file: the replaced one goes to GC
    o = fs.create(ALICE, f"{h}/other").inode
    fs.rename(ALICE, f"{h}/g2", f"{h}/other")
    assert fs.stat(ALICE, f"{h}/other").id == f.id and fs.stat(ALICE, f"{h}/g").nlink == 2
    assert [i.inode_id for i in fs.gc_pending()] == [o.id]
    # type mismatches
    err(E.EISDIR, fs.rename, ALICE, f"{h}/g", f"{h}/b2")
    err(E.ENOTDIR, fs.rename, ALICE, f"{h}/b2", f"{h}/g")
    # dir over empty dir; not over a non-empty one
    e = fs.mkdir(ALICE, f"{h}/empty")
    fs.rename(ALICE, f"{h}/b2/c", f"{h}/empty")
    err(E.ENOENT, fs.stat_inode, ALICE, e.id)
    fs.mkdir(ALICE, f"{h}/empty/x")
    fs.mkdir(ALICE, f"{h}/d")
    err(E.ENOTEMPTY, fs.rename, ALICE, f"{h}/d", f"{h}/empty")
    err(E.ENOENT, fs.rename, ALICE, f"{h}/nope", f"{h}/x")
    err(E.ENOENT, fs.rename, ALICE, f"{h}/g", f"{h}/nope/x")
    err(E.ENOTDIR, fs.rename, ALICE, f"{h}/g", f"{h}/g/x")
    err(E.EBUSY, fs.rename, ADMIN, "/", "/x")
    err(E.EBUSY, fs.rename, ADMIN, "/tmp", "/")
    err(E.EACCES, fs.rename, BOB, f"{h}/g", "/tmp/g")
    err(E.EACCES, fs.rename, ALICE, f"{h}/g", "/home/g")
    # a symlink is moved itself, not its target
    fs.symlink(ALICE, "d", f"{h}/s")
    fs.rename(ALICE, f"{h}/s", f"{h}/d/s")
    assert fs.lstat(ALICE, f"{h}/d/s").target == "d"


def test_dir_policy_inheritance_and_layout(fs: MetaStore) -> None:
    h = "/home/alice"
    f = fs.create(ALICE, f"{h}/f").inode
    assert f.layout is not None and f.layout.chunk_size == 1 << 20 and f.layout.stripe_size == 4
    assert set(f.layout.chains) <= set(range(1, 9))
    pol = LayoutPolicy(2, 4096, 2)
    fs.mkdir(ALICE, f"{h}/p", policy=pol)
    fs.mkdir(ALICE, f"{h}/p/q/r", parents=True)
    g = fs.create(ALICE, f"{h}/p/q/r/g").inode
    assert g.layout is not None
    assert (g.layout.chain_table_id, g.layout.chain_table_version, g.layout.chunk_size) == (2, 5, 4096)
    assert sorted(g.layout.chains) == [21, 22]
    fs.set_dir_policy(ALICE, f"{h}/p/q", LayoutPolicy(1, 64 << 20, 8))
    k = fs.create(ALICE, f"{h}/p/q/r/k").inode
    assert k.layout is not None and k.layout.stripe_size == 8 and sorted(k.layout.chains) == list(range(1, 9))
    assert fs.stat(ALICE, f"{h}/p/q/r/g").layout == g.layout  # existing files keep theirs
    own = fs.create(ALICE, f"{h}/p/own", policy=LayoutPolicy(1, 8192, 3)).inode
    assert own.layout is not None and own.layout.chunk_size == 8192 and own.layout.stripe_size == 3
    fs.set_dir_policy(ALICE, f"{h}/p/q", None)
    assert fs.create(ALICE, f"{h}/p/q/z").inode.layout.chain_table_id == 2  # type: ignore[union-attr]
    err(E.EPERM, fs.set_dir_policy, BOB, f"{h}/p", pol)
    err(E.ENOTDIR, fs.set_dir_policy, ALICE, f"{h}/f", pol)
    # round robin: consecutive creates under one shard move the base by the stripe
    layouts = [fs.create(ALICE, f"{h}/rr{i}").inode for i in range(16)]
    bases = {(i.id % 32, min(i.layout.chains)) for i in layouts}  # type: ignore[union-attr]
    assert len(bases) > 1


@pytest.mark.parametrize(
    "call",
    [
        lambda fs: fs.mkdir(ALICE, "home/alice/x"),
        lambda fs: fs.mkdir(ALICE, ""),
        lambda fs: fs.mkdir(ALICE, "/home/alice/a\0b"),
        lambda fs: fs.mkdir(ALICE, "/home/alice/" + "n" * 256),
        lambda fs: fs.mkdir(ALICE, "/home/alice/" + "é" * 128),  # 256 bytes
        lambda fs: fs.mkdir(ALICE, "/a" * 2049),
        lambda fs: fs.mkdir(ALICE, "/home/alice/x", 0o17777),
        lambda fs: fs.mkdir(ALICE, "/home/alice/x", policy=LayoutPolicy(1, 3000, 1)),
        lambda fs: fs.mkdir(ALICE, "/home/alice/x", policy=LayoutPolicy(1, 4096, 9)),
        lambda fs: fs.mkdir(ALICE, "/home/alice/x", policy=LayoutPolicy(3, 4096, 1)),
        lambda fs: fs.create(ALICE, "/home/alice/x", policy=LayoutPolicy(1, 1 << 27, 1)),
        lambda fs: fs.create(ALICE, "/home/alice/x", -1),
        lambda fs: fs.create(ALICE, b"/home/alice/x"),
        lambda fs: fs.symlink(ALICE, "", "/home/alice/x"),
        lambda fs: fs.symlink(ALICE, "a\0", "/home/alice/x"),
        lambda fs: fs.rename(ALICE, "/home/alice", "rel"),
        lambda fs: fs.link(ALICE, "rel", "/home/alice/x"),
        lambda fs: fs.readdir(ALICE, "/home", after="a/b"),
        lambda fs: fs.readdir(ALICE, "/home", limit=0),
        lambda fs: fs.truncate(ALICE, "/home/alice/x", -1),
        lambda fs: fs.setattr(ALICE, "/home/alice", uid=-1),
        lambda fs: fs.set_dir_policy(ALICE, "/home/alice", LayoutPolicy(1, 4096, 0)),
        lambda fs: fs.gc_pending(0),
        lambda fs: fs.open(ALICE, "x"),
    ],
)
def test_bad_input_writes_nothing(kv: KV, fs: MetaStore, call: Callable[[MetaStore], Any]) -> None:
    before = dump(kv)
    with pytest.raises(FsInvalidArgument) as ei:
        call(fs)
    assert ei.value.errno in (E.EINVAL, E.ENAMETOOLONG) and ei.value.code == "INVALID_ARGUMENT"
    assert dump(kv) == before


def test_failed_calls_write_nothing(kv: KV, fs: MetaStore) -> None:
    fs.mkdir(ALICE, "/home/alice/d/e", parents=True)
    before = dump(kv)
    err(E.EEXIST, fs.mkdir, ALICE, "/home/alice/d")
    err(E.ENOTEMPTY, fs.rmdir, ALICE, "/home/alice/d")
    err(E.EINVAL, fs.rename, ALICE, "/home/alice/d", "/home/alice/d/e/f")
    err(E.EACCES, fs.create, BOB, "/home/alice/x")
    assert dump(kv) == before


def test_statfs(fs: MetaStore) -> None:
    base = fs.statfs(ADMIN)
    f = fs.create(ALICE, "/home/alice/f").inode
    fs.report_length(ALICE, f.id, 10)
    fs.symlink(ALICE, "f", "/home/alice/s")
    s = fs.statfs(ALICE)
    assert (s.inodes, s.files, s.dirs, s.symlinks, s.used_bytes) == (base.inodes + 2, 1, base.dirs, 1, 10)
    fs.unlink(ALICE, "/home/alice/f")
    assert fs.statfs(ALICE).gc_pending == 1


def test_request_id_makes_retry_safe(kv: KV, fs: MetaStore) -> None:
    kv.faults.inject("unknown_result")
    d = fs.mkdir(ALICE, "/home/alice/once", request_id=b"req-1")
    assert fs.stat(ALICE, "/home/alice/once") == d
    # the same request again returns the recorded result instead of EEXIST
    assert fs.mkdir(ALICE, "/home/alice/once", request_id=b"req-1") == d
    kv.faults.inject("unknown_result")
    fs.rename(ALICE, "/home/alice/once", "/home/alice/twice", request_id=b"req-2")
    assert fs.stat(ALICE, "/home/alice/twice").id == d.id


def test_conflict_retry(kv: KV, fs: MetaStore) -> None:
    kv.faults.inject("conflict", times=3)
    assert fs.create(ALICE, "/home/alice/f").created
    assert kv.stats.as_dict()["retries"] >= 3
