"""Collective telemetry kept by coord and what ``GetOpStats`` makes of it (C4-style).

Every node's worker sends :class:`~fireflyer.hfreduce.telemetry.TelemetryBatch` es of
finished ops.  :class:`OpStatsStore` files each node's :class:`OpRecord` under
(communicator, generation, seq) and keeps the last ``keep`` ops per communicator;
:func:`aggregate` turns the last N into what detection needs (health-planner §1):

- **arrival lag** per node: the node is ready when its *last* local rank submitted
  (``max(arrivals)``); its lag is that minus the earliest node's, per op.  A node
  that is consistently last is a compute straggler (non-communication slow);
- **phase times** per node: local reduce, inter-node tree, write-back;
- **edge matrix**: ``src -> dst`` is the time node ``src`` spent in socket calls
  with peer ``dst`` during the op (both directions, as the engine measures it) and
  the bytes it sent; an outlier cell points at a link, a whole row or column at a
  node's NIC (communication slow).

Pure: records in, numbers out; the service only feeds it from NATS.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import msgspec

from fireflyer.hfreduce.telemetry import OpRecord

__all__ = ["OpStatsStore", "NodeStats", "EdgeStat", "OpSummary", "OpStatsReport", "aggregate"]


class NodeStats(msgspec.Struct, kw_only=True):
    node_rank: int
    ops: int = 0
    arrival_lag_mean_s: float = 0.0
    arrival_lag_max_s: float = 0.0
    local_reduce_mean_s: float = 0.0
    tree_mean_s: float = 0.0
    writeback_mean_s: float = 0.0
    last_arrivals: int = 0


class EdgeStat(msgspec.Struct, kw_only=True):
    src: int
    dst: int
    ops: int = 0
    transfer_mean_s: float = 0.0
    transfer_max_s: float = 0.0
    bytes_sent: int = 0


class OpSummary(msgspec.Struct, kw_only=True):
    generation: int
    seq: int
    kind: str
    nbytes: int
    nodes_reported: int
    #: first node's start to last node's finish
    span_s: float
    #: the node that arrived last (-1 with a single node)
    last_node: int
    max_lag_s: float
    error: str = ""


class OpStatsReport(msgspec.Struct, kw_only=True):
    comm: str
    ops: int
    nodes: list[NodeStats]
    edges: list[EdgeStat]
    recent: list[OpSummary]
    dropped: int = 0


def _arrival(rec: OpRecord) -> float:
    return max(rec.arrivals.values()) if rec.arrivals else rec.started_at


class OpStatsStore:
    """The last ``keep`` ops of each communicator, each a map node rank -> that node's record."""

    def __init__(self, keep: int = 512, max_comms: int = 4096) -> None:
        self.keep = max(1, keep)
        self.max_comms = max_comms
        self._ops: collections.OrderedDict[str, collections.OrderedDict[tuple[int, int], dict[int, OpRecord]]] = \
            collections.OrderedDict()
        self._dropped: dict[str, dict[int, int]] = {}

    def add(self, comm: str, node_rank: int, records: Sequence[OpRecord], dropped: int = 0) -> None:
        ops = self._ops.get(comm)
        if ops is None:
            ops = self._ops[comm] = collections.OrderedDict()
            while len(self._ops) > self.max_comms:  # forget the communicator heard from least recently
                old, _ = self._ops.popitem(last=False)
                self._dropped.pop(old, None)
        self._ops.move_to_end(comm)
        self._dropped.setdefault(comm, {})[node_rank] = dropped
        for rec in records:
            key = (rec.generation, rec.seq)
            per_node = ops.get(key)
            if per_node is None:
                per_node = ops[key] = {}
                if len(ops) > self.keep:
                    # evict the oldest op, not the first inserted: nodes report at different times
                    del ops[min(ops)]
            per_node[rec.node_rank] = rec

    def comms(self) -> list[str]:
        return list(self._ops)

    def ops(self, comm: str, last: int = 0) -> list[tuple[tuple[int, int], dict[int, OpRecord]]]:
        items = sorted(self._ops.get(comm, {}).items())
        return items[-last:] if last > 0 else items

    def dropped(self, comm: str) -> int:
        return sum(self._dropped.get(comm, {}).values())

    def report(self, comm: str, last: int = 0, recent: int = 20) -> OpStatsReport:
        return aggregate(comm, self.ops(comm, last), dropped=self.dropped(comm), recent=recent)


