"""The chain update: one test case per row of RULES, then scenarios and invariants."""

from __future__ import annotations

import random
from collections.abc import Mapping

import msgspec
import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.mgmt import chains as chains_mod
from fireflyer.mgmt.chains import (
    ORDER,
    RULES,
    Context,
    Rule,
    apply_to_routing,
    decide_targets,
    next_chain,
    rules_markdown,
    update_chains,
)
from fireflyer.mgmt.model import Chain, ChainTarget, LocalState, PublicState, RoutingInfo, TargetInfo

P = PublicState
L = LocalState
C = Context

X = 1  # the target under test in the row cases


def chain(*targets: tuple[int, PublicState], version: int = 1, chain_id: int = 7) -> Chain:
    return Chain(
        chain_id=chain_id,
        version=version,
        targets=tuple(ChainTarget(target_id=t, public_state=s) for t, s in targets),
    )


def layout(c: Chain) -> list[tuple[int, PublicState]]:
    return [(t.target_id, t.public_state) for t in c.targets]


# -- one case per row ---------------------------------------------------------------------------

# companions (target id, public state, local state) that put X in each context; X's position
# is where "X" stands.
_S = (2, P.SERVING, L.UPTODATE)
_CONTEXTS: dict[Context, list[object]] = {
    C.SERVING_REMAINS: ["X", _S],
    C.FIRST_SERVING_NONE_REMAIN: ["X", (2, P.SERVING, L.OFFLINE)],
    C.LATER_SERVING_NONE_REMAIN: [(2, P.SERVING, L.OFFLINE), "X"],
    C.HAS_SERVING: [_S, "X"],
    C.NO_SERVING: [(2, P.LASTSRV, L.OFFLINE), "X", (3, P.OFFLINE, L.OFFLINE)],
    C.SYNC_SLOT_FREE: [_S, "X", (3, P.OFFLINE, L.OFFLINE)],
    C.OTHER_SYNCING: [_S, (3, P.SYNCING, L.ONLINE), "X"],
    C.EARLIER_RETURNING: [_S, (3, P.WAITING, L.ONLINE), "X"],
}
# rows that hold whatever else is in the chain are checked alone and next to a healthy serving
# target (or next to a down lastsrv-free chain for lastsrv, which never coexists with serving)
_ANY_VARIANTS: list[list[object]] = [["X"], [_S, "X"], ["X", (3, P.OFFLINE, L.OFFLINE)]]


def _cases() -> list[tuple[Rule, list[object]]]:
    out = []
    for r in RULES:
        if r.context is C.ANY:
            variants = (
                _ANY_VARIANTS if r.current is not P.LASTSRV else [["X"], ["X", (3, P.OFFLINE, L.OFFLINE)]]
            )
            out.extend((r, v) for v in variants)
        else:
            out.append((r, _CONTEXTS[r.context]))
    return out


def _build(rule: Rule, spec: list[object]) -> tuple[Chain, dict[int, LocalState]]:
    targets: list[tuple[int, PublicState]] = []
    local: dict[int, LocalState] = {}
    for item in spec:
        if item == "X":
            targets.append((X, rule.current))
            local[X] = rule.local
        else:
            tid, ps, ls = item  # type: ignore[misc]
            targets.append((tid, ps))
            local[tid] = ls
    return chain(*targets), local


@pytest.mark.parametrize(
    ("rule", "spec"),
    _cases(),
    ids=[f"{r.current}+{r.local}|{r.context}|{i}" for i, (r, _) in enumerate(_cases())],
)
def test_every_rule_row(rule: Rule, spec: list[object]) -> None:
    c, local = _build(rule, spec)
    decided = {d.target_id: d for d in decide_targets(c, local)}
    assert decided[X].rule == rule, f"expected row {rule}, got {decided[X].rule}"
    assert decided[X].next is rule.next
    new = next_chain(c, local)
    assert new.state_of(X) is rule.next
    assert new.version == (c.version if new.targets == c.targets else c.version + 1)


def test_every_row_is_covered_and_the_table_is_complete() -> None:
    keys = [(r.current, r.local, r.context) for r in RULES]
    assert len(keys) == len(set(keys)), "duplicate rows"
    groups = {
        frozenset({C.ANY}),
        frozenset({C.SERVING_REMAINS, C.FIRST_SERVING_NONE_REMAIN, C.LATER_SERVING_NONE_REMAIN}),
        frozenset({C.HAS_SERVING, C.NO_SERVING}),
        frozenset({C.SYNC_SLOT_FREE, C.NO_SERVING, C.OTHER_SYNCING, C.EARLIER_RETURNING}),
    }
    for ps in PublicState:
        for ls in LocalState:
            contexts = frozenset(r.context for r in RULES if r.current is ps and r.local is ls)
            assert contexts in groups, f"{ps}+{ls} has contexts {set(contexts)}"
    assert {r.source for r in RULES} == {"note", "ours"}
    covered = {r for r, _ in _cases()}
    assert covered == set(RULES)


