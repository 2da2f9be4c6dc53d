"""NVIDIA Xid events from kernel logs: a parser, the Xid table as data, and counts per category.

    events = parse_lines(open("/var/log/kern.log"))       # [XidEvent, ...]
    summary = summarize(events)                          # counts and shares per category, group, Xid
    info = XID_TABLE[79]                                 # category, actions, who is to blame

The parser reads the shapes real nodes produce: plain ``dmesg`` (``[12345.678901] NVRM: Xid ...``),
``dmesg -T`` (``[Tue Mar  5 10:11:12 2024] ...``), journal/syslog (``Mar 05 10:11:12 host kernel: ...``,
ISO stamps too, with or without the kernel's own ``[uptime]``; ``journalctl -o short-monotonic``'s
``[uptime] host kernel: ...``), ``dmesg -x`` facility prefixes, ``dmesg -r``'s ``<4>`` priorities and
``/dev/kmsg`` records (``4,1234,171620236,-;NVRM: ...``); the
device as ``PCI:0000:3b:00``, old ``0000:3b:00`` or MIG ``PCI:0000:01:00 GPU-I:05``.  Lines that are not
events are handled so they do not become events:

- multi-line dumps after an Xid (GSP RPC history, register dumps, kernel stack traces) are
  *continuations*: they are kept in the previous event's ``detail``;
- rate-limit lines (``... callbacks suppressed``, ``printk: N messages suppressed``) are counted as
  ``suppressed`` (the kernel dropped those messages: counts are a lower bound when it is non-zero);
- NVSwitch ``SXid`` lines are fabric errors, not GPU Xids: counted apart, never as events;
- ``NVRM: GPU at PCI:...: GPU-<uuid>`` context lines give the GPU UUID of later events;
- one record read twice (dmesg and kern.log concatenated) appears as the same µs kernel timestamp
  and text: kept once.

The Xid table follows NVIDIA's Xid catalog (immediate / investigatory resolution) and the grouping
of the Fire-Flyer paper's Table V (software, NVLink, ECC, uncorrectable, GSP).  Application Xids
(13, 31, 43, 45, 69) blame the job: the node stays in service.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

import msgspec

__all__ = [
    "ACTIONS",
    "XidInfo",
    "XID_TABLE",
    "xid_info",
    "XidEvent",
    "ParseStats",
    "ParseResult",
    "XidStream",
    "parse_lines",
    "parse_text",
    "CountRow",
    "XidSummary",
    "count_by",
    "summarize",
]

#: what an Xid asks of the platform, mildest first
ACTIONS = ("none", "restart_job", "reset_gpu", "reboot_node", "drain", "rma")


class XidInfo(msgspec.Struct, frozen=True):
    """One row of the Xid table."""

    xid: int
    mnemonic: str
    description: str
    #: what broke: application, nvlink, memory, fallen_off_bus, gsp, micro_controller, driver, recovery, other
    category: str
    #: the Fire-Flyer paper's grouping (Table V): software, nvlink, ecc, uncorrectable, gsp, other
    group: str
    #: "job" (the application caused it: the node stays in service) or "node"
    blame: str
    #: what to do now, in order (members of ACTIONS)
    actions: tuple[str, ...]
    #: what to do when it repeats on the same GPU (a member of ACTIONS)
    on_repeat: str
    #: NVIDIA's catalog buckets: immediate / investigatory resolution
    nvidia: str


def _x(xid: int, mnemonic: str, description: str, category: str, group: str, blame: str,
       actions: tuple[str, ...], on_repeat: str, nvidia: str) -> XidInfo:
    return XidInfo(xid, mnemonic, description, category, group, blame, actions, on_repeat, nvidia)


#: The Xids Fire-Flyer reports (and 154, the driver's own summary of the action it needs).
XID_TABLE: dict[int, XidInfo] = {x.xid: x for x in (
    _x(13, "GR_EXCEPTION", "graphics engine exception (usually an out-of-range access in a kernel)",
       "application", "software", "job", ("restart_job",), "drain", "RESTART_APP / WORKFLOW_XID_13"),
    _x(31, "MMU_ERR_FLT", "GPU memory page fault (an illegal address in the application)",
       "application", "software", "job", ("restart_job",), "drain", "RESTART_APP / WORKFLOW_XID_31"),
    _x(43, "RESETCHANNEL_VERIF_ERROR", "GPU stopped processing the channel of a faulting application; "
       "the GPU stays healthy", "application", "software", "job", ("none",), "none", "IGNORE / CONTACT_SUPPORT"),
    _x(44, "GR_FAULT_CTXSW", "graphics engine fault during a context switch", "driver", "uncorrectable", "node",
       ("none",), "drain", "IGNORE / CONTACT_SUPPORT"),
    _x(45, "PREEMPTIVE_REMOVAL", "preemptive cleanup after earlier errors (a secondary Xid: act on the root one)",
       "application", "software", "job", ("none",), "none", "WORKFLOW_XID_45"),
    _x(48, "GPU_ECC_DBE", "double-bit ECC error", "memory", "uncorrectable", "node", ("drain", "reset_gpu"), "rma",
       "WORKFLOW_XID_48"),
    _x(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint/warning", "micro_controller", "uncorrectable",
       "node", ("drain", "reset_gpu"), "rma", "CONTACT_SUPPORT"),
    _x(62, "PMU_HALT_ERROR", "internal micro-controller halt", "micro_controller", "uncorrectable", "node",
       ("drain", "reset_gpu"), "rma", "RESET_GPU / CONTACT_SUPPORT"),
    _x(63, "ROW_REMAP_EVENT", "row remapping / page retirement recorded (handled; a reset activates it)",
       "memory", "ecc", "node", ("reset_gpu",), "drain", "IGNORE / IGNORE"),
    _x(64, "ROW_REMAP_FAILURE", "row remapping / page retirement failed", "memory", "ecc", "node",
       ("drain", "reset_gpu"), "rma", "RESET_GPU / CONTACT_SUPPORT"),
    _x(69, "GR_CLASS_ERROR", "graphics engine class error", "application", "uncorrectable", "job",
       ("restart_job",), "drain", "RESTART_APP / CHECK_APP"),
    _x(74, "NVLINK_ERROR", "NVLink error (the peer GPU may be the faulty one)", "nvlink", "nvlink", "node",
       ("drain", "reset_gpu"), "rma", "WORKFLOW_NVLINK_ERR / CONTACT_SUPPORT"),
    _x(79, "GPU_FALLEN_OFF_BUS", "GPU has fallen off the bus", "fallen_off_bus", "uncorrectable", "node",
       ("drain", "reboot_node"), "rma", "RESTART_BM / CONTACT_SUPPORT"),
    _x(94, "CONTAINED_ERROR", "contained memory error (only the application using it is affected)", "memory", "ecc",
       "node", ("restart_job", "reset_gpu"), "drain", "RESTART_APP / IGNORE"),
    _x(95, "UNCONTAINED_ERROR", "uncontained memory error", "memory", "ecc", "node", ("drain", "reset_gpu"), "rma",
       "RESET_GPU / IGNORE"),
    _x(119, "GSP_RPC_TIMEOUT", "GSP firmware RPC timeout", "gsp", "gsp", "node", ("drain", "reset_gpu"),
       "reboot_node", "RESET_GPU / INVESTIGATE_SW"),
    _x(154, "RECOVERY_ACTION", "the driver's summary of the recovery the GPU needs", "recovery", "other", "node",
       ("none",), "none", "follow the action it names"),
)}


def xid_info(xid: int) -> XidInfo:
    """The table's row, or a conservative one for an Xid the table does not know (drain and look)."""
    known = XID_TABLE.get(xid)
    if known is not None:
        return known
    return XidInfo(xid, "UNKNOWN", f"Xid {xid} is not in Fire-Flyer's table: look it up in NVIDIA's catalog",
                   "other", "other", "node", ("drain",), "drain", "see the catalog")


