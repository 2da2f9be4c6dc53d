"""The suspend flag a node agent raises for a task, and how a task's process reads it.

**Delivery.**  Suspend(task) on an agent writes one file per task on that node,
``<state_dir>/node/<node>/tasks/<task>/suspend``, whose path every rank of the task gets
as ``FF_SUSPEND_FILE``.  The flag is up while the file exists; its content is one JSON
object (:class:`SuspendFlag`: when it was raised and why).  A file rather than HAI's 1-byte
SysV shared-memory segment: it needs no IPC namespace, survives an agent restart, is
visible to every process of the task on the node (HAI's reached rank 0's node only; the
scheduler raises it on every node of the task), and polling it is one ``stat`` --
cheap enough to do every training step.  Optionally the agent also sends a POSIX signal to
every rank's process group (Slurm's ``--signal``), for programs that would rather be
interrupted than poll.  The runtime API (``receive_suspend_command``) builds on
:func:`suspend_requested`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from .env import SUSPEND_FILE_ENV

__all__ = ["SuspendFlag", "suspend_requested", "read_flag", "encode_flag"]


class SuspendFlag(msgspec.Struct, frozen=True, kw_only=True):
    raised_at: float
    reason: str = ""


def encode_flag(reason: str, *, now: float | None = None) -> bytes:
    return msgspec.json.encode(SuspendFlag(raised_at=time.time() if now is None else now, reason=reason))


def suspend_requested(env: Mapping[str, str] | None = None) -> bool:
    """True while this process's task has a suspend pending on this node (False outside a task)."""
    path = (os.environ if env is None else env).get(SUSPEND_FILE_ENV)
    return bool(path) and os.path.exists(path)


def read_flag(path: str | Path) -> SuspendFlag | None:
    """The flag's content, or None when it is down (or half written: the agent renames it into place)."""
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=SuspendFlag)
    except (FileNotFoundError, msgspec.DecodeError):
        return None
