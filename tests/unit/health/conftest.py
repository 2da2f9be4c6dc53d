"""Fixtures of the health checks: a fake sysfs tree and an in-process communicator."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fireflyer.health.checks import NicSpec, NodeSpec, PcieSpec

SPEC = NodeSpec(name="n1", cpu_max_mhz=3000, cpu_governor="performance",
                nics=(NicSpec("ib0", 200000), NicSpec("eth0", 25000)),
                pcie=(PcieSpec("0000:3b:00.0", 16, 16.0, "GPU0"), PcieSpec("0000:5e:00.0", 16, 16.0, "NIC ib0")))


def write_sysfs(root: Path, *, cpus: int = 2, max_khz: int = 3_500_000, cur_khz: int = 3_400_000,
                governor: str = "performance", nics: dict[str, tuple[str, str]] | None = None,
                pcie: dict[str, tuple[str, str]] | None = None) -> Path:
    """A sysfs tree as Linux lays it out: cpufreq per CPU, class/net/<nic>, bus/pci/devices/<addr>."""
    def put(rel: str, text: str) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    for c in range(cpus):
        put(f"devices/system/cpu/cpu{c}/cpufreq/cpuinfo_max_freq", str(max_khz))
        put(f"devices/system/cpu/cpu{c}/cpufreq/scaling_cur_freq", str(cur_khz))
        put(f"devices/system/cpu/cpu{c}/cpufreq/scaling_governor", governor)
    (root / "devices/system/cpu/cpufreq").mkdir(parents=True, exist_ok=True)  # not a cpuN directory
    for name, (speed, state) in (nics or {"ib0": ("200000", "up"), "eth0": ("25000", "up")}).items():
        if speed:
            put(f"class/net/{name}/speed", speed)
        put(f"class/net/{name}/operstate", state)
    for addr, (width, speed) in (pcie or {"0000:3b:00.0": ("16", "16.0 GT/s PCIe"),
                                          "0000:5e:00.0": ("16", "16.0 GT/s PCIe")}).items():
        put(f"bus/pci/devices/{addr}/current_link_width", width)
        put(f"bus/pci/devices/{addr}/current_link_speed", speed)
        put(f"bus/pci/devices/{addr}/max_link_width", "16")
        put(f"bus/pci/devices/{addr}/max_link_speed", "16.0 GT/s PCIe")
    return root


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return write_sysfs(tmp_path / "sys")


class ThreadGroup:
    """``n`` in-process ranks whose allreduce sums through shared memory (a stand-in for HFReduce)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.bufs: list[Any] = [None] * n
        self.barrier = threading.Barrier(n, timeout=20)

    def comm(self, rank: int) -> ThreadComm:
        return ThreadComm(self, rank)


class ThreadComm:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.n

    def allreduce(self, x: Any, op: str = "sum", async_op: bool = False, *, timeout_s: float | None = None) -> Any:
        assert op == "sum"
        g = self.group
        g.bufs[self.rank] = np.array(x, copy=True)
        g.barrier.wait()
        total = np.sum(g.bufs, axis=0)
        g.barrier.wait()  # nobody overwrites its buffer before every rank has summed
        x[:] = total
        return x
