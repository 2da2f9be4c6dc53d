"""The decision, rule by rule: a small scenario each, and the reason a waiting run is given."""

from __future__ import annotations

import random

import msgspec
from sched_util import HOUR, cluster, hold, running, waiting

from fireflyer.sched.model import DRAINED, NodeView, Priority, Quota, SchedConfig, StopCode, SuspendCode
from fireflyer.sched.policy import (
    DRAINED_NODES,
    INVALID,
    NOT_ENOUGH_NODES,
    OVER_QUOTA,
    TOO_LARGE,
    UNKNOWN_GROUP,
    WAITING_RELEASE,
    ZONE_RULE,
    Decision,
    decide,
)

P = Priority


def started(d: Decision) -> dict[int, tuple[str, ...]]:
    return {s.task: s.nodes for s in d.starts}


def preempted(d: Decision) -> dict[int, int]:
    return {p.task: p.for_task for p in d.preempts}


# --- order --------------------------------------------------------------------------------------

def test_higher_priority_first() -> None:
    d = decide([waiting(1, 4, P.LOW, at=0), waiting(2, 4, P.HIGH, at=5)], cluster({"A": 4}), [], 0)
    assert started(d) == {2: ("n0", "n1", "n2", "n3")}
    assert d.waiting[1].code == NOT_ENOUGH_NODES and "needs 4 nodes" in d.waiting[1].message


def test_fifo_within_a_priority_by_chain_submission() -> None:
    # run 2 is a resumed run of a chain submitted first: it keeps its place
    tasks = [waiting(1, 4, at=10), waiting(2, 4, at=1, suspended=True), waiting(3, 4, at=5)]
    d = decide(tasks, cluster({"A": 4}), [], 20)
    assert list(started(d)) == [2] and set(d.waiting) == {1, 3}


def test_backfill_uses_nodes_a_blocked_run_cannot() -> None:
    nodes = cluster({"A": 4}, held={"n0": 9, "n1": 9})
    tasks = [running(9, ["n0", "n1"], P.HIGH, user="bob", started=-HOUR), waiting(1, 4, P.HIGH),
             waiting(2, 2, P.LOW, at=1)]
    d = decide(tasks, nodes, [], 0)
    assert started(d) == {2: ("n2", "n3")} and d.waiting[1].code == NOT_ENOUGH_NODES


# --- gang ---------------------------------------------------------------------------------------

def test_gang_all_or_nothing() -> None:
    nodes = cluster({"A": 4}, held={"n0": 9})
    tasks = [running(9, ["n0"], started=-HOUR, user="bob", priority=P.HIGH), waiting(1, 4)]
    d = decide(tasks, nodes, [], 0)
    assert d.starts == [] and d.waiting[1].code == NOT_ENOUGH_NODES
    assert "A: 3" in d.waiting[1].message


# --- zones --------------------------------------------------------------------------------------

def test_best_fit_zone_keeps_the_large_hole_whole() -> None:
    nodes = cluster({"A": 4, "B": 4}, held={"n0": 9})
    tasks = [running(9, ["n0"], user="bob", priority=P.HIGH), waiting(1, 3), waiting(2, 4)]
    d = decide(tasks, nodes, [], 0)
    assert started(d) == {1: ("n1", "n2", "n3"), 2: ("n4", "n5", "n6", "n7")}
    assert all(len(s.zones) == 1 for s in d.starts)


def test_span_zones_when_no_zone_holds_it() -> None:
    d = decide([waiting(1, 6)], cluster({"A": 4, "B": 4}), [], 0)
    [s] = d.starts
    assert s.zones == ("A", "B") and len(s.nodes) == 6


def test_at_most_one_run_spans_zones_in_a_cycle() -> None:
    d = decide([waiting(1, 4), waiting(2, 4)], cluster({"A": 3, "B": 3, "C": 3}), [], 0)
    assert [s.task for s in d.starts] == [1] and d.starts[0].zones == ("A", "B")
    assert d.waiting[2].code == ZONE_RULE and "run 1 already spans zones" in d.waiting[2].message


def test_no_second_cross_zone_run_while_one_runs() -> None:
    nodes = cluster({"A": 4, "B": 4}, held={"n0": 9, "n4": 9})
    d = decide([running(9, ["n0", "n4"], user="bob"), waiting(1, 5)], nodes, [], 0)
    assert d.starts == [] and d.waiting[1].code == ZONE_RULE and "run 9 already spans zones" in d.waiting[1].message
    # the same run without the cross-zone one: it spans
    d = decide([waiting(1, 5)], cluster({"A": 4, "B": 4}), [], 0)
    assert d.starts[0].zones == ("A", "B")


