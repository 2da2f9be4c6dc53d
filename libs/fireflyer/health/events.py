"""What a node agent reports about its own health, on NATS (JSON, tagged; see :mod:`fireflyer.bus.events`).

Each node agent watches its kernel log and its network links (``services/node/kernlog.py``,
``services/node/linkmon.py``) and publishes, per node ``<node>``:

- ``ff.node.v1.node.<node>.xid`` -- :class:`XidEvent`: one NVIDIA Xid the kernel printed, with the
  Xid table's verdict (category, who is to blame, what to do).  A flood of the same Xid on the same
  GPU is rate limited: the first one goes out at once, the rest of a flood window as one event with
  ``count`` > 1;
- ``ff.node.v1.node.<node>.link`` -- :class:`LinkEvent`: a network interface went down, came up,
  flapped between two samples, changed speed, or the agent's own heartbeats had a gap;
- ``ff.node.v1.node.<node>.advice`` -- :class:`NodeAdvice`: what the node-side policy concludes
  (restart the job, reset a GPU, reboot, drain the node, send the GPU back: :data:`ADVICE`).

The agent advises; it does not act.  A health service (``services/health``) subscribes to
:data:`XID_PATTERN`, :data:`LINK_PATTERN` and :data:`ADVICE_PATTERN`, combines them with what it
knows of the cluster, and decides (drain through the scheduler, open a ticket).  Every field has
a default where it can, so adding fields stays compatible (the rules of :mod:`fireflyer.bus.events`).

The parser's own records (:class:`fireflyer.health.xid.XidEvent`, :class:`fireflyer.health.flashcut.LinkEvent`)
are in-process values; the classes here are the wire contract built from them
(:func:`xid_event`, :func:`link_event`).
"""

from __future__ import annotations

import time

from fireflyer.bus.events import Event
from fireflyer.bus.subjects import pattern, subject

from . import flashcut
from . import xid as xidmod

__all__ = ["ADVICE", "XidEvent", "LinkEvent", "NodeAdvice", "xid_subject", "link_subject", "advice_subject",
           "XID_PATTERN", "LINK_PATTERN", "ADVICE_PATTERN", "xid_event", "link_event", "advice_rank",
           "MAX_DETAIL_LINES"]

#: the advice a node can get, mildest first (the Xid table's ACTIONS: ``none``, ``restart_job``,
#: ``reset_gpu``, ``reboot_node``, ``drain``, ``rma``)
ADVICE = xidmod.ACTIONS
#: a GSP dump is a few dozen lines; a stack trace of a wedged driver can be hundreds -- the head says enough
MAX_DETAIL_LINES = 64


def advice_rank(action: str) -> int:
    """Position of ``action`` in :data:`ADVICE` (higher is more severe); ValueError for an unknown one."""
    return ADVICE.index(action)


class XidEvent(Event, tag="health.xid.v1"):
    """One NVIDIA Xid on one GPU of ``node`` (or ``count`` of them, for a rate-limited flood)."""

    node: str
    xid: int
    #: when the agent read it (seconds since the epoch); for a flood, when the last one was read
    time: float = 0.0
    #: when the first one of a flood was read (== time when count is 1)
    first_time: float = 0.0
    #: PCI bus id as printed, lower case, no ``PCI:`` (``0000:3b:00``)
    pci: str = ""
    #: MIG GPU instance (``GPU-I:05`` -> 5); None without MIG
    gpu_instance: int | None = None
    #: GPU UUID when the kernel named it earlier (``NVRM: GPU at PCI:...: GPU-...``)
    uuid: str = ""
    #: from the Xid table (fireflyer.health.xid.XID_TABLE; unknown Xids get a conservative row)
    mnemonic: str = ""
    #: application, nvlink, memory, fallen_off_bus, gsp, micro_controller, driver, recovery, other
    category: str = ""
    #: the Fire-Flyer paper's Table V group: software, nvlink, ecc, uncorrectable, gsp, other
    group: str = ""
    #: "job": the application caused it and the node stays in service; "node": the hardware/driver
    blame: str = "node"
    #: what to do now (a member of ADVICE): the table's first action, or its on-repeat action when
    #: this GPU had the same Xid in an earlier episode within the repeat window
    action: str = "none"
    #: the table's actions in order
    actions: tuple[str, ...] = ()
    #: episodes of this Xid on this GPU within the repeat window, this one included
    repeat: int = 1
    #: the driver's text after the pid/name fields
    message: str = ""
    pid: int | None = None
    process: str = ""
    #: the kernel's time stamp as printed (uptime seconds, ``dmesg -T`` or journal date)
    kernel_time: str = ""
    uptime_s: float | None = None
    #: the (first) line as read, prefixes included
    raw: str = ""
    #: continuation lines (GSP RPC history, stack trace), at most MAX_DETAIL_LINES
    detail: tuple[str, ...] = ()
    #: Xid lines this event stands for (> 1: a flood collapsed into one message)
    count: int = 1
    #: False: the first Xid of an episode (published at once); True: the rest of a flood window,
    #: ``count`` lines from ``first_time`` to ``time``, sent when the window ended (no new advice)
    summary: bool = False
    #: messages the kernel's own rate limiter dropped ("N callbacks suppressed") since the
    #: previous event this agent published: non-zero means counts are a lower bound
    suppressed: int = 0


