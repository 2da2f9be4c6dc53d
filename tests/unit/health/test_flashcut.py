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


FAILURES_CSV = """\
# node,time[,interface[,count]] -- a synthetic log (Table VIII's rows must be supplied from the paper)
node,time,interface,count
n1,2023-06-01T10:00:00,ib0
n1,2023-06-01T10:20:00,ib0
n2,2023-06-01T10:30:00
n1,2023-06-01 10:40,ib1
n1,2023-06-01T10:50:00,ib0
n3,2023-07-02,ib0,2
n3,2023-07-02T00:30:00Z,ib0
n2,2023-06-01T18:00:00
n2,1685642400
"""


def test_read_failures_csv_and_replay_per_node() -> None:
    from fireflyer.health.flashcut import read_failures_csv, replay_failures

    log = read_failures_csv(FAILURES_CSV)
    assert len(log.events) == 9 and log.dated_counts == []
    assert log.events[5].count == 2 and log.events[3].iface == "ib1" and log.events[2].iface == ""
    out = replay_failures(log, FlashCutConfig(window_s=3600, drain_after=3))
    # n1: 3 within the hour by 10:40 (drained once); n3: 2 + 1 within 30 min; n2: 10:30, 18:00, 18:00 + 0 s -> no
    assert (out["nodes"], out["failures"], out["drains"]) == (3, 10, 2)
    assert [(d["node"], d["time"]) for d in out["drained"]] == [
        ("n1", "2023-06-01T10:40:00+00:00"), ("n3", "2023-07-02T00:30:00+00:00")]
    assert replay_failures(log, FlashCutConfig(window_s=86_400, drain_after=3))["drains"] == 3


def test_read_failures_csv_table_viii_shape_and_errors() -> None:
    from fireflyer.health.flashcut import read_failures_csv, replay_failures

    log = read_failures_csv("date,count\n2023-04-03,1\n2023-05-10,4\n2023-07-01,2\n2024-02-20,3\n")
    assert log.events == [] and log.dated_counts[1] == ("2023-05-10", 4)
    out = replay_failures(log, FlashCutConfig(window_s=3600, drain_after=3))
    assert (out["burst"]["drains"], out["spread"]["drains"]) == (2, 0)
    for bad in ("2023-04-03,1\n2023-04-04,x\n", "n1,yesterday\n", "n1,2023-01-01,ib0,0\n", "n1\n"):
        with pytest.raises(InvalidArgument):
            read_failures_csv(bad)
    assert read_failures_csv("# nothing\n") == flashcut.FailureLog()


def test_cli_flashcut_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fireflyer.cli.main import main as ff_main

    f = tmp_path / "failures.csv"
    f.write_text(FAILURES_CSV)
    assert ff_main(["health", "flashcut-replay", str(f)]) == 0
    out = capsys.readouterr().out
    assert "10 link failures on 3 nodes (drain at 3 within 3600s): 2 drains" in out
    assert "drain n1 at 2023-06-01T10:40:00+00:00" in out
    assert ff_main(["health", "flashcut-replay", str(f), "--drain-after", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["drains"] == 3 and doc["drain_after"] == 2
    t8 = tmp_path / "t8.csv"
    t8.write_text("2023-05-10,4\n2024-02-20,3\n")
    assert ff_main(["health", "flashcut-replay", str(t8)]) == 0
    assert "7 link failures on 2 dates" in capsys.readouterr().out
    assert ff_main(["health", "flashcut-replay", str(tmp_path / "nope.csv")]) == 1
    assert ff_main(["health", "flashcut-replay", str(f), "--drain-after", "0"]) != 0
