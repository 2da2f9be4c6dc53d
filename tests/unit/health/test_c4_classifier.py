"""The C4-style classifier (fireflyer.health.c4) on small synthetic traces: each syndrome named, clean runs quiet."""

from __future__ import annotations

import numpy as np
import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.health.c4 import (
    COMM_HANG,
    COMM_SLOW,
    DRAIN_AND_RESTART,
    NONCOMM_HANG,
    NONCOMM_SLOW,
    RESTART_AVOIDING_LINK,
    WATCH_LINK,
    C4Config,
    C4Detector,
    Incident,
    OpTrace,
    robust_z,
)
from fireflyer.health.synth import Fault, TraceSpec, expected, generate


def _run(spec: TraceSpec, faults: tuple[Fault, ...] = (), config: C4Config | None = None,
         poll_every: float = 0.5) -> list[Incident]:
    det = C4Detector(config)
    out: list[Incident] = []
    for op in generate(spec, faults):
        if op.complete:
            out += det.observe(op)
        else:
            for k in range(200):
                out += det.poll(op, op.t0 + k * poll_every)
    return out


@pytest.mark.parametrize(("kind", "syndrome", "target", "action"), [
    ("delay", NONCOMM_SLOW, "node", DRAIN_AND_RESTART),
    ("slow_cell", COMM_SLOW, "link", WATCH_LINK),
    ("slow_row", COMM_SLOW, "node", DRAIN_AND_RESTART),
    ("skip", NONCOMM_HANG, "node", DRAIN_AND_RESTART),
    ("stall", COMM_HANG, "link", RESTART_AVOIDING_LINK),
])
def test_each_syndrome_is_named(kind: str, syndrome: str, target: str, action: str) -> None:
    f = Fault(kind=kind, node=7, peer=9, start=12, magnitude=0.1 if kind == "delay" else 3.0)
    incidents = _run(TraceSpec(nodes=16, ops=40, seed=3), (f,))
    assert [i.key() for i in incidents] == [expected(f)]
    inc = incidents[0]
    assert (inc.syndrome, inc.target, inc.action) == (syndrome, target, action)
    if target == "link":
        assert inc.link == [7, 9]
    else:
        assert inc.nodes == [7]
    assert inc.detail and inc.scores


def test_slow_named_on_the_kth_op_with_its_evidence_ops() -> None:
    f = Fault(kind="delay", node=3, start=10, magnitude=0.1)
    (inc,) = _run(TraceSpec(nodes=32, ops=30, seed=5), (f,))
    assert inc.seq == 12 and inc.ops == [10, 11, 12]  # persist_k = 3
    assert inc.scores["z"] > 6 and inc.scores["lag_s"] == pytest.approx(0.1, abs=0.02)


def test_hang_named_at_the_deadline_not_before() -> None:
    cfg = C4Config(deadline_s=5.0)
    f = Fault(kind="skip", node=2, start=4)
    ops = list(generate(TraceSpec(nodes=8, ops=10, seed=1), (f,)))
    det = C4Detector(cfg)
    for op in ops[:-1]:
        assert det.observe(op) == []
    hung = ops[-1]
    assert not hung.complete
    assert det.poll(hung, hung.t0 + 4.99) == []
    (inc,) = det.poll(hung, hung.t0 + 5.0)
    assert inc.nodes == [2] and inc.scores["missing"] == 1 and inc.at == hung.t0 + 5.0
    assert det.poll(hung, hung.t0 + 6.0) == []  # reported once


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_clean_noisy_traces_give_no_incident(seed: int) -> None:
    assert _run(TraceSpec(nodes=64, ops=400, seed=seed)) == []


def test_spiky_noise_gives_no_incident() -> None:
    # 50 ms spikes in 0.3 % of arrivals and cells (5x the default rate, 5x as long): single-op
    # outliers that persistence must absorb (a pair's two cells then hit 3 of 5 ops ~2e-6 of the time)
    assert _run(TraceSpec(nodes=32, ops=500, seed=9, spike_p=0.003, spike_s=0.05)) == []


def test_a_single_slow_op_does_not_trigger() -> None:
    spec = TraceSpec(nodes=16, ops=30, seed=2)
    ops = list(generate(spec))
    ops[10].arrival[4] += 0.5  # one op very late
    ops[20].edge_s[3] *= 10  # one cell very slow once
    det = C4Detector()
    assert [i for op in ops for i in det.observe(op)] == []


def test_two_slow_ops_in_the_window_do_not_trigger_three_do() -> None:
    ops = list(generate(TraceSpec(nodes=16, ops=30, seed=2)))
    for s in (10, 13):
        ops[s].arrival[4] += 0.2
    det = C4Detector()
    assert [i for op in ops for i in det.observe(op)] == []
    ops = list(generate(TraceSpec(nodes=16, ops=30, seed=2)))
    for s in (10, 12, 14):
        ops[s].arrival[4] += 0.2
    det = C4Detector()
    found = [i for op in ops for i in det.observe(op)]
    assert [(i.syndrome, i.nodes, i.ops) for i in found] == [(NONCOMM_SLOW, [4], [10, 12, 14])]


