"""Placing tensors in shard files, writing them and reading them back (storage-independent).

:func:`pack` decides, purely, where each tensor goes: tensors fill shard files in order, each
at an ``align``-aligned offset, and a new shard starts when the next tensor would cross
``shard_bytes`` (a tensor larger than that gets a shard of its own).  :func:`write_shards`
and :func:`read_tensors` move the bytes through any object with the 3FS client's two batch
calls (``batch_write([(path, offset, data)])``, ``batch_read([(path, offset, length)])``
returning results with ``.data``/``.error``): :class:`fireflyer.fs.FileSystem`, or
:class:`~fireflyer.ckpt.localfs.LocalFS` for a local directory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import msgspec
import numpy as np

from fireflyer.core.errors import FireFlyerError, InvalidArgument
from fireflyer.storage.checksum import crc32c

from .index import ShardFile, ShardIndex, TensorEntry, ValueEntry, encode_index, index_name
from .private import make_private_dir, write_private
from .state import FlatState, ValueLeaf, _as_path, _matches, numpy_dtype, torch_dtype

__all__ = ["ShardLayout", "CheckpointCorrupted", "BatchFS", "pack", "write_shards", "read_tensors",
           "shard_name", "ParallelFS", "write_index"]

#: the largest single I/O sent to the file system (3FS's default limit is 1 GiB)
IO_BYTES = 64 << 20


class CheckpointCorrupted(FireFlyerError):
    """A tensor's bytes do not match the CRC32C recorded when it was saved (fields ``path``, ``shard``)."""

    code = "DATA_LOSS"


class BatchFS(Protocol):
    def batch_write(self, ios: Sequence[tuple[str, int, Any]]) -> Sequence[Any]: ...
    def batch_read(self, ios: Sequence[tuple[str, int, int]]) -> Sequence[Any]: ...


class ShardLayout(msgspec.Struct, frozen=True):
    """One shard file: its name, size and the indices (into ``index.entries``) of its tensors;
    ``base``: where the file's byte 0 lies in the staging arena when the shard is an image of an
    arena region (-1: the tensors are written one by one)."""

    name: str
    size: int
    entries: list[int]
    base: int = -1


def shard_name(rank: int, i: int) -> str:
    return f"rank{rank:05d}-shard{i:04d}.bin"


def _align_up(n: int, align: int) -> int:
    return -(-n // align) * align


def pack(flat: FlatState, *, rank: int = 0, shard_bytes: int = 256 << 20, align: int = 4096,
         arena_offsets: Mapping[str, int] | None = None) -> tuple[ShardIndex, list[ShardLayout]]:
    """Place every tensor of ``flat`` in a shard (and checksum it); returns the index and the layouts.

    With ``arena_offsets`` (each tensor's place in the staging arena, rising in leaf order, as
    a :class:`~fireflyer.ckpt.snapshot.Snapshot` has them) every shard is an image of one arena
    region: a tensor's offset in its shard is its arena offset minus the shard's ``base``.
    The writer then sends whole regions in large I/Os that start on chunk boundaries, so 3FS
    stores whole chunks (a partial write of a chunk copies the rest of it)."""
    if shard_bytes <= 0 or align <= 0:
        raise InvalidArgument(f"shard_bytes ({shard_bytes}) and align ({align}) must be positive")
    entries: list[TensorEntry | ValueEntry] = []
    layouts: list[tuple[list[int], int, int]] = []  # (entry indices, size, arena base)
    last_at = -1
    for leaf in flat.leaves:
        if isinstance(leaf, ValueLeaf):
            entries.append(ValueEntry(leaf.path, leaf.value_bytes))
            continue
        n = leaf.nbytes
        if arena_offsets is not None:
            at = arena_offsets[leaf.path]
            if at < last_at:
                raise InvalidArgument(f"arena offsets must rise in leaf order ({leaf.path} at {at})", path=leaf.path)
            last_at = at
            if not layouts or (layouts[-1][0] and at + n - layouts[-1][2] > shard_bytes):
                layouts.append(([], 0, at))
            offset = at - layouts[-1][2]
        else:
            if layouts:
                offset = _align_up(layouts[-1][1], align)
            if not layouts or (layouts[-1][0] and offset + n > shard_bytes):
                layouts.append(([], 0, -1))
                offset = 0
        members, _, base = layouts[-1]
        members.append(len(entries))
        layouts[-1] = (members, offset + n, base)
        entries.append(TensorEntry(leaf.path, leaf.kind, leaf.dtype, leaf.shape,  # type: ignore[arg-type]
                                   len(layouts) - 1, offset, n, crc32c(leaf.data)))
    out = [ShardLayout(shard_name(rank, i), size, members, base)
           for i, (members, size, base) in enumerate(layouts)]
    index = ShardIndex(rank=rank, tree=flat.tree, entries=entries,
                       shards=[ShardFile(s.name, s.size) for s in out])
    return index, out


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}" if directory else name


