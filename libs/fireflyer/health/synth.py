"""Synthetic collective traces with injected faults, for the C4 classifier's tests and ``ff bench health``.

A virtual communicator of ``nodes`` nodes runs one collective every ``step_s`` seconds.  Each
node talks to its ring neighbours at distance 1 and 2 (four peers, both directions measured by
each side, as HFReduce's engine does), so an op has ``4 * nodes`` transfer cells.  Noise:

- arrival: normal jitter (``jitter_s``) plus rare single-op spikes (``spike_p``, exponential with
  mean ``spike_s``) -- a GC pause or a page fault, which must not trigger anything;
- transfer: ``transfer_s`` times a normal factor (``transfer_cv``) with the same kind of spikes.

Faults (:class:`Fault`): ``delay`` (a node arrives ``magnitude`` s late from op ``start`` on),
``slow_cell`` (connection ``node -> peer`` takes ``magnitude`` x as long), ``slow_row`` (every
connection of ``node`` as sender: its NIC), ``skip`` (``node`` never enters op ``start``: the op
hangs), ``stall`` (connection ``node <-> peer`` stops at op ``start``: the op hangs with that
connection stalled).  Everything comes from ``numpy.random.default_rng(seed)``: same seed, same trace.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import numpy as np

from fireflyer.core.errors import InvalidArgument

from .c4 import COMM_HANG, COMM_SLOW, NONCOMM_HANG, NONCOMM_SLOW, OpTrace

__all__ = ["TraceSpec", "Fault", "FAULT_KINDS", "expected", "ring_edges", "generate"]

FAULT_KINDS = ("delay", "slow_cell", "slow_row", "skip", "stall")
#: faults that make the op never finish
HANG_KINDS = ("skip", "stall")


class TraceSpec(msgspec.Struct, frozen=True, kw_only=True):
    nodes: int = 64
    ops: int = 100
    seed: int = 0
    step_s: float = 0.5
    base_arrival_s: float = 0.01
    jitter_s: float = 0.002
    spike_p: float = 0.002
    spike_s: float = 0.01
    transfer_s: float = 0.05
    transfer_cv: float = 0.05


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    node: int
    peer: int = -1
    #: the first op it affects (hangs: the op that hangs; the trace stops there)
    start: int = 0
    #: delay: seconds late; slow_cell / slow_row: factor on the transfer time
    magnitude: float = 0.1


def expected(f: Fault) -> tuple[str, str, tuple[int, ...]]:
    """The :meth:`~.c4.Incident.key` a correct classifier reports for ``f``."""
    if f.kind == "delay":
        return (NONCOMM_SLOW, "node", (f.node,))
    if f.kind == "slow_row":
        return (COMM_SLOW, "node", (f.node,))
    if f.kind == "skip":
        return (NONCOMM_HANG, "node", (f.node,))
    a, b = min(f.node, f.peer), max(f.node, f.peer)
    return (COMM_SLOW if f.kind == "slow_cell" else COMM_HANG, "link", (a, b))


def ring_edges(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of every node's connections to its ring neighbours at distance 1 and 2."""
    n = np.arange(nodes)
    offs = [1, -1, 2, -2] if nodes > 4 else [1, -1]
    src = np.concatenate([n for _ in offs])
    dst = np.concatenate([(n + o) % nodes for o in offs])
    keep = src != dst
    return src[keep].astype(np.int64), dst[keep].astype(np.int64)


def _spikes(rng: np.random.Generator, size: int, p: float, mean: float) -> np.ndarray:
    hit = rng.random(size) < p
    out = np.zeros(size)
    k = int(hit.sum())
    if k:
        out[hit] = rng.exponential(mean, k)
    return out


def generate(spec: TraceSpec, faults: tuple[Fault, ...] = ()) -> Iterator[OpTrace]:
    """The trace's ops in order; a hang fault's op is the last one (outstanding, never finished)."""
    if spec.nodes < 3:
        raise InvalidArgument(f"synthetic trace: nodes must be >= 3, got {spec.nodes}")
    for f in faults:
        if f.kind not in FAULT_KINDS or not 0 <= f.node < spec.nodes:
            raise InvalidArgument(f"synthetic trace: bad fault {f} (kinds: {', '.join(FAULT_KINDS)}; "
                                  f"node in 0..{spec.nodes - 1})")
    rng = np.random.default_rng(spec.seed)
    src, dst = ring_edges(spec.nodes)
    n, e = spec.nodes, len(src)
    for seq in range(spec.ops):
        t0 = seq * spec.step_s
        arrival = spec.base_arrival_s + rng.normal(0.0, spec.jitter_s, n) + _spikes(rng, n, spec.spike_p, spec.spike_s)
        secs = spec.transfer_s * np.maximum(0.2, 1 + rng.normal(0.0, spec.transfer_cv, e)) \
            + _spikes(rng, e, spec.spike_p, spec.spike_s)
        stalled = np.zeros(e, dtype=bool)
        hung = False
        for f in faults:
            if seq < f.start:
                continue
            if f.kind == "delay":
                arrival[f.node] += f.magnitude
            elif f.kind == "slow_cell":
                secs[(src == f.node) & (dst == f.peer)] *= f.magnitude
            elif f.kind == "slow_row":
                secs[src == f.node] *= f.magnitude
            elif seq == f.start and f.kind == "skip":
                arrival[f.node] = np.nan
                hung = True
            elif seq == f.start and f.kind == "stall":
                stalled |= ((src == f.node) & (dst == f.peer)) | ((src == f.peer) & (dst == f.node))
                hung = True
        # times relative to the first arrival, as the adapter builds them
        first = float(np.nanmin(arrival))
        arrival = arrival - first
        t0 += first
        if hung:
            yield OpTrace(seq=seq, t0=t0, arrival=arrival, finish=np.full(n, np.nan), edge_src=src, edge_dst=dst,
                          edge_s=np.full(e, np.nan), edge_stalled=stalled)
            return
        finish = float(np.nanmax(arrival)) + float(secs.max()) + np.zeros(n)
        yield OpTrace(seq=seq, t0=t0, arrival=arrival, finish=finish, edge_src=src, edge_dst=dst, edge_s=secs,
                      edge_stalled=stalled)
