"""``ff up`` / ``ff status`` / ``ff down``: the local cluster's life cycle.

``up`` starts nats-server (unless an external URL is given) and every service
of the cluster file as detached processes, records them in ``cluster.json``,
then waits — concurrently, each with its own deadline — until each answers
its gRPC health check.  If one exits or stays unhealthy, it prints which, why
and the tail of its log, stops everything it started, and fails.

``down`` signals only what the record names *and* is still the same process
(pid plus start time), services first, nats last.

The managed nats-server keeps one port for the life of the state dir (``nats.port``):
restarted with the command line ``cluster.json`` records (``nats.command``), it comes
back where every service's client reconnects to.  ``status`` and ``down`` then find it
through its own pid file (``-P``, ``nats.pid``) or, failing that, as the nats-server
listening on that port; the pid recorded at ``up`` is only the first place they look.

The managed nats-server runs with ``<state>/nats.conf`` (``-c``, also in ``nats.command``), whose
users are the tokens of ``tokens.json`` (:mod:`.natsauth`, docs/nats-auth.md): no anonymous client,
each service connects with its own ``svc-<name>`` token.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
from rich.console import Console

from fireflyer.core.errors import DeadlineExceeded, FailedPrecondition, FireFlyerError, Unavailable
from fireflyer.core.log import get_logger
from fireflyer.storage.capability import write_key_file

from . import report
from .config import ClusterConfig, load_cluster_config
from .decisions import (
    NATS_PHASE,
    SERVING,
    StatusRow,
    StopOutcome,
    StopTarget,
    UpVerdict,
    choose_nats_port,
    decide_up,
    is_nats_on_port,
    nats_status_row,
    status_exit_code,
    status_row,
    stop_phase,
    stop_targets,
)
from .homes import home_users, homes_line, make_homes
from .procs import (
    alive,
    cmdline,
    free_ports,
    observe,
    pids_matching,
    port_free,
    read_pid_file,
    read_tail,
    spawn,
    stop_processes,
    tcp_reachable,
)
from .records import (
    ClusterRecord,
    NatsRecord,
    ProcessRecord,
    StatePaths,
    TokensFile,
    ensure_tokens,
    read_nats_port,
    read_record,
    remove_record,
    state_lock,
    write_nats_port,
    write_record,
)

__all__ = ["up", "status", "down", "metrics", "metrics_rows", "metrics_address", "collect_status", "alive_map", "nats_port_for", "live_nats", "TAIL_LINES"]

log = get_logger(__name__)

TAIL_LINES = 20
RPC_HOST = "127.0.0.1"


def nats_port_for(paths: StatePaths, configured: int = 0, host: str = "127.0.0.1") -> int:
    """The managed nats-server's port for this state dir: the one recorded there (``nats.port``)
    while it is free, else a fresh free one, which is recorded (see ``choose_nats_port``)."""
    recorded = read_nats_port(paths)
    port = choose_nats_port(configured=configured, recorded=recorded,
                            recorded_free=recorded is not None and port_free(host, recorded))
    if port == 0:
        port = free_ports(1, host)[0]
        if recorded is not None:
            log.warning("cluster.nats_port_moved", old=recorded, new=port, why=f"port {recorded} is in use")
    if port != recorded:
        write_nats_port(paths, port)
    return port


def live_nats(n: NatsRecord) -> NatsRecord:
    """``n`` with the pid (and start time) of the cluster's nats-server running *now*.

    The recorded pid while that process lives; else the pid in nats-server's own pid file,
    else any nats-server serving the recorded port (a NATS restarted by hand or by a
    supervisor); ``n`` unchanged when none runs.
    """
    if not n.managed or alive(n.pid, n.start_ticks) or n.port is None:
        return n
    port = n.port

    def serves_port(pid: int) -> bool:
        argv = cmdline(pid)
        return argv is not None and is_nats_on_port(argv, port)

    from_file = read_pid_file(n.pid_file)
    candidates = [from_file] if from_file is not None and serves_port(from_file) else []
    if not candidates:
        candidates = pids_matching(lambda argv: is_nats_on_port(argv, port))
    for pid in candidates:
        seen = observe(pid)
        if seen is not None and not seen.zombie:
            return msgspec.structs.replace(n, pid=pid, start_ticks=seen.start_ticks)
    return n


def _with_live_nats(record: ClusterRecord) -> ClusterRecord:
    return msgspec.structs.replace(record, nats=live_nats(record.nats))


def alive_map(record: ClusterRecord | None) -> dict[str, bool]:
    """label -> is the recorded process still the one we started (nats: the one now on its port)."""
    if record is None:
        return {}
    record = _with_live_nats(record)
    out = {p.instance: alive(p.pid, p.start_ticks) for p in record.processes}
    if record.nats.managed:
        out["nats"] = alive(record.nats.pid, record.nats.start_ticks)
    return out


async def _health(address: str, timeout_s: float) -> str:
    # imported here: `ff status --help` and `ff down` need no grpc
    from fireflyer.rpc.health import check_health

    return await check_health(address, timeout_s=timeout_s)


# ---------------------------------------------------------------------------- up


class _Started(msgspec.Struct):
    record: ProcessRecord
    popen: subprocess.Popen[bytes]
    ready_timeout_s: float


def _start_nats(cfg: ClusterConfig, paths: StatePaths, env: Mapping[str, str], tokens: TokensFile) -> NatsRecord:
    external = env.get("FF_NATS_URL") or cfg.nats.url
    if external:
        return NatsRecord(url=external, managed=False)
    from fireflyer.bus.server import NatsServerProcess

    from .natsauth import write_nats_config

    log_path = paths.log_for("nats")
    port = nats_port_for(paths, cfg.nats.port)
    # every client authenticates with its token (docs/nats-auth.md): the users come from tokens.json
    conf = write_nats_config(paths.root, tokens.tokens)
    # detach: the server must outlive this `ff up` process, like the services
    server = NatsServerProcess(store_dir=paths.nats_store, port=port, log_file=log_path, detach=True,
                               pid_file=paths.nats_pid, config_file=conf)
    server.start(timeout_s=10.0)
    assert server.pid is not None  # set by start()
    seen = observe(server.pid)
    return NatsRecord(url=server.url, managed=True, pid=server.pid, start_ticks=seen.start_ticks if seen else None,
                      port=server.port, log=str(log_path), pid_file=str(paths.nats_pid),
                      command=server.command(server.port))


def _service_env(base: Mapping[str, str], *, paths: StatePaths, nats_url: str, port: int, instance: str,
                 service_token: str, extra: Mapping[str, str], metrics_port: int | None = None) -> dict[str, str]:
    env = dict(base)
    env.update({
        "FF_STATE_DIR": str(paths.root),
        "FF_NATS_URL": nats_url,
        "FF_RPC_HOST": RPC_HOST,
        "FF_RPC_PORT": str(port),
        "FF_INSTANCE": instance,
        "FF_AUTH_TOKENS_FILE": str(paths.tokens),
        # the service's own credential (svc-<name>, role service), never the admin's: a peer it
        # calls is trusted with this token only, and mgmtd binds the nodes it registers to it
        "FF_TOKEN": service_token,
        # meta signs chunk capabilities with it, storage checks them (fireflyer.storage.capability)
        "FF_CAPABILITY_KEY_FILE": str(paths.capability_key),
        "FF_TELEMETRY_SPAN_FILE": str(paths.spans),
        "FF_LOG_FORMAT": "json",
        # a service's log must reach the file as it happens, not when a buffer fills
        "PYTHONUNBUFFERED": "1",
    })
    if metrics_port is not None:
        # the Prometheus endpoint (docs/metrics.md); one port per process, like FF_RPC_PORT
        env["FF_METRICS_PORT"] = str(metrics_port)
    env.update(extra)
    return env


def metrics_address(entry_env: Mapping[str, str], assigned: int) -> str:
    """Where a process's metrics will be, given its entry's env and the port ``ff up`` assigned:
    an entry's own nonzero ``FF_METRICS_PORT`` wins; ``0`` there (a port only the process knows)
    or an empty value (off) records none."""
    own = entry_env.get("FF_METRICS_PORT")
    if own is None:
        return f"{RPC_HOST}:{assigned}"
    own = own.strip()
    return f"{RPC_HOST}:{int(own)}" if own.isdigit() and int(own) > 0 else ""


#: env names DESIGN.md §3 fixes for service addresses where they differ from FF_<NAME>_ADDR
_ADDR_ENV = {"checkpoint": "FF_CKPT_ADDR", "scheduler": "FF_SCHED_ADDR"}


def address_env(planned: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``FF_<SERVICE>_ADDR`` -> every instance's address, comma separated, for (name, address) pairs.

    Every process of the cluster gets all of them, so services find each other
    (meta finds mgmtd, the launcher finds coord) without a discovery step.
    """
    by_name: dict[str, list[str]] = {}
    for name, address in planned:
        by_name.setdefault(name, []).append(address)
    return {_ADDR_ENV.get(name, f"FF_{name.upper().replace('-', '_')}_ADDR"): ",".join(addrs)
            for name, addrs in by_name.items()}


