"""``ff bench flows``: an allreduce's pattern of loopback flows, measured without the allreduce."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from fireflyer.bench.flows import main, measure_flows, pattern_flows
from fireflyer.cli.main import main as ff_main
from fireflyer.core.errors import InvalidArgument


def test_the_patterns_are_the_ring_and_the_double_trees_edges_both_ways() -> None:
    assert pattern_flows("ring", 4) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert pattern_flows("ring3", 4) == pattern_flows("ring", 4) * 3
    tree = pattern_flows("tree", 4)
    # tree 0: 0 - 2, 2 - 1, 2 - 3; tree 1 (mirrored): 3 - 1, 1 - 0, 1 - 2 -- each edge up and down
    edges = [(0, 2), (2, 1), (2, 3), (3, 1), (1, 0), (1, 2)]
    assert len(tree) == 12 and sorted(tree) == sorted([e for a, b in edges for e in ((a, b), (b, a))])
    assert len(pattern_flows("tree", 5)) == 16 and len(pattern_flows("tree", 2)) == 4
    with pytest.raises(InvalidArgument, match="at least 2 nodes"):
        pattern_flows("ring", 1)
    with pytest.raises(InvalidArgument, match="unknown flow pattern"):
        pattern_flows("star", 4)


def test_flows_carry_bytes_and_bad_sizes_are_refused() -> None:
    rate = measure_flows(pattern_flows("tree", 2), 2, buf_bytes=1 << 20, piece=64 << 10, seconds=0.2)
    assert rate > 1e6  # bytes per second, summed over the four flows
    with pytest.raises(InvalidArgument):
        measure_flows([(0, 1)], 2, buf_bytes=1 << 10, piece=1 << 20, seconds=0.1)


def test_the_clock_starts_once_every_buffer_is_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faulting in big buffers is not part of a trial: with each allocation taking longer than the
    whole trial, flows that set up their buffers on the clock would carry nothing at all."""
    real_ones = np.ones

    def slow_ones(*args: object, **kw: object) -> np.ndarray:
        time.sleep(0.4)
        return real_ones(*args, **kw)

    monkeypatch.setattr(np, "ones", slow_ones)  # (the node processes are forked: they inherit it)
    rate = measure_flows(pattern_flows("ring", 2), 2, buf_bytes=1 << 20, piece=64 << 10, seconds=0.2)
    assert rate > 1e6


def test_the_cli_interleaves_the_patterns_and_rates_them_against_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert ff_main(["bench", "flows", "--nodes", "2", "--patterns", "ring,tree", "--buffer", "256K", "--piece", "64K",
                    "--seconds", "0.1", "--rounds", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ring, tree = doc["patterns"]
    assert (ring["pattern"], ring["flows"], tree["pattern"], tree["flows"]) == ("ring", 2, "tree", 4)
    assert len(ring["GBps"]) == 2 and all(v > 0 for v in ring["GBps"] + tree["GBps"])
    assert ring["vs_first"] == 1.0 and tree["vs_first"] == pytest.approx(tree["median_GBps"] / ring["median_GBps"])
    assert doc["congestion"] and doc["socket_buffers"]["send_buf_bytes"] == 256 << 10  # the launcher's links'
    assert main(["--nodes", "2", "--patterns", "ring", "--buffer", "256K", "--piece", "64K", "--seconds", "0.1",
                 "--rounds", "1"]) == 0
    cap = capsys.readouterr()
    assert "ring:   2 flows, median" in cap.out and "round 1 of 1: ring (2 flows)" in cap.err


@pytest.mark.parametrize("argv, words", [(["--patterns", "star"], "unknown flow pattern"),
                                         (["--nodes", "1"], "at least 2 nodes"),
                                         (["--rounds", "0"], "--rounds must be at least 1")])
def test_bad_arguments_are_refused(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1 and words in capsys.readouterr().err
