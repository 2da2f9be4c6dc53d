"""``ff bench ringref``: a bare ring allreduce measured against the loopback bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fireflyer.bench.ringref as rr
from fireflyer.cli.main import main as ff_main
from fireflyer.core.errors import Internal, InvalidArgument


@pytest.mark.parametrize("nodes", [2, 3, 4, 5])
def test_the_steps_reduce_every_segment_everywhere(nodes: int) -> None:
    """Simulated step by step with every node's segments as sets of contributors: after the
    reduce-scatter each node holds one segment from everyone, after the allgather all of them; and
    what a node sends at step s is what it received at step s - 1."""
    held = [[{i} for _ in range(nodes)] for i in range(nodes)]
    steps = [rr.ring_steps(i, nodes) for i in range(nodes)]
    assert all(len(s) == 2 * (nodes - 1) for s in steps)
    for s in range(2 * (nodes - 1)):
        sent = [(steps[i][s][0], set(held[i][steps[i][s][0]])) for i in range(nodes)]
        for i in range(nodes):
            seg, contrib = sent[(i - 1) % nodes]
            out, into, reduce = steps[i][s]
            assert into == seg  # the receiver expects the segment its neighbour sends
            held[i][into] = held[i][into] | contrib if reduce else contrib
            if s:
                assert out == steps[i][s - 1][1]
        if s == nodes - 2:  # end of the reduce-scatter: segment i + 1 is final on node i
            assert all(held[i][(i + 1) % nodes] == set(range(nodes)) for i in range(nodes))
    assert all(h == set(range(nodes)) for node in held for h in node)


def test_ring_ops_reduce_correctly_with_pieces_that_do_not_divide_a_segment() -> None:
    # 3 nodes x 3000 floats: segments of 1000, pieces of 384 (the last one short)
    times = rr.measure_ring_ops(3, 3 * 1000 * 4, piece_bytes=384 * 4, ops=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_a_wrong_result_is_reported_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    real_add = np.add

    def bad_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        return real_add(a, b * 2, out=out)

    monkeypatch.setattr(rr.np, "add", bad_add)  # (the node processes are forked: they inherit it)
    with pytest.raises(Internal, match="expected 3.0"):
        rr.measure_ring_ops(2, 2 * 64 * 4, piece_bytes=64, ops=1)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="at least 2 nodes"):
        rr.measure_ring_ops(1, 1024, piece_bytes=64, ops=1)
    with pytest.raises(InvalidArgument, match="multiple of 12"):
        rr.measure_ring_ops(3, 1000, piece_bytes=64, ops=1)
    with pytest.raises(InvalidArgument, match="at least one op"):
        rr.measure_ring_ops(2, 1024, piece_bytes=64, ops=0)


def test_the_cli_reports_each_round_against_its_own_bound(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    real_cap = rr.loopback_capacity
    monkeypatch.setattr(rr, "loopback_capacity",  # the bound's anchor, with fewer bytes per trial
                        lambda *a, **kw: real_cap(*a, **{**kw, "target_bytes": 2e7, "repeats": 2}))
    assert ff_main(["bench", "ringref", "--nodes", "3", "--size", "768K", "--chunk", "64K", "--ops", "2",
                    "--rounds", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["nodes"], doc["size_bytes"], doc["chunk_bytes"], len(doc["rounds"])) == (3, 768 << 10, 64 << 10, 2)
    for r in doc["rounds"]:
        assert r["bound_GBps"] == pytest.approx(r["loopback_GBps"] / 4)  # C / (2(n-1))
        assert r["fraction_of_bound"] == pytest.approx(r["algbw_GBps"] / r["bound_GBps"])
        assert r["algbw_GBps"] == pytest.approx(doc["size_bytes"] / r["time_s"] / 1e9)
    fr = sorted(r["fraction_of_bound"] for r in doc["rounds"])
    assert doc["fraction_of_bound"] == {"median": pytest.approx(sum(fr) / 2), "min": fr[0], "max": fr[1]}
    assert doc["socket_buffers"]["send_buf_bytes"] == 256 << 10  # the launcher's links'
    assert rr.main(["--nodes", "3", "--size", "1000"]) == 1  # not a multiple of nodes x 4: an error, no traceback
    assert "multiple of 12" in capsys.readouterr().err


def test_a_stalled_node_fails_its_neighbour_instead_of_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    real_add = np.add

    def slow_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        if a.flat[0] == 2.0:  # node 1's own values: it alone stalls before its allgather send
            time.sleep(3.0)
        return real_add(a, b, out=out)

    monkeypatch.setattr(rr.np, "add", slow_add)
    with pytest.raises(Internal, match="node 0: TimeoutError: ring reference: the previous node sent nothing"):
        rr.measure_ring_ops(2, 2 * 64 * 4, piece_bytes=256, ops=1, timeout_s=1.0)
