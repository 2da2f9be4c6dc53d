"""Per-op state of the HFReduce node engine: chunk layout, progress counters, telemetry.

One :class:`OpState` exists per ``allreduce`` call.  The engine's threads share it
under the engine lock; ownership of the caller's ``work`` buffer during the op:

- chunk ``c`` of tree ``t`` holds this node's partial until the tree's up thread
  reduces the children's chunk ``c`` into it (in place) and sends it to the parent;
- a non-root then receives the final chunk from its parent straight into the same
  place (safe: its partial for that chunk is already in the kernel's socket buffer
  or at the parent), the root has it final after its reduce (and ``avg`` division);
- from then on it is read-only: down writers send it to the children and
  ``on_final`` sees it.  ``work`` goes back to the caller when ``remaining`` is 0
  (``complete``: ``on_done`` has run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from fireflyer.hfreduce._blocks import framed_bytes
from fireflyer.hfreduce.kernels import cast_into
from fireflyer.hfreduce.trees import split_halves
from fireflyer.hfreduce.types import Fingerprint, OpStats, PeerStats, TreeStats

__all__ = ["OpState", "Layout", "divide_inplace", "fp_wire", "fp_from_wire"]


class Layout(msgspec.Struct, frozen=True):
    """Elements ``[start, stop)`` of one tree, cut in ``nchunks`` chunks of ``per_chunk`` elements.

    An empty half still has one (empty) chunk, so every op exchanges at least one
    frame per link and direction: every op is fingerprinted and paced the same way.
    Exception: inline (small) ops put everything on tree 0 and give tree 1 no
    chunk; tree 0 spans all nodes, so every node's fingerprint is still compared.
    """

    start: int
    stop: int
    per_chunk: int
    nchunks: int

    def chunk(self, c: int) -> tuple[int, int]:
        a = self.start + c * self.per_chunk
        return a, min(self.stop, a + self.per_chunk)


def fp_wire(fp: Fingerprint) -> list[object]:
    return list(msgspec.structs.astuple(fp))


def fp_from_wire(v: object) -> str:
    """Readable form of a peer's fingerprint (whatever it sent)."""
    try:
        return str(Fingerprint(*v))  # type: ignore[misc]
    except Exception:  # noqa: BLE001 - a garbled fingerprint is still worth showing
        return repr(v)


def divide_inplace(x: np.ndarray, d: int) -> None:
    """``x /= d`` with the kernels' ``avg`` semantics (true division; floor for ints; RNE for low-p)."""
    if d == 1 or x.size == 0:
        return
    if x.dtype.kind in "iu":
        np.floor_divide(x, x.dtype.type(d), out=x)
    elif x.dtype in (np.float32, np.float64):
        np.divide(x, x.dtype.type(d), out=x)
    else:  # float16 / bfloat16 / fp8: divide in float32, round once
        tmp = x.astype(np.float32)
        tmp /= np.float32(d)
        cast_into(x, tmp, threads=1)


#: ``fuse(start, stop, children)``: the local partial and the children's chunks, reduced in one
#: pass into ``work[start:stop]`` (see :meth:`NodeEngine.allreduce <.engine.NodeEngine.allreduce>`)
Fuse = Callable[[int, int, Sequence[np.ndarray]], None]


