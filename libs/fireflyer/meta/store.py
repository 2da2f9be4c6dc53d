"""``MetaStore``: the 3FS metadata operations, each one serializable KV transaction.

Stateless apart from the id allocator's local blocks: any number of stores in any
number of processes over one KV are one file system.  Calls are synchronous (the
service runs them with ``asyncio.to_thread``), take a ``Caller`` and absolute paths,
and raise ``FsError`` with the POSIX errno and the path.  Bad input raises
``FsInvalidArgument`` before any KV access, so nothing is written.

Transactions.  Read-only calls (stat, lstat, stat_inode, readdir, readlink, open
without O_TRUNC, statfs, gc_pending) read at one snapshot with ``snapshot=True``.
Mutations read with conflict tracking everything they base a decision on (the path
walked, the entries checked, the emptiness scan of a directory being removed, the
ancestors walked by rename's loop check) and rename also adds both parents' inodes
and both entries as explicit read-conflict keys, as 3FS does; concurrent renames
therefore cannot create a loop or lose an entry, and the whole thing is serializable
in commit order (checked by the tests against an in-memory model).  Pass
``request_id`` to a mutation to make it safe to retry after ``CommitUnknown`` (the
KV's idempotency records).

Deliberate simplifications (3FS does the same or close):

- a directory's inode is not written when entries are added or removed (no mtime or
  nlink update on the parent), so creates in one directory never conflict on it;
  directories report nlink 2;
- a moved file's inode is not touched by rename (no ctime update);
- the layout policy of a new file is the nearest ancestor's ``dir_policy`` (found
  through parent pointers), else ``root_policy``: changing a directory's policy
  affects later creates below it, never existing files;
- unlinking the last link deletes the inode at once and queues a ``GcItem`` for the
  storage side (no deferral for open files: 3FS's write sessions are not modelled);
- O_TRUNC and ``truncate`` to a smaller length queue a ``TruncateItem``: the storage
  side must cut the chunks past the length (see ``truncate_pending``).
"""

from __future__ import annotations

import errno as E
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import msgspec

from fireflyer.core.clock import SYSTEM_CLOCK, Clock
from fireflyer.core.errors import FsError, NotFound
from fireflyer.kv import KV, Txn

from . import keys
from .alloc import InodeAllocator, read_counter
from .homes import HOME_ROOT, denied_message, permission_hint, plan_home
from .layout import make_layout, rr_initial, rr_shard
from .limits import check_file_size, check_length, check_open_flags, check_time
from .model import (
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
    TruncateItem,
)
from .paths import Walker, check_name_arg, check_target, fs_error, split_path
from .perms import R, W, X, access_for_flags, allowed, owns, sticky_allows

__all__ = ["MetaStore"]

T = TypeVar("T")
_enc = msgspec.msgpack.Encoder()
_gc_dec = msgspec.msgpack.Decoder(GcItem)
_trunc_dec = msgspec.msgpack.Decoder(TruncateItem)
_inode_dec = msgspec.msgpack.Decoder(Inode)
FORMAT_VERSION = 1


def _check_mode(mode: object) -> int:
    if type(mode) is not int or not 0 <= mode <= 0o7777:
        raise FsInvalidArgument(f"mode {mode!r} must be an int in [0, 0o7777]", mode=str(mode))
    return mode


def _check_len(length: object, what: str = "length") -> int:
    return check_length(length, what)


def _check_file_length(inode: Inode, length: int, path: str) -> None:
    """EFBIG when ``length`` is past what the file's layout can hold (see :mod:`.limits`)."""
    try:
        check_file_size(length, inode.layout.chunk_size if inode.layout is not None else None)
    except FsInvalidArgument as e:
        e.fields.setdefault("path", path)
        raise


class _Ids:
    """Inode ids for one call, allocated lazily and reused when the txn retries."""

    def __init__(self, alloc: InodeAllocator) -> None:
        self._alloc = alloc
        self._ids: list[int] = []
        self._used = 0

    def reset(self) -> None:
        self._used = 0

    def take(self) -> int:
        if self._used == len(self._ids):
            self._ids.append(self._alloc.next_id())
        self._used += 1
        return self._ids[self._used - 1]