def _start_services(cfg: ClusterConfig, paths: StatePaths, env: Mapping[str, str], cwd: Path, nats_url: str,
                    tokens: TokensFile, started: list[_Started]) -> None:
    """Spawn every instance, appending to ``started`` as it goes (the caller cleans up on error)."""
    # a gRPC port and a metrics port per process, and an HTTP port for a service with ``http = true``
    total = sum(s.replicas * (3 if s.http else 2) for s in cfg.service)
    ports = iter(free_ports(total, RPC_HOST))
    planned = [(entry, instance, next(ports), next(ports)) for entry in cfg.service
               for instance in entry.instances()]
    http_ports = {instance: next(ports) for entry, instance, _, _ in planned if entry.http}
    addresses = address_env([(entry.name, f"{RPC_HOST}:{port}") for entry, _, port, _ in planned])
    for entry, instance, port, metrics_port in planned:
        log_path = paths.log_for(instance)
        credential = tokens.for_service(entry.name)
        assert credential is not None  # ensure_tokens made one per service of the config
        # the cluster's addresses first, so an entry's own env can still override one
        http_address = f"{RPC_HOST}:{http_ports[instance]}" if instance in http_ports else ""
        extra = ({"FF_HTTP_HOST": RPC_HOST, "FF_HTTP_PORT": str(http_ports[instance]), **entry.env} if http_address
                 else entry.env)
        child_env = _service_env({**env, **addresses}, paths=paths, nats_url=nats_url, port=port,
                                 instance=instance, service_token=credential.token, extra=extra,
                                 metrics_port=metrics_port)
        popen = spawn([sys.executable, "-m", entry.module, *entry.args], env=child_env, cwd=cwd,
                      log_path=log_path)
        seen = observe(popen.pid)
        rec = ProcessRecord(name=entry.name, instance=instance, module=entry.module, pid=popen.pid,
                            start_ticks=seen.start_ticks if seen else None, address=f"{RPC_HOST}:{port}",
                            log=str(log_path), started_at=time.time(),
                            metrics=metrics_address(entry.env, metrics_port), http_address=http_address)
        started.append(_Started(rec, popen, cfg.ready_timeout_for(entry)))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _Failure(msgspec.Struct, frozen=True):
    instance: str
    why: str
    log: str


