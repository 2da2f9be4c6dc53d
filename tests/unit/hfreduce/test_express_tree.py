"""The express path beyond two nodes, between in-process engines: up and down tree 0, the same
bits on every node and every run, early partials parked, and failures that name the peer."""

from __future__ import annotations

import numpy as np
import pytest
from engine_util import close_all, express_op, make_engines, run_all, wait_until

from fireflyer.hfreduce.errors import CollectiveAborted, CollectiveTimeout, FingerprintMismatch, HFReduceError
from fireflyer.hfreduce.express import XOP, XOp
from fireflyer.hfreduce.express_tree import TreeExpress
from fireflyer.hfreduce.types import Fingerprint
from fireflyer.wire.frame import Request


def _leaves_first(engines: list) -> list:  # type: ignore[type-arg]
    """The engines, nodes without children first and the root last (children's frames park)."""
    return sorted(engines, key=lambda e: (len(e.express.children), e.express.parent is None))


def _run(engines: list, seq: int, arrays: list[np.ndarray], order: list, **kw: object) -> list[XOp]:  # type: ignore[type-arg]
    done: list[XOp] = []
    for e in order:
        e.express.start(express_op(seq, arrays[e.node], done, **kw))  # type: ignore[arg-type]
    wait_until(lambda: len(done) == len(engines), f"op {seq} done on every node")
    return done


@pytest.fixture(params=[3, 4, 5])
def engines(request):  # type: ignore[no-untyped-def]
    es = make_engines(request.param, timeout_s=5.0)
    yield es
    close_all(es)


@pytest.fixture
def three():  # type: ignore[no-untyped-def]
    """Three engines: tree 0 centred is a root (node 2) and two leaves."""
    es = make_engines(3, timeout_s=5.0)
    yield es
    close_all(es)


def test_every_node_gets_the_same_bits_run_after_run_whoever_starts_first(engines) -> None:  # type: ignore[no-untyped-def]
    n = len(engines)
    assert all(isinstance(e.express, TreeExpress) and e.express.link is None for e in engines)
    roots = [e for e in engines if e.express.parent is None]
    assert len(roots) == 1 and sum(len(e.express.children) for e in engines) == n - 1
    rng = np.random.default_rng(n)
    inputs = [rng.standard_normal(33).astype(np.float32) * np.float32(1e6) for _ in range(n)]
    inputs[0][:3] = [np.inf, -0.0, 1e-45]
    first: bytes | None = None
    for seq in range(6):
        order = _leaves_first(engines) if seq % 2 else list(reversed(_leaves_first(engines)))
        xs = [x.copy() for x in inputs]
        done = _run(engines, seq, xs, order)
        assert len({x.tobytes() for x in xs}) == 1, f"op {seq}: nodes differ"
        first = first or xs[0].tobytes()
        assert xs[0].tobytes() == first, f"op {seq}: other bits than op 0"
        np.testing.assert_allclose(xs[0][3:], np.sum(np.stack(inputs), 0, dtype=np.float64)[3:], rtol=1e-5)
        assert xs[0][0] == np.inf and np.isfinite(xs[0][3:]).all()
    assert all(e.failed is None for e in engines)
    st = roots[0].express.stats(next(op for op in done if op.ours is xs[roots[0].node]))
    assert st.nbytes == 33 * 4 and st.trees[0].up_s > 0 and st.kind == "allreduce"
    kids = [lk.peer for lk in roots[0].express.children]
    assert sorted(st.peers) == sorted(kids)
    assert all(st.peers[p].bytes_sent == st.peers[p].bytes_received == 33 * 4 for p in kids)


def test_avg_divides_once_at_the_root(engines) -> None:  # type: ignore[no-untyped-def]
    n = len(engines)
    xs = [np.array([3 * i, -7, 1], np.int64) for i in range(n)]
    want = np.floor_divide(np.sum(np.stack(xs), 0), n)
    _run(engines, 0, xs, _leaves_first(engines), divisor=n)
    for x in xs:
        assert x.tolist() == want.tolist()


def test_max_over_the_tree(engines) -> None:  # type: ignore[no-untyped-def]
    xs = [np.array([float(i), -float(i)], np.float32) for i in range(len(engines))]
    _run(engines, 0, xs, list(engines), redop="max")
    assert all(x.tolist() == [len(engines) - 1.0, 0.0] for x in xs)


def test_a_fingerprint_that_differs_fails_every_engine(engines) -> None:  # type: ignore[no-untyped-def]
    leaf = _leaves_first(engines)[0]
    for e in engines:
        try:
            e.express.start(express_op(0, np.ones(5 if e is leaf else 4, np.float32), []))
        except (FingerprintMismatch, CollectiveAborted):
            pass
    wait_until(lambda: all(e.failed is not None for e in engines), "every engine fails")
    assert any(isinstance(e.failed, FingerprintMismatch) for e in engines)
    for e in engines:
        assert "5 el" in str(e.failed) and "4 el" in str(e.failed), repr(e.failed)


