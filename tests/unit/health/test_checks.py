"""Every validator check: a positive run, and each injected fault must make it FAIL."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from fireflyer.ckpt.localfs import LocalFS
from fireflyer.health.checks import Baseline, Status
from fireflyer.health.checks.allreduce import check_allreduce, expected_sum, rank_data
from fireflyer.health.checks.cpu import check_cpu, lcg_jump
from fireflyer.health.checks.gemm import abft_verify, check_gemm, gemm_size
from fireflyer.health.checks.hardware import INJECTIONS as HW_INJECTIONS
from fireflyer.health.checks.hardware import check_hardware
from fireflyer.health.checks.memory import BitFlip, check_memory_bandwidth, check_memory_pattern
from fireflyer.health.checks.storage import check_storage

from .conftest import SPEC, ThreadGroup, write_sysfs

#: tests compare with a baseline from a clean run of the same size, at a low fraction: CI is noisy,
#: and an injected slowdown is 20x (it still fails unless its own run was 2x faster than the best clean one)
TEST_FRACTION = 0.1


def _baseline(result, *metrics: str) -> Baseline:
    return Baseline(values={m: result.evidence[m] for m in metrics}, fraction=TEST_FRACTION)


def _best(run, metric: str, times: int = 3):
    """The clean run with the highest ``metric`` of ``times`` (a baseline is the node at its best)."""
    return max((run() for _ in range(times)), key=lambda r: r.evidence[metric])


# --- hardware -----------------------------------------------------------------------------------------------------

def test_hardware_passes_on_a_tree_matching_the_spec(sysfs: Path) -> None:
    r = check_hardware(SPEC, str(sysfs))
    assert r.status is Status.PASS, r.summary
    assert r.evidence["nics"]["ib0"] == {"operstate": "up", "speed_mbps": 200000}
    assert r.evidence["pcie"]["0000:3b:00.0"] == {"width": 16, "speed_gts": 16.0} and r.evidence["cpus"] == 2


@pytest.mark.parametrize("inject", HW_INJECTIONS)
def test_hardware_injected_faults_fail(sysfs: Path, inject: str) -> None:
    r = check_hardware(SPEC, str(sysfs), inject=inject)
    assert r.status is Status.FAIL and r.injected == inject and r.evidence["problems"]


@pytest.mark.parametrize("tree,expect", [
    ({"nics": {"ib0": ("100", "up"), "eth0": ("25000", "up")}}, "NIC ib0 at 100 Mb/s < spec 200000"),
    ({"nics": {"ib0": ("", "down"), "eth0": ("25000", "up")}}, "NIC ib0 is down"),
    ({"nics": {"eth0": ("25000", "up")}}, "NIC ib0 is missing"),
    ({"pcie": {"0000:3b:00.0": ("8", "16.0 GT/s PCIe"), "0000:5e:00.0": ("16", "16.0 GT/s PCIe")}},
     "PCIe 0000:3b:00.0 (GPU0) link x8 < spec x16"),
    ({"pcie": {"0000:3b:00.0": ("16", "8.0 GT/s PCIe"), "0000:5e:00.0": ("16", "16.0 GT/s PCIe")}},
     "link 8 GT/s < spec 16 GT/s"),
    ({"max_khz": 1_500_000}, "cpu0 max 1500 MHz < spec 3000 MHz"),
    ({"governor": "powersave"}, "cpu1 governor 'powersave' != 'performance'"),
])
def test_hardware_fixture_trees_with_faults_fail(tmp_path: Path, tree: dict, expect: str) -> None:
    r = check_hardware(SPEC, str(write_sysfs(tmp_path / "sys", **tree)))
    assert r.status is Status.FAIL and expect in r.summary, r.summary


def test_hardware_injection_the_spec_would_not_notice_is_an_error(sysfs: Path) -> None:
    from fireflyer.health.checks import NodeSpec

    r = check_hardware(NodeSpec(), str(sysfs), inject="nic_down")
    assert r.status is Status.ERROR and "does not check it" in r.summary


def test_hardware_throttled_cpu_fails_when_the_spec_asks(tmp_path: Path) -> None:
    from fireflyer.health.checks import NodeSpec

    spec = NodeSpec(cpu_max_mhz=3000, cpu_min_fraction=0.5)
    assert check_hardware(spec, str(write_sysfs(tmp_path / "a", cur_khz=2_000_000))).status is Status.PASS
    r = check_hardware(spec, str(write_sysfs(tmp_path / "b", cur_khz=1_000_000)))
    assert r.status is Status.FAIL and "throttled" in r.summary


# --- CPU ----------------------------------------------------------------------------------------------------------

def test_lcg_jump_equals_stepping() -> None:
    x, a, c, mask = 12345, 6364136223846793005, 1442695040888963407, (1 << 64) - 1
    for _ in range(37):
        x = (a * x + c) & mask
    ja, jc = lcg_jump(37)
    assert (ja * 12345 + jc) & mask == x


def test_cpu_exact_and_throughput() -> None:
    clean = _best(lambda: check_cpu(Baseline(), workers=2, n=2048, rounds=40), "cpu_steps_per_s_per_core")
    assert clean.status is Status.PASS and clean.evidence["wrong_workers"] == []
    base = _baseline(clean, "cpu_steps_per_s_per_core")
    flipped = check_cpu(base, workers=2, n=2048, rounds=40, inject="bitflip")
    assert flipped.status is Status.FAIL and flipped.evidence["wrong_workers"] == [0]
    assert flipped.evidence["index"] == 1024 and flipped.evidence["xor"] == 1 << 17
    throttled = check_cpu(base, workers=2, n=2048, rounds=40, inject="throttle")
    assert throttled.status is Status.FAIL and throttled.evidence["slowest_worker"] == 0 and "throttled" in throttled.summary


# --- memory -------------------------------------------------------------------------------------------------------

def test_memory_bandwidth_and_slow_injection() -> None:
    clean = _best(lambda: check_memory_bandwidth(Baseline(), mib=1, repeats=3), "mem_triad_gbps")
    assert clean.status is Status.PASS and clean.evidence["mem_triad_gbps"] > 0
    slow = check_memory_bandwidth(_baseline(clean, "mem_triad_gbps"), mib=1, repeats=3, inject="slow")
    assert slow.status is Status.FAIL and "baseline" in slow.summary


def test_memory_pattern_clean() -> None:
    r = check_memory_pattern(mib=0.125)
    assert r.status is Status.PASS and r.evidence["passed"] == ["walking_ones", "address_in_address",
                                                                "moving_inversions"]


@pytest.mark.parametrize("test", ["walking_ones", "address_in_address", "moving_inversions"])
def test_memory_pattern_names_the_flipped_address(test: str) -> None:
    r = check_memory_pattern(mib=0.125, tests=(test,), inject=BitFlip(word=5000, bit=40))
    assert r.status is Status.FAIL
    assert r.evidence["offset"] == 5000 * 8 and r.evidence["bits"] == hex(1 << 40)
    assert int(r.evidence["address"], 16) % 8 == 0 and r.evidence["address"] in r.summary


def test_memory_pattern_default_injection_fails() -> None:
    r = check_memory_pattern(mib=0.125, inject="bitflip")
    assert r.status is Status.FAIL and r.injected == "bitflip"


# --- GEMM ---------------------------------------------------------------------------------------------------------

def test_gemm_size_fits_the_budget() -> None:
    n = gemm_size(64 << 20)
    assert 3 * n * n * 4 <= 64 << 20 < 3 * (n + 64) ** 2 * 4 and n % 64 == 0


def test_gemm_checksums_and_injections() -> None:
    clean = _best(lambda: check_gemm(Baseline(), n=96, device="cpu"), "gemm_gflops")
    assert clean.status is Status.PASS and clean.evidence["worst_error_over_tol"] < 1
    base = _baseline(clean, "gemm_gflops")
    bad = check_gemm(base, n=96, device="cpu", inject="corrupt")
    assert bad.status is Status.FAIL and bad.evidence["bad_rows"] == [32] and bad.evidence["bad_cols"] == [64]
    assert "element (32, 64)" in bad.summary
    slow = check_gemm(base, n=96, device="cpu", inject="slow")
    assert slow.status is Status.FAIL and "GFLOP/s" in slow.summary


def test_abft_catches_a_corrupted_input_after_the_product() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((64, 48), dtype=np.float32), rng.standard_normal((48, 80), dtype=np.float32)
    c = a @ b
    assert abft_verify(a, b, c, block=16)[:2] == ([], [])
    a[3, 5] += 1.0  # the checksums were taken from different data than the product
    rows, _cols, worst = abft_verify(a, b, c, block=16)
    assert rows == [3] and worst > 1


def test_gemm_torch_path_on_the_host() -> None:
    """The path a GPU takes (torch tensors, checked where they live), run on the CPU."""
    clean = check_gemm(Baseline(), n=80, device="torch:cpu")
    assert clean.status is Status.PASS and clean.evidence["device"] == "torch:cpu"
    bad = check_gemm(Baseline(), n=80, device="torch:cpu", inject="corrupt")
    assert bad.status is Status.FAIL and "element (26, 53)" in bad.summary


# --- allreduce ----------------------------------------------------------------------------------------------------

def _run_ranks(n: int, baseline: Baseline, inject: str = "") -> list:
    group = ThreadGroup(n)
    out: list = [None] * n

    def rank(r: int) -> None:
        out[r] = check_allreduce(group.comm(r), baseline, mib=0.0625, iters=2, inject=inject)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_allreduce_exact_integers() -> None:
    assert np.array_equal(expected_sum(3, 10), rank_data(0, 10) + rank_data(1, 10) + rank_data(2, 10))
    results = _run_ranks(3, Baseline())
    assert [r.status for r in results] == [Status.PASS] * 3
    assert results[0].evidence["bytes"] == 65536 and results[0].evidence["allreduce_busbw_gbps"] > 0


def test_allreduce_wrong_data_on_one_rank_fails_every_rank() -> None:
    results = _run_ranks(3, Baseline(), inject="wrong_data")
    assert [r.status for r in results] == [Status.FAIL] * 3
    assert {r.evidence["index"] for r in results} == {4096}
    assert all(r.evidence["got"] == r.evidence["expected"] + 1 for r in results)


def test_allreduce_slow_rank_fails_against_the_baseline() -> None:
    clean = max((_run_ranks(2, Baseline()) for _ in range(3)), key=lambda rs: rs[0].evidence["allreduce_busbw_gbps"])
    base = _baseline(clean[0], "allreduce_busbw_gbps")
    slow = _run_ranks(2, base, inject="slow")
    assert slow[0].status is Status.FAIL and "bus bandwidth" in slow[0].summary


def test_allreduce_error_when_the_collective_fails() -> None:
    class Dead:
        rank, world_size = 0, 2

        def allreduce(self, x, op="sum", async_op=False, *, timeout_s=None):
            raise TimeoutError("peer 1 never arrived")

    r = check_allreduce(Dead(), Baseline(), mib=0.01)
    assert r.status is Status.ERROR and "peer 1 never arrived" in r.summary


# --- storage ------------------------------------------------------------------------------------------------------

def test_storage_read_back_and_injections(tmp_path: Path) -> None:
    fs = LocalFS(tmp_path)
    clean = check_storage(fs, Baseline(), files=2, mib=0.0625)
    assert clean.status is Status.PASS and clean.evidence["bytes"] == 2 * 65536
    assert list((tmp_path / "health").iterdir()) == []  # cleaned up
    base = Baseline(values={"storage_write_mbps": clean.evidence["storage_write_mbps"],
                            "storage_read_mbps": clean.evidence["storage_read_mbps"]}, fraction=TEST_FRACTION)
    bad = check_storage(fs, base, files=2, mib=0.0625, inject="corrupt")
    assert bad.status is Status.FAIL and bad.evidence["offset"] == 32768 and bad.evidence["path"].endswith("/f0")
    assert bad.evidence["got"] == bad.evidence["expected"] ^ 0x40
    slow = check_storage(fs, base, files=2, mib=0.0625, inject="slow")
    assert slow.status is Status.FAIL and "MB/s" in slow.summary


def test_storage_error_when_the_file_system_refuses(tmp_path: Path) -> None:
    class ReadOnly(LocalFS):
        def write_bytes(self, path, data, *, mode=0o644):
            raise PermissionError(f"{path}: read-only file system")

    r = check_storage(ReadOnly(tmp_path), Baseline(), files=1, mib=0.01)
    assert r.status is Status.ERROR and "read-only" in r.summary
