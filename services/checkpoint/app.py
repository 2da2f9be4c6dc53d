"""The checkpoint service: settings (``FF_CHECKPOINT_*``) and wiring onto the standard runtime.

    python -m services.checkpoint     # FF_CHECKPOINT_KV_URL=sqlite:///... (default <state_dir>/checkpoint.db)

Records live in the KV (SQLite by default, PostgreSQL for several replicas: every state
change is one serializable transaction, so replicas over one KV may serve together).
Checkpoint data and ``MANIFEST`` files live in 3FS under ``root``; the 3FS client finds
meta and mgmtd through ``FF_META_ADDR`` / ``FF_MGMTD_ADDR`` (``ff up`` passes them) or the
cluster record under the state dir, and presents this service's token (``FF_TOKEN``).
With ``local_root`` set, a local directory stands in for 3FS (no 3FS cluster needed).

Each commit is published as ``CheckpointCommitted`` on JetStream subject
``ff.ckpt.v1.job.<job>.committed`` (stream ``FF_CKPT``) through an outbox
(:mod:`fireflyer.bus.outbox`, kept in ``<state_dir>/<instance>.outbox.db``): the commit RPC
returns without waiting for NATS, and an event that could not be published (NATS down or
restarting) is sent, in order, once NATS is back.  A sweep runs at start and every
``sweep_interval_s``: it aborts checkpoints idle past ``abandon_after_s`` (a writer that
died) and removes their directories, and finishes commits and deletes a crash interrupted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.api.checkpoint.v1 import checkpoint_pb2_grpc as pb_grpc
from fireflyer.bus.outbox import Outbox
from fireflyer.ckpt.catalog import Catalog
from fireflyer.ckpt.layout import prefer_chunk_size
from fireflyer.ckpt.localfs import LocalFS
from fireflyer.ckpt.model import CheckpointRecord
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import FireFlyerError, SettingsError
from fireflyer.core.patience import Patience
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.kv import KV, aopen_kv
from fireflyer.meta.model import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE

from .events import STREAM, STREAM_SUBJECTS, committed_event, committed_subject
from .metrics import CheckpointMetrics
from .servicer import SERVICE_NAME, CheckpointServicer

__all__ = ["CheckpointSection", "CheckpointSettings", "CheckpointService", "kv_url_for", "outbox_path", "main"]


class CheckpointSection(msgspec.Struct, frozen=True, kw_only=True):
    #: empty: sqlite:///<state_dir>/checkpoint.db
    kv_url: str = ""
    #: where checkpoint directories go in the file system: <root>/<job>/step<N>-<id>
    root: str = "/ckpt"
    #: a pending checkpoint without Begin/CommitShard for this long is aborted by the sweep
    abandon_after_s: float = 600.0
    sweep_interval_s: float = 5.0
    #: a local directory instead of 3FS (single-machine use and tests)
    local_root: str = ""
    #: how long one attempt to publish a commit's event waits for JetStream's ack (the outbox
    #: retries until one is acked; the commit itself never waits)
    publish_timeout_s: float = 2.0
    #: chunk size of files under ``root`` in 3FS (its layout policy, set when smaller; 0: leave
    #: the inherited layout): large chunks amortize the storage's per-chunk fsyncs
    chunk_bytes: int = 64 << 20


class CheckpointSettings(ServiceSettings, frozen=True, kw_only=True):
    checkpoint: CheckpointSection = msgspec.field(default_factory=CheckpointSection)


def outbox_path(settings: CheckpointSettings, instance: str) -> Path:
    """``<state_dir>/<instance>.outbox.db``: commit events not yet acked by JetStream."""
    return Path(settings.state_dir).absolute() / f"{instance}.outbox.db"


def kv_url_for(settings: CheckpointSettings) -> str:
    return settings.checkpoint.kv_url or f"sqlite:///{Path(settings.state_dir).absolute() / 'checkpoint.db'}"


def _check(c: CheckpointSection) -> None:
    for key in ("abandon_after_s", "sweep_interval_s", "publish_timeout_s"):
        if not getattr(c, key) > 0:
            raise SettingsError(f"checkpoint.{key} must be positive, got {getattr(c, key)}",
                                key=f"checkpoint.{key}", expected="float > 0")
    if c.chunk_bytes and (c.chunk_bytes & (c.chunk_bytes - 1) or not MIN_CHUNK_SIZE <= c.chunk_bytes <= MAX_CHUNK_SIZE):
        raise SettingsError(f"checkpoint.chunk_bytes must be 0 or a power of two in [{MIN_CHUNK_SIZE}, "
                            f"{MAX_CHUNK_SIZE}], got {c.chunk_bytes}", key="checkpoint.chunk_bytes",
                            expected="power of two")
    if not c.root.startswith("/"):
        raise SettingsError(f"checkpoint.root must be an absolute path, got {c.root!r}", key="checkpoint.root",
                            expected="absolute path")


class CheckpointService(Service):
    """Fire-Flyer checkpoint catalog service (checkpoint)."""

    name = "checkpoint"
    settings_type = CheckpointSettings

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.kv: KV | None = None
        self.fs: Any = None
        self.catalog: Catalog | None = None
        self._ctx: ServiceContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._layout: asyncio.Task[None] | None = None
        self._outbox: Outbox | None = None
        self._metrics: CheckpointMetrics | None = None

    async def start(self, ctx: ServiceContext) -> None:
        settings: CheckpointSettings = self.settings  # type: ignore[assignment]
        c = settings.checkpoint
        _check(c)
        self._ctx, self._loop = ctx, asyncio.get_running_loop()
        self._metrics = CheckpointMetrics(ctx.metrics)
        if ctx.bus is not None:
            await ctx.bus.ensure_stream(STREAM, STREAM_SUBJECTS)
            # commits are published through an outbox kept next to the service's other state: a
            # commit never waits for NATS, and one made while NATS is away goes out once it is back
            self._outbox = Outbox(ctx.bus, path=outbox_path(settings, ctx.instance), name=f"{ctx.instance}-committed",
                                  attempt_timeout_s=c.publish_timeout_s)
            await self._outbox.start()
        else:
            ctx.log.warning("checkpoint.no_nats", note="commits are not published (nats.url is empty)")
        self.kv = await aopen_kv(kv_url_for(settings))
        self.fs = await asyncio.to_thread(self._open_fs, settings)
        if not c.local_root:
            await asyncio.to_thread(self._make_root, c.root)
            if c.chunk_bytes:
                self._layout = ctx.spawn(self._chunk_size_loop(c.root, c.chunk_bytes), name="checkpoint-chunk-size")
        # In 3FS the ranks create their checkpoint's directory under their own user; the
        # service (admin) writes only MANIFEST into it and removes it.
        self.catalog = Catalog(self.kv, self.fs, root=c.root, clock=ctx.clock, abandon_after_s=c.abandon_after_s,
                               create_dirs=bool(c.local_root), on_committed=self._on_committed)
        ctx.add_servicer(pb_grpc.add_CheckpointServiceServicer_to_server, CheckpointServicer(self.catalog),
                         SERVICE_NAME)
        # once now (what a crash left behind is finished before the first client call), then periodically
        await self._sweep_once()
        self._sweeper = ctx.spawn(self._sweep_loop(c.sweep_interval_s), name="checkpoint-sweep")
        ctx.log.info("checkpoint.starting", kv=kv_url_for(settings).split("@")[-1], root=c.root,
                     fs=f"local:{c.local_root}" if c.local_root else "3fs", abandon_after_s=c.abandon_after_s)

    @staticmethod
    def _open_fs(settings: CheckpointSettings) -> Any:
        if settings.checkpoint.local_root:
            Path(settings.checkpoint.local_root).mkdir(parents=True, exist_ok=True)
            return LocalFS(settings.checkpoint.local_root)
        from fireflyer.fs import connect

        return connect(token=settings.token, state_dir=settings.state_dir)

    def _make_root(self, root: str) -> None:
        """``root`` world-writable and sticky (as /tmp): every user's job gets its own directory
        in it, which only that user (and admins) may change."""
        self.fs.mkdir(root, 0o1777, parents=True, exist_ok=True)
        self.fs.chmod(root, 0o1777)

    async def _chunk_size_loop(self, root: str, chunk_bytes: int, *, max_delay_s: float = 10.0) -> None:
        """Give ``root`` ``chunk_bytes`` chunks (:mod:`fireflyer.ckpt.layout`) once the file
        system can: a cluster coming up starts this service before mgmtd has chain tables, and
        a layout cannot name a table that does not exist yet.  Until then checkpoints get the
        inherited chunk size (correct, only slower to write)."""
        assert self._ctx is not None
        delay = 0.5
        # each new reason once at INFO ("chain table 1 does not exist" while storage forms the
        # chains), a WARNING only if the wait lasts
        patience = Patience(self._ctx.log, "checkpoint.chunk_size_waiting", grace_s=60.0)
        while True:
            try:
                got = await asyncio.to_thread(prefer_chunk_size, self.fs, root, chunk_bytes)
            except FireFlyerError as e:
                patience.failed(e, root=root, chunk_bytes=chunk_bytes)
                await asyncio.sleep(delay)
                delay = min(2 * delay, max_delay_s)
                continue
            self._ctx.log.info("checkpoint.chunk_size", root=root, chunk_bytes=got)
            return

    def _on_committed(self, rec: CheckpointRecord) -> None:
        """Called by the Catalog on a worker thread: queue the event in the outbox and return (the
        outbox publishes it, retrying until JetStream acks it)."""
        if self._metrics is not None:
            self._metrics.committed(rec)
        ctx, outbox = self._ctx, self._outbox
        if ctx is None or outbox is None:
            return
        try:
            outbox.append(committed_subject(rec.job), committed_event(rec))
        except FireFlyerError as e:  # the outbox is full: NATS has been away for long
            # the commit stands (the record and MANIFEST say so); readers polling Latest still see it
            ctx.log.error("checkpoint.publish_failed", checkpoint=rec.id, job=rec.job, step=rec.step, error=str(e))
            return
        ctx.log.info("checkpoint.publish_queued", checkpoint=rec.id, job=rec.job, step=rec.step,
                     pending=outbox.pending)

    async def _sweep_once(self) -> None:
        assert self.catalog is not None and self._ctx is not None
        try:
            acted = await asyncio.to_thread(self.catalog.sweep)
        except Exception as e:  # noqa: BLE001 -- a KV or file-system hiccup: the next sweep retries
            self._ctx.log.warning("checkpoint.sweep_failed", error=repr(e))
            return
        if acted:
            self._ctx.log.info("checkpoint.swept", checkpoints=[f"{r.id}:{r.state.value}" for r in acted])

    async def _sweep_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self._sweep_once()

    async def stop(self) -> None:
        for task in (self._sweeper, self._layout):  # before the KV and fs close under them
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._outbox is not None:  # a moment to send what is queued; the rest waits in its file
            await self._outbox.stop(drain_s=2.0)
        if self.fs is not None and hasattr(self.fs, "close"):
            await asyncio.to_thread(self.fs.close)
        if self.kv is not None:
            self.kv.close()


def main(argv: list[str] | None = None) -> int:
    return run_service(CheckpointService, argv)
