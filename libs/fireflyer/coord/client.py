"""Clients of the coordination service.

:class:`CoordClient` is the plain async API (one call per RPC, typed errors).
:class:`CoordMembership` is what a node's HFReduce worker holds for the life of
its communicator: it runs its own asyncio loop on a background thread (the worker
has no loop, and its data path must never wait on one, DESIGN.md §1), joins,
heartbeats every ``heartbeat_interval_s``, listens for the communicator's
``aborted`` event on NATS, and calls ``on_abort(reason, culprit)`` once when coord
says the generation is over -- through the event, or through a heartbeat reply
when NATS is absent or slow.  A coord that is down (restarting) is retried
quietly: running collectives do not depend on it, and a restarted coord counts
every member as freshly seen.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any

from fireflyer.api.coord.v1 import coord_pb2 as pb
from fireflyer.api.coord.v1 import coord_pb2_grpc as pb_grpc
from fireflyer.core.errors import DeadlineExceeded, FailedPrecondition, NotFound, Unavailable
from fireflyer.core.log import get_logger

from .convert import (
    STATE_FROM_PB,
    CommView,
    JoinResult,
    comm_from_pb,
    join_result_from_pb,
    join_spec_to_pb,
    opstats_from_pb,
)
from .model import ABORTED, ENDED, CommAborted, JoinSpec
from .opstats import OpStatsReport

__all__ = ["CoordClient", "CoordMembership", "AbortCallback"]

log = get_logger(__name__)

#: ``on_abort(reason, culprit)``; called at most once, on a thread of its own
AbortCallback = Callable[[str, str], None]


class CoordClient:
    """Async calls to one coord address; create and use it on one event loop."""

    def __init__(self, address: str, *, token: str | None = None) -> None:
        from fireflyer.rpc import connect

        self.address = address
        self.channel = connect(address, token=token)
        self.stub = pb_grpc.CoordServiceStub(self.channel)

    async def join(self, spec: JoinSpec, *, timeout_s: float = 60.0) -> JoinResult:
        reply = await self.stub.Join(join_spec_to_pb(spec, timeout_s), timeout=timeout_s + 5.0)
        return join_result_from_pb(reply)

    async def heartbeat(self, comm: str, generation: int, node: str, *, timeout_s: float = 5.0) -> tuple[str, str]:
        r = await self.stub.Heartbeat(pb.HeartbeatRequest(comm=comm, generation=generation, node=node),
                                      timeout=timeout_s)
        return STATE_FROM_PB.get(r.state, "unknown"), r.reason

    async def leave(self, comm: str, generation: int, node: str, *, timeout_s: float = 5.0) -> str:
        r = await self.stub.Leave(pb.LeaveRequest(comm=comm, generation=generation, node=node), timeout=timeout_s)
        return STATE_FROM_PB.get(r.state, "unknown")

    async def abort(self, comm: str, reason: str, *, generation: int = 0, node: str = "",
                    timeout_s: float = 5.0) -> tuple[str, str]:
        r = await self.stub.Abort(pb.AbortRequest(comm=comm, generation=generation, node=node, reason=reason),
                                  timeout=timeout_s)
        return STATE_FROM_PB.get(r.state, "unknown"), r.reason

    async def get(self, comm: str) -> CommView:
        return comm_from_pb((await self.stub.Get(pb.GetRequest(comm=comm))).comm)

    async def list(self, job: str = "") -> list[CommView]:
        return [comm_from_pb(c) for c in (await self.stub.List(pb.ListRequest(job=job))).comms]

    async def op_stats(self, comm: str, last: int = 0) -> tuple[OpStatsReport, dict[int, str]]:
        return opstats_from_pb(await self.stub.GetOpStats(pb.GetOpStatsRequest(comm=comm, last=last)))

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> CoordClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class CoordMembership:
    """One node's membership of one communicator, driven from a background thread; see the module docs."""

    def __init__(self, address: str, spec: JoinSpec, *, token: str | None = None, nats_url: str = "",
                 join_timeout_s: float = 60.0, on_abort: AbortCallback | None = None) -> None:
        self.address = address
        self.spec = spec
        self.token = token
        self.nats_url = nats_url
        self.join_timeout_s = join_timeout_s
        self.on_abort = on_abort
        self.result: JoinResult | None = None
        self.aborted: tuple[str, str] | None = None
        self.heartbeats = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ff-coord-member", daemon=True)
        self._client: CoordClient | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._bus: Any = None
        self._once = threading.Lock()
        self._closed = False

    # -- from the owner's thread ------------------------------------------------------------------

    def join(self) -> JoinResult:
        """Join (retrying while coord is unreachable), then heartbeat and watch in the background."""
        self._thread.start()
        return self._call(self._join(), timeout_s=self.join_timeout_s + 15.0)

    def abort(self, reason: str, timeout_s: float = 5.0) -> None:
        """Ask coord to abort this communicator (every member raises); best effort."""
        r = self.result
        if r is None or self._closed:
            return
        try:
            self._call(self._client_call(lambda c: c.abort(r.comm, reason, generation=r.generation,
                                                          node=self.spec.node)), timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001 - the caller is failing already
            log.warning("coord.abort_failed", comm=r.comm, error=str(e))

    def close(self, *, leave: bool = True, timeout_s: float = 3.0) -> None:
        """Leave the communicator (when ``leave``), stop heartbeating, end the thread."""
        if self._closed or not self._thread.is_alive():
            self._closed = True
            return
        self._closed = True
        try:
            self._call(self._close(leave), timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001 - closing anyway
            log.info("coord.close_incomplete", error=str(e))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)

    def _call(self, coro: Any, *, timeout_s: float) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise DeadlineExceeded(f"coord at {self.address} did not answer within {timeout_s:g} s",
                                   address=self.address) from None

    # -- on the membership loop -------------------------------------------------------------------

    async def _client_call(self, fn: Callable[[CoordClient], Any]) -> Any:
        assert self._client is not None
        return await fn(self._client)

    async def _join(self) -> JoinResult:
        self._client = CoordClient(self.address, token=self.token)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.join_timeout_s
        delay = 0.1
        while True:
            left = deadline - loop.time()
            try:
                result = await self._client.join(self.spec, timeout_s=max(0.5, left))
                break
            except Unavailable as e:
                if loop.time() + delay >= deadline:
                    raise Unavailable(f"coord at {self.address} unreachable for {self.join_timeout_s:g} s: {e}",
                                      address=self.address) from e
                log.info("coord.join_retry", address=self.address, error=str(e), delay_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.result = result
        self._tasks.append(loop.create_task(self._heartbeat_loop(result), name="coord-heartbeat"))
        if self.nats_url:
            await self._watch(result)
        return result

    async def _watch(self, r: JoinResult) -> None:
        from fireflyer.bus import Bus
        from fireflyer.core.config import NatsSettings

        async def on_event(ev: CommAborted, msg: Any) -> None:
            if ev.comm == r.comm and ev.generation == r.generation:
                self._fire(ev.reason, ev.culprit)

        try:
            # the member's own NATS user: it may read its owner's namespace, where r.aborted_subject is
            self._bus = await Bus.connect(NatsSettings(url=self.nats_url), name=f"coord-member-{self.spec.node}",
                                          wait_s=5.0, token=self.token or os.environ.get("FF_TOKEN"))
            await self._bus.subscribe(r.aborted_subject, on_event, types=CommAborted)
        except Exception as e:  # noqa: BLE001 - heartbeat replies still carry aborts
            log.warning("coord.watch_failed", nats=self.nats_url, error=str(e))

    async def _heartbeat_loop(self, r: JoinResult) -> None:
        assert self._client is not None
        interval = max(0.05, r.heartbeat_interval_s)
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                state, reason = await self._client.heartbeat(r.comm, r.generation, self.spec.node,
                                                             timeout_s=max(1.0, interval))
                self.heartbeats += 1
            except FailedPrecondition as e:  # stale generation or no longer a member: we are out
                self._fire(str(e), "")
                return
            except (Unavailable, DeadlineExceeded, NotFound) as e:
                log.info("coord.heartbeat_failed", comm=r.comm, error=str(e))
                continue
            except Exception as e:  # noqa: BLE001 - keep heartbeating whatever one call did
                log.warning("coord.heartbeat_error", comm=r.comm, error=repr(e))
                continue
            if state in (ABORTED, ENDED):
                self._fire(reason or f"communicator {r.comm} generation {r.generation} {state}", "")
                return

    def _fire(self, reason: str, culprit: str) -> None:
        with self._once:
            if self.aborted is not None or self._closed:
                return
            self.aborted = (reason, culprit)
        log.warning("coord.comm_aborted", comm=self.result.comm if self.result else "", reason=reason,
                    culprit=culprit)
        cb = self.on_abort
        if cb is not None:
            threading.Thread(target=cb, args=(reason, culprit), name="ff-coord-abort", daemon=True).start()

    async def _close(self, leave: bool) -> None:
        for t in self._tasks:
            t.cancel()
        r = self.result
        if leave and r is not None and self._client is not None and self.aborted is None:
            try:
                await self._client.leave(r.comm, r.generation, self.spec.node, timeout_s=2.0)
            except Exception as e:  # noqa: BLE001 - coord may be down; liveness ends it anyway
                log.info("coord.leave_failed", comm=r.comm, error=str(e))
        if self._bus is not None:
            try:
                await self._bus.close()
            except Exception:  # noqa: BLE001
                pass
        if self._client is not None:
            await self._client.close()
