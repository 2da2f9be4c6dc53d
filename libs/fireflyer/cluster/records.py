"""What ``ff up`` leaves in the state dir, and how it is read back.

    <state>/cluster.json   ClusterRecord: pids (with their start times), ports, addresses
    <state>/tokens.json    bearer tokens (admin, the local user, one svc-<name> per service), mode 0600
    <state>/logs/          one log per process (<instance>.log, nats.log)
    <state>/nats/          the JetStream store of the managed nats-server
    <state>/nats.port      the managed nats-server's client port, kept for the life of the state dir
    <state>/nats.pid       written by nats-server itself (-P): finds a restarted one again
    <state>/nats.conf      the managed nats-server's config; it includes nats-auth.conf (0600), the
                           NATS users made from tokens.json (fireflyer.cluster.natsauth)
    <state>/spans.jsonl    the span file every service appends to
    <state>/cluster.lock   flock'd by up/down so two of them never interleave

Each process record keeps the pid's start time (clock ticks since boot, from
``/proc/<pid>/stat``): a pid alone may have been recycled by the time
``ff down`` runs, and ``ff down`` must signal only what ``ff up`` started.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from fireflyer.core.errors import FailedPrecondition, FireFlyerError, SettingsError
from fireflyer.rpc.auth import SERVICE_ROLE, TokenEntry, generate_token, validate_entries, write_tokens_file

__all__ = [
    "NatsRecord",
    "ProcessRecord",
    "ClusterRecord",
    "StatePaths",
    "read_record",
    "write_record",
    "remove_record",
    "read_nats_port",
    "write_nats_port",
    "write_atomic",
    "TokenEntry",
    "TokensFile",
    "SERVICE_USER_PREFIX",
    "service_user",
    "ensure_tokens",
    "read_tokens",
    "state_lock",
]

RECORD_VERSION = 1


class NatsRecord(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    #: False: an external server (FF_NATS_URL or [nats] url); ff down leaves it alone
    managed: bool
    pid: int | None = None
    start_ticks: int | None = None
    port: int | None = None
    log: str | None = None
    #: nats-server's own pid file (``-P``); a server restarted with ``command`` rewrites it
    pid_file: str | None = None
    #: the command line that started it: run it again to restart NATS on the same port and store
    command: list[str] = msgspec.field(default_factory=list)


class ProcessRecord(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    instance: str
    module: str
    pid: int
    #: /proc/<pid>/stat starttime; None where /proc is missing (then only the pid is checked)
    start_ticks: int | None
    address: str
    log: str
    started_at: float
    #: ``host:port`` of its Prometheus endpoint (``GET /metrics``); "" if ff up gave it none
    metrics: str = ""
    #: "host:port" of its HTTP server, for a service with ``http = true`` (the dashboard); else ""
    http_address: str = ""


class ClusterRecord(msgspec.Struct, frozen=True, kw_only=True):
    state_dir: str
    config: str
    started_at: float
    nats: NatsRecord
    processes: list[ProcessRecord]
    tokens_file: str
    spans_file: str
    version: int = RECORD_VERSION
    #: the pid of the `ff up` that wrote this (diagnostics only)
    up_pid: int = 0


class StatePaths:
    """Every path under one state dir, in one place."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.root = Path(state_dir).absolute()

    @property
    def record(self) -> Path:
        return self.root / "cluster.json"

    @property
    def lock(self) -> Path:
        return self.root / "cluster.lock"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens.json"

    @property
    def capability_key(self) -> Path:
        """The key meta and the storage nodes share to sign chunk capabilities (0600)."""
        return self.root / "capability.key"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def nats_store(self) -> Path:
        return self.root / "nats"

    @property
    def nats_port(self) -> Path:
        return self.root / "nats.port"

    @property
    def nats_pid(self) -> Path:
        return self.root / "nats.pid"

    @property
    def spans(self) -> Path:
        return self.root / "spans.jsonl"

    def log_for(self, instance: str) -> Path:
        return self.logs / f"{instance}.log"

    def make(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.nats_store.mkdir(parents=True, exist_ok=True)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write via a temp file and rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed or (for an existing tmp) widened it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_record(paths: StatePaths, record: ClusterRecord) -> None:
    write_atomic(paths.record, msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n")


def read_record(paths: StatePaths) -> ClusterRecord | None:
    """The cluster record, or None when there is none."""
    try:
        raw = paths.record.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(raw, type=ClusterRecord)
    except msgspec.DecodeError as e:
        raise FailedPrecondition(
            f"{paths.record} is unreadable ({e}); stop its processes by hand and remove it",
            path=str(paths.record),
        ) from e


def read_nats_port(paths: StatePaths) -> int | None:
    """The port recorded for this state dir's nats-server, or None (none yet, or unreadable)."""
    try:
        port = int(paths.nats_port.read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def write_nats_port(paths: StatePaths, port: int) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.nats_port, f"{port}\n".encode())


def remove_record(paths: StatePaths) -> None:
    with contextlib.suppress(FileNotFoundError):
        paths.record.unlink()


class TokensFile(msgspec.Struct, frozen=True):
    """The tokens file as ``ff up`` writes it; entries are ``fireflyer.rpc.auth.TokenEntry``."""

    tokens: list[TokenEntry]

    def for_role(self, role: str) -> TokenEntry | None:
        """The first entry with ``role`` that a client can use: a plain ``token`` (not a hash),
        neither revoked nor expired."""
        now = time.time()
        return next((t for t in self.tokens if role in t.roles and t.token and t.state(now) == "active"), None)

    def for_service(self, name: str) -> TokenEntry | None:
        """The credential ``ff up`` gives the processes of service ``name`` (user ``svc-<name>``,
        role ``service``): plain, neither revoked nor expired."""
        now = time.time()
        user = service_user(name)
        return next((t for t in self.tokens if t.user == user and SERVICE_ROLE in t.roles and t.token
                     and t.state(now) == "active"), None)


#: user names of the cluster's own credentials start with this (``ff admin users add`` refuses it)
SERVICE_USER_PREFIX = "svc-"


def service_user(name: str) -> str:
    """The user of service ``name``'s credential: ``svc-<name>`` (``svc-storage``, ``svc-meta``)."""
    return f"{SERVICE_USER_PREFIX}{name}"


def read_tokens(path: Path) -> TokensFile:
    try:
        tf = msgspec.json.decode(path.read_bytes(), type=TokensFile)
        validate_entries(tf.tokens, source=str(path))
        return tf
    except FileNotFoundError as e:
        raise SettingsError(f"tokens file {path} does not exist (ff up writes it)", key="auth.tokens_file",
                            source=str(path)) from e
    except msgspec.DecodeError as e:
        raise SettingsError(f"tokens file {path} is not valid: {e}", key="auth.tokens_file", source=str(path)) from e


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return f"uid{os.getuid()}"


def ensure_tokens(path: Path, services: Sequence[str] = ()) -> TokensFile:
    """Keep a valid tokens file (clients may hold its tokens); otherwise write a fresh one, mode 0600.

    Valid: a usable admin entry, a usable user entry, and a usable service credential
    (``svc-<name>``, role ``service``) for each of ``services``.  What is missing is added
    fresh; every other entry is kept."""
    entries: list[TokenEntry] = []
    if path.exists():
        try:
            existing = read_tokens(path)
        except FireFlyerError:
            existing = None
        if (existing is not None and existing.for_role("admin") and existing.for_role("user")
                and all(existing.for_service(s) for s in services)):
            os.chmod(path, 0o600)
            return existing
        if existing is not None:
            # keep the users added with ff admin users; only the missing entries are made new
            entries = list(existing.tokens)
    if not TokensFile(entries).for_role("admin"):
        entries.append(TokenEntry(token=generate_token(), user="admin", roles=["admin"]))
    if not TokensFile(entries).for_role("user"):
        entries.append(TokenEntry(token=generate_token(), user=_local_user(), roles=["user"]))
    for name in dict.fromkeys(services):
        if not TokensFile(entries).for_service(name):
            entries.append(TokenEntry(token=generate_token(), user=service_user(name), roles=[SERVICE_ROLE]))
    write_tokens_file(path, entries)
    return TokensFile(entries)


@contextlib.contextmanager
def state_lock(paths: StatePaths, *, what: str) -> Iterator[None]:
    """Hold ``cluster.lock`` (flock) so up and down on one state dir never interleave.

    Non-blocking: a second caller fails at once naming the state dir rather than
    waiting behind a start-up that may take a while.  Child processes do not
    inherit the descriptor (subprocess closes fds), so the lock dies with us.
    """
    paths.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise FailedPrecondition(
                f"another ff up/down is running on state dir {paths.root}; wait for it, then retry {what}",
                state_dir=str(paths.root),
            ) from e
        yield
    finally:
        os.close(fd)
