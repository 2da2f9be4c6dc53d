"""Network flash cuts (fireflyer.health.flashcut): sysfs sampling, heartbeat gaps, the drain policy, the replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.health import flashcut
from fireflyer.health.flashcut import (
    DRAIN,
    OBSERVE,
    FlashCutConfig,
    FlashCutPolicy,
    LinkEvent,
    LinkWatcher,
    diff_links,
    heartbeat_gaps,
    read_links,
    replay,
    replay_table_viii,
)


def _link(root: Path, iface: str, operstate: str, carrier: str | None, changes: int) -> None:
    d = root / "class" / "net" / iface
    d.mkdir(parents=True, exist_ok=True)
    (d / "operstate").write_text(operstate + "\n")
    if carrier is None:
        (d / "carrier").unlink(missing_ok=True)
    else:
        (d / "carrier").write_text(carrier + "\n")
    (d / "carrier_changes").write_text(f"{changes}\n")


def test_read_links_from_a_fixture_root(tmp_path: Path) -> None:
    _link(tmp_path, "ib0", "up", "1", 4)
    _link(tmp_path, "eth0", "down", None, 7)
    _link(tmp_path, "lo", "unknown", "1", 0)
    links = read_links(tmp_path)
    assert sorted(links) == ["eth0", "ib0"]
    assert (links["ib0"].operstate, links["ib0"].carrier, links["ib0"].carrier_changes) == ("up", 1, 4)
    assert links["eth0"].carrier is None and links["eth0"].carrier_changes == 7
    with pytest.raises(InvalidArgument, match="class/net"):
        read_links(tmp_path / "nope")


def test_watcher_sees_down_up_and_hidden_flaps(tmp_path: Path) -> None:
    _link(tmp_path, "ib0", "up", "1", 2)
    w = LinkWatcher("n1", tmp_path)
    assert w.sample(0.0) == []
    _link(tmp_path, "ib0", "down", "0", 3)
    (down,) = w.sample(1.0)
    assert (down.kind, down.iface, down.node, down.t) == ("down", "ib0", "n1", 1.0)
    _link(tmp_path, "ib0", "up", "1", 4)
    (up,) = w.sample(2.0)
    assert up.kind == "up"
    _link(tmp_path, "ib0", "up", "1", 8)  # two flaps between samples, up at both
    (flap,) = w.sample(3.0)
    assert (flap.kind, flap.count) == ("flap", 2)
    assert w.sample(4.0) == []


def test_visible_down_with_extra_changes_counts_both() -> None:
    from fireflyer.health.flashcut import LinkState

    before = {"ib0": LinkState(iface="ib0", operstate="up", carrier=1, carrier_changes=10)}
    after = {"ib0": LinkState(iface="ib0", operstate="down", carrier=0, carrier_changes=13)}
    kinds = [(e.kind, e.count) for e in diff_links("n", before, after, 5.0)]
    assert kinds == [("down", 1), ("flap", 1)]


def test_heartbeat_gaps() -> None:
    times = [0, 1, 2, 3, 9, 10, 11, 20]
    gaps = heartbeat_gaps("n2", times, interval_s=1.0, gap_factor=3.0)
    assert [(g.t, g.kind) for g in gaps] == [(9, "heartbeat_gap"), (20, "heartbeat_gap")]
    with pytest.raises(InvalidArgument):
        heartbeat_gaps("n2", times, interval_s=0)


def _ev(node: str, t: float, kind: str = "down", count: int = 1) -> LinkEvent:
    return LinkEvent(node=node, iface="ib0", t=t, kind=kind, count=count)


def test_policy_drains_on_repeated_flaps_within_the_window() -> None:
    pol = FlashCutPolicy(FlashCutConfig(window_s=600, drain_after=3))
    a = pol.observe(_ev("n1", 0))
    b = pol.observe(_ev("n1", 100))
    assert a is not None and b is not None and (a.action, b.action) == (OBSERVE, OBSERVE) and b.in_window == 2
    assert pol.observe(_ev("n1", 150, kind="up")) is None  # recovery is not a fault
    c = pol.observe(_ev("n1", 200))
    assert c is not None and c.action == DRAIN and "drain at 3" in c.detail
    d = pol.observe(_ev("n1", 250))
    assert d is not None and d.action == OBSERVE  # already drained
    assert pol.drains == [("n1", 200)]
    pol.readmit("n1")
    e = pol.observe(_ev("n1", 260))
    assert e is not None and e.in_window == 1


def test_policy_flaps_spread_beyond_the_window_do_not_drain() -> None:
    pol = FlashCutPolicy(FlashCutConfig(window_s=600, drain_after=3))
    incidents = pol.run([_ev("n1", t) for t in (0, 700, 1400, 2100)] + [_ev("n2", 0), _ev("n3", 1)])
    assert len(incidents) == 6 and pol.drains == []


def test_policy_counts_hidden_flaps_and_heartbeat_gaps() -> None:
    pol = FlashCutPolicy(FlashCutConfig(window_s=600, drain_after=3))
    assert pol.observe(_ev("n1", 0, kind="heartbeat_gap")).action == OBSERVE  # type: ignore[union-attr]
    inc = pol.observe(_ev("n1", 10, kind="flap", count=2))
    assert inc is not None and inc.action == DRAIN and inc.in_window == 3


def test_config_is_checked() -> None:
    with pytest.raises(InvalidArgument):
        FlashCutPolicy(FlashCutConfig(drain_after=0))


def test_replay_of_dated_counts() -> None:
    rows = [("2023-04-03", 1), ("2023-05-10", 4), ("2023-07-01", 2), ("2024-02-20", 3)]
    cfg = FlashCutConfig(window_s=3600, drain_after=3)
    burst = replay(rows, cfg, placement="burst")
    assert (burst["failures"], burst["incidents"], burst["drains"]) == (10, 10, 2)  # the 4- and 3-failure days
    spread = replay(rows, cfg, placement="spread")
    assert spread["drains"] == 0  # 3 or 4 a day, hours apart
    with pytest.raises(InvalidArgument):
        replay([("April", 1)], cfg)
    with pytest.raises(InvalidArgument):
        replay(rows, cfg, placement="random")


def test_table_viii_replay_says_when_there_is_no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    out = replay_table_viii()
    if not flashcut.TABLE_VIII:
        assert out == {"available": False, "note": flashcut.TABLE_VIII_NOTE}
    monkeypatch.setattr(flashcut, "TABLE_VIII", (("2023-06-01", 5),))
    out = replay_table_viii(FlashCutConfig(drain_after=3))
    assert out["available"] and out["burst"]["drains"] == 1 and out["spread"]["drains"] == 0
