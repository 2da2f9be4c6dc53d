"""Failure semantics with injected faults: every rank raises, in time, naming the culprit.

Two nodes x two local ranks (global ranks 0,1 on node 0 and 2,3 on node 1), real worker
processes, a short deadline.  Faults: a fingerprint mismatch between two local ranks, a
sleeping rank, ``kill -9`` of a rank (the worker survives and serves a new communicator)
and ``kill -9`` of a worker.
"""

from __future__ import annotations

import os
import signal

import pytest
from hfr_cluster import Cluster

from fireflyer.hfreduce.express import EXPRESS_BYTES
from fireflyer.hfreduce.shm import list_segments

TIMEOUT_S = 2.0
SLACK_S = 2.0


def _start(timeout_s: float = TIMEOUT_S) -> Cluster:
    return Cluster(2, 2, chunk="1k", timeout_s=timeout_s).start()


def _all_raised(res: dict[int, dict], ranks: list[int]) -> None:
    assert sorted(res) == sorted(ranks), res
    for r in ranks:
        assert not res[r]["ok"], f"rank {r} did not raise: {res[r]}"
        assert res[r]["hfreduce_error"], f"rank {r} raised {res[r]['kind']}: {res[r]['message']}"


def _op_while_a_worker_is_stopped(*, nnodes: int, stopped: int, k: int = 0) -> dict[int, dict]:
    """``k`` ranks per node (default: two ranks in all), a 1 s deadline: one op, then a second one
    submitted while node ``stopped``'s worker is stopped (SIGSTOP, resumed afterwards); the ranks'
    outcomes."""
    k = k or 2 // nnodes
    c = Cluster(nnodes, k, chunk="1k", timeout_s=1.0).start()
    try:
        run = c.ranks("pause", wait=False)
        run.wait_line("submitting", nnodes * k)
        c.workers[stopped].send_signal(signal.SIGSTOP)
        (run.out / "go").touch()
        run.wait(30)
        res = run.results()
        c.workers[stopped].send_signal(signal.SIGCONT)
    finally:
        c.stop()
    return res


def test_worker_fingerprint_mismatch_raises_everywhere() -> None:
    c = _start()
    try:
        run = c.ranks("mismatch", victim=3, timeout_s=30)
        res = run.results()
    finally:
        codes = c.stop()
    _all_raised(res, [0, 1, 2, 3])
    for r in (2, 3):  # the victim's node: both fingerprints, both ranks named
        assert res[r]["kind"] == "FingerprintMismatch", res[r]
        msg = res[r]["message"]
        assert "100 el" in msg and "101 el" in msg and "rank 3" in msg and "rank 2" in msg, msg
    for r in (0, 1):  # the other node learns it through the engine, with the same text
        msg = res[r]["message"]
        assert "101 el" in msg and "node 1" in msg, msg
        assert res[r]["op_elapsed"] < TIMEOUT_S + SLACK_S, res[r]
    assert codes == [0, 0]
    assert list_segments() == []


@pytest.mark.parametrize("count", [1001, 40000])  # a small op and a large one
def test_worker_nodes_reducing_different_dtypes_raise_a_mismatch_everywhere(count: int) -> None:
    """float32 on node 0, bfloat16 on node 1: both carry float32 partials between the nodes, so
    only the dtype in the engine's fingerprint can tell; every rank gets both fingerprints."""
    _mismatch_on_every_rank("dtype_by_node", count, "bfloat16", "float32")