def _check(results: Sequence[Any], what: Sequence[str]) -> None:
    for r, w in zip(results, what, strict=True):
        err = getattr(r, "error", None)
        if err is not None:
            if isinstance(err, FireFlyerError):
                raise err
            raise FireFlyerError(f"checkpoint I/O failed: {w}: {err}", target=w) from err


def write_shards(fs: BatchFS, directory: str, index: ShardIndex,
                 tensors: FlatState | Mapping[str, Any], *, io_bytes: int = IO_BYTES,
                 layouts: Sequence[ShardLayout] | None = None, arena: Any = None) -> int:
    """Write every tensor of ``index`` into its shard under ``directory``; returns the bytes written.

    ``tensors`` maps path -> bytes-like (or is the :class:`FlatState` that was packed).  The
    shard files are created first where ``fs`` can (``mkdir``/``write_bytes``, as the 3FS
    client does), since 3FS's ``batch_write`` writes only to existing files.

    With ``layouts`` packed from arena offsets and the ``arena`` itself, each shard is written
    as its arena region in ``io_bytes`` I/Os from offset 0 (chunk-aligned whenever ``io_bytes``
    is a multiple of the chunk size, as the default 64 MiB is of every 3FS chunk size)."""
    bufs = tensors.buffers() if isinstance(tensors, FlatState) else tensors
    if hasattr(fs, "mkdir") and directory:
        make_private_dir(fs, directory)  # 0700: the job's files are its owner's alone
    if hasattr(fs, "write_bytes"):
        for s in index.shards:
            write_private(fs, _join(directory, s.name), b"")  # 0600
    ios: list[tuple[str, int, memoryview]] = []
    what: list[str] = []
    if arena is not None and layouts is not None and all(lay.base >= 0 for lay in layouts):
        whole = memoryview(arena).cast("B")
        for lay in layouts:
            if lay.base + lay.size > whole.nbytes:
                raise InvalidArgument(f"shard {lay.name} lies outside the arena", shard=lay.name)
            region = whole[lay.base:lay.base + lay.size]
            target = _join(directory, lay.name)
            for at in range(0, lay.size, io_bytes):
                ios.append((target, at, region[at:at + io_bytes]))
                what.append(f"{target} @{at}")
        if ios:
            _check(fs.batch_write(ios), what)
        return sum(lay.size for lay in layouts)  # the tensors and the alignment gaps between them
    total = 0
    for e in index.entries:
        if not isinstance(e, TensorEntry) or e.nbytes == 0:
            continue
        try:
            view = memoryview(bufs[e.path]).cast("B")
        except KeyError:
            raise InvalidArgument(f"no data given for tensor {e.path}", path=e.path) from None
        if view.nbytes != e.nbytes:
            raise InvalidArgument(f"{e.path}: {view.nbytes} bytes given, the index says {e.nbytes}",
                                  path=e.path)
        target = _join(directory, index.shards[e.shard].name)
        for at in range(0, e.nbytes, io_bytes):
            ios.append((target, e.offset + at, view[at:at + io_bytes]))
            what.append(f"{e.path} -> {target}")
        total += e.nbytes
    if ios:
        _check(fs.batch_write(ios), what)
    return total


def write_index(fs: Any, directory: str, index: ShardIndex) -> bytes:
    """Write ``index`` as the rank's index file, after its shards (a present index means complete
    shards); returns the bytes written, whose digest the rank commits."""
    data = encode_index(index)
    path = _join(directory, index_name(index.rank))
    if hasattr(fs, "write_bytes"):
        write_private(fs, path, data)
    else:
        _check(fs.batch_write([(path, 0, memoryview(data))]), [path])
    return data


def _runs(entries: list[TensorEntry], gap: int) -> list[list[TensorEntry]]:
    """Group one shard's entries (sorted by offset) into runs read with one I/O."""
    runs: list[list[TensorEntry]] = []
    for e in sorted(entries, key=lambda e: e.offset):
        if runs:
            last = runs[-1][-1]
            if e.offset - (last.offset + last.nbytes) <= gap and e.offset + e.nbytes - runs[-1][0].offset <= IO_BYTES:
                runs[-1].append(e)
                continue
        runs.append([e])
    return runs