class OpState:
    """Progress of one collective on this node (fields change under the engine lock)."""

    # (slots: an op is built and read on every small allreduce, so its attribute traffic counts)
    __slots__ = ("k", "fp", "wire_fp", "work", "wbytes", "isz", "redop", "avg_divisor", "on_final", "fill", "fuse",
                 "fused", "layouts", "filled", "up_done", "final", "up_sending", "inline", "claimed", "exchange", "xsent",
                 "xclaimed", "status_sent", "remaining", "complete", "result", "on_done", "t0", "started_at",
                 "up_end", "down_end", "sent_b", "recv_b", "io_s", "stream", "reduce_s", "copyout_s", "ring",
                 "bcast")

    def __init__(self, k: int, fp: Fingerprint, work: np.ndarray, redop: str, avg_divisor: int,
                 on_final: Callable[[int, int], None] | None, chunk_bytes: int, nlinks: int,
                 child_links_per_tree: tuple[int, int], *, inline: bool = False, exchange: bool = False) -> None:
        self.k = k
        self.fp = fp
        self.wire_fp = fp_wire(fp)
        self.work = work
        self.wbytes = memoryview(work.view(np.uint8)) if work.size else memoryview(b"")
        self.isz = work.dtype.itemsize
        self.redop = redop
        self.avg_divisor = avg_divisor
        self.on_final = on_final
        #: the caller's ``fill(start, stop)`` (threaded ops only), run per chunk by the fill thread
        self.fill: Callable[[int, int], None] | None = None
        #: the caller's ``fuse``; ``fused[t]``: tree t's up step makes our partial with it (and
        #: the fill thread skips tree t)
        self.fuse: Fuse | None = None
        self.fused = [False, False]
        #: a streamed op's inputs and mirrors (``_streamed.StreamOp``): the engine's block loops
        #: make the partial and write the result
        self.stream: Any = None
        #: a ring op's plan and progress (``_ring.RingOp``): the op goes around the ring, not the trees
        self.ring: Any = None
        #: a broadcast's routing and progress (``_bcast.BcastOp``): the root's data flooded over the trees
        self.bcast: Any = None
        #: seconds of the block loops in reduce kernels and in copies to the mirrors
        self.reduce_s = 0.0
        self.copyout_s = 0.0
        per = max(1, chunk_bytes // self.isz)
        count = work.size
        if inline:  # small op: all of it on tree 0 in one chunk; tree 1 carries no frame at all
            self.layouts: tuple[Layout, Layout] = (Layout(0, count, max(per, count), 1),
                                                   Layout(count, count, per, 0))
        else:
            self.layouts = tuple(  # type: ignore[assignment]
                Layout(a, b, per, max(1, -(-(b - a) // per))) for a, b in split_halves(count))
        n0, n1 = self.layouts[0].nchunks, self.layouts[1].nchunks
        #: chunks of each tree whose local partial is in ``work`` (the fill thread's progress;
        #: without ``fill`` the caller's buffer already holds it all)
        self.filled = [n0, n1]
        #: chunks the up thread finished (sent up, or final at the root), per tree
        self.up_done = [0, 0]
        #: chunks final on this node, per tree (a prefix: chunks finish in order)
        self.final = [0, 0]
        self.up_sending = [False, False]
        #: small op: one chunk on tree 0, each step run by whichever thread completes its inputs
        self.inline = inline
        #: inline up step of tree t taken by some thread
        self.claimed = [False, False]
        #: two nodes, small op: the root sends its partial down (``xsent``) instead of the final
        #: chunk, and the child reduces it with its own (step taken once: ``xclaimed``)
        self.exchange = inline and exchange
        self.xsent = False
        self.xclaimed = False
        self.status_sent = False
        if self.exchange:  # our up step (sent, or reduced at the root) and the final chunk; no down send
            self.remaining = 2
        else:  # completion: every chunk final, every down send done, the up stream of each tree through
            c0, c1 = child_links_per_tree
            self.remaining = n0 + (n0 > 0) + n1 + (n1 > 0) + c0 * n0 + c1 * n1
        #: every step ran and ``on_done`` returned (set by the thread that ran the last step)
        self.complete = False
        #: the op's telemetry, computed by that thread
        self.result: OpStats | None = None
        #: called once with the stats on that thread, before the caller wakes (may be None)
        self.on_done: Callable[[OpStats], None] | None = None
        self.t0 = time.monotonic()
        self.started_at = time.time()
        self.up_end = [0.0, 0.0]
        self.down_end = [0.0, 0.0]
        self.sent_b = [0] * nlinks
        self.recv_b = [0] * nlinks
        self.io_s = [0.0] * nlinks

    def nbytes(self, a: int, b: int) -> tuple[int, int]:
        return a * self.isz, b * self.isz

    def frame_bytes(self, a: int, b: int) -> int:
        """Payload bytes of the frame carrying elements [a, b): the data, plus a streamed op's
        block markers (``_blocks.framed_bytes``)."""
        if self.stream is None:
            return (b - a) * self.isz
        return framed_bytes(b - a, self.stream.blk, self.isz)

    def stats(self, link_peers: list[int]) -> OpStats:
        trees = []
        for t in (0, 1):
            up = max(0.0, self.up_end[t] - self.t0)
            down = max(0.0, self.down_end[t] - max(self.up_end[t], self.t0)) if self.down_end[t] else 0.0
            trees.append(TreeStats(up_s=up, down_s=down))
        peers: dict[int, PeerStats] = {}
        for i, p in enumerate(link_peers):
            ps = peers.setdefault(p, PeerStats())
            ps.bytes_sent += self.sent_b[i]
            ps.bytes_received += self.recv_b[i]
            ps.transfer_s += self.io_s[i]
        return OpStats(seq=self.fp.seq, kind=self.fp.kind, nbytes=self.work.nbytes, trees=trees,
                       algorithm="tree" if self.ring is None else "ring",
                       peers=peers, reduce_s=self.reduce_s, copyout_s=self.copyout_s, started_at=self.started_at,
                       finished_at=self.started_at + (time.monotonic() - self.t0))
