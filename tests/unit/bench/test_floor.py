"""The floor anchor of ``ff bench allreduce``: its arithmetic, and that the node processes run and report."""

from __future__ import annotations

import pytest

from fireflyer.bench import _floor as bench_floor
from fireflyer.bench._floor import Floor, _overlaps, combine, measure_floor, ring_bytes
from fireflyer.core.errors import Internal


def test_each_node_moves_the_allreduce_lower_bound() -> None:
    assert ring_bytes(1, 1000) == 0  # one node: nothing crosses the network
    assert ring_bytes(2, 1000) == 1000  # two: the whole buffer each way
    assert ring_bytes(4, 1000) == 1500  # 2(n-1)/n * S
    assert ring_bytes(3, 1000) == 1334  # rounded up


def test_a_trial_lasts_as_long_as_its_slowest_node_and_the_best_trial_counts() -> None:
    assert combine([[3.0, 1.0, 2.0], [1.0, 4.0, 2.5]]) == 2.5
    with pytest.raises(ValueError):
        combine([[1.0, 2.0], [1.0]])
    with pytest.raises(ValueError):
        combine([])


def test_the_parts_add_up_on_one_cpu_per_node_and_overlap_on_more() -> None:
    assert Floor(net_s=0.03, mem_s=0.02, overlap=False).time_s == pytest.approx(0.05)
    assert Floor(net_s=0.03, mem_s=0.02, overlap=True).time_s == pytest.approx(0.03)
    assert _overlaps(2, "node", [0, 1]) is False  # a CPU per node
    assert _overlaps(2, "node", [0, 1, 2, 3]) is True  # two each
    assert _overlaps(4, "node", [0, 1]) is False  # more nodes than CPUs: nothing bound, they share
    assert _overlaps(1, "node", [0, 1]) is True  # one node on two CPUs
    assert _overlaps(2, "none", [0, 1]) is False


@pytest.mark.parametrize(("nodes", "k"), [(2, 2), (3, 1), (1, 2)])
def test_every_node_streams_and_copies(nodes: int, k: int) -> None:
    f = measure_floor(nodes, k, 1 << 20, trials=2, congestion=("reno",))
    assert f.mem_s > 0 and f.time_s >= max(f.net_s, f.mem_s)
    assert (f.net_s > 0) == (nodes > 1)


def test_bad_arguments_and_a_failing_node_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        measure_floor(0, 1, 1 << 20)
    real = bench_floor._fan_out

    def broken(dsts, src, nbytes, block):  # type: ignore[no-untyped-def]
        if nbytes > 1 << 16:  # the children's timed copies (the parent's compile call copies nothing)
            raise MemoryError("injected")
        return real(dsts, src, nbytes, block)

    monkeypatch.setattr(bench_floor, "_fan_out", broken)  # the forked node processes inherit it
    with pytest.raises(Internal, match="injected"):
        measure_floor(2, 1, 1 << 20, trials=1, timeout_s=30)
