"""``torch.distributed.checkpoint`` storage on 3FS (or any file system with batch I/O).

``dcp.save(state_dict, storage_writer=FFStorageWriter(path, fs=fs))`` and
``dcp.load(state_dict, storage_reader=FFStorageReader(path, fs=fs))`` work as with torch's
own file-system storage, with or without a process group.  ``fs`` is anything with the 3FS
client's ``batch_write``/``batch_read``/``mkdir``/``write_bytes``/``read_bytes``
(:func:`fireflyer.fs.connect` when not given; :class:`~fireflyer.ckpt.localfs.LocalFS` for a
local directory).

Layout of a checkpoint directory: one data file per rank (``__<rank>_data``) holding every
item the rank writes back to back at 64-byte aligned offsets -- tensors as their raw
C-contiguous bytes (no pickling, so they are read straight into a buffer and viewed), other
objects as the bytes DCP serialized -- and ``__ff_dcp.metadata``, DCP's :class:`Metadata`
(pickled, as DCP itself stores it) whose ``storage_data`` maps each item to its
:class:`FFStorageInfo` (file, offset, length, CRC32C, and a tensor's dtype and shape).  The
coordinator writes the metadata last, so a directory with it holds a complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from fireflyer.core.errors import FsError, NotFound
from fireflyer.storage.checksum import crc32c

from .private import make_private_dir, write_private
from .shard import IO_BYTES, CheckpointCorrupted, ParallelFS
from .state import torch_dtype

__all__ = ["FFStorageWriter", "FFStorageReader", "FFStorageInfo", "METADATA_NAME"]

METADATA_NAME = "__ff_dcp.metadata"
_ALIGN = 64


@dataclasses.dataclass(frozen=True)
class FFStorageInfo:
    """Where one saved item lies (pickled inside the DCP metadata)."""

    relative_path: str
    offset: int
    length: int
    crc32c: int
    #: a tensor's dtype name and shape; "" for serialized bytes
    dtype: str = ""
    shape: tuple[int, ...] = ()


def _default_fs(fs: Any) -> Any:
    if fs is not None:
        return fs
    from fireflyer.fs import connect

    return connect()


def _join(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}" if path else name


def _completed(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


class FFStorageWriter(StorageWriter):
    def __init__(self, path: str | os.PathLike[str], fs: Any = None, *, io_threads: int = 4) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.fs = _default_fs(fs)
        self.io_threads = io_threads
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = True

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        make_private_dir(self.fs, self.path)  # 0700, files 0600: the writer's alone
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # each rank gets its own file name, so ranks never write to the same file
        return [dataclasses.replace(p, storage_data=f"__{i}_data") for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        name = plan.storage_data if isinstance(plan.storage_data, str) else "__0_data"
        target = _join(self.path, name)
        ios: list[tuple[str, int, memoryview]] = []
        results: list[WriteResult] = []
        keep: list[Any] = []  # the CPU copies must live until written
        offset = 0
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                view = memoryview(data.getbuffer()).cast("B")
                dtype, shape = "", ()
            else:
                t = data.detach()
                t = t.cpu().contiguous() if t.device.type != "cpu" else t.contiguous()
                t = t.resolve_conj().resolve_neg()
                dtype, shape = str(t.dtype).removeprefix("torch."), tuple(t.shape)
                flat = t.reshape(-1)
                view = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
            keep.append(view)
            for at in range(0, view.nbytes, IO_BYTES):
                ios.append((target, offset + at, view[at:at + IO_BYTES]))
            info = FFStorageInfo(name, offset, view.nbytes, crc32c(view), dtype, shape)
            results.append(WriteResult(index=item.index, size_in_bytes=view.nbytes, storage_data=info))
            offset += -(-view.nbytes // _ALIGN) * _ALIGN
        write_private(self.fs, target, b"")  # 3FS writes only to existing files
        if ios:
            with ThreadPoolExecutor(self.io_threads, thread_name_prefix="ff-dcp-io") as pool:
                out = ParallelFS(self.fs, pool, self.io_threads).batch_write(ios)
            for r, (path, off, _v) in zip(out, ios, strict=True):
                if getattr(r, "error", None) is not None:
                    raise FsError(f"DCP write {path} @{off} failed: {r.error}", path=path) from r.error
        return _completed(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {wr.index: wr.storage_data for rank in results for wr in rank}
        write_private(self.fs, _join(self.path, METADATA_NAME), pickle.dumps(metadata))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, str | os.PathLike)


def _narrow(t: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    for dim, (off, n) in enumerate(zip(offsets, lengths, strict=True)):
        if off != 0 or n != t.size(dim):
            t = t.narrow(dim, off, n)
    return t


class FFStorageReader(StorageReader):
    def __init__(self, path: str | os.PathLike[str], fs: Any = None, *, io_threads: int = 4,
                 verify: bool = True) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.fs = _default_fs(fs)
        self.io_threads = io_threads
        self.verify = verify
        self.load_id = uuid.uuid4().hex
        self.storage_data: dict[MetadataIndex, FFStorageInfo] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.load_id = uuid.uuid4().hex
        self.storage_data = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = _join(self.path, METADATA_NAME)
        try:
            raw = self.fs.read_bytes(path)
        except FsError as e:
            raise NotFound(f"no DCP checkpoint at {self.path} ({METADATA_NAME} missing: the save did not "
                           "finish)", path=path) from e
        metadata: Metadata = pickle.loads(raw)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # type: ignore[union-attr]
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        infos: dict[FFStorageInfo, int] = {}  # one read per stored item, however many requests use it
        for req in plan.items:
            infos.setdefault(self.storage_data[req.storage_index], len(infos))
        ios = [(_join(self.path, i.relative_path), i.offset, i.length) for i in infos]
        with ThreadPoolExecutor(self.io_threads, thread_name_prefix="ff-dcp-io") as pool:
            got = ParallelFS(self.fs, pool, self.io_threads).batch_read(ios) if ios else []
        bufs: list[Any] = []
        for info, (path, off, n), r in zip(infos, ios, got, strict=True):
            if getattr(r, "error", None) is not None:
                raise FsError(f"DCP read {path} @{off}+{n} failed: {r.error}", path=path) from r.error
            data = r.data
            if len(data) != n or (self.verify and crc32c(data) != info.crc32c):
                raise CheckpointCorrupted(f"DCP checkpoint {self.path}: item in {path} at offset {off} "
                                          f"({n} bytes) is truncated or corrupted (CRC32C mismatch)",
                                          path=path, offset=off)
            bufs.append(data)
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            data = bufs[infos[info]]
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes(data)))
                continue
            dtype = torch_dtype(info.dtype)
            if info.length == 0:
                t = torch.empty(info.shape, dtype=dtype)
            else:
                buf = data if isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly) \
                    else bytearray(data)
                t = torch.frombuffer(buf, dtype=torch.uint8, count=info.length).view(dtype).reshape(info.shape)
            t = _narrow(t, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != t.size():
                raise CheckpointCorrupted(f"DCP checkpoint {self.path}: {req.storage_index.fqn} has shape "
                                          f"{tuple(t.size())}, the state_dict expects {tuple(target.size())}",
                                          path=req.storage_index.fqn)
            target.copy_(t)
            planner.commit_tensor(req, target)
        return _completed(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, str | os.PathLike)