class XidEvent(msgspec.Struct, frozen=True):
    """One Xid the kernel reported."""

    xid: int
    #: PCI bus id as printed, lower case, without the ``PCI:`` prefix and the function (``0000:3b:00``)
    pci: str
    message: str
    #: the line's time stamp as printed (``12345.678901``, ``Tue Mar  5 10:11:12 2024``, ``Mar 05 10:11:12``)
    timestamp: str = ""
    #: seconds since boot when the line carries the kernel's own stamp
    uptime_s: float | None = None
    host: str = ""
    #: MIG GPU instance (``GPU-I:05`` -> 5)
    gpu_instance: int | None = None
    pid: int | None = None
    process: str = ""
    #: from an earlier (or later) ``NVRM: GPU at PCI:...: GPU-...`` line
    uuid: str = ""
    #: continuation lines (a GSP RPC dump, a stack trace), their prefixes removed
    detail: tuple[str, ...] = ()
    #: 1-based line number in the input
    line: int = 0
    #: the Xid line as read (prefixes included, line end removed)
    raw: str = ""

    @property
    def info(self) -> XidInfo:
        return xid_info(self.xid)


class ParseStats(msgspec.Struct):
    lines: int = 0
    events: int = 0
    continuation: int = 0
    #: messages the kernel's rate limiter dropped (the N of "N callbacks suppressed")
    suppressed: int = 0
    rate_limit_lines: int = 0
    sxid: int = 0
    duplicates: int = 0
    #: lines that named an Xid but could not be read (kept so nothing is lost silently)
    malformed: int = 0


