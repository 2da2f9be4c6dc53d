"""``ff admin``: inspect and set up the 3FS cluster manager (mgmtd).

    ff admin routing | nodes | targets | chains | chain-tables | primary   [--json]
    ff admin create-chain --chain-id 1 --targets 101@storage-1,102@storage-2,103@storage-3
    ff admin init-chains --targets 101@s1,102@s2,103@s3,104@s1,... --replicas 3 [--first-chain-id 1]
                         [--table-id 1]
    ff admin create-chain-table --table-id 1 --chains 1,2,3 [--desc "..."]
    ff admin offline-target 102
    ff admin users add NAME [--role user|admin] [--expires-in 90d | --expires 2027-01-31T00:00:00Z]
    ff admin users ls [--json]
    ff admin users revoke NAME

Targets are ``ID`` or ``ID@NODE``; the node may be left out for targets a storage node
already reported in its heartbeats.  ``init-chains`` cuts the target list, in order,
into chains of ``--replicas`` targets (so list them interleaved across nodes, as 3FS's
data-placement tool would), and with ``--table-id`` also creates that chain table.

mgmtd addresses come from ``--address`` (comma separated), else ``FF_MGMTD_ADDR``, else
every mgmtd instance of the local cluster's ``cluster.json``; writes reach the primary
through redirects.  The token is ``--token``, else ``FF_TOKEN``, else the cluster's
tokens file entry for ``--role`` (default admin).  A refused call prints its status
code (``PERMISSION_DENIED: ...``) and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["register", "resolve_mgmtd", "parse_targets", "plan_chains"]


def resolve_mgmtd(state_dir: Path | str | None, *, address: str | None, token: str | None,
                  role: str) -> tuple[list[str], str]:
    """(addresses, token) by ``find_cluster``'s precedence: explicit values, FF_MGMTD_ADDR /
    FF_TOKEN, then the cluster of ``state_dir`` / FF_STATE_DIR / .ff and its ``role`` token."""
    from fireflyer.cluster.discovery import find_cluster

    c = find_cluster(state_dir, mgmtd=address, token=token, role=role, need=("mgmtd", "token"))
    assert c.token is not None
    return list(c.mgmtd), c.token


def parse_targets(text: str) -> list[tuple[int, str]]:
    """``"101@storage-1,102"`` -> ``[(101, "storage-1"), (102, "")]``."""
    from fireflyer.core.errors import InvalidArgument

    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        tid, _, node = item.partition("@")
        try:
            n = int(tid)
        except ValueError:
            raise InvalidArgument(f"bad target {item!r}: expected ID or ID@NODE, e.g. 101@storage-1",
                                  value=item) from None
        out.append((n, node))
    if not out:
        raise InvalidArgument("no targets given", field="targets")
    return out


def plan_chains(targets: Sequence[tuple[int, str]], replicas: int, first_chain_id: int) -> list[Any]:
    """Cut ``targets`` in order into chains of ``replicas`` targets, ids from ``first_chain_id``."""
    from fireflyer.core.errors import InvalidArgument
    from fireflyer.mgmt.edits import ChainSpec, TargetSpec

    if replicas < 1 or len(targets) % replicas:
        raise InvalidArgument(f"{len(targets)} targets do not split into chains of {replicas} "
                              "(give a multiple of --replicas)", replicas=replicas, targets=len(targets))
    return [ChainSpec(chain_id=first_chain_id + i // replicas,
                      targets=tuple(TargetSpec(target_id=t, node_id=n) for t, n in targets[i:i + replicas]))
            for i in range(0, len(targets), replicas)]


def _print(obj: Any, as_json: bool, table: Callable[[Any], Sequence[str]]) -> None:
    import msgspec

    if as_json:
        print(msgspec.json.encode(obj).decode())
    else:
        for line in table(obj):
            print(line)


def _chain_lines(chains: Sequence[Any]) -> list[str]:
    lines = [f"{'CHAIN':>6} {'VER':>4}  TARGETS (head .. tail)"]
    for c in chains:
        lines.append(f"{c.chain_id:>6} {c.version:>4}  " + " ".join(f"{t.target_id}:{t.public_state}" for t in c.targets))
    return lines


def _target_lines(targets: Sequence[Any]) -> list[str]:
    lines = [f"{'TARGET':>7} {'CHAIN':>6}  {'NODE':<16} {'PUBLIC':<8} LOCAL"]
    for t in targets:
        lines.append(f"{t.target_id:>7} {t.chain_id or '-':>6}  {t.node_id:<16} {t.public_state:<8} {t.local_state}")
    return lines


def _node_lines(nodes: Sequence[Any]) -> list[str]:
    lines = [f"{'NODE':<16} {'TYPE':<10} {'STATUS':<17} ADDRESS"]
    for n in nodes:
        lines.append(f"{n.node_id:<16} {n.type:<10} {n.status:<17} {n.address}")
    return lines


def _table_lines(tables: Sequence[Any]) -> list[str]:
    lines = [f"{'TABLE':>6} {'VER':>4}  CHAINS"]
    for t in tables:
        lines.append(f"{t.table_id:>6} {t.version:>4}  {','.join(map(str, t.chain_ids))}  {t.desc}")
    return lines


def _routing_lines(r: Any) -> list[str]:
    return [f"routing version {r.version}", "", *_node_lines(r.nodes), "", *_target_lines(r.targets), "",
            *_chain_lines(r.chains), "", *_table_lines(r.chain_tables)]


async def _run(ns: argparse.Namespace, addresses: list[str], token: str) -> int:
    from fireflyer.mgmt.client import MgmtdClient

    async with MgmtdClient(addresses, token=token, redirect_timeout_s=ns.timeout) as c:
        cmd, js = ns.admin_command, ns.json
        if cmd == "routing":
            _print(await c.get_routing(), js, _routing_lines)
        elif cmd == "nodes":
            _print(await c.list_nodes(), js, _node_lines)
        elif cmd == "targets":
            _print(await c.list_targets(), js, _target_lines)
        elif cmd == "chains":
            _print(await c.list_chains(), js, _chain_lines)
        elif cmd == "chain-tables":
            _print(await c.list_chain_tables(), js, _table_lines)
        elif cmd == "primary":
            _print(await c.get_primary(), js,
                   lambda p: [f"primary {p.primary or '(none)'} at {p.primary_address or '-'} term {p.term} "
                              f"(asked {p.node})"])
        elif cmd in ("create-chain", "init-chains"):
            targets = parse_targets(ns.targets)
            if cmd == "create-chain":
                specs = plan_chains(targets, len(targets), ns.chain_id)
            else:
                specs = plan_chains(targets, ns.replicas, ns.first_chain_id)
            version, chains = await c.create_chains(specs)
            _print(chains, js, lambda ch: [f"routing version {version}", *_chain_lines(ch)])
            if cmd == "init-chains" and ns.table_id:
                version, table = await c.create_chain_table(ns.table_id, [s.chain_id for s in specs])
                _print(table, js, lambda t: [f"routing version {version}", *_table_lines([t])])
        elif cmd == "create-chain-table":
            ids = [int(x) for x in ns.chains.split(",") if x.strip()]
            version, table = await c.create_chain_table(ns.table_id, ids, ns.desc)
            _print(table, js, lambda t: [f"routing version {version}", *_table_lines([t])])
        elif cmd == "offline-target":
            version, chain = await c.offline_target(ns.target)
            _print(chain, js, lambda ch: [f"routing version {version}", *_chain_lines([ch])])
    return 0


def _users(ns: argparse.Namespace) -> int:
    """``ff admin users``: edits the cluster's tokens file (no mgmtd call; see fireflyer.cluster.users)."""
    import time

    import msgspec

    from fireflyer.cluster import users

    if not ns.users_command:
        ns.users_parser.print_help()
        return 2
    path = Path(ns.tokens_file) if ns.tokens_file else users.tokens_path(ns.state_dir)
    if ns.users_command == "add":
        expires = None
        if ns.expires_in is not None:
            expires = users.parse_time_after(time.time(), users.parse_duration(ns.expires_in))
        elif ns.expires is not None:
            expires = users.parse_time(ns.expires)
        token, entry = users.add_user(path, ns.name, role=ns.user_role, expires_at=expires)
        if ns.json or ns.users_json:
            row = users.user_rows([entry], now=time.time())[0]
            print(msgspec.json.encode({**msgspec.structs.asdict(row), "token": token}).decode())
        else:
            until = f", expires {users.user_rows([entry], now=time.time())[0].expires_at}" if expires else ""
            print(f"added user {ns.name} (role {ns.user_role}{until}); its token, shown only now:")
            print(token)
            print(f"hand it over as FF_TOKEN; services accept it within a few seconds ({path})", file=sys.stderr)
        return 0
    if ns.users_command == "revoke":
        n = users.revoke_user(path, ns.name)
        print(f"revoked {n} token{'s' if n != 1 else ''} of user {ns.name}; services refuse "
              f"{'them' if n != 1 else 'it'} within a few seconds")
        return 0
    rows = users.list_users(path)
    if ns.json or ns.users_json:
        print(msgspec.json.encode(rows).decode())
        return 0
    fmt = "{:<16} {:<12} {:<21} {:<21} {}"
    print(fmt.format("USER", "ROLES", "CREATED", "EXPIRES", "STATE"))
    for r in rows:
        state = f"revoked {r.revoked_at}" if r.state == "revoked" and r.revoked_at else r.state
        print(fmt.format(r.user, ",".join(r.roles), r.created_at or "-", r.expires_at or "never", state))
    return 0


