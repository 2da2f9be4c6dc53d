"""Double binary trees over the nodes of an HFReduce job, plain and zone-aware.

HFReduce reduces inside a node first and then runs an allreduce *between nodes*
over two binary trees (Sanders, Speck and Träff 2009): the buffer is cut in two
halves, tree 0 reduces and broadcasts the first half and tree 1 the second (see
:func:`split_halves`), both at once.  A node that is interior (has children) in
one tree is, as far as possible, a leaf in the other, so every node sends and
receives about the same volume and no link sits idle.  This module only computes
the trees; it is pure code (sizes or zone names in, trees out), used centrally by
the coordination service and, per node, by the HFReduce worker.

**Numbering.**  Every tree is over node indices ``0..n-1``.  For
:func:`double_binary_tree` the index is the node's rank in the job.  For
:func:`zone_aware_double_tree` it is the node's index in the ``zones`` sequence
the caller passed, and the function also returns the *ordering* it used:
``order[pos]`` is the node at position ``pos``; each zone occupies a contiguous
run of positions.  ``TreeNode.children`` are listed in increasing position
(rank, for plain trees), which for tree 0 is left to right; a worker that
combines its children in that order gets a fixed, reproducible reduction order.

**The in-order tree** over ``m`` positions (tree 0 of both constructions):
position 0 is the root and has one child; positions ``1..m-1`` form the
Cartesian tree on the number of trailing zero bits (the position with the most
trailing zeros in a range is unique and is that range's root).  So every subtree
covers a contiguous range of positions, odd positions are exactly the leaves,
even positions exactly the interior nodes (``m >= 2``), and the depth is
``ceil(log2 m)``.  The parent of ``r >= 1`` with lowest set bit ``b`` is the
nearer of ``r - b`` and ``r + b`` in that Cartesian tree: ``r - b`` when bit
``2b`` of ``r`` is set or ``r + b >= m``, else ``r + b``.

**Plain double tree** (:func:`double_binary_tree`, the paper's construction):
tree 1 is tree 0 relabelled by the mirror ``r -> n-1-r`` for even ``n`` (so the
odd leaves of tree 0 become the interior of tree 1: no node is interior in both)
or by the shift ``r -> (r+1) mod n`` for odd ``n`` (exactly rank 0, the root of
tree 0, is interior in both when ``n >= 3``).  Roots: ``(0, n-1)`` for even
``n``, ``(0, 1)`` for odd ``n``.  Both trees have depth ``ceil(log2 n)``.

**Zone-aware double tree** (:func:`zone_aware_double_tree`, paper §III-B: the
two zones of the cluster are joined by few links, so only one pair of nodes may
talk across them).  Each zone gets its own pair of trees, rooted at the zone's
*gateway* (its first node in input order) in *both* trees: tree 0 is the
in-order tree over the zone's positions, tree 1 is tree 0 relabelled by the
shift ``r -> r+1`` of positions ``1..m-1`` (wrapping ``m-1 -> 1``) with the
gateway fixed.  That shift maps the even (interior) positions ``>= 2`` to odd
ones, so inside a zone only the gateway is interior in both trees.  The zones'
gateways are then joined by the *same* edges in both trees, so the cross-zone
pairs are the same in both: ``k - 1`` pairs for ``k`` zones (one for two).
Zones are merged smallest first, the smaller cluster's gateway becoming a child
of the larger cluster's gateway (union by size); with two zones the smaller
zone's gateway hangs under the larger zone's gateway, which is the root of both
trees.

Why not join two plain double trees: the mirror or shift moves the zone's
tree-0 root to a deep leaf of tree 1, so one pair cannot join both trees near
their roots and tree 1 would be about twice as deep.  Rooting both trees of a
zone at its gateway keeps the join at the top.  Properties of the zone-aware
trees (``k >= 2`` zones; one zone falls back to the plain double tree):

- both trees span all nodes (``n - 1`` edges, acyclic) and have depth at most
  ``ceil(log2 n)``: attaching a cluster of ``s2`` nodes one level below a
  cluster of ``s1 >= s2`` nodes gives depth ``max(ceil(log2 s1),
  1 + ceil(log2 s2)) <= ceil(log2(s1 + s2))``;
- exactly ``k - 1`` unordered node pairs communicate across zones, all between
  gateways, the same pairs in both trees;
- the nodes interior in both trees are exactly the gateways that have a child
  (with two zones: the root gateway, and the other gateway when its zone has
  two or more nodes) -- unavoidable, since the one cross-zone pair must be an
  edge of both trees;
- tree 0 is in-order over the ordering: every subtree is a contiguous range of
  positions;
- with two zones every node has at most two children; with more, a gateway has
  one child more per cluster merged under it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = [
    "TreeNode",
    "Tree",
    "DoubleTree",
    "double_binary_tree",
    "zone_aware_double_tree",
    "split_halves",
    "depth_bound",
]


class TreeNode(msgspec.Struct, frozen=True):
    """One node's place in one tree: its ``parent`` (-1 at the root) and ``children``."""

    rank: int
    parent: int
    children: tuple[int, ...]

    @property
    def is_root(self) -> bool:
        return self.parent < 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


