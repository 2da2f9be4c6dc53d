"""Pure decisions of ``ff up`` / ``status`` / ``down``: observations in, decisions out.

Nothing here touches processes, files or sockets, so every rule (is this pid
still ours, may ``up`` start, what to signal and in which order, what a status
row says) is tested with plain values; ``supervisor`` feeds it observations.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import msgspec

from .records import ClusterRecord

__all__ = [
    "ProcInfo",
    "parse_proc_stat",
    "is_ours",
    "UpVerdict",
    "UpDecision",
    "decide_up",
    "StopTarget",
    "MGMTD_PHASE",
    "NATS_PHASE",
    "stop_phase",
    "stop_targets",
    "StopOutcome",
    "stop_outcome",
    "StatusRow",
    "status_row",
    "nats_status_row",
    "status_exit_code",
    "tail_lines",
    "SERVING",
    "choose_nats_port",
    "is_nats_on_port",
]

SERVING = "SERVING"
#: health of the nats row when its port accepts a connection
NATS_REACHABLE = "reachable"


class ProcInfo(msgspec.Struct, frozen=True):
    """What /proc says about a pid right now."""

    pid: int
    #: clock ticks after boot at which the process started; None where unknown
    start_ticks: int | None
    #: exited but not yet reaped by its parent: dead for every purpose here
    zombie: bool = False


def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state letter, start time in ticks) from the text of ``/proc/<pid>/stat``.

    The command name (field 2) is in parentheses and may itself contain spaces
    and ')', so split after the *last* ')'.  Fields after it start at field 3
    (state); starttime is field 22.
    """
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[19])


def is_ours(recorded_ticks: int | None, seen: ProcInfo | None) -> bool:
    """Is the recorded process still alive as the *same* process?

    A pid whose start time differs was recycled by the kernel for someone
    else's process: it must be treated as gone and never signalled.
    """
    if seen is None or seen.zombie:
        return False
    if recorded_ticks is None or seen.start_ticks is None:
        return True  # no /proc: the pid is all we have
    return seen.start_ticks == recorded_ticks


class UpVerdict(enum.Enum):
    FRESH = "fresh"  # no record: start
    STALE = "stale"  # a record whose processes are all gone: replace it
    REFUSE = "refuse"  # something recorded still runs: do not start twice


class UpDecision(msgspec.Struct, frozen=True):
    verdict: UpVerdict
    #: labels (instance names, "nats") of the recorded processes still alive
    alive: list[str]


def decide_up(record: ClusterRecord | None, alive: Mapping[str, bool]) -> UpDecision:
    """May ``ff up`` start on a state dir holding ``record``? ``alive`` maps label -> is_ours."""
    if record is None:
        return UpDecision(UpVerdict.FRESH, [])
    labels = [p.instance for p in record.processes]
    if record.nats.managed:
        labels.append("nats")
    live = [label for label in labels if alive.get(label, False)]
    return UpDecision(UpVerdict.REFUSE if live else UpVerdict.STALE, live)


class StopTarget(msgspec.Struct, frozen=True):
    label: str
    pid: int
    start_ticks: int | None
    #: targets of a later phase are signalled only after every earlier one is gone
    #: (:func:`stop_phase`: the services, then mgmtd, then nats)
    phase: int = 0


#: mgmtd stops after the services that report to it: a storage node that stops cleanly tells
#: mgmtd its targets are offline, so that they leave their chains at once (a restarted node then
#: rejoins without waiting out mgmtd's heartbeat fail interval, ~25 s on the local cluster)
MGMTD_PHASE = 1
#: nats last: services (mgmtd too) drain their NATS connections while it still runs
NATS_PHASE = 2


def stop_phase(service: str) -> int:
    """The stop phase of a service of the cluster file (by its name: ``mgmtd``, ``storage``, ...)."""
    return MGMTD_PHASE if service == "mgmtd" else 0


def stop_targets(record: ClusterRecord, alive: Mapping[str, bool]) -> tuple[list[StopTarget], list[str]]:
    """What ``ff down`` signals, in order, and the labels that were already gone.

    Services go first, newest first, then mgmtd (:data:`MGMTD_PHASE`), and nats last, so
    services can drain their NATS connections while the server is still there.  An external nats server
    (``managed`` false) is never ours to stop.
    """
    targets: list[StopTarget] = []
    gone: list[str] = []
    for p in reversed(record.processes):
        if alive.get(p.instance, False):
            targets.append(StopTarget(p.instance, p.pid, p.start_ticks, phase=stop_phase(p.name)))
        else:
            gone.append(p.instance)
    n = record.nats
    if n.managed and n.pid is not None:
        if alive.get("nats", False):
            targets.append(StopTarget("nats", n.pid, n.start_ticks, phase=NATS_PHASE))
        else:
            gone.append("nats")
    return targets, gone