async def _wait_one(s: _Started, ui: report.StartProgress) -> _Failure | None:
    rec = s.record
    deadline = time.monotonic() + s.ready_timeout_s
    last = "no answer"
    while True:
        code = s.popen.poll()
        if code is not None:
            why = f"{_describe_exit(code)} during start-up"
            ui.finish(rec.instance, False, why)
            return _Failure(rec.instance, why, rec.log)
        remaining = deadline - time.monotonic()
        try:
            last = await _health(rec.address, timeout_s=max(0.2, min(1.0, remaining)))
        except (Unavailable, DeadlineExceeded):
            last = "no answer"
        except FireFlyerError as e:  # answered, but not with a status: keep waiting, show why
            last = e.kind
        if last == SERVING:
            ui.finish(rec.instance, True, f"{SERVING} at {rec.address}")
            return None
        if remaining <= 0:
            why = f"not healthy after {s.ready_timeout_s:g}s (health: {last})"
            ui.finish(rec.instance, False, why)
            return _Failure(rec.instance, why, rec.log)
        ui.update(rec.instance, f"waiting ({last})")
        await asyncio.sleep(0.05)


async def _wait_ready(started: Sequence[_Started], ui: report.StartProgress) -> list[_Failure]:
    """Wait for all; on the first failure stop waiting (the cluster is going down anyway)."""
    tasks = [asyncio.create_task(_wait_one(s, ui)) for s in started]
    failures: list[_Failure] = []
    pending: set[asyncio.Task[_Failure | None]] = set(tasks)
    while pending and not failures:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        failures.extend(f for t in done if (f := t.result()) is not None)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    # others may have died in the same moment: report them too
    named = {f.instance for f in failures}
    for s in started:
        code = s.popen.poll()
        if code is not None and s.record.instance not in named:
            failures.append(_Failure(s.record.instance, f"{_describe_exit(code)} during start-up", s.record.log))
    return failures


