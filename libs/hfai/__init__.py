"""A compatibility shim for scripts written for HAI Platform's ``hfai`` package.

``hfai.client`` (and, as HAI does, ``hfai`` itself) re-exports Fire-Flyer's runtime API,
:mod:`fireflyer.hai`: ``receive_suspend_command``, ``go_suspend``, ``set_whole_life_state``,
``get_whole_life_state``, ``set_watchdog_time``, ``set_priority``, ``EXP_PRIORITY``, and our
``suspend_requested(comm)``, which agrees on the flag across every rank.
"""

from hfai.client import (
    EXP_PRIORITY,
    get_whole_life_state,
    go_suspend,
    receive_suspend_command,
    set_priority,
    set_watchdog_time,
    set_whole_life_state,
    suspend_requested,
)

__all__ = ["EXP_PRIORITY", "receive_suspend_command", "go_suspend", "set_whole_life_state", "get_whole_life_state",
           "set_watchdog_time", "set_priority", "suspend_requested"]