class ParseResult(msgspec.Struct):
    events: list[XidEvent]
    stats: ParseStats
    #: PCI bus id -> GPU UUID, from the context lines
    uuids: dict[str, str] = {}


_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
# The prefixes, outermost first; each leaves the rest of the line in group "rest".
_DMESG = re.compile(r"^\[\s*(?P<up>\d+\.\d+)\]\s?(?P<rest>.*)$")
_DMESG_T = re.compile(rf"^\[(?P<ts>{_DAY} {_MONTH} [ \d]\d \d\d:\d\d:\d\d \d{{4}})\]\s?(?P<rest>.*)$")
_SYSLOG = re.compile(rf"^(?P<ts>{_MONTH} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?) (?P<host>\S+) (?P<tag>[^:\s]+):\s?(?P<rest>.*)$")
_ISO = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?) (?P<host>\S+) "
                  r"(?P<tag>[^:\s]+):\s?(?P<rest>.*)$")
# ``journalctl -o short-monotonic``: ``[  171.620236] host kernel: ...`` (the host after the kernel's stamp)
_MONO_HOST = re.compile(r"^(?P<host>[^\s:\[\]]+) kernel: ?(?P<rest>.*)$")
# ``dmesg -r`` / console: a ``<4>`` priority before the stamp; ``/dev/kmsg`` records: ``4,1234,171620236,-;text``
_PRIO = re.compile(r"^<\d{1,3}>")
_KMSG = re.compile(r"^\d{1,3},\d+,(?P<usec>\d+),[^;]*;(?P<rest>.*)$")
_FACILITY = re.compile(r"^(?:kern|user|daemon|syslog)\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:\s?"
                       r"(?P<rest>.*)$")

