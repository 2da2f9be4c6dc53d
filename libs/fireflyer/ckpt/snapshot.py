"""The snapshot phase of a checkpoint: copy a training state to host memory, fast.

The snapshot is the only part of a save that stalls training (paper §VII-A: the state is
copied to host memory, then written to 3FS in the background), so :class:`Snapshotter`
keeps its copy cheap:

- one staging **arena** (a host buffer, page-locked when CUDA tensors are saved) is kept
  across saves and reused while it is large enough, so later saves allocate nothing and take
  no page faults;
- the **copy plan** (each tensor's place in the arena, its destination view and its leaf)
  is kept too and reused when the next state has the same paths, dtypes, shapes and devices
  -- the usual case: the same model and optimizer every interval -- so thousands of small
  tensors cost one ``torch._foreach_copy_`` call, not a Python loop of copies;
- large CPU tensors are copied by ``copy_`` (parallel over torch's intra-op threads) or,
  with ``copy_threads > 1``, in slices over a small thread pool (``copy_`` releases the GIL),
  for processes that run torch with one intra-op thread;
- CUDA tensors are copied device-to-host with ``non_blocking=True`` on a side stream that
  first waits for the current stream (so it copies the latest values); the current stream
  then waits for the copies, so training kernels queued after :meth:`Snapshotter.take`
  returns cannot modify a tensor before it was copied.  The host is not blocked:
  :meth:`Snapshot.wait` (called by the writer thread) synchronizes on the recorded event.

The result is a :class:`~fireflyer.ckpt.state.FlatState` built by the same walk as
:func:`~fireflyer.ckpt.state.flatten` (same checks, same paths), whose tensor leaves are
views of the arena.  Those views are overwritten by the next :meth:`~Snapshotter.take`:
finish writing one snapshot before taking the next.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import numpy as np

from .state import FlatState, Leaf, TensorLeaf, check_tensor, flatten, numpy_dtype, numpy_dtype_name

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None  # type: ignore[assignment]

__all__ = ["Snapshot", "Snapshotter", "snapshot"]

#: arena offsets are aligned so every dtype view is aligned (and cache-line friendly)
ALIGN = 64
#: tensors at least this large are copied on their own (sliced over ``copy_threads``)
LARGE = 16 << 20
_SLICE = 8 << 20

_EMPTY = memoryview(b"")
_PENDING = TensorLeaf("", "torch", "", (), _EMPTY)  # placeholder put in the walk's leaf list


class _Plan(msgspec.Struct):
    """Where each tensor of a state with a given signature goes, and the prepared copies."""

    signature: tuple[Any, ...]
    total: int
    offsets: dict[str, int]
    leaves: list[TensorLeaf]
    #: (destination view, index into the sources) per copy group
    small: list[tuple[Any, int]]
    large: list[tuple[Any, int]]
    arrays: list[tuple[np.ndarray, int]]
    cuda: dict[Any, list[tuple[Any, int]]]


class Snapshot(msgspec.Struct):
    """A state copied to host memory: its :attr:`flat` leaves are valid once :meth:`wait` returned.

    ``arena`` is the staging memory the tensor leaves are views of and ``offsets`` each tensor
    leaf's place in it (by path), so a writer can send whole arena regions -- several tensors
    and the alignment gaps between them -- as single I/Os (:func:`~fireflyer.ckpt.shard.pack`)."""

    flat: FlatState
    nbytes: int
    events: list[Any] = []
    arena: memoryview | None = None
    offsets: dict[str, int] = {}

    def wait(self) -> None:
        """Block until the device-to-host copies are done (a no-op for CPU-only states)."""
        for ev in self.events:
            ev.synchronize()
        self.events = []


class Snapshotter:
    """Takes snapshots into one reusable staging arena (see the module doc)."""

    def __init__(self, *, copy_threads: int = 1, pin_memory: bool | None = None) -> None:
        self.copy_threads = max(1, copy_threads)
        self.pin_memory = pin_memory
        self._arena: Any = None  # torch uint8 tensor, or numpy array without torch
        self._arena_np: np.ndarray | None = None
        self._plan: _Plan | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._streams: dict[Any, Any] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return 0 if self._arena_np is None else self._arena_np.nbytes

    def release(self) -> None:
        """Drop the arena and the plan (the next snapshot allocates again)."""
        with self._lock:
            self._arena = self._arena_np = self._plan = None
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None

    # -- the snapshot ----------------------------------------------------------------------
    def take(self, state: Any) -> Snapshot:
        """Copy every tensor/array of ``state`` into the arena; raises
        :class:`~fireflyer.core.errors.InvalidArgument` (naming the path) on what cannot be
        checkpointed, before copying anything."""
        sources: list[Any] = []
        sig: list[Any] = []

        def hook(path: str, kind: str, obj: Any) -> Leaf:
            if kind == "torch":
                name = check_tensor(path, obj)
                sig.append((path, kind, name, obj.shape, obj.device, obj.dtype.itemsize))
            else:
                name = numpy_dtype_name(obj.dtype, path)
                sig.append((path, kind, name, obj.shape, None, obj.dtype.itemsize))
            sources.append(obj)
            return _PENDING

        flat = flatten(state, on_array=hook)
        with self._lock:
            signature = tuple(sig)
            plan = self._plan
            if plan is None or plan.signature != signature:
                plan = self._plan = self._make_plan(signature)
            events = self._copy(plan, sources)
            it = iter(plan.leaves)
            leaves = [next(it) if leaf is _PENDING else leaf for leaf in flat.leaves]
            arena = memoryview(self._arena_np)[:plan.total] if self._arena_np is not None else None
        return Snapshot(FlatState(flat.tree, leaves), plan.total, events, arena, plan.offsets)

    def _make_plan(self, signature: tuple[Any, ...]) -> _Plan:
        offsets: list[int] = []
        total = 0
        for _path, _kind, _name, shape, _dev, itemsize in signature:
            offsets.append(total)
            n = int(np.prod(shape, dtype=np.int64)) * itemsize if shape else itemsize
            total += -(-n // ALIGN) * ALIGN
        any_cuda = any(d is not None and d.type == "cuda" for *_, d, _i in signature)
        self._reserve(total, pinned=self.pin_memory if self.pin_memory is not None else any_cuda)
        arena_np = self._arena_np
        assert arena_np is not None
        plan = _Plan(signature, total, {sig[0]: off for sig, off in zip(signature, offsets, strict=True)},
                     [], [], [], [], {})
        for i, ((path, kind, name, shape, dev, itemsize), off) in enumerate(zip(signature, offsets, strict=True)):
            n = int(np.prod(shape, dtype=np.int64)) * itemsize if shape else itemsize
            raw = arena_np[off:off + n]
            plan.leaves.append(TensorLeaf(path, kind, name, tuple(shape), memoryview(raw) if n else _EMPTY))
            if n == 0:
                continue
            if kind == "torch":
                dst = self._arena[off:off + n].view(getattr(torch, name)).view(shape)
                if dev.type == "cuda":
                    plan.cuda.setdefault(dev, []).append((dst, i))
                else:
                    (plan.large if n >= LARGE else plan.small).append((dst, i))
            else:
                plan.arrays.append((raw.view(numpy_dtype(name)).reshape(shape), i))
        return plan

    def _reserve(self, nbytes: int, *, pinned: bool) -> None:
        """Keep the arena when it is large enough (and pinned when it must be), else replace it."""
        pinned = pinned and torch is not None and torch.cuda.is_available()
        if self._arena_np is not None and self._arena_np.nbytes >= nbytes:
            if not pinned or (torch is not None and self._arena.is_pinned()):
                return
        self._arena = self._arena_np = None  # free the old one first: peak memory, not 2x
        size = max(nbytes, ALIGN)
        if torch is not None:
            self._arena = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            self._arena_np = self._arena.numpy()
        else:  # pragma: no cover
            self._arena = self._arena_np = np.empty(size, dtype=np.uint8)

    def _copy(self, plan: _Plan, sources: list[Any]) -> list[Any]:
        events = self._copy_cuda(plan, sources) if plan.cuda else []
        if plan.small:
            with torch.no_grad():
                torch._foreach_copy_([d for d, _ in plan.small], [sources[i] for _, i in plan.small])
        for dst, i in plan.large:
            with torch.no_grad():
                self._copy_large(dst, sources[i])
        for arr, i in plan.arrays:
            np.copyto(arr, sources[i], casting="no")
        return events

    def _copy_large(self, dst: Any, src: Any) -> None:
        src = src.detach()  # the pool threads do not inherit no_grad
        if self.copy_threads == 1 or not src.is_contiguous() or src.is_conj() or src.is_neg():
            dst.copy_(src)
            return
        d, s = dst.view(-1), src.view(-1)
        step = max(_SLICE // max(1, s.element_size()), 1)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.copy_threads, thread_name_prefix="ff-ckpt-copy")
        futs = [self._pool.submit(d[a:a + step].copy_, s[a:a + step]) for a in range(0, s.numel(), step)]
        for f in futs:
            f.result()

    def _copy_cuda(self, plan: _Plan, sources: list[Any]) -> list[Any]:
        events = []
        for dev, items in plan.cuda.items():
            current = torch.cuda.current_stream(dev)
            stream = self._streams.get(dev)
            if stream is None:
                stream = self._streams[dev] = torch.cuda.Stream(dev)
            stream.wait_stream(current)  # copy the values the queued kernels produce
            with torch.cuda.stream(stream), torch.no_grad():
                torch._foreach_copy_([d for d, _ in items], [sources[i] for _, i in items],
                                     non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
            current.wait_stream(stream)  # later in-place updates run after the copies
            events.append(ev)
        return events


def snapshot(state: Any) -> Snapshot:
    """A one-off snapshot (its own arena); use a :class:`Snapshotter` to reuse buffers."""
    return Snapshotter().take(state)