def test_rules_are_in_the_docs() -> None:
    md = rules_markdown()
    assert chains_mod.__doc__ is not None and md in chains_mod.__doc__
    assert md.count("\n") == len(RULES) + 1
    ours = [r for r in RULES if r.source == "ours"]
    # the note's silent cases named in the brief are decided as our choice
    assert {(r.current, r.local) for r in ours} >= {
        (P.WAITING, L.UPTODATE),
        (P.OFFLINE, L.UPTODATE),
        (P.LASTSRV, L.OFFLINE),
        (P.LASTSRV, L.ONLINE),
        (P.LASTSRV, L.UPTODATE),
    }


# -- scenarios on a 3-replica chain -----------------------------------------------------------

A, B, Cc = 101, 102, 103
ALL_UP = {A: L.UPTODATE, B: L.UPTODATE, Cc: L.UPTODATE}


def fresh() -> Chain:
    return chain((A, P.SERVING), (B, P.SERVING), (Cc, P.SERVING), version=1)


def test_no_op_update_keeps_the_chain_and_its_version() -> None:
    c = fresh()
    assert next_chain(c, ALL_UP) is c
    assert next_chain(c, {A: L.ONLINE, B: L.UPTODATE, Cc: L.ONLINE}) is c
    assert update_chains([c], ALL_UP) == []


def test_tail_fails_goes_offline_at_tail_and_bumps_version() -> None:
    new = next_chain(fresh(), {**ALL_UP, Cc: L.OFFLINE})
    assert layout(new) == [(A, P.SERVING), (B, P.SERVING), (Cc, P.OFFLINE)]
    assert new.version == 2


def test_head_fails_moves_to_the_end() -> None:
    new = next_chain(fresh(), {**ALL_UP, A: L.OFFLINE})
    assert layout(new) == [(B, P.SERVING), (Cc, P.SERVING), (A, P.OFFLINE)]
    assert new.head == B and new.version == 2


def test_all_fail_in_sequence_first_serving_becomes_lastsrv() -> None:
    local = dict(ALL_UP)
    c = fresh()
    local[B] = L.OFFLINE
    c = next_chain(c, local)
    assert layout(c) == [(A, P.SERVING), (Cc, P.SERVING), (B, P.OFFLINE)]
    local[A] = L.OFFLINE
    c = next_chain(c, local)
    # stable within a class: A was ahead of B, so it stays ahead among the offline ones
    assert layout(c) == [(Cc, P.SERVING), (A, P.OFFLINE), (B, P.OFFLINE)]
    local[Cc] = L.OFFLINE
    c = next_chain(c, local)
    assert layout(c) == [(Cc, P.LASTSRV), (A, P.OFFLINE), (B, P.OFFLINE)]
    assert c.version == 4 and c.head is None  # unavailable
    assert next_chain(c, local) is c  # and stays so while all are down


def test_all_fail_at_once_keeps_the_first_in_chain_order_as_lastsrv() -> None:
    c = next_chain(fresh(), {A: L.OFFLINE, B: L.OFFLINE, Cc: L.OFFLINE})
    assert layout(c) == [(A, P.LASTSRV), (B, P.OFFLINE), (Cc, P.OFFLINE)]


def test_others_returning_while_lastsrv_is_down_only_wait() -> None:
    c = chain((Cc, P.LASTSRV), (B, P.OFFLINE), (A, P.OFFLINE), version=4)
    c = next_chain(c, {Cc: L.OFFLINE, B: L.ONLINE, A: L.UPTODATE})
    assert layout(c) == [(Cc, P.LASTSRV), (B, P.WAITING), (A, P.WAITING)]
    # the last copy returns: serves again, and only then can the others resync
    c = next_chain(c, {Cc: L.ONLINE, B: L.ONLINE, A: L.ONLINE})
    assert layout(c) == [(Cc, P.SERVING), (B, P.SYNCING), (A, P.WAITING)]


def test_returning_target_syncs_then_serves() -> None:
    c = next_chain(fresh(), {**ALL_UP, A: L.OFFLINE})
    v = c.version
    c = next_chain(c, {**ALL_UP, A: L.ONLINE})  # restarted, reports online
    assert layout(c) == [(B, P.SERVING), (Cc, P.SERVING), (A, P.SYNCING)] and c.version == v + 1
    assert next_chain(c, {**ALL_UP, A: L.ONLINE}) is c  # resync in progress: nothing changes
    c = next_chain(c, ALL_UP)  # sync-done -> up-to-date
    assert layout(c) == [(B, P.SERVING), (Cc, P.SERVING), (A, P.SERVING)] and c.version == v + 2


