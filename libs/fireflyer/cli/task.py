"""``ff task``, ``ff nodes``, ``ff quota``: the HAI Platform scheduler from the command line.

    ff task submit [-n NODES] [-p PRIORITY] [-g GROUP] [--name NAME] [--zone Z] [--max-restarts R]
                   [--grace ACK[,FINAL]] [--signal SIG] [-f spec.yaml] -- CMD ARGS
    ff task ls [--all] [--user U] [--json]          your chains (an admin: everyone's)
    ff task status ID [--json]                      the chain (one row per run) and the newest run's ranks
    ff task logs ID [-f] [--rank R] [--restart N]   a rank's output: a chain id, its newest run (-f: follow;
                                                    --restart N: the run after N restarts, 0 the first)
    ff task stop|suspend|resume ID                  stop for good; interrupt and hold; release a held chain
    ff task priority ID PRIORITY                    change a chain's priority
    ff task run [--simulate-suspend-after S] [--whole-life-state N] -- CMD
                                                    run CMD here in simulate mode (HAI's ++ -ss S -ls N)
    ff nodes [--drain NODE --reason R | --enable NODE] [--json]
    ff quota [--user OWNER] [--set OWNER GROUP PRIORITY NODES | --remove OWNER GROUP PRIORITY] [--json]

ID is a chain id (the id ``submit`` prints) or the id of any run of it.  ``-f`` reads a spec file
shaped like HAI's v2 experiment file, in YAML, TOML or JSON (:mod:`fireflyer.sched.specfile`); flags
override it.  The scheduler is ``--address`` (comma separated replicas), else ``FF_SCHED_ADDR``,
else the scheduler of the local cluster (``--state-dir`` / ``FF_STATE_DIR`` / ``.ff``); the token
``--token``, else ``FF_TOKEN``, else the cluster's user token (its admin token for ``--drain``,
``--enable``, ``--set`` and ``--remove``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

__all__ = ["register", "parse_grace", "chains_table", "status_tables"]

_SPEC_FLAGS = {"nodes": "nodes", "priority": "priority", "group": "group", "name": "name", "zone": "zone",
               "max_restarts": "max_restarts", "signal": "signal"}


def parse_grace(text: str) -> tuple[float, float | None]:
    """``"ACK,FINAL"`` or ``"ACK"`` -> seconds; anything else -> InvalidArgument naming ``grace``."""
    from fireflyer.core.errors import InvalidArgument

    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2):
        raise InvalidArgument(f"--grace takes ACK or ACK,FINAL in seconds (e.g. 5,30), got {text!r}", field="grace")
    return values[0], values[1] if len(values) == 2 else None


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if os.isatty(1) else 200, highlight=False)


def _when(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t > 0 else "-"


def chains_table(chains: list[Any]) -> Any:
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("ID", "NAME", "USER", "STATE", "CHAIN", "PRIORITY", "NODES", "RESTARTS", "SUBMITTED", "REASON / NODES"):
        table.add_column(col, overflow="fold")
    for c in chains:
        r = c.runs[-1]
        detail = ",".join(r.nodes) if r.chain_status == "running" and r.nodes else r.reason
        table.add_row(str(c.chain_id), c.name or "-", c.user, r.slurm_state + (" (held)" if r.held else ""),
                      r.chain_status, r.priority or r.spec.priority, str(r.spec.nodes), str(r.restart_count),
                      _when(r.submitted_at), detail)
    return table


def status_tables(chain: Any) -> list[Any]:
    from rich.table import Table

    runs = Table(title=f"task {chain.chain_id} ({chain.name or 'unnamed'}) of {chain.user}: "
                       f"{' '.join(chain.runs[-1].spec.command)}", box=None, header_style="bold", title_justify="left")
    for col in ("RUN", "RESTART", "STATE", "CHAIN", "QUEUE", "PRIORITY", "NODES", "STARTED", "STOP CODE", "SUSPEND",
                "WHOLE_LIFE", "REASON"):
        runs.add_column(col, overflow="fold")
    for r in chain.runs:
        stop = f"{r.stop_code} ({'|'.join(r.stop_reasons)})" if r.stop_code else "0"
        runs.add_row(str(r.id), str(r.restart_count), r.slurm_state + (" (held)" if r.held else ""), r.chain_status,
                     r.queue_status, r.priority or r.spec.priority, ",".join(r.nodes) or "-", _when(r.started_at), stop,
                     str(r.suspend_code), str(r.whole_life_state), r.reason)
    out = [runs]
    last = next((r for r in reversed(chain.runs) if r.ranks), None)
    if last is not None:
        ranks = Table(title=f"ranks of run {last.id}", box=None, header_style="bold", title_justify="left")
        for col in ("RANK", "NODE", "STATE", "EXIT"):
            ranks.add_column(col)
        for k in last.ranks:
            ranks.add_row(str(k.rank), k.node, k.state, "-" if k.exit_code == -1 else str(k.exit_code))
        out.append(ranks)
    return out


def _to_json(msg: Any) -> Any:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def _spec(ns: argparse.Namespace) -> Any:
    from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
    from fireflyer.sched.specfile import read_spec_file

    fields: dict[str, Any] = read_spec_file(ns.file) if ns.file else {}
    for attr, field in _SPEC_FLAGS.items():
        value = getattr(ns, attr)
        if value is not None:
            fields[field] = value
    command = list(ns.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if command:
        fields["command"] = command
    if ns.grace is not None:
        fields["grace_ack_s"], final = parse_grace(ns.grace)
        if final is not None:
            fields["grace_final_s"] = final
    fields.setdefault("nodes", 1)
    try:
        return pb.TaskSpec(**fields)
    except (TypeError, ValueError) as e:
        from fireflyer.core.errors import InvalidArgument

        raise InvalidArgument(f"bad task spec: {e}", field="spec") from None


def _role(ns: argparse.Namespace) -> str:
    admin = any(getattr(ns, a, None) for a in ("drain", "enable", "set", "remove"))
    return "admin" if admin else "user"


async def _run(ns: argparse.Namespace) -> int:
    from fireflyer.sched.client import SchedClient

    out = _console()
    async with SchedClient(ns.address, token=ns.token, state_dir=ns.state_dir, role=_role(ns)) as c:
        if ns.command == "nodes":
            return await _nodes(ns, c, out)
        if ns.command == "quota":
            return await _quota(ns, c, out)
        cmd = ns.task_cmd
        if cmd == "submit":
            spec = _spec(ns)
            chain = await c.submit(spec)
            if ns.json:
                print(json.dumps(_to_json(chain)))
            else:
                r = chain.runs[-1]
                out.print(f"submitted task {chain.chain_id} ({chain.name or 'unnamed'}): {r.spec.nodes} node(s), "
                          f"{r.spec.priority}, group {r.spec.group}; `ff task status {chain.chain_id}` follows it")
        elif cmd == "ls":
            chains = await c.list(user=ns.user or "", include_finished=ns.all)
            if ns.json:
                print(json.dumps([_to_json(x) for x in chains]))
            elif not chains:
                out.print("no tasks" + ("" if ns.all else " (--all shows finished ones)"))
            else:
                out.print(chains_table(chains))
        elif cmd == "status":
            chain = await c.get(ns.id)
            if ns.json:
                print(json.dumps(_to_json(chain)))
            else:
                for t in status_tables(chain):
                    out.print(t)
        elif cmd == "logs":
            async for data in c.logs(ns.id, ns.rank, follow=ns.follow, restart=ns.restart):
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
        elif cmd in ("stop", "suspend", "resume"):
            chain = await getattr(c, cmd)(ns.id)
            r = chain.runs[-1]
            done = {"stop": "stopping" if r.chain_status == "running" else "stopped",
                    "suspend": "suspending" if r.chain_status == "running" else "held",
                    "resume": "released to the queue"}[cmd]
            out.print(f"task {chain.chain_id}: {done} ({r.slurm_state})")
        elif cmd == "priority":
            chain = await c.set_priority(ns.id, ns.priority)
            out.print(f"task {chain.chain_id}: priority {chain.runs[-1].spec.priority}")
    return 0


async def _nodes(ns: argparse.Namespace, c: Any, out: Any) -> int:
    from rich.table import Table

    if ns.drain:
        n = await c.set_node_state(ns.drain, "drained", ns.reason or "")
        out.print(f"node {n.name}: drained ({n.reason}); its running task keeps going, no new one starts there")
        return 0
    if ns.enable:
        n = await c.set_node_state(ns.enable, "enabled")
        out.print(f"node {n.name}: enabled")
        return 0
    nodes = await c.nodes()
    if ns.json:
        print(json.dumps([_to_json(n) for n in nodes]))
        return 0
    if not nodes:
        out.print("no nodes have registered with the scheduler (node agents register when they start)")
        return 0
    table = Table(box=None, header_style="bold")
    for col in ("NODE", "GROUP", "ZONE", "STATE", "TASK", "GPUS", "ADDRESS", "SEEN", "REASON"):
        table.add_column(col, overflow="fold")
    now = time.time()
    for n in nodes:
        table.add_row(n.name, n.group, n.zone or "-", n.state + (" (lost)" if n.lost else ""), str(n.task) if n.task else "-", str(n.gpus),
                      n.address or "-", f"{now - n.last_seen_at:.0f}s ago" if n.last_seen_at else "-", n.reason)
    out.print(table)
    return 0


async def _quota(ns: argparse.Namespace, c: Any, out: Any) -> int:
    from rich.table import Table

    from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
    from fireflyer.core.errors import InvalidArgument

    if ns.set or ns.remove:
        args = ns.set or ns.remove
        if ns.set:
            try:
                n = int(args[3])
            except ValueError:
                raise InvalidArgument(f"--set takes OWNER GROUP PRIORITY NODES; NODES must be an integer, got "
                                      f"{args[3]!r}", field="max_nodes") from None
        q = pb.Quota(owner=args[0], group=args[1], priority=args[2], max_nodes=n if ns.set else 0)
        await c.set_quota(q, remove=bool(ns.remove))
        out.print(f"quota of {args[0]} in group {args[1]} at {args[2].upper()}: "
                  + (f"{args[3]} node(s)" if ns.set else "removed"))
        return 0
    used = await c.used(ns.user or "")
    if ns.json:
        print(json.dumps([_to_json(u) for u in used]))
        return 0
    if not used:
        out.print("no quota entries and nothing running" + (f" for {ns.user}" if ns.user else ""))
        return 0
    table = Table(box=None, header_style="bold")
    for col in ("OWNER", "GROUP", "PRIORITY", "USED", "LIMIT"):
        table.add_column(col)
    for u in used:
        table.add_row(u.owner, u.group, u.priority, str(u.used), "-" if u.limit < 0 else str(u.limit))
    out.print(table)
    return 0


def _cmd(ns: argparse.Namespace) -> int:
    if getattr(ns, "task_cmd", None) == "run":
        return _simulate(ns)
    return asyncio.run(_run(ns))


def _simulate(ns: argparse.Namespace) -> int:
    from fireflyer.hai.simulate import simulate

    command = list(ns.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("ff task run: give the command after --, e.g. ff task run --simulate-suspend-after 30 -- python "
              "train.py", file=sys.stderr)
        return 2
    res = simulate(command, suspend_after_s=ns.simulate_suspend_after, whole_life_state=ns.whole_life_state)
    if ns.json:
        import msgspec

        print(msgspec.json.encode(res).decode())
    elif res.suspended:
        print(f"suspended: whole_life_state {res.whole_life_state}", file=sys.stderr)
    return 0 if res.suspended else res.exit_code


def _add_common(p: argparse.ArgumentParser) -> None:
    from fireflyer.cli.options import add_cluster_options

    add_cluster_options(p, address_help="scheduler host:port, comma separated (default $FF_SCHED_ADDR, else the "
                                        "cluster's)")


def _task_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", type=int, help="chain id (or any run id of it)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("task", help="submit and manage tasks on the HAI scheduler", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    sub = p.add_subparsers(dest="task_cmd", metavar="WHAT", required=True)
    s = sub.add_parser("submit", help="submit a task: ff task submit -n 2 -p HIGH -- python train.py")
    s.add_argument("-n", "--nodes", type=int, default=None, help="whole nodes (default 1)")
    s.add_argument("-p", "--priority", default=None, help="EXTREME_HIGH, VERY_HIGH, HIGH, ABOVE_NORMAL, NORMAL "
                                                          "(default), UNDER_NORMAL, BELOW_NORMAL, LOW or AUTO")
    s.add_argument("-g", "--group", default=None, help="node group (default 'default')")
    s.add_argument("--name", default=None)
    s.add_argument("--zone", default=None, help="pin to one network zone")
    s.add_argument("--max-restarts", type=int, default=None, help="requeue after a user-code failure this often")
    s.add_argument("--grace", default=None, metavar="ACK[,FINAL]",
                   help="seconds to acknowledge an interrupt, then to save (default: the cluster's, 5,5)")
    s.add_argument("--signal", default=None, help="also send this signal on an interrupt (Slurm --signal), e.g. "
                                                  "SIGUSR1")
    s.add_argument("-f", "--file", default=None, help="a spec file like HAI's v2 experiment file (YAML, TOML or JSON)")
    s.add_argument("--json", action="store_true")
    s.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command and its arguments")
    rn = sub.add_parser("run", help="run a command locally in simulate mode (hai-cli ... ++ -ss S)")
    rn.add_argument("--simulate-suspend-after", type=float, default=None, metavar="S",
                    help="raise the suspend flag after S seconds (HAI's -ss)")
    rn.add_argument("--whole-life-state", type=int, default=0, metavar="N", help="the state the run starts with "
                                                                                 "(HAI's -ls)")
    rn.add_argument("--json", action="store_true", help="print what happened as JSON")
    rn.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command and its arguments")
    ls = sub.add_parser("ls", help="list tasks")
    ls.add_argument("--all", action="store_true", help="also finished ones")
    ls.add_argument("--user", default=None, help="an admin: only this user's")
    ls.add_argument("--json", action="store_true")
    st = sub.add_parser("status", help="a task's runs and ranks")
    _task_id(st)
    st.add_argument("--json", action="store_true")
    lg = sub.add_parser("logs", help="a rank's output")
    _task_id(lg)
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("--rank", type=int, default=0)
    lg.add_argument("--restart", type=int, default=None, metavar="N",
                    help="the run after N restarts (0: the first run); default the newest")
    for verb, text in (("stop", "stop for good (not requeued)"), ("suspend", "interrupt and hold until resume"),
                       ("resume", "release a held task")):
        _task_id(sub.add_parser(verb, help=text))
    pr = sub.add_parser("priority", help="change a task's priority")
    _task_id(pr)
    pr.add_argument("priority")
    p.set_defaults(func=_cmd)

    n = subparsers.add_parser("nodes", help="the scheduler's nodes; drain or enable one (admin)")
    _add_common(n)
    g = n.add_mutually_exclusive_group()
    g.add_argument("--drain", default=None, metavar="NODE")
    g.add_argument("--enable", default=None, metavar="NODE")
    n.add_argument("--reason", default=None, help="why the node is drained (required with --drain)")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=_cmd)

    q = subparsers.add_parser("quota", help="quotas and what is used of them; set one (admin)")
    _add_common(q)
    q.add_argument("--user", default=None, help="only this owner (user or shared group)")
    gq = q.add_mutually_exclusive_group()
    gq.add_argument("--set", nargs=4, default=None, metavar=("OWNER", "GROUP", "PRIORITY", "NODES"))
    gq.add_argument("--remove", nargs=3, default=None, metavar=("OWNER", "GROUP", "PRIORITY"))
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_cmd)
