"""The node agent's kernel-log watcher (services.node.kernlog): file and command sources, floods, SXid, dumps."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fireflyer.bus.events import Event
from fireflyer.core.errors import SettingsError
from fireflyer.health.events import NodeAdvice, XidEvent
from fireflyer.health.xidwatch import XidWatchConfig
from services.node.kernlog import KernLogSettings, KernLogWatcher, follow_command, follow_file

X79 = "[ {t}] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


async def take(it: AsyncIterator[str], n: int, timeout_s: float = 5.0) -> list[str]:
    out: list[str] = []

    async def go() -> None:
        async for line in it:
            out.append(line)
            if len(out) == n:
                return

    await asyncio.wait_for(go(), timeout_s)
    return out


def append(p: Path, *lines: str) -> None:
    with open(p, "a") as f:
        f.write("".join(line + "\n" for line in lines))


async def test_file_follows_appends_from_the_end(tmp_path: Path) -> None:
    p = tmp_path / "kern.log"
    p.write_text("old line\n")
    it = follow_file(str(p), poll_s=0.01)
    task = asyncio.ensure_future(take(it, 2))
    await asyncio.sleep(0.05)
    append(p, "one")
    with open(p, "a") as f:  # noqa: ASYNC230 -- a line written in two pieces is one line
        f.write("tw")
        f.flush()
        await asyncio.sleep(0.05)
        f.write("o\n")
    assert await task == ["one", "two"]


async def test_file_survives_truncation_and_rotation(tmp_path: Path) -> None:
    p = tmp_path / "kern.log"
    p.write_text("")
    it = follow_file(str(p), poll_s=0.01, from_start=True)  # the reader may open it after the first append
    got: list[str] = []

    async def reader() -> None:
        async for line in it:
            got.append(line)

    task = asyncio.ensure_future(reader())
    try:
        async def until(n: int) -> None:
            for _ in range(500):
                if len(got) >= n:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"only {got}")

        append(p, "a1", "a2")
        await until(2)
        p.write_text("")  # copytruncate
        await asyncio.sleep(0.05)
        append(p, "b1")
        await until(3)
        os.rename(p, tmp_path / "kern.log.1")  # rotation: the writer still appends to the old file ...
        append(tmp_path / "kern.log.1", "c-old")
        await asyncio.sleep(0.05)
        append(p, "d-new1", "d-new2")  # ... until a new one appears under the name
        await until(6)
        assert got == ["a1", "a2", "b1", "c-old", "d-new1", "d-new2"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_file_that_appears_later_is_read_whole(tmp_path: Path) -> None:
    p = tmp_path / "late.log"
    task = asyncio.ensure_future(take(follow_file(str(p), poll_s=0.01), 2))
    await asyncio.sleep(0.05)
    append(p, "x", "y")
    assert await task == ["x", "y"]


async def test_file_from_start(tmp_path: Path) -> None:
    p = tmp_path / "kern.log"
    p.write_text("first\n")
    assert await take(follow_file(str(p), poll_s=0.01, from_start=True), 1) == ["first"]


async def test_command_lines_and_restart(tmp_path: Path) -> None:
    prog = "import sys; print('l1'); print('l2', file=sys.stderr); sys.stdout.flush()"
    lines = await take(follow_command([sys.executable, "-c", prog], restart_first_s=0.01, restart_max_s=0.02), 4)
    assert sorted(lines[:2]) == ["l1", "l2"] and sorted(lines[2:]) == ["l1", "l2"]  # it ran twice


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Event]] = []

    async def __call__(self, subject: str, ev: Event) -> None:
        self.sent.append((subject, ev))

    def xids(self) -> list[XidEvent]:
        return [e for _, e in self.sent if isinstance(e, XidEvent)]

    def advice(self) -> list[NodeAdvice]:
        return [e for _, e in self.sent if isinstance(e, NodeAdvice)]


def watcher(sink: Sink, flood_s: float = 10.0) -> KernLogWatcher:
    return KernLogWatcher("n1", KernLogSettings(file="unused", watch=XidWatchConfig(flood_window_s=flood_s)), sink)


async def test_watcher_holds_an_xid_until_its_dump_ends() -> None:
    sink = Sink()
    w = watcher(sink)
    await w.handle(X79.format(t="1.0"), 100.0)
    assert sink.sent == []  # a dump may follow
    await w.handle("[ 1.1] NVRM: GPU4 RPC history (CPU -> GSP):", 100.1)
    await w.handle("[ 1.2] Call Trace:", 100.2)
    await w.handle(None, 101.0)  # quiet: the dump is complete
    (ev,) = sink.xids()
    assert ev.detail == ("NVRM: GPU4 RPC history (CPU -> GSP):", "Call Trace:") and ev.time == 101.0
    assert [s for s, _ in sink.sent] == ["ff.node.v1.node.n1.xid", "ff.node.v1.node.n1.advice"]
    assert sink.advice()[0].action == "drain"


async def test_watcher_ignores_sxid_and_limits_a_flood() -> None:
    sink = Sink()
    w = watcher(sink, flood_s=5.0)
    await w.handle("[ 0.5] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 12028, Non-fatal, Link 62 egress", 0.0)
    await w.handle("[ 0.6] nvidia: 40 callbacks suppressed", 0.0)
    for i in range(300):
        await w.handle(f"[ {1 + i / 1000:.6f}] NVRM: Xid (PCI:0000:3b:00): 31, pid=9, name=p, MMU Fault", 1.0 + i / 100)
    await w.handle(None, 4.5)
    assert [(e.xid, e.count, e.summary, e.suppressed) for e in sink.xids()] == [(31, 1, False, 40)]
    await w.handle(None, 6.5)  # the flood window (5 s from the first at 1.0) has ended
    assert [(e.count, e.summary) for e in sink.xids()] == [(1, False), (299, True)]
    assert len(sink.advice()) == 1 and w.stream.stats.sxid == 1


async def test_watcher_runs_a_file_source_and_survives_a_failing_bus(tmp_path: Path) -> None:
    p = tmp_path / "kern.log"
    p.write_text("")
    calls: list[str] = []

    async def flaky(subject: str, ev: Event) -> None:
        calls.append(subject)
        if len(calls) == 1:
            raise ConnectionError("nats away")

    w = KernLogWatcher("n1", KernLogSettings(file=str(p), poll_s=0.01, idle_s=0.05), flaky)
    task = asyncio.ensure_future(w.run())
    try:
        await asyncio.sleep(0.1)
        append(p, X79.format(t="1.0"))
        for _ in range(300):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        assert calls == ["ff.node.v1.node.n1.xid", "ff.node.v1.node.n1.advice"] and w.dropped == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_settings_from_env() -> None:
    assert KernLogSettings.from_env({}) is None
    s = KernLogSettings.from_env({"FF_NODE_KMSG_CMD": "journalctl -k -f -n 0 -o short-iso",
                                  "FF_NODE_XID_FLOOD_WINDOW_S": "2"})
    assert s is not None and s.cmd == ("journalctl", "-k", "-f", "-n", "0", "-o", "short-iso")
    assert s.watch.flood_window_s == 2 and s.describe().startswith("command journalctl")
    f = KernLogSettings.from_env({"FF_NODE_KMSG_FILE": "/var/log/kern.log", "FF_NODE_KMSG_FROM_START": "1"})
    assert f is not None and f.file == "/var/log/kern.log" and f.from_start
    for bad in ({"FF_NODE_KMSG_FILE": "a", "FF_NODE_KMSG_CMD": "b"}, {"FF_NODE_KMSG_CMD": "  "},
                {"FF_NODE_KMSG_FILE": "a", "FF_NODE_KMSG_POLL_S": "0"},
                {"FF_NODE_KMSG_FILE": "a", "FF_NODE_XID_REPEAT_WINDOW_S": "x"}):
        with pytest.raises(SettingsError):
            KernLogSettings.from_env(bad)
