"""Process control for the local cluster: observe, spawn, signal, stop.

Services run in a session of their own (``start_new_session``), so they
outlive ``ff up``, a Ctrl-C in its terminal does not reach them, and a signal
to the process group also reaches anything a service forked.
"""

from __future__ import annotations

import contextlib
import os
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
    "tcp_reachable",
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


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (held open together, so no duplicates among them).

    The service binds it a moment later; another process could take it in
    between, which then shows up as a start-up failure with the bind error in the log.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
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
