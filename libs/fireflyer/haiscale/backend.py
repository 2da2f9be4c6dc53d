"""HFReduce as a ``torch.distributed`` backend: ``dist.init_process_group("hfreduce")``.

    import fireflyer.haiscale                  # registers the backend (so does ``import haiscale``)
    dist.init_process_group("hfreduce")        # under ff launch: RANK, WORLD_SIZE, MASTER_* and FF_*
    dist.all_reduce(t); dist.broadcast(t, 0); dist.barrier()
    model = torch.nn.parallel.DistributedDataParallel(model)   # stock torch DDP, reduced by HFReduce

The process group is a Python ``dist.ProcessGroup`` subclass (torch calls its methods
through its pybind trampoline, as for its own threaded test group) over the process's
shared HFReduce communicator (:mod:`.comm`: a worker runs one at a time).  Each op is submitted asynchronously and returns a
:class:`HFReduceWork`; ``wait()`` waits for the HFReduce op itself.  ``get_future()``
(what torch DDP's reducer chains on) is completed by one helper thread per group,
started on the first call, that waits for those ops in submission order.

Ops:

- ``allreduce`` (sum, avg, max, min), ``allreduce_coalesced``, ``broadcast``,
  ``reduce``, ``barrier``: HFReduce's own collectives;
- ``allgather`` / ``all_gather_single`` (``all_gather``, ``all_gather_into_tensor``) and
  ``reduce_scatter`` / ``reduce_scatter_single`` (``reduce_scatter_tensor``): HFReduce's native
  ``comm.allgather`` / ``comm.reduce_scatter``, one op each (the list forms through one flat
  buffer).  The allgather is bit-exact for every dtype (-0.0, NaN payloads) and each node receives
  the other nodes' shares once; the reduce-scatter's values are bit for bit those of an allreduce
  followed by slicing (:mod:`fireflyer.hfreduce.opexec` says how, and what bytes each moves).
  Inputs are left as they are;
- everything else (send / recv, alltoall, gather, scatter, PRODUCT / BAND ... reduce ops)
  raises :class:`~fireflyer.core.errors.Unimplemented` naming the op.

Only the world group: ``dist.new_group`` over a subset raises (an HFReduce communicator
spans every rank of the launch).
"""

from __future__ import annotations

import os
import queue
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work

from fireflyer.core.errors import InvalidArgument, Unimplemented

__all__ = ["BACKEND", "HFReduceProcessGroup", "HFReduceWork", "register"]

BACKEND = "hfreduce"

_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min"}


def _op_name(op: Any, where: str) -> str:
    for k, v in _OPS.items():
        if op == k:
            return v
    name = getattr(getattr(op, "op", op), "name", str(op))  # opts carry a ReduceOp wrapping a RedOpType
    raise Unimplemented(f"the hfreduce backend has no reduce op {name} (in {where}); it reduces with SUM, AVG, "
                        f"MAX and MIN", op=name, collective=where)


class HFReduceWork(Work):
    """One or more HFReduce ops of one torch collective; ``finish`` runs once they are all done."""

    def __init__(self, works: list[Any], result: list[torch.Tensor], finish: Any = None) -> None:
        super().__init__()
        self._works, self._result, self._finish = works, result, finish
        self._lock = threading.Lock()
        self._done = False
        self._error: BaseException | None = None
        self._fut: torch.futures.Future[list[torch.Tensor]] | None = None

    def _complete(self) -> None:
        with self._lock:
            if not self._done:
                try:
                    for w in self._works:
                        w.wait()
                    if self._finish is not None:
                        self._finish()
                except BaseException as e:  # noqa: BLE001 - handed to the waiter and the future
                    self._error = e
                self._done = True
                if self._fut is not None:
                    if self._error is None:
                        self._fut.set_result(self._result)
                    else:
                        self._fut.set_exception(self._error)
        if self._error is not None:
            raise self._error

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._complete()
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        if all(w.is_completed() for w in self._works):
            self._complete()
            return True
        return False

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> Any:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        with self._lock:
            if self._fut is None:
                self._fut = torch.futures.Future()
                if self._done:
                    if self._error is None:
                        self._fut.set_result(self._result)
                    else:
                        self._fut.set_exception(self._error)
                    return self._fut
                fresh = True
            else:
                fresh = False
        if fresh:
            _completer().put(self)
        return self._fut


