"""Package attributes that load their submodule on first use (PEP 562).

A package such as :mod:`fireflyer.bus` re-exports the names of its submodules for
convenience (``from fireflyer.bus import Bus``), but importing *one* light submodule
(``fireflyer.bus.events``) runs the package's ``__init__`` first; with eager re-exports
that drags in nats-py, and for :mod:`fireflyer.rpc` gRPC, about a quarter of a second per
process on the 2-vCPU VMs.  HFReduce's workers and every training rank are such processes.
So the packages declare which submodule holds each name and load it when asked::

    __getattr__ = lazy_attributes(__name__, {"Bus": "connection", "Event": "events"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``where[name]`` is the submodule (relative to
    the package) that defines ``name``; the value is cached in the package once loaded."""
    def __getattr__(name: str) -> Any:
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