def test_pinned_zone() -> None:
    d = decide([waiting(1, 2, zone="B")], cluster({"A": 4, "B": 4}), [], 0)
    assert d.starts[0].zones == ("B",)
    d = decide([waiting(1, 5, zone="B")], cluster({"A": 4, "B": 4}), [], 0)
    assert d.waiting[1].code == ZONE_RULE and "pinned to zone 'B'" in d.waiting[1].message


def test_cross_zone_off() -> None:
    d = decide([waiting(1, 5)], cluster({"A": 4, "B": 4}), [], 0, SchedConfig(allow_cross_zone=False))
    assert d.waiting[1].code == ZONE_RULE and "may not span zones" in d.waiting[1].message


# --- preemption ---------------------------------------------------------------------------------

def test_preempt_then_wait_for_release_then_start() -> None:
    nodes = cluster({"A": 4}, held={f"n{i}": 9 for i in range(4)})
    low = running(9, ["n0", "n1", "n2", "n3"], P.LOW, user="bob", started=-HOUR)
    high = waiting(1, 4, P.HIGH)
    other = waiting(2, 2, P.NORMAL, user="carol")
    d = decide([low, high, other], nodes, [], 0)
    assert preempted(d) == {9: 1} and d.starts == []
    assert d.waiting[1].code == WAITING_RELEASE and "run(s) 9" in d.waiting[1].message
    assert "preempted for run 1 (HIGH" in d.preempts[0].reason
    # next cycle: run 9 is releasing (the interrupt was sent), its nodes are still held
    low = msgspec.structs.replace(low, suspend_code=SuspendCode.SENT, stop_code=StopCode.INTERRUPT)
    d = decide([low, high, other], nodes, [], 1)
    assert d.preempts == [] and d.starts == [] and d.waiting[1].code == WAITING_RELEASE
    # two of its nodes come free first: nobody else takes them
    part = [msgspec.structs.replace(n, task=None) if n.name in ("n0", "n1") else n for n in nodes]
    d = decide([low, high, other], part, [], 2)
    assert d.starts == [] and d.waiting[1].code == WAITING_RELEASE and d.waiting[2].code == NOT_ENOUGH_NODES
    # released: the run that preempted gets exactly those nodes
    low = msgspec.structs.replace(low, chain_status="finished", nodes=())
    d = decide([low, high, other], cluster({"A": 4}), [], 3)
    assert started(d) == {1: ("n0", "n1", "n2", "n3")}


def test_free_nodes_reserved_by_a_preemptor_are_not_given_away() -> None:
    nodes = cluster({"A": 4}, held={"n0": 9, "n1": 9})
    tasks = [running(9, ["n0", "n1"], P.LOW, user="bob", started=-HOUR), waiting(1, 4, P.HIGH),
             waiting(2, 2, P.NORMAL, user="carol")]
    d = decide(tasks, nodes, [], 0)
    assert preempted(d) == {9: 1} and d.starts == []
    assert d.waiting[2].code == NOT_ENOUGH_NODES


def test_never_preempt_same_user_and_priority() -> None:
    nodes = cluster({"A": 2}, held={"n0": 9, "n1": 9})
    tasks = [running(9, ["n0", "n1"], P.NORMAL, user="alice", at=5, started=-HOUR), waiting(1, 2, P.NORMAL, at=0)]
    for cfg in (SchedConfig(), SchedConfig(preempt_equal_priority=True)):
        d = decide(tasks, nodes, [], 0, cfg)
        assert d.preempts == [] and d.waiting[1].code == NOT_ENOUGH_NODES
        assert "no running run of lower priority" in d.waiting[1].message
    # another user's later run of the same level: only with time sharing on
    other = [running(9, ["n0", "n1"], P.NORMAL, user="bob", at=5, started=-HOUR), waiting(1, 2, P.NORMAL, at=0)]
    assert decide(other, nodes, [], 0).preempts == []
    assert preempted(decide(other, nodes, [], 0, SchedConfig(preempt_equal_priority=True))) == {9: 1}


def test_minimum_runtime_protects() -> None:
    nodes = cluster({"A": 2}, held={"n0": 9, "n1": 9})
    young = [running(9, ["n0", "n1"], P.LOW, user="bob", started=-60), waiting(1, 2, P.HIGH)]
    d = decide(young, nodes, [], 0)
    assert d.preempts == [] and "inside their minimum runtime" in d.waiting[1].message
    assert preempted(decide(young, nodes, [], 0, SchedConfig(min_runtime_s=30))) == {9: 1}
    # the run's own minimum runtime overrides the cluster's
    own = [running(9, ["n0", "n1"], P.LOW, user="bob", started=-600, min_runtime_s=1200.0), waiting(1, 2, P.HIGH)]
    assert decide(own, nodes, [], 0, SchedConfig(min_runtime_s=30)).preempts == []