def _rebuild(e: TensorEntry, buf: Any, offset: int, map_location: Any) -> Any:
    if e.kind == "torch":
        import torch

        dtype = torch_dtype(e.dtype)
        if e.nbytes == 0:
            t = torch.empty(e.shape, dtype=dtype)
        else:
            t = torch.frombuffer(buf, dtype=torch.uint8, count=e.nbytes, offset=offset).view(dtype).reshape(e.shape)
        if map_location not in (None, "cpu") and str(map_location) != "cpu":
            t = t.to(map_location)
        return t
    dtype = numpy_dtype(e.dtype)
    count = e.nbytes // dtype.itemsize if dtype.itemsize else 0
    a = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(e.shape)
    return a[()] if e.kind == "numpy_scalar" else a


def read_tensors(fs: BatchFS, directory: str, index: ShardIndex, paths: Sequence[Any] | None = None,
                 map_location: Any = "cpu", *, verify: bool = True, gap: int = 1 << 20) -> dict[str, Any]:
    """Read the tensors of ``index`` (those under ``paths``, as in :func:`~fireflyer.ckpt.state.select`)
    and return path -> tensor/array; plain values are decoded too.

    Tensors lying close together in a shard are read with one I/O (holes up to ``gap`` bytes
    are read and dropped) into one writable buffer; the tensors are views of it (zero-copy
    when ``fs`` returns writable buffers, one copy when it returns ``bytes``).  With
    ``verify``, each tensor's CRC32C is checked: :class:`CheckpointCorrupted` names the
    first bad tensor and its shard."""
    prefixes = None if paths is None else [_as_path(p) for p in paths]
    wanted = [e for e in index.entries if prefixes is None or _matches(e.path, prefixes)]
    out: dict[str, Any] = {}
    by_shard: dict[int, list[TensorEntry]] = {}
    for e in wanted:
        if isinstance(e, ValueEntry):
            out[e.path] = msgspec.msgpack.decode(e.value_bytes)
        else:
            by_shard.setdefault(e.shard, []).append(e)
    # A shard mostly wanted (a full load) is read whole from offset 0, so the I/O pieces fall on
    # chunk boundaries and the storage serves whole chunks; otherwise only the runs around the
    # wanted tensors are read.
    runs: list[list[TensorEntry]] = []
    whole: set[int] = set()
    for s in sorted(by_shard):
        ents = by_shard[s]
        if 2 * sum(e.nbytes for e in ents) >= index.shards[s].size:
            whole.add(len(runs))
            runs.append(sorted(ents, key=lambda e: e.offset))
        else:
            runs.extend(_runs(ents, gap))
    ios = []
    for k, run in enumerate(runs):
        start = 0 if k in whole else run[0].offset
        end = max(e.offset + e.nbytes for e in run)
        ios.append((_join(directory, index.shards[run[0].shard].name), start, end - start))
    results = fs.batch_read(ios) if ios else []
    _check(results, [f"{p} @{o}+{n}" for p, o, n in ios])
    checks: list[tuple[TensorEntry, str, memoryview]] = []
    for run, (target, start, _n), r in zip(runs, ios, results, strict=True):
        data = r.data
        buf = data if isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly) \
            else bytearray(data)
        for e in run:
            at = e.offset - start
            if at + e.nbytes > len(buf):
                raise CheckpointCorrupted(f"tensor {e.path}: shard {target} is truncated "
                                          f"({start + len(buf)} bytes, needs {e.offset + e.nbytes})",
                                          path=e.path, shard=target)
            if verify:
                checks.append((e, target, memoryview(buf)[at:at + e.nbytes]))
            out[e.path] = _rebuild(e, buf, at, map_location)
    if checks:
        _verify(checks, getattr(fs, "pool", None))
    return out


def _verify(checks: list[tuple[TensorEntry, str, memoryview]], pool: ThreadPoolExecutor | None) -> None:
    """Check every tensor's CRC32C; the ``crc32c`` package releases the GIL while hashing, so
    the checks run spread over ``pool``'s threads.  Raises for the first bad tensor in index order."""
    def crc(c: tuple[TensorEntry, str, memoryview]) -> int:
        return crc32c(c[2])

    big = sum(c[2].nbytes for c in checks) >= 64 << 20
    gots = list(pool.map(crc, checks)) if pool is not None and big and len(checks) > 1 else [crc(c) for c in checks]
    for (e, target, _view), got in zip(checks, gots, strict=True):
        if got != e.crc32c:
            raise CheckpointCorrupted(
                f"tensor {e.path} in shard {target} (offset {e.offset}, {e.nbytes} bytes) is corrupted: "
                f"CRC32C {got:#010x} != {e.crc32c:#010x} saved; restore an older checkpoint",
                path=e.path, shard=target, offset=e.offset)


