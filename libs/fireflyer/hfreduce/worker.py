"""The HFReduce node worker: one process per node, serving its local ranks.

    python -m fireflyer.hfreduce.worker --node-rank 0 --nnodes 2 --local-world-size 4 \\
        --socket /tmp/ff/hfr0.sock --peers 10.0.0.1:7100,10.0.0.2:7100 [--chunk-size 4M] \\
        [--timeout-s 60] [--token T] [--job-id J] [--zones A,A]

prints ``hfreduce worker ready node=R socket=PATH listen=HOST:PORT`` on stdout once it
accepts ranks, and exits 0 on SIGTERM.  Settings also come from ``FF_HFREDUCE_*``
(:mod:`.settings`); flags win.  ``--peers`` lists every node's engine listen address
in node-rank order (this node listens on ``peers[node_rank]``); one node needs none.

With ``--coord HOST:PORT`` (or ``FF_COORD_ADDR`` and no ``--peers``) the coordination
service is the rendezvous instead: the worker joins communicator ``JOB/--coord-comm``
as ``--node-name`` (zone ``--zone``, engine on ``--listen``), blocks until all
``--nnodes`` nodes joined, and takes its node rank, the peers and the zones from the
answer (``--node-rank`` is then ignored).  It heartbeats while it runs, leaves on
SIGTERM, and when coord aborts the communicator (a node missed heartbeats, or a
member called Abort) every live communicator of this worker fails, so every local
rank raises with coord's reason naming the node (:mod:`fireflyer.coord.client`).

Threads: one accept thread, one thread per rank connection (control messages of
:mod:`.protocol`; it also starts a small op whose last submit it receives while no op
runs, which the engine thread that completes it then ends), one op thread per
communicator generation (:mod:`.nodecomm`), one
write-back thread per generation, the engine's transfer threads, and the telemetry
publisher.  None of them runs an asyncio loop on the data path (DESIGN.md §1).

A rank that dies fails its communicator on every rank of the job but never the worker:
the worker drops that rank's shared-memory mappings and serves the next communicator.
A rank that says goodbye (``comm.close()``, or the client's goodbye at interpreter exit)
leaves quietly: ``hfreduce.comm_failed`` (a warning) is kept for real failures.  Logs go
to stderr: warnings and errors only, unless ``FF_LOG_LEVEL`` (and ``FF_LOG_FORMAT``) is set.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from fireflyer.cluster.procs import free_ports
from fireflyer.core.errors import FireFlyerError, InvalidArgument, ProtocolError
from fireflyer.core.log import configure_logging, get_logger

from . import _blocks, kernels
from .errors import HFReduceError
from .nodecomm import NodeComm, RankConn
from .protocol import (
    Bye,
    Channel,
    Failed,
    Hello,
    Register,
    Registered,
    StatusReply,
    StatusRequest,
    Submit,
    Unregister,
    Welcome,
)
from .settings import WorkerSettings, load_worker_settings
from .shm import Segment, sweep_stale
from .telemetry import NatsTelemetry, OpRecord, OpRing

__all__ = ["Worker", "main", "READY_PREFIX"]

log = get_logger(__name__)
READY_PREFIX = "hfreduce worker ready"
KINDS = ("allreduce", "reduce", "broadcast", "barrier", "allgather", "reduce_scatter")


def engine_available() -> bool:
    return importlib.util.find_spec("fireflyer.hfreduce.engine") is not None


class Worker:
    """The node worker's state; :meth:`start` serves, :meth:`stop` ends (see the module docs)."""

    def __init__(self, *, node_rank: int, nnodes: int, local_world_size: int, socket_path: str,
                 peers: Sequence[str] = (), zones: Sequence[str] | None = None,
                 settings: WorkerSettings | None = None) -> None:
        self.settings = settings or WorkerSettings()
        if nnodes < 1 or not 0 <= node_rank < nnodes:
            raise InvalidArgument(f"node rank {node_rank} out of range for {nnodes} nodes")
        if nnodes > 1 and len(peers) != nnodes:
            raise InvalidArgument(f"--peers must list {nnodes} addresses (one per node), got {len(peers)}")
        if nnodes > 1 and not engine_available():
            raise InvalidArgument("this build of fireflyer has no inter-node engine (fireflyer.hfreduce.engine); "
                                  "run with --nnodes 1")
        self.node_rank = node_rank
        self.nnodes = nnodes
        self.local_world_size = local_world_size
        self.socket_path = socket_path
        self.peers = list(peers)
        self.zones = list(zones) if zones else None
        self.listen = self.peers[node_rank] if self.peers else None
        self.chunk_bytes = self.settings.chunk_bytes
        self.threads = self.settings.threads or kernels.default_threads()
        self.engine_slot = threading.Lock()
        self.ring = OpRing(self.settings.status_ring)
        # NATS takes the cluster credential (FF_TOKEN), never the engines' per-job --token
        self.nats = NatsTelemetry(self.settings.nats_url, node_rank=node_rank,
                                  interval_s=self.settings.telemetry_interval_s,
                                  token=os.environ.get("FF_TOKEN")) if self.settings.nats_url else None
        self._lock = threading.Lock()
        self._comms: dict[str, NodeComm] = {}
        self._generations: dict[str, int] = {}
        self._conns: set[RankConn] = set()
        self._sock: socket.socket | None = None
        self._stopped = threading.Event()
        #: the coord membership (coord mode) and the error its abort left behind
        self.coord: Any = None
        self.coord_error: FireFlyerError | None = None
        self.tracing = False
        self.refresh_tracing()

    # -- serving ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the socket and start accepting ranks (returns at once)."""
        sweep_stale()
        path = self.socket_path
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # left by a dead worker
            else:
                probe.close()
                raise InvalidArgument(f"another HFReduce worker already serves {path}", socket=path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(256)
        self._sock = sock
        self._acceptor = threading.Thread(target=self._accept_loop, name="hfr-accept", daemon=True)
        self._acceptor.start()
        threading.Thread(target=self._sweeper, name="hfr-sweep", daemon=True).start()
        if self.settings.stream and self.nnodes > 1:  # compile the streamed ops' loops before the first one
            threading.Thread(target=_blocks.warm_up, name="hfr-warm", daemon=True).start()
        log.info("hfreduce.worker_started", node=self.node_rank, socket=path, listen=self.listen,
                 chunk_bytes=self.chunk_bytes, threads=self.threads)

    def ready_line(self) -> str:
        line = f"{READY_PREFIX} node={self.node_rank} socket={self.socket_path} listen={self.listen or '-'}"
        r = self.coord.result if self.coord is not None else None
        return f"{line} coord={r.comm}#{r.generation}" if r is not None else line

    def stop(self) -> None:
        """Fail live communicators (ranks raise), close everything, remove the socket."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._sock is not None:
            # close() alone does not wake a thread blocked in accept(); shutdown() does (EINVAL)
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            acceptor = getattr(self, "_acceptor", None)
            if acceptor is not None and acceptor is not threading.current_thread():
                acceptor.join(timeout=2.0)
        with self._lock:
            comms = list(self._comms.values())
            conns = list(self._conns)
        for c in comms:
            c.fail(HFReduceError(f"the HFReduce worker of node {self.node_rank} is shutting down",
                                 node=self.node_rank))
        for conn in conns:
            conn.chan.close()
        if self.nats is not None:
            self.nats.close()
        if self.coord is not None:
            self.coord.close(leave=True)

    def coord_aborted(self, reason: str, culprit: str) -> None:
        """Coord aborted this job's communicator: fail every live communicator (ranks raise) and refuse new ones."""
        comm = self.coord.result.comm if self.coord is not None and self.coord.result else "?"
        err = HFReduceError(f"communicator {comm} was aborted by the coordination service: {reason}",
                            node=self.node_rank, culprit=culprit, comm=comm)
        self.coord_error = err
        with self._lock:
            comms = list(self._comms.values())
        log.warning("hfreduce.coord_aborted", comm=comm, reason=reason, culprit=culprit)
        for c in comms:
            c.fail(err)

    def _sweeper(self) -> None:
        while not self._stopped.wait(5.0):
            sweep_stale()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stopped.is_set():
            try:
                s, _ = self._sock.accept()
            except OSError:
                return
            conn = RankConn(Channel(s))
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="hfr-rank", daemon=True).start()

    def _serve(self, conn: RankConn) -> None:
        try:
            while True:
                msg = conn.chan.recv()
                if msg is None:
                    break
                if isinstance(msg, Bye):
                    conn.said_bye = True
                    break
                self._handle(conn, msg)
        except ProtocolError as e:
            log.warning("hfreduce.bad_message", error=str(e))
        finally:
            if conn.comm is not None:
                conn.comm.leave(conn, died=not conn.said_bye and not self._stopped.is_set())
            for seg in conn.segments.values():
                seg.close()
            conn.segments.clear()
            conn.chan.close()
            with self._lock:
                self._conns.discard(conn)

    def _handle(self, conn: RankConn, msg: Any) -> None:
        if isinstance(msg, Submit):
            if conn.comm is None:
                conn.send(Failed(seq=msg.seq, error=HFReduceError("submit before hello").to_dict()))
            else:
                bad = _check_submit(msg)
                if bad is not None:
                    conn.comm.fail(bad)
                conn.comm.submit(conn, msg)
        elif isinstance(msg, Register):
            try:
                seg = Segment.attach(msg.name, msg.nbytes)
            except (OSError, ValueError) as e:
                conn.send(Failed(seq=-1, error=HFReduceError(f"cannot map segment {msg.name}: {e}").to_dict()))
                return
            finally:
                if msg.name.startswith("ffhr-") and "/" not in msg.name:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"/dev/shm/{msg.name}")
            old = conn.segments.pop(msg.seg, None)
            if old is not None:
                old.close()
            conn.segments[msg.seg] = seg
            conn.send(Registered(seg=msg.seg))
        elif isinstance(msg, Unregister):
            seg = conn.segments.pop(msg.seg, None)
            if seg is not None:
                seg.close()
        elif isinstance(msg, Hello):
            try:
                comm = self.join(conn, msg)
            except FireFlyerError as e:
                conn.send(Failed(seq=-1, error=e.to_dict()))
                return
            conn.send(Welcome(generation=comm.generation, node_rank=self.node_rank, chunk_bytes=self.chunk_bytes,
                              worker_pid=os.getpid(), timeout_s=comm.timeout_s))
        elif isinstance(msg, StatusRequest):
            key = conn.comm.key if conn.comm is not None else None
            recent, pending = self.ring.snapshot(key)
            conn.send(StatusReply(req=msg.req, recent=recent, pending=pending, worker=self.info()))
        else:
            raise ProtocolError(f"unexpected message {type(msg).__name__} from a rank")

    # -- communicators ----------------------------------------------------------------------------

    def join(self, conn: RankConn, hello: Hello) -> NodeComm:
        """Attach a rank to the live generation of its communicator, or start a new generation."""
        if conn.comm is not None:
            raise InvalidArgument("this connection already joined a communicator")
        if self.coord_error is not None:
            raise self.coord_error
        if hello.node_rank != self.node_rank or hello.nnodes != self.nnodes:
            raise InvalidArgument(f"rank {hello.rank} says node {hello.node_rank} of {hello.nnodes}, but this worker "
                                  f"serves node {self.node_rank} of {self.nnodes} (wrong FF_HFREDUCE_SOCKET?)")
        if hello.local_world_size != self.local_world_size:
            raise InvalidArgument(f"rank {hello.rank} says local_world_size {hello.local_world_size}, this worker "
                                  f"was started for {self.local_world_size}")
        key = f"{hello.job_id or self.settings.job_id or 'job'}/{hello.comm}"
        with self._lock:
            comm = self._comms.get(key)
            if comm is None or comm.error is not None or comm.closing or hello.local_rank in comm.left:
                if comm is not None and comm.error is None and not comm.closing:
                    comm.fail(HFReduceError(f"communicator {key!r} was re-created by rank {hello.rank}", comm=key))
                gen = self._generations.get(key, 0) + 1
                self._generations[key] = gen
                comm = NodeComm(self, key, gen, hello)
                self._comms[key] = comm
        comm.join(conn, hello)
        conn.hello = hello
        conn.comm = comm
        return comm

    def retire(self, comm: NodeComm) -> None:
        with self._lock:
            if self._comms.get(comm.key) is comm:
                del self._comms[comm.key]

    def info(self) -> dict[str, Any]:
        with self._lock:
            comms = {k: {"generation": c.generation, "joined": sorted(c.conns), "left": sorted(c.left),
                         "error": str(c.error) if c.error else "", "next_seq": c.next_seq, "fast_ops": c.fast_ops,
                         "posted_ops": c.posted_ops, "express_ops": c.express_ops,
                         # the TCP congestion control of the engine's links (FF_HFREDUCE_TCP_CONGESTION)
                         "congestion": c.engine.congestion_summary() if c.engine is not None else [],
                         # their SO_SNDBUF as the kernel reports it (FF_HFREDUCE_SEND_BUF_SIZE, doubled)
                         "send_buffers": c.engine.send_buffers() if c.engine is not None else [],
                         # how long its express link polls for the next small op (FF_HFREDUCE_EXPRESS_POLL_US)
                         "express_poll_us": c.engine.express_poll_s * 1e6 if c.engine is not None else None,
                         # how large ops cross the nodes (FF_HFREDUCE_ALGORITHM; "tree" where a ring cannot run)
                         "algorithm": c.engine.algorithm if c.engine is not None else None}
                     for k, c in self._comms.items()}
        return {"node_rank": self.node_rank, "nnodes": self.nnodes, "pid": os.getpid(),
                "local_world_size": self.local_world_size, "chunk_bytes": self.chunk_bytes,
                "threads": self.threads, "comms": comms,
                "telemetry_sent": self.nats.sent if self.nats else 0}

    # -- telemetry --------------------------------------------------------------------------------

    def ring_begin(self, rec: OpRecord) -> OpRecord:
        self.ring.begin(rec)
        return rec

    def ring_record(self, comm: NodeComm, seq: int) -> OpRecord | None:
        return self.ring.get(comm.key, comm.generation, seq)

    def ring_pending(self, comm: NodeComm) -> list[int]:
        return self.ring.pending_seqs(comm.key, comm.generation)

    def ring_end(self, comm: NodeComm, seq: int, phase: str, *, error: str = "") -> OpRecord | None:
        rec = self.ring.get(comm.key, comm.generation, seq)
        if rec is None:
            return None
        rec.phase, rec.error, rec.finished_at = phase, error, time.time()
        rec.missing = [r for r in range(comm.K) if r not in rec.arrivals]
        self.ring.finish(rec)
        if self.nats is not None:
            self.nats.submit(rec)
            if phase == "failed":
                self.nats.nudge()
        return rec

    def refresh_tracing(self) -> None:
        """Look again whether tracing is set up (:func:`_setup_tracing`); ops make spans only then.

        Looked up once, not per op: asking OpenTelemetry reads the environment, and a no-op
        span still costs a few % of a small op.
        """
        from opentelemetry.trace import ProxyTracerProvider, get_tracer_provider

        self.tracing = not isinstance(get_tracer_provider(), ProxyTracerProvider)

    def span(self, comm: NodeComm, sub: Submit, seq: int) -> contextlib.AbstractContextManager[Any]:
        """The op's span (entered: the span, or None when tracing is off)."""
        return self._span(comm, sub, seq) if self.tracing else contextlib.nullcontext()

    def span_after(self, comm: NodeComm, sub: Submit, seq: int, started_at: float, rec: OpRecord | None) -> None:
        """The span of an op that ran without one open (an express op, which no thread waits for):
        from ``started_at`` (``time.time()``) to now, with the record's phase times."""
        from fireflyer.telemetry import tracer

        sp = tracer("fireflyer.hfreduce").start_span(f"hfreduce.{sub.kind}", attributes=self._span_attrs(comm, sub, seq),
                                                     start_time=int(started_at * 1e9))
        if rec is not None:
            for k in ("local_reduce_s", "tree_s", "writeback_s"):
                sp.set_attribute(f"hfreduce.{k}", getattr(rec, k))
        sp.end()

    def _span_attrs(self, comm: NodeComm, sub: Submit, seq: int) -> dict[str, Any]:
        return {"hfreduce.comm": comm.key, "hfreduce.seq": seq, "hfreduce.kind": sub.kind, "hfreduce.op": sub.op,
                "hfreduce.dtype": sub.dtype, "hfreduce.count": sub.count, "hfreduce.node": self.node_rank}

    @contextlib.contextmanager
    def _span(self, comm: NodeComm, sub: Submit, seq: int) -> Iterator[Any]:
        from fireflyer.telemetry import tracer

        with tracer("fireflyer.hfreduce").start_as_current_span(f"hfreduce.{sub.kind}",
                                                                attributes=self._span_attrs(comm, sub, seq)) as sp:
            yield sp


