"""Per-op telemetry of the node worker: a ring buffer, a NATS publisher and OTel spans.

Why three sinks: the ring buffer answers ``comm.status()`` (what ran recently, what is
pending and in which phase -- the "which rank is stuck" question NCCL users cannot ask),
NATS feeds the coordinator's anomaly detection (``ff.coord.v1.comm.<id>.telemetry``),
and spans put an op on the same trace timeline as the rest of the job.

The op path only appends to a deque and a ``queue.SimpleQueue``; the publisher thread
batches and sends on its own asyncio loop, so a slow or absent NATS never delays a
collective (records are dropped, and counted, when the queue is over its bound).
"""

from __future__ import annotations

import asyncio
import collections
import queue
import re
import threading
import time
from typing import Any

import msgspec

from fireflyer.bus.events import Event
from fireflyer.core.log import get_logger

from .types import OpStats

__all__ = ["OpRecord", "OpRing", "TelemetryBatch", "NatsTelemetry", "comm_token", "PHASES"]

log = get_logger(__name__)

#: the phases an op goes through on a worker, in order (then ``done`` or ``failed``)
PHASES = ("waiting_ranks", "local_reduce", "tree", "writeback", "done", "failed")


class OpRecord(msgspec.Struct, kw_only=True):
    """One collective on one node: what it was, where it is, how long each part took.

    ``arrivals`` maps a local rank to the wall time (``time.time()``) its submit
    arrived; ``missing`` lists local ranks not yet arrived (while waiting) or that
    never did (after a timeout).  Times ending in ``_s`` are durations.
    """

    comm: str
    generation: int = 0
    seq: int
    kind: str
    op: str
    dtype: str
    count: int
    nbytes: int = 0
    node_rank: int = 0
    phase: str = "waiting_ranks"
    started_at: float = 0.0
    arrivals: dict[int, float] = msgspec.field(default_factory=dict)
    missing: list[int] = msgspec.field(default_factory=list)
    local_reduce_s: float = 0.0
    tree_s: float = 0.0
    writeback_s: float = 0.0
    finished_at: float = 0.0
    error: str = ""
    stats: OpStats | None = None


class OpRing:
    """The last ``size`` finished ops plus the pending ones, thread-safe."""

    def __init__(self, size: int = 256) -> None:
        self._recent: collections.deque[OpRecord] = collections.deque(maxlen=max(1, size))
        self._pending: dict[tuple[str, int, int], OpRecord] = {}
        self._lock = threading.Lock()

    def begin(self, rec: OpRecord) -> None:
        with self._lock:
            self._pending[(rec.comm, rec.generation, rec.seq)] = rec

    def finish(self, rec: OpRecord) -> None:
        with self._lock:
            self._pending.pop((rec.comm, rec.generation, rec.seq), None)
            self._recent.append(rec)

    def get(self, comm: str, generation: int, seq: int) -> OpRecord | None:
        with self._lock:
            return self._pending.get((comm, generation, seq))

    def pending_seqs(self, comm: str, generation: int) -> list[int]:
        """The seqs of the ops of one communicator generation still pending, in order."""
        with self._lock:
            return sorted(seq for (c, g, seq) in self._pending if c == comm and g == generation)

    def snapshot(self, comm: str | None = None) -> tuple[list[OpRecord], list[OpRecord]]:
        """Copies (recent, pending), optionally only of one communicator."""
        with self._lock:
            recent = [msgspec.structs.replace(r) for r in self._recent if comm is None or r.comm == comm]
            pending = [msgspec.structs.replace(r, arrivals=dict(r.arrivals), missing=list(r.missing))
                       for r in self._pending.values() if comm is None or r.comm == comm]
        return recent, pending


class TelemetryBatch(Event, tag="hfreduce.telemetry.v1"):
    """What one node's worker sends per interval for one communicator."""

    comm: str
    node_rank: int
    records: list[OpRecord]
    dropped: int = 0


_TOKEN_BAD = re.compile(r"[.*>\s/]")


def comm_token(comm: str) -> str:
    """A communicator name as a NATS subject token (``job/name`` -> ``job-name``)."""
    return _TOKEN_BAD.sub("-", comm) or "default"


class NatsTelemetry:
    """Batches finished :class:`OpRecord` s to NATS from a background thread.

    ``submit`` never blocks; ``close`` flushes what is queued (bounded wait).
    """

    def __init__(self, url: str, *, node_rank: int, interval_s: float = 1.0, max_queue: int = 10_000,
                 token: str | None = None, owner: str = "") -> None:
        self.url = url
        self.node_rank = node_rank
        #: the cluster credential (FF_TOKEN) this worker connects to NATS with
        self.token = token
        #: the job's user: batches go to its namespace (``ff.user.<owner>.coord.v1.comm.*.telemetry``),
        #: the only place a user's NATS credential may publish; "" = the cluster-wide subject
        #: (a worker run by a service, or a NATS without auth).  Coord mode sets it from the join.
        self.owner = owner
        self.interval_s = interval_s
        self.max_queue = max_queue
        self.sent = 0
        self.dropped = 0
        self._q: queue.SimpleQueue[OpRecord] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._nudged = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hfreduce-telemetry", daemon=True)
        self._thread.start()

    def submit(self, rec: OpRecord) -> None:
        if self._q.qsize() >= self.max_queue:
            self.dropped += 1
            return
        self._q.put(rec)

    def nudge(self) -> None:
        """Send what is queued now, not at the end of the interval: a failed op's record is the
        evidence a health service acts on, and a failing worker may be stopped within the interval."""
        self._nudged.set()

    def close(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _drain(self) -> dict[str, list[OpRecord]]:
        out: dict[str, list[OpRecord]] = {}
        while True:
            try:
                rec = self._q.get_nowait()
            except queue.Empty:
                return out
            out.setdefault(rec.comm, []).append(rec)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as e:  # never take the worker down for telemetry
            log.warning("hfreduce.telemetry_stopped", error=str(e))

    async def _main(self) -> None:
        from fireflyer.bus.connection import Bus
        from fireflyer.bus.subjects import owned, subject
        from fireflyer.core.config import NatsSettings

        bus: Any = None
        try:
            while True:
                stopping = self._stop.is_set()
                batches = self._drain()
                if batches and bus is None:
                    try:
                        bus = await Bus.connect(NatsSettings(url=self.url), name=f"hfreduce-worker-{self.node_rank}",
                                                token=self.token)
                    except Exception as e:
                        self.dropped += sum(len(v) for v in batches.values())
                        log.warning("hfreduce.telemetry_connect_failed", url=self.url, error=str(e))
                        batches = {}
                for comm, recs in batches.items():
                    ev = TelemetryBatch(comm=comm, node_rank=self.node_rank, records=recs, dropped=self.dropped)
                    try:
                        subj = subject("coord", "comm", comm_token(comm), "telemetry")
                        await bus.publish(owned(self.owner, subj) if self.owner else subj, ev)
                        self.sent += len(recs)
                    except Exception as e:
                        self.dropped += len(recs)
                        log.warning("hfreduce.telemetry_publish_failed", error=str(e))
                if stopping:
                    break
                deadline = time.monotonic() + self.interval_s
                while not self._stop.is_set() and not self._nudged.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(min(0.05, self.interval_s))
                self._nudged.clear()
            if bus is not None:
                await bus.flush(2.0)
        finally:
            if bus is not None:
                await bus.close()
