"""The HAI Platform runtime API for training code (``hfai.client``'s calls; issue 49).

    from fireflyer import hai

    start = resume_from_latest_checkpoint()
    for step in range(start, steps):
        train_step()
        if hai.suspend_requested(comm):     # every rank agrees (HFReduce max), so all save at this step
            save_checkpoint(step + 1)
            hai.go_suspend()                # never returns: the node agents stop the task

Inside a task the scheduler started (``FF_TASK_ID`` set by the node agent):

- the suspend flag is the file ``FF_SUSPEND_FILE`` the agent raises on *every* node of the task
  (HAI raised it on rank 0's node only);
- :func:`receive_suspend_command` is True while it is up, and the first time a process sees it, it
  acknowledges (HAI's ``suspend_code`` 2) -- the node agent reports that to the scheduler, which then
  gives the task ``grace_final_s`` to save instead of stopping it after ``grace_ack_s``;
- :func:`go_suspend` says the task may be stopped now (``suspend_code`` 3) and waits to be stopped;
- :func:`set_whole_life_state` / :func:`get_whole_life_state`: an integer the chain carries across
  its runs (``FF_WHOLE_LIFE_STATE``, HAI's ``MARSV2_WHOLE_LIFE_STATE``);
- :func:`set_priority` changes the chain's priority (``TaskService.UpdatePriority`` with the task's
  own ``FF_TOKEN``, its user's);
- :func:`set_watchdog_time`: a task whose ranks print nothing for this long is stopped as failed
  (TIMEOUT) by its node agents.

The runtime never calls the scheduler for the handshake: it writes files beside the flag
(:mod:`fireflyer.node.runtime`) and the node agent reports them, so ranks need no service
credential and a handshake survives a scheduler failover.

Outside a cluster (no ``FF_TASK_ID``) every call is a no-op: no suspend is ever requested,
``go_suspend`` returns, the whole-life state is kept in the process.  Simulate mode
(``ff task run --simulate-suspend-after S -- CMD``, HAI's ``hai-cli ... ++ -ss S``) runs CMD
locally with a flag that goes up after S seconds, and stops CMD once it calls ``go_suspend``.
"""

from __future__ import annotations

import enum
import os
import sys
import time
from typing import Any

from fireflyer.node import runtime as _rt
from fireflyer.node.env import SUSPEND_FILE_ENV

__all__ = ["EXP_PRIORITY", "in_cluster", "receive_suspend_command", "suspend_requested", "go_suspend",
           "set_whole_life_state", "get_whole_life_state", "set_watchdog_time", "get_watchdog_time", "set_priority",
           "SIMULATE_ENV"]

#: set by ``ff task run --simulate-suspend-after`` (the simulated task's id)
SIMULATE_ENV = "FF_HAI_SIMULATE"


class EXP_PRIORITY(enum.IntEnum):  # noqa: N801 -- HAI's name, so scripts written for hfai run unchanged
    EXTREME_HIGH = 50
    VERY_HIGH = 40
    HIGH = 30
    ABOVE_NORMAL = 20
    NORMAL = 10
    UNDER_NORMAL = 8
    BELOW_NORMAL = 5
    LOW = 0
    AUTO = -1


_local_state: dict[str, int] = {}
_acked = False


def in_cluster() -> bool:
    """Inside a task started by a node agent, or under simulate mode."""
    return bool(os.environ.get("FF_TASK_ID") or os.environ.get(SIMULATE_ENV)) and bool(os.environ.get(SUSPEND_FILE_ENV))


def _flag_up() -> bool:
    path = os.environ.get(SUSPEND_FILE_ENV)
    return bool(path) and os.path.exists(path)  # type: ignore[arg-type]


def receive_suspend_command(timeout: float = 500, raise_exception: bool = False) -> bool:
    """True while the scheduler asks this task to suspend (on this node); the first True acknowledges.

    ``timeout`` and ``raise_exception`` are HAI's (its call went over a socket); reading the flag is
    one ``stat`` here, so they do not apply."""
    global _acked
    if not in_cluster() or not _flag_up():
        return False
    if not _acked:
        d = _rt.task_dir_of()
        if d is not None:
            _rt.write_ack(d, _rt.RECEIVED)
        _acked = True
    return True


