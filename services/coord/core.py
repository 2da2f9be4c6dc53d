"""coord's engine room: the rendezvous state machine adapted to RPCs, the KV and NATS.

Everything runs on the service's event loop and the state machine is called
without awaiting in between, so no lock is needed around it.  A Join that does
not complete the generation parks a future; the step that forms the generation
persists the record, then answers every parked join.  A loop (every
``sweep_interval_s``) expires join deadlines and scans heartbeats; an abort is
persisted and published on ``ff.coord.v1.comm.<id>.aborted`` so every member
raises within seconds.  Telemetry batches from the workers land in an
:class:`~fireflyer.coord.opstats.OpStatsStore`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from fireflyer.api.coord.v1 import coord_pb2 as pb
from fireflyer.coord import convert
from fireflyer.coord.layout import tree_views
from fireflyer.coord.model import CommAborted, CommRecord, JoinSpec, aborted_subject
from fireflyer.coord.opstats import OpStatsReport, OpStatsStore
from fireflyer.coord.rendezvous import LivenessConfig, Outcome, Rendezvous
from fireflyer.core.clock import Clock
from fireflyer.core.errors import Aborted, NotFound

from .metrics import CoordMetrics
from .store import CoordStore

__all__ = ["CoreConfig", "CoordCore"]


class CoreConfig(msgspec.Struct, frozen=True, kw_only=True):
    heartbeat_interval_s: float = 1.0
    heartbeat_misses: int = 3
    restart_grace_s: float = 10.0
    join_timeout_s: float = 60.0
    sweep_interval_s: float = 0.1
    keep_ops: int = 512


class CoordCore:
    def __init__(self, cfg: CoreConfig, *, store: CoordStore | None, bus: Any, clock: Clock, log: Any,
                 metrics: CoordMetrics | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.bus = bus
        self.clock = clock
        self.log = log
        self.rv = Rendezvous(LivenessConfig(interval_s=cfg.heartbeat_interval_s, misses=cfg.heartbeat_misses,
                                                restart_grace_s=cfg.restart_grace_s))
        self.ops = OpStatsStore(cfg.keep_ops)
        self.metrics = metrics
        self._waiters: dict[tuple[str, str], tuple[int, asyncio.Future[pb.JoinReply]]] = {}
        self.published = 0

    async def load(self) -> int:
        if self.store is None:
            return 0
        records = await self.store.load()
        self.rv.load(records, self.clock.time())
        return len(records)

    # -- RPCs -------------------------------------------------------------------------------------

    async def join(self, spec: JoinSpec, timeout_s: float) -> pb.JoinReply:
        now = self.clock.time()
        timeout = timeout_s if timeout_s > 0 else self.cfg.join_timeout_s
        out = self.rv.join(spec, now, now + timeout)
        assert out.record is not None
        key = (out.record.comm, spec.node)
        fut: asyncio.Future[pb.JoinReply] = asyncio.get_running_loop().create_future()
        old = self._waiters.pop(key, None)
        if old is not None and not old[1].done():
            old[1].set_exception(Aborted(f"node {spec.node} joined {key[0]} again; this earlier join is replaced",
                                         comm=key[0], node=spec.node))
        self._waiters[key] = (out.record.generation, fut)
        await self.apply(out)
        try:
            return await fut
        except asyncio.CancelledError:
            # the caller went away while waiting: withdraw it, so the generation does not form without it
            rec = self.rv.comms.get(key[0])
            if self._waiters.get(key, (0, None))[1] is fut:
                del self._waiters[key]
                if rec is not None and rec.state == "forming" and rec.member(spec.node) is not None:
                    await self.apply(self.rv.leave(key[0], rec.generation, spec.node, self.clock.time()))
            raise

    def heartbeat(self, comm: str, generation: int, node: str) -> CommRecord:
        return self.rv.heartbeat(comm, generation, node, self.clock.time())

    async def leave(self, comm: str, generation: int, node: str) -> CommRecord:
        out = self.rv.leave(comm, generation, node, self.clock.time())
        await self.apply(out)
        assert out.record is not None
        return out.record

    async def abort(self, comm: str, generation: int, node: str, reason: str) -> CommRecord:
        out = self.rv.abort(comm, generation, node, reason, self.clock.time())
        await self.apply(out)
        assert out.record is not None
        return out.record

    def describe(self, rec: CommRecord) -> pb.Communicator:
        now = self.clock.time()

        def age(node: str) -> float:
            seen = self.rv.last_seen(rec.comm, node)
            return -1.0 if seen is None else max(0.0, now - seen)

        return convert.comm_to_pb(rec, age)

    def op_stats(self, comm: str, last: int) -> tuple[OpStatsReport, dict[int, str]]:
        rec = self.rv.comms.get(comm)
        if rec is None and comm not in self.ops.comms():
            raise NotFound(f"no communicator {comm!r} and no telemetry for it", comm=comm)
        names = {m.node_rank: m.node for m in rec.members} if rec is not None else {}
        return self.ops.report(comm, last), names

    # -- steps ------------------------------------------------------------------------------------

    async def apply(self, out: Outcome) -> None:
        """Persist, then answer joins and publish aborts (in that order: a reply implies a stored record)."""
        if out.dirty and self.store is not None:
            await self.store.save(out.dirty)
        if out.formed is not None:
            self._answer(out.formed)
        for w, err in out.failed:
            entry = self._waiters.get((w.comm, w.node))
            if entry is not None and entry[0] == w.generation:
                del self._waiters[(w.comm, w.node)]
                if not entry[1].done():
                    entry[1].set_exception(err)
        for rec in out.aborted:
            self.log.warning("coord.comm_aborted", comm=rec.comm, generation=rec.generation, reason=rec.reason,
                             culprit=rec.culprit)
            if self.bus is not None:
                try:
                    await self.bus.publish(aborted_subject(rec.comm, rec.owner), CommAborted(
                        comm=rec.comm, generation=rec.generation, reason=rec.reason, culprit=rec.culprit))
                    self.published += 1
                except Exception as e:  # noqa: BLE001 - members still learn it from heartbeat replies
                    self.log.warning("coord.publish_failed", comm=rec.comm, error=str(e))

    def _answer(self, rec: CommRecord) -> None:
        dt = self.rv.trees[rec.comm]
        subject = aborted_subject(rec.comm, rec.owner)
        depths = (dt.trees[0].depth(), dt.trees[1].depth())
        for m in rec.members:
            entry = self._waiters.pop((rec.comm, m.node), None)
            if entry is None or entry[1].done():
                continue
            reply = convert.join_reply(rec, m.node_rank, tree_views(dt, rec.members, m.node_rank, depths),
                                       interval_s=self.cfg.heartbeat_interval_s, misses=self.cfg.heartbeat_misses,
                                       aborted_subject=subject)
            entry[1].set_result(reply)
        self.log.info("coord.comm_formed", comm=rec.comm, generation=rec.generation, nnodes=rec.nnodes,
                      depth=rec.depth, cross_zone_pairs=rec.cross_zone_pairs)

    async def sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.sweep_interval_s)
            try:
                now = self.clock.time()
                await self.apply(self.rv.expire(now))
                await self.apply(self.rv.scan(now))
            except Exception as e:  # noqa: BLE001 - a KV hiccup must not end liveness checking
                self.log.warning("coord.sweep_failed", error=repr(e))

    async def on_telemetry(self, batch: Any, msg: Any) -> None:
        self.ops.add(batch.comm, batch.node_rank, batch.records, batch.dropped)
        if self.metrics is not None:
            self.metrics.observe(batch.comm, batch.records)