class LinkEvent(Event, tag="health.link.v1"):
    """A change of one network interface of ``node``, or a gap in the node's own heartbeats."""

    node: str
    #: ``ib0``, ``eth0``; empty for a heartbeat gap
    interface: str = ""
    #: when it was seen (seconds since the epoch; the sample that showed it)
    time: float = 0.0
    #: down | up | flap (carrier changes between samples with no visible state change) |
    #: speed (the negotiated speed changed) | heartbeat_gap
    kind: str = ""
    #: flaps this event stands for (a flap is two carrier changes)
    count: int = 1
    #: growth of ``carrier_changes`` since the previous sample (None when sysfs has no counter)
    carrier_changes_delta: int | None = None
    operstate: str = ""
    carrier: int | None = None
    #: Mb/s as sysfs says (None: unknown, e.g. the link is down)
    speed_mbps: int | None = None
    #: counted link faults of this node within the flash-cut window, this one included (0: not counted)
    in_window: int = 0
    #: the readings behind it (``operstate up->down, carrier 1->0``)
    evidence: str = ""


class NodeAdvice(Event, tag="health.advice.v1"):
    """The node-side policy's conclusion: what should happen to a job, a GPU or the node."""

    node: str
    #: a member of ADVICE (``none``, ``restart_job``, ``reset_gpu``, ``reboot_node``, ``drain``, ``rma``)
    action: str
    time: float = 0.0
    #: what led to it: ``xid`` (the Xid table) or ``flashcut`` (link flaps / heartbeat gaps)
    source: str = ""
    #: the GPU it concerns (PCI bus id), for Xid advice
    pci: str = ""
    #: the interface it concerns, for link advice
    interface: str = ""
    #: the task process behind a job-blamed Xid, when the kernel named it
    pid: int | None = None
    #: one sentence an operator can read
    reason: str = ""
    #: the event_ids of the XidEvents/LinkEvents it follows from
    evidence: tuple[str, ...] = ()


def xid_subject(node: str) -> str:
    """``ff.node.v1.node.<node>.xid``"""
    return subject("node", "node", node, "xid")


def link_subject(node: str) -> str:
    """``ff.node.v1.node.<node>.link``"""
    return subject("node", "node", node, "link")


def advice_subject(node: str) -> str:
    """``ff.node.v1.node.<node>.advice``"""
    return subject("node", "node", node, "advice")


#: every node's Xids, links and advice (what a health service subscribes to)
XID_PATTERN = pattern("node", entity="node", event="xid")
LINK_PATTERN = pattern("node", entity="node", event="link")
ADVICE_PATTERN = pattern("node", entity="node", event="advice")


def xid_event(node: str, ev: xidmod.XidEvent, *, t: float | None = None, first_t: float | None = None,
              count: int = 1, suppressed: int = 0, action: str | None = None, repeat: int = 1,
              summary: bool = False) -> XidEvent:
    """The wire event for a parsed Xid (``action`` defaults to the table's first action)."""
    info = ev.info
    now = time.time() if t is None else t
    return XidEvent(
        node=node, xid=ev.xid, time=now, first_time=now if first_t is None else first_t, pci=ev.pci,
        gpu_instance=ev.gpu_instance, uuid=ev.uuid, mnemonic=info.mnemonic, category=info.category,
        group=info.group, blame=info.blame, action=action or info.actions[0], actions=info.actions, repeat=repeat,
        message=ev.message, pid=ev.pid, process=ev.process, kernel_time=ev.timestamp, uptime_s=ev.uptime_s,
        raw=ev.raw, detail=ev.detail[:MAX_DETAIL_LINES], count=count, suppressed=suppressed, summary=summary)


def link_event(ev: flashcut.LinkEvent, *, after: flashcut.LinkState | None = None, delta: int | None = None,
               in_window: int = 0) -> LinkEvent:
    """The wire event for a flash-cut link event (``after``: the interface's state at the sample)."""
    return LinkEvent(node=ev.node, interface=ev.iface, time=ev.t, kind=ev.kind, count=ev.count,
                     carrier_changes_delta=delta, operstate=after.operstate if after else "",
                     carrier=after.carrier if after else None, speed_mbps=after.speed if after else None,
                     in_window=in_window, evidence=ev.detail)
