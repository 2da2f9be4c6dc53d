"""The storage service: settings (``FF_STORAGE_*``) and wiring onto the standard runtime.

    FF_STORAGE_TARGETS="101:/ssd0/t101,102:/ssd1/t102" python -m services.storage

Targets: ``targets`` lists ``ID[:DIR]`` (a missing DIR is ``<target_root>/<ID>``); empty
means ``target_count`` targets numbered from ``target_base``, where base 0 derives from
the instance ordinal (``storage-2`` -> 301, 302, ...) so replicas of one ``[[service]]``
entry in ``deploy/local.toml`` get distinct ids from the same environment.
``target_root`` defaults to ``<state_dir>/storage/<node_id>``.

mgmtd: ``FF_MGMTD_ADDR`` (comma separated), else the mgmtd processes of the local
cluster's ``<state_dir>/cluster.json`` (what ``ff up`` writes).  The gRPC server only
serves health; all storage I/O is on the wire server (``wire_host:wire_port``), whose
address the node advertises to mgmtd in its heartbeat tags (``wire=host:port``).

Short-circuit local reads (``local_reads``, default on): the node also listens on a Unix
socket (``local_socket``, default ``<target_root>/local.sock``) and advertises it with this
host's identity (``local=<host>|<path>`` tag); clients on the same host get the chunks'
version files as descriptors there after the same token check and read checks as
``stor.batch_read`` (:mod:`.localserver`, :mod:`fireflyer.storage.localread`).

Timing defaults are 3FS's (heartbeat 10 s; forwarding retries with exponential backoff
for up to 30 s); tests shrink them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import FireFlyerError, SettingsError
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.mgmt.client import MgmtdClient, RoutingCache
from fireflyer.rpc import TokenStore
from fireflyer.rpc.auth import ANONYMOUS_ADMIN
from fireflyer.storage import ChainVersionMismatch, ChunkStore, Replica, RetryPolicy
from fireflyer.storage.capability import load_keyring
from fireflyer.storage.protocol import BatchLimits
from fireflyer.wire import FrameLimits, ServerRequest, WireServer

from .dataplane import DataPlane, HeldTransfers
from .forwarder import ConnectionPool, Forwarder
from .localserver import LocalReadServer
from .loops import InitChains, NodeLoops
from .metrics import StorageMetrics
from .node import StorageNode, TargetRuntime

__all__ = ["StorageSection", "StorageSettings", "StorageService", "parse_targets", "main"]


class StorageSection(msgspec.Struct, frozen=True, kw_only=True):
    #: this node's id at mgmtd; empty: the instance name
    node_id: str = ""
    #: "ID[:DIR],..."; empty: target_count targets from target_base
    targets: str = ""
    target_root: str = ""
    target_count: int = 1
    #: first target id when ``targets`` is empty; 0: (instance ordinal + 1) * 100 + 1
    target_base: int = 0
    wire_host: str = "127.0.0.1"
    #: 0 picks a free port (advertised to mgmtd)
    wire_port: int = 0
    fsync: bool = True
    #: recompute every read chunk's CRC (3FS default off; whole-chunk reads are checked anyway)
    verify_reads: bool = False
    cluster_id: str = "local"
    heartbeat_interval_s: float = 10.0
    routing_pull_s: float = 10.0
    #: refuse I/O when the last heartbeat ack is older than this (replaced by half mgmtd's fail interval)
    fence_after_s: float = 30.0
    join_timeout_s: float = 600.0
    connect_timeout_s: float = 2.0
    forward_timeout_s: float = 5.0
    forward_max_attempts: int = 10
    forward_base_delay_s: float = 0.05
    forward_max_delay_s: float = 2.0
    forward_deadline_s: float = 30.0
    batch_max_ios: int = 128
    batch_max_bytes: int = 4 << 20
    max_chunk_size: int = 64 << 20
    #: how long batch-read data waits for its request-to-send grant, and how much may wait
    rts_hold_s: float = 30.0
    rts_max_bytes: int = 1 << 30
    io_threads: int = 16
    resync_workers: int = 4
    resync_interval_s: float = 1.0
    #: take a target with a corrupted chunk offline so resync replaces the copy
    repair_corrupt: bool = True
    #: "nodes=3,replicas=3,table=1": storage node 0 creates chains for a fresh local cluster
    init_chains: str = ""
    #: serve short-circuit local reads (chunk file descriptors over a Unix socket) to clients on
    #: this host; off as well when ``verify_reads`` is on (reads must then be checked here)
    local_reads: bool = True
    #: the socket's path; empty: ``<target_root>/local.sock``
    local_socket: str = ""
    #: the socket file's permission bits (octal); every request is also token-checked
    local_socket_mode: str = "0666"
    #: data-plane connections open at once (before and after their hello); over it a new one is
    #: refused with a ResourceExhausted error frame (``wire.conn_refused`` at INFO)
    wire_max_connections: int = 1024
    #: authenticated data-plane connections of one user (admins and services are not counted)
    wire_max_connections_per_user: int = 256
    #: a new connection must complete its hello within this, or it is closed
    wire_handshake_timeout_s: float = 5.0
    #: a frame that has started must be whole within this (its head), plus its payload at
    #: ``wire_min_payload_rate`` bytes/s; a stalled or trickling peer is closed
    wire_frame_timeout_s: float = 5.0
    wire_min_payload_rate: int = 1 << 20
    #: payload bytes of requests being received, all connections together; a request that
    #: does not fit waits ``wire_payload_budget_wait_s``, then fails with ResourceExhausted
    wire_payload_budget_bytes: int = 1 << 30
    wire_payload_budget_wait_s: float = 5.0


class StorageSettings(ServiceSettings, frozen=True, kw_only=True):
    storage: StorageSection = msgspec.field(default_factory=StorageSection)
    #: the key shared with meta that signs chunk capabilities (FF_CAPABILITY_KEY_FILE); empty:
    #: ``<state_dir>/capability.key`` (``ff up`` writes it).  Missing: the node does not start
    capability_key_file: str = ""
    #: mgmtd address(es), FF_MGMTD_ADDR; empty: from <state_dir>/cluster.json
    mgmtd_addr: str = ""


def _ordinal(instance: str) -> int:
    m = re.search(r"-(\d+)$", instance)
    return int(m.group(1)) if m else 0


def parse_targets(s: StorageSection, *, root: Path, instance: str) -> list[tuple[int, Path]]:
    """``[(target id, dir)]`` from the settings (module doc); bad specs fail naming the key."""
    out: list[tuple[int, Path]] = []
    if s.targets.strip():
        for part in s.targets.split(","):
            tid_text, _, d = part.strip().partition(":")
            try:
                tid = int(tid_text)
            except ValueError:
                raise SettingsError(f"bad target {part!r} in storage.targets (expected ID[:DIR])",
                                    key="storage.targets", expected="ID[:DIR],...") from None
            out.append((tid, Path(d) if d else root / str(tid)))
    else:
        if s.target_count < 1:
            raise SettingsError("storage.target_count must be >= 1", key="storage.target_count", expected="int >= 1")
        base = s.target_base or (_ordinal(instance) + 1) * 100 + 1
        out = [(base + i, root / str(base + i)) for i in range(s.target_count)]
    ids = [t for t, _ in out]
    if any(t <= 0 for t in ids) or len(set(ids)) != len(ids):
        raise SettingsError(f"storage target ids must be positive and distinct, got {ids}", key="storage.targets",
                            expected="distinct ids >= 1")
    return out


def _socket_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise SettingsError(f"storage.local_socket_mode must be octal permission bits, got {text!r}",
                            key="storage.local_socket_mode", expected="octal, e.g. 0660")
    return mode


async def _mgmtd_addresses(settings: StorageSettings) -> list[str]:
    if settings.mgmtd_addr:
        return [a.strip() for a in settings.mgmtd_addr.split(",") if a.strip()]
    from fireflyer.cluster.records import StatePaths, read_record

    paths = StatePaths(Path(settings.state_dir))
    while True:  # ff up writes cluster.json right after spawning every service
        record = await asyncio.to_thread(read_record, paths)
        if record is not None:
            found = [p.address for p in record.processes if p.name == "mgmtd"]
            if found:
                return found
        await asyncio.sleep(0.2)


class StorageService(Service):
    """Fire-Flyer 3FS storage node (CRAQ targets on the wire data plane)."""

    name = "storage"
    settings_type = StorageSettings

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.node: StorageNode | None = None
        self.wire: WireServer | None = None
        self.dataplane: DataPlane | None = None
        self.local: LocalReadServer | None = None
        self.pool: ConnectionPool | None = None
        self.loops: NodeLoops | None = None
        self._stores: list[ChunkStore] = []
        self._cache: RoutingCache | None = None
        self._client: MgmtdClient | None = None
        self._run_task: asyncio.Task[None] | None = None

    async def start(self, ctx: ServiceContext) -> None:
        settings: StorageSettings = self.settings  # type: ignore[assignment]
        s = settings.storage
        node_id = s.node_id or ctx.instance
        root = Path(s.target_root) if s.target_root else Path(settings.state_dir) / "storage" / node_id
        specs = parse_targets(s, root=root, instance=ctx.instance)
        token = settings.token or ""
        if settings.auth.enabled and not token:
            raise SettingsError("storage needs its service credential (role service) to register with mgmtd "
                                "and forward to other storage nodes: set FF_TOKEN (ff up sets svc-storage's)",
                                key="token", expected="bearer token")
        # chunk ops of users need meta's capabilities, signed with this shared key
        keys = load_keyring(settings.capability_key_file, settings.state_dir)
        self.pool = ConnectionPool(token=token, name=node_id, connect_timeout_s=s.connect_timeout_s,
                                   request_timeout_s=s.forward_timeout_s, io_timeout_s=s.forward_timeout_s)
        retry = RetryPolicy(max_attempts=s.forward_max_attempts, base_delay_s=s.forward_base_delay_s,
                            max_delay_s=s.forward_max_delay_s, deadline_s=s.forward_deadline_s)
        holder: dict[str, StorageNode] = {}
        forwarder = Forwarder(self.pool, lambda t: holder["node"].address_of(t))

        def make_replica_for(tid: int) -> Any:
            return lambda store: Replica(tid, store, chains=lambda c: holder["node"].chain(c), forward=forwarder,
                                         retry=retry)

        targets = []
        for tid, path in specs:
            store = await asyncio.to_thread(ChunkStore, path, fsync=s.fsync, verify_reads=s.verify_reads,
                                            target_id=tid)
            self._stores.append(store)
            targets.append(TargetRuntime(tid, path, store, make_replica_for(tid)))

        if settings.auth.enabled:
            assert settings.auth.tokens_file  # the runtime checked it
            # follows the file (ff admin users add/revoke); a revoked or expired token is refused saying so
            authenticate = TokenStore.watch(settings.auth.tokens_file,
                                            interval_s=settings.auth.reload_interval_s).authenticate
        else:
            def authenticate(token: str) -> Any:
                return ANONYMOUS_ADMIN

        held = HeldTransfers(hold_s=s.rts_hold_s, max_bytes=s.rts_max_bytes)
        limits = BatchLimits(max_ios=s.batch_max_ios, max_bytes=s.batch_max_bytes)
        frame_limits = FrameLimits(max_payload_bytes=max(s.batch_max_bytes, s.max_chunk_size) + (1 << 20))
        loops_ref: dict[str, NodeLoops] = {}

        def handler(req: ServerRequest) -> None:
            try:
                dataplane(req)
            except ChainVersionMismatch as e:
                if int(e.fields.get("got", 0)) > int(e.fields.get("expected", 0)) and "loops" in loops_ref:
                    loops_ref["loops"].kick_refresh()  # the sender knows a newer chain: catch up
                raise

        for key in ("wire_max_connections", "wire_max_connections_per_user", "wire_payload_budget_bytes"):
            if getattr(s, key) < 1:
                raise SettingsError(f"storage.{key} must be >= 1, got {getattr(s, key)}", key=f"storage.{key}",
                                    expected="int >= 1")
        for key in ("wire_handshake_timeout_s", "wire_frame_timeout_s", "wire_min_payload_rate"):
            if not getattr(s, key) > 0:
                raise SettingsError(f"storage.{key} must be > 0, got {getattr(s, key)}", key=f"storage.{key}",
                                    expected="number > 0")
        self.wire = WireServer(handler, authenticate=authenticate, host=s.wire_host, port=s.wire_port,
                               limits=frame_limits, name=f"storage:{node_id}",
                               handshake_timeout_s=s.wire_handshake_timeout_s,
                               frame_timeout_s=s.wire_frame_timeout_s, min_payload_rate=s.wire_min_payload_rate,
                               max_connections=s.wire_max_connections,
                               max_connections_per_user=s.wire_max_connections_per_user,
                               payload_budget_bytes=s.wire_payload_budget_bytes,
                               payload_budget_wait_s=s.wire_payload_budget_wait_s)
        wire_port = self.wire.port
        node = StorageNode(node_id, targets, wire_address=f"{s.wire_host}:{wire_port}",
                           grpc_address=lambda: ctx.server.address, fence_after_s=s.fence_after_s)
        holder["node"] = self.node = node
        metrics = StorageMetrics(ctx.metrics)
        dataplane = DataPlane(node, forwarder, limits=limits, max_chunk_size=s.max_chunk_size, held=held,
                              workers=s.io_threads, keys=keys, on_corrupt=lambda rt, cid, e: loops_ref["loops"].on_corrupt(rt, cid, e),
                              metrics=metrics)
        ctx.metrics.on_scrape(lambda: metrics.set_targets(rt.public for rt in node.targets.values()))
        self.dataplane = dataplane
        wire_port = self.wire.start()
        node.wire_address = f"{s.wire_host}:{wire_port}"
        if s.local_reads and not s.verify_reads:
            self.local = LocalReadServer(Path(s.local_socket) if s.local_socket else root / "local.sock",
                                         dataplane.open_local, authenticate=authenticate,
                                         mode=_socket_mode(s.local_socket_mode), name=f"storage:{node_id}")
            try:
                await asyncio.to_thread(self.local.start)
                node.local_socket = str(self.local.path)
            except (OSError, FireFlyerError) as e:  # an optimization: serve without it, loudly
                ctx.log.warning("storage.local_reads_off", path=str(self.local.path), error=str(e))
                self.local = None
        init = InitChains.parse(s.init_chains)

        async def run() -> None:
            addresses = await _mgmtd_addresses(settings)
            self._client = MgmtdClient(addresses, token=token or None, rpc=settings.rpc)
            self._cache = RoutingCache(self._client, bus=ctx.bus, cluster_id=s.cluster_id,
                                       pull_interval_s=s.routing_pull_s)
            self._cache.on_update.append(node.set_routing)
            await self._cache.start()
            self.loops = loops_ref["loops"] = NodeLoops(
                node, self._client, self._cache, forwarder, bus=ctx.bus, heartbeat_interval_s=s.heartbeat_interval_s,
                join_timeout_s=s.join_timeout_s, resync_interval_s=s.resync_interval_s,
                resync_workers=s.resync_workers, repair_corrupt=s.repair_corrupt, init_chains=init,
                is_first=_ordinal(ctx.instance) == 0,
            )  # fmt: skip
            await self.loops.run()

        self._run_task = ctx.spawn(run(), name="storage-node")
        ctx.log.info("storage.starting", node=node_id, wire=node.wire_address,
                     targets=",".join(f"{t}:{p}" for t, p in specs), fsync=s.fsync)

    async def stop(self) -> None:
        if self.local is not None:
            await asyncio.to_thread(self.local.stop)
        if self.wire is not None:
            await asyncio.to_thread(self.wire.stop)
        if self._run_task is not None:  # no heartbeat may follow the leaving one
            self._run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._run_task
        if self.loops is not None and self._client is not None:
            await self.loops.leave()
        if self.dataplane is not None:
            self.dataplane.close()
        if self.pool is not None:
            self.pool.close()
        if self._cache is not None:
            await self._cache.stop()
        if self._client is not None:
            await self._client.close()
        for store in self._stores:
            store.close()


def main(argv: list[str] | None = None) -> int:
    return run_service(StorageService, argv)
