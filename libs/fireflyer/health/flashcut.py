"""Network flash cuts: link flaps and heartbeat gaps become incidents; repeated ones drain the node.

Fire-Flyer (arXiv 2408.14158, Fig. 10 and Table VIII) counts IB link failures -- "flash cuts",
a link that drops and comes back -- as about 30 % of hardware faults besides NVLink Xids.  One
flap costs a job an op or a reconnect; a link that flaps again and again costs every job placed
on it, so the policy drains a node once it has flapped ``drain_after`` times within ``window_s``.

- :func:`read_links` reads ``<sysfs_root>/class/net/<if>/{operstate,carrier,carrier_changes,speed}``
  (the root is a parameter, so tests use a fixture tree); :func:`diff_links` turns two samples
  into :class:`LinkEvent` s (``down``, ``up``, ``flap`` for carrier changes that happened
  between samples without a visible state change, ``speed`` when an up link renegotiated);
- :func:`heartbeat_gaps` turns a node's heartbeat times into ``heartbeat_gap`` events;
- :class:`FlashCutPolicy` is the pure policy over timestamped events;
- :func:`replay` runs dated link-failure counts (Table VIII's shape) through it;
  :func:`read_failures_csv` and :func:`replay_failures` do the same for a CSV of failures (per node,
  with times, or Table VIII's date,count rows) -- ``ff health flashcut-replay FILE``.

Table VIII's counts are not in the research notes this was built from (``health-planner.md``
records only that the table lists link-failure counts by date from 2023-04 to 2024-02), so
:data:`TABLE_VIII` is empty and :func:`replay_table_viii` says so instead of inventing numbers;
give it the rows once they are transcribed from the paper.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = ["LinkState", "LinkEvent", "FlashCutConfig", "FlashCutIncident", "FlashCutPolicy", "LinkWatcher",
           "read_links", "diff_links", "heartbeat_gaps", "replay", "replay_table_viii", "TABLE_VIII",
           "FailureLog", "read_failures_csv", "replay_failures",
           "DRAIN", "OBSERVE"]

DRAIN = "drain_node"
OBSERVE = "observe"
#: events that count towards a drain (``up`` is the recovery, not a new fault)
_COUNTED = ("down", "flap", "heartbeat_gap")

#: (date "YYYY-MM-DD", link failures that day) of the paper's Table VIII -- not transcribed yet (see module doc)
TABLE_VIII: tuple[tuple[str, int], ...] = ()
TABLE_VIII_NOTE = ("Table VIII's per-date counts are not in shared/research/health-planner.md (it records only "
                   "that the table spans 2023-04 to 2024-02); nothing was replayed rather than inventing counts")


class LinkState(msgspec.Struct, frozen=True, kw_only=True):
    iface: str
    operstate: str = "unknown"
    #: 1 carrier up, 0 down, None when the kernel refuses to say (interface administratively down)
    carrier: int | None = None
    carrier_changes: int | None = None
    #: negotiated speed in Mb/s; None when unknown (sysfs says -1 or refuses while the link is down)
    speed: int | None = None


class LinkEvent(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    iface: str
    t: float
    #: down | up | flap | speed | heartbeat_gap (only down, flap and heartbeat_gap count towards a drain)
    kind: str
    #: flaps this event stands for (carrier_changes counts both edges of a flap)
    count: int = 1
    detail: str = ""


class FlashCutConfig(msgspec.Struct, frozen=True, kw_only=True):
    window_s: float = 3600.0
    drain_after: int = 3
    #: a heartbeat gap is ``gap_factor`` x the expected interval or more
    gap_factor: float = 3.0

    def validate(self) -> FlashCutConfig:
        if self.window_s <= 0 or self.drain_after < 1 or self.gap_factor <= 1:
            raise InvalidArgument(f"FlashCutConfig: need window_s > 0, drain_after >= 1 and gap_factor > 1, "
                                  f"got {self.window_s}, {self.drain_after}, {self.gap_factor}; fix the health config")
        return self


class FlashCutIncident(msgspec.Struct, kw_only=True):
    node: str
    iface: str
    kind: str
    t: float
    #: counted events of this node within the window, this one included
    in_window: int
    action: str = OBSERVE
    detail: str = ""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # carrier reads fail with EINVAL on an interface that is administratively down
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _speed(text: str | None) -> int | None:
    v = _int(text)
    return v if v is not None and v > 0 else None  # -1 (SPEED_UNKNOWN) while the link has no carrier


def read_links(sysfs_root: str | Path = "/sys", *, skip: Iterable[str] = ("lo",)) -> dict[str, LinkState]:
    """Every interface under ``<sysfs_root>/class/net`` but ``skip``: its operstate and carrier counters."""
    base = Path(sysfs_root) / "class" / "net"
    if not base.is_dir():
        raise InvalidArgument(f"no {base}: give the sysfs root (the directory holding class/net)")
    skipped = set(skip)
    out: dict[str, LinkState] = {}
    for d in sorted(base.iterdir()):
        if d.name in skipped:
            continue
        out[d.name] = LinkState(iface=d.name, operstate=_read(d / "operstate") or "unknown",
                                carrier=_int(_read(d / "carrier")), carrier_changes=_int(_read(d / "carrier_changes")),
                                speed=_speed(_read(d / "speed")))
    return out


def _is_up(s: LinkState) -> bool:
    return s.operstate == "up" and s.carrier != 0


def diff_links(node: str, before: dict[str, LinkState], after: dict[str, LinkState], t: float) -> list[LinkEvent]:
    """Events between two samples: visible down/up transitions, and flaps hidden between samples
    (``carrier_changes`` grew by more than the visible transitions explain; two changes = one flap)."""
    out: list[LinkEvent] = []
    for iface, now in sorted(after.items()):
        was = before.get(iface)
        if was is None:
            continue
        seen = 0
        if _is_up(was) and not _is_up(now):
            out.append(LinkEvent(node=node, iface=iface, t=t, kind="down",
                                 detail=f"operstate {was.operstate}->{now.operstate}, carrier {was.carrier}->{now.carrier}"))
            seen = 1
        elif not _is_up(was) and _is_up(now):
            out.append(LinkEvent(node=node, iface=iface, t=t, kind="up",
                                 detail=f"operstate {was.operstate}->{now.operstate}"))
            seen = 1
        elif _is_up(was) and _is_up(now) and was.speed is not None and now.speed is not None \
                and was.speed != now.speed:  # a link that retrained to a lower rate still costs every job on it
            out.append(LinkEvent(node=node, iface=iface, t=t, kind="speed",
                                 detail=f"speed {was.speed}->{now.speed} Mb/s"))
        if was.carrier_changes is not None and now.carrier_changes is not None:
            hidden = now.carrier_changes - was.carrier_changes - seen
            if hidden >= 2:
                out.append(LinkEvent(node=node, iface=iface, t=t, kind="flap", count=hidden // 2,
                                     detail=f"carrier_changes {was.carrier_changes}->{now.carrier_changes} "
                                            f"with the link {now.operstate} at both samples"))
    return out


def heartbeat_gaps(node: str, times: Sequence[float], interval_s: float, gap_factor: float = 3.0) -> list[LinkEvent]:
    """A ``heartbeat_gap`` event (at the heartbeat that ended it) per gap of ``gap_factor`` intervals or more."""
    if interval_s <= 0:
        raise InvalidArgument(f"heartbeat_gaps: interval_s must be > 0, got {interval_s}")
    ts = sorted(times)
    return [LinkEvent(node=node, iface="", t=b, kind="heartbeat_gap",
                      detail=f"no heartbeat for {b - a:.1f}s (expected every {interval_s:g}s)")
            for a, b in zip(ts, ts[1:], strict=False) if b - a >= gap_factor * interval_s]


class FlashCutPolicy:
    """Every counted event is an incident; the ``drain_after``-th within ``window_s`` on a node drains it.

    A drained node's events are still reported (action ``observe``) but do not drain it twice;
    :meth:`readmit` (after it passes validation) starts its count afresh.  Events must come in
    time order per node.
    """

    def __init__(self, config: FlashCutConfig | None = None) -> None:
        self.config = (config or FlashCutConfig()).validate()
        self._times: dict[str, deque[float]] = {}
        self.drained: set[str] = set()
        self.drains: list[tuple[str, float]] = []

    def readmit(self, node: str) -> None:
        self.drained.discard(node)
        self._times.pop(node, None)

    def observe(self, ev: LinkEvent) -> FlashCutIncident | None:
        if ev.kind not in _COUNTED:
            return None
        q = self._times.setdefault(ev.node, deque())
        q.extend([ev.t] * max(1, ev.count))
        while q and q[0] <= ev.t - self.config.window_s:
            q.popleft()
        action = OBSERVE
        if len(q) >= self.config.drain_after and ev.node not in self.drained:
            action = DRAIN
            self.drained.add(ev.node)
            self.drains.append((ev.node, ev.t))
        where = f"{ev.node}/{ev.iface}" if ev.iface else ev.node
        return FlashCutIncident(
            node=ev.node, iface=ev.iface, kind=ev.kind, t=ev.t, in_window=len(q), action=action,
            detail=f"{ev.kind} on {where}: {len(q)} in the last {self.config.window_s:g}s "
                   f"(drain at {self.config.drain_after}){'; ' + ev.detail if ev.detail else ''}")

    def run(self, events: Iterable[LinkEvent]) -> list[FlashCutIncident]:
        out = []
        for ev in sorted(events, key=lambda e: e.t):
            inc = self.observe(ev)
            if inc is not None:
                out.append(inc)
        return out


class LinkWatcher:
    """Samples one node's links under ``sysfs_root``; :meth:`sample` returns the events since the last call."""

    def __init__(self, node: str, sysfs_root: str | Path = "/sys") -> None:
        self.node = node
        self.sysfs_root = Path(sysfs_root)
        self._last: dict[str, LinkState] | None = None

    def sample(self, t: float) -> list[LinkEvent]:
        now = read_links(self.sysfs_root)
        events = diff_links(self.node, self._last, now, t) if self._last is not None else []
        self._last = now
        return events


