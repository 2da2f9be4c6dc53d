"""``ff bench allreduce``'s own arithmetic and report: bus bandwidth, iterations, the placement
it really had, and the table (moved from tests/unit/hfreduce/test_launch_plan.py)."""

from __future__ import annotations

import pytest

from fireflyer.bench._rank import iterations, probe_ops
from fireflyer.bench.allreduce import busbw


def test_bench_reports_the_placement_it_really_had() -> None:
    from fireflyer.bench.allreduce import placement

    assert placement(2, "node", [0, 1]) == "node"
    assert placement(4, "node", [0, 1]) == "none"  # more nodes than CPUs: nothing was bound
    assert placement(2, "none", [0, 1]) == "none" and placement(1, "node", [0, 1]) == "none"


def test_bench_arithmetic() -> None:
    assert busbw(1.0, 8) == pytest.approx(1.75) and busbw(1.0, 2) == 1.0 and busbw(1.0, 1) == 1.0
    assert iterations(0.1, 0.5) == 5 and iterations(1.0, 0.5) == 3 and iterations(1e-9, 0.5) == 20000
    assert iterations(0.0, 0.5) == 20000
    # small ops are probed with more ops (the first few are slow), and every rank picks the same count
    assert probe_ops(4) == probe_ops(1 << 20) > probe_ops((1 << 20) + 1) >= 2


def test_bench_table_formats_missing_anchors_as_dashes() -> None:
    from fireflyer.bench.allreduce import markdown_table, table_rows

    entry = {"size_bytes": 64 << 20, "time_s": 0.05, "algbw_GBps": 1.342, "busbw_GBps": 2.348,
             "gloo_time_s": 0.2, "gloo_algbw_GBps": 0.3355, "ratio": 4.0, "bound_GBps": 1.5,
             "fraction_of_bound": 0.8947}
    small = dict(entry, size_bytes=4, time_s=150e-6, gloo_time_s=None, gloo_algbw_GBps=None, ratio=None,
                 bound_GBps=None, fraction_of_bound=None)
    result = {"nodes": 2, "local_ranks": 4, "world_size": 8, "dtype": "fp32", "cpu_count": 2,
              "torch_version": "2.13.0", "git_sha": "abc", "results": [entry, small]}
    head, rows = table_rows(result)
    assert rows[0] == ["64M", "50.0 ms", "1.342", "2.348", "200.0 ms", "0.336", "4.00x", "1.500", "89%",
                       "-", "-", "-", "-", "-"]
    assert rows[1] == ["4", "150 us", "1.342", "2.348", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"]
    entry.update(floor_time_s=0.04, fraction_of_floor=0.8, gloo_over_floor=5.0, fraction_of_tree_flows=0.714,
                 ring_ref_fraction_of_bound=0.58)
    assert head[9:11] == ["% of tree flows", "ring ref % of bound"]
    assert table_rows(result)[1][0][9:] == ["71%", "58%", "40.0 ms", "80%", "5.00x"]
    md = markdown_table(result).splitlines()
    assert md[2] == "| " + " | ".join(head) + " |" and md[4].startswith("| 64M | 50.0 ms |")
    assert "SO_SNDBUF" not in md[0]  # a result from before socket_buffers existed says nothing about them
    result["socket_buffers"] = {"links_buf_bytes": None, "links_send_buf_bytes": 256 << 10}
    assert "SO_SNDBUF 256K (ours), git abc" in markdown_table(result).splitlines()[0]
    result["socket_buffers"] = {"links_buf_bytes": None, "links_send_buf_bytes": None}
    assert "socket buffers auto-tuned (ours)" in markdown_table(result)
    result["socket_buffers"] = {"links_buf_bytes": 1 << 20, "links_send_buf_bytes": 256 << 10}
    assert "SO_SNDBUF/SO_RCVBUF 1M (ours)" in markdown_table(result)
    assert "block" not in markdown_table(result).splitlines()[0]  # from before block_bytes was recorded
    result["block_bytes"] = 256 << 10
    assert "SO_SNDBUF/SO_RCVBUF 1M (ours), block 256K (ours), git abc" in markdown_table(result)
