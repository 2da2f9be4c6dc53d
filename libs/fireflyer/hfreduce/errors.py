"""Errors of the HFReduce collectives (inter-node engine and the node worker).

Every failure of a collective says *who* is at fault and *what* happened, so an
operator reading one line on any node can go to the right machine:

- :class:`FingerprintMismatch` -- two nodes called different collectives (seq,
  op, dtype, count or communicator differ): a program bug, not a fault;
- :class:`CollectiveTimeout` -- a peer sent nothing within the deadline (a hung
  or sleeping rank, a dead link); names the stalled peer, tree, phase, chunk;
- :class:`PeerLost` -- a connection dropped (EOF, reset): the peer process died;
- :class:`CollectiveAborted` -- raised on a node because *another* node failed
  first; ``origin`` names the node that first failed, ``reason`` its message.

All are :class:`HFReduceError` (code ``ABORTED``): after any of them the
communicator is unusable and the caller must build a new one.
"""

from __future__ import annotations

from typing import Any

from fireflyer.core.errors import FireFlyerError

__all__ = [
    "HFReduceError",
    "FingerprintMismatch",
    "CollectiveTimeout",
    "PeerLost",
    "CollectiveAborted",
]


class HFReduceError(FireFlyerError):
    """Root of HFReduce collective failures; the communicator is dead after one."""

    code = "ABORTED"


class FingerprintMismatch(HFReduceError):
    """Two nodes disagree on the collective: fields ``node``, ``peer``, ``ours``, ``theirs``."""

    def __init__(self, message: str = "", *, node: Any = None, peer: Any = None,
                 ours: Any = None, theirs: Any = None, **fields: Any) -> None:
        if not message:
            message = (f"collective mismatch on node {node}: we run {ours} but node {peer} "
                       f"runs {theirs} (every node must issue the same collectives in the same order)")
        super().__init__(message, node=node, peer=peer, ours=ours, theirs=theirs, **fields)


class CollectiveTimeout(HFReduceError, TimeoutError):
    """A peer sent nothing in time.

    Fields: ``node`` (us), ``peer`` (the stalled one), ``tree``, ``phase``
    (``up``/``down``/``connect``), ``chunk``, ``seq``, ``missing`` (comma list of
    the nodes we were still waiting for), ``waited_s``.
    """

    def __init__(self, message: str = "", *, node: Any = None, peer: Any = None, tree: Any = None,
                 phase: Any = None, chunk: Any = None, seq: Any = None, missing: Any = None,
                 waited_s: Any = None, **fields: Any) -> None:
        if not message:
            message = (f"op #{seq} on node {node}: node {peer} sent nothing for {waited_s} s "
                       f"in tree {tree} {phase} phase, chunk {chunk}")
        super().__init__(message, node=node, peer=peer, tree=tree, phase=phase, chunk=chunk,
                         seq=seq, missing=missing, waited_s=waited_s, **fields)


class PeerLost(HFReduceError):
    """A connection to ``peer`` dropped: fields ``node``, ``peer``, ``tree``, ``phase``, ``seq``."""

    def __init__(self, message: str = "", *, node: Any = None, peer: Any = None, tree: Any = None,
                 phase: Any = None, seq: Any = None, **fields: Any) -> None:
        if not message:
            message = (f"op #{seq} on node {node}: lost the connection to node {peer} "
                       f"(tree {tree}, {phase} phase); the peer process probably died")
        super().__init__(message, node=node, peer=peer, tree=tree, phase=phase, seq=seq, **fields)


class CollectiveAborted(HFReduceError):
    """Another node failed first: fields ``node`` (us), ``origin``, ``reason``, ``seq``."""

    def __init__(self, message: str = "", *, node: Any = None, origin: Any = None,
                 reason: Any = None, seq: Any = None, **fields: Any) -> None:
        if not message:
            message = f"op #{seq} on node {node} aborted because node {origin} failed: {reason}"
        super().__init__(message, node=node, origin=origin, reason=reason, seq=seq, **fields)