def replay(rows: Sequence[tuple[str, int]], config: FlashCutConfig | None = None, *,
           placement: str = "burst") -> dict[str, Any]:
    """Dated link-failure counts through the policy, each date's failures on one node's link (the
    table names no nodes, so this is the upper bound on drains).  ``placement``: ``burst`` puts a
    date's failures one minute apart from midnight, ``spread`` spreads them evenly over the day."""
    if placement not in ("burst", "spread"):
        raise InvalidArgument(f"replay: placement must be 'burst' or 'spread', got {placement!r}")
    policy = FlashCutPolicy(config)
    events: list[LinkEvent] = []
    for i, (date, count) in enumerate(rows):
        try:
            day = dt.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            raise InvalidArgument(f"replay: row {i} date {date!r} is not YYYY-MM-DD") from None
        step = 60.0 if placement == "burst" else 86_400.0 / max(count, 1)
        events += [LinkEvent(node=f"table-row-{i}", iface="ib0", t=day + k * step, kind="down")
                   for k in range(count)]
    incidents = policy.run(events)
    return {"rows": len(rows), "failures": sum(c for _, c in rows), "incidents": len(incidents),
            "drains": len(policy.drains), "placement": placement,
            "window_s": policy.config.window_s, "drain_after": policy.config.drain_after}


