"""Pure edits of :class:`~fireflyer.mgmt.model.RoutingInfo`: what each mgmtd write does.

mgmtd applies every change the same way: inside one KV transaction it reads the
routing info, calls one of these functions, and writes back the records that differ
(``services/mgmtd/store.py``).  Each function returns the *same object* when nothing
changes and otherwise a RoutingInfo whose ``version`` is exactly one higher, so a
retried or repeated request never bumps the version twice, and clients that compare
versions see every change once.

- :func:`sync_registry`: the primary's periodic pass (3FS's chain updater, every 1 s):
  chain states from the heartbeat registry's local states, plus node records and
  targets that storage nodes reported but no chain holds yet (``chain_id`` 0);
- :func:`create_chains`, :func:`create_chain_table`, :func:`offline_target`: admin RPCs.

Bad input raises :class:`~fireflyer.core.errors.InvalidArgument` (or NotFound /
AlreadyExists / FailedPrecondition) before anything is built, so nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from fireflyer.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound

from .chains import apply_to_routing, next_chain, update_chains
from .model import (
    Chain,
    ChainId,
    ChainTable,
    ChainTarget,
    LocalState,
    NodeInfo,
    PublicState,
    RoutingInfo,
    TargetId,
    TargetInfo,
)
from .registry import RegistryState, local_states

__all__ = [
    "NO_CHAIN",
    "TargetSpec",
    "ChainSpec",
    "sync_registry",
    "create_chains",
    "create_chain_table",
    "offline_target",
    "latest_tables",
]

#: ``TargetInfo.chain_id`` of a target that no chain holds yet
NO_CHAIN = 0


class TargetSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A target to place in a new chain; ``node_id`` may be empty if a heartbeat reported it."""

    target_id: TargetId
    node_id: str = ""
    disk: str = ""
    path: str = ""


class ChainSpec(msgspec.Struct, frozen=True, kw_only=True):
    chain_id: ChainId
    targets: tuple[TargetSpec, ...]


def _node_key(n: NodeInfo) -> tuple[object, ...]:
    # last_heartbeat is left out: persisting every heartbeat would bump the version every few seconds
    return (n.type, n.address, n.hostname, n.status, n.registered_at, n.tags, n.owner)


def sync_registry(routing: RoutingInfo, reg: RegistryState) -> RoutingInfo:
    """One chain-updater pass: chains, target local states, nodes and new targets from ``reg``.

    A target a storage node reports that routing does not list yet is added with
    ``chain_id`` 0 and public state OFFLINE (it serves nothing until an admin puts it
    in a chain); a target reported by another node than recorded moves to it (latest
    report wins, as in :func:`fireflyer.mgmt.registry.apply_heartbeat`).
    """
    local = local_states(reg)
    mid = apply_to_routing(routing, update_chains(routing.chains, local), local)

    nodes = {n.node_id: n for n in mid.nodes}
    for nid, n in reg.nodes.items():
        old = nodes.get(nid)
        if old is None or _node_key(old) != _node_key(n):
            nodes[nid] = n
    targets = {t.target_id: t for t in mid.targets}
    for tid, t in reg.targets.items():
        old_t = targets.get(tid)
        if old_t is None:
            targets[tid] = TargetInfo(target_id=tid, node_id=t.node_id, chain_id=NO_CHAIN,
                                      local_state=t.local_state, public_state=PublicState.OFFLINE,
                                      disk=t.disk, path=t.path)
        elif (old_t.node_id, old_t.disk, old_t.path) != (t.node_id, t.disk, t.path):
            targets[tid] = msgspec.structs.replace(old_t, node_id=t.node_id, disk=t.disk, path=t.path)
    new_nodes = tuple(sorted(nodes.values(), key=lambda n: n.node_id))
    new_targets = tuple(sorted(targets.values(), key=lambda t: t.target_id))
    if new_nodes == mid.nodes and new_targets == mid.targets:
        return mid
    return RoutingInfo(version=routing.version + 1, nodes=new_nodes, targets=new_targets, chains=mid.chains,
                       chain_tables=mid.chain_tables)


def _check_chain_spec(spec: ChainSpec, seen_targets: set[TargetId]) -> None:
    if spec.chain_id <= 0:
        raise InvalidArgument(f"chain ids start at 1, got {spec.chain_id}", chain=spec.chain_id)
    if not spec.targets:
        raise InvalidArgument(f"chain {spec.chain_id} lists no targets", chain=spec.chain_id)
    for t in spec.targets:
        if t.target_id <= 0:
            raise InvalidArgument(f"target ids start at 1, got {t.target_id} in chain {spec.chain_id}",
                                  chain=spec.chain_id, target=t.target_id)
        if t.target_id in seen_targets:
            raise InvalidArgument(f"target {t.target_id} is listed twice (a target belongs to one chain)",
                                  chain=spec.chain_id, target=t.target_id)
        seen_targets.add(t.target_id)