class StopOutcome(enum.Enum):
    STOPPED = "stopped"  # exited after SIGTERM
    KILLED = "killed"  # still there after the timeout: SIGKILL
    NOT_RUNNING = "was not running"
    SURVIVED = "still running"  # even SIGKILL did not remove it (uninterruptible sleep)


def stop_outcome(*, gone_after_term: bool, gone_after_kill: bool) -> StopOutcome:
    if gone_after_term:
        return StopOutcome.STOPPED
    return StopOutcome.KILLED if gone_after_kill else StopOutcome.SURVIVED


class StatusRow(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    instance: str
    pid: int | None
    address: str
    #: running | crashed | external
    state: str
    #: SERVING / NOT_SERVING / UNKNOWN / SERVICE_UNKNOWN / unreachable / reachable / -
    health: str
    exit_code: int | None = None
    log: str | None = None
    log_tail: list[str] = msgspec.field(default_factory=list)
    #: a crashed managed nats: the command line that starts it again (same port and store)
    restart_command: list[str] = msgspec.field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.state in ("running", "external") and self.health in (SERVING, NATS_REACHABLE)


def status_row(*, name: str, instance: str, pid: int, address: str, log: str, alive: bool,
               health: str | None, exit_code: int | None = None, log_tail: Sequence[str] = ()) -> StatusRow:
    """One service's row.  A recorded process that is gone while its record is
    still there died without ``ff down``: it crashed (or was killed)."""
    if alive:
        return StatusRow(name=name, instance=instance, pid=pid, address=address, state="running",
                         health=health or "unreachable", log=log)
    return StatusRow(name=name, instance=instance, pid=pid, address=address, state="crashed", health="-",
                     exit_code=exit_code, log=log, log_tail=list(log_tail))


def nats_status_row(*, url: str, managed: bool, pid: int | None, log: str | None, alive: bool,
                    reachable: bool, log_tail: Sequence[str] = (), command: Sequence[str] = ()) -> StatusRow:
    health = NATS_REACHABLE if reachable else "unreachable"
    if not managed:
        return StatusRow(name="nats", instance="nats", pid=None, address=url, state="external", health=health)
    if alive:
        return StatusRow(name="nats", instance="nats", pid=pid, address=url, state="running", health=health, log=log)
    return StatusRow(name="nats", instance="nats", pid=pid, address=url, state="crashed", health="-", log=log,
                     log_tail=list(log_tail), restart_command=list(command))


def status_exit_code(rows: Sequence[StatusRow]) -> int:
    """0 when every process runs and answers; 1 otherwise (scripts poll on it)."""
    return 0 if rows and all(r.healthy for r in rows) else 1


def tail_lines(text: str, n: int = 20) -> list[str]:
    """The last ``n`` non-empty-trailing lines of a log."""
    lines = text.rstrip("\n").splitlines()
    return lines[-n:] if n > 0 else []


def choose_nats_port(*, configured: int, recorded: int | None, recorded_free: bool) -> int:
    """The port ``ff up`` gives the managed nats-server; 0: pick a free one (and record it).

    A port set in the cluster file wins.  Otherwise the port recorded in the state dir is
    kept for its whole life, so a NATS restarted later (by hand, with its recorded command
    line) comes back where every service looks for it; only if something else holds that
    port now does a fresh ``ff up`` (whose services all get the new URL) move.
    """
    if configured > 0:
        return configured
    if recorded is not None and recorded_free:
        return recorded
    return 0


_PORT_FLAGS = ("-p", "-port", "--port")


def is_nats_on_port(argv: Sequence[str], port: int) -> bool:
    """Is ``argv`` (a process's command line) a nats-server serving clients on ``port``?"""
    if not argv or not argv[0].rsplit("/", 1)[-1].startswith("nats-server"):
        return False
    want = str(port)
    for i, arg in enumerate(argv[1:], start=1):
        if arg in _PORT_FLAGS and i + 1 < len(argv) and argv[i + 1] == want:
            return True
        flag, eq, value = arg.partition("=")
        if eq and flag in _PORT_FLAGS and value == want:
            return True
    return False
