"""Talking to mgmtd: :class:`MgmtdClient`, :class:`RoutingCache`, :class:`HeartbeatSender`.

    client = MgmtdClient(["127.0.0.1:7001", "127.0.0.1:7002"], token=settings.token)
    routing = await client.get_routing()                       # any live replica
    cache = RoutingCache(client, bus=bus, cluster_id="local")   # NATS events + 10 s pull
    await cache.start(); cache.routing.chains ...
    sender = HeartbeatSender(client, make_heartbeat, interval_s=10.0); sender.start()

**Reads** go to any replica (every replica reads the shared KV), trying the next
address when one does not answer.  **Writes** (heartbeats, admin calls) go to the
primary: a replica that is not the primary answers ``NotPrimary`` naming the primary
and its address, and the client retries there; while no replica holds a live lease
(a takeover in progress, at most one lease period) it keeps retrying with a short
backoff until ``redirect_timeout_s``.

**Routing refresh.** mgmtd publishes :class:`RoutingUpdated` on
``ff.mgmtd.v1.routing.<cluster>.updated`` after every committed version bump, as a
plain (at-most-once) NATS message; the cache pulls on each event whose version is
newer than its own *and* every ``pull_interval_s`` (3FS: 10 s), so a missed event
(NATS reconnect, a mgmtd killed between commit and publish) delays a refresh by at
most one pull interval and never loses it.  Plain rather than JetStream: routing is
state, not a log; only the newest version matters and the pull always fetches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
import msgspec

from fireflyer.api.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.api.mgmtd.v1 import mgmtd_pb2_grpc as pb_grpc
from fireflyer.bus import subjects
from fireflyer.bus.events import Event
from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import DeadlineExceeded, FireFlyerError, InvalidArgument, Unavailable
from fireflyer.core.log import get_logger
from fireflyer.core.patience import Patience
from fireflyer.rpc import connect

from . import convert
from .edits import ChainSpec
from .lease import NotPrimary
from .model import Chain, ChainTable, NodeInfo, RoutingInfo, TargetInfo
from .registry import Heartbeat

__all__ = [
    "RoutingUpdated",
    "routing_subject",
    "registry_subject",
    "PrimaryInfo",
    "HeartbeatAck",
    "MgmtdClient",
    "RoutingCache",
    "HeartbeatSender",
]

log = get_logger(__name__)
T = TypeVar("T")


class RoutingUpdated(Event, tag="mgmtd.routing_updated.v1"):
    """mgmtd committed routing info ``version`` (published after the commit)."""

    cluster: str
    version: int
    primary: str = ""


def routing_subject(cluster: str) -> str:
    """``ff.mgmtd.v1.routing.<cluster>.updated``."""
    return subjects.subject("mgmtd", "routing", cluster, "updated")


def registry_subject(entity: str, ident: str | int, event: str) -> str:
    """Registry events: ``ff.mgmtd.v1.node.<id>.{registered,failed,recovered}``, ``...target.<id>.state``."""
    return subjects.subject("mgmtd", entity, ident, event)


class PrimaryInfo(msgspec.Struct, frozen=True, kw_only=True):
    primary: str
    primary_address: str
    term: int
    expires_at: float
    node: str
    node_address: str
    is_primary: bool


class HeartbeatAck(msgspec.Struct, frozen=True, kw_only=True):
    routing_version: int
    primary: str
    fail_interval_s: float


def _addresses(addresses: str | Sequence[str]) -> list[str]:
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    out = [a.strip() for a in items if a.strip()]
    if not out:
        raise InvalidArgument("MgmtdClient needs at least one mgmtd address (host:port)", field="addresses")
    return out


class MgmtdClient:
    """gRPC client of every mgmtd replica; follows NotPrimary redirects; typed results."""

    def __init__(self, addresses: str | Sequence[str], *, token: str | None = None,
                 rpc: RpcSettings | None = None, call_timeout_s: float = 5.0,
                 redirect_timeout_s: float = 15.0) -> None:
        self.addresses = _addresses(addresses)
        self.token = token
        self.rpc = rpc
        self.call_timeout_s = call_timeout_s
        self.redirect_timeout_s = redirect_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._read_from = self.addresses[0]
        self._primary: str | None = None

    def _stub(self, address: str) -> pb_grpc.MgmtdServiceStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = connect(address, token=self.token, settings=self.rpc)
        return pb_grpc.MgmtdServiceStub(ch)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            await ch.close()

    async def __aenter__(self) -> MgmtdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def primary_address(self) -> str | None:
        """The last primary this client was redirected to or succeeded writing at."""
        return self._primary

    async def _read(self, call: Callable[[pb_grpc.MgmtdServiceStub], Awaitable[T]]) -> T:
        """Try the last good replica, then the others; Unavailable if none answers."""
        order = [self._read_from] + [a for a in self.addresses if a != self._read_from]
        last: FireFlyerError | None = None
        for address in order:
            try:
                result = await call(self._stub(address))
            except (Unavailable, DeadlineExceeded) as e:
                last = e
                continue
            self._read_from = address
            return result
        raise Unavailable(f"no mgmtd replica answered ({', '.join(order)}): {last}",
                          addresses=",".join(order))

    async def _write(self, call: Callable[[pb_grpc.MgmtdServiceStub], Awaitable[T]]) -> T:
        """Call the primary, following NotPrimary redirects until ``redirect_timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.redirect_timeout_s
        target = self._primary or self._read_from
        delay = 0.05
        last: FireFlyerError | None = None
        tried: list[str] = []
        while True:
            try:
                result = await call(self._stub(target))
                self._primary = target
                return result
            except NotPrimary as e:
                last = e
                hint = str(e.fields.get("primary_address") or "")
                self._primary = None
                if hint and hint != target:
                    log.debug("mgmtd.client.redirect", frm=target, to=hint)
                    target = hint
                    continue  # a named primary: go there at once
            except (Unavailable, DeadlineExceeded) as e:
                last = e
                self._primary = None
            tried.append(target)
            if loop.time() + delay > deadline:
                raise Unavailable(f"no mgmtd primary accepted the write within {self.redirect_timeout_s}s "
                                  f"(tried {', '.join(dict.fromkeys(tried))}): {last}",
                                  addresses=",".join(self.addresses)) from last
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, 1.0)
            # no hint: walk the configured replicas; one of them is (or becomes) the primary
            target = self.addresses[(self.addresses.index(target) + 1) % len(self.addresses)] \
                if target in self.addresses else self.addresses[0]

    # -- reads --------------------------------------------------------------------------
    async def get_routing(self, known_version: int = 0) -> RoutingInfo | None:
        """The routing info; None when ``known_version`` is already the current version."""
        req = pb.GetRoutingInfoRequest(known_version=known_version)
        reply = await self._read(lambda s: s.GetRoutingInfo(req, timeout=self.call_timeout_s))
        return convert.routing_from_pb(reply.routing) if reply.changed else None

    async def get_primary(self, address: str | None = None) -> PrimaryInfo:
        """Who holds the lease, as ``address`` (default: any replica) sees it."""
        req = pb.GetPrimaryRequest()
        if address is not None:
            r = await self._stub(address).GetPrimary(req, timeout=self.call_timeout_s)
        else:
            r = await self._read(lambda s: s.GetPrimary(req, timeout=self.call_timeout_s))
        return PrimaryInfo(primary=r.primary, primary_address=r.primary_address, term=r.term,
                           expires_at=r.expires_at, node=r.node, node_address=r.node_address,
                           is_primary=r.is_primary)

    async def list_nodes(self) -> list[NodeInfo]:
        r = await self._read(lambda s: s.ListNodes(pb.ListNodesRequest(), timeout=self.call_timeout_s))
        return [convert.node_from_pb(n) for n in r.nodes]

    async def list_targets(self) -> list[TargetInfo]:
        r = await self._read(lambda s: s.ListTargets(pb.ListTargetsRequest(), timeout=self.call_timeout_s))
        return [convert.target_from_pb(t) for t in r.targets]

    async def list_chains(self) -> list[Chain]:
        r = await self._read(lambda s: s.ListChains(pb.ListChainsRequest(), timeout=self.call_timeout_s))
        return [convert.chain_from_pb(c) for c in r.chains]

    async def list_chain_tables(self) -> list[ChainTable]:
        r = await self._read(lambda s: s.ListChainTables(pb.ListChainTablesRequest(),
                                                         timeout=self.call_timeout_s))
        return [convert.table_from_pb(t) for t in r.chain_tables]

    # -- writes -------------------------------------------------------------------------
    async def heartbeat(self, hb: Heartbeat) -> HeartbeatAck:
        req = convert.heartbeat_to_pb(hb)
        r = await self._write(lambda s: s.Heartbeat(req, timeout=self.call_timeout_s))
        return HeartbeatAck(routing_version=r.routing_version, primary=r.primary,
                            fail_interval_s=r.fail_interval_s)

    async def create_chains(self, specs: Sequence[ChainSpec]) -> tuple[int, list[Chain]]:
        """Create chains (admin); returns (routing version, the chains as stored)."""
        req = pb.CreateChainsRequest(chains=[
            pb.ChainSpec(chain_id=c.chain_id, targets=[pb.TargetSpec(target_id=t.target_id, node_id=t.node_id,
                                                                      disk=t.disk, path=t.path)
                                                       for t in c.targets]) for c in specs])
        r = await self._write(lambda s: s.CreateChains(req, timeout=self.call_timeout_s))
        return r.routing_version, [convert.chain_from_pb(c) for c in r.chains]

    async def create_chain_table(self, table_id: int, chain_ids: Sequence[int], desc: str = ""
                                 ) -> tuple[int, ChainTable]:
        req = pb.CreateChainTableRequest(table_id=table_id, chain_ids=list(chain_ids), desc=desc)
        r = await self._write(lambda s: s.CreateChainTable(req, timeout=self.call_timeout_s))
        return r.routing_version, convert.table_from_pb(r.table)

    async def offline_target(self, target_id: int) -> tuple[int, Chain]:
        req = pb.OfflineTargetRequest(target_id=target_id)
        r = await self._write(lambda s: s.OfflineTarget(req, timeout=self.call_timeout_s))
        return r.routing_version, convert.chain_from_pb(r.chain)


