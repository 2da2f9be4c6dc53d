"""Invariants of the decision over random clusters, queues and quotas (hypothesis)."""

from __future__ import annotations

from collections import defaultdict

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fireflyer.sched.model import (
    DRAINED,
    ENABLED,
    LEVELS,
    RUNNING,
    SUSPENDED,
    WAITING_INIT,
    NodeView,
    Priority,
    Quota,
    SchedConfig,
    StopCode,
    SuspendCode,
    Task,
    TaskSpec,
)
from fireflyer.sched.policy import REASON_CODES, decide, effective_priority

USERS = ("alice", "bob", "carol")
PRIOS = (*LEVELS, Priority.AUTO)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Task], list[NodeView], list[Quota], float, SchedConfig]:
    zones = draw(st.sampled_from([("A",), ("A", "B"), ("A", "B", "C")]))
    groups = draw(st.sampled_from([("g",), ("g", "h")]))
    nodes: list[NodeView] = []
    for i in range(draw(st.integers(1, 18))):
        drained = draw(st.integers(0, 5)) == 0
        nodes.append(NodeView(name=f"n{i}", group=draw(st.sampled_from(groups)), zone=draw(st.sampled_from(zones)),
                              state=DRAINED if drained else ENABLED, reason="bad" if drained else ""))
    now = 10_000.0
    tasks: list[Task] = []
    next_id = 1
    # running runs on disjoint nodes of one group each (drained nodes may still carry one);
    # at most one of them spans zones, as the decision keeps it
    by_group: dict[str, list[str]] = defaultdict(list)
    for n in nodes:
        by_group[n.group].append(n.name)
    zone_of = {n.name: n.zone for n in nodes}
    holder: dict[str, int] = {}
    spans = 0
    for g, names in sorted(by_group.items()):
        pool = list(names)
        while pool and draw(st.integers(0, 2)) == 0:
            k = draw(st.integers(1, len(pool)))
            take, pool = pool[:k], pool[k:]
            if len({zone_of[x] for x in take}) > 1:
                if spans:
                    continue
                spans += 1
            prio = draw(st.sampled_from(LEVELS))
            releasing = draw(st.integers(0, 3)) == 0
            spec = TaskSpec(user=draw(st.sampled_from(USERS)), group=g, nodes=k, priority=prio, command=("x",))
            tasks.append(Task(id=next_id, chain_id=next_id, spec=spec, submitted_at=draw(st.floats(0, 100)),
                              chain_status=RUNNING, queue_status="scheduled", priority=prio,
                              started_at=now - draw(st.sampled_from([10.0, 1000.0, 5000.0])), nodes=tuple(take),
                              suspend_code=SuspendCode.SENT if releasing else SuspendCode.NONE,
                              stop_code=StopCode.INTERRUPT if releasing else StopCode.NONE))
            for x in take:
                holder[x] = next_id
            next_id += 1
    nodes = [msgspec.structs.replace(n, task=holder.get(n.name)) for n in nodes]
    for _ in range(draw(st.integers(0, 20))):
        spec = TaskSpec(user=draw(st.sampled_from(USERS)), shared_group=draw(st.sampled_from(["", "team"])),
                        group=draw(st.sampled_from((*groups, "nope"))), nodes=draw(st.integers(1, 6)),
                        priority=draw(st.sampled_from(PRIOS)), command=("x",),
                        zone=draw(st.sampled_from(("", "", *zones))))
        tasks.append(Task(id=next_id, chain_id=next_id, spec=spec, submitted_at=draw(st.floats(0, 100)),
                          chain_status=draw(st.sampled_from([WAITING_INIT, SUSPENDED]))))
        next_id += 1
    quotas = [Quota(owner=draw(st.sampled_from((*USERS, "team"))), group=draw(st.sampled_from(groups)),
                    priority=draw(st.sampled_from(LEVELS)), max_nodes=draw(st.integers(0, 6)))
              for _ in range(draw(st.integers(0, 5)))]
    quotas = list({(q.owner, q.group, q.priority): q for q in quotas}.values())
    config = SchedConfig(preempt_equal_priority=draw(st.booleans()), default_quota=draw(st.sampled_from([None, 4])),
                         allow_cross_zone=draw(st.booleans()))
    return tasks, nodes, quotas, now, config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_decision_invariants(sc: tuple[list[Task], list[NodeView], list[Quota], float, SchedConfig]) -> None:
    tasks, nodes, quotas, now, config = sc
    d = decide(tasks, nodes, quotas, now, config)
    by_id = {t.id: t for t in tasks}
    node = {n.name: n for n in nodes}

    # no node allocated twice, only free enabled nodes of the run's group get work
    given_out = [x for s in d.starts for x in s.nodes]
    assert len(given_out) == len(set(given_out))
    for s in d.starts:
        t = by_id[s.task]
        assert t.waiting
        # gang: exactly what it asked for
        assert len(s.nodes) == t.spec.nodes
        for x in s.nodes:
            assert node[x].task is None and node[x].state == ENABLED and node[x].group == t.spec.group
        assert s.zones == tuple(dict.fromkeys(node[x].zone for x in s.nodes)) or set(s.zones) == {
            node[x].zone for x in s.nodes}
        if t.spec.zone:
            assert s.zones == (t.spec.zone,)
        if len(s.zones) > 1:
            assert config.allow_cross_zone

    # at most one run spans zones (what ran before and what starts now)
    spanning = [t.id for t in tasks if t.running and len({node[x].zone for x in t.nodes}) > 1]
    spanning += [s.task for s in d.starts if len(s.zones) > 1]
    assert len(spanning) <= 1

    # quotas never exceeded by a start
    limits = {(q.owner, q.group, int(q.priority)): q.max_nodes for q in quotas}
    used: dict[tuple[str, str, int], int] = defaultdict(int)
    for t in tasks:
        if t.running:
            for owner in {t.spec.user, t.spec.shared_group} - {""}:
                used[(owner, t.spec.group, int(t.priority))] += len(t.nodes)
    for s in d.starts:
        t = by_id[s.task]
        assert s.priority != Priority.AUTO and (t.spec.priority == Priority.AUTO or s.priority == t.spec.priority)
        owners = [o for o in (t.spec.user, t.spec.shared_group) if o]
        explicit = [o for o in owners if (o, t.spec.group, int(s.priority)) in limits]
        for owner in owners:
            used[(owner, t.spec.group, int(s.priority))] += len(s.nodes)
        for owner in explicit:
            key = (owner, t.spec.group, int(s.priority))
            assert used[key] <= limits[key]
        if not explicit and config.default_quota is not None:
            assert used[(t.spec.user, t.spec.group, int(s.priority))] <= config.default_quota

    # victims: running, not already releasing, past their minimum runtime, lower (or, with time
    # sharing, equal and later and another user's), never the same user's at the same level
    victims = [p.task for p in d.preempts]
    assert len(victims) == len(set(victims))
    for p in d.preempts:
        v, w = by_id[p.task], by_id[p.for_task]
        assert v.running and not v.releasing and now - v.started_at >= config.min_runtime_s
        assert w.waiting and p.for_task not in {s.task for s in d.starts}
        wl = int(p.for_priority)
        assert w.spec.priority in (Priority.AUTO, p.for_priority)
        vl = effective_priority(v, now, config)
        assert vl < wl or (config.preempt_equal_priority and vl == wl and v.spec.user != w.spec.user)
        assert not (v.spec.user == w.spec.user and vl == wl)

    # every waiting run either starts or has exactly one reason
    waiting_ids = {t.id for t in tasks if t.waiting}
    started_ids = {s.task for s in d.starts}
    assert started_ids | set(d.waiting) == waiting_ids and not started_ids & set(d.waiting)
    assert all(r.code in REASON_CODES and r.message and "\n" not in r.message for r in d.waiting.values())

    # deterministic, whatever the order of the inputs
    assert decide(list(reversed(tasks)), list(reversed(nodes)), list(reversed(quotas)), now, config) == d