class MetaStore:
    """The metadata operations over ``kv``; see the module doc."""

    def __init__(
        self,
        kv: KV,
        *,
        tables: ChainTableSource,
        clock: Clock = SYSTEM_CLOCK,
        root_policy: LayoutPolicy = LayoutPolicy(1, 1 << 20, 4),
        alloc_shards: int = 32,
        alloc_block: int = 4096,
    ) -> None:
        root_policy.validate()
        self.kv = kv
        self.tables = tables
        self.clock = clock
        self.root_policy = root_policy
        self.alloc = InodeAllocator(kv, shards=alloc_shards, block_size=alloc_block)

    # -- setup ----------------------------------------------------------------------------
    @staticmethod
    def init(kv: KV, *, clock: Clock = SYSTEM_CLOCK, alloc_shards: int = 32) -> Inode:
        """Create the root (admin-owned, 0o755) and the allocator counters if missing."""

        def fn(txn: Txn) -> Inode:
            raw = txn.get(keys.inode_key(ROOT_ID))
            if raw is not None:
                return _inode_dec.decode(raw)
            now = clock.time()
            root = Inode(ROOT_ID, FileType.DIR, 0o755, 0, 0, 2, 0, now, now, now, parent=ROOT_ID)
            txn.set(keys.inode_key(ROOT_ID), _enc.encode(root))
            for s in range(alloc_shards):
                if txn.get(keys.alloc_key(s)) is None:
                    txn.set(keys.alloc_key(s), read_counter(txn, s).to_bytes(8, "big"))
            txn.set(keys.META, _enc.encode({"format": FORMAT_VERSION}))
            return root

        return kv.run(fn)

    # -- plumbing -------------------------------------------------------------------------
    def _run(
        self,
        fn: Callable[[Txn], T],
        *,
        write: bool,
        request_id: bytes | None = None,
        result_type: Any = None,
    ) -> T:
        """One call = one ``kv.run`` (tests override this to observe the commit order)."""
        if request_id is not None and write:
            return self.kv.run(fn, idempotency_key=b"meta/" + request_id, result_type=result_type)
        return self.kv.run(fn, idempotent=not write)

    def _now(self) -> float:
        return self.clock.time()

    @staticmethod
    def _put(txn: Txn, w: Walker, inode: Inode) -> Inode:
        txn.set(keys.inode_key(inode.id), _enc.encode(inode))
        w.remember(inode)
        return inode

    @staticmethod
    def _put_entry(txn: Txn, parent_id: int, name: str, inode: Inode) -> None:
        txn.set(keys.dentry_key(parent_id, name), _enc.encode((inode.id, inode.type)))

    def _table(self, table_id: int) -> tuple[int, tuple[int, ...]]:
        try:
            return self.tables.get_table(table_id)
        except NotFound:
            raise FsInvalidArgument(f"chain table {table_id} does not exist", table=table_id) from None

    def _check_policy(self, policy: LayoutPolicy | None) -> None:
        if policy is not None:
            if not isinstance(policy, LayoutPolicy):
                raise FsInvalidArgument("policy must be a LayoutPolicy")
            policy.validate(len(self._table(policy.chain_table_id)[1]))

    def _need(self, w: Walker, inode: Inode, want: int, what: str) -> None:
        if not allowed(w.who, inode, want):
            write = bool(want & W)
            raise FsError(denied_message(what, w.path, w.who.user, write=write), errno=E.EACCES, path=w.path,
                          hint=permission_hint(w.who.user, write=write))

    def _effective_policy(self, w: Walker, directory: Inode) -> LayoutPolicy:
        cur = directory
        while True:
            if cur.dir_policy is not None:
                return cur.dir_policy
            if cur.id == ROOT_ID:
                return self.root_policy
            cur = w.must_inode(cur.parent)

    def _new_layout(self, txn: Txn, policy: LayoutPolicy, inode_id: int) -> Layout:
        version, table = self._table(policy.chain_table_id)
        policy.validate(len(table))
        shard = rr_shard(inode_id)
        key = keys.rr_key(policy.chain_table_id, shard)
        raw = txn.get(key, snapshot=True)  # balance only: concurrent creates may share a base
        base = rr_initial(shard, len(table)) if raw is None else int.from_bytes(raw, "big")
        txn.set(key, ((base + policy.stripe_size) % len(table)).to_bytes(8, "big"))
        return make_layout(policy, version, table, base, inode_id)

    def _drop_link(self, txn: Txn, w: Walker, inode: Inode, now: float) -> None:
        """One name of ``inode`` is gone: nlink - 1; at 0 delete it (files go to GC)."""
        if inode.nlink > 1:
            self._put(txn, w, msgspec.structs.replace(inode, nlink=inode.nlink - 1, ctime=now))
            return
        txn.clear(keys.inode_key(inode.id))
        w.forget(inode.id)
        if inode.type is FileType.FILE:
            item = GcItem(inode.id, inode.layout, inode.length, now)
            txn.set(keys.gc_key(inode.id), _enc.encode(item))

    def _set_length(self, txn: Txn, w: Walker, inode: Inode, length: int, now: float) -> Inode:
        if length < inode.length:
            item = TruncateItem(inode.id, inode.layout, length, now)
            txn.set(keys.trunc_key(inode.id), _enc.encode(item))
        return self._put(txn, w, msgspec.structs.replace(inode, length=length, mtime=now, ctime=now))

    def _new_dir(
        self, txn: Txn, w: Walker, parent: Inode, name: str, mode: int, ids: _Ids, policy: LayoutPolicy | None
    ) -> Inode:
        now = self._now()
        who = w.who
        d = Inode(
            ids.take(), FileType.DIR, mode, who.uid, who.gid, 2, 0, now, now, now,
            parent=parent.id, name=name, dir_policy=policy,
        )  # fmt: skip
        self._put(txn, w, d)
        self._put_entry(txn, parent.id, name, d)
        return d

    # -- directories ----------------------------------------------------------------------
    def mkdir(
        self,
        who: Caller,
        path: str,
        mode: int = 0o755,
        *,
        parents: bool = False,
        policy: LayoutPolicy | None = None,
        request_id: bytes | None = None,
    ) -> Inode:
        """Make a directory (EEXIST if the name exists).  ``parents=True`` is ``mkdir -p``:
        missing ancestors are made (with ``mode``, no policy) and an existing directory at
        ``path`` is returned as is.  ``policy`` becomes the new directory's ``dir_policy``.
        ``path`` may be at most ``limits.MAX_DEPTH`` levels deep (ENAMETOOLONG)."""
        comps = split_path(path, new_name=True)
        _check_mode(mode)
        self._check_policy(policy)
        ids = _Ids(self.alloc)

        def fn(txn: Txn) -> Inode:
            ids.reset()
            w = Walker(txn, who, snapshot=False, path=path)
            if not parents:
                parent, name = w.parent_of(comps, E.EEXIST)
                if w.entry(parent.id, name) is not None:
                    raise fs_error(E.EEXIST, "file exists", path)
                self._need(w, parent, W | X, "write on parent")
                return self._new_dir(txn, w, parent, name, mode, ids, policy)
            cur = w.root()
            for i, name in enumerate(comps):
                last = i == len(comps) - 1
                if name == "..":
                    cur = w.walk(cur, [".."], follow_last=True)
                    continue
                w._search(cur)
                if w.entry(cur.id, name) is None:
                    # name the directory that lacks the permission (an ancestor, not the parent)
                    where = "write on parent" if last else f"write on {'/' + '/'.join(comps[:i])}"
                    self._need(w, cur, W | X, where)
                    cur = self._new_dir(txn, w, cur, name, mode, ids, policy if last else None)
                    continue
                child = w.walk(cur, [name], follow_last=True)
                if child.type is not FileType.DIR:
                    raise fs_error(E.EEXIST if last else E.ENOTDIR, "exists and is not a directory", path)
                cur = child
            return cur

        return self._run(fn, write=True, request_id=request_id, result_type=Inode)

    def ensure_home(self, user: str, uid: int, gid: int) -> tuple[Inode, bool]:
        """Make ``/home`` (root's, 0755) and ``/home/<user>`` (owned by uid/gid, 0700) where
        missing (see :mod:`.homes`); (the home's inode, whether this call made it).  An
        existing home is returned as it is, whatever its mode or owner (an admin may have
        changed them); a non-directory in its place is EEXIST.  Idempotent, one transaction."""
        ids = _Ids(self.alloc)
        root_caller = Caller(0, 0, admin=True)

        def fn(txn: Txn) -> tuple[Inode, bool]:
            ids.reset()
            w = Walker(txn, root_caller, snapshot=False, path=HOME_ROOT)
            root = w.root()
            found = w.entry(root.id, HOME_ROOT.lstrip("/"))
            base = w.must_inode(found[0]) if found is not None else None
            if base is not None and base.type is not FileType.DIR:
                raise fs_error(E.EEXIST, "exists and is not a directory", HOME_ROOT)
            home = None
            if base is not None:
                entry = w.entry(base.id, user)
                home = w.must_inode(entry[0]) if entry is not None else None
            steps = plan_home(user, uid, gid, root_exists=base is not None, home_exists=home is not None)
            for step in steps:
                parent = root if step.path == HOME_ROOT else base
                assert parent is not None
                mk = Walker(txn, Caller(step.uid, step.gid, admin=True), snapshot=False, path=step.path)
                made = self._new_dir(txn, mk, parent, step.path.rsplit("/", 1)[1], step.mode, ids, None)
                if step.path == HOME_ROOT:
                    base = made
                else:
                    home = made
            assert home is not None
            if home.type is not FileType.DIR:
                raise fs_error(E.EEXIST, "a non-directory is in the place of the home", f"{HOME_ROOT}/{user}")
            return home, any(s.path != HOME_ROOT for s in steps)

        inode, created = self._run(fn, write=True, result_type=tuple[Inode, bool])
        return inode, created

    def rmdir(self, who: Caller, path: str, *, request_id: bytes | None = None) -> None:
        """Remove an empty directory (ENOTEMPTY, ENOTDIR; EBUSY for ``/``)."""
        comps = split_path(path)

        def fn(txn: Txn) -> None:
            w = Walker(txn, who, snapshot=False, path=path)
            parent, name = w.parent_of(comps, E.EBUSY)
            found = w.entry(parent.id, name)
            if found is None:
                raise fs_error(E.ENOENT, "no such file or directory", path)
            self._need(w, parent, W | X, "write on parent")
            inode = w.must_inode(found[0])
            if not sticky_allows(who, parent, inode):
                raise fs_error(E.EPERM, "sticky directory: not the owner", path)
            if inode.type is not FileType.DIR:
                raise fs_error(E.ENOTDIR, "not a directory", path)
            if not w.is_empty(inode.id):
                raise fs_error(E.ENOTEMPTY, "directory not empty", path)
            txn.clear(keys.dentry_key(parent.id, name))
            txn.clear(keys.inode_key(inode.id))

        self._run(fn, write=True, request_id=request_id)

    def readdir(self, who: Caller, path: str, *, after: str = "", limit: int = 128) -> ReaddirPage:
        """Entries after the name ``after`` (exclusive), at most ``limit``, in byte order:
        one range scan of the directory's ``DENT`` prefix.  Needs read permission."""
        comps = split_path(path)
        check_name_arg(after, "after")
        if type(limit) is not int or limit < 1:
            raise FsInvalidArgument(f"limit {limit!r} must be an int >= 1", limit=str(limit))

        def fn(txn: Txn) -> ReaddirPage:
            w = Walker(txn, who, snapshot=True, path=path)
            d = w.resolve(comps, follow_last=True)
            if d.type is not FileType.DIR:
                raise fs_error(E.ENOTDIR, "not a directory", path)
            self._need(w, d, R, "read on directory")
            begin, end = keys.dentry_range(d.id)
            if after:
                begin = keys.dentry_key(d.id, after) + b"\x00"
            rows = txn.get_range(begin, end, limit=limit + 1, snapshot=True)
            entries = []
            for k, v in rows[:limit]:
                iid, typ = msgspec.msgpack.decode(v, type=tuple[int, FileType])
                entries.append(DirEntry(keys.dentry_name(k), iid, typ))
            more = len(rows) > limit
            return ReaddirPage(tuple(entries), more, entries[-1].name if entries else after)

        return self._run(fn, write=False)

    def set_dir_policy(
        self, who: Caller, path: str, policy: LayoutPolicy | None, *, request_id: bytes | None = None
    ) -> Inode:
        """Set (or clear, with None) the default layout for files created below ``path``."""
        comps = split_path(path)
        self._check_policy(policy)

        def fn(txn: Txn) -> Inode:
            w = Walker(txn, who, snapshot=False, path=path)
            d = w.resolve(comps, follow_last=True)
            if d.type is not FileType.DIR:
                raise fs_error(E.ENOTDIR, "not a directory", path)
            if not owns(who, d):
                raise fs_error(E.EPERM, "only the owner may set a directory's layout policy", path)
            return self._put(txn, w, msgspec.structs.replace(d, dir_policy=policy, ctime=self._now()))

        return self._run(fn, write=True, request_id=request_id, result_type=Inode)

    # -- files ----------------------------------------------------------------------------
    def create(
        self,
        who: Caller,
        path: str,
        mode: int = 0o644,
        *,
        flags: int = os.O_CREAT,
        policy: LayoutPolicy | None = None,
        request_id: bytes | None = None,
    ) -> OpenResult:
        """Open-or-create a regular file (O_CREAT is implied).  O_EXCL: EEXIST if the name
        exists (a symlink included, never followed); otherwise a final symlink is followed
        (a dangling one creates its target) unless O_NOFOLLOW (ELOOP).  An existing file
        is checked against the access mode (O_TRUNC needs write and sets length 0); a
        new one gets ``policy`` or the parent's effective policy, and its layout.  ``flags``
        with unknown bits (``limits.check_open_flags``) are EINVAL."""
        comps = split_path(path, new_name=True)
        _check_mode(mode)
        check_open_flags(flags)
        self._check_policy(policy)
        flags |= os.O_CREAT
        ids = _Ids(self.alloc)

        def fn(txn: Txn) -> OpenResult:
            ids.reset()
            w = Walker(txn, who, snapshot=False, path=path)
            parent, name = w.parent_of(comps, E.EISDIR)
            found = w.entry(parent.id, name)
            while found is not None and found[1] is FileType.SYMLINK:
                if flags & os.O_EXCL:
                    raise fs_error(E.EEXIST, "file exists", path)
                if flags & os.O_NOFOLLOW:
                    raise fs_error(E.ELOOP, "final component is a symlink (O_NOFOLLOW)", path)
                start, tcomps = w.follow(w.must_inode(found[0]), parent)
                parent, name = w.parent_of(tcomps, E.EISDIR, start=start)
                found = w.entry(parent.id, name)
            if found is not None:
                if flags & os.O_EXCL:
                    raise fs_error(E.EEXIST, "file exists", path)
                existing = w.must_inode(found[0])
                if existing.type is FileType.DIR:
                    raise fs_error(E.EISDIR, "is a directory", path)
                return OpenResult(self._open_existing(txn, w, existing, flags), False)
            self._need(w, parent, W | X, "write on parent")
            iid = ids.take()
            layout = self._new_layout(txn, policy or self._effective_policy(w, parent), iid)
            now = self._now()
            f = Inode(iid, FileType.FILE, mode, who.uid, who.gid, 1, 0, now, now, now, layout=layout)
            self._put(txn, w, f)
            self._put_entry(txn, parent.id, name, f)
            return OpenResult(f, True)

        return self._run(fn, write=True, request_id=request_id, result_type=OpenResult)

    def _open_existing(self, txn: Txn, w: Walker, inode: Inode, flags: int) -> Inode:
        if flags & os.O_DIRECTORY and inode.type is not FileType.DIR:
            raise fs_error(E.ENOTDIR, "not a directory", w.path)
        if inode.type is FileType.DIR and (flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC):
            raise fs_error(E.EISDIR, "is a directory", w.path)
        if inode.type is FileType.SYMLINK:
            raise fs_error(E.ELOOP, "final component is a symlink (O_NOFOLLOW)", w.path)
        self._need(w, inode, access_for_flags(flags), "open")
        if flags & os.O_TRUNC and inode.type is FileType.FILE and inode.length > 0:
            return self._set_length(txn, w, inode, 0, self._now())
        return inode

    def open(self, who: Caller, path: str, flags: int = os.O_RDONLY) -> OpenResult:
        """Open an existing file or directory, checking permission for the access mode.
        With O_CREAT it is ``create(who, path, 0o644, flags=flags)``."""
        check_open_flags(flags)
        if flags & os.O_CREAT:
            return self.create(who, path, 0o644, flags=flags)
        comps = split_path(path)
        write = bool(flags & os.O_TRUNC)

        def fn(txn: Txn) -> OpenResult:
            w = Walker(txn, who, snapshot=not write, path=path)
            inode = w.resolve(comps, follow_last=not flags & os.O_NOFOLLOW)
            return OpenResult(self._open_existing(txn, w, inode, flags), False)

        return self._run(fn, write=write)

    def stat(self, who: Caller, path: str) -> Inode:
        """The inode at ``path``, following symlinks (x on every directory walked)."""
        comps = split_path(path)
        return self._run(
            lambda txn: Walker(txn, who, snapshot=True, path=path).resolve(comps, follow_last=True),
            write=False,
        )

    def lstat(self, who: Caller, path: str) -> Inode:
        """The inode at ``path``; a final symlink is returned itself."""
        comps = split_path(path)
        return self._run(
            lambda txn: Walker(txn, who, snapshot=True, path=path).resolve(comps, follow_last=False),
            write=False,
        )

    def stat_inode(self, who: Caller, inode_id: int, *, opened: bool = False) -> Inode:
        """An inode by id (ENOENT if gone), with the permission reaching it would need.

        Files keep no parent pointer (hard links give them several), so the path to one is
        unknown here; the rule is: root and the owner
        always; a directory when every directory from the root down to its parent is
        searchable (x), as a path lookup would need; another user's file only when the
        caller ``opened`` it (the servicer checked a chunk capability meta granted to this
        caller for this inode), since its open already passed the path's checks.  Else
        EACCES: an inode id guessed or scanned reveals nothing."""
        _check_len(inode_id, "inode id")

        def fn(txn: Txn) -> Inode:
            w = Walker(txn, who, snapshot=True)
            got = w.inode(inode_id)
            if got is None:
                raise FsError(f"no inode {inode_id}", errno=E.ENOENT, inode=inode_id)
            if owns(who, got) or opened:
                return got
            if got.type is FileType.DIR:
                cur = got
                while cur.id != ROOT_ID:
                    parent = w.must_inode(cur.parent)
                    if not allowed(who, parent, X):
                        break
                    cur = parent
                else:
                    return got
            raise FsError(f"stat of inode {inode_id} by id refused to {who.user or who.uid}: not its owner, "
                          "and the path to it is not searchable by you (a file: open it by path first)",
                          errno=E.EACCES, inode=inode_id)

        return self._run(fn, write=False)

    def inode_by_id(self, inode_id: int) -> Inode:
        """An inode by id without any permission check (callers check: a capability renewal)."""
        _check_len(inode_id, "inode id")

        def fn(txn: Txn) -> Inode:
            got = Walker(txn, Caller(0, 0, admin=True), snapshot=True).inode(inode_id)
            if got is None:
                raise FsError(f"no inode {inode_id}", errno=E.ENOENT, inode=inode_id)
            return got

        return self._run(fn, write=False)

    def unlink(self, who: Caller, path: str, *, request_id: bytes | None = None) -> None:
        """Remove a file or symlink name (EISDIR for directories); nlink - 1, GC at 0."""
        comps = split_path(path)

        def fn(txn: Txn) -> None:
            w = Walker(txn, who, snapshot=False, path=path)
            parent, name = w.parent_of(comps, E.EISDIR)
            found = w.entry(parent.id, name)
            if found is None:
                raise fs_error(E.ENOENT, "no such file or directory", path)
            self._need(w, parent, W | X, "write on parent")
            inode = w.must_inode(found[0])
            if not sticky_allows(who, parent, inode):
                raise fs_error(E.EPERM, "sticky directory: not the owner", path)
            if inode.type is FileType.DIR:
                raise fs_error(E.EISDIR, "is a directory (use rmdir)", path)
            txn.clear(keys.dentry_key(parent.id, name))
            self._drop_link(txn, w, inode, self._now())

        self._run(fn, write=True, request_id=request_id)

    def link(self, who: Caller, existing: str, new: str, *, request_id: bytes | None = None) -> Inode:
        """A hard link ``new`` to the regular file ``existing`` (not followed if a symlink;
        EPERM for directories and symlinks).  Returns the file with nlink + 1."""
        src, dst = split_path(existing), split_path(new, new_name=True)

        def fn(txn: Txn) -> Inode:
            w = Walker(txn, who, snapshot=False, path=existing)
            inode = w.resolve(src, follow_last=False)
            if inode.type is not FileType.FILE:
                raise fs_error(E.EPERM, "hard links are allowed to regular files only", existing)
            if not owns(who, inode) and not allowed(who, inode, R | W):
                # Linux protected_hardlinks: a link to someone else's file you cannot read and
                # write would pin it (quota, a later chmod, a setuid trap) in a place you control
                raise fs_error(E.EPERM, "hard link to a file you neither own nor may read and write "
                               "(protected hardlinks)", existing)
            w.path = new
            parent, name = w.parent_of(dst, E.EEXIST)
            if w.entry(parent.id, name) is not None:
                raise fs_error(E.EEXIST, "file exists", new)
            self._need(w, parent, W | X, "write on parent")
            inode = w.must_inode(inode.id)
            out = self._put(txn, w, msgspec.structs.replace(inode, nlink=inode.nlink + 1, ctime=self._now()))
            self._put_entry(txn, parent.id, name, out)
            return out

        return self._run(fn, write=True, request_id=request_id, result_type=Inode)

    def symlink(self, who: Caller, target: str, linkpath: str, *, request_id: bytes | None = None) -> Inode:
        """Make symlink ``linkpath`` -> ``target`` (any non-empty string; not checked)."""
        check_target(target)
        comps = split_path(linkpath, new_name=True)
        ids = _Ids(self.alloc)

        def fn(txn: Txn) -> Inode:
            ids.reset()
            w = Walker(txn, who, snapshot=False, path=linkpath)
            parent, name = w.parent_of(comps, E.EEXIST)
            if w.entry(parent.id, name) is not None:
                raise fs_error(E.EEXIST, "file exists", linkpath)
            self._need(w, parent, W | X, "write on parent")
            now = self._now()
            n = len(target.encode("utf-8"))
            s = Inode(
                ids.take(), FileType.SYMLINK, 0o777, who.uid, who.gid, 1, n, now, now, now, target=target
            )
            self._put(txn, w, s)
            self._put_entry(txn, parent.id, name, s)
            return s

        return self._run(fn, write=True, request_id=request_id, result_type=Inode)

    def readlink(self, who: Caller, path: str) -> str:
        """A symlink's target (EINVAL if ``path`` is not a symlink)."""
        comps = split_path(path)

        def fn(txn: Txn) -> str:
            inode = Walker(txn, who, snapshot=True, path=path).resolve(comps, follow_last=False)
            if inode.type is not FileType.SYMLINK:
                raise fs_error(E.EINVAL, "not a symbolic link", path)
            return inode.target

        return self._run(fn, write=False)

    def truncate(self, who: Caller, path: str, length: int, *, request_id: bytes | None = None) -> Inode:
        """Set a file's length (needs write permission; EISDIR for directories; EFBIG past
        what the file's layout can hold, EINVAL for a negative length: see :mod:`.limits`)."""
        comps = split_path(path)
        check_length(length, max_value=None)  # EFBIG against the file's own layout, in the transaction

        def fn(txn: Txn) -> Inode:
            w = Walker(txn, who, snapshot=False, path=path)
            inode = w.resolve(comps, follow_last=True)
            if inode.type is FileType.DIR:
                raise fs_error(E.EISDIR, "is a directory", path)
            self._need(w, inode, W, "write")
            _check_file_length(inode, length, path)
            return self._set_length(txn, w, inode, length, self._now())

        return self._run(fn, write=True, request_id=request_id, result_type=Inode)

    def report_length(self, who: Caller, inode_id: int, length: int) -> Inode:
        """A client's max written position: adopted if larger than the recorded length.
        Idempotent by nature (max), so safe to retry without a request id.  EFBIG past what
        the file's layout can hold."""
        _check_len(inode_id, "inode id")
        check_length(length, max_value=None)  # EFBIG against the file's own layout, in the transaction

        def fn(txn: Txn) -> Inode:
            w = Walker(txn, who, snapshot=False, path=f"<inode {inode_id}>")
            inode = w.inode(inode_id)
            if inode is None:
                raise FsError(f"no inode {inode_id}", errno=E.ENOENT, inode=inode_id)
            if inode.type is not FileType.FILE:
                raise FsError(f"inode {inode_id} is not a file", errno=E.EISDIR, inode=inode_id)
            self._need(w, inode, W, "write")
            _check_file_length(inode, length, f"<inode {inode_id}>")
            if length <= inode.length:
                return inode
            return self._put(txn, w, msgspec.structs.replace(inode, length=length, mtime=self._now()))

        return self.kv.run(fn, idempotent=True)

    def setattr(
        self,
        who: Caller,
        path: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime: float | None = None,
        mtime: float | None = None,
        request_id: bytes | None = None,
    ) -> Inode:
        """chmod (owner or admin), chown/chgrp (admin/root only), utimes (owner or admin);
        follows symlinks.  EPERM when not allowed; EINVAL for a time that is not finite or
        outside ``limits.MIN_TIME .. MAX_TIME``."""
        comps = split_path(path)
        if mode is not None:
            _check_mode(mode)
        for v, what in ((uid, "uid"), (gid, "gid")):
            if v is not None:
                _check_len(v, what)
        if atime is not None:
            atime = check_time(atime, "atime")
        if mtime is not None:
            mtime = check_time(mtime, "mtime")

        def fn(txn: Txn) -> Inode:
            w = Walker(txn, who, snapshot=False, path=path)
            inode = w.resolve(comps, follow_last=True)
            chown = (uid is not None and uid != inode.uid) or (gid is not None and gid != inode.gid)
            if chown and not who.is_super:
                raise fs_error(E.EPERM, "only an admin may change the owner or group", path)
            if (mode is not None or atime is not None or mtime is not None) and not owns(who, inode):
                raise fs_error(E.EPERM, "only the owner may change mode or times", path)
            new = msgspec.structs.replace(
                inode,
                mode=inode.mode if mode is None else mode,
                uid=inode.uid if uid is None else uid,
                gid=inode.gid if gid is None else gid,
                atime=inode.atime if atime is None else float(atime),
                mtime=inode.mtime if mtime is None else float(mtime),
                ctime=self._now(),
            )
            return self._put(txn, w, new)

        return self._run(fn, write=True, request_id=request_id, result_type=Inode)

    # -- rename ---------------------------------------------------------------------------
    def rename(self, who: Caller, src: str, dst: str, *, request_id: bytes | None = None) -> None:
        """Atomically move ``src`` to ``dst``.  Order of checks: both parents resolved
        (ENOENT/ENOTDIR/EACCES), ``/`` on either side EBUSY, src missing ENOENT, same
        entry: no-op, write on both parents EACCES, sticky EPERM, moving a directory
        into itself or a descendant EINVAL (walking ``dst``'s ancestors), then against an
        existing ``dst``: same inode no-op, ENOTDIR / EISDIR on type mismatch, sticky
        EPERM, ENOTEMPTY for a non-empty directory; a replaced file loses a link (GC at
        0), a replaced empty directory is deleted."""
        sc, dc = split_path(src), split_path(dst, new_name=True)

        def fn(txn: Txn) -> None:
            w = Walker(txn, who, snapshot=False, path=src)
            sp, sname = w.parent_of(sc, E.EBUSY)
            w.path = dst
            dp, dname = w.parent_of(dc, E.EBUSY)
            w.path = src
            for k in (
                keys.inode_key(sp.id),
                keys.inode_key(dp.id),
                keys.dentry_key(sp.id, sname),
                keys.dentry_key(dp.id, dname),
            ):
                txn.add_read_conflict_key(k)
            found = w.entry(sp.id, sname)
            if found is None:
                raise fs_error(E.ENOENT, "no such file or directory", src)
            if sp.id == dp.id and sname == dname:
                return
            self._need(w, sp, W | X, "write on source parent")
            self._need(w, dp, W | X, "write on destination parent")
            moving = w.must_inode(found[0])
            if not sticky_allows(who, sp, moving):
                raise fs_error(E.EPERM, "sticky directory: not the owner", src)
            if moving.type is FileType.DIR:
                a = dp
                while True:
                    if a.id == moving.id:
                        raise fs_error(E.EINVAL, f"cannot move a directory into itself ({dst})", src)
                    if a.id == ROOT_ID:
                        break
                    a = w.must_inode(a.parent)
                if sp.id != dp.id:
                    self._need(w, moving, W, "write on the moved directory")
            w.path = dst
            now = self._now()
            there = w.entry(dp.id, dname)
            if there is not None:
                if there[0] == moving.id:
                    return
                old = w.must_inode(there[0])
                if moving.type is FileType.DIR and old.type is not FileType.DIR:
                    raise fs_error(E.ENOTDIR, "destination is not a directory", dst)
                if moving.type is not FileType.DIR and old.type is FileType.DIR:
                    raise fs_error(E.EISDIR, "destination is a directory", dst)
                if not sticky_allows(who, dp, old):
                    raise fs_error(E.EPERM, "sticky directory: not the owner", dst)
                if old.type is FileType.DIR:
                    if not w.is_empty(old.id):
                        raise fs_error(E.ENOTEMPTY, "destination directory not empty", dst)
                    txn.clear(keys.inode_key(old.id))
                else:
                    self._drop_link(txn, w, old, now)
            txn.clear(keys.dentry_key(sp.id, sname))
            self._put_entry(txn, dp.id, dname, moving)
            if moving.type is FileType.DIR:
                self._put(txn, w, msgspec.structs.replace(moving, parent=dp.id, name=dname, ctime=now))

        self._run(fn, write=True, request_id=request_id)

    # -- accounting and GC ----------------------------------------------------------------
    def statfs(self, who: Caller) -> StatFs:
        """Counts from one snapshot scan of ``INOD`` and ``GCQU`` (O(inodes))."""

        def fn(txn: Txn) -> StatFs:
            counts = {t: 0 for t in FileType}
            used = 0
            b, e = keys.INOD, keys.INOD[:-1] + b"E"
            for _, v in txn.get_range(b, e, snapshot=True):
                inode = _inode_dec.decode(v)
                counts[inode.type] += 1
                used += inode.length if inode.type is FileType.FILE else 0
            gc = len(txn.get_range(keys.GCQU, keys.GCQU[:-1] + b"V", snapshot=True))
            n = sum(counts.values())
            return StatFs(n, counts[FileType.FILE], counts[FileType.DIR], counts[FileType.SYMLINK], used, gc)

        return self._run(fn, write=False)

    def gc_pending(self, limit: int = 128) -> list[GcItem]:
        """Removed files whose chunks still have to be deleted, in inode id order."""
        if type(limit) is not int or limit < 1:
            raise FsInvalidArgument("limit must be an int >= 1")
        return self._run(
            lambda txn: [
                _gc_dec.decode(v) for _, v in txn.get_range(keys.GCQU, b"GCQV", limit=limit, snapshot=True)
            ],
            write=False,
        )

    def gc_done(self, inode_ids: Iterable[int]) -> None:
        """The storage side deleted these files' chunks: drop their GC records."""
        ids = [_check_len(i, "inode id") for i in inode_ids]

        def fn(txn: Txn) -> None:
            for i in ids:
                txn.clear(keys.gc_key(i))

        self.kv.run(fn, idempotent=True)

    def truncate_pending(self, limit: int = 128) -> list[TruncateItem]:
        """Files shrunk since the storage side last acknowledged (latest length each)."""
        if type(limit) is not int or limit < 1:
            raise FsInvalidArgument("limit must be an int >= 1")
        return self._run(
            lambda txn: [
                _trunc_dec.decode(v) for _, v in txn.get_range(keys.TRNC, b"TRND", limit=limit, snapshot=True)
            ],
            write=False,
        )

    def truncate_done(self, items: Iterable[TruncateItem]) -> None:
        """Acknowledge applied truncations; a record replaced since (a newer truncate)
        is kept."""
        todo = list(items)

        def fn(txn: Txn) -> None:
            for item in todo:
                k = keys.trunc_key(item.inode_id)
                if txn.get(k) == _enc.encode(item):
                    txn.clear(k)

        self.kv.run(fn, idempotent=True)