def test_victims_lowest_priority_then_newest() -> None:
    nodes = cluster({"A": 3}, held={"n0": 7, "n1": 8, "n2": 9})
    runs = [running(7, ["n0"], P.LOW, user="bob", started=-3 * HOUR),
            running(8, ["n1"], P.LOW, user="bob", started=-2 * HOUR),
            running(9, ["n2"], P.NORMAL, user="bob", started=-2.5 * HOUR)]
    for need, victims in ((1, [8]), (2, [8, 7]), (3, [8, 7, 9])):
        d = decide([*runs, waiting(1, need, P.HIGH)], nodes, [], 0)
        assert [p.task for p in d.preempts] == victims


def test_zone_with_the_lowest_victims_is_chosen() -> None:
    # zone B needs fewer interrupted nodes, but a NORMAL run; zone A's victim is LOW
    nodes = cluster({"A": 4, "B": 4}, held={**{f"n{i}": 7 for i in range(4)}, "n4": 8, "n5": 8})
    runs = [running(7, ["n0", "n1", "n2", "n3"], P.LOW, user="bob", started=-HOUR),
            running(8, ["n4", "n5"], P.NORMAL, user="bob", started=-2 * HOUR)]
    d = decide([*runs, waiting(1, 4, P.HIGH, zone="")], nodes, [], 0, SchedConfig(allow_cross_zone=False))
    assert [p.task for p in d.preempts] == [7]


def test_victims_made_unnecessary_are_spared() -> None:
    nodes = cluster({"A": 9}, held={**{"n0": 7}, **{f"n{i}": 8 for i in range(1, 9)}})
    runs = [running(7, ["n0"], P.LOW, user="bob", started=-HOUR),
            running(8, [f"n{i}" for i in range(1, 9)], P.NORMAL, user="bob", started=-HOUR)]
    d = decide([*runs, waiting(1, 4, P.HIGH)], nodes, [], 0)
    assert [p.task for p in d.preempts] == [8]
    assert d.waiting[1].message.startswith("waiting for 8 nodes")


def test_above_normal_is_demoted_after_30_minutes() -> None:
    nodes = cluster({"A": 2}, held={"n0": 9, "n1": 9})
    for ran, victims in ((1000.0, []), (2000.0, [9])):
        tasks = [running(9, ["n0", "n1"], P.ABOVE_NORMAL, user="bob", started=-ran),
                 waiting(1, 2, P.ABOVE_NORMAL)]
        assert [p.task for p in decide(tasks, nodes, [], 0).preempts] == victims


def test_existing_release_is_waited_for_not_preempted_again() -> None:
    nodes = cluster({"A": 4}, held={f"n{i}": (8 if i < 2 else 9) for i in range(4)})
    tasks = [running(8, ["n0", "n1"], P.LOW, user="bob", started=-HOUR, releasing=True),
             running(9, ["n2", "n3"], P.LOW, user="bob", started=-HOUR), waiting(1, 2, P.HIGH)]
    d = decide(tasks, nodes, [], 0)
    assert d.preempts == [] and d.waiting[1].code == WAITING_RELEASE and "run(s) 8" in d.waiting[1].message


# --- quotas -------------------------------------------------------------------------------------

def test_user_quota_per_group_and_priority() -> None:
    nodes = cluster({"A": 8}, held={"n0": 9, "n1": 9, "n2": 9})
    quotas = [Quota(owner="alice", group="default", priority=P.NORMAL, max_nodes=4)]
    run = running(9, ["n0", "n1", "n2"], P.NORMAL)
    d = decide([run, waiting(1, 2), waiting(2, 1, at=1)], nodes, quotas, 0)
    assert list(started(d)) == [2]
    assert d.waiting[1].code == OVER_QUOTA and "alice holds 3 of its 4-node quota at NORMAL" in d.waiting[1].message
    # the quota at another level is another budget
    d = decide([run, waiting(1, 2, P.HIGH)], nodes, quotas, 0)
    assert list(started(d)) == [1]


def test_expired_quota_counts_as_absent() -> None:
    quotas = [Quota(owner="alice", group="default", priority=P.NORMAL, max_nodes=1, expires_at=100.0)]
    assert decide([waiting(1, 2)], cluster({"A": 4}), quotas, 50).waiting[1].code == OVER_QUOTA
    assert list(started(decide([waiting(1, 2)], cluster({"A": 4}), quotas, 100))) == [1]
    assert decide([waiting(1, 2)], cluster({"A": 4}), quotas, 100, SchedConfig(default_quota=1)).starts == []


def test_shared_group_quota_caps_its_members_together() -> None:
    quotas = [Quota(owner="public", group="default", priority=P.NORMAL, max_nodes=3)]
    tasks = [waiting(1, 2, user="alice", shared_group="public"), waiting(2, 2, user="bob", shared_group="public", at=1),
             waiting(3, 1, user="carol", shared_group="public", at=2)]
    d = decide(tasks, cluster({"A": 8}), quotas, 0)
    assert list(started(d)) == [1, 3] and d.waiting[2].code == OVER_QUOTA and "public" in d.waiting[2].message


