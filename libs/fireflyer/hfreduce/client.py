"""The rank side of HFReduce: ``comm = hfreduce.init(); comm.allreduce(x)``.

    comm = hfreduce.init()                      # FF_RANK, FF_WORLD_SIZE, ... (DESIGN.md §3)
    g = comm.zeros(n, "float32")                # shared memory: the worker reduces it in place
    comm.allreduce(g, op="avg")                 # blocks; returns g
    w = comm.allreduce(t, async_op=True)        # numpy, CPU torch, CUDA (torch, numba) buffers
    w.wait(timeout=30); w.is_completed()
    comm.broadcast(x, root=0); comm.reduce(x, root=0); comm.barrier()
    comm.allgather(out, x)                      # out[r*n:(r+1)*n] = rank r's x (n = x.size)
    comm.reduce_scatter(out, x, op="sum")       # out = slice rank of the reduce of every rank's x
    comm.status()                               # recent and pending ops with their phases
    comm.close()

Buffers.  Arrays from :meth:`Communicator.empty` / :meth:`~Communicator.zeros` (and
torch tensors made from them with ``torch.from_numpy``) live in shared segments the
worker has mapped: zero copy.  Any other numpy array or CPU tensor is copied into a
staging segment and the result copied back; CUDA buffers go D2H / H2D (:mod:`.cuda`).
Results are in place: the call returns (or ``Work.wait`` returns) the object passed in.

Failures raise the :class:`~fireflyer.hfreduce.errors.HFReduceError` family with what
the worker or the engine found (who did not arrive, which fingerprints differ, which
peer / tree / phase stalled).  If the worker itself dies, every pending and later op
raises :class:`PeerLost` naming the node's worker; if it hangs, the op raises
:class:`CollectiveTimeout` ``GRACE_S`` after its deadline.  After any error the
communicator is dead: build a new one with ``init()``.

Order: a rank's ops complete in submission order.

Closing.  ``comm.close()`` leaves the communicator.  One never closed (a torch script that
skips ``destroy_process_group``) says the same goodbye at interpreter exit, or when it is
garbage collected, within ``GOODBYE_S``, so its worker retires it quietly; not from a forked
child (the socket is the parent's), and not when the interpreter ends on an uncaught
exception, which the worker reports as the rank's failure (``hfreduce.comm_failed``).

Records.  ``comm.status()`` shows the worker's records of recent and pending ops (phases,
arrivals, per-tree and per-peer times).  A communicator made with ``init(op_records=True)``
also gets each op's record in its reply, as ``Work.record`` (otherwise None): that costs a
small op the record's encoding and decoding, ~10 us on each side, so it is off by default.

Replies.  There is no reader thread: the thread that waits reads the worker's replies
itself (``Work.wait``, ``is_completed``, ``status``; one at a time, the others wait for
it), so a blocking op costs one wake-up on the rank, not two (the reader's, then the
waiter's).  :class:`Work` results (copy-back, H2D) are produced by whichever thread
reads the reply; ``is_completed()`` reads what has arrived without blocking, so it
alone is enough to poll an async op.  Every submit also drains the replies that have
arrived, so a rank that only submits never lets them pile up in the socket.
"""

from __future__ import annotations

import os
import socket as _socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from fireflyer.core.errors import FireFlyerError, InvalidArgument, Unavailable, error_from_dict

from . import kernels
from .cuda import is_cuda_array
from .errors import CollectiveTimeout, HFReduceError, PeerLost
from .protocol import (
    Bye,
    Channel,
    Done,
    Failed,
    Hello,
    Register,
    Registered,
    StatusReply,
    StatusRequest,
    Submit,
    Unregister,
    Welcome,
    encode,
)
from .shm import Segment
from .telemetry import OpRecord
from .torch_dtypes import torch_cpu_view, torch_to_numpy_dtype

__all__ = ["init", "Communicator", "Work", "CommStatus", "GRACE_S", "torch_to_numpy_dtype"]

