"""The file-system metadata client: one method per meta operation.

    async with await MetaClient.connect(["10.0.0.5:7001", "10.0.0.6:7001"], token) as meta:
        await meta.mkdir("/data/run1", parents=True)
        res = await meta.create("/data/run1/ckpt-0")       # OpenResult(inode, created)
        async for entry in meta.iterdir("/data/run1"):      # all pages
            print(entry.name, entry.type)

Results are the library's msgspec models (``fireflyer.meta.Inode``, ``DirEntry``,
``ReaddirPage``, ``OpenResult``); failures are the typed errors the service
raised (``FsError`` with ``errno`` and ``path``, ``InvalidArgument``, ...).

**Replicas and failover.**  Meta servers are stateless over one KV, so any
replica can take any call.  The client keeps one channel per replica (never one
per call) and spreads calls round robin.  A replica that answers UNAVAILABLE
(down, restarting, draining) is benched for ``bench_s`` and the call goes to
the next; when all are benched the client waits with backoff and, if it was
built from mgmtd, re-reads the replica list from routing info.  After
``failover_timeout_s`` the last UNAVAILABLE is raised.  Only UNAVAILABLE is
retried.  Every mutation carries a random ``request_id`` that stays the same
across its retries; the store keeps the outcome under that id in the KV (3FS's
``IDEM`` records), so when a connection dies after the server committed, the
retry on another replica returns the first outcome instead of EEXIST/ENOENT.

**Transport.**  Each replica also serves every call over ``fireflyer.wire``
(services/meta/wire.py: the same protobuf messages as payloads of framed requests
on the server's event loop, at a fraction of gRPC's Python cost per call).  The
client asks each replica once (``Endpoints`` over gRPC) where that listener is,
opens one connection to it and sends the replica's calls there; a replica that
runs none, or whose listener cannot be reached, keeps being called over gRPC
(asked again after ``WIRE_RECHECK_S``).  ``transport="grpc"`` (or
``FF_META_TRANSPORT=grpc``) never uses it.  Failover, request ids and errors are
the same on both.

**Routing.**  With ``mgmtd=`` (a :class:`fireflyer.mgmt.client.RoutingCache`,
kept fresh by mgmtd's routing-version events, or a bare ``MgmtdClient``) the
replica list is the live ``meta`` nodes of routing info (each meta replica
heartbeats its address to mgmtd), re-read when every known replica fails;
otherwise it is the addresses given or ``FF_META_ADDR`` (comma separated).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.api.meta.v1 import meta_pb2_grpc
from fireflyer.core.config import RpcSettings
from fireflyer.core.errors import FireFlyerError, InvalidArgument, Unauthenticated, Unavailable, Unimplemented
from fireflyer.core.log import get_logger
from fireflyer.core.netaddr import split_address
from fireflyer.meta import DirEntry, Inode, LayoutPolicy, OpenResult, ReaddirPage, StatFs
from fireflyer.rpc import connect as rpc_connect
from fireflyer.wire.aio import AioConnection

from . import meta_codec as codec
from .home import Identity, resolve_path

__all__ = ["MetaClient", "parse_addresses", "TRANSPORTS", "WIRE_RECHECK_S"]

log = get_logger(__name__)

#: "auto": a replica's wire endpoint when it has one, else gRPC; "grpc": gRPC only
TRANSPORTS = ("auto", "grpc")
#: how long a replica without a usable wire endpoint is called over gRPC before asking again
WIRE_RECHECK_S = 30.0
#: reply message type per method, for decoding wire payloads
_REPLY_TYPES: dict[str, Any] = {m.name: getattr(pb, m.output_type.name)
                                for m in pb.DESCRIPTOR.services_by_name["MetaService"].methods}

#: what a list of meta servers looks like in FF_META_ADDR and --address
AddressSource = Callable[[], Awaitable[list[str]]]


def _rid() -> bytes:
    """A fresh idempotency id for one logical mutation (kept across its failover retries)."""
    return os.urandom(16)


def parse_addresses(value: str | Sequence[str] | None) -> list[str]:
    """``"a:1,b:2"`` or ``["a:1", "b:2"]`` -> a de-duplicated list in the given order."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in (s.strip() for s in items):
        if item and item not in out:
            out.append(item)
    return out


