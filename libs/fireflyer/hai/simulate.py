"""Simulate mode: run a command locally as a node agent would run one rank of a task, and raise
its suspend flag after a while (``ff task run --simulate-suspend-after S -- CMD``; HAI's
``hai-cli python train.py ++ -ss S -ls N``).

The command gets ``FF_SUSPEND_FILE`` (in a temporary task directory), ``FF_HAI_SIMULATE`` and the
whole-life state (``FF_WHOLE_LIFE_STATE``, ``MARSV2_WHOLE_LIFE_STATE``), so :mod:`fireflyer.hai`
behaves as in a cluster: the flag goes up after ``suspend_after_s`` seconds, and once the command
calls ``go_suspend()`` it is stopped (SIGTERM to its process group, SIGKILL after ``grace_s``), as
the agents would stop it.  The command runs in a session of its own, like a rank.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from fireflyer.node.env import SUSPEND_FILE_ENV
from fireflyer.node.runtime import CAN_SUSPEND, read_ack, read_whole_life_state
from fireflyer.node.suspend import encode_flag

from . import SIMULATE_ENV

__all__ = ["SimulateResult", "simulate"]


class SimulateResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int
    #: the command called go_suspend() and was stopped
    suspended: bool
    #: when the flag went up and when go_suspend() was seen, seconds after the start (None: never)
    flag_at_s: float | None
    go_suspend_at_s: float | None
    whole_life_state: int


def _raise_flag(path: Path) -> None:
    tmp = path.with_name(".suspend.tmp")
    tmp.write_bytes(encode_flag("simulated by ff task run --simulate-suspend-after"))
    os.replace(tmp, path)


def _stop(p: subprocess.Popen[bytes], grace_s: float) -> int:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        return p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        return p.wait()


def simulate(command: Sequence[str], *, suspend_after_s: float | None, whole_life_state: int = 0,
             grace_s: float = 5.0, poll_s: float = 0.05, env: Mapping[str, str] | None = None,
             log: bool = True) -> SimulateResult:
    if not command:
        raise ValueError("simulate needs a command")
    task_dir = Path(tempfile.mkdtemp(prefix="ff-simulate-"))
    flag = task_dir / "suspend"
    child_env = dict(os.environ if env is None else env)
    child_env.update({SUSPEND_FILE_ENV: str(flag), SIMULATE_ENV: f"simulate-{os.getpid()}",
                      "FF_WHOLE_LIFE_STATE": str(whole_life_state), "MARSV2_WHOLE_LIFE_STATE": str(whole_life_state),
                      "FF_RESTART_COUNT": child_env.get("FF_RESTART_COUNT", "0")})
    child_env.pop("FF_TASK_ID", None)  # not a cluster task: set_priority stays local
    start = time.monotonic()
    flag_at = go_at = None
    suspended = False
    p = subprocess.Popen(list(command), env=child_env, start_new_session=True)
    try:
        while p.poll() is None:
            now = time.monotonic() - start
            if flag_at is None and suspend_after_s is not None and now >= suspend_after_s:
                _raise_flag(flag)
                flag_at = now
                if log:
                    print(f"ff task run: suspend flag raised after {now:.1f} s (simulated)", file=sys.stderr)
            if read_ack(task_dir) == CAN_SUSPEND:
                go_at = now
                suspended = True
                if log:
                    print(f"ff task run: go_suspend() after {now:.1f} s: stopping the command, as the cluster "
                          "would (its next run resumes from its checkpoint)", file=sys.stderr)
                _stop(p, grace_s)
                break
            time.sleep(poll_s)
        code = p.wait()
    except KeyboardInterrupt:
        code = _stop(p, grace_s)
    finally:
        wls = read_whole_life_state(task_dir)
        shutil.rmtree(task_dir, ignore_errors=True)
    return SimulateResult(exit_code=code, suspended=suspended, flag_at_s=flag_at, go_suspend_at_s=go_at,
                          whole_life_state=whole_life_state if wls is None else wls)