def _check_submit(sub: Submit) -> FireFlyerError | None:
    if sub.kind not in KINDS:
        return InvalidArgument(f"unknown collective {sub.kind!r}")
    if sub.kind in ("allreduce", "reduce", "reduce_scatter") and sub.op not in kernels.OPS:
        return InvalidArgument(f"unknown reduce op {sub.op!r}; expected one of {kernels.OPS}")
    if sub.count < 0 or sub.out_count < 0:
        return InvalidArgument(f"negative count {sub.count} / {sub.out_count}")
    if sub.kind != "barrier":
        try:
            kernels.dtype_from_name(sub.dtype)
        except FireFlyerError as e:
            return e
    return None


def _setup_tracing(node_rank: int) -> None:
    env = os.environ
    if not (env.get("FF_STATE_DIR") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("FF_TELEMETRY_SPAN_FILE")):
        return
    from fireflyer.core.config import TelemetrySettings
    from fireflyer.telemetry import setup_tracing

    setup_tracing("hfreduce-worker", f"node{node_rank}:{os.getpid()}", state_dir=env.get("FF_STATE_DIR") or ".ff",
                  settings=TelemetrySettings(span_file=env.get("FF_TELEMETRY_SPAN_FILE") or None))


def _coord_join(address: str, ns: argparse.Namespace, settings: WorkerSettings) -> Any:
    """Join the job's communicator in coord (blocks until every node joined); the membership."""
    from fireflyer.coord import CoordMembership, JoinSpec

    listen = ns.listen
    if not listen:
        listen = f"127.0.0.1:{free_ports(1)[0]}"  # outside the ephemeral range (see free_ports)
    restart = ns.restart_count if ns.restart_count is not None else int(os.environ.get("FF_RESTART_COUNT") or 0)
    spec = JoinSpec(job=settings.job_id or "job", name=ns.coord_comm,
                    node=ns.node_name or os.environ.get("FF_NODE_NAME") or socket.gethostname(), zone=ns.zone,
                    local_world_size=ns.local_world_size, address=listen, nnodes=ns.nnodes, restart_count=restart)
    # the coord token is the cluster's FF_TOKEN (the engines' --token is a different, per-job secret)
    membership = CoordMembership(address, spec, nats_url=settings.nats_url, join_timeout_s=ns.coord_timeout_s)
    try:
        membership.join()
    except BaseException:
        membership.close(leave=False)
        raise
    return membership