@pytest.mark.parametrize("count", [1000, EXPRESS_BYTES // 4])
def test_worker_nodes_disagreeing_on_a_small_ops_size_raise_a_mismatch_everywhere(count: int) -> None:
    """Node 0 reduces ``count`` elements, node 1 one more.  At 1,000 both take the express path
    (two nodes, small allreduce); at EXPRESS_BYTES / 4 node 0 does and node 1, one element over,
    takes the engine: the frame that arrives for an op the other node runs on the engine is a
    mismatch too, and every rank is told both fingerprints, well before the deadline."""
    _mismatch_on_every_rank("count_by_node", count, f"{count} el", f"{count + 1} el")


@pytest.mark.parametrize("count", [1000, EXPRESS_BYTES // 4])
def test_worker_nodes_disagreeing_on_a_small_broadcasts_size_raise_a_mismatch_everywhere(count: int) -> None:
    """As above for a broadcast (its bytes travel as int32 words): at 1,000 float32 both nodes
    take the express path, at EXPRESS_BYTES / 4 node 1 takes the engine; either way every rank
    is told both fingerprints."""
    _mismatch_on_every_rank("bcast_count_by_node", count, f"{count} el", f"{count + 1} el")


@pytest.mark.parametrize("count", [1001, 40001])  # the express path, the engine's broadcast
def test_worker_nodes_broadcasting_different_counts_of_the_same_words_raise_a_mismatch_everywhere(count: int) -> None:
    """Node 0 broadcasts ``count`` float16, node 1 one more: with ``count`` odd both are the same
    number of int32 words, as a small broadcast travels, so only the ranks' own count in the
    fingerprint tells them apart (before, at 1,001 every rank returned, node 1's last element a
    zero it never had)."""
    _mismatch_on_every_rank("bcast_f16_count_by_node", count, f"float16, {count} el", f"float16, {count + 1} el")


@pytest.mark.parametrize("count", [1000, 40000])
def test_worker_nodes_broadcasting_different_dtypes_of_the_same_bytes_raise_a_mismatch_everywhere(count: int) -> None:
    _mismatch_on_every_rank("bcast_dtype_by_node", count, "copy, float16", "copy, bfloat16")


@pytest.mark.parametrize("count", [1000, 40000])  # the express path, the engine's (streamed)
@pytest.mark.parametrize("kind", ["bcast", "reduce"])
@pytest.mark.parametrize("nnodes", [2, 3])  # three nodes: the tree express path, and the ring for 40,000
def test_worker_nodes_disagreeing_on_a_root_raise_a_mismatch_everywhere(kind: str, count: int, nnodes: int) -> None:
    """Each node's ranks name their own node's first rank as the root.  The nodes would run the
    same bytes: a broadcast would sum two nodes' data, a reduce would land on a rank of each node,
    and every rank would return as if all were well.  The root is in the fingerprint, so every
    rank is told both roots instead."""
    k = 2 if nnodes == 2 else 1
    res = _mismatch_on_every_rank(f"{kind}_root_by_node", count, nnodes=nnodes)
    for r in range(nnodes * k):
        msg = res[r]["message"]
        assert sum(f"{count} el, root {node * k}," in msg for node in range(nnodes)) == 2, msg


@pytest.mark.parametrize("mode", ["count_by_node", "bcast_count_by_node"])
def test_worker_nodes_running_one_op_express_and_on_the_engine_raise_a_mismatch_everywhere(mode: str) -> None:
    """Three nodes around a ring: node 0 reduces (or broadcasts) EXPRESS_BYTES / 4 float32, small
    enough for its express path, nodes 1 and 2 one and two more, which go around the ring (or are
    the engine's broadcast).  Their first frame reaches a reader of node 0 that waits for an engine
    op node 0 will never post, reading nothing behind it on that link; every rank must still be
    told of the mismatch well before the deadline."""
    count = EXPRESS_BYTES // 4
    c = Cluster(3, 1, chunk="1k", timeout_s=TIMEOUT_S, env={"FF_HFREDUCE_ALGORITHM": "ring"}).start()
    try:
        res = c.ranks(mode, count=count, timeout_s=30).results()
    finally:
        c.stop()
    _all_raised(res, [0, 1, 2])
    for r in range(3):
        assert res[r]["kind"] == "FingerprintMismatch", res[r]
        assert res[r]["op_elapsed"] < TIMEOUT_S, res[r]
    assert list_segments() == []


def test_worker_three_nodes_disagreeing_on_a_small_ops_size_raise_a_mismatch_everywhere() -> None:
    """Node ``i`` reduces 1,000 + ``i`` elements: on three nodes the small op goes up tree 0, and
    the first node to compare fingerprints fails every engine; every rank is told both."""
    res = _mismatch_on_every_rank("count_by_node", 1000, nnodes=3)
    for r in range(3):
        assert sum(f"{1000 + i} el" in res[r]["message"] for i in range(3)) == 2, res[r]["message"]


def _mismatch_on_every_rank(mode: str, count: int, *shown: str, nnodes: int = 2) -> dict[int, dict]:
    """Run ``mode`` with ``count``: every rank raises a FingerprintMismatch naming ``shown``, in
    time; the ranks' outcomes."""
    c = _start() if nnodes == 2 else Cluster(nnodes, 1, chunk="1k", timeout_s=TIMEOUT_S).start()
    world = 4 if nnodes == 2 else nnodes
    try:
        res = c.ranks(mode, count=count, timeout_s=30).results()
    finally:
        c.stop()
    _all_raised(res, list(range(world)))
    for r in range(world):
        assert res[r]["kind"] == "FingerprintMismatch", res[r]
        msg = res[r]["message"]
        assert all(s in msg for s in shown), msg
        assert res[r]["op_elapsed"] < TIMEOUT_S + SLACK_S, res[r]
    assert list_segments() == []
    return res


def test_worker_stopped_peer_worker_is_named_by_the_other_node_within_deadline() -> None:
    """Two nodes, one rank each, a small (express) allreduce while node 1's worker is stopped:
    node 0's rank raises a CollectiveTimeout naming node 1 after the deadline (plus the engine's
    slack), not later; node 1's rank finds its own worker silent."""
    from fireflyer.hfreduce.client import GRACE_S

    res = _op_while_a_worker_is_stopped(nnodes=2, stopped=1)
    _all_raised(res, [0, 1])
    assert res[0]["kind"] == "CollectiveTimeout", res[0]
    assert "node 1" in res[0]["message"] and "exchange" in res[0]["message"], res[0]["message"]
    assert 1.0 <= res[0]["op_elapsed"] < 1.0 + SLACK_S, res[0]
    assert res[1]["kind"] == "CollectiveTimeout" and "worker of node 1" in res[1]["message"], res[1]
    assert res[1]["op_elapsed"] < 1.0 + GRACE_S + 1.0, res[1]
    assert list_segments() == []


def test_worker_three_nodes_name_a_stopped_leaf_worker_in_the_up_phase_within_deadline() -> None:
    """Three nodes, one rank each: a small allreduce takes the express path up and down tree 0,
    rooted at its centre (node 2, with leaves 0 and 1).  Node 0's worker is stopped: the root
    names it (its partial never came up), node 1, whose partial went up, hears the root's reason
    through the abort, and node 0's rank finds its own worker silent."""
    from fireflyer.hfreduce.client import GRACE_S
    from fireflyer.hfreduce.trees import double_binary_tree

    assert double_binary_tree(3).trees[0].centred().root == 2
    res = _op_while_a_worker_is_stopped(nnodes=3, stopped=0, k=1)
    _all_raised(res, [0, 1, 2])
    assert res[2]["kind"] == "CollectiveTimeout", res[2]
    assert "node 0" in res[2]["message"] and "up phase" in res[2]["message"], res[2]["message"]
    assert "node 0" in res[1]["message"], res[1]["message"]
    for r in (1, 2):
        assert 1.0 <= res[r]["op_elapsed"] < 1.0 + SLACK_S, res[r]
    assert res[0]["kind"] == "CollectiveTimeout" and "worker of node 0" in res[0]["message"], res[0]
    assert res[0]["op_elapsed"] < 1.0 + GRACE_S + 1.0, res[0]
    assert list_segments() == []


def test_worker_node_running_an_op_the_other_closed_on_is_told_close_at_once() -> None:
    """Node 0's ranks close after one op; node 1's run a second (a small, express allreduce).
    Node 0's worker ends with a ``close`` collective: node 1's ranks get a fingerprint mismatch
    naming it, well before the deadline, and node 0's ranks close cleanly."""
    c = _start(timeout_s=10.0)
    try:
        res = c.ranks("one_more_on_node1", timeout_s=30).results()
    finally:
        c.stop()
    assert all(res[r]["ok"] for r in (0, 1)), res
    for r in (2, 3):
        assert res[r]["kind"] == "FingerprintMismatch", res[r]
        assert "close#1" in res[r]["message"] and "allreduce#1" in res[r]["message"], res[r]["message"]
        assert res[r]["op_elapsed"] < 5.0, res[r]
    assert list_segments() == []


def test_worker_sleeping_rank_named_within_deadline() -> None:
    c = _start()
    try:
        run = c.ranks("sleep", victim=3, sleep_s=TIMEOUT_S + 3, timeout_s=30)
        res = run.results()
    finally:
        c.stop()
    _all_raised(res, [0, 1, 2, 3])
    for r in (0, 1, 2):
        assert res[r]["op_elapsed"] < TIMEOUT_S + SLACK_S, res[r]
    # its node-mate is told exactly who did not arrive
    assert res[2]["kind"] == "CollectiveTimeout", res[2]
    assert "rank 3" in res[2]["message"] and "did not submit" in res[2]["message"], res[2]["message"]
    # the other node gets node 1's reason through the engine's abort (the engine waits a little
    # longer than the deadline so that the precise local reason wins the race)
    for r in (0, 1):
        assert "node 1" in res[r]["message"] and "rank 3" in res[r]["message"], res[r]["message"]
    # the sleeper itself fails at once when it finally calls
    assert res[3]["op_elapsed"] < 1.0, res[3]
    assert list_segments() == []


def test_worker_kill9_rank_then_new_communicator() -> None:
    c = _start(timeout_s=10.0)
    try:
        run = c.ranks("victim", victim=1, wait=False)
        run.wait_line("submitting", 4)
        run.wait_line("rank 1 pid", 1)
        os.kill(run.pids[1], signal.SIGKILL)
        run.wait(30)
        res = run.results()
        _all_raised(res, [0, 2, 3])  # rank 1 is dead and writes nothing
        for r in (0, 2, 3):  # well before the 10 s deadline: a death is noticed at once
            assert res[r]["op_elapsed"] < 5.0, res[r]
        assert res[0]["kind"] == "PeerLost" and "rank 1" in res[0]["message"], res[0]
        assert all(w.poll() is None for w in c.workers), "a worker died with the rank"
        again = c.ranks("ops", name="second", timeout_s=30)
        ok = again.results()
        assert all(ok[r]["ok"] for r in range(4)), ok
    finally:
        codes = c.stop()
    assert codes == [0, 0]
    assert list_segments() == []


def test_worker_kill9_worker_every_rank_raises() -> None:
    c = _start(timeout_s=10.0)
    try:
        run = c.ranks("victim", victim=3, wait=False)
        run.wait_line("submitting", 4)
        c.kill_worker(1)
        run.wait_line("rank 3 pid", 1)
        os.kill(run.pids[3], signal.SIGKILL)  # it sleeps in user code; only its worker's ranks matter
        run.wait(30)
        res = run.results()
    finally:
        c.stop()
    _all_raised(res, [0, 1, 2])
    assert res[2]["kind"] == "PeerLost" and "worker of node 1" in res[2]["message"], res[2]
    for r in (0, 1):
        assert "node 1" in res[r]["message"], res[r]["message"]
        assert res[r]["op_elapsed"] < 10.0 + SLACK_S, res[r]
    assert list_segments() == []


def test_worker_hung_worker_ranks_raise_after_deadline_and_grace() -> None:
    from fireflyer.hfreduce.client import GRACE_S

    res = _op_while_a_worker_is_stopped(nnodes=1, stopped=0)
    _all_raised(res, [0, 1])
    for r in (0, 1):
        assert res[r]["kind"] == "CollectiveTimeout" and "worker of node 0" in res[r]["message"], res[r]
        assert 1.0 <= res[r]["op_elapsed"] < 1.0 + GRACE_S + 1.0, res[r]
    assert list_segments() == []


#: (nodes, ranks per node, extra worker environment): two nodes on the trees' streamed block loops, three
#: around the ring (``FF_HFREDUCE_ALGORITHM=ring``)
LARGE_OP_SHAPES = [(2, 2, {}), (3, 2, {"FF_HFREDUCE_ALGORITHM": "ring"})]


@pytest.mark.parametrize(("nnodes", "k", "env"), LARGE_OP_SHAPES, ids=["trees", "ring"])
def test_worker_kill9_worker_in_the_middle_of_large_ops_every_rank_raises(nnodes: int, k: int,
                                                                          env: dict[str, str]) -> None:
    """Large ops stream (one frame per tree half, in blocks) or go around the ring: a worker
    killed mid-op breaks its peers' loops at once, and every rank raises naming the dead node."""
    world = nnodes * k
    c = Cluster(nnodes, k, chunk="1k", timeout_s=10.0, env=env).start()
    try:
        run = c.ranks("bigloop", wait=False)
        run.wait_line("streaming", world)
        c.kill_worker(1)
        run.wait(30)
        res = run.results()
    finally:
        c.stop()
    assert sorted(res) == list(range(world)), res
    for r in range(world):
        assert not res[r]["ok"] and res[r]["hfreduce_error"], res[r]
        assert "node 1" in res[r]["message"], res[r]["message"]
        assert res[r]["op_elapsed"] < 5.0, res[r]  # well before the deadline: a death is noticed at once
    assert res[0]["kind"] in ("PeerLost", "CollectiveAborted"), res[0]
    assert list_segments() == []


@pytest.mark.parametrize(("nnodes", "k", "env"), LARGE_OP_SHAPES, ids=["trees", "ring"])
def test_worker_kill9_rank_in_the_middle_of_large_ops_aborts_every_node(nnodes: int, k: int,
                                                                        env: dict[str, str]) -> None:
    """A rank killed mid-op fails its node's communicator; the node's loops end their frames
    (a streamed half with an aborted block), and the other nodes' ranks get the abort with its
    reason (the rank), not a lost connection."""
    world, last = nnodes * k, nnodes - 1
    c = Cluster(nnodes, k, chunk="1k", timeout_s=10.0, env=env).start()
    try:
        run = c.ranks("bigloop", wait=False)
        run.wait_line("streaming", world)
        os.kill(run.pids[world - 1], signal.SIGKILL)
        run.wait(30)
        res = run.results()
        assert all(w.poll() is None for w in c.workers), "a worker died with the rank"
    finally:
        c.stop()
    _all_raised(res, list(range(world - 1)))
    for r in range(world - 1):
        assert res[r]["op_elapsed"] < 5.0, res[r]
        assert f"rank {world - 1}" in res[r]["message"], res[r]["message"]
    for r in range(last * k):  # the other nodes' ranks: the abort from the last node, with its reason
        assert res[r]["kind"] == "CollectiveAborted" and f"node {last}" in res[r]["message"], res[r]
    assert list_segments() == []


def test_worker_sleeping_rank_in_an_allgather_is_named_within_deadline() -> None:
    """An allgather (beyond the express size: the engine's broadcasts, one per node) that rank 3
    is late for: every other rank raises within the deadline naming it, as for an allreduce."""
    c = _start()
    try:
        run = c.ranks("sleep_allgather", victim=3, sleep_s=TIMEOUT_S + 3, timeout_s=30)
        res = run.results()
    finally:
        c.stop()
    _all_raised(res, [0, 1, 2, 3])
    for r in (0, 1, 2):
        assert res[r]["op_elapsed"] < TIMEOUT_S + SLACK_S, res[r]
        assert "rank 3" in res[r]["message"], res[r]["message"]
    assert res[2]["kind"] == "CollectiveTimeout" and "did not submit" in res[2]["message"], res[2]
    for r in (0, 1):  # the other node: node 1's reason through the engine's abort
        assert "node 1" in res[r]["message"], res[r]["message"]
    assert res[3]["op_elapsed"] < 1.0, res[3]
    assert list_segments() == []


def test_worker_kill9_rank_in_the_middle_of_allgathers_aborts_every_node() -> None:
    """Three nodes x two ranks running large allgathers and reduce_scatters back to back: the last
    rank killed mid-op fails its node's communicator, and every other rank raises at once naming
    it (the other nodes through the engine's abort); the workers survive."""
    nnodes, k = 3, 2
    world, last = nnodes * k, nnodes - 1
    c = Cluster(nnodes, k, chunk="64k", timeout_s=10.0).start()
    try:
        run = c.ranks("gatherloop", wait=False)
        run.wait_line("gathering", world)
        os.kill(run.pids[world - 1], signal.SIGKILL)
        run.wait(30)
        res = run.results()
        assert all(w.poll() is None for w in c.workers), "a worker died with the rank"
    finally:
        c.stop()
    _all_raised(res, list(range(world - 1)))
    for r in range(world - 1):
        assert res[r]["op_elapsed"] < 5.0, res[r]  # well before the 10 s deadline
        assert f"rank {world - 1}" in res[r]["message"], res[r]["message"]
    for r in range(last * k):
        assert res[r]["kind"] == "CollectiveAborted" and f"node {last}" in res[r]["message"], res[r]
    assert list_segments() == []