def replay_table_viii(config: FlashCutConfig | None = None) -> dict[str, Any]:
    """:func:`replay` of :data:`TABLE_VIII` under both placements, or why there is nothing to replay."""
    if not TABLE_VIII:
        return {"available": False, "note": TABLE_VIII_NOTE}
    return {"available": True, "burst": replay(TABLE_VIII, config, placement="burst"),
            "spread": replay(TABLE_VIII, config, placement="spread")}


class FailureLog(msgspec.Struct, kw_only=True):
    """A CSV of link failures read by :func:`read_failures_csv`: events (one per failure, per node) or
    Table VIII's dated counts (no nodes)."""

    events: list[LinkEvent] = []
    dated_counts: list[tuple[str, int]] = []


_TIME_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S")


def _when(text: str, where: str) -> float:
    text = text.strip()
    try:
        return float(text)  # seconds since the epoch
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        parsed = None
        for fmt in _TIME_FORMATS:
            try:
                parsed = dt.datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
    if parsed is None:
        raise InvalidArgument(f"{where}: {text!r} is not a time (YYYY-MM-DD[ HH:MM[:SS]], ISO 8601 or epoch seconds)")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)  # the logs this comes from are in UTC unless they say otherwise
    return parsed.timestamp()


def read_failures_csv(text: str) -> FailureLog:
    """Link failures from CSV text, one of two shapes (``#`` comments and a header line are skipped):

    - ``node,time[,interface[,count]]``: each row a failure (``count`` of them) of ``node`` at ``time``;
    - ``date,count``: Table VIII's shape, failures per day with no node named.

    The shape is told by the first data row: an integer second column makes it ``date,count``.
    """
    rows: list[tuple[int, list[str]]] = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if not rows and cells[0].lower() in ("node", "date", "host", "time"):
            continue  # the header
        rows.append((i, cells))
    if not rows:
        return FailureLog()
    first = rows[0][1]
    if len(first) == 2 and first[1].isdigit():
        out: list[tuple[str, int]] = []
        for i, cells in rows:
            if len(cells) != 2 or not cells[1].isdigit():
                raise InvalidArgument(f"line {i}: expected date,count like the rows before, got {','.join(cells)!r}")
            _when(cells[0], f"line {i}")
            out.append((cells[0], int(cells[1])))
        return FailureLog(dated_counts=out)
    events: list[LinkEvent] = []
    for i, cells in rows:
        if not 2 <= len(cells) <= 4 or not cells[0]:
            raise InvalidArgument(f"line {i}: expected node,time[,interface[,count]], got {','.join(cells)!r}")
        count = 1
        if len(cells) == 4:
            if not cells[3].isdigit() or int(cells[3]) < 1:
                raise InvalidArgument(f"line {i}: count must be a positive integer, got {cells[3]!r}")
            count = int(cells[3])
        events.append(LinkEvent(node=cells[0], iface=cells[2] if len(cells) > 2 else "", t=_when(cells[1], f"line {i}"),
                                kind="down", count=count))
    return FailureLog(events=events)


def replay_failures(log: FailureLog, config: FlashCutConfig | None = None) -> dict[str, Any]:
    """The policy over a :class:`FailureLog`: the drains it would make, per node (events), or the
    :func:`replay` of dated counts under both placements."""
    if log.dated_counts:
        return {"shape": "date,count", "burst": replay(log.dated_counts, config, placement="burst"),
                "spread": replay(log.dated_counts, config, placement="spread")}
    policy = FlashCutPolicy(config)
    incidents = policy.run(log.events)
    nodes = sorted({e.node for e in log.events})
    return {"shape": "node,time", "nodes": len(nodes), "failures": sum(max(1, e.count) for e in log.events),
            "incidents": len(incidents), "drains": len(policy.drains),
            "drained": [{"node": n, "t": t, "time": dt.datetime.fromtimestamp(t, dt.UTC).isoformat()}
                        for n, t in policy.drains],
            "window_s": policy.config.window_s, "drain_after": policy.config.drain_after}