def aggregate(comm: str, ops: Sequence[tuple[tuple[int, int], dict[int, OpRecord]]], *, dropped: int = 0,
              recent: int = 20) -> OpStatsReport:
    """Per-node lag and phase means, the edge matrix and per-op summaries of ``ops`` (oldest first)."""
    lag_sum: dict[int, float] = collections.defaultdict(float)
    lag_max: dict[int, float] = collections.defaultdict(float)
    phase = {k: collections.defaultdict(float) for k in ("local_reduce_s", "tree_s", "writeback_s")}
    count: dict[int, int] = collections.defaultdict(int)
    last_count: dict[int, int] = collections.defaultdict(int)
    e_sum: dict[tuple[int, int], float] = collections.defaultdict(float)
    e_max: dict[tuple[int, int], float] = collections.defaultdict(float)
    e_n: dict[tuple[int, int], int] = collections.defaultdict(int)
    e_bytes: dict[tuple[int, int], int] = collections.defaultdict(int)
    summaries: list[OpSummary] = []
    for (gen, seq), per_node in ops:
        arrivals = {n: _arrival(r) for n, r in per_node.items()}
        first = min(arrivals.values())
        last_node = max(arrivals, key=lambda n: arrivals[n]) if len(arrivals) > 1 else -1
        for n, rec in per_node.items():
            lag = arrivals[n] - first
            count[n] += 1
            lag_sum[n] += lag
            lag_max[n] = max(lag_max[n], lag)
            for k, acc in phase.items():
                acc[n] += getattr(rec, k)
            if rec.stats is not None:
                for peer, ps in rec.stats.peers.items():
                    e = (n, int(peer))
                    e_n[e] += 1
                    e_sum[e] += ps.transfer_s
                    e_max[e] = max(e_max[e], ps.transfer_s)
                    e_bytes[e] += ps.bytes_sent
        if last_node >= 0:
            last_count[last_node] += 1
        any_rec = next(iter(per_node.values()))
        starts = [r.started_at for r in per_node.values() if r.started_at]
        ends = [r.finished_at for r in per_node.values() if r.finished_at]
        summaries.append(OpSummary(
            generation=gen, seq=seq, kind=any_rec.kind, nbytes=max(r.nbytes for r in per_node.values()),
            nodes_reported=len(per_node), span_s=(max(ends) - min(starts)) if starts and ends else 0.0,
            last_node=last_node, max_lag_s=max(arrivals.values()) - first,
            error=next((r.error for r in per_node.values() if r.error), "")))
    nodes = [NodeStats(node_rank=n, ops=c, arrival_lag_mean_s=lag_sum[n] / c, arrival_lag_max_s=lag_max[n],
                       local_reduce_mean_s=phase["local_reduce_s"][n] / c, tree_mean_s=phase["tree_s"][n] / c,
                       writeback_mean_s=phase["writeback_s"][n] / c, last_arrivals=last_count[n])
             for n, c in sorted(count.items())]
    edges = [EdgeStat(src=s, dst=d, ops=k, transfer_mean_s=e_sum[(s, d)] / k, transfer_max_s=e_max[(s, d)],
                      bytes_sent=e_bytes[(s, d)]) for (s, d), k in sorted(e_n.items())]
    return OpStatsReport(comm=comm, ops=len(ops), nodes=nodes, edges=edges,
                         recent=summaries[-recent:] if recent > 0 else [], dropped=dropped)
