"""GetOpStats aggregation on synthetic telemetry: arrival lag, phases, the edge matrix."""

from __future__ import annotations

from fireflyer.coord.opstats import OpStatsStore, aggregate
from fireflyer.hfreduce.telemetry import OpRecord
from fireflyer.hfreduce.types import OpStats, PeerStats


def rec(node: int, seq: int, arrive: float, *, tree_s: float = 0.01, peers: dict[int, float] | None = None,
        gen: int = 1) -> OpRecord:
    stats = OpStats(seq=seq, peers={p: PeerStats(bytes_sent=100, transfer_s=t) for p, t in (peers or {}).items()})
    return OpRecord(comm="j/default", generation=gen, seq=seq, kind="allreduce", op="sum", dtype="float32",
                    count=25, nbytes=100, node_rank=node, phase="done", started_at=arrive - 0.001,
                    arrivals={0: arrive - 0.001, 1: arrive}, local_reduce_s=0.002, tree_s=tree_s,
                    writeback_s=0.003, finished_at=arrive + 0.05, stats=stats)


def test_straggler_lag_and_slow_edge() -> None:
    store = OpStatsStore(keep=100)
    for seq in range(10):
        t = 100.0 + seq
        # node 2 always arrives 40 ms late; edge 0 -> 1 is 10x slower than the others
        store.add("j/default", 0, [rec(0, seq, t, peers={1: 0.05, 2: 0.005})])
        store.add("j/default", 1, [rec(1, seq, t + 0.001, peers={0: 0.05})])
        store.add("j/default", 2, [rec(2, seq, t + 0.040, peers={0: 0.005})], dropped=3)
    rep = store.report("j/default", last=5)
    assert rep.ops == 5 and rep.dropped == 3
    by = {n.node_rank: n for n in rep.nodes}
    assert abs(by[2].arrival_lag_mean_s - 0.040) < 1e-6 and by[2].last_arrivals == 5
    assert by[0].arrival_lag_max_s == 0.0 and by[0].ops == 5
    assert abs(by[1].tree_mean_s - 0.01) < 1e-9 and abs(by[1].writeback_mean_s - 0.003) < 1e-9
    edges = {(e.src, e.dst): e for e in rep.edges}
    assert set(edges) == {(0, 1), (0, 2), (1, 0), (2, 0)}
    assert edges[(0, 1)].transfer_mean_s > 5 * edges[(0, 2)].transfer_mean_s
    assert edges[(0, 1)].ops == 5 and edges[(0, 1)].bytes_sent == 500
    assert [s.seq for s in rep.recent] == [5, 6, 7, 8, 9] and all(s.last_node == 2 for s in rep.recent)


def test_keeps_the_last_n_ops_and_orders_by_generation() -> None:
    store = OpStatsStore(keep=4)
    for seq in range(6):
        store.add("c", 0, [rec(0, seq, 1.0 + seq)])
    store.add("c", 0, [rec(0, 0, 50.0, gen=2)])
    keys = [k for k, _ in store.ops("c")]
    assert keys == [(1, 3), (1, 4), (1, 5), (2, 0)]
    assert aggregate("c", []).ops == 0
    assert store.report("nothing").ops == 0