def test_default_quota() -> None:
    d = decide([waiting(1, 3), waiting(2, 2, at=1)], cluster({"A": 8}), [], 0, SchedConfig(default_quota=4))
    assert list(started(d)) == [1] and "default 4-node quota" in d.waiting[2].message


def test_auto_takes_the_highest_level_with_quota() -> None:
    quotas = [Quota(owner="alice", group="default", priority=P.HIGH, max_nodes=2),
              Quota(owner="alice", group="default", priority=P.NORMAL, max_nodes=2)]
    tasks = [waiting(1, 2, P.AUTO), waiting(2, 2, P.AUTO, at=1), waiting(3, 2, P.AUTO, at=2)]
    d = decide(tasks, cluster({"A": 8}), quotas, 0)
    # the third finds no room at its explicit levels: the fallback level, LOW, under the default quota
    assert {s.task: s.priority for s in d.starts} == {1: P.HIGH, 2: P.NORMAL, 3: P.LOW}
    d = decide(tasks, cluster({"A": 8}), quotas, 0, SchedConfig(default_quota=0))
    assert {s.task: s.priority for s in d.starts} == {1: P.HIGH, 2: P.NORMAL}
    assert d.waiting[3].code == OVER_QUOTA and d.waiting[3].message.startswith("AUTO")
    # an AUTO run queues at the level it resolves to: below an earlier NORMAL run once HIGH is used up
    nodes = cluster({"A": 4}, held={"n0": 9, "n1": 9})
    tasks = [running(9, ["n0", "n1"], P.HIGH), waiting(1, 2, P.AUTO, at=0), waiting(2, 2, P.NORMAL, user="bob", at=5)]
    d = decide(tasks, nodes, quotas[:1], 0)
    assert list(started(d)) == [2] and d.waiting[1].code == NOT_ENOUGH_NODES
    # no quota entry at all: the fallback level (LOW)
    assert decide([waiting(1, 2, P.AUTO)], cluster({"A": 2}), [], 0).starts[0].priority is P.LOW


# --- nodes --------------------------------------------------------------------------------------

def test_drained_nodes_get_no_work() -> None:
    nodes = cluster({"A": 4}, drained={"n0": "bad GPU 3", "n2": "validator failed"})
    d = decide([waiting(1, 2), waiting(2, 1, at=1)], nodes, [], 0)
    assert started(d) == {1: ("n1", "n3")} and d.waiting[2].code == NOT_ENOUGH_NODES
    d = decide([waiting(1, 3)], nodes, [], 0)
    assert d.waiting[1].code == DRAINED_NODES and "n0: bad GPU 3" in d.waiting[1].message


def test_drained_node_of_a_victim_is_not_counted_as_coming_free() -> None:
    nodes = cluster({"A": 2}, held={"n0": 9, "n1": 9})
    nodes[0] = msgspec.structs.replace(nodes[0], state=DRAINED, reason="ECC")
    nodes.append(NodeView(name="n2", zone="A"))
    tasks = [running(9, ["n0", "n1"], P.LOW, user="bob", started=-HOUR), waiting(1, 3, P.HIGH)]
    d = decide(tasks, nodes, [], 0)
    assert d.preempts == [] and d.waiting[1].code == DRAINED_NODES


def test_unknown_group_too_large_invalid() -> None:
    d = decide([waiting(1, 2, group="gpu-x"), waiting(2, 9), waiting(3, 0)], cluster({"A": 4}), [], 0)
    assert d.starts == []
    assert (d.waiting[1].code, d.waiting[2].code, d.waiting[3].code) == (UNKNOWN_GROUP, TOO_LARGE, INVALID)


def test_groups_are_separate_pools() -> None:
    nodes = cluster({"A": 2}) + cluster({"A": 2}, group="big", prefix="b")
    d = decide([waiting(1, 2, group="big"), waiting(2, 2)], nodes, [], 0)
    assert started(d) == {1: ("b0", "b1"), 2: ("n0", "n1")}


def test_decision_does_not_depend_on_input_order() -> None:
    nodes = cluster({"A": 5, "B": 5})
    tasks = [running(9, ["n0", "n5"], P.LOW, user="bob", started=-HOUR)]
    tasks += [waiting(i, 1 + i % 4, P(random.Random(i).choice([0, 10, 30])), user=f"u{i % 3}", at=i % 5)
              for i in range(1, 12)]
    nodes = hold(nodes, tasks)
    want = decide(tasks, nodes, [], 0)
    rng = random.Random(1)
    for _ in range(5):
        t2, n2 = tasks[:], nodes[:]
        rng.shuffle(t2)
        rng.shuffle(n2)
        assert decide(t2, n2, [], 0) == want
