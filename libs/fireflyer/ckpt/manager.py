"""The training-side checkpoint manager: snapshot, write in the background, commit, load.

A save (paper §VII-A) stalls training only for the snapshot: the state is copied to host
memory (:mod:`.snapshot`) and :meth:`CheckpointManager.save` returns a future; a writer
thread then opens the checkpoint in the catalog (every rank calls ``begin`` and gets the
same pending checkpoint), writes this rank's shards with parallel batch I/O, writes its
index and commits its shard; the last rank's commit writes the manifest and commits the
checkpoint for all.  At most one save is in flight per manager: a new save first waits for
the previous one (its staging buffers are reused), so a slow file system throttles saving
instead of piling up host copies of the model.

The catalog is any object with :class:`~fireflyer.ckpt.catalog.Catalog`'s methods: the
catalog itself over a local SQLite file (``root=``, several processes may share it), or the
checkpoint service's client (found by ``fireflyer.cluster.discovery.find_cluster``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from opentelemetry import context as otel_context

from fireflyer.core.clock import SYSTEM_CLOCK, Clock
from fireflyer.core.errors import FailedPrecondition, FsError, InvalidArgument, NoClusterFound, NotFound
from fireflyer.core.log import get_logger
from fireflyer.telemetry import ensure_task_tracing, tracer

from .catalog import index_digest
from .index import decode_index, index_name
from .localfs import LocalFS
from .model import CheckpointRecord, RetentionPolicy, check_job
from .shard import CheckpointCorrupted, ParallelFS, pack, read_tensors, write_index, write_shards
from .snapshot import Snapshot, Snapshotter
from .state import unflatten

__all__ = ["CheckpointManager"]

log = get_logger(__name__)
_tracer = tracer(__name__)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgument(f"{name}={raw!r} is not an integer", key=name) from None


class CheckpointManager:
    """Saves and loads one rank's training state of ``job`` (see the module doc).

    ``root``: a local (or shared POSIX) directory holding the checkpoints and the catalog
    (``catalog.db``); without it the checkpoint service and 3FS of the cluster are used, found
    as every client finds it (:func:`fireflyer.cluster.discovery.find_cluster`):
    ``FF_CKPT_ADDR``/``FF_META_ADDR``/``FF_MGMTD_ADDR``/``FF_TOKEN`` (``ff launch`` sets them),
    else the local cluster of ``state_dir`` / ``FF_STATE_DIR`` / ``.ff`` (``ff up``) with its user
    token; with none, :class:`~fireflyer.core.errors.NoClusterFound`.
    ``interval_s`` (seconds, default 300) paces :meth:`maybe_save`: it saves at its first call and
    then once ``interval_s`` has passed since the last save; ``keep_last``/``keep_every`` are the job's
    retention.  ``after_write`` is a fault-injection hook called in the I/O thread after each
    part of a shard write.

    ``last_timings`` holds the phases (seconds) of the last completed save."""

    def __init__(self, job: str, root: str | os.PathLike[str] | None = None, interval_s: float = 300.0,
                 keep_last: int = 3, *, keep_every: int = 0, rank: int | None = None,
                 world_size: int | None = None, catalog: Any = None, fs: Any = None,
                 shard_bytes: int = 256 << 20, io_threads: int = 4, clock: Clock | None = None,
                 abandon_after_s: float = 600.0, copy_threads: int = 1,
                 after_write: Callable[[], None] | None = None,
                 state_dir: str | os.PathLike[str] | None = None) -> None:
        self.job = check_job(job)
        ensure_task_tracing()  # a rank of a traced task: its saves show in the task's trace
        self._state_dir = state_dir
        self.rank = _env_int("FF_RANK", 0) if rank is None else rank
        self.world_size = _env_int("FF_WORLD_SIZE", 1) if world_size is None else world_size
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise InvalidArgument(f"world_size must be >= 1, got {self.world_size!r}", job=job)
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise InvalidArgument(f"rank {self.rank!r} is outside 0..{self.world_size - 1}", job=job)
        if interval_s < 0 or shard_bytes <= 0 or io_threads < 1:
            raise InvalidArgument(f"bad settings: interval_s={interval_s}, shard_bytes={shard_bytes}, "
                                  f"io_threads={io_threads}", job=job)
        self.retention = RetentionPolicy(keep_last=keep_last, keep_every=keep_every).check()
        self.interval_s = float(interval_s)
        self.shard_bytes = shard_bytes
        self.last_timings: dict[str, float] = {}
        self.clock = clock or SYSTEM_CLOCK
        self._own_kv: Any = None
        self.catalog, self.fs = self._resolve(root, catalog, fs, abandon_after_s)
        self._io_pool = ThreadPoolExecutor(io_threads, thread_name_prefix="ff-ckpt-io")
        self._pfs = ParallelFS(self.fs, self._io_pool, io_threads, after_write=after_write)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ff-ckpt-writer")
        self._snap = Snapshotter(copy_threads=copy_threads)
        self._lock = threading.Lock()
        self._inflight: Future[CheckpointRecord] | None = None
        self._last_step: int | None = None
        self._last_save_at: float | None = None  # no save yet: the first maybe_save saves
        self._closed = False

    def _resolve(self, root: Any, catalog: Any, fs: Any, abandon_after_s: float) -> tuple[Any, Any]:
        if root is not None:
            root = os.path.abspath(os.fspath(root))
            os.makedirs(root, exist_ok=True)
            fs = fs if fs is not None else LocalFS(root)
            if catalog is None:
                from fireflyer.kv import open_kv

                from .catalog import Catalog

                self._own_kv = open_kv(f"sqlite:///{root}/catalog.db")
                catalog = Catalog(self._own_kv, fs, root="/", clock=self.clock, abandon_after_s=abandon_after_s)
                swept = catalog.sweep()  # clean up after writers that died mid-save
                if swept:
                    log.info("ckpt.manager.swept", job=self.job, checkpoints=[r.id for r in swept])
            return catalog, fs
        if catalog is None or fs is None:
            from fireflyer.cluster.discovery import find_cluster

            # one look for both (FF_CKPT_ADDR/FF_META_ADDR/FF_MGMTD_ADDR/FF_TOKEN, else the cluster of
            # state_dir / FF_STATE_DIR / .ff); NoClusterFound says how to point at one, or pass root=
            try:
                cluster = find_cluster(self._state_dir, need=(("ckpt",) if catalog is None else ())
                                       + (("meta", "mgmtd", "token") if fs is None else ()))
            except NoClusterFound as e:
                raise NoClusterFound(f"{e.message}; or pass root=DIR to keep checkpoints in a local directory",
                                     job=self.job, **e.fields) from None
        if catalog is None:
            from .client import CheckpointClient  # type: ignore[import-not-found,unused-ignore]

            catalog = CheckpointClient(cluster.ckpt[0], token=cluster.token or "")
        if fs is None:
            from fireflyer.fs import connect

            fs = connect(meta=list(cluster.meta), mgmtd=list(cluster.mgmtd), token=cluster.token)
        return catalog, fs

    # -- saving -------------------------------------------------------------------------------
    @property
    def last_saved_step(self) -> int | None:
        """The last step this manager saved and committed (its own shard), or None."""
        return self._last_step

    def save(self, step: int, state: Any, blocking: bool = False,
             meta: dict[str, str] | None = None) -> Future[CheckpointRecord]:
        """Snapshot ``state`` and write it in the background; the future's result is the
        checkpoint record after this rank's commit (committed once every rank committed).

        Bad input raises here, before anything is written: a step that is not an int >= 0
        (:class:`InvalidArgument`) or not after the last saved one (:class:`FailedPrecondition`),
        a state with something that cannot be checkpointed (:class:`InvalidArgument` naming its
        path).  Waits for the previous save first (one save in flight).  A failure while
        writing aborts the checkpoint and is the future's exception; the manager stays usable."""
        self._check_open()
        if type(step) is not int or step < 0:
            raise InvalidArgument(f"step must be an integer >= 0, got {step!r}", job=self.job, step=str(step))
        meta = dict(meta or {})
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in meta.items()):
            raise InvalidArgument("checkpoint meta must map str to str", job=self.job)
        with self._lock:
            self._wait_inflight()
            if self._last_step is not None and step <= self._last_step:
                raise FailedPrecondition(f"step {step} is not after the last saved step {self._last_step} of "
                                         f"job {self.job}", job=self.job, step=step, last_step=self._last_step)
            with _tracer.start_as_current_span("ckpt.snapshot", attributes={"ckpt.job": self.job, "ckpt.step": step,
                                                                           "ckpt.rank": self.rank}):
                snap = self._snap.take(state)  # the training stall; raises on bad state
            self._last_save_at = self.clock.monotonic()
            # the writer thread's spans are children of the caller's (a thread starts with no context)
            fut = self._writer.submit(self._write, step, snap, meta, otel_context.get_current())
            self._inflight = fut
        if blocking:
            self._wait_inflight()
        return fut

    def maybe_save(self, step: int, state: Any, meta: dict[str, str] | None = None) -> Future[CheckpointRecord] | None:
        """Save at the first call, then whenever ``interval_s`` (default 300 s) has passed since the
        last save (by this method or :meth:`save`); otherwise return None and do nothing.

        So a training loop that calls it every step has a checkpoint from its first step on, and
        then one every ``interval_s``; ``interval_s=0`` saves at every call.  The returned future
        is :meth:`save`'s.  To save at steps of your choosing (every N steps, the last step), call
        :meth:`save` instead."""
        if self._last_save_at is not None and self.clock.monotonic() - self._last_save_at < self.interval_s:
            return None
        return self.save(step, state, meta=meta)

    def _write(self, step: int, snap: Snapshot, meta: dict[str, str],
               parent: otel_context.Context | None = None) -> CheckpointRecord:
        # one span per save with a child per phase (begin, pack, write, commit): what the waterfall of a
        # task's trace shows of its checkpoints (docs/tracing.md)
        with _tracer.start_as_current_span("ckpt.save", context=parent, attributes={
                "ckpt.job": self.job, "ckpt.step": step, "ckpt.rank": self.rank}) as span:
            out = self._write_phases(step, snap, meta)
            span.set_attribute("ckpt.id", out.id)
            return out

    def _write_phases(self, step: int, snap: Snapshot, meta: dict[str, str]) -> CheckpointRecord:
        rec: CheckpointRecord | None = None
        try:
            t0 = time.perf_counter()
            with _tracer.start_as_current_span("ckpt.begin"):
                rec = self.catalog.begin(self.job, step, self.world_size, meta, retention=self.retention)
                snap.wait()  # the device-to-host copies overlap the begin round trip
            t1 = time.perf_counter()
            # shards are images of arena regions, written in whole chunks (shard.pack)
            with _tracer.start_as_current_span("ckpt.pack"):
                index, layouts = pack(snap.flat, rank=self.rank, shard_bytes=self.shard_bytes,
                                      arena_offsets=snap.offsets if snap.arena is not None else None)
            t2 = time.perf_counter()
            with _tracer.start_as_current_span("ckpt.write") as sp:
                nbytes = write_shards(self._pfs, rec.directory, index, snap.flat, layouts=layouts, arena=snap.arena)
                sp.set_attribute("ckpt.nbytes", nbytes)
            t3 = time.perf_counter()
            with _tracer.start_as_current_span("ckpt.commit"):
                data = write_index(self.fs, rec.directory, index)
                out: CheckpointRecord = self.catalog.commit_shard(rec.id, self.rank, index_digest(data), nbytes)
            t4 = time.perf_counter()
            self.last_timings = {"begin_s": t1 - t0, "pack_crc_s": t2 - t1, "write_s": t3 - t2, "commit_s": t4 - t3}
            self._last_step = step
            log.info("ckpt.manager.saved", job=self.job, step=step, rank=self.rank, checkpoint=out.id,
                     nbytes=nbytes, state=str(out.state))
            return out
        except BaseException as e:
            if rec is not None:  # only the checkpoint this rank began; an abort fails it for all ranks
                try:
                    self.catalog.abort(rec.id, f"rank {self.rank} failed to write its shard: {e}")
                except Exception as abort_err:  # noqa: BLE001 -- best effort; sweep aborts it later anyway
                    log.warning("ckpt.manager.abort_failed", checkpoint=rec.id, error=repr(abort_err))
            raise

    def _wait_inflight(self) -> None:
        fut = self._inflight
        if fut is not None:
            try:
                fut.result()
            except BaseException:  # noqa: BLE001 -- reported through that save's future
                pass

    def wait(self) -> None:
        """Wait for the save in flight (its errors stay on its future)."""
        self._wait_inflight()

    def close(self) -> None:
        """Wait for the save in flight, then release threads and staging memory."""
        if self._closed:
            return
        self._wait_inflight()
        self._closed = True
        self._writer.shutdown(wait=True)
        self._io_pool.shutdown(wait=True)
        self._snap.release()
        if self._own_kv is not None:
            self._own_kv.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPrecondition(f"checkpoint manager of job {self.job} is closed", job=self.job)

    # -- reading ------------------------------------------------------------------------------
    def list(self, *, include_all: bool = False) -> list[CheckpointRecord]:
        """The job's checkpoints in step order (committed only unless ``include_all``); [] if none."""
        try:
            return list(self.catalog.list(self.job, include_all=include_all))
        except NotFound:
            return []

    def latest(self) -> CheckpointRecord | None:
        """The newest committed checkpoint, or None."""
        done = self.list()
        return done[-1] if done else None

    def load_record(self, step: int | None = None) -> CheckpointRecord:
        """The committed checkpoint at ``step`` (the newest when None); :class:`NotFound` otherwise."""
        done = self.list()
        match = done[-1:] if step is None else [r for r in done if r.step == step]
        if not match:
            at = "" if step is None else f" at step {step}"
            have = ", ".join(str(r.step) for r in done[-5:]) or "none"
            raise NotFound(f"job {self.job} has no committed checkpoint{at} (newest steps: {have})",
                           job=self.job, step=-1 if step is None else step)
        return match[0]

    def load(self, step: int | None = None, keys: Iterable[str | Sequence[Any]] | None = None,
             map_location: Any = "cpu", *, rank: int | None = None) -> Any:
        """Load this rank's state from the newest committed checkpoint (or the one at ``step``);
        only the subtrees under ``keys`` when given.  A checkpoint saved by one rank (replicated
        data-parallel state) is loaded by every rank."""
        self._check_open()
        with _tracer.start_as_current_span("ckpt.load", attributes={"ckpt.job": self.job, "ckpt.rank": self.rank}):
            return self._load(step, keys, map_location, rank)

    def _load(self, step: int | None, keys: Iterable[str | Sequence[Any]] | None, map_location: Any,
              rank: int | None) -> Any:
        rec = self.load_record(step)
        rank = self.rank if rank is None else rank
        src = 0 if rec.world_size == 1 else rank
        if not 0 <= src < rec.world_size:
            raise InvalidArgument(f"rank {rank} is outside checkpoint {rec.id}'s world of {rec.world_size} ranks",
                                  checkpoint=rec.id, rank=rank)
        path = f"{rec.directory}/{index_name(src)}"
        try:
            data = self.fs.read_bytes(path)
        except FsError as e:
            raise CheckpointCorrupted(f"checkpoint {rec.id} (job {rec.job}, step {rec.step}) is committed but "
                                      f"rank {src}'s index {path} cannot be read: {e}", checkpoint=rec.id,
                                      step=rec.step, path=path) from e
        # the index is what every tensor's offset and CRC come from: check it against the digest
        # its rank committed before trusting any of it
        want = next((s.index_digest for s in self.catalog.shards(rec.id) if s.rank == src), None)
        if want is not None and index_digest(data) != want:
            raise CheckpointCorrupted(f"checkpoint {rec.id} (job {rec.job}, step {rec.step}): rank {src}'s index "
                                      f"{path} does not match the digest committed for it; restore an older "
                                      "checkpoint", checkpoint=rec.id, step=rec.step, path=path)
        index = decode_index(data)
        keys = None if keys is None else list(keys)
        try:
            leaves = read_tensors(self._pfs, rec.directory, index, keys, map_location)
        except CheckpointCorrupted as e:
            raise CheckpointCorrupted(f"checkpoint {rec.id} (job {rec.job}, step {rec.step}): {e.message}",
                                      **{**e.fields, "checkpoint": rec.id, "step": rec.step}) from e
        return unflatten(index.tree, leaves, keys)