class Tree(msgspec.Struct, frozen=True):
    """A rooted spanning tree; ``nodes[r]`` is the :class:`TreeNode` of node ``r``."""

    root: int
    nodes: tuple[TreeNode, ...]

    @property
    def size(self) -> int:
        return len(self.nodes)

    def node(self, rank: int) -> TreeNode:
        _check_rank(rank, len(self.nodes))
        return self.nodes[rank]

    def parents(self) -> tuple[int, ...]:
        """``parents()[r]`` is the parent of node ``r`` (-1 for the root)."""
        return tuple(nd.parent for nd in self.nodes)

    def depth(self) -> int:
        """Edges on the longest root-to-leaf path (0 for a single node)."""
        nodes = self.nodes
        level = [self.root]
        depth = -1
        while level:
            depth += 1
            level = [c for v in level for c in nodes[v].children]
        return depth

    def edges(self) -> tuple[tuple[int, int], ...]:
        """``(parent, child)`` for every non-root node, in child order."""
        return tuple((nd.parent, nd.rank) for nd in self.nodes if nd.parent >= 0)

    def interior(self) -> frozenset[int]:
        """The nodes with at least one child."""
        return frozenset(nd.rank for nd in self.nodes if nd.children)

    def leaves(self) -> frozenset[int]:
        return frozenset(nd.rank for nd in self.nodes if not nd.children)

    def centred(self) -> Tree:
        """The same edges rooted at a centre: the node whose farthest node is nearest (the
        lowest rank among equals), so the depth is the least any root of these edges gives.

        The double binary tree's roots have one child, a level the small ops' express path
        (:mod:`.express_tree`), which only needs the edges, need not climb: over four nodes
        tree 0 is 0 - 2 - {1, 3}, two levels below its root, and rooted at 2 it is a star.
        """
        n = len(self.nodes)
        adj: list[list[int]] = [list(nd.children) for nd in self.nodes]
        for nd in self.nodes:
            if nd.parent >= 0:
                adj[nd.rank].append(nd.parent)

        def bfs(src: int) -> tuple[list[int], list[int]]:  # (distance, parent) of every node from src
            dist, par, level = [-1] * n, [-1] * n, [src]
            dist[src] = 0
            while level:
                nxt = []
                for v in level:
                    for w in adj[v]:
                        if dist[w] < 0:
                            dist[w], par[w] = dist[v] + 1, v
                            nxt.append(w)
                level = nxt
            return dist, par

        # the centres are the middle of a longest path (one node, or two adjacent ones)
        d0, _ = bfs(0)
        u = max(range(n), key=lambda r: (d0[r], -r))
        du, par = bfs(u)
        v = max(range(n), key=lambda r: (du[r], -r))
        path = [v]
        while path[-1] != u:
            path.append(par[path[-1]])
        length = du[v]
        best = min(path[length // 2], path[(length + 1) // 2])
        _, par = bfs(best)
        kids: list[list[int]] = [[] for _ in range(n)]
        for v in range(n):
            if par[v] >= 0:
                kids[par[v]].append(v)
        return Tree(root=best, nodes=tuple(TreeNode(rank=v, parent=par[v], children=tuple(sorted(kids[v])))
                                           for v in range(n)))


class DoubleTree(msgspec.Struct, frozen=True):
    """The two trees of one allreduce; tree ``t`` carries half ``t`` (:func:`split_halves`)."""

    trees: tuple[Tree, Tree]

    @property
    def size(self) -> int:
        return len(self.trees[0].nodes)

    def roots(self) -> tuple[int, int]:
        return (self.trees[0].root, self.trees[1].root)

    def for_rank(self, rank: int) -> tuple[TreeNode, TreeNode]:
        """Node ``rank``'s parent and children in tree 0 and in tree 1."""
        _check_rank(rank, self.size)
        return (self.trees[0].nodes[rank], self.trees[1].nodes[rank])

    def depth(self) -> int:
        """The deeper of the two trees' depths."""
        return max(self.trees[0].depth(), self.trees[1].depth())

    def interior_in_both(self) -> frozenset[int]:
        """Nodes with children in both trees (their links carry more than the others')."""
        return self.trees[0].interior() & self.trees[1].interior()

    def cross_zone_pairs(self, zones: Sequence[str]) -> set[frozenset[int]]:
        """Unordered node pairs joined by an edge, in either tree, whose zones differ."""
        got = len(zones) if hasattr(zones, "__len__") and not isinstance(zones, str) else None
        if got != self.size:
            raise InvalidArgument(
                f"zones must name the zone of each of the {self.size} nodes", expected=self.size, got=got
            )
        return {frozenset(e) for tree in self.trees for e in tree.edges() if zones[e[0]] != zones[e[1]]}


def depth_bound(n: int) -> int:
    """``ceil(log2 n)`` (0 for ``n == 1``): the depth of both constructions' trees is at most this."""
    _check_count(n)
    return (n - 1).bit_length()


def split_halves(count: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``[start, stop)`` of the elements tree 0 and tree 1 carry.

    Tree 0 takes the first ``ceil(count/2)`` elements, tree 1 the rest.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidArgument("count must be a non-negative int", count=repr(count))
    half = (count + 1) // 2
    return (0, half), (half, count)


def double_binary_tree(n: int) -> DoubleTree:
    """The plain double binary tree over ranks ``0..n-1`` (mirror for even, shift for odd ``n``)."""
    _check_count(n)
    p0 = _inorder_parents(n)
    perm = [n - 1 - r for r in range(n)] if n % 2 == 0 else [*range(1, n), 0]
    p1 = [-1] * n
    for r, p in enumerate(p0):
        if p >= 0:
            p1[perm[r]] = perm[p]
    order = range(n)
    return DoubleTree((_build(p0, order), _build(p1, order)))


def zone_aware_double_tree(zones: Sequence[str]) -> tuple[DoubleTree, tuple[int, ...]]:
    """Double tree over nodes ``0..len(zones)-1`` with one cross-zone pair per zone join.

    ``zones[i]`` names node ``i``'s zone.  Returns the trees (indexed by node
    index) and the ordering: ``order[pos]`` is the node at position ``pos``.
    Within a zone, positions follow input order and the zone's first node is its
    gateway; callers control locality (e.g. nodes sorted by leaf switch) through
    the order they pass.  One zone gives :func:`double_binary_tree` and the
    identity ordering.  See the module docstring for the properties.
    """
    if isinstance(zones, str) or not isinstance(zones, Sequence):
        raise InvalidArgument(
            "zones must be a sequence of zone names, one per node", got=type(zones).__name__
        )
    n = len(zones)
    if n == 0:
        raise InvalidArgument("zones is empty: a double tree needs at least one node", n=0)
    members: dict[str, list[int]] = {}
    for i, z in enumerate(zones):
        if not isinstance(z, str):
            raise InvalidArgument("zone names must be str", node=i, got=type(z).__name__)
        members.setdefault(z, []).append(i)
    if len(members) == 1:
        return double_binary_tree(n), tuple(range(n))

    # Union by size over the zones, smallest clusters first (Huffman order keeps
    # the gateways' extra children few); ties: the earlier zone stays on top.
    names = list(members)  # first-appearance order
    sub_zones: list[list[int]] = [[] for _ in names]
    heap = [(len(members[z]), -k, k) for k, z in enumerate(names)]
    heapq.heapify(heap)
    while len(heap) > 1:
        small_size, _, small = heapq.heappop(heap)
        large_size, large_key, large = heapq.heappop(heap)
        sub_zones[large].append(small)
        heapq.heappush(heap, (small_size + large_size, large_key, large))
    top = heap[0][2]

    # Positions: zones in preorder of the zone tree, so every cluster is contiguous.
    zone_order: list[int] = []
    gateway_parent: dict[int, int] = {top: -1}
    stack = [top]
    while stack:
        k = stack.pop()
        zone_order.append(k)
        for child in sorted(sub_zones[k], reverse=True):
            gateway_parent[child] = members[names[k]][0]
            stack.append(child)
    order = tuple(i for k in zone_order for i in members[names[k]])

    p0 = [-1] * n
    p1 = [-1] * n
    for k in zone_order:
        mem = members[names[k]]
        m = len(mem)
        local = _inorder_parents(m)
        # tree 1: shift local positions 1..m-1 by one (m-1 wraps to 1), gateway fixed
        shifted = [0, *range(2, m), 1] if m > 1 else [0]
        for r in range(1, m):
            p0[mem[r]] = mem[local[r]]
            p1[mem[shifted[r]]] = mem[shifted[local[r]]]
        p0[mem[0]] = p1[mem[0]] = gateway_parent[k]
    return DoubleTree((_build(p0, order), _build(p1, order))), order


def _inorder_parents(m: int) -> list[int]:
    """Parents of the in-order tree over positions ``0..m-1`` (module docstring)."""
    parents = [-1] * m
    for r in range(1, m):
        b = r & -r
        up = r + b
        if r & (b << 1) or up >= m:
            up = r - b
        parents[r] = up
    return parents


def _build(parents: list[int], order: Sequence[int]) -> Tree:
    """A :class:`Tree` from a parent list; children listed in ``order``."""
    children: list[list[int]] = [[] for _ in parents]
    root = -1
    for v in order:
        p = parents[v]
        if p >= 0:
            children[p].append(v)
        else:
            root = v
    nodes = tuple(TreeNode(r, p, tuple(c)) for r, (p, c) in enumerate(zip(parents, children, strict=True)))
    return Tree(root, nodes)


def _check_count(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument("a double tree needs n >= 1 nodes (an int)", n=repr(n))


def _check_rank(rank: int, n: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise InvalidArgument(f"rank must be in 0..{n - 1}", rank=repr(rank), size=n)
