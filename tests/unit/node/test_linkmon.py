"""The node agent's link monitor (services.node.linkmon) over a fake sysfs tree."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fireflyer.bus.events import Event
from fireflyer.core.errors import SettingsError
from fireflyer.health.events import LinkEvent, NodeAdvice
from fireflyer.health.flashcut import FlashCutConfig
from services.node.linkmon import LinkMonitor, LinkMonSettings


def put(root: Path, iface: str, operstate: str, carrier: str | None, changes: int, speed: str = "200000") -> None:
    d = root / "class" / "net" / iface
    d.mkdir(parents=True, exist_ok=True)
    (d / "operstate").write_text(operstate + "\n")
    if carrier is None:
        (d / "carrier").unlink(missing_ok=True)
    else:
        (d / "carrier").write_text(carrier + "\n")
    (d / "carrier_changes").write_text(f"{changes}\n")
    (d / "speed").write_text(speed + "\n")


def monitor(root: Path, **kw: object) -> LinkMonitor:
    cfg = FlashCutConfig(window_s=600, drain_after=3)
    return LinkMonitor("n1", LinkMonSettings(sysfs_root=str(root), flashcut=cfg, **kw), _noop)  # type: ignore[arg-type]


async def _noop(subject: str, ev: Event) -> None:
    return None


def test_a_flap_becomes_down_and_up_events(tmp_path: Path) -> None:
    put(tmp_path, "ib0", "up", "1", 2)
    put(tmp_path, "eth0", "up", "1", 1, speed="25000")
    m = monitor(tmp_path)
    assert m.sample(0.0) == []  # the first sample is the baseline
    put(tmp_path, "ib0", "down", "0", 3, speed="-1")
    ((subj, down),) = m.sample(1.0)
    assert subj == "ff.node.v1.node.n1.link" and isinstance(down, LinkEvent)
    assert (down.node, down.interface, down.kind, down.time, down.carrier_changes_delta, down.operstate,
            down.carrier, down.speed_mbps, down.in_window) == ("n1", "ib0", "down", 1.0, 1, "down", 0, None, 1)
    assert "operstate up->down" in down.evidence
    put(tmp_path, "ib0", "up", "1", 4)
    ((_, up),) = m.sample(2.0)
    assert isinstance(up, LinkEvent) and (up.kind, up.in_window, up.speed_mbps) == ("up", 0, 200000)
    put(tmp_path, "eth0", "up", "1", 1, speed="10000")  # renegotiated down
    ((_, sp),) = m.sample(3.0)
    assert isinstance(sp, LinkEvent) and (sp.interface, sp.kind, sp.evidence) == ("eth0", "speed",
                                                                                  "speed 25000->10000 Mb/s")
    assert m.sample(4.0) == []


def test_repeated_flaps_advise_a_drain_once(tmp_path: Path) -> None:
    put(tmp_path, "ib0", "up", "1", 0)
    m = monitor(tmp_path)
    m.sample(0.0)
    put(tmp_path, "ib0", "up", "1", 2)  # a flap hidden between samples
    assert [type(e).__name__ for _, e in m.sample(10.0)] == ["LinkEvent"]
    put(tmp_path, "ib0", "down", "0", 3)
    assert [type(e).__name__ for _, e in m.sample(20.0)] == ["LinkEvent"]
    put(tmp_path, "ib0", "up", "1", 4)
    m.sample(30.0)
    put(tmp_path, "ib0", "down", "0", 5)  # the third fault within 600 s
    out = m.sample(40.0)
    assert [s for s, _ in out] == ["ff.node.v1.node.n1.link", "ff.node.v1.node.n1.advice"]
    link, adv = out[0][1], out[1][1]
    assert isinstance(link, LinkEvent) and link.in_window == 3
    assert isinstance(adv, NodeAdvice) and (adv.action, adv.source, adv.interface, adv.evidence) == (
        "drain", "flashcut", "ib0", (link.event_id,))
    assert "3 in the last 600s" in adv.reason
    put(tmp_path, "ib0", "up", "1", 8)  # up again, and a hidden flap: reported, no second advice
    assert [(s, e.kind) for s, e in m.sample(50.0)] == [  # type: ignore[attr-defined]
        ("ff.node.v1.node.n1.link", "up"), ("ff.node.v1.node.n1.link", "flap")]


def test_flaps_spread_beyond_the_window_do_not_drain(tmp_path: Path) -> None:
    put(tmp_path, "ib0", "up", "1", 0)
    m = monitor(tmp_path)
    m.sample(0.0)
    out = []
    for i in range(1, 6):
        put(tmp_path, "ib0", "up", "1", 2 * i)
        out += m.sample(i * 700.0)
    assert len(out) == 5 and not any(isinstance(e, NodeAdvice) for _, e in out)


def test_interface_globs(tmp_path: Path) -> None:
    put(tmp_path, "ib0", "up", "1", 0)
    put(tmp_path, "docker0", "up", "1", 0)
    m = monitor(tmp_path, ifaces=("ib*",))
    m.sample(0.0)
    put(tmp_path, "docker0", "down", "0", 1)
    put(tmp_path, "ib0", "down", "0", 1)
    assert [e.interface for _, e in m.sample(1.0)] == ["ib0"]  # type: ignore[attr-defined]


async def test_heartbeat_gaps_count_towards_a_drain_and_run_publishes(tmp_path: Path) -> None:
    put(tmp_path, "ib0", "up", "1", 0)
    sent: list[tuple[str, Event]] = []

    async def publish(subject: str, ev: Event) -> None:
        sent.append((subject, ev))

    clock = iter(float(i) for i in range(10_000))
    m = LinkMonitor("n1", LinkMonSettings(sysfs_root=str(tmp_path), interval_s=0.01,
                                          flashcut=FlashCutConfig(window_s=600, drain_after=2)), publish,
                    clock=lambda: next(clock))
    m.heartbeat_sent(100.0, 1.0)
    m.heartbeat_sent(101.0, 1.0)  # on time
    m.heartbeat_sent(110.0, 1.0)  # 9 s without one: a gap
    task = asyncio.ensure_future(m.run())
    try:
        for _ in range(200):
            if sent:
                break
            await asyncio.sleep(0.01)
        put(tmp_path, "ib0", "down", "0", 1)
        for _ in range(200):
            if any(isinstance(e, NodeAdvice) for _, e in sent):
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    gap = sent[0][1]
    assert isinstance(gap, LinkEvent) and (gap.kind, gap.interface, gap.time, gap.in_window) == (
        "heartbeat_gap", "", 110.0, 1)
    assert "no heartbeat for 9.0s" in gap.evidence
    kinds = [(s.rsplit(".", 1)[1], getattr(e, "kind", getattr(e, "action", ""))) for s, e in sent]
    assert kinds == [("link", "heartbeat_gap"), ("link", "down"), ("advice", "drain")]


def test_settings_from_env(tmp_path: Path) -> None:
    assert LinkMonSettings.from_env({}) is None
    put(tmp_path, "ib0", "up", "1", 0)
    s = LinkMonSettings.from_env({"FF_NODE_SYSFS_ROOT": str(tmp_path), "FF_NODE_LINK_IFACES": "ib*, eth0",
                                  "FF_NODE_FLASHCUT_DRAIN_AFTER": "5", "FF_NODE_LINK_INTERVAL_S": "0.5"})
    assert s is not None and s.ifaces == ("ib*", "eth0") and s.flashcut.drain_after == 5 and s.interval_s == 0.5
    for bad in ({"FF_NODE_SYSFS_ROOT": str(tmp_path / "nope")},
                {"FF_NODE_SYSFS_ROOT": str(tmp_path), "FF_NODE_FLASHCUT_DRAIN_AFTER": "0"},
                {"FF_NODE_SYSFS_ROOT": str(tmp_path), "FF_NODE_FLASHCUT_DRAIN_AFTER": "two"},
                {"FF_NODE_SYSFS_ROOT": str(tmp_path), "FF_NODE_LINK_INTERVAL_S": "-1"}):
        with pytest.raises(SettingsError):
            LinkMonSettings.from_env(bad)