def test_two_returning_at_once_sync_one_at_a_time() -> None:
    local = {**ALL_UP, A: L.OFFLINE, B: L.OFFLINE}
    c = next_chain(next_chain(fresh(), {**ALL_UP, B: L.OFFLINE}), local)
    assert layout(c) == [(Cc, P.SERVING), (A, P.OFFLINE), (B, P.OFFLINE)]
    local = {**ALL_UP, A: L.ONLINE, B: L.ONLINE}
    c = next_chain(c, local)
    assert layout(c) == [(Cc, P.SERVING), (A, P.SYNCING), (B, P.WAITING)]
    assert next_chain(c, local) is c  # B keeps waiting while A syncs
    local[A] = L.UPTODATE
    c = next_chain(c, local)  # A serves; the slot is free for B in the same pass
    assert layout(c) == [(Cc, P.SERVING), (A, P.SERVING), (B, P.SYNCING)]
    local[B] = L.UPTODATE
    c = next_chain(c, local)
    assert layout(c) == [(Cc, P.SERVING), (A, P.SERVING), (B, P.SERVING)]
    assert c.version == 6  # five changes after version 1


def test_syncing_target_loses_its_source() -> None:
    c = chain((Cc, P.SERVING), (A, P.SYNCING), version=3)
    c = next_chain(c, {Cc: L.OFFLINE, A: L.ONLINE})
    assert layout(c) == [(Cc, P.LASTSRV), (A, P.WAITING)]


def test_finished_resync_counts_as_a_remaining_serving_copy() -> None:
    # the last serving target fails in the same pass in which the syncing one finishes
    c = chain((Cc, P.SERVING), (A, P.SYNCING), version=3)
    c = next_chain(c, {Cc: L.OFFLINE, A: L.UPTODATE})
    assert layout(c) == [(A, P.SERVING), (Cc, P.OFFLINE)]


def test_unknown_local_state_keeps_the_public_state() -> None:
    c = fresh()
    assert next_chain(c, {}) is c
    # a target mgmtd has not heard from counts as the serving copy it is: no lastsrv
    new = next_chain(c, {A: L.OFFLINE, B: L.OFFLINE})
    assert layout(new) == [(Cc, P.SERVING), (A, P.OFFLINE), (B, P.OFFLINE)]
    assert [d.rule for d in decide_targets(c, {}) if d.target_id == A] == [None]


def test_order_alone_changing_bumps_the_version() -> None:
    c = chain((A, P.OFFLINE), (B, P.SERVING), version=5)
    new = next_chain(c, {A: L.OFFLINE, B: L.UPTODATE})
    assert layout(new) == [(B, P.SERVING), (A, P.OFFLINE)] and new.version == 6


def test_update_chains_returns_only_changed_chains_in_input_order() -> None:
    c1 = chain((1, P.SERVING), (2, P.SERVING), chain_id=1)
    c2 = chain((3, P.SERVING), (4, P.SERVING), chain_id=2)
    c3 = chain((5, P.SERVING), (6, P.SERVING), chain_id=3)
    local = {1: L.UPTODATE, 2: L.UPTODATE, 3: L.OFFLINE, 4: L.UPTODATE, 5: L.UPTODATE, 6: L.OFFLINE}
    changed = update_chains([c1, c2, c3], local)
    assert [c.chain_id for c in changed] == [2, 3]
    assert all(c.version == 2 for c in changed)


# -- invariants over random reachable histories -------------------------------------------------


def _check_step(old: Chain, new: Chain, local: Mapping[int, LocalState]) -> None:
    states = new.states
    assert list(states) == sorted(states, key=ORDER.index), "order is by class"
    assert (new.version == old.version) == (new.targets == old.targets)
    assert new.version in (old.version, old.version + 1)
    assert sorted(new.target_ids) == sorted(old.target_ids)
    assert states.count(P.LASTSRV) <= 1
    if P.LASTSRV in states:
        assert P.SERVING not in states
    if P.SERVING in old.states or P.LASTSRV in old.states:  # never lose the last copy
        assert P.SERVING in states or P.LASTSRV in states
    newly_syncing = [
        t for t in new.targets if t.public_state is P.SYNCING and old.state_of(t.target_id) is not P.SYNCING
    ]
    assert len(newly_syncing) <= 1
    if newly_syncing:
        assert P.SYNCING not in old.states or all(
            local.get(t.target_id) is not L.ONLINE for t in old.targets if t.public_state is P.SYNCING
        )
    for t in new.targets:
        before = old.state_of(t.target_id)
        if t.public_state is P.SERVING and before is not P.SERVING:
            # only a finished resync or the returning last copy starts serving
            assert before in (P.SYNCING, P.LASTSRV)
            assert local[t.target_id] is not L.OFFLINE
        if t.public_state is not P.OFFLINE and t.public_state is not P.LASTSRV:
            assert local.get(t.target_id, L.UPTODATE) is not L.OFFLINE or before is t.public_state