#: how long after an op's deadline a rank gives up on a worker that says nothing
GRACE_S = 1.5
#: the most a goodbye at interpreter exit (or on garbage collection) may take: exit never hangs on it
GOODBYE_S = 2.0
#: a waiter re-checks deadlines (and whether it may read) at least this often
_STEP_S = 0.05
#: a waiter whose replies another thread is reading looks again this often
_NUDGE_S = 0.002


class CommStatus(msgspec.Struct):
    """``comm.status()``: the worker's ring buffer for this communicator, and this rank's view."""

    recent: list[OpRecord]
    pending: list[OpRecord]
    worker: dict[str, Any]
    rank_pending: list[int]


class Work:
    """An op in flight: ``wait(timeout)`` returns its result object or raises its error."""

    def __init__(self, comm: Communicator, seq: int, kind: str, obj: Any,
                 finish: Callable[[], None] | None, timeout_s: float) -> None:
        self.comm = comm
        self.seq = seq
        self.kind = kind
        self.obj = obj
        self.record: OpRecord | None = None
        self._finish = finish
        self._timeout_s = timeout_s
        # a flag, not a threading.Event: nobody blocks on it (waiters drive _progress, which polls
        # the socket), and an Event costs a Condition and a lock per op
        self._done = False
        self._error: BaseException | None = None
        self.head_since = time.monotonic()
        # only when the process traces (comm._tracer): the op's span is written when it resolves
        self._started_ns = time.time_ns() if comm._tracer is not None else 0

    def _is_done(self) -> bool:
        return self._done

    def _resolve(self, record: OpRecord | None, error: BaseException | None) -> None:
        if self._done:
            return
        self.record = record
        if error is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as e:  # noqa: BLE001 - reported to the waiter
                error = e
        self._error = error
        self._done = True
        if self._started_ns:
            self._span(error)

    def _span(self, error: BaseException | None) -> None:
        """One span per op, from submit to result (after the fact, so an async op needs no open span)."""
        from opentelemetry.trace import Status, StatusCode

        comm = self.comm
        sp = comm._tracer.start_span(f"hfreduce.{self.kind}", start_time=self._started_ns, attributes={
            "hfreduce.comm": comm.name, "hfreduce.seq": self.seq, "hfreduce.rank": comm.rank,
            "hfreduce.world_size": comm.world_size, "hfreduce.nbytes": int(getattr(self.obj, "nbytes", 0) or 0)})
        if error is not None:
            sp.set_status(Status(StatusCode.ERROR, str(error)))
        sp.end()

    def is_completed(self) -> bool:
        if not self._done:
            self.comm._progress(0.0, self._is_done)
        return self._done

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done (or ``timeout`` s: TimeoutError, the op stays pending); raise its error."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            self.comm._progress(_STEP_S if end is None else min(_STEP_S, end - time.monotonic()), self._is_done)
            if self._done:
                break
            now = time.monotonic()
            if self.comm._head() is self and now > self.head_since + self._timeout_s + GRACE_S:
                self.comm._worker_silent(self)
            if end is not None and now >= end:
                raise TimeoutError(f"op #{self.seq} ({self.kind}) not completed within {timeout} s")
        if self._error is not None:
            raise self._error
        return self.obj

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "pending"
        return f"Work(seq={self.seq}, {self.kind}, {state})"