def _stop_started(console: Console, paths: StatePaths, nats: NatsRecord | None, started: Sequence[_Started],
                  timeout_s: float) -> None:
    targets = [StopTarget(s.record.instance, s.record.pid, s.record.start_ticks, phase=stop_phase(s.record.name))
               for s in reversed(started)]
    if nats is not None and nats.managed and nats.pid is not None:
        targets.append(StopTarget("nats", nats.pid, nats.start_ticks, phase=NATS_PHASE))
    if not targets:
        return
    live = [t for t in targets if alive(t.pid, t.start_ticks)]
    outcomes = stop_processes(live, timeout_s=timeout_s, children=[s.popen for s in started])
    for s in started:
        s.popen.poll()
    pids = {t.label: t.pid for t in targets}
    full = {t.label: outcomes.get(t.label, StopOutcome.NOT_RUNNING) for t in targets}
    report.print_down(console, f"stopping what ff up started — {paths.root}", pids, full)


def up(*, config_path: Path, state_dir: Path, env: Mapping[str, str], cwd: Path, console: Console) -> int:
    cfg = load_cluster_config(config_path)
    paths = StatePaths(state_dir)
    with state_lock(paths, what="ff up"):
        old = read_record(paths)
        decision = decide_up(old, alive_map(old))
        if decision.verdict is UpVerdict.REFUSE:
            raise FailedPrecondition(
                f"a cluster is already running on state dir {paths.root} ({', '.join(decision.alive)} alive); "
                f"stop it with `ff down --state-dir {paths.root}` or use another --state-dir",
                state_dir=str(paths.root),
            )
        if decision.verdict is UpVerdict.STALE:
            console.print(f"replacing stale {paths.record}: none of its processes is running", highlight=False)
            remove_record(paths)
        paths.make()
        tokens = ensure_tokens(paths.tokens, services=[s.name for s in cfg.service])
        write_key_file(paths.capability_key)  # kept for the state dir's life, like the tokens

        nats: NatsRecord | None = None
        started: list[_Started] = []
        try:
            nats = _start_nats(cfg, paths, env, tokens)
            _start_services(cfg, paths, env, cwd, nats.url, tokens, started)
            record = ClusterRecord(state_dir=str(paths.root), config=str(Path(config_path).absolute()),
                                   started_at=time.time(), nats=nats, processes=[s.record for s in started],
                                   tokens_file=str(paths.tokens), spans_file=str(paths.spans), up_pid=os.getpid())
            write_record(paths, record)
            failures: list[_Failure] = []
            if started:
                with report.StartProgress(console, [s.record.instance for s in started]) as ui:
                    failures = asyncio.run(_wait_ready(started, ui))
        except BaseException as e:
            # Ctrl-C or an error mid-start: leave nothing running that no record names
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"failed: {type(e).__name__}"
            console.print(f"ff up {why}; stopping what was started", highlight=False, markup=False)
            _stop_started(console, paths, nats, started, cfg.cluster.stop_timeout_s)
            remove_record(paths)
            raise

        if failures:
            for f in failures:
                console.print(f"service {f.instance} {f.why}", style="red", highlight=False)
                report.print_tail(console, f"last {TAIL_LINES} lines of {f.log}", read_tail(f.log, TAIL_LINES))
            console.print("stopping the other processes", highlight=False)
            _stop_started(console, paths, nats, started, cfg.cluster.stop_timeout_s)
            remove_record(paths)
            return 1
        report.print_up_table(console, record)
        _make_homes(console, record, tokens)
        return 0