def test_a_silent_child_is_blamed_in_the_up_phase(three) -> None:  # type: ignore[no-untyped-def]
    es = three
    root = next(e for e in es if e.express.parent is None)
    silent = root.express.children[0].peer
    for e in es:
        if e.node != silent:
            e.express.start(express_op(7, np.ones(2, np.float32), []))
    with pytest.raises(CollectiveTimeout) as ei:
        root.express.wait(7, 0.3)
    f = ei.value.fields
    assert f["peer"] == silent and f["phase"] == "up" and f["tree"] == 0, f
    assert f"node {silent}" in str(ei.value)
    wait_until(lambda: all(e.failed is not None for e in es), "every node is told")
    other = next(e for e in es if e is not root and e.node != silent)  # sent up, waited for the result
    assert isinstance(other.failed, CollectiveAborted) and f"node {silent}" in str(other.failed)


def test_deadlines_are_staggered_so_the_node_next_to_the_fault_names_it(three) -> None:  # type: ignore[no-untyped-def]
    """The root and a leaf that sent its partial up both watch the op with the same deadline; a
    silent leaf must be named by the root (up phase, earlier deadline), and the waiting leaf told
    that reason through the abort, not blame the root for a result it never got."""
    es = three
    root = next(e for e in es if e.express.parent is None)
    silent, waiting = (es[lk.peer] for lk in root.express.children)
    for e in (root, waiting):
        e.express.start(express_op(4, np.ones(2, np.float32), []))
    assert waiting.express._stagger_s() > root.express._stagger_s()
    raised = run_all([lambda: root.express.wait(4, 0.3), lambda: waiting.express.wait(4, 0.3)], 10.0)
    assert isinstance(raised[0], CollectiveTimeout) and raised[0].fields["peer"] == silent.node, raised
    assert isinstance(raised[1], CollectiveAborted) and f"node {silent.node}" in str(raised[1]), raised
    assert "up phase" in str(raised[1]), raised


def test_a_child_that_sent_up_blames_its_parent_after_the_deadline(three) -> None:  # type: ignore[no-untyped-def]
    es = three
    root = next(e for e in es if e.express.parent is None)
    leaf = next(e for e in es if e.express.parent is not None and not e.express.children)
    leaf.express.start(express_op(2, np.ones(2, np.float32), []))  # the root never starts op 2
    with pytest.raises(CollectiveTimeout) as ei:
        leaf.express.wait(2, 0.3)
    f = ei.value.fields
    assert f["peer"] == root.node and f["phase"] == "down" and f["tree"] == 0, f
    assert f"node {root.node}" in str(ei.value)
    wait_until(lambda: root.failed is not None, "the root is told")


def test_a_frame_for_an_op_run_on_the_engine_is_a_mismatch(three) -> None:  # type: ignore[no-untyped-def]
    es = three
    root = next(e for e in es if e.express.parent is None)
    leaf = es[root.express.children[0].peer]
    assert not leaf.express.children  # (centred, a three-node tree is a root and two leaves)
    leaf.express.start(express_op(0, np.ones(3, np.float32), []))  # a leaf's partial goes up at once
    wait_until(lambda: (0, leaf.node) in root.express._parked, "the leaf's partial parked at the root")
    with pytest.raises(FingerprintMismatch) as ei:
        root.express.engine_op(0, Fingerprint(comm="t/x", seq=0, op="sum", dtype="float32", count=40000))
    assert "40000 el" in str(ei.value) and "3 el" in str(ei.value)
    wait_until(lambda: leaf.failed is not None, "the leaf hears of it")


def test_an_express_frame_off_tree_0_fails_the_engine(three) -> None:  # type: ignore[no-untyped-def]
    es = three
    src = es[0]
    lk = next(lk for lk in src.tree_links(1))
    with lk.fs.send_lock:
        lk.fs.send_frame(Request(rid=0, op=XOP, meta={"fp": []}), memoryview(bytes(8)))
    wait_until(lambda: es[lk.peer].failed is not None, "the receiver fails")
    assert isinstance(es[lk.peer].failed, HFReduceError) and "carries none" in str(es[lk.peer].failed)


def test_a_barrier_is_an_express_exchange_of_nothing_and_its_record_says_barrier(engines) -> None:  # type: ignore[no-untyped-def]
    done: list[XOp] = []
    for e in _leaves_first(engines):
        op = express_op(0, np.zeros(0, np.int32), done)
        op.fpw[-1] = "barrier"
        e.express.start(op)
    wait_until(lambda: len(done) == len(engines), "the barrier done everywhere")
    root = next(e for e in engines if e.express.parent is None)
    st = root.express.stats(next(op for op in done if op.links.keys() == {lk.peer for lk in root.express.children}))
    assert st.kind == "barrier" and st.nbytes == 0
