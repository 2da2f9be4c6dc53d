"""The synchronous 3FS client: ``connect()``, namespace calls, files, batch I/O.

    import fireflyer.fs as ff
    fs = ff.connect()                                  # FF_META_ADDR / FF_MGMTD_ADDR / FF_TOKEN, or .ff/
    fs.mkdir("/ckpt", parents=True, exist_ok=True)
    with fs.open("/ckpt/shard-0", "wb") as f:
        f.write(blob)
    res = fs.batch_read([("/ckpt/shard-0", 0, 4096), ("/ckpt/shard-0", 1 << 20, 4096)])

Users are training scripts and the checkpoint manager, so the API is blocking.
Meta calls run the async :class:`~.meta_client.MetaClient` on a private event-loop
thread; data goes through :class:`~fireflyer.storage.client_min.StorageClient`
(chain heads for writes, any serving replica for reads, failover, request-to-send)
and :mod:`.batch` (grouping by chain and node, dedupe-safe write retries).

**Where to.**  ``connect(meta=, mgmtd=, token=, state_dir=)``; each unset one comes
from ``FF_META_ADDR`` / ``FF_MGMTD_ADDR`` / ``FF_TOKEN``, else from the cluster that
``ff up`` recorded under ``state_dir`` (``FF_STATE_DIR``, default ``.ff``; the user
token): :func:`fireflyer.cluster.discovery.find_cluster`.  With none of them,
``NoClusterFound`` says how to point the client at a cluster.  Timing comes from :class:`FsClientSettings` (``FF_FS_*``).

**Paths.**  A path without a leading ``/`` is relative to the caller's home
``/home/<user>`` (``fs.home``; meta creates it on the first ``WhoAmI``, which the client
sends when it first meets a relative path): ``fs.write_bytes("data/x.bin", b)`` writes
``/home/<user>/data/x.bin``.

**Errors.**  File-system errors are ``FsError`` with ``errno`` and ``path`` (ENOENT,
EISDIR, EACCES, EEXIST ...: also ``OSError``); bad arguments are
``InvalidArgument`` (also ``ValueError``), raised before anything is sent; storage
errors that outlast the retry deadline are the storage's typed errors.
"""

from __future__ import annotations

import asyncio
import errno as E
import itertools
import os
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec

from fireflyer.core.errors import FireFlyerError, FsError, InvalidArgument
from fireflyer.core.settings import load_settings
from fireflyer.meta import DirEntry, FileType, Inode, Layout, LayoutPolicy
from fireflyer.meta.limits import check_file_size
from fireflyer.storage.capability import CapabilityCache, CapabilityDenied
from fireflyer.storage.client_min import MgmtdRouting, StorageClient

from . import batch as _batch
from .file import File, check_range
from .home import Identity
from .length import LengthReporter, exact_length
from .meta_client import MetaClient

__all__ = ["FsClientSettings", "FileSystem", "BatchResult", "connect", "load_client_settings"]

T = TypeVar("T")
Buffer = bytes | bytearray | memoryview


class FsClientSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Client timing and limits (env ``FF_FS_<FIELD>``)."""

    #: one storage request's timeout; a slower replica is failed over
    request_timeout_s: float = 5.0
    connect_timeout_s: float = 2.0
    #: total time one I/O may spend retrying with backoff (3FS: 60 s)
    retry_deadline_s: float = 60.0
    #: meta calls fail over between replicas for at most this long
    meta_timeout_s: float = 10.0
    #: how often open writers report their highest written end (3FS: 5 s)
    report_interval_s: float = 5.0
    #: on close/fsync ask storage for the exact length (needs the admin role today; see length.py)
    exact_length_on_close: bool = True
    #: threads sending storage batches
    max_parallel: int = 32
    #: the largest single read or write call
    max_io_bytes: int = 1 << 30
    #: bytes a read-only handle read sequentially keeps in flight ahead of its reader (0: off)
    readahead_bytes: int = 64 << 20
    #: short-circuit local reads: chunks of a replica on this host are read from their files
    #: (descriptors from the storage node's Unix socket) instead of over TCP; FF_FS_LOCAL_READS=0 turns it off
    local_reads: bool = True


class _Env(msgspec.Struct, frozen=True, kw_only=True):
    fs: FsClientSettings = msgspec.field(default_factory=FsClientSettings)


def load_client_settings(env: Mapping[str, str] | None = None) -> FsClientSettings:
    return load_settings(_Env, env=env).fs


class BatchResult(msgspec.Struct, frozen=True):
    """One I/O of a batch: ``data`` (reads) or the number of bytes written, or the error.

    ``batch_read`` gives ``data`` as a ``bytearray`` of its own (writable, so a caller can build
    tensors on it without another copy; ``== b"..."`` works as for bytes); ``batch_write``
    leaves it ``b""``."""

    data: bytes | bytearray = b""
    written: int = 0  # bytes written (batch_write) or read into the caller's buffer (batch_read_into)
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _resolve(meta: str | Sequence[str] | None, mgmtd: str | Sequence[str] | None, token: str | None,
             state_dir: str | os.PathLike[str] | None) -> tuple[list[str], list[str], str]:
    from fireflyer.cluster.discovery import find_cluster

    c = find_cluster(state_dir, meta=meta, mgmtd=mgmtd, token=token, need=("meta", "mgmtd", "token"))
    assert c.token is not None
    return list(c.meta), list(c.mgmtd), c.token


def connect(*, meta: str | Sequence[str] | None = None, mgmtd: str | Sequence[str] | None = None,
            token: str | None = None, state_dir: str | os.PathLike[str] | None = None,
            settings: FsClientSettings | None = None, local_reads: bool | None = None) -> FileSystem:
    """A :class:`FileSystem` for the cluster named by the arguments, the environment or ``state_dir``.

    ``local_reads``: short-circuit reads of chunks on this host (None: the settings', i.e.
    ``FF_FS_LOCAL_READS``, default on)."""
    metas, mgmtds, tok = _resolve(meta, mgmtd, token, state_dir)
    s = settings or load_client_settings()
    if local_reads is not None:
        s = msgspec.structs.replace(s, local_reads=local_reads)
    return FileSystem(metas, mgmtds, tok, s)


def _parse_mode(mode: str) -> tuple[int, bool, bool, bool, bool]:
    """(open flags, readable, writable, append, binary) of a Python open() mode."""
    chars = set(mode)
    kinds = chars & set("rwax")
    if len(kinds) != 1 or not chars <= set("rwaxbt+") or len(mode) != len(chars) or {"b", "t"} <= chars:
        raise InvalidArgument(f"bad open mode {mode!r} (one of r/w/a/x, optional +, b or t)", mode=mode)
    kind, plus = kinds.pop(), "+" in chars
    flags = {"r": 0, "w": os.O_CREAT | os.O_TRUNC, "a": os.O_CREAT | os.O_APPEND,
             "x": os.O_CREAT | os.O_EXCL}[kind]
    readable, writable = kind == "r" or plus, kind != "r" or plus
    flags |= os.O_RDWR if readable and writable else (os.O_WRONLY if writable else os.O_RDONLY)
    return flags, readable, writable, kind == "a", "b" in chars


class FileSystem:
    """A connected client (see the module doc).  Thread safe; close it when done."""

    def __init__(self, meta: Sequence[str], mgmtd: Sequence[str], token: str,
                 settings: FsClientSettings | None = None) -> None:
        self.settings = s = settings or FsClientSettings()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ff-fs-loop", daemon=True)
        self._thread.start()
        self.meta: MetaClient = self._call(MetaClient.connect(list(meta), token, failover_timeout_s=s.meta_timeout_s))
        self._routing = MgmtdRouting(list(mgmtd), token=token, timeout_s=s.request_timeout_s)
        #: meta's chunk capabilities of the files this client opened; every chunk op carries
        #: its file's, renewed through meta before it expires (users never see them)
        self.capabilities = CapabilityCache(self._renew_capability)
        try:
            self.storage = StorageClient(self._routing.get, token=token, request_timeout_s=s.request_timeout_s,
                                         connect_timeout_s=s.connect_timeout_s, retry_deadline_s=s.retry_deadline_s,
                                         max_parallel=s.max_parallel, local_reads=s.local_reads,
                                         capabilities=self.capabilities)
        except BaseException:
            self._routing.close()
            raise
        self._pool = ThreadPoolExecutor(s.max_parallel, thread_name_prefix="ff-fs-batch")
        self.lengths = LengthReporter(lambda f: f.report_length(), s.report_interval_s)
        self._exact_allowed = True
        self._closed = False

    # -- plumbing -------------------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.lengths.report_all()
        self.lengths.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.storage.close()
        self._routing.close()
        self._call(self.meta.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)

    def __enter__(self) -> FileSystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- identity -------------------------------------------------------------------------
    def whoami(self) -> Identity:
        """Who this client's token is: user, roles, uid/gid and home (meta makes the home if missing)."""
        return self._call(self.meta.whoami())

    @property
    def home(self) -> str:
        """The caller's home ``/home/<user>``, against which relative paths resolve (asked once)."""
        return self._call(self.meta.home())

    def abspath(self, path: str) -> str:
        """``path`` made absolute: a relative path is under :attr:`home` (:mod:`.home`)."""
        if isinstance(path, str) and path.startswith("/"):
            return path
        return self._call(self.meta.abspath(path))

    # -- namespace ------------------------------------------------------------------------
    def _with_local_length(self, inode: Inode) -> Inode:
        if inode.type is FileType.FILE:
            hi = self.lengths.written_end(inode.id)
            if hi > inode.length:
                return msgspec.structs.replace(inode, length=hi)
        return inode

    def stat(self, path: str) -> Inode:
        """The inode (symlinks followed); a file's length includes this client's unreported writes."""
        return self._with_local_length(self._call(self.meta.stat(path)))

    def lstat(self, path: str) -> Inode:
        return self._with_local_length(self._call(self.meta.lstat(path)))

    def _stat_inode(self, inode_id: int) -> Inode:
        # another user's file (opened by path) is stat-able by id with its capability
        return self._call(self.meta.stat_inode(inode_id, self.capabilities.peek(inode_id)))

    def _renew_capability(self, inode_id: int, mode: int, old: bytes | None) -> bytes:
        if old is None:
            raise CapabilityDenied(f"no capability for inode {inode_id}: open the file first", reason="missing",
                                   inode=inode_id)
        return self._call(self.meta.grant_capability(inode_id, mode, old))

    def exists(self, path: str) -> bool:
        try:
            self._call(self.meta.lstat(path))
        except FsError as e:
            if e.errno in (E.ENOENT, E.ENOTDIR):
                return False
            raise
        return True

    def isdir(self, path: str) -> bool:
        try:
            return self._call(self.meta.stat(path)).type is FileType.DIR
        except FsError:
            return False

    def isfile(self, path: str) -> bool:
        try:
            return self._call(self.meta.stat(path)).type is FileType.FILE
        except FsError:
            return False

    def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False, exist_ok: bool = False,
              policy: LayoutPolicy | None = None) -> Inode:
        try:
            return self._call(self.meta.mkdir(path, mode, parents=parents, policy=policy))
        except FsError as e:
            if exist_ok and e.errno == E.EEXIST and self.isdir(path):
                return self.stat(path)
            raise

    def listdir(self, path: str) -> list[DirEntry]:
        return self._call(self.meta.listdir(path))

    def ls(self, path: str) -> list[str]:
        return [e.name for e in self.listdir(path)]

    def walk(self, path: str) -> Iterator[tuple[str, list[str], list[str]]]:
        """``os.walk`` order (top down): (dir, subdirs, non-directory names).  Iterative (an
        explicit stack), so no tree depth exhausts Python's recursion limit; as with
        ``os.walk``, removing names from ``subdirs`` before the next step prunes them."""
        stack = [path]
        while stack:
            top = stack.pop()
            entries = self.listdir(top)
            dirs = [e.name for e in entries if e.type is FileType.DIR]
            yield top, dirs, [e.name for e in entries if e.type is not FileType.DIR]
            stack.extend(f"{top.rstrip('/')}/{d}" for d in reversed(dirs))

    def du(self, path: str) -> int:
        """Total length of the files under ``path`` (symlinks not followed; iterative)."""
        inode = self.lstat(path)
        if inode.type is not FileType.DIR:
            return inode.length if inode.type is FileType.FILE else 0
        total = 0
        for top, _dirs, files in self.walk(path):
            for name in files:
                total += self.du(f"{top.rstrip('/')}/{name}")
        return total

    def unlink(self, path: str) -> None:
        """Remove a file name; at the last link meta's GC removes the chunks after its delay."""
        self._call(self.meta.unlink(path))

    def rmdir(self, path: str) -> None:
        self._call(self.meta.rmdir(path))

    def rmtree(self, path: str) -> None:
        """Remove ``path`` and everything below it, children first.  Iterative: a directory
        is listed, its files unlinked and its subdirectories stacked above it; it is removed
        when it comes up again with its subdirectories gone, so no depth is too deep."""
        stack: list[tuple[str, bool]] = [(path, False)]
        while stack:
            top, emptied = stack.pop()
            if emptied:
                self.rmdir(top)
                continue
            stack.append((top, True))
            for entry in self.listdir(top):
                child = f"{top.rstrip('/')}/{entry.name}"
                if entry.type is FileType.DIR:
                    stack.append((child, False))
                else:
                    self.unlink(child)

    def rename(self, src: str, dst: str) -> None:
        self._call(self.meta.rename(src, dst))

    def symlink(self, target: str, link_path: str) -> Inode:
        return self._call(self.meta.symlink(target, link_path))

    def readlink(self, path: str) -> str:
        return self._call(self.meta.readlink(path))

    def set_dir_policy(self, path: str, policy: LayoutPolicy | None) -> Inode:
        return self._call(self.meta.set_dir_policy(path, policy))

    def chmod(self, path: str, mode: int) -> Inode:
        """Set the permission bits (incl. sticky/setgid) of ``path``; the owner or an admin may."""
        return self._call(self.meta.setattr(path, mode=mode))

    def truncate(self, path: str, length: int) -> Inode:
        """Set a file's length; shrinking removes the data past it on storage before returning."""
        # EINVAL below 0, EFBIG past what any layout holds; meta checks the file's own layout
        check_file_size(length, None, field=f"truncate {path}: length")
        return self._truncate_path(path, length)

    def _truncate_path(self, path: str, length: int) -> Inode:
        return self._call(self.meta.truncate(path, length))

    # -- files ----------------------------------------------------------------------------
    def open(self, path: str, mode: str = "rb", buffering: int = -1, encoding: str | None = None,
             errors: str | None = None, newline: str | None = None, *, create_mode: int = 0o644,
             policy: LayoutPolicy | None = None) -> Any:
        """Like built-in ``open``: ``File`` for ``buffering=0`` (binary), else a buffered or text wrapper."""
        import io

        flags, readable, writable, append, binary = _parse_mode(mode)
        if buffering == 0 and not binary:
            raise InvalidArgument("unbuffered (buffering=0) files must be binary", mode=mode)
        if binary and encoding is not None:
            raise InvalidArgument("binary mode takes no encoding", mode=mode)
        if flags & os.O_CREAT:
            res = self._call(self.meta.create(path, create_mode, flags=flags, policy=policy))
        else:
            res = self._call(self.meta.open(path, flags))
        inode = res.inode
        self.capabilities.put(res.capability)
        if inode.type is FileType.DIR:
            raise FsError("is a directory", errno=E.EISDIR, path=path)
        if inode.layout is None:
            raise FsError("not a regular file", errno=E.EINVAL, path=path)
        raw = File(self, path, inode, readable=readable, writable=writable, append=append, mode=mode)
        if append:
            raw.seek(0, io.SEEK_END)
        if buffering == 0:
            return raw
        size = buffering if buffering > 1 else min(max(inode.layout.chunk_size, 64 << 10), 4 << 20)
        buffered: Any
        if readable and writable:
            buffered = io.BufferedRandom(raw, size)
        elif writable:
            buffered = io.BufferedWriter(raw, size)
        else:
            buffered = io.BufferedReader(raw, size)
        if binary:
            return buffered
        return io.TextIOWrapper(buffered, encoding=encoding or "utf-8", errors=errors, newline=newline)

    def read_bytes(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        with self.open(path, "rb", buffering=0) as f:
            return f.pread(f.size() - offset if length is None else length, offset) if offset < f.size() else b""

    def write_bytes(self, path: str, data: Buffer, *, mode: int = 0o644) -> int:
        """Replace ``path``'s content with ``data``; a new file is created with ``mode``."""
        with self.open(path, "wb", buffering=0, create_mode=mode) as f:
            return f.pwrite(data, 0)

    # -- data path (used by File and the batch calls) -------------------------------------
    def _max_piece(self) -> int:
        return self.storage.limits.max_bytes

    def _read_piece(self, layout: Layout) -> int:
        """Reads ask for at most a whole chunk per I/O: a whole chunk is served from its file with
        its stored CRC (sendfile, nothing recomputed), which slices of a large chunk are not.  A
        lone I/O larger than the batch byte limit travels in a batch of its own."""
        return max(self._max_piece(), layout.chunk_size)

    def _write_piece(self, layout: Layout) -> int:
        """Writes go a whole chunk at a time: a chunk larger than one batch is sent as one
        ``stor.write`` (see :mod:`.batch`), never as slices that each rewrite the chunk."""
        return max(self._max_piece(), layout.chunk_size)

    def _read_range(self, inode_id: int, layout: Layout, offset: int, length: int, path: str) -> bytes:
        out = bytearray(length)
        self._read_range_into(inode_id, layout, offset, memoryview(out), path)
        return bytes(out)

    def _read_range_into(self, inode_id: int, layout: Layout, offset: int, dest: memoryview, path: str) -> None:
        """Fill ``dest`` with the file's bytes at ``offset`` (holes as zeros); all pieces in flight at once."""
        pieces = _batch.pieces_of(inode_id, layout, offset, len(dest), self._read_piece(layout))
        errs = _batch.read_pieces_into(self.storage, pieces, [dest[p.at:p.at + p.length] for p in pieces])
        for err in errs:
            if err is not None:
                err.fields.setdefault("path", path)
                raise err

    def _write_range(self, inode_id: int, layout: Layout, offset: int, data: memoryview, path: str) -> None:
        # views, not copies: the call returns only once every piece is written (or failed)
        pieces = [_batch.WritePiece(p.chain_id, p.chunk_id, p.offset, layout.chunk_size, data[p.at:p.at + p.length])
                  for p in _batch.pieces_of(inode_id, layout, offset, len(data), self._write_piece(layout))]
        for err in _batch.write_pieces(self.storage, self._pool, pieces, self.settings.retry_deadline_s):
            if err is not None:
                err.fields.setdefault("path", path)
                raise err

    def _report_length(self, inode_id: int, length: int) -> Inode:
        return self._call(self.meta.report_length(inode_id, length))

    def _exact_length(self, layout: Layout, inode_id: int) -> int | None:
        if not self._exact_allowed:
            return None
        try:
            got = exact_length(self.storage, layout, inode_id)
        except (CapabilityDenied, FsError):
            return None  # no read access to this file (write-only): the handle's own end is used
        if got is None:
            self._exact_allowed = False  # a user token: stor.query_last is admin-only
        return got

    # -- batches --------------------------------------------------------------------------
    def _inodes(self, targets: Sequence[Any], flags: int) -> list[tuple[str, Inode] | Exception]:
        """Resolve each distinct path once (concurrently); File handles pass through."""
        paths = sorted({t for t in targets if isinstance(t, str)})

        async def one(p: str) -> Inode:
            res = await self.meta.open(p, flags)
            self.capabilities.put(res.capability)
            return res.inode

        async def all_() -> list[Inode | BaseException]:
            return await asyncio.gather(*(one(p) for p in paths), return_exceptions=True)

        got = dict(zip(paths, self._call(all_()), strict=True))
        out: list[tuple[str, Inode] | Exception] = []
        for t in targets:
            if isinstance(t, File):
                out.append((t.name, Inode(t.inode_id, FileType.FILE, 0, 0, 0, 1, t.size(), 0, 0, 0,
                                          layout=t.layout)))
                continue
            r = got[t]
            if isinstance(r, BaseException):
                out.append(r if isinstance(r, Exception) else FireFlyerError(str(r)))
            elif r.type is FileType.DIR or r.layout is None:
                out.append(FsError("is a directory", errno=E.EISDIR, path=t))
            else:
                out.append((t, self._with_local_length(r)))
        return out

    def _check_target(self, t: object, i: int) -> None:
        if not isinstance(t, str | File):
            raise InvalidArgument(f"batch item {i}: target must be a path or an open File, got {type(t).__name__}")

    def batch_read(self, ios: Sequence[tuple[str | File, int, int]]) -> list[BatchResult]:
        """Read many ``(path or File, offset, length)`` at once.

        Returns a list of :class:`BatchResult`, one per I/O, in the order of ``ios``:

        - ``ok`` (``error is None``): ``data`` is a ``bytearray`` of its own with the bytes read,
          ``length`` of them, fewer when the range runs past the end of the file (``b""`` at or
          after it); holes read as zeros.  ``written`` is 0.
        - otherwise ``error`` is that I/O's exception (``FsError`` with ``errno`` ENOENT for a
          missing file, EISDIR for a directory, EACCES ...; a storage error that outlasted the
          retry deadline) and ``data`` is ``b""``.  One I/O failing does not fail the others:
          check ``ok`` on each result (nothing is raised for it).

        Bad arguments (a negative offset or length, a length over ``max_io_bytes``, a target that
        is neither a path nor a File) raise ``InvalidArgument`` before anything is read.  All
        I/Os' chunk pieces are grouped by chain and node and read concurrently, each received
        straight into its I/O's result buffer (see :mod:`.batch`)."""
        for i, (t, off, n) in enumerate(ios):
            self._check_target(t, i)
            check_range(off, n, what=f"batch_read item {i}", limit=self.settings.max_io_bytes)
        resolved = self._inodes([t for t, _, _ in ios], os.O_RDONLY)
        pieces: list[_batch.Piece] = []
        dests: list[memoryview] = []
        spans: list[tuple[int, int, bytearray]] = []  # (first piece, piece count, result buffer)
        for (_, off, n), r in zip(ios, resolved, strict=True):
            if isinstance(r, Exception):
                spans.append((len(pieces), 0, bytearray()))
                continue
            _, inode = r
            assert inode.layout is not None
            buf = bytearray(max(0, min(off + n, inode.length) - off))
            ps = _batch.pieces_of(inode.id, inode.layout, off, len(buf), self._read_piece(inode.layout))
            spans.append((len(pieces), len(ps), buf))
            pieces.extend(ps)
            dests.extend(memoryview(buf)[p.at:p.at + p.length] for p in ps)
        errs = _batch.read_pieces_into(self.storage, pieces, dests)
        del dests  # views pin a bytearray's size: none may outlive the call (callers may resize theirs)
        out: list[BatchResult] = []
        for (start, count, buf), r in zip(spans, resolved, strict=True):
            if isinstance(r, Exception):
                out.append(BatchResult(error=r))
                continue
            err = next((e for e in errs[start:start + count] if e is not None), None)
            out.append(BatchResult(error=err) if err else BatchResult(data=buf))
        return out

    def batch_read_into(self, ios: Sequence[tuple[str | File, int, Buffer]]) -> list[BatchResult]:
        """Read many ``(path or File, offset, buffer)`` at once, each into its writable buffer.

        Returns one :class:`BatchResult` per I/O, in order: when ``ok``, ``written`` is the
        number of bytes read into the buffer (its size, or fewer at EOF; the rest of the buffer
        is left as it was) and ``data`` is ``b""``; otherwise ``error`` is that I/O's exception
        (as in :meth:`batch_read`; the buffer's contents are then unspecified).  Holes read as
        zeros.

        Like :meth:`batch_read` without allocating (and zero-filling) a result buffer per I/O:
        the pieces are received straight into the caller's memory, e.g. ``np.empty`` arrays
        that tensors are then built on.  Bad arguments (a read-only buffer) raise first."""
        views: list[memoryview] = []
        for i, (t, off, buf) in enumerate(ios):
            self._check_target(t, i)
            try:
                v = memoryview(buf)  # type: ignore[arg-type]
            except TypeError:
                raise InvalidArgument(f"batch_read_into item {i}: buffer must be a writable bytes-like object, "
                                      f"got {type(buf).__name__}") from None
            if v.readonly:
                raise InvalidArgument(f"batch_read_into item {i}: buffer is read-only")
            v = v.cast("B") if v.format != "B" or v.ndim != 1 else v
            check_range(off, v.nbytes, what=f"batch_read_into item {i}", limit=self.settings.max_io_bytes)
            views.append(v)
        resolved = self._inodes([t for t, _, _ in ios], os.O_RDONLY)
        pieces: list[_batch.Piece] = []
        dests: list[memoryview] = []
        spans: list[tuple[int, int, int]] = []  # (first piece, piece count, bytes to read)
        for (_, off, _), v, r in zip(ios, views, resolved, strict=True):
            if isinstance(r, Exception):
                spans.append((len(pieces), 0, 0))
                continue
            _, inode = r
            assert inode.layout is not None
            n = max(0, min(off + v.nbytes, inode.length) - off)
            ps = _batch.pieces_of(inode.id, inode.layout, off, n, self._read_piece(inode.layout))
            spans.append((len(pieces), len(ps), n))
            pieces.extend(ps)
            dests.extend(v[p.at:p.at + p.length] for p in ps)
        errs = _batch.read_pieces_into(self.storage, pieces, dests) if pieces else []
        del dests
        out: list[BatchResult] = []
        for (start, count, n), r in zip(spans, resolved, strict=True):
            if isinstance(r, Exception):
                out.append(BatchResult(error=r))
                continue
            err = next((e for e in errs[start:start + count] if e is not None), None)
            out.append(BatchResult(error=err) if err else BatchResult(written=n))
        return out

    def batch_write(self, ios: Sequence[tuple[str | File, int, Buffer]]) -> list[BatchResult]:
        """Write many ``(path or File, offset, data)`` to existing files at once.

        Returns one :class:`BatchResult` per I/O, in order: when ``ok``, ``written`` is the
        number of bytes written (all of ``data``; a write is never short) and ``data`` is
        ``b""``; otherwise ``error`` is that I/O's exception (``FsError`` ENOENT for a missing
        file, EISDIR for a directory, EACCES; a storage error after the retry deadline), and
        what part of it reached storage is unspecified.  Failures are per I/O, not raised.

        Bad arguments raise ``InvalidArgument`` before anything is written.  The files' new
        lengths are reported to meta before returning."""
        for i, (t, off, data) in enumerate(ios):
            self._check_target(t, i)
            if not isinstance(data, bytes | bytearray | memoryview):
                raise InvalidArgument(f"batch_write item {i}: data must be bytes-like, got {type(data).__name__}")
            check_range(off, memoryview(data).nbytes, what=f"batch_write item {i}",
                        limit=self.settings.max_io_bytes)
        resolved = self._inodes([t for t, _, _ in ios], os.O_WRONLY)
        pieces: list[_batch.WritePiece] = []
        owner: list[int] = []
        for i, ((_, off, data), r) in enumerate(zip(ios, resolved, strict=True)):
            if isinstance(r, Exception):
                continue
            _, inode = r
            assert inode.layout is not None
            view = memoryview(data).cast("B")
            for p in _batch.pieces_of(inode.id, inode.layout, off, len(view), self._write_piece(inode.layout)):
                pieces.append(_batch.WritePiece(p.chain_id, p.chunk_id, p.offset, inode.layout.chunk_size,
                                                view[p.at:p.at + p.length]))  # a view: no copy per piece
                owner.append(i)
        merged, owners = _merge_adjacent(pieces, owner)
        errs = _batch.write_pieces(self.storage, self._pool, merged, self.settings.retry_deadline_s)
        failed: dict[int, Exception] = {}
        for ws, e in zip(owners, errs, strict=True):
            if e is not None:
                for i in ws:
                    failed.setdefault(i, e)
        ends: dict[int, int] = {}
        out: list[BatchResult] = []
        for i, ((_, off, data), r) in enumerate(zip(ios, resolved, strict=True)):
            if isinstance(r, Exception) or i in failed:
                out.append(BatchResult(error=r if isinstance(r, Exception) else failed[i]))
                continue
            n = memoryview(data).nbytes
            if n:
                ends[r[1].id] = max(ends.get(r[1].id, 0), off + n)
            out.append(BatchResult(written=n))
        for inode_id, end in ends.items():
            self._report_length(inode_id, end)
        return out


def _merge_adjacent(pieces: list[_batch.WritePiece], owner: list[int]) -> tuple[list[_batch.WritePiece], list[list[int]]]:
    """Join pieces that continue each other inside one chunk (e.g. two tensors that share a
    64 MiB chunk) into one piece, so the chunk gets one new version instead of one per piece
    (every version is a copy-on-write of the chunk with its own fsyncs).  Only exactly
    adjacent pieces are joined: bytes between pieces are never touched.  Returns the pieces
    and, per piece, the I/Os it carries."""
    by_chunk: dict[tuple[int, bytes], list[int]] = {}
    for k, p in enumerate(pieces):
        by_chunk.setdefault((p.chain_id, p.chunk_id.to_bytes()), []).append(k)
    if all(len(ks) == 1 for ks in by_chunk.values()):
        return pieces, [[i] for i in owner]
    out: list[_batch.WritePiece] = []
    owners: list[list[int]] = []
    for ks in by_chunk.values():
        spans = sorted((pieces[k].offset, pieces[k].offset + len(pieces[k].data)) for k in ks)
        if any(b[0] < a[1] for a, b in itertools.pairwise(spans)):  # overlapping: keep their order
            out.extend(pieces[k] for k in ks)
            owners.extend([owner[k]] for k in ks)
            continue
        ks.sort(key=lambda k: pieces[k].offset)
        run = [ks[0]]
        for k in [*ks[1:], None]:
            last = pieces[run[-1]]
            if k is not None and pieces[k].offset == last.offset + len(last.data):
                run.append(k)
                continue
            first = pieces[run[0]]
            data = first.data if len(run) == 1 else b"".join(pieces[j].data for j in run)
            out.append(_batch.WritePiece(first.chain_id, first.chunk_id, first.offset, first.chunk_size, data))
            owners.append(sorted({owner[j] for j in run}))
            if k is not None:
                run = [k]
    return out, owners
