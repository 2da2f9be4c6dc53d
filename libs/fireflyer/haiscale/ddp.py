"""HaiScale's DistributedDataParallel: torch DDP's API, gradients averaged through HFReduce.

    from fireflyer import hfreduce
    from fireflyer.haiscale.ddp import DistributedDataParallel as DDP
    model = DDP(MyModel())                  # the process's shared communicator unless given one
    loss = model(x).sum(); loss.backward()  # gradients averaged over all ranks
    opt.step()

How a step goes.  Construction broadcasts rank 0's parameters and buffers to every
rank (after checking that every rank has the same parameter names, shapes and
dtypes) and plans buckets (:mod:`.buckets`): reverse registration order, the first
one small.  Each bucket is a flat buffer in shared memory the node's HFReduce worker
has mapped, so reducing it copies nothing.  A ``register_post_accumulate_grad_hook``
on every parameter copies its gradient into its bucket slot and marks it ready; a
bucket whose parameters are all ready is handed to the comm hook (an asynchronous
``avg`` allreduce by default) at once, while backward goes on, in bucket order (so
every rank submits the same ops in the same order, whatever order its hooks fire).
The first hook of a backward queues an end-of-backward callback with the autograd
engine (``Variable._execution_engine.queue_callback``, which torch 2.13 still
has and which runs once all gradients are accumulated); that callback submits what
is left, waits only for what is still in flight, and writes the averages back into
``param.grad``.  So ``loss.backward()`` returns with the gradients reduced.

Checks.  With ``find_unused_parameters=False`` a rank whose backward skipped a
parameter raises :class:`UnreadyGradients` naming it.  On the first step every rank
also shares which parameters it got gradients for (a small int32 allreduce; the
buckets of that step are submitted after it), so every rank, not only the one that
skipped, raises naming the parameter and the ranks that did or did not produce it.
With ``find_unused_parameters=True`` locally unused parameters count as zero, and a
per-step readiness allreduce finds the globally unused ones, whose ``.grad`` is left
as it was (None after ``zero_grad()``), as torch DDP does.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fireflyer.core.errors import FailedPrecondition, InvalidArgument

from .buckets import DEFAULT_FIRST_BUCKET_BYTES, MIB, BucketPlan, ParamSpec, plan_buckets
from .hooks import Pending, allreduce_hook

__all__ = ["DistributedDataParallel", "Reducer", "UnreadyGradients", "shared_tensor"]

try:
    import torch
except ImportError as _e:  # pragma: no cover - haiscale is torch's companion
    raise ImportError("fireflyer.haiscale needs torch") from _e


class UnreadyGradients(FailedPrecondition):
    """Ranks disagree on which parameters got gradients (or one rank skipped some): names them."""


def shared_tensor(comm: Any, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat CPU tensor in shared memory the HFReduce worker has mapped: its ops copy nothing."""
    from fireflyer.hfreduce.torch_dtypes import torch_to_numpy_dtype

    arr = comm.empty(max(numel, 1), torch_to_numpy_dtype(dtype))[:numel]
    if dtype == torch.bfloat16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.from_numpy(arr.view(np.uint8)).view(dtype)
    return torch.from_numpy(arr)


class _BucketView:
    """The :class:`~.hooks.GradBucket` a comm hook gets."""

    def __init__(self, reducer: Reducer, index: int) -> None:
        self.comm = reducer.comm
        self._reducer, self._index = reducer, index

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._reducer.buffers[self._index]

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self._reducer.params[i] for i in self._reducer.plan.buckets[self._index].params]

    def gradients(self) -> list[torch.Tensor]:
        return [self._reducer.slot(i) for i in self._reducer.plan.buckets[self._index].params]

    def is_last(self) -> bool:
        return self._index == len(self._reducer.plan.buckets) - 1

    def scratch(self, dtype: torch.dtype) -> torch.Tensor:
        """A shared buffer of this bucket's size in ``dtype``, kept for the next steps."""
        key = (self._index, dtype)
        buf = self._reducer._scratch.get(key)
        if buf is None:
            buf = self._reducer._scratch[key] = shared_tensor(self.comm, self.buffer().numel(), dtype)
        return buf