class _Staging:
    """This rank's copy-in segments: one per op in flight, reused, grown on demand."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.free: list[tuple[int, Segment]] = []

    def acquire(self, nbytes: int) -> tuple[int, Segment]:
        fits = [s for s in self.free if s[1].nbytes >= nbytes]
        if fits:
            best = min(fits, key=lambda s: s[1].nbytes)
            self.free.remove(best)
            return best
        if self.free:  # too small: retire the smallest free one rather than pile up memory
            seg_id, seg = min(self.free, key=lambda s: s[1].nbytes)
            self.free.remove((seg_id, seg))
            self.comm._unregister(seg_id, seg)
        return self.comm._register(Segment.create(max(nbytes, 1 << 16)))

    def release(self, item: tuple[int, Segment]) -> None:
        self.free.append(item)


class Communicator:
    """A rank's handle on its node worker; see the module docs.  Use :func:`init`."""

    def __init__(self, *, rank: int, world_size: int, local_rank: int, local_world_size: int, node_rank: int,
                 nnodes: int, socket: str, job_id: str = "", name: str = "default", timeout_s: float | None = None,
                 connect_timeout_s: float = 30.0, op_records: bool = False) -> None:
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.node_rank, self.nnodes = node_rank, nnodes
        self.socket_path, self.job_id, self.name = socket, job_id, name
        #: ask the worker for each op's record (``Work.record``); see the module docs
        self.op_records = op_records
        self._lock = threading.RLock()
        self._ctl = threading.Lock()
        self._ctl_replies: list[Any] = []
        #: held by the one thread reading the worker's replies (see the module docs)
        self._rx = threading.Lock()
        self._pending: dict[int, Work] = {}
        self._seq = 0
        self._segments: dict[int, Segment] = {}
        self._user_segments: dict[int, Segment] = {}
        self._last_found: tuple[weakref.ref[np.ndarray], int, int] | None = None
        self._next_seg = 0
        self._broken: FireFlyerError | None = None
        self._closed = False
        self._cuda: Any = None
        self._staging = _Staging(self)
        self._tracer = _op_tracer()
        sock = _connect(socket, connect_timeout_s, node_rank)
        sock.settimeout(connect_timeout_s)  # a hung worker must not hang init() (recv -> None -> PeerLost)
        self._chan = Channel(sock)
        self._chan.send(Hello(comm=name, job_id=job_id, rank=rank, world_size=world_size, local_rank=local_rank,
                              local_world_size=local_world_size, node_rank=node_rank, nnodes=nnodes,
                              pid=os.getpid(), timeout_s=timeout_s or 0.0))
        reply = self._chan.recv()
        if isinstance(reply, Failed):
            self._chan.close()
            raise error_from_dict(reply.error)
        if not isinstance(reply, Welcome):
            self._chan.close()
            raise PeerLost(f"the HFReduce worker of node {node_rank} ({socket}) closed the connection during "
                           f"the handshake", node=node_rank, peer="worker")
        sock.settimeout(None)
        self.generation = reply.generation
        self.timeout_s = reply.timeout_s
        self.chunk_bytes = reply.chunk_bytes
        self.worker_pid = reply.worker_pid
        # a rank that exits (or drops its last reference) without close() still says goodbye, so
        # its worker retires the communicator quietly instead of reporting a dead rank; holds no
        # reference to self (weakref.finalize also runs its callback at interpreter exit)
        self._goodbye = weakref.finalize(self, _goodbye, self._chan, os.getpid())

    # -- public API -------------------------------------------------------------------------------

    def allreduce(self, x: Any, op: str = "sum", async_op: bool = False, *, timeout_s: float | None = None) -> Any:
        """Reduce ``x`` over all ranks with ``op`` (sum, avg, max, min), in place."""
        return self._collective("allreduce", x, op, -1, async_op, timeout_s)

    def reduce(self, x: Any, root: int, op: str = "sum", async_op: bool = False, *,
               timeout_s: float | None = None) -> Any:
        """Like allreduce, but only rank ``root``'s buffer receives the result (others are untouched)."""
        self._check_root(root)
        return self._collective("reduce", x, op, root, async_op, timeout_s)

    def broadcast(self, x: Any, root: int, async_op: bool = False, *, timeout_s: float | None = None) -> Any:
        """Copy rank ``root``'s buffer into every rank's ``x``, bit for bit."""
        self._check_root(root)
        return self._collective("broadcast", x, "sum", root, async_op, timeout_s)

    def allgather(self, out: Any, x: Any, async_op: bool = False, *, timeout_s: float | None = None) -> Any:
        """Gather every rank's ``x`` into every rank's ``out``, bit for bit (any dtype, NaN payloads
        and -0.0 included): rank ``r``'s ``x`` (``n`` elements) lands at ``out[r*n:(r+1)*n]`` (``out``
        flattened: ``world_size * n`` elements, ``x``'s dtype).  ``x`` is left as it is.  Returns
        ``out`` (or a Work).  How the worker moves the bytes: :mod:`.opexec` (each node receives the
        other nodes' blocks once: ``(nodes - 1) / nodes`` of ``out`` per node)."""
        self._check_pair("allgather", out, x)
        return self._collective("allgather", x, "sum", -1, async_op, timeout_s, out=out)

    def reduce_scatter(self, out: Any, x: Any, op: str = "sum", async_op: bool = False, *,
                       timeout_s: float | None = None) -> Any:
        """Reduce ``x`` (``world_size * n`` elements) over all ranks with ``op`` (as :meth:`allreduce`:
        sum, avg, max, min) and give rank ``r`` slice ``r`` of the result in ``out`` (``n`` elements,
        ``x``'s dtype).  ``x`` is left as it is.  The values are bit for bit those an
        :meth:`allreduce` of ``x`` followed by slicing gives, for every dtype and op (the worker runs
        the same reduction, in the same order; see :mod:`.opexec`).  Returns ``out`` (or a Work)."""
        if op not in kernels.OPS:
            raise InvalidArgument(f"unknown reduce op {op!r}; expected one of {', '.join(kernels.OPS)}")
        self._check_pair("reduce_scatter", out, x)
        return self._collective("reduce_scatter", x, op, -1, async_op, timeout_s, out=out)

    def barrier(self, async_op: bool = False, *, timeout_s: float | None = None) -> Any:
        """Return once every rank has called barrier (or return a Work)."""
        return self._collective("barrier", None, "sum", -1, async_op, timeout_s)

    def empty(self, shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
        """A numpy array in shared memory: ops on it need no copies (the worker reads it in place)."""
        dt = kernels.dtype_from_name(dtype) if not isinstance(dtype, np.dtype) else dtype
        count = int(np.prod(shape)) if not isinstance(shape, int) else shape
        seg_id, seg = self._register(Segment.create(count * dt.itemsize))
        with self._lock:
            self._user_segments[seg_id] = seg
        arr = seg.array(dt, count).reshape(shape)
        weakref.finalize(seg._mm, self._drop_user_segment, seg_id)
        return arr

    def zeros(self, shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
        return self.empty(shape, dtype)  # fresh shared memory is zero-filled by the kernel

    def status(self, timeout_s: float = 5.0) -> CommStatus:
        """The worker's recent and pending ops of this communicator (phases, arrivals, timings)."""
        reply = self._control(StatusRequest(req=0), timeout_s)
        if not isinstance(reply, StatusReply):
            raise HFReduceError(f"unexpected status reply {reply!r}")
        with self._lock:
            mine = sorted(self._pending)
        return CommStatus(recent=reply.recent, pending=reply.pending, worker=reply.worker, rank_pending=mine)

    def close(self) -> None:
        """Leave the communicator; pending ops fail.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._goodbye.detach()
        try:
            self._chan.send(Bye())
        except OSError:
            pass
        self._chan.close()
        self._fail_all(HFReduceError(f"communicator {self.name!r} was closed", rank=self.rank))
        with self._lock:
            segs = list(self._segments.values())
            self._segments.clear()
            self._user_segments.clear()
        for seg in segs:
            seg.unlink()
            seg.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Communicator({self.name!r}, rank {self.rank}/{self.world_size}, local {self.local_rank}/"
                f"{self.local_world_size}, node {self.node_rank}/{self.nnodes}, gen {self.generation})")

    # -- op machinery -----------------------------------------------------------------------------

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.world_size:
            raise InvalidArgument(f"root {root} out of range for world size {self.world_size}")

    def _describe(self, x: Any) -> tuple[int, np.dtype]:
        """(element count, dtype) of a buffer the ops take, without touching the worker."""
        if type(x) is not np.ndarray and is_cuda_array(x):
            if self._cuda is None:
                from .cuda import CudaStaging

                self._cuda = CudaStaging()
            dev, dt = self._cuda.device_array(x)
            return dev.nbytes // dt.itemsize, dt
        if isinstance(x, np.ndarray):
            return x.size, kernels.dtype_from_name(x.dtype)
        if type(x).__module__.startswith("torch"):
            return int(x.numel()), torch_to_numpy_dtype(x.dtype)
        raise InvalidArgument(f"HFReduce takes numpy arrays, torch tensors and CUDA arrays, not {type(x)}")

    def _check_pair(self, kind: str, out: Any, x: Any) -> None:
        """An allgather's or reduce_scatter's buffers agree (checked before anything is sent)."""
        (nx, dx), (no, do) = self._describe(x), self._describe(out)
        if dx != do:
            raise InvalidArgument(f"{kind}: out has dtype {do}, x has {dx}; they must be the same", kind=kind)
        want = (no, nx * self.world_size) if kind == "allgather" else (nx, no * self.world_size)
        if want[0] != want[1]:
            what = "out" if kind == "allgather" else "x"
            raise InvalidArgument(f"{kind}: {what} must have world_size ({self.world_size}) x "
                                  f"{nx if kind == 'allgather' else no} = {want[1]} elements, it has {want[0]}",
                                  kind=kind)

    def _collective(self, kind: str, x: Any, op: str, root: int, async_op: bool, timeout_s: float | None,
                    out: Any = None) -> Any:
        if kind in ("allreduce", "reduce", "reduce_scatter") and op not in kernels.OPS:
            raise InvalidArgument(f"unknown reduce op {op!r}; expected one of {', '.join(kernels.OPS)}")
        if self._broken is not None:
            raise self._broken
        if self._closed:
            raise HFReduceError(f"communicator {self.name!r} is closed", rank=self.rank)
        timeout = timeout_s or self.timeout_s
        finish: Callable[[], None] | None = None
        release: Callable[[], None] | None = None
        out_seg, out_offset, out_count = -1, 0, 0
        if kind == "barrier":
            seg_id, offset, count, dtype = -1, 0, 0, "int32"
        elif out is not None:  # allgather / reduce_scatter: x is only read, out only written
            seg_id, offset, count, dtype, _, release = self._prepare(kind, x, root, writes_back=False)
            try:
                out_seg, out_offset, out_count, _, finish, release2 = self._prepare(kind, out, root, writes_back=True)
            except BaseException:
                if release:
                    release()
                raise
            if release2 is not None:
                release = release2 if release is None else _chain(release, release2)
        else:
            seg_id, offset, count, dtype, finish, release = self._prepare(kind, x, root)
        result = x if out is None else out
        with self._lock:
            if self._broken is not None:
                if release:
                    release()
                raise self._broken
            seq = self._seq
            self._seq += 1
            done = finish if release is None else _chain(finish, release)
            work = Work(self, seq, kind, result, done, timeout)
            if not self._pending:
                work.head_since = time.monotonic()
            self._pending[seq] = work
            try:
                self._chan.send(Submit(seq=seq, kind=kind, op=op, dtype=dtype, count=count, seg=seg_id,
                                       offset=offset, root=root, timeout_s=timeout, record=self.op_records,
                                       out_seg=out_seg, out_offset=out_offset, out_count=out_count))
            except OSError:
                pass  # whoever reads next sees the EOF and fails the op naming the worker
        if async_op:
            self._progress(0.0, lambda: False)  # drain replies that arrived (see the module docs)
            return work
        return work.wait()

    def _prepare(self, kind: str, x: Any, root: int,
                 writes_back: bool | None = None) -> tuple[int, int, int, str, Any, Any]:
        """Where the worker finds x: (seg, offset, count, dtype, finish, release)."""
        if writes_back is None:
            writes_back = kind == "allreduce" or (kind == "reduce" and root == self.rank) or \
                (kind == "broadcast" and root != self.rank)
        if type(x) is not np.ndarray and is_cuda_array(x):
            if self._cuda is None:
                from .cuda import CudaStaging

                self._cuda = CudaStaging()
            dev, dt = self._cuda.device_array(x)
            item = self._staging.acquire(dev.nbytes)
            self._cuda.pin(item[1].base)
            host = item[1].array(np.uint8, dev.nbytes)
            self._cuda.to_host(dev, host)
            finish = (lambda: self._cuda.to_device(host, dev)) if writes_back else None
            return item[0], 0, dev.nbytes // dt.itemsize, kernels.dtype_name(dt), finish, lambda: self._staging.release(item)
        if type(x) is np.ndarray:
            arr = x
        elif type(x).__module__.startswith("torch"):
            if x.device.type != "cpu":
                raise InvalidArgument(f"unsupported torch device {x.device}")
            arr = torch_cpu_view(x)
        elif isinstance(x, np.ndarray):
            arr = x
        else:
            raise InvalidArgument(f"HFReduce reduces numpy arrays, torch tensors and CUDA arrays, not {type(x)}")
        dt = kernels.dtype_from_name(arr.dtype)
        if writes_back and not arr.flags.writeable:
            raise InvalidArgument("the result is written in place, but the array is read-only")
        found = self._find_segment(arr)
        if found is not None:
            return found[0], found[1], arr.size, kernels.dtype_name(dt), None, None
        item = self._staging.acquire(arr.nbytes)
        flat = item[1].array(dt, arr.size)
        np.copyto(flat.reshape(arr.shape), arr)
        finish = (lambda: np.copyto(arr, flat.reshape(arr.shape))) if writes_back else None
        return item[0], 0, arr.size, kernels.dtype_name(dt), finish, lambda: self._staging.release(item)

    def _find_segment(self, arr: np.ndarray) -> tuple[int, int] | None:
        # the same array op after op is the common case: remember the last one found (an array
        # object never moves, and its segment stays registered for as long as the array lives)
        last = self._last_found
        if last is not None and last[0]() is arr:
            return last[1], last[2]
        if not arr.flags.c_contiguous or arr.size == 0:
            return None
        addr = arr.__array_interface__["data"][0]  # (arr.ctypes.data builds a ctypes object: ~2 us)
        with self._lock:
            for seg_id, seg in self._user_segments.items():
                if seg.contains(addr, arr.nbytes):
                    self._last_found = (weakref.ref(arr), seg_id, addr - seg.address)
                    return seg_id, addr - seg.address
        return None

    def _head(self) -> Work | None:
        with self._lock:
            return self._pending[min(self._pending)] if self._pending else None

    def _worker_silent(self, work: Work) -> None:
        err = CollectiveTimeout(
            f"op #{work.seq} ({work.kind}) of communicator {self.name!r}: the HFReduce worker of node {self.node_rank} "
            f"(pid {self.worker_pid}, {self.socket_path}) gave no answer {work._timeout_s + GRACE_S:g} s after the "
            f"op could start (worker hung or stopped?)", node=self.node_rank, peer="worker", phase="worker",
            seq=work.seq, waited_s=work._timeout_s + GRACE_S)
        self._break(err)

    # -- segments & control ------------------------------------------------------------------------

    def _register(self, seg: Segment) -> tuple[int, Segment]:
        with self._lock:
            seg_id = self._next_seg
            self._next_seg += 1
        try:
            reply = self._control(Register(seg=seg_id, name=seg.name, nbytes=seg.nbytes), self.timeout_s)
        finally:
            seg.unlink()  # the worker unlinked it already when it mapped it; this covers its failure
        if not isinstance(reply, Registered):
            seg.close()
            raise HFReduceError(f"the worker did not map segment {seg.name}: {reply!r}")
        with self._lock:
            self._segments[seg_id] = seg
        return seg_id, seg

    def _unregister(self, seg_id: int, seg: Segment) -> None:
        with self._lock:
            self._segments.pop(seg_id, None)
        try:
            self._chan.send(Unregister(seg=seg_id))
        except OSError:
            pass
        seg.close()

    def _drop_user_segment(self, seg_id: int) -> None:
        with self._lock:
            seg = self._user_segments.pop(seg_id, None)
            self._segments.pop(seg_id, None)
            closed = self._closed
        if seg is not None and not closed:
            try:
                self._chan.send(Unregister(seg=seg_id))
            except OSError:
                pass

    def _control(self, msg: Any, timeout_s: float) -> Any:
        """One request/reply on the control stream (Register, Status); replies come in order."""
        with self._ctl:
            if self._broken is not None:
                raise self._broken
            self._chan.send(msg)
            end = time.monotonic() + timeout_s
            while not self._ctl_replies:
                if self._broken is not None:
                    raise self._broken
                left = end - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeout(f"the HFReduce worker of node {self.node_rank} did not answer "
                                            f"{type(msg).__name__} within {timeout_s:g} s", node=self.node_rank,
                                            peer="worker", phase="control")
                self._progress(min(_STEP_S, left), lambda: bool(self._ctl_replies) or self._broken is not None)
            reply = self._ctl_replies.pop(0)
        if isinstance(reply, Failed):
            raise error_from_dict(reply.error)
        return reply

    def _progress(self, wait_s: float, done: Callable[[], bool]) -> None:
        """Read and dispatch the worker's replies until ``done()`` or ``wait_s`` has passed.

        One thread reads at a time; a thread that finds another reading sleeps briefly
        instead (the reader dispatches its reply too).  ``wait_s`` 0: only what has arrived.
        """
        if not self._rx.acquire(blocking=False):
            if wait_s > 0:
                time.sleep(min(wait_s, _NUDGE_S))
            return
        try:
            end = time.monotonic() + wait_s
            while not done() and self._broken is None:
                if not self._chan.readable(max(0.0, end - time.monotonic())):
                    return
                try:
                    msg = self._chan.recv()
                except FireFlyerError as e:
                    self._break(e)
                    return
                if msg is None:
                    if not self._closed:
                        self._break(PeerLost(
                            f"the HFReduce worker of node {self.node_rank} (pid {self.worker_pid}, "
                            f"{self.socket_path}) closed the connection of rank {self.rank}: the worker died or "
                            f"was stopped", node=self.node_rank, peer="worker", phase="control"))
                    return
                self._dispatch(msg)
        finally:
            self._rx.release()

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, Done | Failed) and msg.seq >= 0:
            with self._lock:
                work = self._pending.pop(msg.seq, None)
                if self._pending:
                    self._pending[min(self._pending)].head_since = time.monotonic()
            if work is None:
                return
            if isinstance(msg, Failed):
                err = error_from_dict(msg.error)
                self._broken = self._broken or err
                work._resolve(None, err)
            else:
                work._resolve(msg.record, None)
        else:
            self._ctl_replies.append(msg)

    def _break(self, err: FireFlyerError) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = err
        self._fail_all(err)

    def _fail_all(self, err: FireFlyerError) -> None:
        with self._lock:
            works = list(self._pending.values())
            self._pending.clear()
        for w in works:
            w._resolve(None, err)


def _exiting_from_uncaught_exception() -> bool:
    """True once the interpreter printed an uncaught exception's traceback (it sets sys.last_value)."""
    return getattr(sys, "last_value", None) is not None and not isinstance(sys.last_value, SystemExit)


def _goodbye(chan: Channel, pid: int) -> None:
    """Say ``Bye`` to the worker and close: a communicator's end without ``close()``.

    Runs at interpreter exit and when the communicator is garbage collected.  Bounded by
    ``GOODBYE_S`` (a worker that does not read must not hang the exit).  Skipped in a forked
    child (the socket is the parent's) and when the interpreter is exiting from an uncaught
    exception: that rank did fail, and its worker reports it as the failure it is.
    """
    if os.getpid() != pid or chan.closed:
        return
    if not _exiting_from_uncaught_exception() and chan._send_lock.acquire(timeout=GOODBYE_S):
        try:
            chan.sock.settimeout(GOODBYE_S)
            chan.sock.sendall(encode(Bye()))
        except OSError:
            pass
        finally:
            chan._send_lock.release()
    chan.close()


def _chain(a: Callable[[], None] | None, b: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            if a is not None:
                a()
        finally:
            b()

    return run


def _connect(path: str, timeout_s: float, node_rank: int) -> _socket.socket:
    """Connect to the worker's socket, retrying while it starts."""
    end = time.monotonic() + timeout_s
    while True:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError as e:
            s.close()
            if time.monotonic() >= end:
                raise Unavailable(f"no HFReduce worker at {path} for node {node_rank} after {timeout_s:g} s ({e}); "
                                  f"is the worker running (ff launch starts it)?", socket=path) from e
            time.sleep(0.05)


_ENV = {"rank": "FF_RANK", "world_size": "FF_WORLD_SIZE", "local_rank": "FF_LOCAL_RANK",
        "local_world_size": "FF_LOCAL_WORLD_SIZE", "node_rank": "FF_NODE_RANK", "nnodes": "FF_NNODES"}


def _op_tracer() -> Any:
    """The tracer for op spans, or None when this process does not trace (the common case: then an op
    costs no OpenTelemetry call at all).  A rank of a traced task sets tracing up here
    (:func:`fireflyer.telemetry.ensure_task_tracing`)."""
    from fireflyer.telemetry import ensure_task_tracing, tracer, tracing_configured

    ensure_task_tracing()
    return tracer("fireflyer.hfreduce.client") if tracing_configured() else None


def init(*, rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
         local_world_size: int | None = None, node_rank: int | None = None, nnodes: int | None = None,
         socket: str | None = None, job_id: str | None = None, name: str = "default",
         timeout_s: float | None = None, connect_timeout_s: float = 30.0, op_records: bool = False,
         env: Mapping[str, str] | None = None) -> Communicator:
    """Join communicator ``name`` through this node's worker; arguments override the environment.

    Reads FF_RANK, FF_WORLD_SIZE, FF_LOCAL_RANK, FF_LOCAL_WORLD_SIZE, FF_NODE_RANK, FF_NNODES,
    FF_HFREDUCE_SOCKET, FF_JOB_ID and FF_HFREDUCE_TIMEOUT_S (DESIGN.md §3).  With ``op_records``
    every op's :class:`Work` gets the worker's record of it (``Work.record``).
    """
    environ = os.environ if env is None else env
    given = {"rank": rank, "world_size": world_size, "local_rank": local_rank,
             "local_world_size": local_world_size, "node_rank": node_rank, "nnodes": nnodes}
    values: dict[str, int] = {}
    missing = []
    for key, var in _ENV.items():
        v = given[key]
        if v is None and var in environ:
            try:
                v = int(environ[var])
            except ValueError as e:
                raise InvalidArgument(f"{var}={environ[var]!r} is not an integer", key=var) from e
        if v is None:
            missing.append(var)
        else:
            values[key] = v
    sock = socket or environ.get("FF_HFREDUCE_SOCKET")
    if not sock:
        missing.append("FF_HFREDUCE_SOCKET")
    if missing:
        raise InvalidArgument(f"hfreduce.init: set {', '.join(missing)} (ff launch does) or pass them as arguments",
                              missing=",".join(missing))
    if timeout_s is None and environ.get("FF_HFREDUCE_TIMEOUT_S"):
        timeout_s = float(environ["FF_HFREDUCE_TIMEOUT_S"])
    if values["world_size"] != values["local_world_size"] * values["nnodes"]:
        raise InvalidArgument(f"world size {values['world_size']} != local world size "
                              f"{values['local_world_size']} x nodes {values['nnodes']}")
    return Communicator(**values, socket=sock, job_id=job_id if job_id is not None else environ.get("FF_JOB_ID", ""),
                        name=name, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, op_records=op_records)
