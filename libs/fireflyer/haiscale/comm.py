"""The process's HFReduce communicator, shared by the DDP wrapper and the torch.distributed backend.

A node's HFReduce worker runs one multi-node communicator at a time (see
:mod:`fireflyer.hfreduce.nodecomm`), so a rank that wraps a model with
``haiscale.ddp.DistributedDataParallel`` *and* uses ``dist.init_process_group("hfreduce")``
must issue both through one communicator: :func:`shared` builds it on first use
(``hfreduce.init()``, from the FF_* environment) and hands the same one to both.
Their ops then go out in program order, which is the same on every rank.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["shared", "adopt", "close_shared"]

_LOCK = threading.Lock()
_COMM: list[Any] = []


def shared() -> Any:
    """This process's communicator, made by ``hfreduce.init()`` on first use (or a closed one replaced)."""
    with _LOCK:
        if _COMM and not _COMM[0]._closed and _COMM[0]._broken is None:
            return _COMM[0]
        from fireflyer import hfreduce

        comm = hfreduce.init()
        _COMM[:] = [comm]
        return comm


def adopt(comm: Any) -> None:
    """Make ``comm`` the shared communicator (a program that built its own with ``hfreduce.init()``)."""
    with _LOCK:
        _COMM[:] = [comm]


def close_shared() -> None:
    """Close the shared communicator, if any (the next :func:`shared` makes a new one)."""
    with _LOCK:
        comm = _COMM.pop() if _COMM else None
    if comm is not None:
        comm.close()
