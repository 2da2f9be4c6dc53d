"""Plain data shared by the HFReduce engine, worker and client.

:class:`Fingerprint` identifies one collective call; every node computes its own
and the engine compares it with the first frame each peer sends for the op, so
mismatched programs fail loudly instead of reducing garbage.  :class:`OpStats`
is the per-op telemetry the engine returns (times per tree and phase, bytes and
time in socket calls per peer).
"""

from __future__ import annotations

import msgspec

__all__ = ["Fingerprint", "PeerStats", "TreeStats", "OpStats"]


class Fingerprint(msgspec.Struct, frozen=True):
    """What a collective is: all nodes of a communicator must agree on every field.

    ``count`` is the element count of the whole buffer, ``dtype`` its numpy name
    (``float32``, ``bfloat16`` ...), ``seq`` the per-communicator op number, ``root`` the
    global rank a reduce or broadcast names (-1 for other kinds): nodes that disagree on it
    would otherwise run the same bytes and end with the result in different places, or with
    several nodes' data summed into a broadcast.
    """

    comm: str
    seq: int
    op: str
    dtype: str
    count: int
    kind: str = "allreduce"
    root: int = -1

    def __str__(self) -> str:
        root = f", root {self.root}" if self.root >= 0 else ""
        return f"{self.kind}#{self.seq}({self.op}, {self.dtype}, {self.count} el{root}, comm {self.comm})"


class TreeStats(msgspec.Struct):
    """Wall time of one tree's phases on this node (0 where the node has no such phase)."""

    up_s: float = 0.0
    down_s: float = 0.0


class PeerStats(msgspec.Struct):
    """Traffic with one peer node: payload bytes and seconds spent in socket calls for it."""

    bytes_sent: int = 0
    bytes_received: int = 0
    transfer_s: float = 0.0


class OpStats(msgspec.Struct):
    """Telemetry of one collective on one node.

    ``trees[t]`` are tree ``t``'s phase times; ``peers`` maps a peer node rank to
    its traffic (summed over both trees); times are ``time.time()`` seconds.  A ring op
    (``algorithm == "ring"``, :mod:`._ring`) reports its reduce-scatter as ``trees[0].up_s``
    and its allgather as ``trees[0].down_s``; ``trees[1]`` stays at zero.
    """

    seq: int
    kind: str = "allreduce"
    nbytes: int = 0
    #: how the op crossed the nodes: ``"tree"`` (the double binary tree) or ``"ring"``
    algorithm: str = "tree"
    trees: list[TreeStats] = msgspec.field(default_factory=list)
    peers: dict[int, PeerStats] = msgspec.field(default_factory=dict)
    #: streamed ops (the engine reduces and writes the result itself): seconds in the reduce
    #: kernels (local inputs and children together) and in copies into the mirrors
    reduce_s: float = 0.0
    copyout_s: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at
