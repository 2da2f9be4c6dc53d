"""``fireflyer.ckpt``: the checkpoint client's storage-independent core (paper §VII-A).

- :mod:`.state`: :func:`flatten` a nested state (dicts, lists, tuples of torch tensors,
  numpy arrays and plain values) into paths and leaves; :func:`unflatten`; :func:`select`;
- :mod:`.index`: :class:`ShardIndex` and its entries (msgspec, msgpack-encoded);
- :mod:`.snapshot`: copy a state to reusable host buffers (the training stall of a save);
- :mod:`.catalog` / :mod:`.model`: checkpoint records and the commit protocol;
- :mod:`.manager`: :class:`CheckpointManager`, what a training loop uses;
- :mod:`.dcp`: ``torch.distributed.checkpoint`` storage over the same file systems;
- :mod:`.shard`: :func:`pack` (where each tensor goes), :func:`write_shards`,
  :func:`read_tensors` (CRC32C-checked, zero-copy views) over any object with the 3FS
  client's ``batch_write``/``batch_read``; :class:`~.localfs.LocalFS` for a local directory.

:func:`save` / :func:`load` put them together for one rank: shards plus
``rank<N>.index`` in one directory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fireflyer.core.errors import FsError, NotFound

from .catalog import Catalog, index_digest
from .index import ShardFile, ShardIndex, TensorEntry, ValueEntry, decode_index, encode_index, index_name
from .localfs import LocalFS
from .model import (
    MANIFEST_NAME,
    CheckpointCommitted,
    CheckpointRecord,
    CkptState,
    Manifest,
    RetentionPolicy,
    ShardCommit,
    decode_manifest,
)
from .shard import (
    BatchFS,
    CheckpointCorrupted,
    ParallelFS,
    ShardLayout,
    pack,
    read_tensors,
    write_index,
    write_shards,
)
from .state import FlatState, flatten, select, unflatten

# The manager and the snapshot import torch (seconds); they load on first use, so the
# checkpoint service and ``ff ckpt``, which only need the catalog, start fast.
_LAZY = {"CheckpointManager": ".manager", "Snapshot": ".snapshot", "Snapshotter": ".snapshot",
         "snapshot": ".snapshot"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "flatten", "unflatten", "select", "FlatState",
    "ShardIndex", "TensorEntry", "ValueEntry", "ShardFile", "encode_index", "decode_index",
    "pack", "write_shards", "read_tensors", "ShardLayout", "CheckpointCorrupted", "BatchFS",
    "LocalFS", "save", "load", "index_name", "ParallelFS", "write_index",
    "Snapshot", "Snapshotter", "snapshot",
    "CheckpointManager", "Catalog", "index_digest",
    "CheckpointRecord", "CkptState", "RetentionPolicy", "Manifest", "ShardCommit", "CheckpointCommitted",
    "MANIFEST_NAME", "decode_manifest",
]


def save(fs: BatchFS, directory: str, state: Any, *, rank: int = 0, shard_bytes: int = 256 << 20,
         align: int = 4096) -> ShardIndex:
    """Write ``state``'s shards, then its index (last, so a present index means complete shards)."""
    flat = flatten(state)  # refuses bad input before anything is written
    index, _ = pack(flat, rank=rank, shard_bytes=shard_bytes, align=align)
    write_shards(fs, directory, index, flat)
    write_index(fs, directory, index)
    return index


def load_index(fs: BatchFS, directory: str, *, rank: int = 0) -> ShardIndex:
    path = f"{directory.rstrip('/')}/{index_name(rank)}"
    if hasattr(fs, "read_bytes"):
        try:
            return decode_index(fs.read_bytes(path))  # type: ignore[attr-defined]
        except FsError as e:
            raise NotFound(f"no checkpoint index for rank {rank} in {directory}", path=path) from e
    r = fs.batch_read([(path, 0, 1 << 30)])[0]
    if r.error is not None or not r.data:
        raise NotFound(f"no checkpoint index for rank {rank} in {directory}", path=path)
    return decode_index(r.data)


def load(fs: BatchFS, directory: str, *, rank: int = 0, keys: Iterable[str | Sequence[Any]] | None = None,
         map_location: Any = "cpu") -> Any:
    """Rebuild the state saved by :func:`save` (only the subtrees under ``keys`` when given)."""
    index = load_index(fs, directory, rank=rank)
    keys = None if keys is None else list(keys)
    leaves = read_tensors(fs, directory, index, keys, map_location)
    return unflatten(index.tree, leaves, keys)
