"""Process control for the local cluster: observe, spawn, signal, stop.

Services run in a session of their own (``start_new_session``), so they
outlive ``ff up``, a Ctrl-C in its terminal does not reach them, and a signal
to the process group also reaches anything a service forked.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .decisions import ProcInfo, StopOutcome, StopTarget, is_ours, parse_proc_stat, stop_outcome, tail_lines

__all__ = [
    "observe",
    "alive",
    "spawn",
    "stop_processes",
    "read_tail",
    "free_ports",
    "ephemeral_port_range",
    "tcp_reachable",
    "port_free",
    "cmdline",
    "pids_matching",
    "read_pid_file",
]


def observe(pid: int) -> ProcInfo | None:
    """What the kernel says about ``pid`` now; None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        text = ""
    if text:
        state, ticks = parse_proc_stat(text)
        return ProcInfo(pid, ticks, zombie=state in ("Z", "X"))
    # no /proc (not Linux): existence is all we can learn
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # exists, owned by someone else
    return ProcInfo(pid, None)


def alive(pid: int | None, start_ticks: int | None) -> bool:
    return pid is not None and is_ours(start_ticks, observe(pid))


def spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists():
        # keep the previous run's log one generation back: the tail we show is this run's
        os.replace(log_path, log_path.with_name(log_path.name + ".1"))
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)


def _signal(t: StopTarget, sig: int) -> None:
    # check identity right before signalling: never signal a recycled pid
    if not alive(t.pid, t.start_ticks):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # a session leader we started leads its own group: signal the whole group
        if os.getpgid(t.pid) == t.pid:
            os.killpg(t.pid, sig)
        else:
            os.kill(t.pid, sig)


def _wait_gone(targets: Sequence[StopTarget], timeout_s: float, reap: Callable[[], None]) -> set[str]:
    """Poll (no sleeps as synchronisation: a deadline) until the targets are gone; return the labels gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        reap()
        gone = {t.label for t in targets if not alive(t.pid, t.start_ticks)}
        if len(gone) == len(targets) or time.monotonic() >= deadline:
            return gone
        time.sleep(0.02)


def stop_processes(targets: Sequence[StopTarget], *, timeout_s: float,
                   children: Sequence[subprocess.Popen[bytes]] = ()) -> dict[str, StopOutcome]:
    """SIGTERM every target, wait up to ``timeout_s``, SIGKILL the rest; the outcome per label.

    Phase by phase (``StopTarget.phase``, services before nats).  Within a phase
    targets are signalled in order but waited for together, so stopping N
    services costs one timeout, not N.  ``children`` are Popen objects of our
    own children, polled so that they are reaped instead of lingering as zombies.
    """
    outcomes: dict[str, StopOutcome] = {}
    for phase in sorted({t.phase for t in targets}):
        outcomes.update(_stop_phase([t for t in targets if t.phase == phase], timeout_s, children))
    return outcomes


def _stop_phase(targets: Sequence[StopTarget], timeout_s: float,
                children: Sequence[subprocess.Popen[bytes]]) -> dict[str, StopOutcome]:
    def reap() -> None:
        for c in children:
            c.poll()

    outcomes: dict[str, StopOutcome] = {}
    for t in targets:
        _signal(t, signal.SIGTERM)
    gone_term = _wait_gone(targets, timeout_s, reap)
    left = [t for t in targets if t.label not in gone_term]
    for t in left:
        _signal(t, signal.SIGKILL)
    gone_kill = _wait_gone(left, 5.0, reap) if left else set()
    for t in targets:
        outcomes[t.label] = stop_outcome(gone_after_term=t.label in gone_term, gone_after_kill=t.label in gone_kill)
    return outcomes


def read_tail(path: str | Path | None, n: int = 20, *, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``n`` lines of a log (reading at most its last ``max_bytes``)."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    return tail_lines(data.decode("utf-8", errors="replace"), n)


#: lowest port :func:`free_ports` hands out below the ephemeral range: under it sit the
#: registered ports of services a machine commonly runs (PostgreSQL, NATS, Redis, ...)
PORT_FLOOR = 20000
_PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux default 32768-60999)."""
    try:
        lo, hi = (int(x) for x in Path(_PORT_RANGE_FILE).read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now on ``host`` (``0.0.0.0``: on every address).

    The service binds it a moment later; another process could take it in
    between, which then shows up as a start-up failure with the bind error in the log.
    So the ports come from *below* the kernel's ephemeral range, where there is room:
    a port the kernel picks itself (``bind(0)``) comes from that range, and every
    outgoing connection of every process draws its local port from it too, so a
    launcher that opens many connections (an allreduce benchmark's ranks, say) would
    sooner or later hand one of them the port it had just picked for Gloo's store
    (a benchmark run failed that way: ``EADDRINUSE`` on ``MASTER_PORT``).  Ports
    below the range are only ever taken by an explicit bind.  Random candidates,
    so that concurrent callers rarely try the same one.
    """
    lo, _ = ephemeral_port_range()
    socks: list[socket.socket] = []

    def take(port: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((host, port))
        except OSError:
            s.close()
            if port == 0:
                raise
            return
        socks.append(s)

    try:
        room = lo - PORT_FLOOR
        if room >= 64 * n:
            for port in random.sample(range(PORT_FLOOR, lo), min(room, 32 * n)):
                if len(socks) == n:
                    break
                take(port)
        while len(socks) < n:  # no room below the range (or all tried were busy): the kernel's pick
            take(0)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tcp_reachable(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    """Can a server bind ``host:port`` now?"""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT does not count
        s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def cmdline(pid: int) -> list[str] | None:
    """The command line of ``pid`` (None: no such process, or no /proc)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] or None


def pids_matching(pred: Callable[[list[str]], bool]) -> list[int]:
    """Pids whose command line satisfies ``pred`` (a /proc scan; empty without /proc)."""
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if name.isdigit():
            argv = cmdline(int(name))
            if argv and pred(argv):
                out.append(int(name))
    return out


def read_pid_file(path: str | Path | None) -> int | None:
    if not path:
        return None
    try:
        pid = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None