def test_comm_hang_common_endpoint_names_the_node() -> None:
    n = 8
    src = np.array([0, 1, 2, 3, 3, 3, 4, 5])
    dst = np.array([1, 2, 3, 4, 5, 6, 3, 3])
    stalled = np.array([False, False, True, True, True, False, True, False])
    op = OpTrace(seq=5, t0=100.0, arrival=np.zeros(n), finish=np.full(n, np.nan), edge_src=src, edge_dst=dst,
                 edge_s=np.full(len(src), np.nan), edge_stalled=stalled)
    (inc,) = C4Detector(C4Config(deadline_s=1.0)).poll(op, 101.0)
    assert (inc.syndrome, inc.target, inc.nodes) == (COMM_HANG, "node", [3])
    assert inc.scores["endpoint_share"] == 1.0


def test_comm_hang_without_transport_view_names_the_unfinished() -> None:
    finish = np.array([np.nan, 0.2, np.nan, 0.3])
    op = OpTrace(seq=1, t0=0.0, arrival=np.zeros(4), finish=finish)
    (inc,) = C4Detector(C4Config(deadline_s=1.0)).poll(op, 2.0)
    assert inc.syndrome == COMM_HANG and inc.nodes == [0, 2] and "no per-connection progress" in inc.detail


def test_slow_nic_column_is_the_node_not_its_links() -> None:
    # a slow receiver: every connection into node 5 is slow (a column of the matrix)
    det = C4Detector()
    found: list[Incident] = []
    for op in generate(TraceSpec(nodes=16, ops=20, seed=4)):
        if op.seq >= 5:
            op.edge_s[op.edge_dst == 5] *= 3
        found += det.observe(op)
    assert [(i.syndrome, i.target, i.nodes) for i in found] == [(COMM_SLOW, "node", [5])]


def test_clear_lets_an_incident_be_reported_again() -> None:
    f = Fault(kind="delay", node=1, start=2, magnitude=0.2)
    ops = list(generate(TraceSpec(nodes=8, ops=12, seed=0), (f,)))
    det = C4Detector()
    first = [i for op in ops[:6] for i in det.observe(op)]
    assert len(first) == 1
    assert [i for op in ops[6:9] for i in det.observe(op)] == []
    det.clear(first[0].key())
    assert len([i for op in ops[9:] for i in det.observe(op)]) == 1


def test_robust_z_ignores_the_outlier_itself() -> None:
    x = np.array([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 10.0])
    z, med, mad = robust_z(x, 1e-6)
    assert med == 1.0 and z[-1] > 50 and abs(z[:-1]).max() < 2


def test_config_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="persist_k"):
        C4Detector(C4Config(persist_k=6, persist_n=5))
    with pytest.raises(InvalidArgument, match="deadline_s"):
        C4Detector(C4Config(deadline_s=0))


def test_a_nic_showing_one_cell_per_op_is_still_the_nic() -> None:
    # node 6's NIC: each op a different one of its four connections is the outlier
    det = C4Detector()
    found: list[Incident] = []
    for op in generate(TraceSpec(nodes=16, ops=24, seed=6)):
        if op.seq >= 5:
            peer = (6 + (1, -1, 2, -2)[op.seq % 4]) % 16
            op.edge_s[(op.edge_src == 6) & (op.edge_dst == peer)] *= 3
        found += det.observe(op)
    assert [(i.syndrome, i.target, i.nodes) for i in found] == [(COMM_SLOW, "node", [6])]


def test_a_named_nic_explains_its_links_later() -> None:
    det = C4Detector()
    found: list[Incident] = []
    for op in generate(TraceSpec(nodes=16, ops=30, seed=7)):
        if 5 <= op.seq < 12:
            op.edge_s[op.edge_src == 6] *= 3  # the whole row: the NIC is named
        elif op.seq >= 12:
            op.edge_s[(op.edge_src == 6) & (op.edge_dst == 7)] *= 3  # then only one of its cells
        found += det.observe(op)
    assert [(i.syndrome, i.target, i.nodes) for i in found] == [(COMM_SLOW, "node", [6])]


def test_a_late_nodes_waiting_peers_do_not_blame_its_nic() -> None:
    # node 3 arrives 0.1 s late and its peers' socket time with it grows by the wait
    det = C4Detector()
    found: list[Incident] = []
    for op in generate(TraceSpec(nodes=16, ops=20, seed=8)):
        if op.seq >= 5:
            op.arrival[3] += 0.1
            touch = (op.edge_src == 3) | (op.edge_dst == 3)
            op.edge_s[touch] += 0.1
        found += det.observe(op)
    assert [(i.syndrome, i.nodes) for i in found] == [(NONCOMM_SLOW, [3])]