class RoutingCache:
    """The newest routing info, refreshed on :class:`RoutingUpdated` events and by a periodic pull.

    ``bus`` may be None (pull only).  ``on_update`` callbacks run after each refresh
    that brought a newer version.
    """

    def __init__(self, client: MgmtdClient, *, bus: Any = None, cluster_id: str = "local",
                 pull_interval_s: float = 10.0) -> None:
        self.client = client
        self.bus = bus
        self.cluster_id = cluster_id
        self.pull_interval_s = pull_interval_s
        self.routing: RoutingInfo | None = None
        self.on_update: list[Callable[[RoutingInfo], Any]] = []
        self.pulls = 0
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._changed = asyncio.Condition()

    @property
    def version(self) -> int:
        return 0 if self.routing is None else self.routing.version

    async def start(self) -> None:
        """Subscribe (if a bus is given), pull once (best effort), then keep refreshing."""
        if self.bus is not None:
            self._sub = await self.bus.subscribe(routing_subject(self.cluster_id), self._on_event,
                                                 types=RoutingUpdated)
        with contextlib.suppress(Unavailable, DeadlineExceeded):
            await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="mgmtd-routing-cache")

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _on_event(self, event: RoutingUpdated, msg: Any) -> None:
        if event.version > self.version:
            self._kick.set()

    async def refresh(self) -> RoutingInfo | None:
        """Pull now; returns the routing info if it was newer than what the cache held."""
        self.pulls += 1
        new = await self.client.get_routing(self.version)
        if new is None or new.version <= self.version:
            return None
        self.routing = new
        async with self._changed:
            self._changed.notify_all()
        for cb in list(self.on_update):
            try:
                res = cb(new)
                if asyncio.iscoroutine(res):
                    await res
            except Exception as e:  # a subscriber's bug must not stop refreshes
                log.warning("mgmtd.routing_cache.callback_failed", error=repr(e))
        return new

    async def wait_version(self, version: int, timeout_s: float) -> RoutingInfo:
        """Wait until the cache holds at least ``version``."""
        async def reached() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: self.version >= version)

        try:
            await asyncio.wait_for(reached(), timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(f"routing version {version} not seen within {timeout_s}s "
                                   f"(have {self.version})", version=version) from None
        assert self.routing is not None
        return self.routing

    async def _loop(self) -> None:
        # mgmtd may come up after us, or fail over: a pull failing for a while is normal life
        patience = Patience(log, "mgmtd.routing_cache.pull_failed")
        while True:
            # (asyncio.timeout, not wait_for: on 3.11 a cancel that lands as the kick wakes the
            # wait could leave wait_for, and with it stop(), waiting forever -- a storage node
            # stopping while a routing update arrived hung until ff down's SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.pull_interval_s):
                    await self._kick.wait()
            self._kick.clear()
            try:
                await self.refresh()
            except FireFlyerError as e:
                patience.failed(e)
            else:
                patience.ok()


class HeartbeatSender:
    """Sends ``make_heartbeat()`` to the mgmtd primary every ``interval_s`` (meta, storage, node agents).

    ``make_heartbeat`` is called each time, so a storage node reports its targets' current
    local states.  A failed send is logged and retried at the next tick; ``failures``
    counts consecutive ones (3FS: a service that cannot reach mgmtd for half the fail
    interval should stop serving; the caller decides, reading ``failures``).  Failures are
    INFO while the cluster forms or fails over, WARNING once they last (:class:`Patience`).
    """

    def __init__(self, client: MgmtdClient, make_heartbeat: Callable[[], Heartbeat], *,
                 interval_s: float = 10.0) -> None:
        self.client = client
        self.make_heartbeat = make_heartbeat
        self.interval_s = interval_s
        self.sent = 0
        self.failures = 0
        self.last_ack: HeartbeatAck | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> HeartbeatSender:
        self._task = asyncio.create_task(self._loop(), name="mgmtd-heartbeat")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def send_once(self) -> HeartbeatAck:
        ack = await self.client.heartbeat(self.make_heartbeat())
        self.sent += 1
        self.failures = 0
        self.last_ack = ack
        return ack

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        patience = Patience(log, "mgmtd.heartbeat_failed")
        while True:
            started = loop.time()
            try:
                await self.send_once()
            except FireFlyerError as e:
                self.failures += 1
                patience.failed(e)
            else:
                patience.ok()
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))
