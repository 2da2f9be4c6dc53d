"""Path validation and resolution inside one KV transaction.

Validation (``split_path``, before any KV access, so bad input writes nothing):
paths are ``str``, absolute, without NUL, valid UTF-8, at most 4096 bytes; each
component at most 255 bytes, and a path that makes a name (``new_name``) at most 256
components (ENAMETOOLONG; the limits live in :mod:`.limits`); empty components (``//``) and ``.`` are
dropped lexically (so ``/a/.`` is ``/a``), a trailing slash is ignored; ``..`` is
resolved physically, through the directory's parent pointer (root's parent is root).
Bad input raises ``FsInvalidArgument`` (an ``FsError`` with errno EINVAL or
ENAMETOOLONG that is also an ``InvalidArgument``: gRPC INVALID_ARGUMENT).

Resolution (``Walker``): every directory searched needs search (x) permission
(EACCES), a non-directory in the middle is ENOTDIR, a missing name ENOENT; symlinks
in intermediate components are always followed, in the final one only where the
operation says so; more than 40 symlinks in one resolution is ELOOP.  Relative
targets resolve from the directory holding the link.  A walker reads with
``snapshot=True`` for read-only calls and tracked reads for mutations, so that a
mutation conflicts with any concurrent change of the path it resolved.
"""

from __future__ import annotations

import errno as E

import msgspec

from fireflyer.core.errors import FsError
from fireflyer.kv import Txn

from . import keys
from .homes import denied_message, permission_hint
from .limits import MAX_DEPTH, MAX_NAME, MAX_PATH, check_depth, check_path_bytes
from .model import ROOT_ID, Caller, FileType, FsInvalidArgument, Inode
from .perms import X, allowed

__all__ = ["split_path", "check_name_arg", "check_target", "Walker", "MAX_NAME", "MAX_PATH", "MAX_DEPTH",
           "MAX_LINKS"]

MAX_LINKS = 40

_inode_dec = msgspec.msgpack.Decoder(Inode)
_entry_dec = msgspec.msgpack.Decoder(tuple[int, FileType])