def _make_homes(console: Console, record: ClusterRecord, tokens: TokensFile) -> None:
    """A home for each user of the tokens file (see .homes); never fails ``ff up``."""
    metas = [p.address for p in record.processes if p.name == "meta"]
    if not metas:
        return
    try:
        homes = asyncio.run(make_homes(metas, home_users(tokens.tokens)))
    except (FireFlyerError, OSError) as e:
        console.print(f"homes: not made now ({e}); each is made on the user's first use (ff whoami)",
                      highlight=False, markup=False)
        return
    console.print(homes_line(homes), highlight=False, markup=False)


# ---------------------------------------------------------------------------- status


async def _row_for(p: ProcessRecord) -> StatusRow:
    is_alive = alive(p.pid, p.start_ticks)
    health: str | None = None
    if is_alive:
        try:
            health = await _health(p.address, timeout_s=1.0)
        except (Unavailable, DeadlineExceeded):
            health = "unreachable"
        except FireFlyerError as e:
            health = e.kind
    tail = [] if is_alive else read_tail(p.log, TAIL_LINES)
    return status_row(name=p.name, instance=p.instance, pid=p.pid, address=p.address, log=p.log, alive=is_alive,
                      health=health, log_tail=tail)


def _nats_row(n: NatsRecord) -> StatusRow:
    is_alive = alive(n.pid, n.start_ticks) if n.managed else True
    host, port = _host_port(n.url)
    reachable = is_alive and tcp_reachable(host, port)
    tail = read_tail(n.log, TAIL_LINES) if n.managed and not is_alive else []
    return nats_status_row(url=n.url, managed=n.managed, pid=n.pid, log=n.log, alive=is_alive,
                           reachable=reachable, log_tail=tail, command=n.command)


def _host_port(url: str) -> tuple[str, int]:
    # first server of a possibly comma-separated list: nats://host:port
    first = url.split(",")[0].strip()
    hostport = first.split("://", 1)[-1].rsplit("@", 1)[-1]
    host, _, port = hostport.rpartition(":")
    return (host or "127.0.0.1"), int(port or 4222)


async def _collect(record: ClusterRecord) -> list[StatusRow]:
    rows = await asyncio.gather(*(_row_for(p) for p in record.processes))
    return [_nats_row(live_nats(record.nats)), *rows]


def collect_status(record: ClusterRecord) -> list[StatusRow]:
    return asyncio.run(_collect(record))


