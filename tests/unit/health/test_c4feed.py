"""fireflyer.health.c4feed: per-node telemetry records assembled into ops and judged in order."""

from __future__ import annotations

from fireflyer.health.c4 import NONCOMM_HANG, NONCOMM_SLOW, C4Config
from fireflyer.health.c4feed import CommFeed
from fireflyer.hfreduce.telemetry import OpRecord

CFG = C4Config(deadline_s=10.0, persist_k=3, persist_n=5)


def rec(seq: int, node: int, lag: float = 0.0, *, phase: str = "done", missing: list[int] | None = None,
        generation: int = 0) -> OpRecord:
    t = 1000.0 + seq + lag
    return OpRecord(comm="7/ddp", generation=generation, seq=seq, kind="allreduce", op="sum", dtype="float32",
                    count=1024, nbytes=4096, node_rank=node, phase=phase, started_at=t,
                    arrivals={} if missing else {0: t}, missing=missing or [], finished_at=1000.0 + seq + 2.0)


def feed_ops(feed: CommFeed, seqs: range, slow: dict[int, float], nodes: int) -> list:
    out = []
    for s in seqs:
        for n in range(nodes):
            out += feed.add(n, [rec(s, n, slow.get(n, 0.0))], now=float(s))
    return out


def test_a_slow_node_of_four_is_named_once_it_persists() -> None:
    feed = CommFeed("7/ddp", 4, CFG)
    assert feed_ops(feed, range(0, 2), {2: 0.5}, 4) == [], "two ops are not yet persistent"
    found = feed_ops(feed, range(2, 6), {2: 0.5}, 4)
    assert [(i.syndrome, i.nodes) for i in found] == [(NONCOMM_SLOW, [2])], "named once, at the third op"
    assert found[0].ops == [0, 1, 2]


def test_no_incident_on_a_clean_run_and_nothing_is_kept() -> None:
    feed = CommFeed("7/ddp", 3, CFG)
    assert feed_ops(feed, range(0, 200), {}, 3) == []
    assert feed.ops_observed == 200 and feed.pending == 0


def test_two_nodes_the_one_far_behind_is_named() -> None:
    feed = CommFeed("7/ddp", 2, CFG)
    assert feed_ops(feed, range(0, 10), {1: 0.05}, 2) == [], "a wobble under two_node_min_lag_s is no fault"
    found = feed_ops(feed, range(10, 14), {1: 1.0}, 2)
    assert [(i.syndrome, i.nodes) for i in found] == [(NONCOMM_SLOW, [1])]


def test_ops_are_judged_in_order_whatever_order_nodes_report_in() -> None:
    feed = CommFeed("7/ddp", 3, CFG)
    # node 2 reports ops 0..4 late, in one batch: nothing is judged before it
    for n in (0, 1):
        assert feed.add(n, [rec(s, n) for s in range(5)], now=1.0) == []
    assert feed.pending == 5 and feed.ops_observed == 0
    feed.add(2, [rec(s, 2) for s in range(5)], now=2.0)
    assert feed.pending == 0 and feed.ops_observed == 5
    assert feed.add(0, [rec(3, 0)], now=3.0) == [] and feed.pending == 0, "a late duplicate is ignored"


def test_a_failed_op_names_the_node_that_never_entered_after_the_grace() -> None:
    feed = CommFeed("7/ddp", 3, CFG, failed_grace_s=2.0)
    feed_ops(feed, range(0, 3), {}, 3)
    # op 3: node 1's worker gave up (its peer never came); node 0 reports later; node 2 never sent the op
    assert feed.add(1, [rec(3, 1, phase="failed")], now=10.0) == [], "the others get a grace to report"
    assert feed.add(0, [rec(3, 0, phase="failed")], now=10.5) == []
    assert feed.tick(11.0) == []
    found = feed.tick(12.1)
    assert [(i.syndrome, i.nodes) for i in found] == [(NONCOMM_HANG, [2])]


def test_a_node_with_missing_local_ranks_never_entered() -> None:
    feed = CommFeed("7/ddp", 3, CFG)
    found = []
    for n in range(3):
        found += feed.add(n, [rec(0, n, phase="failed", missing=[1] if n == 0 else None)], now=5.0)
    assert [(i.syndrome, i.nodes) for i in found] == [(NONCOMM_HANG, [0])], "judged at once: every node reported"


def test_other_generations_are_ignored_and_stale_ops_dropped() -> None:
    feed = CommFeed("7/ddp", 2, CFG, generation=1, stale_s=30.0)
    assert feed.add(0, [rec(0, 0, generation=0)], now=0.0) == [] and feed.pending == 0
    feed.add(0, [rec(0, 0, generation=1)], now=0.0)
    assert feed.pending == 1
    feed.tick(10.0)
    assert feed.pending == 1
    feed.tick(31.0)
    assert feed.pending == 0, "node 1 never reported: dropped unjudged"


def test_a_stopped_node_whose_last_ops_were_never_published_is_named_at_the_failed_op() -> None:
    # node 1's worker is stopped (SIGSTOP, a stuck host) between telemetry batches: it published ops
    # 0..2, finished 3..5 without publishing them, and never entered op 6; node 0's worker fails op 6.
    feed = CommFeed("7/ddp", 2, CFG, failed_grace_s=2.0)
    assert feed.add(1, [rec(s, 1) for s in range(3)], now=1.0) == []
    assert feed.add(0, [rec(s, 0) for s in range(6)] + [rec(6, 0, phase="failed")], now=5.0) == []
    assert feed.tick(6.0) == [], "the other node gets the grace to report"
    found = feed.tick(7.1)
    assert [(i.syndrome, i.nodes, i.seq) for i in found] == [(NONCOMM_HANG, [1], 6)]
    assert feed.pending == 0, "the ops before it are settled: the comm failed after them"
    assert feed.add(1, [rec(s, 1) for s in range(3, 6)], now=8.0) == [], "their late records change nothing"


def test_a_failed_op_does_not_skip_earlier_ops_that_can_still_complete() -> None:
    feed = CommFeed("7/ddp", 3, CFG, failed_grace_s=2.0)
    for n in (0, 1):
        feed.add(n, [rec(0, n), rec(1, n, phase="failed")], now=1.0)
    assert feed.tick(2.0) == [] and feed.pending == 2, "within the grace node 2 may still report op 0"
    found = feed.add(2, [rec(0, 2)], now=2.5)
    assert found == [] and feed.ops_observed == 1 and feed.pending == 1, "op 0 completed: observed in order"
    assert [(i.syndrome, i.nodes) for i in feed.tick(3.1)] == [(NONCOMM_HANG, [2])]
