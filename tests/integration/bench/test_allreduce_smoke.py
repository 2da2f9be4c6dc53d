"""Smoke test of ``ff bench allreduce``: tiny sizes, the JSON keys, positive numbers (no timing assertions)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from fireflyer.bench.allreduce import loopback_capacity, main
from fireflyer.cli.main import main as ff_main

REQUIRED = {"size_bytes", "dtype", "nodes", "local_ranks", "time_s", "algbw_GBps", "busbw_GBps",
            "gloo_algbw_GBps", "ratio", "gloo_time_s", "bound_GBps", "fraction_of_bound", "floor_time_s",
            "floor_net_s", "floor_mem_s", "fraction_of_floor", "gloo_over_floor", "tree_flows_GBps",
            "fraction_of_tree_flows", "bound_over_tree_flows", "ring_ref_time_s",
            "ring_ref_fraction_of_bound"}


def test_two_nodes_vs_gloo_with_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "ar.json"
    rc = ff_main(["bench", "allreduce", "--nodes", "2", "--local-ranks", "1", "--sizes", "4,1M",
                  "--vs", "gloo", "--target-s", "0.05", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr()
    assert "ratio" in printed.out  # the table
    assert "goals (this run): 2 nodes 4 B vs Gloo" in printed.err
    doc = json.loads(out.read_text())
    assert doc["bench"] == "allreduce" and doc["world_size"] == 2 and doc["cpu_count"] >= 1
    assert doc["torch_version"] and "git_sha" in doc
    assert [e["size_bytes"] for e in doc["results"]] == [4, 1 << 20]
    for e in doc["results"]:
        assert REQUIRED <= e.keys()
        assert (e["dtype"], e["nodes"], e["local_ranks"]) == ("fp32", 2, 1)
        for k in ("time_s", "algbw_GBps", "busbw_GBps", "gloo_time_s", "gloo_algbw_GBps", "ratio"):
            assert e[k] > 0, k
        assert e["busbw_GBps"] == pytest.approx(e["algbw_GBps"])  # n = 2: busbw == algbw
    small, big = doc["results"]
    assert small["bound_GBps"] is None  # the bound is not meaningful for latency-bound sizes
    assert big["bound_GBps"] > 0 and big["loopback_GBps"] == pytest.approx(2 * big["bound_GBps"])
    assert big["fraction_of_bound"] == pytest.approx(big["algbw_GBps"] / big["bound_GBps"])
    # the floor: both parts measured, added up (a CPU per node here or nodes sharing CPUs), and the ratios
    assert small["floor_time_s"] is None and small["gloo_over_floor"] is None
    assert big["floor_net_s"] > 0 and big["floor_mem_s"] > 0
    assert big["floor_time_s"] >= max(big["floor_net_s"], big["floor_mem_s"])
    assert big["fraction_of_floor"] == pytest.approx(big["floor_time_s"] / big["time_s"])
    assert big["gloo_over_floor"] == pytest.approx(big["gloo_time_s"] / big["floor_time_s"])
    assert big["tree_flows_GBps"] is None  # two nodes: the trees' flows are the pair's
    assert big["ring_ref_time_s"] is None and big["ring_ref_fraction_of_bound"] is None  # (a ring of two is the pair)
    cc = doc["tcp_congestion"]
    assert cc["hfreduce"] == cc["anchors"] and cc["gloo"] == cc["system"]
    assert cc["hfreduce"] in ("cubic", "reno")  # the workers' default prefers these to the system's
    assert doc["socket_buffers"]["links_send_buf_bytes"] == 256 << 10  # the workers' default
    assert doc["socket_buffers"]["links_buf_bytes"] is None
    # the run judges itself on the goals its shape has: at 2 nodes, the 4-byte latency against Gloo
    assert doc["goals"] == [{"goal": "2 nodes 4 B vs Gloo", "value": small["ratio"], "target": 1.0,
                             "met": small["ratio"] >= 1.0}]


def test_three_nodes_measure_the_flows_of_their_trees(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Beyond two nodes the run measures what the double tree's own flows carry (8 for 3 nodes) and
    sets ours and the bound against it."""
    import fireflyer.bench.allreduce as ba
    import fireflyer.bench.flows as bf

    monkeypatch.setattr(ba, "_TREE_FLOW_SECONDS", 0.2)
    patterns: list[tuple[int, int]] = []
    real = bf.pattern_flows

    def spy(pattern: str, nodes: int) -> list[tuple[int, int]]:
        flows = real(pattern, nodes)
        patterns.append((len(flows), nodes))
        return flows

    monkeypatch.setattr(ba, "pattern_flows", spy)
    rings: list[int] = []
    real_ring = ba.measure_ring_ops

    def ring_spy(nodes: int, size: int, **kw: object) -> list[float]:
        rings.append(size)
        return real_ring(nodes, size, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ba, "measure_ring_ops", ring_spy)
    monkeypatch.delenv("FF_HFREDUCE_ALGORITHM", raising=False)
    rc = main(["--nodes", "3", "--local-ranks", "1", "--sizes", "4,1M", "--target-s", "0.05", "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    small, big = doc["results"]
    assert doc["algorithm"] == "ring"  # the launcher's choice for one rank per node on three nodes
    assert patterns == [(8, 3), (8, 3)]  # before and after the collectives, the best kept
    assert rings == [(1 << 20) // 12 * 12] * 2  # the ring's too, on whole segments of float32s
    assert small["tree_flows_GBps"] is None  # latency-bound sizes have no anchors
    assert big["tree_flows_GBps"] > 0
    assert big["fraction_of_tree_flows"] == pytest.approx(big["algbw_GBps"] * 4 / big["tree_flows_GBps"])
    assert big["bound_over_tree_flows"] == pytest.approx(big["loopback_GBps"] / big["tree_flows_GBps"])
    assert big["ring_ref_time_s"] > 0  # the bare ring over the bound's flows, and its share of the bound
    assert big["ring_ref_fraction_of_bound"] == pytest.approx(
        big["size_bytes"] / big["ring_ref_time_s"] / 1e9 / big["bound_GBps"])


def test_one_node_two_ranks_bf16_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--nodes", "1", "--local-ranks", "2", "--sizes", "4K,64K", "--dtype", "bf16",
               "--target-s", "0.05", "--json", "-"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["vs"] is None and doc["world_size"] == 2 and doc["algorithm"] == "tree"
    for e in doc["results"]:
        assert REQUIRED <= e.keys() and e["dtype"] == "bf16"
        assert e["time_s"] > 0 and e["algbw_GBps"] > 0
        assert e["busbw_GBps"] == pytest.approx(e["algbw_GBps"])
        assert e["gloo_algbw_GBps"] is None and e["ratio"] is None and e["bound_GBps"] is None
        assert e["floor_time_s"] is None  # sizes under 1 MiB have no floor
    assert doc["goals"] == []  # the goals are fp32's, and need Gloo


def test_loopback_anchor_is_positive_and_alternates_the_socket_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The anchor's trials take the given socket buffers in turn (the links' and auto-tuning) and keep
    the best; each trial's sockets really have the buffers it was given."""
    from fireflyer.bench import _floor

    seen: list[tuple[object, int]] = []
    real_pair = _floor.loopback_pair

    def pair(src: int, dst: int, congestion=(), buffers=(None, None)):  # type: ignore[no-untyped-def]
        tx, rx = real_pair(src, dst, congestion, buffers)
        seen.append((buffers, tx.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)))
        return tx, rx

    monkeypatch.setattr(_floor, "loopback_pair", pair)
    with socket.socket() as fresh:
        auto = fresh.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    links = (None, 96 << 10)
    assert loopback_capacity(2, 1 << 20, target_bytes=64e6, repeats=3, buffers=[links, (None, None)]) > 0
    assert [b for b, _ in seen] == [links] * 2 + [(None, None)] * 2 + [links] * 2
    assert {n for b, n in seen if b == links} == {192 << 10}
    assert all(n != 192 << 10 for b, n in seen if b != links) and auto != 192 << 10


def test_runs_report_medians_and_keep_every_run(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--nodes", "1", "--local-ranks", "2", "--sizes", "4K", "--target-s", "0.02", "--runs", "2",
               "--json", "-"])
    assert rc == 0
    cap = capsys.readouterr()
    assert "run 1 of 2" in cap.err and "run 2 of 2" in cap.err  # progress on stderr, the JSON alone on stdout
    doc = json.loads(cap.out)
    assert doc["runs"] == 2 and len(doc["per_run"]) == 2
    (e,) = doc["results"]
    assert REQUIRED <= e.keys()
    times = [r[0]["time_s"] for r in doc["per_run"]]
    assert e["time_s"] == pytest.approx(sum(times) / 2)  # the median of two
    assert e["range"]["time_s"] == [min(times), max(times)]


def test_runs_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--runs", "0"])
    assert exc.value.code == 2 and "--runs must be at least 1" in capsys.readouterr().err
