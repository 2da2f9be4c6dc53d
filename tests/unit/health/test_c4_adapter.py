"""coord's per-node OpRecords -> OpTrace (fireflyer.health.c4.trace_from_records), and detection through it."""

from __future__ import annotations

import math

import pytest

from fireflyer.coord.opstats import OpStatsStore
from fireflyer.core.errors import InvalidArgument
from fireflyer.health.c4 import (
    COMM_HANG,
    NONCOMM_HANG,
    NONCOMM_SLOW,
    C4Config,
    C4Detector,
    trace_from_records,
)
from fireflyer.hfreduce.telemetry import OpRecord
from fireflyer.hfreduce.types import OpStats, PeerStats


def _rec(node: int, seq: int, t: float, *, late: float = 0.0, done: bool = True, transfer: float = 0.05,
         nodes: int = 4) -> OpRecord:
    peers = {p: PeerStats(bytes_sent=1 << 20, bytes_received=1 << 20, transfer_s=transfer)
             for p in ((node + 1) % nodes, (node - 1) % nodes)}
    return OpRecord(comm="job/c", seq=seq, kind="allreduce", op="sum", dtype="float32", count=1 << 18,
                    nbytes=1 << 20, node_rank=node, phase="done" if done else "tree", started_at=t,
                    arrivals={0: t + late, 1: t + late + 0.001}, finished_at=t + late + 0.2 if done else 0.0,
                    stats=OpStats(seq=seq, peers=peers) if done else None)


def test_trace_from_records_fields() -> None:
    per_node = {n: _rec(n, 7, 1000.0, late=0.01 * n) for n in range(4)}
    tr = trace_from_records(per_node, 4)
    assert tr.seq == 7 and tr.t0 == pytest.approx(1000.001)
    assert tr.arrival.tolist() == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert tr.complete and len(tr.edge_s) == 8 and not tr.edge_stalled.any()
    assert sorted(zip(tr.edge_src.tolist(), tr.edge_dst.tolist(), strict=True))[:2] == [(0, 1), (0, 3)]


def test_missing_node_and_stalled_pairs() -> None:
    per_node = {n: _rec(n, 3, 50.0, done=False) for n in (0, 1, 3)}
    tr = trace_from_records(per_node, 4, stalled=[(1, 2)])
    assert math.isnan(tr.arrival[2]) and not tr.complete
    assert tr.edge_stalled.sum() == 1
    with pytest.raises(InvalidArgument):
        trace_from_records(per_node, 0)


def test_detection_through_the_opstats_store() -> None:
    store = OpStatsStore(keep=64)
    nodes = 6
    for seq in range(12):
        for n in range(nodes):
            late = 0.15 if (n == 4 and seq >= 5) else 0.001 * ((seq * 7 + n * 3) % 5)
            store.add("job/c", n, [_rec(n, seq, 10.0 * seq, late=late, nodes=nodes)])
    det = C4Detector()
    found = []
    for _key, per_node in store.ops("job/c"):
        found += det.observe(trace_from_records(per_node, nodes))
    assert [(i.syndrome, i.nodes, i.ops) for i in found] == [(NONCOMM_SLOW, [4], [5, 6, 7])]


def test_hangs_through_records() -> None:
    det = C4Detector(C4Config(deadline_s=10.0))
    per_node = {n: _rec(n, 3, 50.0, done=False) for n in (0, 1, 3)}
    (inc,) = det.poll(trace_from_records(per_node, 4), now=61.0)
    assert (inc.syndrome, inc.nodes) == (NONCOMM_HANG, [2])
    per_node = {n: _rec(n, 4, 70.0, done=False) for n in range(4)}
    (inc,) = det.poll(trace_from_records(per_node, 4, stalled=[(1, 2), (2, 1)]), now=81.0)
    assert (inc.syndrome, inc.target, inc.link) == (COMM_HANG, "link", [1, 2])


def test_a_node_with_missing_local_ranks_has_not_entered() -> None:
    per_node = {n: _rec(n, 2, 20.0, done=False) for n in range(3)}
    per_node[1] = OpRecord(comm="job/c", seq=2, kind="allreduce", op="sum", dtype="float32", count=1, node_rank=1,
                           started_at=20.0, arrivals={0: 20.0}, missing=[1])
    tr = trace_from_records(per_node, 3)
    assert math.isnan(tr.arrival[1]) and not math.isnan(tr.arrival[0])
    (inc,) = C4Detector(C4Config(deadline_s=5.0)).poll(tr, now=tr.t0 + 5.0)
    assert (inc.syndrome, inc.nodes) == (NONCOMM_HANG, [1])
