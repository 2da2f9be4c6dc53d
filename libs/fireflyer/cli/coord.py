"""``ff coord``: look at the coordination service's communicators and their collective telemetry.

    ff coord comms [--job JOB] [--json]            every communicator: generation, state, nodes, reason
    ff coord get JOB/NAME [--json]                 one communicator, node by node (ranks, zones, heartbeats)
    ff coord stats JOB/NAME [--last N] [--json]    per-node arrival lag and phase times, the edge matrix
    ff coord abort JOB/NAME --reason TEXT          abort it: every member raises

The address is ``--address``, else ``FF_COORD_ADDR``, else the coord of the local
cluster's ``cluster.json`` (``ff up``); the token ``--token``, else ``FF_TOKEN``, else
the cluster's user token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["register", "resolve_coord", "comms_table", "stats_tables"]


def resolve_coord(state_dir: Path | str | None, *, address: str | None, token: str | None) -> tuple[str, str | None]:
    """(coord address, token) by ``find_cluster``'s precedence (``--address``, FF_COORD_ADDR, the
    cluster of ``state_dir`` / FF_STATE_DIR / .ff; the user token)."""
    from fireflyer.cluster.discovery import find_cluster

    c = find_cluster(state_dir, coord=address, token=token, need=("coord",))
    return c.coord[0], c.token


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def comms_table(comms: list[Any]) -> str:
    if not comms:
        return "no communicators"
    rows = [[c.comm, c.generation, c.state, c.nnodes, c.world_size, c.depth, c.cross_zone_pairs,
             ",".join(n.node for n in c.nodes), (c.reason[:70] + "...") if len(c.reason) > 73 else c.reason]
            for c in comms]
    return _table(["COMM", "GEN", "STATE", "NODES", "RANKS", "DEPTH", "XZONE", "MEMBERS", "REASON"], rows)


def get_table(c: Any) -> str:
    head = (f"{c.comm} generation {c.generation}: {c.state}; {c.nnodes} nodes, {c.world_size} ranks, tree depth "
            f"{c.depth}, cross-zone pairs {c.cross_zone_pairs}" + (f"\nreason: {c.reason}" if c.reason else ""))
    rows = [[n.node_rank, n.node, n.zone or "-", n.local_world_size, n.first_rank, n.address,
             "left" if n.left else ("-" if n.last_seen_age_s < 0 else f"{n.last_seen_age_s:.1f}s ago")]
            for n in c.nodes]
    return head + "\n" + _table(["NODE_RANK", "NODE", "ZONE", "K", "FIRST_RANK", "ADDRESS", "HEARTBEAT"], rows)


def stats_tables(rep: Any, names: dict[int, str]) -> str:
    out = [f"{rep.comm}: {rep.ops} operations" + (f" ({rep.dropped} telemetry records dropped)" if rep.dropped else "")]
    if not rep.ops:
        return out[0] + " (no telemetry yet: workers send it when FF_NATS_URL is set)"
    out.append("\nper node (ms):")
    out.append(_table(["NODE_RANK", "NODE", "OPS", "LAG_MEAN", "LAG_MAX", "LAST_ARRIVALS", "LOCAL_REDUCE", "TREE",
                       "WRITEBACK"],
                      [[n.node_rank, names.get(n.node_rank, "-"), n.ops, _ms(n.arrival_lag_mean_s),
                        _ms(n.arrival_lag_max_s), n.last_arrivals, _ms(n.local_reduce_mean_s), _ms(n.tree_mean_s),
                        _ms(n.writeback_mean_s)] for n in rep.nodes]))
    if rep.edges:
        nodes = sorted({e.src for e in rep.edges} | {e.dst for e in rep.edges})
        cell = {(e.src, e.dst): _ms(e.transfer_mean_s) for e in rep.edges}
        out.append("\ntransfer time src -> dst (ms, mean per op; row = the reporting node):")
        out.append(_table(["SRC\\DST", *map(str, nodes)],
                          [[s, *[cell.get((s, d), ".") for d in nodes]] for s in nodes]))
    return "\n".join(out)


async def _run(ns: argparse.Namespace) -> int:
    from fireflyer.coord import CoordClient

    address, token = resolve_coord(ns.state_dir, address=ns.address, token=ns.token)
    async with CoordClient(address, token=token) as c:
        if ns.coord_cmd == "comms":
            comms = await c.list(ns.job or "")
            print(json.dumps(msgspec.to_builtins(comms)) if ns.json else comms_table(comms))
        elif ns.coord_cmd == "get":
            view = await c.get(ns.comm)
            print(json.dumps(msgspec.to_builtins(view)) if ns.json else get_table(view))
        elif ns.coord_cmd == "stats":
            rep, names = await c.op_stats(ns.comm, ns.last)
            print(json.dumps({"report": msgspec.to_builtins(rep), "names": names}) if ns.json
                  else stats_tables(rep, names))
        else:
            state, reason = await c.abort(ns.comm, ns.reason)
            print(f"{ns.comm}: {state}: {reason}")
    return 0


def _cmd(ns: argparse.Namespace) -> int:
    return asyncio.run(_run(ns))


def register(subparsers: Any) -> None:
    from fireflyer.cli.options import add_cluster_options

    p = subparsers.add_parser("coord", help="communicators of the coordination service and their telemetry",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_options(p, address_help="coord host:port (default $FF_COORD_ADDR, else the cluster's)")
    sub = p.add_subparsers(dest="coord_cmd", metavar="WHAT", required=True)
    comms = sub.add_parser("comms", help="list communicators")
    comms.add_argument("--job", default=None)
    comms.add_argument("--json", action="store_true")
    get = sub.add_parser("get", help="one communicator")
    get.add_argument("comm", help="JOB/NAME")
    get.add_argument("--json", action="store_true")
    stats = sub.add_parser("stats", help="collective telemetry of a communicator")
    stats.add_argument("comm", help="JOB/NAME")
    stats.add_argument("--last", type=int, default=0, help="only the last N operations (default all kept)")
    stats.add_argument("--json", action="store_true")
    abort = sub.add_parser("abort", help="abort a communicator (every member raises)")
    abort.add_argument("comm", help="JOB/NAME")
    abort.add_argument("--reason", default="aborted by an operator")
    p.set_defaults(func=_cmd)
