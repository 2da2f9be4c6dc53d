"""Many cycles in a row: the decision applied to its own results keeps the cluster consistent."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_util import cluster, waiting

from fireflyer.sched.model import (
    DRAINED,
    LEVELS,
    RUNNING,
    SUSPENDED,
    Quota,
    SchedConfig,
    StopCode,
    SuspendCode,
    Task,
)
from fireflyer.sched.policy import WAITING_RELEASE, decide


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_cycles_keep_the_cluster_consistent(seed: int) -> None:
    rng = random.Random(seed)
    nodes = {n.name: n for n in cluster({"A": 6, "B": 5, "C": 3})}
    zone = {n.name: n.zone for n in nodes.values()}
    quotas = [Quota(owner="u0", group="default", priority=LEVELS[2], max_nodes=5)]
    config = SchedConfig(min_runtime_s=120.0, preempt_equal_priority=rng.random() < 0.5)
    tasks: dict[int, Task] = {}
    next_id = 1
    for cycle in range(25):
        now = cycle * 60.0
        # agents release what was preempted; some runs end; an admin drains a node now and then
        for t in list(tasks.values()):
            if t.running and (t.releasing or rng.random() < 0.1):
                for x in t.nodes:
                    nodes[x] = msgspec.structs.replace(nodes[x], task=None)
                del tasks[t.id]
                if t.releasing:
                    tasks[next_id] = Task(id=next_id, chain_id=t.chain_id, spec=t.spec, submitted_at=t.submitted_at,
                                          restart_count=t.restart_count + 1, chain_status=SUSPENDED)
                    next_id += 1
        if rng.random() < 0.1:
            x = rng.choice(sorted(nodes))
            nodes[x] = msgspec.structs.replace(nodes[x], state=DRAINED, reason="test")
        for _ in range(rng.randint(0, 4)):
            tasks[next_id] = waiting(next_id, rng.choice([1, 1, 2, 3, 4, 7]), rng.choice(LEVELS),
                                     user=f"u{rng.randint(0, 2)}", at=now)
            next_id += 1

        d = decide(list(tasks.values()), list(nodes.values()), quotas, now, config)

        for s in d.starts:
            for x in s.nodes:
                assert nodes[x].task is None and nodes[x].state != DRAINED
                nodes[x] = msgspec.structs.replace(nodes[x], task=s.task)
            tasks[s.task] = msgspec.structs.replace(tasks[s.task], chain_status=RUNNING, priority=s.priority,
                                                    started_at=now, nodes=s.nodes)
        for p in d.preempts:
            assert d.waiting[p.for_task].code == WAITING_RELEASE
            tasks[p.task] = msgspec.structs.replace(tasks[p.task], suspend_code=SuspendCode.SENT,
                                                    stop_code=StopCode.INTERRUPT)
        held = [x for t in tasks.values() if t.running for x in t.nodes]
        assert len(held) == len(set(held))
        assert sum(1 for t in tasks.values() if t.running and len({zone[x] for x in t.nodes}) > 1) <= 1
        used = sum(len(t.nodes) for t in tasks.values()
                   if t.running and t.spec.user == "u0" and t.priority == LEVELS[2])
        assert used <= 5