class _Replica:
    __slots__ = ("address", "channel", "stub", "benched_until", "calls", "wire", "wire_retry_at", "wire_lock")

    def __init__(self, address: str, token: str | None, settings: RpcSettings) -> None:
        self.address = address
        self.channel = rpc_connect(address, token=token, settings=settings)
        self.stub = meta_pb2_grpc.MetaServiceStub(self.channel)
        self.benched_until = 0.0
        self.calls = 0
        #: the open wire connection (None: not asked yet, none offered, or it broke)
        self.wire: AioConnection | None = None
        #: no wire discovery before this (monotonic): the replica offered none or it failed
        self.wire_retry_at = 0.0
        self.wire_lock = asyncio.Lock()

    async def close(self) -> None:
        if self.wire is not None:
            self.wire.close()
        await self.channel.close()


class MetaClient:
    """Calls to a set of meta replicas with round-robin and failover (see the module doc)."""

    def __init__(self, addresses: Sequence[str], token: str | None, *, settings: RpcSettings | None = None,
                 failover_timeout_s: float = 10.0, bench_s: float = 1.0,
                 refresh: AddressSource | None = None, transport: str | None = None) -> None:
        transport = transport or os.environ.get("FF_META_TRANSPORT") or "auto"
        if transport not in TRANSPORTS:
            raise InvalidArgument(f"meta transport {transport!r} is not one of {', '.join(TRANSPORTS)}",
                                  transport=transport)
        self.transport = transport
        if not addresses:
            raise InvalidArgument("no meta server addresses: pass addresses, set FF_META_ADDR or give mgmtd=")
        self.token = token
        self.settings = settings or RpcSettings()
        self.failover_timeout_s = failover_timeout_s
        self.bench_s = bench_s
        self._refresh = refresh
        self._replicas: list[_Replica] = []
        self._rr = itertools.count(random.randrange(1 << 16))
        self._set_addresses(addresses)
        #: calls that were retried on another replica (for tests and the benchmark)
        self.failovers = 0
        #: the WhoAmI answer, asked on first need (a relative path, ``home()``)
        self._identity: Identity | None = None

    @classmethod
    async def connect(cls, addresses: str | Sequence[str] | None = None, token: str | None = None, *,
                      mgmtd: Any = None, settings: RpcSettings | None = None,
                      failover_timeout_s: float = 10.0, transport: str | None = None) -> MetaClient:
        """A client for ``addresses`` (or mgmtd's meta nodes, or FF_META_ADDR, or the local
        cluster's meta replicas: ``fireflyer.cluster.discovery.find_cluster``).

        ``token=None`` uses ``FF_TOKEN`` (or, when the addresses came from the local cluster,
        its user token).  Channels connect lazily, so this does
        not fail when a replica is down; the first call does, after failover.
        """
        if token is None:
            token = os.environ.get("FF_TOKEN") or None
        refresh: AddressSource | None = None
        found = parse_addresses(addresses)
        if mgmtd is not None:
            async def refresh() -> list[str]:
                return await _meta_addresses_from(mgmtd)

            if not found:
                found = await refresh()
        if not found:
            # FF_META_ADDR, else the local cluster (FF_STATE_DIR / .ff): one precedence for every client
            from fireflyer.cluster.discovery import find_cluster

            c = find_cluster(need=("meta",), token=token)
            found, token = list(c.meta), c.token
        return cls(found, token, settings=settings, failover_timeout_s=failover_timeout_s, refresh=refresh,
                   transport=transport)

    def _set_addresses(self, addresses: Sequence[str]) -> list[_Replica]:
        """Keep channels of replicas still listed, open new ones; returns the dropped ones."""
        keep = {r.address: r for r in self._replicas}
        new = [keep.pop(a, None) or _Replica(a, self.token, self.settings) for a in addresses]
        self._replicas = new
        return list(keep.values())

    @property
    def addresses(self) -> list[str]:
        return [r.address for r in self._replicas]

    def calls_by_replica(self) -> dict[str, int]:
        """Calls sent to each replica so far, retries included (load spreading, tests)."""
        return {r.address: r.calls for r in self._replicas}

    def transports(self) -> dict[str, str]:
        """How each replica is being called now: "wire host:port" or "grpc"."""
        return {r.address: f"wire {r.wire.peer}" if r.wire is not None and not r.wire.closed else "grpc"
                for r in self._replicas}

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self._replicas), return_exceptions=True)
        self._replicas = []

    async def __aenter__(self) -> MetaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- failover -----------------------------------------------------------------------
    def _pick(self, now: float) -> _Replica:
        n = len(self._replicas)
        start = next(self._rr)
        for i in range(n):
            r = self._replicas[(start + i) % n]
            if r.benched_until <= now:
                return r
        return min(self._replicas, key=lambda r: r.benched_until)

    async def _call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        deadline = time.monotonic() + self.failover_timeout_s
        attempt = 0
        while True:
            if not self._replicas:
                raise Unavailable("the meta client is closed or has no replicas")
            now = time.monotonic()
            replica = self._pick(now)
            replica.calls += 1
            try:
                wire = await self._wire(replica) if self.transport == "auto" else None
                if wire is None:
                    return await getattr(replica.stub, method)(request, timeout=timeout_s)
                data = await wire.request(method, request.SerializeToString(),
                                          timeout_s=timeout_s or self.settings.default_deadline_s)
                return _REPLY_TYPES[method].FromString(data)
            except Unavailable as err:
                replica.benched_until = time.monotonic() + self.bench_s
                attempt += 1
                if time.monotonic() >= deadline:
                    err.fields.setdefault("replicas", ",".join(self.addresses))
                    raise
                self.failovers += 1
                if all(r.benched_until > time.monotonic() for r in self._replicas):
                    await self._reroute()
                    await asyncio.sleep(min(0.05 * 2 ** min(attempt, 5), 1.0) * (0.5 + random.random() / 2))

    async def _reroute(self) -> None:
        if self._refresh is None:
            return
        try:
            addresses = await self._refresh()
        except Exception:  # noqa: BLE001 - mgmtd down too: keep the list we have
            return
        if addresses and addresses != self.addresses:
            dropped = self._set_addresses(addresses)
            await asyncio.gather(*(r.close() for r in dropped), return_exceptions=True)

    async def _wire(self, replica: _Replica) -> AioConnection | None:
        """The replica's wire connection: opened on first use after asking where it listens.

        None means "call it over gRPC": it runs no wire endpoint (or predates them), or the
        endpoint could not be reached although gRPC could (a firewall, a wildcard bind) — then
        it is asked again after ``WIRE_RECHECK_S``.  Unavailable from the ``Endpoints`` call
        itself is the replica being down and goes to failover like any call's.
        """
        conn = replica.wire
        if conn is not None and not conn.closed:
            return conn
        if replica.wire_retry_at > time.monotonic():
            return None
        async with replica.wire_lock:  # one discovery per replica, however many callers wait
            conn = replica.wire
            if conn is not None and not conn.closed:
                return conn
            replica.wire = None
            if replica.wire_retry_at > time.monotonic():
                return None
            try:
                reply = await replica.stub.Endpoints(pb.EndpointsRequest(), timeout=self.settings.default_deadline_s)
            except Unimplemented:
                replica.wire_retry_at = time.monotonic() + WIRE_RECHECK_S
                return None
            if not reply.wire_address:
                replica.wire_retry_at = time.monotonic() + WIRE_RECHECK_S
                return None
            host, port = split_address(reply.wire_address)
            try:
                replica.wire = await AioConnection.connect(host, port, token=self.token or "",
                                                           client_name="meta-client")
            except Unauthenticated:
                raise  # the same token would fail over gRPC too: say so
            except FireFlyerError as e:
                log.warning("meta.wire_unreachable", replica=replica.address, wire=reply.wire_address,
                            error=str(e), retry_s=WIRE_RECHECK_S)
                replica.wire_retry_at = time.monotonic() + WIRE_RECHECK_S
                return None
            return replica.wire

    # -- identity and relative paths ----------------------------------------------------
    async def whoami(self) -> Identity:
        """Who this client's token is, and its home (meta creates the home when missing)."""
        r = await self._call("WhoAmI", pb.WhoAmIRequest())
        ident = Identity(user=r.user, roles=tuple(r.roles), home=r.home, uid=r.uid, gid=r.gid,
                         home_created=r.home_created)
        self._identity = ident
        return ident

    async def home(self) -> str:
        """The caller's home (``/home/<user>``; "" for a service), asked once and remembered."""
        if self._identity is None:
            await self.whoami()
        assert self._identity is not None
        return self._identity.home

    async def abspath(self, path: str) -> str:
        """``path`` if absolute, else resolved against the caller's home (:mod:`.home`)."""
        if isinstance(path, str) and path.startswith("/"):
            return path
        return resolve_path(path, await self.home())

    # -- operations ---------------------------------------------------------------------
    async def mkdir(self, path: str, mode: int = 0o755, *, parents: bool = False,
                    policy: LayoutPolicy | None = None) -> Inode:
        req = pb.MkdirRequest(path=await self.abspath(path), mode=mode, parents=parents, request_id=_rid())
        if policy is not None:
            req.policy.CopyFrom(codec.policy_to_pb(policy))
        return codec.inode_from_pb((await self._call("Mkdir", req)).inode)

    async def create(self, path: str, mode: int = 0o644, *, flags: int = os.O_CREAT,
                     policy: LayoutPolicy | None = None) -> OpenResult:
        req = pb.CreateRequest(path=await self.abspath(path), mode=mode, flags=flags, request_id=_rid())
        if policy is not None:
            req.policy.CopyFrom(codec.policy_to_pb(policy))
        reply = await self._call("Create", req)
        return OpenResult(inode=codec.inode_from_pb(reply.inode), created=reply.created, capability=reply.capability)

    async def open(self, path: str, flags: int = os.O_RDONLY) -> OpenResult:
        reply = await self._call("Open", pb.OpenRequest(path=await self.abspath(path), flags=flags))
        return OpenResult(inode=codec.inode_from_pb(reply.inode), created=reply.created, capability=reply.capability)

    async def stat(self, path: str) -> Inode:
        return codec.inode_from_pb((await self._call("Stat", pb.StatRequest(path=await self.abspath(path), follow=True))).inode)

    async def lstat(self, path: str) -> Inode:
        return codec.inode_from_pb((await self._call("Stat", pb.StatRequest(path=await self.abspath(path), follow=False))).inode)

    async def stat_inode(self, inode_id: int, capability: bytes = b"") -> Inode:
        """An inode by id; another user's file needs the ``capability`` its open returned."""
        req = pb.StatInodeRequest(inode_id=inode_id, capability=capability)
        return codec.inode_from_pb((await self._call("StatInode", req)).inode)

    async def grant_capability(self, inode_id: int, mode: int, capability: bytes) -> bytes:
        """Renew ``capability`` (encoded) for ``mode`` (READ=1 | WRITE=2) on ``inode_id``."""
        req = pb.GrantCapabilityRequest(inode_id=inode_id, mode=mode, capability=capability)
        return bytes((await self._call("GrantCapability", req)).capability)

    async def readdir(self, path: str, *, after: str = "", limit: int = 0) -> ReaddirPage:
        """One page (``limit`` 0: the server's default of 128)."""
        return codec.page_from_pb(await self._call("Readdir", pb.ReaddirRequest(path=await self.abspath(path), after=after,
                                                                                limit=limit)))

    async def iterdir(self, path: str, *, page_size: int = 0) -> AsyncIterator[DirEntry]:
        """Every entry of a directory, page after page (not one snapshot: see readdir)."""
        after = ""
        while True:
            page = await self.readdir(path, after=after, limit=page_size)
            for entry in page.entries:
                yield entry
            if not page.more:
                return
            after = page.next_after

    async def listdir(self, path: str) -> list[DirEntry]:
        return [e async for e in self.iterdir(path)]

    async def rename(self, src: str, dst: str) -> None:
        await self._call("Rename", pb.RenameRequest(src=await self.abspath(src), dst=await self.abspath(dst), request_id=_rid()))

    async def unlink(self, path: str) -> None:
        await self._call("Unlink", pb.UnlinkRequest(path=await self.abspath(path), request_id=_rid()))

    async def rmdir(self, path: str) -> None:
        await self._call("Rmdir", pb.RmdirRequest(path=await self.abspath(path), request_id=_rid()))

    async def symlink(self, target: str, link_path: str) -> Inode:
        reply = await self._call("Symlink", pb.SymlinkRequest(target=target, link_path=await self.abspath(link_path), request_id=_rid()))
        return codec.inode_from_pb(reply.inode)

    async def readlink(self, path: str) -> str:
        return str((await self._call("Readlink", pb.ReadlinkRequest(path=await self.abspath(path)))).target)

    async def link(self, existing: str, new_path: str) -> Inode:
        req = pb.LinkRequest(existing=await self.abspath(existing), new_path=await self.abspath(new_path), request_id=_rid())
        return codec.inode_from_pb((await self._call("Link", req)).inode)

    async def truncate(self, path: str, length: int) -> Inode:
        req = pb.TruncateRequest(path=await self.abspath(path), length=length, request_id=_rid())
        return codec.inode_from_pb((await self._call("Truncate", req)).inode)

    async def setattr(self, path: str, *, mode: int | None = None, uid: int | None = None,
                      gid: int | None = None, atime: float | None = None, mtime: float | None = None,
                      owner: str | None = None) -> Inode:
        """chmod/chown/utimes; ``owner`` is chown by user name (meta maps it to uid and gid; admin only)."""
        fields = {"mode": mode, "uid": uid, "gid": gid, "atime": atime, "mtime": mtime, "owner": owner}
        req = pb.SetattrRequest(path=await self.abspath(path), request_id=_rid(),
                                **{k: v for k, v in fields.items() if v is not None})
        return codec.inode_from_pb((await self._call("Setattr", req)).inode)

    async def statfs(self) -> StatFs:
        return codec.statfs_from_pb(await self._call("Statfs", pb.StatfsRequest()))

    async def report_length(self, inode_id: int, length: int) -> Inode:
        req = pb.ReportLengthRequest(inode_id=inode_id, length=length)
        return codec.inode_from_pb((await self._call("ReportLength", req)).inode)

    async def set_dir_policy(self, path: str, policy: LayoutPolicy | None) -> Inode:
        """Set (None: clear) the layout policy that files created below ``path`` get."""
        req = pb.SetDirPolicyRequest(path=await self.abspath(path), request_id=_rid())
        if policy is not None:
            req.policy.CopyFrom(codec.policy_to_pb(policy))
        return codec.inode_from_pb((await self._call("SetDirPolicy", req)).inode)


async def _meta_addresses_from(mgmtd: Any) -> list[str]:
    """Addresses of live meta nodes in mgmtd's routing info (registered by a service).

    ``mgmtd`` is a :class:`~fireflyer.mgmt.client.RoutingCache` (its cached copy,
    which NATS events and pulls keep fresh; refreshed here only when empty or on
    failover) or a bare :class:`~fireflyer.mgmt.client.MgmtdClient` (one pull).
    """
    from fireflyer.mgmt.model import NodeStatus, NodeType

    if hasattr(mgmtd, "refresh") and hasattr(mgmtd, "routing"):  # a RoutingCache
        await mgmtd.refresh()
        routing = mgmtd.routing
    else:
        routing = await mgmtd.get_routing(0)
    if routing is None:
        return []
    # only a meta node a service credential registered (it has an owner) gets the caller's token;
    # see fireflyer.storage.protocol.trusted_peer for why mgmtd's routing is trusted
    return sorted(n.address for n in routing.nodes
                  if n.type is NodeType.META and n.status is NodeStatus.ALIVE and n.address and n.owner)
