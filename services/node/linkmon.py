"""The node agent's link monitor: poll the network interfaces, publish changes, advise a drain on flash cuts.

    FF_NODE_LINKMON=1                  watch /sys (a production node)
    FF_NODE_SYSFS_ROOT=/tmp/fake-sys   watch another tree (implies on; tests, containers with /host/sys)

Neither set (the local cluster's default, where three agents share one machine): no monitor.
Other settings: ``FF_NODE_LINK_INTERVAL_S`` (1), ``FF_NODE_LINK_IFACES`` (comma-separated
globs, ``ib*,eth0``; default every interface but ``lo``), ``FF_NODE_FLASHCUT_WINDOW_S`` (3600),
``FF_NODE_FLASHCUT_DRAIN_AFTER`` (3) and ``FF_NODE_FLASHCUT_GAP_FACTOR`` (3).

Every ``interval_s`` it reads ``<root>/class/net/<if>/{operstate,carrier,carrier_changes,speed}``
(:func:`fireflyer.health.flashcut.read_links`) and publishes each change
(:func:`~fireflyer.health.flashcut.diff_links`: down, up, hidden flaps, speed) as a
:class:`~fireflyer.health.events.LinkEvent` on ``ff.node.v1.node.<node>.link``.  Downs, flaps and
heartbeat gaps go through :class:`~fireflyer.health.flashcut.FlashCutPolicy`; when it says drain
(``drain_after`` of them within ``window_s``), a :class:`~fireflyer.health.events.NodeAdvice` with
action ``drain`` goes out on ``ff.node.v1.node.<node>.advice`` -- once, until the agent restarts.

Heartbeat gaps: the agent tells :meth:`LinkMonitor.heartbeat_sent` when a heartbeat reached NATS;
a stretch of ``gap_factor`` intervals without one (NATS or the node's network was away from here)
is a ``heartbeat_gap`` event, published once the bus is back.  The health service sees the same
gap from the other side, for nodes that cannot tell it themselves.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.bus.events import Event
from fireflyer.core.errors import FireFlyerError, SettingsError
from fireflyer.health import flashcut
from fireflyer.health.events import LinkEvent, NodeAdvice, advice_subject, link_event, link_subject

__all__ = ["LinkMonSettings", "LinkMonitor"]

Publish = Callable[[str, Event], Awaitable[None]]


def _num(env: Mapping[str, str], key: str, default: float, kind: type = float) -> Any:
    raw = env.get(key, "")
    try:
        return kind(raw) if raw else default
    except ValueError:
        raise SettingsError(f"{key} must be a {kind.__name__}, got {raw!r}", key=key,
                            expected=kind.__name__) from None


class LinkMonSettings(msgspec.Struct, frozen=True, kw_only=True):
    sysfs_root: str = "/sys"
    interval_s: float = 1.0
    #: fnmatch globs of the interfaces to watch; empty: all but lo
    ifaces: tuple[str, ...] = ()
    flashcut: flashcut.FlashCutConfig = msgspec.field(default_factory=flashcut.FlashCutConfig)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LinkMonSettings | None:
        """The settings of ``FF_NODE_LINKMON`` / ``FF_NODE_SYSFS_ROOT`` and friends; None when off."""
        root = env.get("FF_NODE_SYSFS_ROOT", "")
        if not root and env.get("FF_NODE_LINKMON", "") not in ("1", "true", "yes"):
            return None
        root = root or "/sys"
        if not (Path(root) / "class" / "net").is_dir():
            raise SettingsError(f"FF_NODE_SYSFS_ROOT: no {root}/class/net; give the directory that holds "
                                f"class/net (/sys on a node)", key="FF_NODE_SYSFS_ROOT", expected="a sysfs root")
        interval = _num(env, "FF_NODE_LINK_INTERVAL_S", 1.0)
        if not interval > 0:
            raise SettingsError(f"FF_NODE_LINK_INTERVAL_S must be positive, got {interval}",
                                key="FF_NODE_LINK_INTERVAL_S", expected="float > 0")
        cfg = flashcut.FlashCutConfig(window_s=_num(env, "FF_NODE_FLASHCUT_WINDOW_S", 3600.0),
                                      drain_after=_num(env, "FF_NODE_FLASHCUT_DRAIN_AFTER", 3, int),
                                      gap_factor=_num(env, "FF_NODE_FLASHCUT_GAP_FACTOR", 3.0))
        try:
            cfg.validate()
        except FireFlyerError as e:
            raise SettingsError(f"FF_NODE_FLASHCUT_*: {e.message}", key="FF_NODE_FLASHCUT_DRAIN_AFTER") from None
        ifaces = tuple(g.strip() for g in env.get("FF_NODE_LINK_IFACES", "").split(",") if g.strip())
        return cls(sysfs_root=root, interval_s=interval, ifaces=ifaces, flashcut=cfg)


class LinkMonitor:
    """One node's links and heartbeat gaps through the flash-cut policy; see the module docs."""

    def __init__(self, node: str, settings: LinkMonSettings, publish: Publish, *, log: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.settings = settings
        self._publish = publish
        self.log = log
        self.clock = clock
        self.policy = flashcut.FlashCutPolicy(settings.flashcut)
        self._last: dict[str, flashcut.LinkState] | None = None
        self._last_beat: float | None = None
        #: events made outside the loop (heartbeat gaps), published by its next round
        self._outbox: list[tuple[str, Event]] = []
        self.dropped = 0

    def _links(self) -> dict[str, flashcut.LinkState]:
        links = flashcut.read_links(self.settings.sysfs_root)
        if not self.settings.ifaces:
            return links
        return {k: v for k, v in links.items() if any(fnmatch.fnmatchcase(k, g) for g in self.settings.ifaces)}

    def _judge(self, ev: flashcut.LinkEvent, wire: LinkEvent) -> list[tuple[str, Event]]:
        """The wire event, with the policy's count, and the drain advice when the policy says so."""
        inc = self.policy.observe(ev)
        if inc is not None:
            wire = msgspec.structs.replace(wire, in_window=inc.in_window)
        out: list[tuple[str, Event]] = [(link_subject(self.node), wire)]
        if inc is not None and inc.action == flashcut.DRAIN:
            out.append((advice_subject(self.node), NodeAdvice(
                node=self.node, action="drain", time=ev.t, source="flashcut", interface=ev.iface,
                reason=f"flash cuts: {inc.detail}", evidence=(wire.event_id,))))
        return out

    def sample(self, t: float) -> list[tuple[str, Event]]:
        """Read the links once; the (subject, event) pairs to publish for what changed since the last sample."""
        now = self._links()
        before, self._last = self._last, now
        if before is None:
            return []
        out: list[tuple[str, Event]] = []
        for ev in flashcut.diff_links(self.node, before, now, t):
            was, after = before.get(ev.iface), now.get(ev.iface)
            delta = None
            if was is not None and after is not None and was.carrier_changes is not None \
                    and after.carrier_changes is not None:
                delta = after.carrier_changes - was.carrier_changes
            out += self._judge(ev, link_event(ev, after=after, delta=delta))
        return out

    def heartbeat_sent(self, t: float, interval_s: float) -> None:
        """A heartbeat reached NATS at ``t``: a long stretch since the previous one is a gap event."""
        prev, self._last_beat = self._last_beat, t
        if prev is None:
            return
        for gap in flashcut.heartbeat_gaps(self.node, [prev, t], interval_s, self.settings.flashcut.gap_factor):
            self._outbox += self._judge(gap, link_event(gap))

    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled."""
        if self.log is not None:
            self.log.info("node.linkmon_watching", sysfs_root=self.settings.sysfs_root,
                          ifaces=",".join(self.settings.ifaces) or "*", window_s=self.settings.flashcut.window_s,
                          drain_after=self.settings.flashcut.drain_after)
        while True:
            try:
                out = self.sample(self.clock())
            except FireFlyerError as e:  # the tree vanished (a container lost its mount): say so, try again
                out = []
                if self.log is not None:
                    self.log.warning("node.linkmon_read_failed", error=str(e))
            out, self._outbox = self._outbox + out, []
            for subject, ev in out:
                await self._send(subject, ev)
            await asyncio.sleep(self.settings.interval_s)

    async def _send(self, subject: str, ev: Event) -> None:
        if self.log is not None:
            if isinstance(ev, NodeAdvice):
                self.log.warning("node.link_advice", action=ev.action, reason=ev.reason)
            elif isinstance(ev, LinkEvent):
                self.log.info("node.link_event", interface=ev.interface, kind=ev.kind, evidence=ev.evidence)
        try:
            await self._publish(subject, ev)
        except Exception as e:  # noqa: BLE001 -- NATS away: report it, keep watching
            self.dropped += 1
            if self.log is not None:
                self.log.warning("node.health_publish_failed", subject=subject, error=repr(e), dropped=self.dropped)