def create_chains(routing: RoutingInfo, specs: Sequence[ChainSpec]) -> RoutingInfo:
    """Add chains (all or none), their targets SERVING in the given order (head first).

    New targets hold no data, so every replica agrees and no resync is needed: *our
    choice*, as 3FS's ``upload-chains`` of a fresh cluster.  A chain that already exists
    with exactly these targets is skipped, so re-running an init is harmless.

    Raises:
        InvalidArgument: no chains, an id < 1, a target listed twice, or a target
            that is neither known from a heartbeat nor given a node.
        AlreadyExists: the chain exists with other targets, or a target is in another chain.
    """
    if not specs:
        raise InvalidArgument("no chains given", field="chains")
    seen_targets: set[TargetId] = set()
    seen_chains: set[ChainId] = set()
    chains = {c.chain_id: c for c in routing.chains}
    targets = {t.target_id: t for t in routing.targets}
    added = False
    for spec in specs:
        _check_chain_spec(spec, seen_targets)
        if spec.chain_id in seen_chains:
            raise InvalidArgument(f"chain {spec.chain_id} is listed twice", chain=spec.chain_id)
        seen_chains.add(spec.chain_id)
        ids = tuple(t.target_id for t in spec.targets)
        existing = chains.get(spec.chain_id)
        if existing is not None:
            if existing.target_ids == ids or sorted(existing.target_ids) == sorted(ids):
                continue  # a repeat of an earlier create (the order may have moved since)
            raise AlreadyExists(f"chain {spec.chain_id} exists with targets {list(existing.target_ids)}",
                                chain=spec.chain_id)
        for t in spec.targets:
            old = targets.get(t.target_id)
            if old is not None and old.chain_id not in (NO_CHAIN, spec.chain_id):
                raise AlreadyExists(f"target {t.target_id} is already in chain {old.chain_id}",
                                    target=t.target_id, chain=old.chain_id)
            node = t.node_id or (old.node_id if old is not None else "")
            if not node:
                raise InvalidArgument(f"target {t.target_id} is unknown (no storage node reported it): "
                                      "name its node, e.g. 101@storage-1", target=t.target_id)
            targets[t.target_id] = TargetInfo(
                target_id=t.target_id, node_id=node, chain_id=spec.chain_id,
                local_state=old.local_state if old is not None else LocalState.OFFLINE,
                public_state=PublicState.SERVING,
                disk=t.disk or (old.disk if old is not None else ""),
                path=t.path or (old.path if old is not None else ""))
        chains[spec.chain_id] = Chain(chain_id=spec.chain_id, version=1,
                                      targets=tuple(ChainTarget(target_id=i, public_state=PublicState.SERVING)
                                                    for i in ids))
        added = True
    if not added:
        return routing
    return msgspec.structs.replace(
        routing, version=routing.version + 1,
        targets=tuple(sorted(targets.values(), key=lambda t: t.target_id)),
        chains=tuple(sorted(chains.values(), key=lambda c: c.chain_id)))


def latest_tables(routing: RoutingInfo) -> dict[int, ChainTable]:
    """The newest version of each chain table, by table id."""
    out: dict[int, ChainTable] = {}
    for t in routing.chain_tables:
        if t.table_id not in out or t.version > out[t.table_id].version:
            out[t.table_id] = t
    return out


def create_chain_table(routing: RoutingInfo, table_id: int, chain_ids: Sequence[ChainId],
                       desc: str = "") -> RoutingInfo:
    """Add chain table ``table_id`` (version 1), or its next version when the chain list differs.

    Old versions stay in routing info: file layouts name (table id, version) and must
    keep resolving (research/3fs.md §2).  Same chains and description: no change.
    """
    if table_id <= 0:
        raise InvalidArgument(f"chain table ids start at 1, got {table_id}", table=table_id)
    if not chain_ids:
        raise InvalidArgument(f"chain table {table_id} lists no chains", table=table_id)
    if len(set(chain_ids)) != len(chain_ids):
        raise InvalidArgument(f"chain table {table_id} lists a chain twice: {list(chain_ids)}", table=table_id)
    known = {c.chain_id for c in routing.chains}
    missing = [c for c in chain_ids if c not in known]
    if missing:
        raise NotFound(f"chain table {table_id} names chains that do not exist: {missing} "
                       "(create them first: ff admin create-chain / init-chains)", table=table_id,
                       chain=missing[0])
    latest = latest_tables(routing).get(table_id)
    if latest is not None and latest.chain_ids == tuple(chain_ids) and latest.desc == desc:
        return routing
    table = ChainTable(table_id=table_id, version=1 if latest is None else latest.version + 1,
                       chain_ids=tuple(chain_ids), desc=desc)
    tables = tuple(sorted((*routing.chain_tables, table), key=lambda t: (t.table_id, t.version)))
    return msgspec.structs.replace(routing, version=routing.version + 1, chain_tables=tables)


def offline_target(routing: RoutingInfo, target_id: TargetId,
                   local: Mapping[TargetId, LocalState]) -> RoutingInfo:
    """Take a target out of service as if its node reported it OFFLINE, by the chain rules.

    So it goes to the chain's tail as offline (or stays as lastsrv when it was the last
    serving copy), and the chain version rises.  When its node reports it alive again it
    returns the usual way (waiting, then syncing once it reports online): an admin
    offline always forces a resync.  ``local`` is the registry's current local states.
    """
    target = next((t for t in routing.targets if t.target_id == target_id), None)
    if target is None:
        raise NotFound(f"no target {target_id} (ff admin targets lists them)", target=target_id)
    if target.chain_id == NO_CHAIN:
        raise FailedPrecondition(f"target {target_id} is in no chain; nothing to take offline",
                                 target=target_id)
    chain = next(c for c in routing.chains if c.chain_id == target.chain_id)
    forced = {**local, target_id: LocalState.OFFLINE}
    new = next_chain(chain, forced)
    return apply_to_routing(routing, [new] if new is not chain else [], forced)
