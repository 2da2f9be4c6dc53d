"""HFReduce: the hierarchical allreduce of the Fire-Flyer paper (arXiv 2408.14158).

Ranks use the client API; each node runs one worker (``python -m fireflyer.hfreduce.worker``)
that reduces its local ranks' shared-memory buffers with :mod:`.kernels` and exchanges
node partials with the other nodes over two binary trees (:mod:`.trees`, the engine)::

    from fireflyer import hfreduce
    comm = hfreduce.init()                    # FF_* environment of DESIGN.md §3
    comm.allreduce(x, op="sum")               # numpy / torch CPU / CUDA, in place
    w = comm.allreduce(y, async_op=True); w.wait()

Errors are the :class:`HFReduceError` family (:mod:`.errors`).  The client is imported
lazily so that ``import fireflyer.hfreduce.kernels`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import CollectiveAborted, CollectiveTimeout, FingerprintMismatch, HFReduceError, PeerLost

if TYPE_CHECKING:
    from .client import CommStatus, Communicator, Work, init

__all__ = [
    "init",
    "Communicator",
    "Work",
    "CommStatus",
    "HFReduceError",
    "FingerprintMismatch",
    "CollectiveTimeout",
    "PeerLost",
    "CollectiveAborted",
]

_LAZY = {"init", "Communicator", "Work", "CommStatus"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'fireflyer.hfreduce' has no attribute {name!r}")
