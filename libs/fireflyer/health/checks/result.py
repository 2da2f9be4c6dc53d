"""What a check returns, what it is compared with, and what the node should have.

A check returns a :class:`CheckResult`: PASS, FAIL (the hardware is wrong: a bad bit, a slow link,
throughput under the baseline) or ERROR (the check could not run: a missing file, a dead worker),
with the evidence that decided it.  Throughput thresholds are relative to a per-node
:class:`Baseline` (``fraction`` x the node's own good run), never absolute: nodes and CI hosts differ.
"""

from __future__ import annotations

import enum
import time
from typing import Any

import msgspec

__all__ = ["Status", "CheckResult", "Baseline", "NicSpec", "PcieSpec", "NodeSpec", "worst", "SLOWDOWN",
           "slow_down"]

#: how much slower an injected slow fault makes a run (the hardware at a twentieth of its speed)
SLOWDOWN = 20

Evidence = dict[str, Any]


class Status(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"


_RANK = {Status.PASS: 0, Status.ERROR: 1, Status.FAIL: 2}


def worst(statuses: list[Status]) -> Status:
    """FAIL beats ERROR beats PASS: a node with one failed check fails."""
    return max(statuses, key=_RANK.__getitem__, default=Status.PASS)


class CheckResult(msgspec.Struct, frozen=True):
    check: str
    status: Status
    #: one line a person reads: what was measured or what is wrong, and where
    summary: str
    #: the numbers behind the verdict (rates, the bad address, expected vs got ...)
    evidence: Evidence = {}
    duration_s: float = 0.0
    #: the fault injected into this run ("" for a real run)
    injected: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.PASS


class Baseline(msgspec.Struct, frozen=True):
    """A node's own throughputs from a good run (metric name -> value, higher is better).

    A check FAILs when its throughput is under ``fraction`` x the baseline; a metric missing from
    the baseline is recorded, not judged (the first run of a new node sets it)."""

    values: dict[str, float] = {}
    fraction: float = 0.5

    def threshold(self, metric: str) -> float | None:
        v = self.values.get(metric)
        return None if v is None or v <= 0 else v * self.fraction

    def judge(self, metric: str, measured: float) -> tuple[bool, Evidence]:
        """(ok, evidence) of one throughput against the baseline."""
        t = self.threshold(metric)
        ev: Evidence = {metric: measured}
        if t is None:
            return True, {**ev, "baseline": None}
        return measured >= t, {**ev, "baseline": self.values[metric], "threshold": t, "fraction": self.fraction}

    def expected_s(self, metric: str, work: float) -> float:
        """Seconds ``work`` (in the metric's units: steps, GB, GFLOP, MB) takes at the baseline rate; 0 if unknown."""
        v = self.values.get(metric)
        return work / v if v and v > 0 else 0.0

    def with_values(self, values: dict[str, float]) -> Baseline:
        return Baseline(values={**self.values, **values}, fraction=self.fraction)


class NicSpec(msgspec.Struct, frozen=True):
    name: str
    #: Mb/s as /sys/class/net/<nic>/speed reports it (200 Gb/s = 200000)
    speed_mbps: int


class PcieSpec(msgspec.Struct, frozen=True):
    #: domain:bus:device.function as under /sys/bus/pci/devices (0000:3b:00.0)
    address: str
    width: int
    #: GT/s (PCIe 4.0: 16.0, 5.0: 32.0)
    speed_gts: float
    label: str = ""


class NodeSpec(msgspec.Struct, frozen=True):
    """The node's inventory: what its hardware should report."""

    name: str = ""
    #: the slowest acceptable maximum CPU frequency (MHz); 0: not checked
    cpu_max_mhz: float = 0.0
    #: the frequency a core may run at, as a fraction of cpu_max_mhz, before it counts as throttled
    cpu_min_fraction: float = 0.5
    #: the cpufreq governor every core should use ("" : not checked)
    cpu_governor: str = ""
    nics: tuple[NicSpec, ...] = ()
    pcie: tuple[PcieSpec, ...] = ()


def slow_down(elapsed: float, expected: float = 0.0) -> float:
    """Injected slowness: sleep so that the run took ``SLOWDOWN`` times as long as it did or as the
    baseline says it should (whichever is longer, so the fault shows through a noisy baseline);
    returns the new elapsed time."""
    total = SLOWDOWN * max(elapsed, expected)
    time.sleep(max(0.0, total - elapsed))
    return total
