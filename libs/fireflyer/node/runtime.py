"""What a task's processes tell their node agent, as files beside the suspend flag.

The runtime API (:mod:`fireflyer.hai`) runs inside a rank; the scheduler must learn of its
acknowledgement of a suspend, its ``go_suspend()`` and its whole-life state.  Ranks do not call
the scheduler for that (``NodeService.Report`` is the agents' channel, role ``service``, and a
rank holds only its user's token): they write small files into the task's directory on their
node, ``dirname(FF_SUSPEND_FILE)``, and the agent reports what it finds (``services.node.schedlink``):

    suspend_ack        "2" (received: the runtime saw the flag) or "3" (can suspend: go_suspend)
    whole_life_state   the chain's state integer (decimal)
    watchdog_s         the task's no-output watchdog, as the runtime set it (seconds)

Every write is a rename into place from a name of its own, so ranks of one node writing at once
never leave half a file, and the agent never reads one.  The handshake only moves forward: an
"ack" never overwrites a "go_suspend".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .env import SUSPEND_FILE_ENV

__all__ = ["ACK_FILE", "WLS_FILE", "WATCHDOG_FILE", "write_watchdog", "read_watchdog", "RECEIVED", "CAN_SUSPEND", "task_dir_of", "write_ack", "write_whole_life_state",
           "read_ack", "read_whole_life_state"]

ACK_FILE = "suspend_ack"
WLS_FILE = "whole_life_state"
WATCHDOG_FILE = "watchdog_s"
RECEIVED = 2
CAN_SUSPEND = 3


def task_dir_of(env: Mapping[str, str] | None = None) -> Path | None:
    """The task's directory on this node (None outside a task started by an agent)."""
    path = (os.environ if env is None else env).get(SUSPEND_FILE_ENV)
    return Path(path).parent if path else None


def _put(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _get_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def write_ack(task_dir: Path, code: int) -> None:
    """Record the handshake step ``code`` (2 or 3); a lower step never replaces a higher one."""
    if code not in (RECEIVED, CAN_SUSPEND):
        raise ValueError(f"suspend acknowledgement must be {RECEIVED} or {CAN_SUSPEND}, got {code}")
    if (read_ack(task_dir) or 0) >= code:
        return
    _put(task_dir / ACK_FILE, str(code))


def read_ack(task_dir: Path) -> int | None:
    return _get_int(task_dir / ACK_FILE)


def write_whole_life_state(task_dir: Path, state: int) -> None:
    _put(task_dir / WLS_FILE, str(int(state)))


def read_whole_life_state(task_dir: Path) -> int | None:
    return _get_int(task_dir / WLS_FILE)


def write_watchdog(task_dir: Path, seconds: float) -> None:
    _put(task_dir / WATCHDOG_FILE, repr(float(seconds)))


def read_watchdog(task_dir: Path) -> float | None:
    try:
        return float((task_dir / WATCHDOG_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