class Reducer:
    """The gradient machinery of one :class:`DistributedDataParallel` (``ddp.reducer``)."""

    def __init__(self, comm: Any, named: list[tuple[str, torch.nn.Parameter]], *, cap_bytes: int,
                 first_bucket_bytes: int, find_unused_parameters: bool, gradient_as_bucket_view: bool) -> None:
        self.comm = comm
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.find_unused = find_unused_parameters
        self.as_view = gradient_as_bucket_view
        specs = [ParamSpec(index=i, name=n, numel=p.numel(), dtype=str(p.dtype).removeprefix("torch."),
                           itemsize=p.element_size()) for i, (n, p) in enumerate(named)]
        self.plan: BucketPlan = plan_buckets(specs, cap_bytes, first_bucket_bytes)
        self.buffers = [shared_tensor(comm, b.numel, self.params[b.params[0]].dtype) for b in self.plan.buckets]
        self._slots: list[torch.Tensor] = [torch.empty(0)] * len(self.params)
        for b, buf in zip(self.plan.buckets, self.buffers, strict=True):
            for i, off in zip(b.params, b.offsets, strict=True):
                p = self.params[i]
                self._slots[i] = buf[off:off + p.numel()].view(p.shape)
        self._scratch: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self.comm_hook: Callable[[Any, Any], Pending] = allreduce_hook
        self.comm_state: Any = None
        self._handles = [p.register_post_accumulate_grad_hook(self._hook_for(i)) for i, p in enumerate(self.params)]
        self.sync = True  # set per forward (no_sync)
        self.steps = 0
        self.stopped = False
        self.last_timing: dict[str, float] = {}
        self._reset()

    # -- per-backward state -----------------------------------------------------------------------

    def _reset(self) -> None:
        self._ready = [False] * len(self.params)
        self._left = [len(b.params) for b in self.plan.buckets]
        self._next = 0  # the next bucket to submit: buckets go in order on every rank
        self._inflight: list[tuple[int, Pending]] = []
        self._queued = False
        self._t_first_submit = 0.0
        self._t_last_grad = 0.0
        # the first step submits nothing before the ranks agree on which parameters have gradients
        self._hold = self.steps == 0 and not self.find_unused

    def slot(self, i: int) -> torch.Tensor:
        return self._slots[i]

    def _hook_for(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            self._on_grad(i, p)

        return hook

    def _on_grad(self, i: int, p: torch.Tensor) -> None:
        if not self.sync or self.stopped:
            return  # no_sync: the gradient stays accumulated in p.grad for the next synchronised step
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        if self._ready[i]:
            raise FailedPrecondition(f"parameter {self.names[i]!r} got a gradient twice in one backward pass (a "
                                     f"reentrant backward or a parameter used by two DDP wrappers?)",
                                     param=self.names[i])
        self._ready[i] = True
        self._t_last_grad = time.perf_counter()
        slot = self._slots[i]
        if p.grad is not None and p.grad.data_ptr() != slot.data_ptr():
            slot.copy_(p.grad)
        bi = self.plan.where[i][0]
        self._left[bi] -= 1
        if not self._hold:
            self._submit_ready()

    def _submit_ready(self) -> None:
        while self._next < len(self.buffers) and self._left[self._next] == 0:
            self._submit(self._next)

    def _submit(self, bi: int) -> None:
        if not self._inflight:
            self._t_first_submit = time.perf_counter()
        self._inflight.append((bi, self.comm_hook(self.comm_state, _BucketView(self, bi))))
        self._next = bi + 1

    def _end_of_backward(self) -> None:
        try:
            self._finish()
        finally:
            self.steps += 1
            self._reset()

    def _finish(self) -> None:
        missing = [i for i, r in enumerate(self._ready) if not r]
        used_everywhere: np.ndarray | None = None
        if self._hold:
            self._agree()
        if self.find_unused:
            for i in missing:
                self._slots[i].zero_()
                self._left[self.plan.where[i][0]] -= 1
            self._submit_ready()
            used = np.asarray(self._ready, dtype=np.int32)
            self.comm.allreduce(used, op="sum")
            used_everywhere = used
        elif missing:
            raise UnreadyGradients(
                f"rank {self.comm.rank}: parameters {', '.join(repr(self.names[i]) for i in missing[:8])}"
                f"{' and more' if len(missing) > 8 else ''} got no gradient in this backward pass, but "
                f"find_unused_parameters=False: every parameter must take part in the loss on every rank "
                f"(or wrap the model with find_unused_parameters=True)",
                rank=self.comm.rank, params=",".join(self.names[i] for i in missing))
        else:
            self._submit_ready()
        for bi, pending in self._inflight:
            out = pending.wait()
            buf = self.buffers[bi]
            if isinstance(out, torch.Tensor) and out.data_ptr() != buf.data_ptr():
                buf.copy_(out.reshape(-1))
        t_synced = time.perf_counter()
        #: the last synchronised backward's timestamps (perf_counter): the first bucket's submission,
        #: the last gradient's arrival (backward's compute ends) and the end of the waits, so
        #: ``synced - last_grad`` is the communication backward did not hide
        self.last_timing = {"first_submit": self._t_first_submit, "last_grad": self._t_last_grad,
                            "synced": t_synced}
        for i, p in enumerate(self.params):
            if used_everywhere is not None and used_everywhere[i] == 0:
                continue  # nobody used it: its .grad stays as it was, as under torch DDP
            slot = self._slots[i]
            if self.as_view:
                p.grad = slot
            elif p.grad is None:
                p.grad = slot.clone()
            else:
                p.grad.copy_(slot)

    def _agree(self) -> None:
        """First step: every rank learns which parameters each rank got gradients for."""
        world, n = self.comm.world_size, len(self.params)
        table = np.zeros((world, n), np.int32)
        table[self.comm.rank] = self._ready
        self.comm.allreduce(table, op="sum")
        odd = [i for i in range(n) if not table[:, i].all()]
        self._hold = False
        if odd:
            parts = []
            for i in odd[:8]:
                have = [r for r in range(world) if table[r, i]]
                lack = [r for r in range(world) if not table[r, i]]
                parts.append(f"{self.names[i]!r} (gradient on ranks {have or 'none'}, none on ranks {lack})")
            raise UnreadyGradients(
                f"ranks disagree on which parameters got gradients in the first backward pass: "
                f"{'; '.join(parts)}{' and more' if len(odd) > 8 else ''}; with find_unused_parameters=False every "
                f"parameter must take part in the loss on every rank (or pass find_unused_parameters=True)",
                params=",".join(self.names[i] for i in odd))

    # -- lifecycle --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Remove the gradient hooks and wait for what is in flight; the model trains locally after."""
        if self.stopped:
            return
        self.stopped = True
        for h in self._handles:
            h.remove()
        inflight, self._inflight = self._inflight, []
        for _, pending in inflight:
            with contextlib.suppress(Exception):
                pending.wait()


class DistributedDataParallel(torch.nn.Module):
    """torch DDP's interface over HFReduce; see the module docs.

    ``device_ids``, ``output_device`` and ``dim`` are accepted for torch's signature and
    unused (one process holds one model replica).  ``process_group`` is not taken: pass
    ``comm`` (an HFReduce communicator; default :func:`.comm.shared`, the one the
    ``hfreduce`` torch.distributed backend uses too).  ``first_bucket_mb``
    sizes the first bucket (1 MiB by default).
    """

    def __init__(self, module: torch.nn.Module, device_ids: Any = None, output_device: Any = None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group: Any = None, bucket_cap_mb: float = 25.0,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, *, comm: Any = None,
                 first_bucket_mb: float = DEFAULT_FIRST_BUCKET_BYTES / MIB) -> None:
        super().__init__()
        if process_group is not None:
            raise InvalidArgument("haiscale DDP reduces through an HFReduce communicator: pass comm=... "
                                  "(hfreduce.init()), not process_group", argument="process_group")
        if comm is None:
            from .comm import shared

            comm = shared()
        self.module = module
        self.comm = comm
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        for n, p in named:
            if p.device.type != "cpu":
                raise InvalidArgument(f"parameter {n!r} is on {p.device}: haiscale DDP reduces CPU models "
                                      f"(CUDA parameters go through the torch backend: "
                                      f"dist.init_process_group('hfreduce') and torch DDP)", param=n)
            _check_dtype(f"parameter {n!r}", p.dtype)
        self._check_same_structure(named)
        self._sync_module_states()
        self.reducer = Reducer(comm, named, cap_bytes=int(bucket_cap_mb * MIB),
                               first_bucket_bytes=int(first_bucket_mb * MIB),
                               find_unused_parameters=find_unused_parameters,
                               gradient_as_bucket_view=gradient_as_bucket_view)

    # -- construction -----------------------------------------------------------------------------

    def _check_same_structure(self, named: list[tuple[str, torch.nn.Parameter]]) -> None:
        text = ";".join(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in named)
        for n, b in self.module.named_buffers():
            text += f";buffer {n}:{tuple(b.shape)}:{b.dtype}"
        crc = zlib.crc32(text.encode())
        both = np.array([crc, -crc], np.int64)
        self.comm.allreduce(both, op="max")
        if both[0] != crc or -both[1] != crc:
            raise InvalidArgument(f"rank {self.comm.rank}: the model's parameters (names, shapes, dtypes) differ "
                                  f"across ranks; every rank must wrap the same model", rank=self.comm.rank)

    def _tensors_to_sync(self, buffers_only: bool) -> list[torch.Tensor]:
        out = [] if buffers_only else [p.data for p in self.module.parameters()]
        out += [b for b in self.module.buffers()]
        return [t for t in out if t.numel() > 0]

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0's values into every rank's tensors: one broadcast per dtype."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for dtype, ts in by_dtype.items():
            if dtype == torch.bool:
                flat = torch.cat([t.reshape(-1).to(torch.int32) for t in ts])
            else:
                _check_dtype("a parameter or buffer", dtype)
                flat = torch.cat([t.reshape(-1) for t in ts])
            self.comm.broadcast(flat, root=0)
            off = 0
            with torch.no_grad():
                for t in ts:
                    t.copy_(flat[off:off + t.numel()].view(t.shape).to(t.dtype))
                    off += t.numel()

    def _sync_module_states(self) -> None:
        self._broadcast(self._tensors_to_sync(buffers_only=False))

    # -- torch DDP's interface --------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.reducer.stopped:
            return self.module(*args, **kwargs)
        if self.require_forward_param_sync and self.broadcast_buffers:
            bufs = self._tensors_to_sync(buffers_only=True)
            if bufs:
                self._broadcast(bufs)
        # no_sync() decides at forward time, as under torch DDP: the backward of this output syncs or not
        self.reducer.sync = self.require_backward_grad_sync
        out = self.module(*args, **kwargs)
        # as torch DDP: after a forward that will not sync gradients (no_sync, or no grad), the next
        # forward does not broadcast buffers either, so accumulated micro-batches keep local statistics
        self.require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes of forwards run inside accumulate gradients locally; the next one outside syncs."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state: Any, hook: Callable[[Any, Any], Pending]) -> None:
        """Reduce each bucket with ``hook(state, bucket)`` (see :mod:`.hooks`); once, before the first step."""
        if self.reducer.steps > 0:
            raise FailedPrecondition("register_comm_hook must be called before the first backward pass")
        if self.reducer.comm_hook is not allreduce_hook:
            raise FailedPrecondition("a comm hook is already registered; DDP takes one")
        self.reducer.comm_hook, self.reducer.comm_state = hook, state

    def stop(self) -> None:
        """``reducer.stop()``: no more gradient reduction (hooks removed; in-flight ops waited for)."""
        self.reducer.stop()


def _check_dtype(what: str, dtype: torch.dtype) -> None:
    from fireflyer.hfreduce.torch_dtypes import torch_to_numpy_dtype

    try:
        torch_to_numpy_dtype(dtype)
    except InvalidArgument as e:
        raise InvalidArgument(f"{what} is {dtype}, which HFReduce does not reduce (float32, float16, bfloat16, "
                              f"float8, int32, int64 only); cast the model", what=what) from e
