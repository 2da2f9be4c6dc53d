"""``ff health``: node health tools and the health service.

    ff health xid FILE [--json] [--by category|group|xid]    Xid counts and shares in a kernel log
    ff health flashcut-replay FILE [--window-s S] [--drain-after N] [--json]
                                                             the drains the flash-cut policy would make
    ff health nodes [--json]                        each node's health state (healthy, suspect, draining,
                                                    drained, validating) and why
    ff health validate NODE [--level N] [--inject CHECK=FAULT ...] [--json]
                                                    validate a node now (admin): every check's PASS / FAIL /
                                                    ERROR with its evidence; a failure drains the node, a
                                                    pass enables a drained one
    ff health incidents [--node NODE] [--limit N] [--json]   incidents, newest first (admin)
    ff health show INCIDENT [--json]                one incident: evidence and the actions taken (admin)

The service is found like every client finds one: ``--address`` / ``FF_HEALTH_ADDR``, else the local
cluster of ``--state-dir`` / ``FF_STATE_DIR`` / ``.ff``; the token ``--token`` / ``FF_TOKEN``, else
that cluster's admin token for the admin commands and its user token for ``nodes``.

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
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

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


def _client(ns: argparse.Namespace, role: str) -> Any:
    from fireflyer.health.client import HealthClient

    return HealthClient(ns.address, token=ns.token, state_dir=ns.state_dir, role=role)


def _to_json(msg: Any) -> Any:
    from google.protobuf.json_format import MessageToDict

    d = MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    for r in d.get("results", ()):  # evidence as the object it is, not a string
        r["evidence"] = json.loads(r.pop("evidence_json") or "{}")
    if "evidence_json" in d:
        d["evidence"] = json.loads(d.pop("evidence_json") or "{}")
    return d


def _when(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t > 0 else "-"


def _nodes(ns: argparse.Namespace) -> int:
    async def go() -> list[Any]:
        async with _client(ns, "user") as c:
            return await c.nodes()
    nodes = asyncio.run(go())
    if ns.json:
        print(json.dumps([_to_json(n) for n in nodes]))
        return 0
    if not nodes:
        print("the health service knows no nodes yet (it learns them from the scheduler within seconds)")
        return 0
    width = max(len(n.name) for n in nodes)
    print(f"{'NODE'.ljust(width)}  {'STATE':<10}  {'SINCE':<14}  {'PASSED':<16}  REASON")
    for n in nodes:
        passed = ",".join(f"L{lvl}@{_when(t)[6:11]}" for lvl, t in sorted(n.last_passed.items())) or "-"
        print(f"{n.name.ljust(width)}  {n.state:<10}  {_when(n.since):<14}  {passed:<16}  {n.reason}")
    return 0


def _evidence_text(evidence: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in evidence.items()
                     if not isinstance(v, list | dict) or len(json.dumps(v)) < 80)


def _validate(ns: argparse.Namespace) -> int:
    inject: dict[str, str] = {}
    for item in ns.inject or ():
        check, sep, fault = item.partition("=")
        if not sep or not check or not fault:
            from fireflyer.core.errors import InvalidArgument

            raise InvalidArgument(f"--inject takes CHECK=FAULT (e.g. gemm=corrupt), got {item!r}", field="inject")
        inject[check] = fault

    async def go() -> Any:
        async with _client(ns, "admin") as c:
            call = asyncio.ensure_future(c.validate(ns.node, ns.level, inject=inject))
            t0 = time.monotonic()
            tty = sys.stderr.isatty()
            while not call.done():  # progress while the node runs its checks
                await asyncio.wait([call], timeout=1.0)
                if not call.done():
                    msg = f"validating {ns.node} at level {ns.level} ... {time.monotonic() - t0:.0f} s"
                    print(("\r" + msg) if tty else msg, end="" if tty else "\n", file=sys.stderr, flush=True)
            if tty:
                print(file=sys.stderr)
            return call.result()
    reply = asyncio.run(go())
    v, n = reply.validation, reply.node
    if ns.json:
        print(json.dumps({"validation": _to_json(v), "node": _to_json(n)}))
        return 0 if v.status == "PASS" else 1
    print(f"validation {v.id} of {v.node} at level {v.level}: {v.status} "
          f"({v.finished_at - v.started_at:.1f} s){' injected ' + str(dict(v.inject)) if v.inject else ''}")
    if v.error:
        print(f"  ERROR  {v.error}")
    for r in v.results:
        print(f"  {r.status:<5}  {r.check:<17} {r.duration_s:6.2f} s  {r.summary}")
        ev = _evidence_text(json.loads(r.evidence_json or "{}"))
        if ev:
            print(f"         {'':<17}           {ev}")
    for check, why in sorted(v.not_run.items()):
        print(f"  -      {check:<17} not run: {why}")
    print(f"node {n.name} is now {n.state}: {n.reason}")
    return 0 if v.status == "PASS" else 1


def _incidents(ns: argparse.Namespace) -> int:
    async def go() -> list[Any]:
        async with _client(ns, "admin") as c:
            return await c.incidents(ns.node or "", ns.limit)
    incs = asyncio.run(go())
    if ns.json:
        print(json.dumps([_to_json(i) for i in incs]))
        return 0
    if not incs:
        print("no incidents")
        return 0
    print(f"{'ID':<11}  {'TIME':<14}  {'KIND':<12}  {'BLAMES':<16}  {'TASK':<5}  SUMMARY / LAST ACTION")
    for i in incs:
        who = f"{i.blame}:{i.node or i.link or i.job}"
        last = i.actions[-1] if i.actions else "-"
        print(f"{i.id:<11}  {_when(i.at):<14}  {i.kind:<12}  {who:<16}  {i.task or '-'!s:<5}  "
              f"{i.summary or '-'} / {last}")
    return 0


def _show(ns: argparse.Namespace) -> int:
    async def go() -> Any:
        async with _client(ns, "admin") as c:
            return await c.incident(ns.incident)
    i = asyncio.run(go())
    if ns.json:
        print(json.dumps(_to_json(i)))
        return 0
    print(f"incident {i.id} at {_when(i.at)}: {i.kind}, blames {i.blame} {i.node or i.link or i.job}")
    print(f"  summary:  {i.summary or '-'}")
    print(f"  task:     {i.task or '-'}   job: {i.job or '-'}   reported by: {i.reporter or '-'}")
    evidence = json.loads(i.evidence_json or "{}")
    print("  evidence: " + (json.dumps(evidence, indent=2).replace("\n", "\n            ") if evidence else "-"))
    print("  actions:")
    for a in i.actions:
        print(f"    - {a}")
    return 0


def _service_options(p: argparse.ArgumentParser) -> None:
    from .options import add_cluster_options

    add_cluster_options(p, address_help="the health service's address (default: $FF_HEALTH_ADDR, else the "
                                        "local cluster's)")


def register(sub: argparse._SubParsersAction) -> None:
    health = sub.add_parser("health", help="node health: states, validation, incidents, Xid logs",
                            description=__doc__,
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

    n = hsub.add_parser("nodes", help="each node's health state and why")
    _service_options(n)
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=_nodes)

    v = hsub.add_parser("validate", help="validate a node now and print every check (admin)")
    _service_options(v)
    v.add_argument("node")
    v.add_argument("--level", type=int, default=1, choices=(1, 2, 3),
                   help="1: seconds, 2: minutes, 3: the long periodic run (default 1)")
    v.add_argument("--inject", action="append", metavar="CHECK=FAULT",
                   help="simulate a fault (a drill: the validation must fail and drain the node), e.g. gemm=corrupt")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=_validate)

    i = hsub.add_parser("incidents", help="incidents, newest first (admin)")
    _service_options(i)
    i.add_argument("--node", default=None, help="only those about this node (or a link of it)")
    i.add_argument("--limit", type=int, default=0, help="at most this many (default all)")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_incidents)

    s = hsub.add_parser("show", help="one incident: evidence and actions taken (admin)")
    _service_options(s)
    s.add_argument("incident")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_show)
