"""From parsed Xids to what a node agent publishes: flood limiting, repeats, advice.  Pure: time is a parameter.

    watch = XidWatch("n3")
    for ev in stream.feed(line):                      # fireflyer.health.xid.XidStream
        for out in watch.add(ev, t=now, suppressed=stream.take_suppressed()):
            publish(xid_subject("n3"), out)           # fireflyer.health.events.XidEvent
            if (adv := watch.advice(out)) is not None:
                publish(advice_subject("n3"), adv)
    for out in watch.tick(now):                       # every second or so: floods that ended
        publish(xid_subject("n3"), out)

**Floods.**  A faulting kernel can print the same Xid thousands of times a second (Xid 31 and 43
storms are the common case).  Per GPU and Xid, the first line is published at once and opens a
*flood window* of ``flood_window_s``; the lines that follow within it are counted and published
as one event with ``count`` = N when the window ends (a flood that goes on is reported once per
window).  The kernel's own limiter (``N callbacks suppressed``) drops lines before they reach us;
its N rides on the next published event as ``suppressed``.

**Repeats.**  A window is one *episode*.  When a GPU has the same Xid in another episode within
``repeat_window_s``, the table's ``on_repeat`` action replaces the first action (an ECC row remap
once is routine; twice in a day drains the node).  For Xids that blame the job, only an episode
of another process counts: one broken program that faults again is still that program.

**Advice.**  Each episode whose action is not ``none`` gives one :class:`~fireflyer.health.events.NodeAdvice`.
"""

from __future__ import annotations

from collections import deque

import msgspec

from fireflyer.core.errors import InvalidArgument

from . import xid as xidmod
from .events import NodeAdvice, XidEvent, xid_event

__all__ = ["XidWatchConfig", "XidWatch"]


class XidWatchConfig(msgspec.Struct, frozen=True, kw_only=True):
    #: lines of one Xid on one GPU within this long after the first are one flood
    flood_window_s: float = 10.0
    #: episodes of one Xid on one GPU within this long count as a repeat
    repeat_window_s: float = 86_400.0

    def validate(self) -> XidWatchConfig:
        if not (self.flood_window_s > 0 and self.repeat_window_s > 0):
            raise InvalidArgument(f"XidWatchConfig: flood_window_s and repeat_window_s must be > 0, got "
                                  f"{self.flood_window_s} and {self.repeat_window_s}")
        return self


_Key = tuple[str, int | None, int]  # (pci, gpu instance, xid)


class _Flood:
    __slots__ = ("ends", "pending", "first_t", "last_t", "last", "action", "repeat")

    def __init__(self, ends: float, action: str, repeat: int) -> None:
        self.ends = ends
        self.pending = 0
        self.first_t = 0.0
        self.last_t = 0.0
        self.last: xidmod.XidEvent | None = None
        self.action = action
        self.repeat = repeat


class XidWatch:
    """One node's Xids: floods collapsed, repeats escalated, advice derived (see the module docs)."""

    def __init__(self, node: str, config: XidWatchConfig | None = None) -> None:
        self.node = node
        self.config = (config or XidWatchConfig()).validate()
        self._floods: dict[_Key, _Flood] = {}
        #: (pci, xid) -> (start time, pid) of its episodes within the repeat window
        self._episodes: dict[tuple[str, int], deque[tuple[float, int | None]]] = {}
        self._suppressed = 0
        #: Xid lines seen and messages published, for the agent's log
        self.lines = 0
        self.published = 0

    def note_suppressed(self, n: int) -> None:
        """The kernel's limiter dropped ``n`` messages: told on the next published event."""
        self._suppressed += n

    def _take_suppressed(self) -> int:
        n, self._suppressed = self._suppressed, 0
        return n

    def _episode(self, ev: xidmod.XidEvent, t: float) -> tuple[str, int]:
        info = ev.info
        q = self._episodes.setdefault((ev.pci, ev.xid), deque())
        while q and q[0][0] <= t - self.config.repeat_window_s:
            q.popleft()
        if info.blame == "job":
            # processes other than this one that had it (an unknown pid is one unknown process)
            prior = len({pid for _, pid in q if pid is None or ev.pid is None or pid != ev.pid})
        else:
            prior = len(q)
        q.append((t, ev.pid))
        return (info.on_repeat if prior else info.actions[0]), prior + 1

    def add(self, ev: xidmod.XidEvent, t: float, *, suppressed: int = 0) -> list[XidEvent]:
        """One parsed Xid read at ``t``; the events to publish now (the first of a flood, and any
        flood whose window ended before ``t``)."""
        self._suppressed += suppressed
        self.lines += 1
        out = self.tick(t)
        key = (ev.pci, ev.gpu_instance, ev.xid)
        flood = self._floods.get(key)
        if flood is not None:  # within an open window: count it, publish at the window's end
            if flood.pending == 0:
                flood.first_t = t
            flood.pending += 1
            flood.last_t = t
            flood.last = ev
            return out
        action, repeat = self._episode(ev, t)
        self._floods[key] = _Flood(t + self.config.flood_window_s, action, repeat)
        out.append(xid_event(self.node, ev, t=t, first_t=t, suppressed=self._take_suppressed(), action=action,
                             repeat=repeat))
        self.published += 1
        return out

    def tick(self, t: float) -> list[XidEvent]:
        """Floods whose window ended by ``t``: one event each for the lines counted in it.  A window
        that counted lines opens the next one (the flood may go on); a quiet one closes."""
        out: list[XidEvent] = []
        for key, flood in list(self._floods.items()):
            if flood.ends > t:
                continue
            if flood.pending and flood.last is not None:
                out.append(xid_event(self.node, flood.last, t=flood.last_t, first_t=flood.first_t,
                                     count=flood.pending, suppressed=self._take_suppressed(), action=flood.action,
                                     repeat=flood.repeat, summary=True))
                flood.ends, flood.pending = t + self.config.flood_window_s, 0
            else:
                del self._floods[key]
        self.published += len(out)
        return out

    def advice(self, ev: XidEvent) -> NodeAdvice | None:
        """The advice an episode's first event gives (None for ``none`` and for flood summaries)."""
        if ev.action == "none" or ev.summary:
            return None
        where = f"GPU {ev.pci}" + (f" (MIG instance {ev.gpu_instance})" if ev.gpu_instance is not None else "")
        again = f", episode {ev.repeat} within {self.config.repeat_window_s:g}s" if ev.repeat > 1 else ""
        who = f"the job (pid {ev.pid}{' ' + ev.process if ev.process else ''})" if ev.blame == "job" and ev.pid \
            else ev.blame
        return NodeAdvice(node=ev.node, action=ev.action, time=ev.time, source="xid", pci=ev.pci, pid=ev.pid,
                          reason=f"Xid {ev.xid} {ev.mnemonic} on {where}{again}: blames {who}; {ev.action}",
                          evidence=(ev.event_id,))
