"""Hardware info and link status: CPU frequency and governor, NIC speed and state, PCIe link width
and speed, read from a sysfs tree (a parameter: tests build a fake one) and compared with the node's
inventory (:class:`~.result.NodeSpec`).

Reading (I/O) and judging (pure) are separate: :func:`read_hardware` returns a
:class:`HardwareReading`, :func:`judge_hardware` compares it with the spec.
"""

from __future__ import annotations

import os
import re
import time

import msgspec

from .result import CheckResult, NodeSpec, Status

__all__ = ["INJECTIONS", "CpuReading", "NicReading", "PcieReading", "HardwareReading", "read_hardware",
           "inject_hardware", "judge_hardware", "check_hardware"]

#: the faults ``check_hardware(inject=...)`` can simulate: each must make the check FAIL
INJECTIONS = ("cpu_freq", "cpu_governor", "nic_speed", "nic_down", "pcie_width", "pcie_speed")


class CpuReading(msgspec.Struct, frozen=True):
    cpu: int
    max_mhz: float
    cur_mhz: float
    governor: str


class NicReading(msgspec.Struct, frozen=True):
    name: str
    present: bool
    #: Mb/s; -1 when the kernel reports none (a down link)
    speed_mbps: int
    operstate: str


class PcieReading(msgspec.Struct, frozen=True):
    address: str
    present: bool
    width: int
    speed_gts: float
    max_width: int = 0
    max_speed_gts: float = 0.0


class HardwareReading(msgspec.Struct, frozen=True):
    cpus: tuple[CpuReading, ...]
    nics: tuple[NicReading, ...]
    pcie: tuple[PcieReading, ...]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:  # absent, or EINVAL (a down NIC's speed)
        return None


def _num(s: str | None, default: float = -1) -> float:
    if s is None:
        return default
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)", s)
    return float(m.group(1)) if m else default


def read_hardware(spec: NodeSpec, sysfs_root: str = "/sys") -> HardwareReading:
    cpus = []
    cpu_dir = os.path.join(sysfs_root, "devices", "system", "cpu")
    names = sorted((n for n in os.listdir(cpu_dir) if re.fullmatch(r"cpu\d+", n)), key=lambda n: int(n[3:])) \
        if os.path.isdir(cpu_dir) else []
    for n in names:
        freq = os.path.join(cpu_dir, n, "cpufreq")
        if not os.path.isdir(freq):
            continue
        cpus.append(CpuReading(cpu=int(n[3:]), max_mhz=_num(_read(os.path.join(freq, "cpuinfo_max_freq"))) / 1000,
                               cur_mhz=_num(_read(os.path.join(freq, "scaling_cur_freq"))) / 1000,
                               governor=_read(os.path.join(freq, "scaling_governor")) or ""))
    nics = []
    for nic in spec.nics:
        d = os.path.join(sysfs_root, "class", "net", nic.name)
        nics.append(NicReading(name=nic.name, present=os.path.isdir(d), speed_mbps=int(_num(_read(f"{d}/speed"))),
                               operstate=_read(f"{d}/operstate") or "unknown"))
    pcie = []
    for dev in spec.pcie:
        d = os.path.join(sysfs_root, "bus", "pci", "devices", dev.address)
        pcie.append(PcieReading(address=dev.address, present=os.path.isdir(d),
                                width=int(_num(_read(f"{d}/current_link_width"), 0)),
                                speed_gts=_num(_read(f"{d}/current_link_speed"), 0),
                                max_width=int(_num(_read(f"{d}/max_link_width"), 0)),
                                max_speed_gts=_num(_read(f"{d}/max_link_speed"), 0)))
    return HardwareReading(cpus=tuple(cpus), nics=tuple(nics), pcie=tuple(pcie))


