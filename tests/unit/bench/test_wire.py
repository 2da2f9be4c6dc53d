"""The benchmark runs and reports what `ff bench wire --json` promises (no timing assertions)."""

import json

import pytest

from fireflyer.bench.wire import main, run_bench
from fireflyer.core.sizes import parse_size


def test_run_bench_reports_positive_figures():
    out = run_bench(4 << 20, repeats=1)
    for key in ("wire_gbps_best", "wire_gbps_median", "raw_gbps_best", "raw_gbps_median",
                "ratio_best", "ratio_median"):
        assert out[key] > 0, key
    assert out["size_bytes"] == 4 << 20 and out["repeats"] == 1 and out["cpu_count"] >= 1
    assert {"git_sha", "python"} <= out.keys()


def test_main_prints_one_json_object(capsys):
    assert main(["--size", "1M", "--repeats", "1", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["size_bytes"] == 1 << 20 and out.count("\n") == 1


@pytest.mark.parametrize("text, n", [("4096", 4096), ("64M", 64 << 20), ("2k", 2048), ("1G", 1 << 30),
                                     ("8MiB", 8 << 20)])
def test_sizes_take_suffixes(text, n):
    assert parse_size(text) == n


def test_bad_size_is_refused():
    with pytest.raises(SystemExit):
        main(["--size", "lots"])
