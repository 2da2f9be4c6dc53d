"""Health events on the wire (fireflyer.health.events) and the node-side Xid policy (fireflyer.health.xidwatch)."""

from __future__ import annotations

import pytest

from fireflyer.bus.events import decode, encode
from fireflyer.core.errors import InvalidArgument
from fireflyer.health import flashcut
from fireflyer.health.events import (
    ADVICE,
    ADVICE_PATTERN,
    LINK_PATTERN,
    XID_PATTERN,
    LinkEvent,
    NodeAdvice,
    XidEvent,
    advice_rank,
    advice_subject,
    link_event,
    link_subject,
    xid_event,
    xid_subject,
)
from fireflyer.health.xid import parse_text
from fireflyer.health.xidwatch import XidWatch, XidWatchConfig


def parsed(xid: int, pci: str = "0000:3b:00", pid: int | None = 7, gi: str = ""):  # type: ignore[no-untyped-def]
    dev = f"PCI:{pci}" + (f" GPU-I:{gi}" if gi else "")
    p = f"pid={pid}, name=python, " if pid is not None else ""
    (ev,) = parse_text(f"[ 1.0] NVRM: Xid ({dev}): {xid}, {p}some text").events
    return ev


def test_subjects_and_patterns() -> None:
    assert xid_subject("n3") == "ff.node.v1.node.n3.xid"
    assert link_subject("n3") == "ff.node.v1.node.n3.link"
    assert advice_subject("n3") == "ff.node.v1.node.n3.advice"
    assert (XID_PATTERN, LINK_PATTERN, ADVICE_PATTERN) == (
        "ff.node.v1.node.*.xid", "ff.node.v1.node.*.link", "ff.node.v1.node.*.advice")
    with pytest.raises(Exception):  # noqa: B017 -- a dotted host name must not land on another subject
        xid_subject("gpu01.rack2")
    assert advice_rank("drain") > advice_rank("reset_gpu") > advice_rank("none") and ADVICE[0] == "none"


def test_events_round_trip_and_carry_the_table_verdict() -> None:
    ev = xid_event("n1", parsed(79), t=100.0)
    assert (ev.category, ev.group, ev.blame, ev.action, ev.actions, ev.mnemonic) == (
        "fallen_off_bus", "uncorrectable", "node", "drain", ("drain", "reboot_node"), "GPU_FALLEN_OFF_BUS")
    assert ev.raw.startswith("[ 1.0] NVRM: Xid") and ev.first_time == ev.time == 100.0 and ev.pid == 7
    wire = encode(ev)
    assert b'"type":"health.xid.v1"' in wire
    assert decode(wire, XidEvent | LinkEvent | NodeAdvice) == ev
    le = link_event(flashcut.LinkEvent(node="n1", iface="ib0", t=5.0, kind="down", detail="operstate up->down"),
                    after=flashcut.LinkState(iface="ib0", operstate="down", carrier=0, carrier_changes=3), delta=1)
    back = decode(encode(le), XidEvent | LinkEvent | NodeAdvice)
    assert isinstance(back, LinkEvent) and (back.interface, back.kind, back.carrier_changes_delta, back.operstate,
                                            back.evidence) == ("ib0", "down", 1, "down", "operstate up->down")
    adv = NodeAdvice(node="n1", action="drain", source="flashcut")
    assert decode(encode(adv), NodeAdvice) == adv


def test_long_dumps_are_capped() -> None:
    text = "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 119, Timeout\n" + "".join(
        f"[ 1.{i:04d}] NVRM: GPU4 RPC history entry {i}\n" for i in range(200))
    (ev,) = parse_text(text).events
    assert len(ev.detail) == 200 and len(xid_event("n", ev).detail) == 64


def test_a_flood_is_one_event_then_one_summary_per_window() -> None:
    w = XidWatch("n1", XidWatchConfig(flood_window_s=10))
    first = w.add(parsed(31), 0.0, suppressed=5)
    assert [(e.count, e.summary, e.suppressed) for e in first] == [(1, False, 5)]
    for i in range(1, 500):
        assert w.add(parsed(31), i * 0.01) == []
    assert w.tick(9.9) == []
    (s,) = w.tick(10.0)
    assert (s.count, s.summary, s.first_time, s.time) == (499, True, 0.01, 4.99)
    assert w.advice(s) is None  # the episode was advised on its first event
    assert w.add(parsed(31), 12.0) == []  # the flood goes on: next window
    (s2,) = w.tick(20.0)
    assert s2.count == 1 and s2.summary
    assert w.tick(30.0) == [] and w.tick(31.0) == []  # a quiet window closes
    (again,) = w.add(parsed(31), 40.0)
    assert not again.summary and again.count == 1
    assert (w.lines, w.published) == (502, 4)


def test_floods_are_per_gpu_instance_and_xid() -> None:
    w = XidWatch("n1")
    assert len(w.add(parsed(31), 0.0)) == 1
    assert len(w.add(parsed(31, pci="0000:5e:00"), 0.1)) == 1
    assert len(w.add(parsed(31, gi="5"), 0.2)) == 1
    assert len(w.add(parsed(43), 0.3)) == 1
    assert w.add(parsed(31), 0.4) == []


def test_repeats_escalate_to_the_on_repeat_action() -> None:
    w = XidWatch("n1", XidWatchConfig(flood_window_s=1, repeat_window_s=100))
    (a,) = w.add(parsed(63), 0.0)
    assert (a.action, a.repeat) == ("reset_gpu", 1)
    adv = w.advice(a)
    assert adv is not None and (adv.action, adv.source, adv.pci, adv.evidence) == ("reset_gpu", "xid", a.pci,
                                                                                   (a.event_id,))
    (b,) = w.add(parsed(63), 50.0)  # a second episode within the repeat window
    assert (b.action, b.repeat) == ("drain", 2)
    assert "episode 2" in w.advice(b).reason  # type: ignore[union-attr]
    (c,) = w.add(parsed(63), 120.0)  # 0 has aged out, 50 has not
    assert (c.action, c.repeat) == ("drain", 2)


def test_repeat_window_ages_out_episodes() -> None:
    w = XidWatch("n1", XidWatchConfig(flood_window_s=1, repeat_window_s=100))
    w.add(parsed(63), 0.0)
    (late,) = w.add(parsed(63), 150.0)
    assert (late.action, late.repeat) == ("reset_gpu", 1)


def test_job_xids_repeat_only_for_another_process() -> None:
    w = XidWatch("n1", XidWatchConfig(flood_window_s=1))
    (a,) = w.add(parsed(13, pid=100), 0.0)
    assert (a.action, a.blame) == ("restart_job", "job")
    assert "the job (pid 100 python)" in w.advice(a).reason  # type: ignore[union-attr]
    (b,) = w.add(parsed(13, pid=100), 5.0)  # the same program faulting again
    assert (b.action, b.repeat) == ("restart_job", 1)
    (c,) = w.add(parsed(13, pid=200), 10.0)  # another job on this GPU: the GPU is suspect
    assert (c.action, c.repeat) == ("drain", 2)


def test_xids_that_need_nothing_give_no_advice() -> None:
    w = XidWatch("n1")
    (ev,) = w.add(parsed(43), 0.0)
    assert ev.action == "none" and w.advice(ev) is None


def test_config_is_checked() -> None:
    with pytest.raises(InvalidArgument):
        XidWatch("n1", XidWatchConfig(flood_window_s=0))