_XID = re.compile(r"NVRM: Xid \((?P<dev>[^)]*)\):\s*(?P<xid>\d+)\s*(?:,\s*(?P<tail>.*))?$")
_SXID = re.compile(r"\bSXid \(")
_PCI = re.compile(r"(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_GI = re.compile(r"GPU-I:\s*(?P<gi>\d+)")
_PID = re.compile(r"^pid=(?P<pid>'<unknown>'|<unknown>|\d+)\s*(?:,\s*|$)")
_NAME = re.compile(r"^name=(?P<name>[^,]*?)\s*(?:,\s*|$)")
_SUPPRESSED = re.compile(r"(?P<n>\d+) (?:callbacks|messages) suppressed")
_UUID = re.compile(r"NVRM: GPU at (?:PCI:)?(?P<pci>[0-9a-fA-F:.]+):\s*(?P<uuid>GPU-[0-9a-fA-F-]+)")
# Lines that carry on a dump: the driver's own follow-up lines and kernel stack traces.
_CONTINUATION = re.compile(r"^(?:NVRM: |\s|Call Trace:|<TASK>|</TASK>|<IRQ>|</IRQ>|CPU: \d+ PID:|Hardware name:|"
                           r"RIP: |RSP: |R[A-Z0-9]{2}: |Code: |Modules linked in:|\? |[a-z_][\w.]*\+0x[0-9a-f]+/0x)")


def _strip_prefix(line: str) -> tuple[str, str, float | None, str, bool]:
    """(rest, timestamp, uptime, host, is_kernel) of one log line."""
    ts, host, up, kernel = "", "", None, True
    m = _SYSLOG.match(line) or _ISO.match(line)
    if m:
        ts, host, line = m["ts"], m["host"], m["rest"]
        kernel = m["tag"] == "kernel"
    else:
        k = _KMSG.match(line)
        if k:
            usec = int(k["usec"])
            return k["rest"], f"{usec // 1_000_000}.{usec % 1_000_000:06d}", usec / 1e6, "", True
        f = _FACILITY.match(line)
        if f:
            line = f["rest"]
        line = _PRIO.sub("", line, count=1)
        m = _DMESG_T.match(line)
        if m:
            ts, line = m["ts"], m["rest"]
    d = _DMESG.match(line)  # dmesg's own stamp, also inside a syslog line
    if d:
        up, line = float(d["up"]), d["rest"]
        ts = ts or d["up"]
        if not host:
            h = _MONO_HOST.match(line)
            if h:
                host, line = h["host"], h["rest"]
    return line, ts, up, host, kernel


def _event(body: str, m: re.Match[str], ts: str, up: float | None, host: str, lineno: int,
           raw: str = "") -> XidEvent | None:
    dev = m["dev"]
    p = _PCI.search(dev)
    if p is None:
        return None
    gi = _GI.search(dev)
    tail = (m["tail"] or "").strip()
    pid: int | None = None
    name = ""
    pm = _PID.match(tail)
    if pm:
        pid = int(pm["pid"]) if pm["pid"].isdigit() else None
        tail = tail[pm.end():]
    nm = _NAME.match(tail)
    if nm:
        name = "" if nm["name"] == "<unknown>" else nm["name"]
        tail = tail[nm.end():]
    # without the function (``.0``): a GPU is function 0, and the context lines name it without one
    return XidEvent(xid=int(m["xid"]), pci=p["pci"].lower().split(".")[0], message=tail.strip(), timestamp=ts, uptime_s=up,
                    host=host, gpu_instance=int(gi["gi"]) if gi else None, pid=pid, process=name, line=lineno,
                    raw=raw)


class XidStream:
    """The parser, one line at a time, for a log that is still being written (``dmesg -w``, a followed file).

        stream = XidStream()
        for line in tail:
            for ev in stream.feed(line):      # events whose dump (if any) has ended
                publish(ev)
        stream.flush()                        # when the source goes quiet: the open event, dump so far

    An Xid is held back until the line after it shows its dump has ended (a line that is not a
    continuation) or :meth:`flush` is called, so its ``detail`` is complete.  The UUID comes from
    ``NVRM: GPU at ...`` lines seen *before* it (:func:`parse_lines` also fills it from later ones).
    :attr:`stats` counts everything seen so far; the ``suppressed`` counter is also kept per
    stretch in :meth:`take_suppressed`, so a watcher can attach the kernel's dropped-message
    count to what it publishes next.
    """

    #: how many (host, uptime, text) keys are kept to drop a record read twice
    SEEN_MAX = 4096

    def __init__(self) -> None:
        self.stats = ParseStats()
        self.uuids: dict[str, str] = {}
        self._seen: dict[tuple[str, float, str], None] = {}  # insertion-ordered: the oldest is dropped first
        self._open: XidEvent | None = None
        self._detail: list[str] = []
        self._lineno = 0
        self._suppressed = 0

    def take_suppressed(self) -> int:
        """Messages the kernel's rate limiter reported dropped since the last call."""
        n, self._suppressed = self._suppressed, 0
        return n

    def _close(self) -> list[XidEvent]:
        ev, self._open = self._open, None
        if ev is None:
            return []
        uuid = self.uuids.get(ev.pci, "")
        if self._detail or uuid:
            ev = msgspec.structs.replace(ev, detail=tuple(self._detail), uuid=uuid)
        self._detail = []
        self.stats.events += 1
        return [ev]

    def flush(self) -> list[XidEvent]:
        """The event still waiting for its dump to end, if any."""
        return self._close()

    def feed(self, raw: str) -> list[XidEvent]:
        """One line (any shape of the module docs); the events it completed (zero or one)."""
        self._lineno += 1
        line = raw.rstrip("\r\n")
        if not line.strip():
            return []
        stats = self.stats
        stats.lines += 1
        body, ts, up, host, kernel = _strip_prefix(line)
        if not kernel:  # another program's syslog line: never ours, and it ends a dump
            return self._close()
        if _SXID.search(body):
            stats.sxid += 1
            return self._close()
        s = _SUPPRESSED.search(body)
        if s:
            stats.rate_limit_lines += 1
            stats.suppressed += int(s["n"])
            self._suppressed += int(s["n"])
            return []  # the limiter's note sits inside a flood; it neither starts nor ends a dump
        u = _UUID.search(body)
        if u:
            out = self._close()
            self.uuids[u["pci"].lower().removeprefix("pci:")] = u["uuid"]
            return out
        m = _XID.search(body)
        if m:
            out = self._close()
            if up is not None:
                key = (host, up, body)
                if key in self._seen:
                    stats.duplicates += 1
                    return out
                self._seen[key] = None
                if len(self._seen) > self.SEEN_MAX:
                    del self._seen[next(iter(self._seen))]
            ev = _event(body, m, ts, up, host, self._lineno, line)
            if ev is None:
                stats.malformed += 1
                return out
            self._open = ev
            return out
        if "Xid" in body and "NVRM" in body:
            stats.malformed += 1
            return self._close()
        if self._open is not None and _CONTINUATION.match(body):
            self._detail.append(body.strip())
            stats.continuation += 1
            return []
        return self._close()


def parse_lines(lines: Iterable[str]) -> ParseResult:
    """Parse kernel-log lines (any of the shapes of the module docs; they may be mixed)."""
    stream = XidStream()
    events: list[XidEvent] = []
    for raw in lines:
        events += stream.feed(raw)
    events += stream.flush()
    # a context line may follow the events it names (the driver prints it again after a reset)
    out = [msgspec.structs.replace(e, uuid=stream.uuids[e.pci]) if not e.uuid and e.pci in stream.uuids else e
           for e in events]
    return ParseResult(events=out, stats=stream.stats, uuids=stream.uuids)


def parse_text(text: str) -> ParseResult:
    return parse_lines(text.splitlines())


class CountRow(msgspec.Struct, frozen=True):
    key: str
    count: int
    #: percent of all events
    share_pct: float


class XidSummary(msgspec.Struct):
    total: int
    by_category: list[CountRow]
    by_group: list[CountRow]
    by_xid: list[CountRow]
    #: events that blame the application (the node stays in service) and those that blame the node
    blame_job: int
    blame_node: int
    stats: ParseStats | None = None


def count_by(events: Sequence[XidEvent], key: str = "category") -> list[CountRow]:
    """Counts and shares (percent) of ``events`` per ``category``, ``group`` (the paper's Table V)
    or ``xid``; largest first, ties by key."""
    if key == "xid":
        counter = Counter(str(e.xid) for e in events)
    elif key in ("category", "group"):
        counter = Counter(getattr(xid_info(e.xid), key) for e in events)
    else:
        raise ValueError(f"count_by: key must be category, group or xid, not {key!r}")
    total = sum(counter.values())
    rows = [CountRow(k, n, 100.0 * n / total) for k, n in counter.items()]
    return sorted(rows, key=lambda r: (-r.count, int(r.key) if key == "xid" else r.key))


def summarize(events: Sequence[XidEvent], stats: ParseStats | None = None) -> XidSummary:
    job = sum(1 for e in events if xid_info(e.xid).blame == "job")
    return XidSummary(total=len(events), by_category=count_by(events, "category"), by_group=count_by(events, "group"),
                      by_xid=count_by(events, "xid"), blame_job=job, blame_node=len(events) - job, stats=stats)