class _Completer:
    """One daemon thread completing the futures of works, in the order they were asked for."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[HFReduceWork] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="hfreduce-futures", daemon=True).start()

    def put(self, work: HFReduceWork) -> None:
        self.q.put(work)

    def _run(self) -> None:
        while True:
            work = self.q.get()
            try:
                work._complete()
            except BaseException:  # noqa: BLE001, S110 - the error went to the future (and to wait())
                pass


_COMPLETER: _Completer | None = None
_COMPLETER_LOCK = threading.Lock()


def _completer() -> _Completer:
    global _COMPLETER
    with _COMPLETER_LOCK:
        if _COMPLETER is None:
            _COMPLETER = _Completer()
        return _COMPLETER


def _contiguous(t: torch.Tensor, where: str) -> None:
    if not t.is_contiguous():
        raise InvalidArgument(f"the hfreduce backend reduces contiguous tensors ({where}); call .contiguous()",
                              collective=where)


class HFReduceProcessGroup(ProcessGroup):
    """A ``dist.ProcessGroup`` whose collectives are HFReduce ops of one communicator."""

    def __init__(self, comm: Any, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.comm = comm
        self._rank, self._size = rank, size

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # -- HFReduce's own collectives ------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "allreduce")
        for t in tensors:
            _contiguous(t, "allreduce")
        return HFReduceWork([self.comm.allreduce(t, op=op, async_op=True) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            _contiguous(t, "broadcast")
        return HFReduceWork([self.comm.broadcast(t, root=root, async_op=True) for t in tensors], tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = _op_name(opts.reduceOp, "reduce")
        for t in tensors:
            _contiguous(t, "reduce")
        return HFReduceWork([self.comm.reduce(t, root=opts.rootRank, op=op, async_op=True) for t in tensors], tensors)

    def barrier(self, opts: Any = None) -> Work:
        return HFReduceWork([self.comm.barrier(async_op=True)], [])

    # -- the sharded-training pair: HFReduce's native allgather / reduce_scatter ------------------------

    def _flat_out(self, output: torch.Tensor, where: str) -> torch.Tensor:
        """``output`` as the flat buffer the op writes (a view: it must be contiguous)."""
        _contiguous(output, where)
        return output.reshape(-1)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> Work:
        works, finishes = [], []
        for outs, inp in zip(output_tensors, input_tensors, strict=True):
            if len(outs) != self._size:
                raise InvalidArgument(f"allgather: {len(outs)} output tensors for world size {self._size}",
                                      collective="allgather")
            flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype)
            works.append(self.comm.allgather(flat, inp.contiguous().reshape(-1), async_op=True))
            finishes.append((flat, outs, inp.numel()))

        def finish() -> None:
            for flat, outs, n in finishes:
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n:(r + 1) * n].view(o.shape))

        return HFReduceWork(works, [t for outs in output_tensors for t in outs], finish)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Work:
        out = self._flat_out(output, "all_gather_into_tensor")
        return HFReduceWork([self.comm.allgather(out, inp.contiguous().reshape(-1), async_op=True)], [output])

    _allgather_base = all_gather_single  # the name torch < 2.10 calls

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> Work:
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter")
        works = []
        for out, ins in zip(output_tensors, input_lists, strict=True):
            if len(ins) != self._size or any(t.numel() != out.numel() for t in ins):
                raise InvalidArgument(f"reduce_scatter: expected {self._size} inputs of {out.numel()} elements "
                                      f"(the output's), got {[t.numel() for t in ins]}", collective="reduce_scatter")
            flat = torch.cat([t.reshape(-1) for t in ins])
            works.append(self.comm.reduce_scatter(self._flat_out(out, "reduce_scatter"), flat, op=op, async_op=True))
        return HFReduceWork(works, output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Work:
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter_tensor")
        out = self._flat_out(output, "reduce_scatter_tensor")
        return HFReduceWork([self.comm.reduce_scatter(out, inp.contiguous().reshape(-1), op=op, async_op=True)],
                            [output])

    _reduce_scatter_base = reduce_scatter_single  # the name torch < 2.10 calls

    # -- what HFReduce has no op for ----------------------------------------------------------------

    def _unsupported(self, op: str) -> Work:
        raise Unimplemented(f"the hfreduce torch.distributed backend does not implement {op}; it has allreduce, "
                            f"broadcast, reduce, barrier, allgather and reduce_scatter (use a gloo group for {op})",
                            collective=op)

    def send(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("send")

    def recv(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("recv")

    def recv_anysource(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("recv_anysource")

    def alltoall(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("alltoall")

    def alltoall_base(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("all_to_all_single")

    def all_to_all_single(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("all_to_all_single")

    def all_gather_single_coalesced(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("all_gather_into_tensor_coalesced")

    def reduce_scatter_single_coalesced(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("reduce_scatter_tensor_coalesced")

    def gather(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("gather")

    def scatter(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("scatter")

    def allgather_coalesced(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("allgather_coalesced")

    def monitored_barrier(self, *a: Any, **k: Any) -> Work:
        return self._unsupported("monitored_barrier")


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> HFReduceProcessGroup:
    from .comm import shared

    world = os.environ.get("FF_WORLD_SIZE")
    if world is not None and int(world) != size:
        raise Unimplemented(f"the hfreduce backend serves the world group only ({world} ranks), not a group of "
                            f"{size}: build sub-groups on gloo", collective="new_group")
    # one communicator per process (a worker runs one at a time), shared with haiscale's DDP; its op
    # deadline is HFReduce's (FF_HFREDUCE_TIMEOUT_S or the worker's), not torch's 30-minute default:
    # a collective that stalls should fail naming the peer within seconds, not half an hour
    comm = shared()
    if comm.rank != rank or comm.world_size != size:
        raise InvalidArgument(f"torch.distributed says rank {rank} of {size}, HFReduce (FF_RANK, FF_WORLD_SIZE) "
                              f"says rank {comm.rank} of {comm.world_size}: launch with ff launch",
                              rank=rank, world_size=size)
    return HFReduceProcessGroup(comm, rank, size)


def register() -> None:
    """Make ``"hfreduce"`` a torch.distributed backend name (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
