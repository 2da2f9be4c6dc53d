"""The meta service process: settings, KV, chain tables and the gRPC servicer.

Settings (``FF_META_*``, file section ``[meta]``; see :class:`MetaSection`)::

    FF_META_KV_URL        KV URL; default sqlite:///<state_dir>/meta.db
    FF_META_USERS         {"alice": {"uid": 1000, "gid": 1000}} (see users.py)
    FF_META_THREADS       threads running mutations (0 = auto by backend)
    FF_META_INLINE_READS  read-only calls on the event loop (default: on SQLite only)
    FF_META_INLINE_WRITES mutations on the event loop unless they would wait (default: on SQLite only)
    FF_META_WIRE          also serve every call over fireflyer.wire (default on; see wire.py)
    FF_META_WIRE_HOST     its host ("" = the gRPC host); bound and advertised, so across machines a routable one
    FF_META_WIRE_PORT     its port (0 = a free one; clients learn it from the Endpoints call)
    FF_MGMTD_ADDR         mgmtd host:port; chain tables then come from its routing info
    FF_META_STATIC_CHAINS chains of the static table used without mgmtd
    FF_CAPABILITY_KEY_FILE key shared with storage signing chunk capabilities (default <state_dir>/capability.key)
    FF_META_CAPABILITY_LIFETIME_S how long a granted capability lasts (default 600)

**KV choice.**  In 3FS mgmtd and meta share one FoundationDB cluster.  Here each
service takes a KV URL: with SQLite (``ff up``'s default) meta keeps its own file
``<state>/meta.db``: two services writing one SQLite file would queue behind a
single write lock for no benefit, and separate files can be inspected, backed up
or wiped one at a time.  With PostgreSQL both may use one database with separate
schemas (``postgresql://host/ff?schema=meta`` and ``...?schema=mgmtd``).  All
meta replicas of a cluster must use the same URL: that shared KV is what makes
them stateless and interchangeable.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.api.meta.v1 import meta_pb2_grpc
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import SettingsError
from fireflyer.core.log import get_logger
from fireflyer.core.runtime import Service, ServiceContext
from fireflyer.kv import KV, open_kv
from fireflyer.meta import ChainTableSource, LayoutPolicy, MetaStore, StaticChainTables
from fireflyer.storage.capability import Grantor, load_keyring

from .gc import GcSettings, GcWorker, StorageCleaner, TruncatingServicer
from .routing import RoutingFollower
from .servicer import SERVICE_NAME, MetaServicer
from .users import UserIds
from .wire import MetaWireEndpoint

__all__ = ["MetaSection", "MetaSettings", "MetaService", "kv_url_for"]

log = get_logger(__name__)


class MetaSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: KV URL shared by all meta replicas; "" = sqlite:///<state_dir>/meta.db
    kv_url: str = ""
    #: user name -> ids; users not listed get a uid derived from the name (users.py)
    users: dict[str, UserIds] = msgspec.field(default_factory=dict)
    #: threads running mutations (and statfs); 0 = auto: 4 on SQLite, which has one writer at a
    #: time anyway (more threads only fight over the GIL), 16 on PostgreSQL (commits overlap)
    threads: int = 0
    #: run read-only calls (stat, readdir, readlink, open) on the event loop instead of the pool;
    #: None = auto: yes on SQLite (a local snapshot read is cheaper than the thread hop), no on
    #: PostgreSQL (a read waits on the network, which must not stall the loop)
    inline_reads: bool | None = None
    #: run mutations on the event loop, inside ``kv.nonblocking()``: one that would wait for the
    #: KV's write lock (or a retry) goes to the pool instead; None = auto: yes where the KV
    #: supports it (SQLite: the lock is local, so "would wait" is known without waiting)
    inline_writes: bool | None = None
    #: serve every call over fireflyer.wire too (MetaClient prefers it: about half gRPC's CPU per
    #: call); the listener binds ``wire_host`` (below) on ``wire_port`` (0 = a free port)
    wire: bool = True
    #: "" = the gRPC host; the address is bound and advertised as is (a wildcard is advertised as
    #: loopback), so a replica serving other machines names its routable address here
    wire_host: str = ""
    wire_port: int = 0
    #: the chain table used when no mgmtd is configured
    static_table_id: int = 1
    static_chains: list[int] = msgspec.field(default_factory=lambda: list(range(1, 17)))
    #: layout policy of the root directory, applied when the namespace is first created
    root_chunk_size: int = 1 << 20
    root_stripe_size: int = 4
    #: how often chain tables are re-read from mgmtd (3FS: 10 s), besides version events
    routing_refresh_s: float = 10.0
    #: heartbeat interval to mgmtd (registers this replica as a ``meta`` node)
    heartbeat_s: float = 10.0
    #: the cluster id in mgmtd's routing event subjects
    cluster_id: str = "local"
    #: GC of removed files' chunks (needs mgmtd for storage routing; see gc.py): delay, round interval,
    #: and the age after which a truncate record its RPC did not apply is applied by the worker
    gc_delay_s: float = 300.0
    gc_interval_s: float = 5.0
    truncate_grace_s: float = 30.0
    #: how long a chunk capability granted on open is good for (clients renew before it ends)
    capability_lifetime_s: float = 600.0


class MetaSettings(ServiceSettings, frozen=True, kw_only=True):
    meta: MetaSection = msgspec.field(default_factory=MetaSection)
    #: mgmtd's address (FF_MGMTD_ADDR); "" = static chain table from settings
    mgmtd_addr: str = ""
    #: the key shared with the storage nodes that signs chunk capabilities
    #: (FF_CAPABILITY_KEY_FILE); "" = ``<state_dir>/capability.key`` (``ff up`` writes it)
    capability_key_file: str = ""


def kv_url_for(settings: MetaSettings) -> str:
    if settings.meta.kv_url:
        return settings.meta.kv_url
    return f"sqlite:///{(Path(settings.state_dir) / 'meta.db').absolute()}"


class MetaService(Service):
    """Fire-Flyer 3FS metadata service (stateless; many replicas share one KV)."""

    name = "meta"
    settings_type = MetaSettings
    #: NATS carries mgmtd's routing-version events when there is a server; meta works without
    uses_bus = True

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.kv: KV | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.follower: RoutingFollower | None = None
        self.servicer: MetaServicer | None = None
        self.cleaner: StorageCleaner | None = None
        self.wire: MetaWireEndpoint | None = None

    async def start(self, ctx: ServiceContext) -> None:
        s: MetaSettings = self.settings  # type: ignore[assignment]
        if s.meta.threads < 0:
            raise SettingsError(f"meta.threads must be >= 0 (0 = auto), got {s.meta.threads}",
                                key="meta.threads", expected="int >= 0")
        grantor = Grantor(load_keyring(s.capability_key_file, s.state_dir), lifetime_s=s.meta.capability_lifetime_s)
        root = LayoutPolicy(s.meta.static_table_id, s.meta.root_chunk_size, s.meta.root_stripe_size)
        url = kv_url_for(s)
        local = url.startswith("sqlite:")
        threads = s.meta.threads or (4 if local else 16)
        inline_reads = local if s.meta.inline_reads is None else s.meta.inline_reads
        inline_writes = local if s.meta.inline_writes is None else s.meta.inline_writes
        self.kv = open_kv(url)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="meta")
        tables: ChainTableSource
        if s.mgmtd_addr:
            self.follower = RoutingFollower(ctx, s.mgmtd_addr, token=s.token, refresh_s=s.meta.routing_refresh_s,
                                            cluster_id=s.meta.cluster_id, heartbeat_s=s.meta.heartbeat_s)
            await self.follower.start()
            tables = self.follower.tables
        else:
            tables = StaticChainTables({s.meta.static_table_id: (1, tuple(s.meta.static_chains))})
        # idempotent and transactional: replicas starting together create one root
        await asyncio.get_running_loop().run_in_executor(self.pool, MetaStore.init, self.kv)
        store = MetaStore(self.kv, tables=tables, root_policy=root)
        common: dict[str, Any] = dict(users=s.meta.users, pool=self.pool, inline_reads=inline_reads,
                                      inline_writes=inline_writes, grantor=grantor,
                                      on_unknown_table=self.follower.refresh_now if self.follower else None)
        if s.mgmtd_addr and s.token:  # storage is reachable: truncates and GC reach the chunks
            self.cleaner = StorageCleaner(_storage_factory(s.mgmtd_addr, s.token))
            self.servicer = TruncatingServicer(store, cleaner=self.cleaner, **common)
            gc = GcSettings(gc_delay_s=s.meta.gc_delay_s, interval_s=s.meta.gc_interval_s,
                            truncate_grace_s=s.meta.truncate_grace_s)
            ctx.spawn(GcWorker(store, self.cleaner, gc, self.pool).run(), name="meta.gc")
        else:
            self.servicer = MetaServicer(store, **common)
        ctx.add_servicer(meta_pb2_grpc.add_MetaServiceServicer_to_server, self.servicer, SERVICE_NAME)
        if s.meta.wire:
            self.wire = MetaWireEndpoint(self.servicer, authenticate=ctx.server.principal_for,
                                         host=s.meta.wire_host or s.rpc.host,
                                         port=s.meta.wire_port)
            self.servicer.wire_address = await self.wire.start()
        ctx.log.info("meta.ready", wire=self.servicer.wire_address or None, kv=getattr(self.kv, "backend", "?"),
                     threads=threads, inline_reads=inline_reads, inline_writes=inline_writes,
                     chain_tables="mgmtd" if self.follower else "static", users=len(s.meta.users))

    async def stop(self) -> None:
        if self.wire is not None:  # calls already running finish; the clients' next ones fail over
            await self.wire.stop(grace_s=self.settings.grace_s)
        if self.servicer is not None:  # how often an inline mutation had to go to the pool
            log.info("meta.stopping", calls=self.servicer.calls, deferred_to_pool=self.servicer.deferred)
        if self.cleaner is not None:
            self.cleaner.close()
        if self.follower is not None:
            await self.follower.stop()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.kv is not None:
            self.kv.close()


def _storage_factory(mgmtd_addr: str, token: str) -> Any:
    def make() -> Any:
        from fireflyer.storage.client_min import MgmtdRouting, StorageClient

        routing = MgmtdRouting(mgmtd_addr.split(","), token=token)
        return StorageClient(routing.get, token=token, client_id="meta-gc", retry_deadline_s=20.0)

    return make
