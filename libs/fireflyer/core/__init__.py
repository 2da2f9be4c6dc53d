"""Core: settings, errors, ids, clock, logging and the service runtime.

This package imports nothing else from Fire-Flyer (``runtime`` is the one
exception, importing ``fireflyer.rpc``/``bus``/``telemetry`` lazily when a
service starts), so every other package may depend on it.
"""

from .clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .ids import id_time_ms, instance_name, new_id
from .log import configure_logging, get_logger
from .settings import add_settings_args, env_name, load_settings, overrides_from_args

__all__ = [
    *_errors_all,
    "Clock",
    "ManualClock",
    "SystemClock",
    "SYSTEM_CLOCK",
    "new_id",
    "id_time_ms",
    "instance_name",
    "get_logger",
    "configure_logging",
    "load_settings",
    "add_settings_args",
    "overrides_from_args",
    "env_name",
]