@pytest.mark.parametrize("seed", range(20))
def test_random_histories_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 5])
    c = chain(*((i, P.SERVING) for i in range(n)))
    local = {i: L.UPTODATE for i in range(n)}
    for _ in range(300):
        for i in range(n):
            if rng.random() < 0.3:
                local[i] = rng.choice(list(LocalState))
        new = next_chain(c, local)
        _check_step(c, new, local)
        # a fixed point is reached within a few passes of unchanged input
        settled = new
        for _ in range(3):
            settled = next_chain(settled, local)
        assert next_chain(settled, local) is settled
        c = new


# -- routing info and records --------------------------------------------------------------------


def test_apply_to_routing_swaps_chains_and_target_states() -> None:
    c = fresh()
    targets = tuple(
        TargetInfo(target_id=t, node_id=f"s{t}", chain_id=7, local_state=L.UPTODATE, public_state=P.SERVING)
        for t in (A, B, Cc)
    )
    r = RoutingInfo(version=10, targets=targets, chains=(c,))
    assert apply_to_routing(r, []) is r
    local = {**ALL_UP, A: L.OFFLINE}
    r2 = apply_to_routing(r, update_chains(r.chains, local), local)
    assert r2.version == 11
    assert layout(r2.chains[0]) == [(B, P.SERVING), (Cc, P.SERVING), (A, P.OFFLINE)]
    by_id = {t.target_id: t for t in r2.targets}
    assert by_id[A].public_state is P.OFFLINE and by_id[A].local_state is L.OFFLINE
    assert by_id[B].public_state is P.SERVING
    assert apply_to_routing(r2, update_chains(r2.chains, local), local) is r2


def test_chain_records_round_trip_and_validate() -> None:
    c = next_chain(fresh(), {**ALL_UP, A: L.OFFLINE})
    for enc, dec in (
        (msgspec.msgpack.encode, msgspec.msgpack.decode),
        (msgspec.json.encode, msgspec.json.decode),
    ):
        assert dec(enc(c), type=Chain) == c
    assert b'"lastsrv"' in msgspec.json.encode(chain((1, P.LASTSRV)))
    with pytest.raises(InvalidArgument):
        chain((1, P.SERVING), (1, P.OFFLINE))
    bad = msgspec.json.encode(
        {"chain_id": 1, "version": 1, "targets": [{"target_id": 1, "public_state": "serving"}] * 2}
    )
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(bad, type=Chain)
    with pytest.raises(AttributeError):
        c.version = 3  # type: ignore[misc]


def test_rule_outcomes_match_the_specification() -> None:
    """An independent copy of the outcomes (research/3fs.md §3 and our documented choices), so an
    edit of RULES cannot silently change behaviour while the row tests follow it."""
    W, S, Y, OFF, LS = P.WAITING, P.SERVING, P.SYNCING, P.OFFLINE, P.LASTSRV
    spec = {
        (S, L.UPTODATE, C.ANY): S, (S, L.ONLINE, C.ANY): S,
        (S, L.OFFLINE, C.SERVING_REMAINS): OFF, (S, L.OFFLINE, C.FIRST_SERVING_NONE_REMAIN): LS,
        (S, L.OFFLINE, C.LATER_SERVING_NONE_REMAIN): OFF,
        (Y, L.UPTODATE, C.ANY): S, (Y, L.ONLINE, C.HAS_SERVING): Y, (Y, L.ONLINE, C.NO_SERVING): W,
        (Y, L.OFFLINE, C.ANY): OFF,
        (W, L.UPTODATE, C.ANY): W, (W, L.OFFLINE, C.ANY): OFF,
        (LS, L.UPTODATE, C.ANY): S, (LS, L.ONLINE, C.ANY): S, (LS, L.OFFLINE, C.ANY): LS,
        (OFF, L.UPTODATE, C.ANY): W, (OFF, L.OFFLINE, C.ANY): OFF,
    }  # fmt: skip
    for cur in (W, OFF):
        spec[(cur, L.ONLINE, C.SYNC_SLOT_FREE)] = Y
        for ctx in (C.NO_SERVING, C.OTHER_SYNCING, C.EARLIER_RETURNING):
            spec[(cur, L.ONLINE, ctx)] = W
    assert {(r.current, r.local, r.context): r.next for r in RULES} == spec