def _utf8(s: str, path: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError:
        raise FsInvalidArgument("path is not valid UTF-8", path=path) from None


def split_path(path: object, *, new_name: bool = False) -> list[str]:
    """The components of an absolute path (see the module doc), or ``FsInvalidArgument``.
    ``new_name``: the path makes a name, so it may be at most ``MAX_DEPTH`` levels deep
    (see :mod:`.limits`)."""
    if not isinstance(path, str):
        raise FsInvalidArgument(f"path must be a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise FsInvalidArgument(f"path {path!r} is not absolute", path=path)
    if "\0" in path:
        raise FsInvalidArgument("path contains a NUL byte", path=path)
    check_path_bytes(path)
    comps = [c for c in path.split("/") if c and c != "."]
    for c in comps:
        if len(c.encode("utf-8")) > MAX_NAME:
            raise FsInvalidArgument(
                f"name {c[:32]!r}... is {len(c.encode())} bytes; the limit is {MAX_NAME} (NAME_MAX)",
                errno=E.ENAMETOOLONG, path=path[:256], field="name", limit=MAX_NAME,
            )
    if new_name:
        check_depth(comps, path)
    return comps


def check_name_arg(name: object, what: str) -> str:
    """A bare name argument (readdir's ``after``): no '/', no NUL, <= 255 bytes ('' allowed)."""
    if not isinstance(name, str) or "/" in name or "\0" in name:
        raise FsInvalidArgument(f"{what} must be a name without '/' or NUL", name=str(name)[:64])
    if len(_utf8(name, name)) > MAX_NAME:
        raise FsInvalidArgument(f"{what} is longer than {MAX_NAME} bytes", errno=E.ENAMETOOLONG)
    return name


def check_target(target: object) -> str:
    """A symlink target: non-empty str, no NUL, <= 4096 bytes (relative targets allowed)."""
    if not isinstance(target, str) or not target or "\0" in target:
        raise FsInvalidArgument("symlink target must be a non-empty str without NUL", target=str(target)[:64])
    if len(_utf8(target, target)) > MAX_PATH:
        raise FsInvalidArgument(f"symlink target longer than {MAX_PATH} bytes", errno=E.ENAMETOOLONG)
    return target


def _target_comps(target: str) -> list[str]:
    return [c for c in target.split("/") if c and c != "."]


def fs_error(errno: int, what: str, path: str) -> FsError:
    return FsError(f"{what}: {path}", errno=errno, path=path)


class Walker:
    """Reads inodes and entries for one call in one transaction (with a per-call
    inode cache) and resolves paths.  ``path`` is the caller's path, for errors."""

    def __init__(self, txn: Txn, who: Caller, *, snapshot: bool, path: str = "") -> None:
        self.txn = txn
        self.who = who
        self.snapshot = snapshot
        self.path = path
        self.links = 0
        self._cache: dict[int, Inode] = {}

    # -- reads ------------------------------------------------------------------------
    def inode(self, inode_id: int) -> Inode | None:
        got = self._cache.get(inode_id)
        if got is None:
            raw = self.txn.get(keys.inode_key(inode_id), snapshot=self.snapshot)
            if raw is None:
                return None
            got = self._cache[inode_id] = _inode_dec.decode(raw)
        return got

    def must_inode(self, inode_id: int) -> Inode:
        got = self.inode(inode_id)
        if got is None:
            if inode_id == ROOT_ID:
                raise FsError("file system not initialized (run MetaStore.init)", errno=E.ENOENT, path="/")
            raise fs_error(E.ENOENT, f"inode {inode_id} vanished", self.path)
        return got

    def remember(self, inode: Inode) -> None:
        """Keep a written inode visible to later reads of this call."""
        self._cache[inode.id] = inode

    def forget(self, inode_id: int) -> None:
        self._cache.pop(inode_id, None)

    def entry(self, parent_id: int, name: str) -> tuple[int, FileType] | None:
        raw = self.txn.get(keys.dentry_key(parent_id, name), snapshot=self.snapshot)
        return None if raw is None else _entry_dec.decode(raw)

    def root(self) -> Inode:
        return self.must_inode(ROOT_ID)

    def is_empty(self, dir_id: int) -> bool:
        b, e = keys.dentry_range(dir_id)
        return not self.txn.get_range(b, e, limit=1, snapshot=self.snapshot)

    # -- resolution ---------------------------------------------------------------------
    def _search(self, cur: Inode) -> None:
        if cur.type is not FileType.DIR:
            raise fs_error(E.ENOTDIR, "not a directory", self.path)
        if not allowed(self.who, cur, X):
            raise FsError(denied_message("search", self.path, self.who.user, write=False), errno=E.EACCES,
                          path=self.path, hint=permission_hint(self.who.user, write=False))

    def follow(self, link: Inode, cur: Inode) -> tuple[Inode, list[str]]:
        """Where symlink ``link`` (found in directory ``cur``) points: (start dir, comps)."""
        self.links += 1
        if self.links > MAX_LINKS:
            raise fs_error(E.ELOOP, f"more than {MAX_LINKS} symbolic links", self.path)
        start = self.root() if link.target.startswith("/") else cur
        return start, _target_comps(link.target)

    def walk(self, start: Inode, comps: list[str], *, follow_last: bool) -> Inode:
        cur = start
        todo = list(reversed(comps))
        while todo:
            name = todo.pop()
            self._search(cur)
            if name == "..":
                cur = self.must_inode(cur.parent) if cur.id != ROOT_ID else cur
                continue
            found = self.entry(cur.id, name)
            if found is None:
                raise fs_error(E.ENOENT, "no such file or directory", self.path)
            child = self.must_inode(found[0])
            if child.type is FileType.SYMLINK and (todo or follow_last):
                cur, more = self.follow(child, cur)
                todo.extend(reversed(more))
                continue
            cur = child
        return cur

    def resolve(self, comps: list[str], *, follow_last: bool) -> Inode:
        return self.walk(self.root(), comps, follow_last=follow_last)

    def parent_of(self, comps: list[str], root_errno: int, start: Inode | None = None) -> tuple[Inode, str]:
        """The directory holding the last component (searched: x checked) and its name.

        An empty path (``/``) raises ``root_errno`` (EEXIST for mkdir, EBUSY for rmdir ...);
        a last component ``..`` is EINVAL (it names no entry that could be changed).
        """
        if not comps:
            raise fs_error(root_errno, "operation not possible on the root directory", self.path)
        if comps[-1] == "..":
            raise FsInvalidArgument(f"last component of {self.path!r} may not be '..'", path=self.path)
        parent = self.walk(start or self.root(), comps[:-1], follow_last=True)
        self._search(parent)
        return parent, comps[-1]