def status(*, state_dir: Path, console: Console, as_json: bool) -> int:
    paths = StatePaths(state_dir)
    record = read_record(paths)
    if record is None:
        msg = f"no cluster is running on state dir {paths.root} (start one with `ff up --state-dir {paths.root}`)"
        if as_json:
            sys.stdout.write(msgspec.json.encode({"state_dir": str(paths.root), "running": False,
                                                   "healthy": False, "message": msg,
                                                   "processes": []}).decode() + "\n")
        else:
            console.print(msg, highlight=False, markup=False)
        return 1
    rows = collect_status(record)
    code = status_exit_code(rows)
    if as_json:
        doc = {"state_dir": record.state_dir, "running": True, "healthy": code == 0, "started_at": record.started_at,
               "tokens_file": record.tokens_file, "processes": rows}
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
    else:
        report.print_status(console, record.state_dir, rows)
    return code


# ---------------------------------------------------------------------------- metrics


def metrics_rows(record: ClusterRecord) -> list[dict[str, object]]:
    """One row per service process: name, instance, its metrics URL ("" where it has none)."""
    return [{"name": p.name, "instance": p.instance, "url": f"http://{p.metrics}/metrics" if p.metrics else ""}
            for p in record.processes]


def _scrape(url: str, timeout_s: float) -> tuple[str, bool]:
    """(what a GET of ``url`` found, whether it failed): "N samples" or the error."""
    import urllib.error
    import urllib.request

    from fireflyer.telemetry.metrics import families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own http URL
            text = resp.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return f"unreachable: {getattr(e, 'reason', e)}", True
    try:
        n = sum(len(f.samples) for f in families(text))
    except ValueError as e:
        return f"bad exposition: {e}", True
    return f"{n} samples", False


def metrics(*, state_dir: Path, console: Console, as_json: bool, scrape: bool, timeout_s: float = 2.0) -> int:
    """``ff metrics``: list (and with ``scrape`` fetch) every process's Prometheus endpoint.

    Exit code 1 when no cluster is recorded or, with ``scrape``, an endpoint did not answer."""
    paths = StatePaths(state_dir)
    record = read_record(paths)
    if record is None:
        console.print(f"no cluster is running on state dir {paths.root} (start one with `ff up --state-dir "
                      f"{paths.root}`)", highlight=False, markup=False)
        return 1
    rows = metrics_rows(record)
    failed = False
    if scrape:
        for r in rows:
            if not r["url"]:
                r["scrape"], r["error"] = "no endpoint recorded", True
            else:
                r["scrape"], r["error"] = _scrape(str(r["url"]), timeout_s)
            failed = failed or bool(r["error"])
    if as_json:
        sys.stdout.write(msgspec.json.encode({"state_dir": record.state_dir, "processes": rows}).decode() + "\n")
    else:
        report.print_metrics(console, record.state_dir, rows)
    return 1 if failed else 0


# ---------------------------------------------------------------------------- down


def down(*, state_dir: Path, timeout_s: float, console: Console) -> int:
    paths = StatePaths(state_dir)
    with state_lock(paths, what="ff down"):
        record = read_record(paths)
        if record is None:
            console.print(f"no cluster recorded in state dir {paths.root}; nothing to stop", highlight=False,
                          markup=False)
            return 0
        record = _with_live_nats(record)  # a NATS restarted since `up` is stopped too
        targets, gone = stop_targets(record, alive_map(record))
        outcomes = stop_processes(targets, timeout_s=timeout_s)
        pids: dict[str, int | None] = {p.instance: p.pid for p in record.processes}
        pids["nats"] = record.nats.pid
        ordered = {t.label: outcomes[t.label] for t in targets}
        ordered.update({label: StopOutcome.NOT_RUNNING for label in gone})
        report.print_down(console, f"ff down — {paths.root}", pids, ordered)
        if not record.nats.managed:
            console.print(f"nats at {record.nats.url} is external: left running", highlight=False, markup=False)
        survivors = [label for label, o in ordered.items() if o is StopOutcome.SURVIVED]
        if survivors:
            # keep the record: it still protects these from a second `ff up`
            console.print(f"still running after SIGKILL: {', '.join(survivors)}; {paths.record} kept",
                          style="red", highlight=False)
            return 1
        remove_record(paths)
        return 0
