"""``ff health``: node health tools.

    ff health xid FILE [--json] [--by category|group|xid]    Xid counts and shares in a kernel log
    ff health flashcut-replay FILE [--window-s S] [--drain-after N] [--json]
                                                             the drains the flash-cut policy would make

FILE is a kernel log in any shape the parser reads (``dmesg``, ``dmesg -T``, ``journalctl -k``,
``/var/log/kern.log``); ``-`` reads standard input.  ``--json`` prints one JSON object: the counts per
category, per group (the Fire-Flyer paper's Table V) and per Xid, and the parser's statistics.

For ``flashcut-replay`` FILE is a CSV of link failures: ``node,time[,interface[,count]]`` rows, or
the paper's Table VIII shape ``date,count`` (no nodes: each date on one node, an upper bound, under
both placements of ``fireflyer.health.flashcut.replay``).  Table VIII's rows are not in this
repository: transcribe them from the paper (arXiv 2408.14158) into such a file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from fireflyer.core.errors import NotFound

__all__ = ["register", "xid_table_text"]


def xid_table_text(rows: list, title: str) -> str:
    width = max([len(title)] + [len(r.key) for r in rows])
    lines = [f"{title.ljust(width)}  {'COUNT':>8}  {'SHARE':>8}"]
    lines += [f"{r.key.ljust(width)}  {r.count:>8}  {r.share_pct:>7.2f}%" for r in rows]
    return "\n".join(lines)


def _xid(ns: argparse.Namespace) -> int:
    from fireflyer.health.xid import parse_lines, summarize

    if ns.file == "-":
        result = parse_lines(sys.stdin)
    else:
        try:
            with open(ns.file, encoding="utf-8", errors="replace") as f:
                result = parse_lines(f)
        except FileNotFoundError:
            raise NotFound(f"ff health xid: no file {ns.file!r}; give a kernel log (dmesg > FILE, "
                           f"journalctl -k > FILE) or - for standard input", path=ns.file) from None
    summary = summarize(result.events, result.stats)
    if ns.json:
        print(msgspec.json.encode(summary).decode())
        return 0
    rows = {"category": summary.by_category, "group": summary.by_group, "xid": summary.by_xid}[ns.by]
    print(f"{summary.total} Xid events ({summary.blame_job} blame the job, {summary.blame_node} the node)")
    if rows:
        print(xid_table_text(rows, ns.by.upper()))
    s = result.stats
    notes = [f"{s.sxid} NVSwitch SXid lines ignored" if s.sxid else "",
             f"{s.suppressed} messages dropped by the kernel's rate limiter (counts are a lower bound)"
             if s.suppressed else "",
             f"{s.malformed} unreadable Xid lines" if s.malformed else ""]
    for n in notes:
        if n:
            print(n)
    return 0


def _flashcut_replay(ns: argparse.Namespace) -> int:
    from fireflyer.health.flashcut import FlashCutConfig, read_failures_csv, replay_failures

    try:
        text = sys.stdin.read() if ns.file == "-" else Path(ns.file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFound(f"ff health flashcut-replay: no file {ns.file!r}; give a CSV of link failures "
                       f"(node,time[,interface[,count]] or date,count)", path=ns.file) from None
    cfg = FlashCutConfig(window_s=ns.window_s, drain_after=ns.drain_after)
    out = replay_failures(read_failures_csv(text), cfg)
    if ns.json:
        print(msgspec.json.encode(out).decode())
        return 0
    policy = f"(drain at {cfg.drain_after} within {cfg.window_s:g}s)"
    if out["shape"] == "date,count":
        b, s = out["burst"], out["spread"]
        print(f"{b['failures']} link failures on {b['rows']} dates {policy}: {b['drains']} drains if each date's "
              f"failures came a minute apart, {s['drains']} if spread over the day (no nodes named: upper bounds)")
        return 0
    print(f"{out['failures']} link failures on {out['nodes']} nodes {policy}: {out['drains']} drains")
    for d in out["drained"]:
        print(f"  drain {d['node']} at {d['time']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    health = sub.add_parser("health", help="node health tools (Xid logs, flash-cut replay)", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    hsub = health.add_subparsers(dest="health_command", metavar="WHAT", required=True)
    xid = hsub.add_parser("xid", help="Xid counts and shares per category in a kernel log")
    xid.add_argument("file", help="kernel log file, or - for standard input")
    xid.add_argument("--json", action="store_true", help="one JSON object on stdout")
    xid.add_argument("--by", choices=("category", "group", "xid"), default="category",
                     help="group the table by category (default), the paper's group, or Xid")
    xid.set_defaults(func=_xid)
    fc = hsub.add_parser("flashcut-replay", help="replay link failures (CSV) through the flash-cut drain policy")
    fc.add_argument("file", help="CSV: node,time[,interface[,count]] or date,count rows; - for standard input")
    fc.add_argument("--window-s", type=float, default=3600.0, help="the policy's window (default 3600)")
    fc.add_argument("--drain-after", type=int, default=3, help="failures within the window that drain (default 3)")
    fc.add_argument("--json", action="store_true", help="one JSON object on stdout")
    fc.set_defaults(func=_flashcut_replay)