def suspend_requested(comm: Any = None) -> bool:
    """:func:`receive_suspend_command`, agreed across every rank: with ``comm`` (an HFReduce
    communicator, ``fireflyer.hfreduce.init()``, or anything with ``allreduce(array, op=)``) the flag
    is an allreduce max of 0/1, so if any rank has seen it, all return True at the same step.  It is
    a collective then: every rank must call it at the same points."""
    local = receive_suspend_command()
    if comm is None:
        return local
    import numpy as np

    flag = np.array([1.0 if local else 0.0], dtype=np.float32)
    out = comm.allreduce(flag, op="max")
    return bool((flag if out is None else out)[0] > 0)


def go_suspend(timeout: float = 500, raise_exception: bool = False) -> None:
    """Tell the scheduler this task may be stopped now (its checkpoint is saved); then wait for the
    node agent's SIGTERM.  Never returns inside a cluster (as HAI's); a no-op outside one."""
    if not in_cluster():
        return
    d = _rt.task_dir_of()
    if d is not None:
        _rt.write_ack(d, _rt.CAN_SUSPEND)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    while True:  # the agents stop the task; a missed stop is the scheduler's grace_final_s's to catch
        time.sleep(3600)


def get_whole_life_state() -> int:
    """The chain's state integer: what this run set, else what the chain carried in, else 0."""
    if in_cluster():
        d = _rt.task_dir_of()
        if d is not None and (v := _rt.read_whole_life_state(d)) is not None:
            return v
    if "whole_life_state" in _local_state:
        return _local_state["whole_life_state"]
    for var in ("FF_WHOLE_LIFE_STATE", "MARSV2_WHOLE_LIFE_STATE"):
        if os.environ.get(var, "").lstrip("-").isdigit():
            return int(os.environ[var])
    return 0


def set_whole_life_state(state: int) -> None:
    """Set the chain's state integer (32 bits, as HAI's); the chain's next run starts with it."""
    if isinstance(state, bool) or not isinstance(state, int) or not -(2**31) <= state < 2**31:
        raise ValueError(f"whole_life_state must be a 32-bit integer, got {state!r}")
    _local_state["whole_life_state"] = state
    if in_cluster():
        d = _rt.task_dir_of()
        if d is not None:
            _rt.write_whole_life_state(d, state)


def get_watchdog_time() -> float:
    if in_cluster():
        d = _rt.task_dir_of()
        if d is not None and (v := _rt.read_watchdog(d)) is not None:
            return v
    return float(os.environ.get("FF_WATCHDOG_S") or 1800.0)


def set_watchdog_time(seconds: float) -> None:
    """A task whose ranks print nothing for ``seconds`` is stopped as failed (TIMEOUT); HAI's default 1800."""
    if not seconds > 0:
        raise ValueError(f"watchdog time must be positive seconds, got {seconds!r}")
    if in_cluster():
        d = _rt.task_dir_of()
        if d is not None:
            _rt.write_watchdog(d, float(seconds))


def set_priority(priority: int | str | EXP_PRIORITY) -> None:
    """Change this task's chain's priority (HAI's levels or their names); it may be interrupted at once
    if its user has no quota at the new level.  A no-op outside a cluster (and in simulate mode)."""
    if isinstance(priority, str):
        name = priority.upper()
        if name not in EXP_PRIORITY.__members__:
            raise ValueError(f"unknown priority {priority!r}; one of {', '.join(EXP_PRIORITY.__members__)}")
    else:
        name = EXP_PRIORITY(int(priority)).name
    task = os.environ.get("FF_CHAIN_ID") or os.environ.get("FF_TASK_ID")
    if not task or not os.environ.get("FF_TASK_ID"):
        return
    import asyncio
    import threading

    from fireflyer.sched.client import SchedClient

    async def call() -> None:
        async with SchedClient(token=os.environ.get("FF_TOKEN", "")) as c:
            await c.set_priority(int(task), name)

    # its own thread and loop: the caller may be inside an event loop of its own
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: _capture(errors, lambda: asyncio.run(call())), daemon=True)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def _capture(errors: list[BaseException], fn: Any) -> None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread
        errors.append(e)