def inject_hardware(r: HardwareReading, inject: str) -> HardwareReading:
    """The reading as a node with that fault would report it (the first device of its kind)."""
    def first(items: tuple, **changes: object) -> tuple:
        return (msgspec.structs.replace(items[0], **changes), *items[1:]) if items else items

    if inject == "cpu_freq":
        return msgspec.structs.replace(r, cpus=tuple(msgspec.structs.replace(c, max_mhz=c.max_mhz / 2,
                                                                            cur_mhz=c.cur_mhz / 2) for c in r.cpus))
    if inject == "cpu_governor":
        return msgspec.structs.replace(r, cpus=first(r.cpus, governor="powersave-injected"))
    if inject == "nic_speed":
        return msgspec.structs.replace(r, nics=first(r.nics, speed_mbps=100))
    if inject == "nic_down":
        return msgspec.structs.replace(r, nics=first(r.nics, operstate="down", speed_mbps=-1))
    if inject == "pcie_width":
        return msgspec.structs.replace(r, pcie=first(r.pcie, width=max(1, r.pcie[0].width // 2) if r.pcie else 0))
    if inject == "pcie_speed":
        return msgspec.structs.replace(r, pcie=first(r.pcie, speed_gts=r.pcie[0].speed_gts / 2 if r.pcie else 0))
    raise ValueError(f"check_hardware: unknown injection {inject!r}; known: {', '.join(INJECTIONS)}")


def judge_hardware(r: HardwareReading, spec: NodeSpec) -> tuple[Status, list[str], dict]:
    """(status, problems, evidence): every difference from the spec is a problem."""
    problems: list[str] = []
    if spec.cpu_max_mhz > 0:
        if not r.cpus:
            problems.append("no cpufreq data under the sysfs root")
        for c in r.cpus:
            if c.max_mhz < spec.cpu_max_mhz:
                problems.append(f"cpu{c.cpu} max {c.max_mhz:.0f} MHz < spec {spec.cpu_max_mhz:.0f} MHz")
            elif spec.cpu_min_fraction > 0 and c.cur_mhz < spec.cpu_min_fraction * spec.cpu_max_mhz:
                problems.append(f"cpu{c.cpu} runs at {c.cur_mhz:.0f} MHz < {spec.cpu_min_fraction:.0%} of "
                                f"{spec.cpu_max_mhz:.0f} MHz (throttled)")
    if spec.cpu_governor:
        for c in r.cpus:
            if c.governor != spec.cpu_governor:
                problems.append(f"cpu{c.cpu} governor {c.governor!r} != {spec.cpu_governor!r}")
    for nic, want in zip(r.nics, spec.nics, strict=True):
        if not nic.present:
            problems.append(f"NIC {nic.name} is missing")
        elif nic.operstate != "up":
            problems.append(f"NIC {nic.name} is {nic.operstate}")
        elif nic.speed_mbps < want.speed_mbps:
            problems.append(f"NIC {nic.name} at {nic.speed_mbps} Mb/s < spec {want.speed_mbps} Mb/s")
    for dev, want in zip(r.pcie, spec.pcie, strict=True):
        name = f"PCIe {dev.address}" + (f" ({want.label})" if want.label else "")
        if not dev.present:
            problems.append(f"{name} is missing")
            continue
        if dev.width < want.width:
            problems.append(f"{name} link x{dev.width} < spec x{want.width}")
        if dev.speed_gts < want.speed_gts:
            problems.append(f"{name} link {dev.speed_gts:g} GT/s < spec {want.speed_gts:g} GT/s")
    evidence = {
        "cpus": len(r.cpus),
        "cpu_max_mhz": min((c.max_mhz for c in r.cpus), default=None),
        "nics": {n.name: {"operstate": n.operstate, "speed_mbps": n.speed_mbps} for n in r.nics},
        "pcie": {p.address: {"width": p.width, "speed_gts": p.speed_gts} for p in r.pcie},
        "problems": problems,
    }
    return (Status.FAIL if problems else Status.PASS), problems, evidence


def check_hardware(spec: NodeSpec, sysfs_root: str = "/sys", *, inject: str = "") -> CheckResult:
    t0 = time.perf_counter()
    try:
        reading = read_hardware(spec, sysfs_root)
    except OSError as e:
        return CheckResult("hardware", Status.ERROR, f"cannot read {sysfs_root}: {e}", {"sysfs_root": sysfs_root},
                           time.perf_counter() - t0, inject)
    if inject:
        # an injected fault must be one the spec would notice; otherwise the run proves nothing
        target = {"cpu_freq": spec.cpu_max_mhz > 0 and reading.cpus, "cpu_governor": spec.cpu_governor and reading.cpus,
                  "nic_speed": spec.nics, "nic_down": spec.nics, "pcie_width": spec.pcie, "pcie_speed": spec.pcie}
        if inject in target and not target[inject]:
            return CheckResult("hardware", Status.ERROR, f"cannot inject {inject}: the spec does not check it (or "
                               f"the sysfs root has no such device)", {"sysfs_root": sysfs_root},
                               time.perf_counter() - t0, inject)
        reading = inject_hardware(reading, inject)
    status, problems, evidence = judge_hardware(reading, spec)
    summary = "; ".join(problems) if problems else (
        f"{len(reading.cpus)} CPUs, {len(reading.nics)} NICs, {len(reading.pcie)} PCIe links as specified")
    return CheckResult("hardware", status, summary, evidence, time.perf_counter() - t0, inject)