def _owner_of(aborted_subject: str) -> str:
    from fireflyer.bus.subjects import owner_of

    token = owner_of(aborted_subject)
    # the subject token spells "." as "~" (fireflyer.bus.subjects.user_token); owned() spells it back
    return token.replace("~", ".") if token else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fireflyer.hfreduce.worker", description=__doc__.split("\n")[0])
    p.add_argument("--node-rank", type=int, default=None, help="required unless coord assigns it")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--local-world-size", type=int, required=True)
    p.add_argument("--socket", required=True, help="Unix socket path the local ranks connect to")
    p.add_argument("--peers", default="", help="HOST:PORT per node, comma separated, in node-rank order")
    p.add_argument("--zones", default="", help="zone per node, comma separated (optional)")
    p.add_argument("--chunk-size", default=None, help="pipeline chunk, e.g. 4M (default FF_HFREDUCE_CHUNK_SIZE or 4M)")
    p.add_argument("--timeout-s", type=float, default=None)
    p.add_argument("--token", default=None)
    p.add_argument("--job-id", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--coord", default=None, metavar="HOST:PORT", help="join through the coordination service")
    p.add_argument("--coord-comm", default="default", help="communicator name in coord (default 'default')")
    p.add_argument("--node-name", default=None, help="this node's name in coord (default FF_NODE_NAME, hostname)")
    p.add_argument("--zone", default="", help="this node's zone (coord mode)")
    p.add_argument("--listen", default=None, metavar="HOST:PORT", help="engine listen address (coord mode)")
    p.add_argument("--restart-count", type=int, default=None, help="job restart count (default FF_RESTART_COUNT)")
    p.add_argument("--coord-timeout-s", type=float, default=60.0, help="how long to wait for the other nodes")
    ns = p.parse_args(argv)
    if os.environ.get("FF_LOG_LEVEL"):  # otherwise only warnings and errors reach stderr (logging's default)
        configure_logging(level=os.environ["FF_LOG_LEVEL"], fmt="json" if os.environ.get("FF_LOG_FORMAT") == "json"
                          else "text", service="hfreduce-worker",
                          instance=None if ns.node_rank is None else str(ns.node_rank))
    try:
        settings = load_worker_settings(overrides={"chunk_size": ns.chunk_size, "timeout_s": ns.timeout_s,
                                                   "token": ns.token, "job_id": ns.job_id, "threads": ns.threads})
        peers = [x.strip() for x in ns.peers.split(",") if x.strip()]
        zones = [x.strip() for x in ns.zones.split(",") if x.strip()] or None
        node_rank, membership = ns.node_rank, None
        coord_addr = ns.coord or (settings.coord_addr if not peers else "")
        if coord_addr:
            membership = _coord_join(coord_addr, ns, settings)
            r = membership.result
            node_rank, peers, zones = r.node_rank, r.addresses, r.zones
        elif node_rank is None:
            raise InvalidArgument("--node-rank is required without --coord / FF_COORD_ADDR")
        try:
            worker = Worker(node_rank=node_rank, nnodes=ns.nnodes, local_world_size=ns.local_world_size,
                            socket_path=ns.socket, peers=peers, zones=zones, settings=settings)
            if membership is not None:
                worker.coord, membership.on_abort = membership, worker.coord_aborted
                if worker.nats is not None:  # telemetry goes where coord put the communicator's events
                    worker.nats.owner = _owner_of(r.aborted_subject)
            worker.start()
        except BaseException:
            if membership is not None:
                membership.close(leave=False)
            raise
    except (FireFlyerError, OSError) as e:
        print(f"hfreduce worker: {e}", file=sys.stderr, flush=True)
        return 2
    _setup_tracing(node_rank)
    worker.refresh_tracing()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(worker.ready_line(), flush=True)
    while not stop.wait(1.0):
        pass
    worker.stop()
    try:
        from fireflyer.telemetry import shutdown_tracing

        shutdown_tracing(2.0)
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
    return 0


def _exit_now(code: int) -> None:
    """Leave without the interpreter's teardown.  By the time ``main`` returns the worker has
    released what others can see (its communicators failed, sockets closed, socket file and
    segment names removed, spans exported); what remains is freeing numba's and LLVM's objects
    one by one, 0.1-0.3 s of CPU per worker on the 2-vCPU VMs, paid by every launcher and test
    that stops a node."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
