"""Node ranks and trees of a formed communicator, computed centrally (paper §III-B).

**Rank order.**  Nodes are ranked by zone name, then by node name in *natural*
order (``node2`` before ``node10``), so ranks are deterministic whatever order the
joins arrived in, each zone is one contiguous run of ranks, and a launcher that
names its nodes ``node0..node{N-1}`` in one zone gets rank ``i`` for ``node{i}``.
Global ranks follow: node ``r``'s local rank ``l`` is ``first_rank[r] + l`` where
``first_rank`` is the prefix sum of local world sizes (``r*K + l`` when uniform).

**Trees.**  Exactly what every node's engine computes from the same inputs
(:class:`fireflyer.hfreduce.engine.NodeEngine`): :func:`zone_aware_double_tree`
over the zones in rank order when any node has a zone (one cross-zone pair for
two zones), else the plain :func:`double_binary_tree`.  Computing them here as
well lets Join return them, and the bench and tests check the property on real
joins.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from fireflyer.hfreduce.trees import DoubleTree, double_binary_tree, zone_aware_double_tree

from .model import Member

__all__ = ["natural_key", "assign_ranks", "build_trees", "cross_zone_pairs", "TreeView", "tree_views"]

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> list[str | int]:
    """``"node10"`` -> ``["node", 10, ""]``: text and numbers alternate, so lists compare."""
    return [int(t) if i % 2 else t for i, t in enumerate(_DIGITS.split(name))]


def assign_ranks(members: Sequence[Member]) -> list[Member]:
    """Members sorted by (zone, natural node name) with node_rank and first_rank set."""
    ordered = sorted(members, key=lambda m: (m.zone, natural_key(m.node), m.node))
    first = 0
    out = []
    for r, m in enumerate(ordered):
        out.append(msgspec.structs.replace(m, node_rank=r, first_rank=first))
        first += m.local_world_size
    return out


def build_trees(members: Sequence[Member]) -> DoubleTree:
    """The double tree over ``members`` (in node-rank order), as the engines build it."""
    zones = [m.zone for m in members]
    if any(zones) and len(members) > 1:
        dt, _order = zone_aware_double_tree(zones)
        return dt
    return double_binary_tree(len(members))


def cross_zone_pairs(dt: DoubleTree, members: Sequence[Member]) -> int:
    zones = [m.zone for m in members]
    return len(dt.cross_zone_pairs(zones)) if len(set(zones)) > 1 else 0


class TreeView(msgspec.Struct, frozen=True):
    """One node's place in one tree, with its neighbours' data-plane addresses."""

    parent: int
    parent_address: str
    children: tuple[int, ...]
    child_addresses: tuple[str, ...]
    root: int
    depth: int


def tree_views(dt: DoubleTree, members: Sequence[Member], node_rank: int,
               depths: tuple[int, int] | None = None) -> tuple[TreeView, TreeView]:
    """Node ``node_rank``'s view of both trees; pass ``depths`` when building many (depth is O(n))."""
    addr = [m.address for m in members]
    depths = depths or (dt.trees[0].depth(), dt.trees[1].depth())
    views = []
    for tree, tn, d in zip(dt.trees, dt.for_rank(node_rank), depths, strict=True):
        views.append(TreeView(parent=tn.parent, parent_address=addr[tn.parent] if tn.parent >= 0 else "",
                              children=tuple(tn.children), child_addresses=tuple(addr[c] for c in tn.children),
                              root=tree.root, depth=d))
    return views[0], views[1]
