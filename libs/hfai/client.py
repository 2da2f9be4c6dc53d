"""``hfai.client``: HAI Platform's runtime calls, served by :mod:`fireflyer.hai` (see its doc)."""

from fireflyer.hai import (
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
