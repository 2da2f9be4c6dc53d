"""CPU cache sizes from sysfs, for the rules that size HFReduce's blocks to the caches.

A module of its own (no numba, no numpy) so that the launcher can ask without loading
the kernels.  Every caller has a default for when sysfs says nothing (containers,
other operating systems): a size here is a hint, never a requirement.
"""

from __future__ import annotations

import os

from fireflyer.core.errors import InvalidArgument
from fireflyer.core.sizes import parse_size

__all__ = ["SYS_CACHE", "cache_bytes"]

#: where Linux lists CPU 0's caches (``index*/level``, ``type``, ``size``)
SYS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


def cache_bytes(level: int, base: str = SYS_CACHE) -> int | None:
    """Size of CPU 0's level-``level`` data (or unified) cache from sysfs (``index*/level``,
    ``type`` and ``size``), or None where it is not listed or cannot be read."""
    try:
        entries = os.listdir(base)
    except OSError:
        return None
    for e in sorted(entries):
        try:
            with open(f"{base}/{e}/level") as f:
                if f.read().strip() != str(level):
                    continue
            try:
                with open(f"{base}/{e}/type") as f:
                    if f.read().strip() == "Instruction":
                        continue
            except FileNotFoundError:
                pass  # no type: take it
            with open(f"{base}/{e}/size") as f:
                return parse_size(f.read(), what=f"level {level} cache size")  # sysfs writes "1024K"
        except (OSError, InvalidArgument):
            continue
    return None