# -- parallel batch I/O ------------------------------------------------------------------------
class _Result(msgspec.Struct):
    data: Any = b""
    written: int = 0
    error: Exception | None = None


class ParallelFS:
    """Spreads ``batch_write``/``batch_read`` over ``threads`` concurrent batch calls on ``fs``
    (the other calls pass through), so one rank keeps several I/Os in flight.

    When ``fs`` can read into given buffers (``batch_read_into``, as :class:`LocalFS`), each
    read gets one buffer that its ``piece_bytes`` pieces fill in parallel: a large tensor is
    read by every thread and still lands in one buffer, without a copy.  ``after_write`` is
    called (in the I/O thread) after each part of a write -- a hook for fault injection."""

    def __init__(self, fs: Any, pool: ThreadPoolExecutor | None, threads: int, *, piece_bytes: int = IO_BYTES,
                 after_write: Callable[[], None] | None = None) -> None:
        self.fs = fs
        self.pool = pool
        self.threads = max(1, threads) if pool is not None else 1
        self.piece_bytes = piece_bytes
        self.after_write = after_write

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def _spread(self, fn: Callable[[list[Any]], Sequence[Any]], items: list[Any]) -> list[Any]:
        """Run ``fn`` over ``threads`` interleaved parts of ``items``; results in ``items``' order."""
        n = min(self.threads, len(items))
        if n <= 1 or self.pool is None:
            return list(fn(items))
        parts = [items[k::n] for k in range(n)]
        futs = [self.pool.submit(fn, p) for p in parts]
        out: list[Any] = [None] * len(items)
        for k, f in enumerate(futs):
            out[k::n] = list(f.result())
        return out

    def batch_write(self, ios: Sequence[tuple[str, int, Any]]) -> list[Any]:
        """Whole files go to one thread each (not interleaved I/Os): I/Os that continue each
        other in a file must reach the same ``batch_write`` call, where 3FS joins those sharing a
        chunk into one write -- split over calls, each would rewrite the chunk (copy-on-write)."""
        def part(p: list[Any]) -> Sequence[Any]:
            res = self.fs.batch_write([io for _, io in p])
            if self.after_write is not None:
                self.after_write()
            return res
        by_file: dict[Any, list[tuple[int, Any]]] = {}
        for k, io in enumerate(ios):
            by_file.setdefault(io[0], []).append((k, io))
        n = min(self.threads, len(by_file))
        if n <= 1 or self.pool is None:
            return list(part(list(enumerate(ios))))
        parts: list[list[tuple[int, Any]]] = [[] for _ in range(n)]
        for group in sorted(by_file.values(), key=lambda g: -len(g)):  # balance: biggest files first
            min(parts, key=len).extend(group)
        out: list[Any] = [None] * len(ios)
        for p, f in [(p, self.pool.submit(part, p)) for p in parts]:
            for (k, _), r in zip(p, f.result(), strict=True):
                out[k] = r
        return out

    def batch_read(self, ios: Sequence[tuple[str, int, int]]) -> list[Any]:
        if not hasattr(self.fs, "batch_read_into"):
            return self._spread(self.fs.batch_read, list(ios))
        bufs = [memoryview(np.empty(n, dtype=np.uint8)) for _, _, n in ios]
        pieces: list[tuple[int, tuple[str, int, memoryview]]] = []
        for i, ((path, off, n), buf) in enumerate(zip(ios, bufs, strict=True)):
            for at in range(0, max(n, 1), self.piece_bytes):
                pieces.append((i, (path, off + at, buf[at:at + self.piece_bytes])))
        got = self._spread(lambda p: self.fs.batch_read_into([io for _, io in p]), pieces)
        out = [_Result(data=b) for b in bufs]
        ends: list[int | None] = [None] * len(ios)  # where the first short piece ended the data
        for (i, (_p, off, view)), r in zip(pieces, got, strict=True):
            err = getattr(r, "error", None)
            if err is not None:
                out[i].error = err
            elif r.written < view.nbytes:
                end = off - ios[i][1] + r.written
                cur = ends[i]
                ends[i] = end if cur is None else min(cur, end)
        for i, end in enumerate(ends):
            if end is not None and out[i].error is None:
                out[i].data = bufs[i][:end]
        return out
