"""The node agent's kernel-log watcher: follow a log, publish the NVIDIA Xids in it.

    FF_NODE_KMSG_FILE=/var/log/kern.log         follow a file (appends; survives rotation and truncation)
    FF_NODE_KMSG_CMD="journalctl -k -f -n 0 -o short-iso"   or read a command's standard output

Neither set (the local cluster's default): no watcher.  On a production node set
``FF_NODE_KMSG_CMD="journalctl -k -f -n 0 -o short-iso"`` -- the journal keeps the kernel's
messages across ``dmesg`` ring-buffer wrap, ``-n 0`` starts at the present (an agent restart
does not publish the Xids of the past again) and ``short-iso`` is a shape the parser reads --
or ``FF_NODE_KMSG_FILE=/var/log/kern.log`` where rsyslog writes one.  ``dmesg -w`` works too,
but it prints the whole ring buffer each time it starts.  Other settings:

- ``FF_NODE_KMSG_FROM_START=1``: read a file from its beginning (default: from its end, like
  ``tail -f -n 0``; a file created or rotated after the start is always read whole);
- ``FF_NODE_KMSG_POLL_S`` (0.2): how often a file is checked for new lines;
- ``FF_NODE_XID_FLOOD_WINDOW_S`` (10) and ``FF_NODE_XID_REPEAT_WINDOW_S`` (86400): see
  :mod:`fireflyer.health.xidwatch`.

This module is I/O only: lines go to :class:`fireflyer.health.xid.XidStream` (the parser: GSP
dumps, rate-limit notes, NVSwitch SXid lines, duplicates), parsed Xids to
:class:`fireflyer.health.xidwatch.XidWatch` (floods, repeats, advice), and what comes out is
published on ``ff.node.v1.node.<node>.xid`` and ``.advice`` (:mod:`fireflyer.health.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import msgspec

from fireflyer.bus.backoff import backoff_delay
from fireflyer.bus.events import Event
from fireflyer.core.errors import SettingsError
from fireflyer.health.events import XidEvent, advice_subject, xid_subject
from fireflyer.health.xid import XidStream
from fireflyer.health.xidwatch import XidWatch, XidWatchConfig

__all__ = ["KernLogSettings", "follow_file", "follow_command", "KernLogWatcher", "Publish"]

Publish = Callable[[str, Event], Awaitable[None]]


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise SettingsError(f"{key} must be a number, got {raw!r}", key=key, expected="float > 0") from None
    if not value > 0:
        raise SettingsError(f"{key} must be positive, got {raw!r}", key=key, expected="float > 0")
    return value


class KernLogSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: a log file to follow
    file: str = ""
    #: a command whose stdout lines are the log (split like a shell would, not run by one)
    cmd: tuple[str, ...] = ()
    from_start: bool = False
    poll_s: float = 0.2
    #: a pending Xid's dump is taken as complete after this long without a line
    idle_s: float = 0.5
    watch: XidWatchConfig = msgspec.field(default_factory=XidWatchConfig)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KernLogSettings | None:
        """The settings of ``FF_NODE_KMSG_*``; None when no source is configured."""
        file, cmd = env.get("FF_NODE_KMSG_FILE", ""), env.get("FF_NODE_KMSG_CMD", "")
        if not file and not cmd:
            return None
        if file and cmd:
            raise SettingsError("set one of FF_NODE_KMSG_FILE and FF_NODE_KMSG_CMD, not both",
                                key="FF_NODE_KMSG_FILE", expected="a file or a command")
        argv = tuple(shlex.split(cmd))
        if cmd and not argv:
            raise SettingsError(f"FF_NODE_KMSG_CMD is empty after splitting: {cmd!r}", key="FF_NODE_KMSG_CMD")
        watch = XidWatchConfig(flood_window_s=_float(env, "FF_NODE_XID_FLOOD_WINDOW_S", 10.0),
                               repeat_window_s=_float(env, "FF_NODE_XID_REPEAT_WINDOW_S", 86_400.0))
        return cls(file=file, cmd=argv, from_start=env.get("FF_NODE_KMSG_FROM_START", "") in ("1", "true", "yes"),
                   poll_s=_float(env, "FF_NODE_KMSG_POLL_S", 0.2), watch=watch.validate())

    def describe(self) -> str:
        return f"file {self.file}" if self.file else f"command {shlex.join(self.cmd)}"


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


async def follow_file(path: str, *, poll_s: float = 0.2, from_start: bool = False) -> AsyncIterator[str]:
    """The lines appended to ``path``, forever, like ``tail -F``.

    Rotation (the file renamed or removed and a new one created under the name) is noticed at end
    of file as a new inode: the old file is read to its end once more (a writer may not have
    reopened yet) and the new one is read from its beginning.  Truncation in place
    (logrotate's ``copytruncate``) is a size below our position: reading restarts at 0.  A
    missing file is waited for.  Reads are polled, not inotify: it works on every file system,
    and kernel logs are small.
    """
    first = True
    while True:
        try:
            # a local log file: open and read are fast, and the file is held across yields (closed below)
            f = open(path, "rb")  # noqa: SIM115, ASYNC230
        except FileNotFoundError:
            first = False  # a file that appears later is new: read it whole
            await asyncio.sleep(poll_s)
            continue
        try:
            ident = _identity(os.fstat(f.fileno()))
            if first and not from_start:
                f.seek(0, os.SEEK_END)
            first = False
            buf = b""
            while True:
                chunk = f.read(1 << 16)
                if chunk:
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        yield line.decode("utf-8", "replace")
                    continue
                try:
                    now = os.stat(path)
                except FileNotFoundError:
                    now = None
                if now is None or _identity(now) != ident:  # rotated: drain the old file, then the new one
                    rest = buf + f.read()
                    for line in rest.split(b"\n"):
                        if line:
                            yield line.decode("utf-8", "replace")
                    break
                if now.st_size < f.tell():  # truncated in place
                    f.seek(0)
                    buf = b""
                    continue
                await asyncio.sleep(poll_s)
        finally:
            f.close()


async def follow_command(argv: tuple[str, ...] | list[str], *, log: Any = None, restart_first_s: float = 0.5,
                         restart_max_s: float = 30.0) -> AsyncIterator[str]:
    """The stdout lines of ``argv`` (stderr merged in: its complaints are logged and never parse as
    Xids), restarted with backoff whenever it exits -- ``journalctl -f`` and ``dmesg -w`` should not."""
    attempt = 0
    while True:
        started = time.monotonic()
        last = ""
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
        except OSError as e:
            rc: int | None = None
            last = repr(e)
        else:
            assert proc.stdout is not None
            try:
                while True:
                    raw = await proc.stdout.readline()
                    if not raw:
                        break
                    last = raw.decode("utf-8", "replace").rstrip("\n")
                    yield last
                rc = await proc.wait()
            finally:
                if proc.returncode is None:  # cancelled (agent stopping): do not leave the reader behind
                    proc.kill()
                    with contextlib.suppress(ProcessLookupError):
                        await proc.wait()
        if time.monotonic() - started > restart_max_s:
            attempt = 0  # it ran a good while: start the backoff over
        delay = backoff_delay(attempt, restart_first_s, restart_max_s)
        attempt += 1
        if log is not None:
            log.warning("node.kmsg_command_exited", command=shlex.join(argv), rc=rc, last_line=last[-200:],
                        restart_in_s=round(delay, 2))
        await asyncio.sleep(delay)


class KernLogWatcher:
    """Follows the configured source and publishes XidEvents and NodeAdvice for ``node``."""

    def __init__(self, node: str, settings: KernLogSettings, publish: Publish, *, log: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.settings = settings
        self._publish = publish
        self.log = log
        self.clock = clock
        self.stream = XidStream()
        self.watch = XidWatch(node, settings.watch)
        #: events the bus refused (NATS away); they are logged, not retried
        self.dropped = 0

    def source(self) -> AsyncIterator[str]:
        s = self.settings
        if s.file:
            return follow_file(s.file, poll_s=s.poll_s, from_start=s.from_start)
        return follow_command(s.cmd, log=self.log)

    async def _pump(self, lines: AsyncIterator[str], q: asyncio.Queue[str]) -> None:
        async for line in lines:
            await q.put(line)

    async def run(self) -> None:
        """Until cancelled.  Lines pass through a queue so quiet stretches are seen (``idle_s``): a
        held Xid is published once its dump has gone quiet, and flood windows close on time."""
        q: asyncio.Queue[str] = asyncio.Queue(maxsize=10_000)
        pump = asyncio.get_running_loop().create_task(self._pump(self.source(), q), name="node-kmsg-read")
        if self.log is not None:
            self.log.info("node.kmsg_watching", source=self.settings.describe())
        try:
            while True:
                if pump.done():  # the source ended or failed: say why instead of idling silently
                    pump.result()
                    raise RuntimeError(f"kernel log source ended: {self.settings.describe()}")
                try:
                    line: str | None = await asyncio.wait_for(q.get(), timeout=self.settings.idle_s)
                except TimeoutError:
                    line = None
                await self.handle(line, self.clock())
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    async def handle(self, line: str | None, now: float) -> None:
        """One line (None: the source went quiet) at ``now``: parse, limit, publish."""
        parsed = self.stream.flush() if line is None else self.stream.feed(line)
        self.watch.note_suppressed(self.stream.take_suppressed())
        out: list[XidEvent] = []
        for ev in parsed:
            out += self.watch.add(ev, now)
        out += self.watch.tick(now)
        for ev in out:
            await self._send(xid_subject(self.node), ev)
            advice = self.watch.advice(ev)
            if advice is not None:
                await self._send(advice_subject(self.node), advice)
                if self.log is not None:
                    self.log.warning("node.xid_advice", xid=ev.xid, pci=ev.pci, action=advice.action,
                                     reason=advice.reason)

    async def _send(self, subject: str, ev: Event) -> None:
        try:
            await self._publish(subject, ev)
        except Exception as e:  # noqa: BLE001 -- NATS away: report it, keep reading the log
            self.dropped += 1
            if self.log is not None:
                self.log.warning("node.health_publish_failed", subject=subject, error=repr(e), dropped=self.dropped)