def _cmd(ns: argparse.Namespace) -> int:
    from fireflyer.core.errors import FireFlyerError

    if not ns.admin_command:
        ns.admin_parser.print_help()
        return 2
    if ns.admin_command == "users":
        try:
            return _users(ns)
        except FireFlyerError as e:
            print(f"ff admin users: {e.code}: {e}", file=sys.stderr)
            return 1
    addresses, token = resolve_mgmtd(ns.state_dir, address=ns.address, token=ns.token, role=ns.role)
    try:
        return asyncio.run(_run(ns, addresses, token))
    except FireFlyerError as e:
        print(f"ff admin {ns.admin_command}: {e.code}: {e}", file=sys.stderr)
        return 1


def register(subparsers: Any) -> None:
    from fireflyer.cli.options import add_cluster_options

    p = subparsers.add_parser("admin", help="inspect and set up mgmtd (routing, chains, chain tables)",
                              description=(__doc__ or "").split("\n\n")[0])
    add_cluster_options(p, address_help="mgmtd host:port list (default $FF_MGMTD_ADDR, else cluster.json)",
                        role="admin")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=15.0, metavar="S", help="how long writes look for a primary")
    sub = p.add_subparsers(dest="admin_command", metavar="WHAT")
    for name, help_ in (("routing", "the whole routing info"), ("nodes", "registered nodes"),
                        ("targets", "storage targets"), ("chains", "chains, head to tail"),
                        ("chain-tables", "chain tables, every version"), ("primary", "which replica is primary")):
        sub.add_parser(name, help=help_)
    cc = sub.add_parser("create-chain", help="create one chain from the given targets (head first)")
    cc.add_argument("--chain-id", type=int, required=True)
    cc.add_argument("--targets", required=True, help="ID[@NODE],... head first")
    ic = sub.add_parser("init-chains", help="cut a target list into chains of --replicas targets")
    ic.add_argument("--targets", required=True, help="ID[@NODE],... interleaved across nodes")
    ic.add_argument("--replicas", type=int, default=3)
    ic.add_argument("--first-chain-id", type=int, default=1)
    ic.add_argument("--table-id", type=int, default=0, help="also create this chain table over the new chains")
    ct = sub.add_parser("create-chain-table", help="create a chain table (or its next version)")
    ct.add_argument("--table-id", type=int, required=True)
    ct.add_argument("--chains", required=True, help="chain ids, comma separated")
    ct.add_argument("--desc", default="")
    ot = sub.add_parser("offline-target", help="take a target out of service (forces a resync)")
    ot.add_argument("target", type=int)
    us = sub.add_parser("users", help="add, list and revoke users (the cluster's tokens file; no restart)",
                        description="Edit the tokens file of the cluster (--state-dir); services pick the "
                                    "change up within a few seconds.")
    us.add_argument("--tokens-file", default=None, metavar="PATH",
                    help="the tokens file to edit (default: the one of the state dir's cluster)")
    usub = us.add_subparsers(dest="users_command", metavar="ACTION")
    ua = usub.add_parser("add", help="add a user; prints its new token once")
    ua.add_argument("name")
    # "service" is listed so that asking for it gets plan_add's explanation, not argparse's "invalid choice"
    ua.add_argument("--role", dest="user_role", choices=["user", "admin", "service"], default="user")
    ux = ua.add_mutually_exclusive_group()
    ux.add_argument("--expires-in", default=None, metavar="DURATION", help="e.g. 90d, 12h, 1h30m (default: never)")
    ux.add_argument("--expires", default=None, metavar="AT", help="RFC 3339 time, e.g. 2027-01-31T00:00:00Z")
    ua.add_argument("--json", dest="users_json", action="store_true", help="one JSON object (with the token)")
    ul = usub.add_parser("ls", help="list users: name, roles, created, expiry, state (never the tokens)")
    ul.add_argument("--json", dest="users_json", action="store_true", help="print JSON instead of a table")
    ur = usub.add_parser("revoke", help="revoke every active token of a user")
    ur.add_argument("name")
    us.set_defaults(users_parser=us, users_json=False)
    p.set_defaults(func=_cmd, admin_parser=p)
