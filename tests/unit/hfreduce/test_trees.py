"""Properties of fireflyer.hfreduce.trees: plain and zone-aware double binary trees."""

import time

import msgspec
import numpy as np
import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce.trees import (
    DoubleTree,
    Tree,
    TreeNode,
    depth_bound,
    double_binary_tree,
    split_halves,
    zone_aware_double_tree,
)

N_MAX = 1300


def check_spanning(tree: Tree, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Assert ``tree`` is a rooted spanning tree of 0..n-1; return (parents, depth per node)."""
    nodes = tree.nodes
    assert [nd.rank for nd in nodes] == list(range(n))
    par = np.array([nd.parent for nd in nodes], dtype=np.int64)
    assert np.flatnonzero(par < 0).tolist() == [tree.root]
    # children lists and parent pointers describe the same n-1 edges
    kids = [(c, nd.rank) for nd in nodes for c in nd.children]
    assert len(kids) == n - 1
    if kids:
        child, parent = np.array(kids).T
        assert (par[child] == parent).all()
        assert np.array_equal(np.sort(child), np.flatnonzero(par >= 0))
    # pointer jumping: every node reaches the root (no cycle), and its distance is its depth
    nxt = np.where(par < 0, np.arange(n), par)
    dist = (par >= 0).astype(np.int64)
    for _ in range(n.bit_length() + 1):
        dist = dist + dist[nxt]
        nxt = nxt[nxt]
    assert (nxt == tree.root).all(), "a node does not reach the root"
    return par, dist


def check_in_order(par: np.ndarray, depth: np.ndarray, pos: np.ndarray) -> None:
    """Every subtree covers a contiguous range of positions."""
    size = np.ones(len(par), dtype=np.int64)
    lo, hi = pos.copy(), pos.copy()
    for d in range(int(depth.max()), 0, -1):
        idx = np.flatnonzero(depth == d)
        np.add.at(size, par[idx], size[idx])
        np.minimum.at(lo, par[idx], lo[idx])
        np.maximum.at(hi, par[idx], hi[idx])
    assert (hi - lo + 1 == size).all(), "a subtree is not a contiguous range"


def check_double(dt: DoubleTree, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = [check_spanning(t, n) for t in dt.trees]
    assert dt.depth() == max(int(d.max()) for _, d in out) <= depth_bound(n)
    return out


# --------------------------------------------------------------------------- plain


def test_small_trees_are_the_documented_ones():
    # workers and the coordination service must agree on these numbers
    assert double_binary_tree(8).trees[0].parents() == (-1, 2, 4, 2, 0, 6, 4, 6)
    assert double_binary_tree(8).trees[1].parents() == (1, 3, 1, 7, 5, 3, 5, -1)
    assert double_binary_tree(7).trees[0].parents() == (-1, 2, 4, 2, 0, 6, 4)
    assert double_binary_tree(7).trees[1].parents() == (5, -1, 3, 5, 3, 1, 0)
    assert double_binary_tree(8).roots() == (0, 7) and double_binary_tree(7).roots() == (0, 1)
    assert double_binary_tree(8).trees[0].node(4) == TreeNode(4, 0, (2, 6))


def test_single_node():
    dt = double_binary_tree(1)
    for t in dt.trees:
        assert t.root == 0 and t.nodes == (TreeNode(0, -1, ()),)
        assert t.edges() == () and t.depth() == 0 and t.interior() == frozenset()
    assert dt.for_rank(0) == (TreeNode(0, -1, ()), TreeNode(0, -1, ()))
    assert zone_aware_double_tree(["A"]) == (dt, (0,))


def test_plain_sweep():
    for n in range(1, N_MAX + 1):
        dt = double_binary_tree(n)
        (p0, d0), (p1, d1) = check_double(dt, n)
        r = np.arange(n)
        # both trees exactly ceil(log2 n) deep
        assert d0.max() == d1.max() == depth_bound(n)
        # tree 0 is in-order over ranks; its interior is the even ranks
        check_in_order(p0, d0, r)
        if n >= 2:
            assert dt.trees[0].interior() == frozenset(range(0, n, 2))
        # tree 1 is tree 0 mirrored (even n) or shifted (odd n)
        perm = n - 1 - r if n % 2 == 0 else (r + 1) % n
        child = np.flatnonzero(p0 >= 0)
        assert (p1[perm[child]] == perm[p0[child]]).all()
        assert dt.roots() == ((0, n - 1) if n % 2 == 0 else (0, 1 % n))
        both = dt.interior_in_both()
        assert both == (frozenset() if n % 2 == 0 or n == 1 else frozenset({0}))


def test_for_rank_and_edges():
    dt = double_binary_tree(10)
    n0, n1 = dt.for_rank(5)
    assert (n0, n1) == (dt.trees[0].nodes[5], dt.trees[1].nodes[5])
    assert n0.is_leaf and not n1.is_leaf and not n0.is_root
    assert len(dt.trees[1].edges()) == 9 and (8, 9) in dt.trees[0].edges()
    assert dt.trees[0].leaves() == frozenset(range(1, 10, 2))


def test_structs_round_trip_through_msgpack():
    dt, order = zone_aware_double_tree(["a", "b", "a", "b", "b"])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(dt), type=DoubleTree) == dt


def test_split_halves():
    assert split_halves(0) == ((0, 0), (0, 0))
    assert split_halves(1) == ((0, 1), (1, 1))
    assert split_halves(7) == ((0, 4), (4, 7))
    assert split_halves(8) == ((0, 4), (4, 8))


# --------------------------------------------------------------------------- zones


def check_zoned(zones: list[str]) -> tuple[DoubleTree, tuple[int, ...]]:
    n = len(zones)
    dt, order = zone_aware_double_tree(zones)
    assert sorted(order) == list(range(n))
    runs = [zones[order[0]]] + [
        zones[b] for a, b in zip(order, order[1:], strict=False) if zones[a] != zones[b]
    ]
    assert len(runs) == len(set(zones)), "each zone must be a contiguous run of positions"
    (p0, d0), _ = check_double(dt, n)
    pos = np.empty(n, dtype=np.int64)
    pos[np.array(order)] = np.arange(n)
    check_in_order(p0, d0, pos)
    return dt, order


def first_index(zones: list[str]) -> dict[str, int]:
    first: dict[str, int] = {}
    for i, z in enumerate(zones):
        first.setdefault(z, i)
    return first


def check_two_zones(zones: list[str]) -> None:
    dt, order = check_zoned(zones)
    counts = {z: zones.count(z) for z in set(zones)}
    first = first_index(zones)
    big, small = sorted(counts, key=lambda z: (-counts[z], first[z]))
    gw_big, gw_small = first[big], first[small]
    # exactly one pair talks across zones, in both trees, between the gateways
    assert dt.cross_zone_pairs(zones) == {frozenset({gw_big, gw_small})}
    for t in dt.trees:
        assert t.root == gw_big and t.nodes[gw_small].parent == gw_big
        assert max(len(nd.children) for nd in t.nodes) <= 2
    assert order[0] == gw_big
    # only the gateways are interior in both trees
    assert dt.interior_in_both() == ({gw_big, gw_small} if counts[small] >= 2 else {gw_big})


def test_two_zones_random_splits_sweep():
    rng = np.random.default_rng(2408)
    for n in range(2, N_MAX + 1):
        a = int(rng.integers(1, n))
        zones = np.array(["A"] * a + ["B"] * (n - a))
        rng.shuffle(zones)
        check_two_zones(zones.tolist())


@pytest.mark.parametrize("n", [*range(2, 70), 127, 128, 129, 1023, 1024, 1025, 1249, 1250, 1299, N_MAX])
def test_two_zones_extreme_and_even_splits(n):
    for a in {1, n - 1, n // 2, (n + 1) // 2}:
        check_two_zones(["A"] * a + ["B"] * (n - a))
        check_two_zones(["B"] * (n - a) + ["A"] * a)


def test_two_zones_of_one_node_and_equal_halves():
    dt, order = check_zoned(["x", "y"])
    assert order == (0, 1) and dt.trees[0].parents() == dt.trees[1].parents() == (-1, 0)
    check_two_zones(["A"] + ["B"] * 1299)
    dt, order = zone_aware_double_tree(["B", "A"] * 625)
    assert dt.roots() == (0, 0) and order[:3] == (0, 2, 4)  # tie: the earlier zone is on top
    assert dt.depth() == depth_bound(1250)


def test_more_zones_join_gateways_by_zones_minus_one_pairs():
    rng = np.random.default_rng(14158)
    for _ in range(60):
        k = int(rng.integers(3, 12))
        n = int(rng.integers(k, 400))
        zones = [f"z{int(z)}" for z in rng.integers(0, k, n)]
        k = len(set(zones))
        dt, _ = check_zoned(zones)
        gateways = set(first_index(zones).values())
        pairs = dt.cross_zone_pairs(zones)
        assert len(pairs) == k - 1 and all(p <= gateways for p in pairs)
        e0, e1 = ({frozenset(e) for e in t.edges() if zones[e[0]] != zones[e[1]]} for t in dt.trees)
        assert e0 == e1 == pairs
        assert dt.interior_in_both() <= gateways


def test_every_node_its_own_zone():
    n = N_MAX
    zones = [str(i) for i in range(n)]
    dt, _ = check_zoned(zones)
    assert len(dt.cross_zone_pairs(zones)) == n - 1


def test_zone_aware_timing_for_1250_nodes(capsys):
    zones = ["A"] * 600 + ["B"] * 650
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        dt, _ = zone_aware_double_tree(zones)
        depth, pairs = dt.depth(), len(dt.cross_zone_pairs(zones))
    ms = (time.perf_counter() - t0) / reps * 1e3
    assert pairs == 1 and depth <= depth_bound(1250)
    with capsys.disabled():
        print(f"\nzone_aware_double_tree(1250 nodes, 2 zones) + depth + cross pairs: {ms:.2f} ms")


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3", None])
def test_bad_node_count(n):
    with pytest.raises(InvalidArgument):
        double_binary_tree(n)
    with pytest.raises(InvalidArgument):
        depth_bound(n)


@pytest.mark.parametrize("zones", [[], (), "AB", ["A", 2], None, 3])
def test_bad_zones(zones):
    with pytest.raises(InvalidArgument):
        zone_aware_double_tree(zones)


def test_bad_ranks_and_lengths():
    dt = double_binary_tree(4)
    for rank in (-1, 4, True, "1"):
        with pytest.raises(InvalidArgument) as ei:
            dt.for_rank(rank)
        assert ei.value.size == 4
    with pytest.raises(InvalidArgument):
        dt.trees[0].node(9)
    with pytest.raises(InvalidArgument):
        dt.cross_zone_pairs(["A", "B"])
    with pytest.raises(InvalidArgument):
        dt.cross_zone_pairs("ABAB")
    with pytest.raises(InvalidArgument):
        split_halves(-1)


@pytest.mark.parametrize("n", list(range(1, 41)) + [64, 127, 128, 1300])
def test_centred_keeps_the_edges_and_takes_the_least_depth_any_root_gives(n: int) -> None:
    zoned = zone_aware_double_tree(["A"] * (n // 2) + ["B"] * (n - n // 2))[0].trees if n > 1 else ()
    for tree in (*double_binary_tree(n).trees, *zoned):
        c = tree.centred()
        assert {frozenset(e) for e in c.edges()} == {frozenset(e) for e in tree.edges()}
        assert c.nodes[c.root].parent == -1 and all(nd.rank == i for i, nd in enumerate(c.nodes))
        assert all(c.nodes[p].children.count(ch) == 1 for p, ch in c.edges())
        assert c.depth() <= tree.depth()
        if n <= 40:  # every other root is no shallower (brute force)
            best = min(_rerooted_depth(tree, r) for r in range(n))
            assert c.depth() == best


def _rerooted_depth(tree: Tree, root: int) -> int:
    """Depth of ``tree``'s edges rooted at ``root`` (a plain BFS, independent of ``centred``)."""
    adj: dict[int, set[int]] = {nd.rank: set(nd.children) for nd in tree.nodes}
    for p, ch in tree.edges():
        adj[ch].add(p)
    seen, level, depth = {root}, [root], -1
    while level:
        depth += 1
        nxt = []
        for v in level:
            for w in adj[v] - seen:
                seen.add(w)
                nxt.append(w)
        level = nxt
    return depth
