"""Name the calling OS thread, so ``top -H``, ``ps -L``, ``perf`` and ``/proc/<pid>/task/*/comm`` tell threads apart.

Python's thread names live only in the interpreter (until 3.14): every thread of a worker
shows up as ``python`` in the tools an operator reaches for when a node burns CPU.  On Linux
``prctl(PR_SET_NAME)`` sets the kernel's name of the calling thread (15 bytes kept, the rest
cut); elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["set_os_thread_name", "OS_NAME_MAX"]

#: bytes of a thread name the kernel keeps (TASK_COMM_LEN 16, with the terminating NUL)
OS_NAME_MAX = 15
_PR_SET_NAME = 15
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:  # no libc to load (a static interpreter): names stay Python's own
        _libc = None


def set_os_thread_name(name: str) -> bool:
    """Give the calling thread ``name`` (ASCII, cut to :data:`OS_NAME_MAX` bytes) in the kernel;
    False where it cannot be set (not Linux, prctl refused)."""
    if _libc is None:
        return False
    raw = name.encode("ascii", "replace")[:OS_NAME_MAX]
    return _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0
