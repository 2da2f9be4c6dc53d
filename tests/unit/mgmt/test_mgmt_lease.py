"""Primary election: decisions, renewal and step-down timing, interleavings, clock skew, NotPrimary."""

from __future__ import annotations

import itertools
import pickle
from dataclasses import dataclass, field

import msgspec
import pytest

from fireflyer.core.clock import ManualClock
from fireflyer.core.errors import FailedPrecondition, InvalidArgument, error_from_dict
from fireflyer.mgmt.lease import (
    DEFAULT_LEASE_S,
    DEFAULT_RENEW_S,
    LeaseAction,
    LeaseConfig,
    NotPrimary,
    decide_lease,
    ensure_primary,
    in_bootstrap,
    is_primary,
    next_renewal_at,
    renew_due,
    should_step_down,
)
from fireflyer.mgmt.model import LeaseRecord

T0 = 1_700_000_000.0


def rec(
    holder: str = "m1", term: int = 1, expires_at: float = T0 + 60, renewed_at: float = T0
) -> LeaseRecord:
    return LeaseRecord(
        holder=holder,
        address=f"{holder}:7001",
        term=term,
        acquired_at=T0,
        renewed_at=renewed_at,
        expires_at=expires_at,
    )


# -- the decision ---------------------------------------------------------------------------------


def test_no_record_take_over_with_term_one() -> None:
    d = decide_lease(None, "m1", "127.0.0.1:7001", T0, 60.0)
    assert d.action is LeaseAction.TAKE_OVER and d.term == 1
    assert d.record == LeaseRecord(
        holder="m1", address="127.0.0.1:7001", term=1, acquired_at=T0, renewed_at=T0, expires_at=T0 + 60
    )
    assert (d.primary, d.primary_address) == ("m1", "127.0.0.1:7001")


def test_own_live_lease_is_extended_same_term() -> None:
    d = decide_lease(rec(term=4), "m1", "10.0.0.1:7001", T0 + 10, 60.0)
    assert d.action is LeaseAction.EXTEND and d.term == 4
    assert d.record is not None
    assert d.record.expires_at == T0 + 70 and d.record.renewed_at == T0 + 10
    assert d.record.acquired_at == T0 and d.record.address == "10.0.0.1:7001"


def test_someone_elses_live_lease_is_followed_and_named() -> None:
    r = rec("m1", term=3)
    d = decide_lease(r, "m2", "m2:7001", T0 + 59.9, 60.0)
    assert d.action is LeaseAction.FOLLOW
    assert (d.primary, d.primary_address, d.term) == ("m1", "m1:7001", 3)
    assert d.record is r


def test_expired_lease_is_taken_over_with_next_term() -> None:
    d = decide_lease(rec("m1", term=3), "m2", "m2:7001", T0 + 60, 60.0)
    assert d.action is LeaseAction.TAKE_OVER and d.term == 4
    assert d.record is not None and d.record.holder == "m2" and d.record.acquired_at == T0 + 60


def test_own_expired_lease_is_a_new_term() -> None:
    d = decide_lease(rec("m1", term=3), "m1", "m1:7001", T0 + 61, 60.0)
    assert d.action is LeaseAction.TAKE_OVER and d.term == 4


def test_takeover_grace_delays_followers_only() -> None:
    r = rec("m1", expires_at=T0 + 60)
    assert decide_lease(r, "m2", "a", T0 + 61, 60.0, takeover_grace_s=2).action is LeaseAction.FOLLOW
    assert decide_lease(r, "m2", "a", T0 + 62, 60.0, takeover_grace_s=2).action is LeaseAction.TAKE_OVER


def test_bad_lease_length_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        decide_lease(None, "m1", "a", T0, 0.0)


# -- renewal, step-down, bootstrap -------------------------------------------------------------------


def test_defaults_are_3fs() -> None:
    cfg = LeaseConfig()
    assert (
        (cfg.lease_s, cfg.renew_s, cfg.bootstrap_s)
        == (DEFAULT_LEASE_S, DEFAULT_RENEW_S, 120.0)
        == (60.0, 10.0, 120.0)
    )


@pytest.mark.parametrize(
    "kw",
    [{"lease_s": 0}, {"renew_s": -1}, {"renew_s": 10, "step_down_margin_s": 50}, {"takeover_grace_s": -1}],
)
def test_config_validation(kw: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        LeaseConfig(**kw)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(kw), type=LeaseConfig)


def test_renewal_schedule_and_step_down() -> None:
    r = rec("m1", renewed_at=T0, expires_at=T0 + 60)
    assert next_renewal_at(r, 10) == T0 + 10
    assert not renew_due(r, T0 + 9.9, 10) and renew_due(r, T0 + 10, 10) and renew_due(None, T0, 10)
    assert not should_step_down(r, "m1", T0 + 54.9, margin_s=5)
    assert should_step_down(r, "m1", T0 + 55, margin_s=5)
    assert should_step_down(r, "m2", T0, margin_s=5)  # not mine
    assert should_step_down(None, "m1", T0)
    assert is_primary(r, "m1", T0 + 1, 5) and not is_primary(r, "m1", T0 + 56, 5)


def test_bootstrap_window_after_takeover() -> None:
    r = rec("m1")
    assert in_bootstrap(r, T0 + 119) and not in_bootstrap(r, T0 + 120)


# -- NotPrimary -----------------------------------------------------------------------------------


def test_not_primary_names_the_primary() -> None:
    r = rec("m1")
    with pytest.raises(NotPrimary) as ei:
        ensure_primary(r, "m2", T0 + 1, 5)
    e = ei.value
    assert isinstance(e, FailedPrecondition) and e.code == "FAILED_PRECONDITION"
    assert str(e) == "mgmtd m2 is not the primary; the primary is m1 at m1:7001"
    assert (e.node, e.primary, e.primary_address, e.term) == ("m2", "m1", "m1:7001", 1)
    again = error_from_dict(e.to_dict())
    assert isinstance(again, NotPrimary) and again.primary_address == "m1:7001" and str(again) == str(e)
    pickled = pickle.loads(pickle.dumps(e))
    assert isinstance(pickled, NotPrimary) and pickled.primary == "m1"


def test_not_primary_without_a_live_lease() -> None:
    with pytest.raises(NotPrimary) as ei:
        ensure_primary(rec("m1", expires_at=T0 + 60), "m2", T0 + 61, 5)
    assert ei.value.primary == "" and "no replica holds a live lease" in str(ei.value)
    with pytest.raises(NotPrimary):  # my own lease inside the step-down margin
        ensure_primary(rec("m1"), "m1", T0 + 56, 5)
    ensure_primary(rec("m1"), "m1", T0 + 54, 5)


# -- replicas over a transactional KV ---------------------------------------------------------------


class KVConflict(Exception):
    pass


@dataclass
class FakeLeaseKV:
    """One key with optimistic concurrency: a commit fails if the key changed since the read."""

    record: LeaseRecord | None = None
    version: int = 0

    def read(self) -> tuple[LeaseRecord | None, int]:
        return self.record, self.version

    def commit(self, read_version: int, new: LeaseRecord) -> None:
        if read_version != self.version:
            raise KVConflict
        self.record, self.version = new, self.version + 1


@dataclass
class Replica:
    name: str
    clock: ManualClock
    cfg: LeaseConfig
    mine: LeaseRecord | None = None
    alive: bool = True
    log: list[str] = field(default_factory=list)

    def renew(self, kv: FakeLeaseKV) -> None:
        """One lease transaction, retried once on conflict (as the service would)."""
        for _ in range(2):
            record, ver = kv.read()
            d = decide_lease(
                record, self.name, f"{self.name}:7001", self.clock.time(), self.cfg.lease_s,
                takeover_grace_s=self.cfg.takeover_grace_s,
            )  # fmt: skip
            if d.action is LeaseAction.FOLLOW:
                self.mine = None
                return
            try:
                kv.commit(ver, d.record)  # type: ignore[arg-type]
            except KVConflict:
                continue
            self.mine = d.record
            self.log.append(d.action)
            return

    def primary(self) -> bool:
        return is_primary(self.mine, self.name, self.clock.time(), self.cfg.step_down_margin_s)


def test_single_replica_takes_and_keeps_the_lease() -> None:
    clock = ManualClock(T0)
    cfg = LeaseConfig(lease_s=0.6, renew_s=0.1, step_down_margin_s=0.05)
    kv = FakeLeaseKV()
    m1 = Replica("m1", clock, cfg)
    for _ in range(100):
        if renew_due(m1.mine, clock.time(), cfg.renew_s):
            m1.renew(kv)
        assert m1.primary()
        clock.advance(0.05)
    assert kv.record is not None and kv.record.term == 1 and kv.record.holder == "m1"
    assert m1.log[0] == LeaseAction.TAKE_OVER and set(m1.log[1:]) == {LeaseAction.EXTEND}


def test_racing_takers_every_interleaving_one_winner() -> None:
    """Both replicas read and commit in every order: exactly one lease is written, the loser
    re-reads and follows the winner by name."""
    steps = ["r1", "c1", "r2", "c2"]
    orders = [
        o
        for o in itertools.permutations(steps)
        if o.index("r1") < o.index("c1") and o.index("r2") < o.index("c2")
    ]
    assert len(orders) == 6
    for order in orders:
        kv = FakeLeaseKV()
        reads: dict[str, tuple[LeaseRecord | None, int]] = {}
        won: list[str] = []
        for step in order:
            me = "m" + step[1]
            if step[0] == "r":
                reads[me] = kv.read()
                continue
            record, ver = reads[me]
            d = decide_lease(record, me, f"{me}:7001", T0, 60.0)
            if d.action is LeaseAction.FOLLOW:
                continue
            try:
                kv.commit(ver, d.record)  # type: ignore[arg-type]
                won.append(me)
            except KVConflict:
                # retry: the fresh read shows the winner
                again = decide_lease(kv.read()[0], me, f"{me}:7001", T0, 60.0)
                assert again.action is LeaseAction.FOLLOW and again.primary != me
                assert again.primary_address == f"{again.primary}:7001"
        assert len(won) == 1, order
        assert kv.record is not None and kv.record.holder == won[0] and kv.record.term == 1


def _run(replicas: list[Replica], kv: FakeLeaseKV, ticks: int, tick_s: float, on_tick=None) -> list[set[str]]:
    """Advance all clocks together; every replica runs its renewal when due (if alive)."""
    primaries = []
    for i in range(ticks):
        if on_tick:
            on_tick(i)
        for r in replicas:
            if r.alive and (renew_due(r.mine, r.clock.time(), r.cfg.renew_s) or r.mine is None):
                r.renew(kv)
        primaries.append({r.name for r in replicas if r.alive and r.primary()})
        for r in replicas:
            r.clock.advance(tick_s)
    return primaries


def test_two_replicas_only_one_primary_and_failover_within_a_lease_period() -> None:
    cfg = LeaseConfig(lease_s=0.6, renew_s=0.1, step_down_margin_s=0.05)
    clock = ManualClock(T0)
    kv = FakeLeaseKV()
    m1, m2 = Replica("m1", clock, cfg), Replica("m2", clock, cfg)
    # m2 starts polling a bit later than m1, so m1 wins the first race
    history = _run([m1, m2], kv, ticks=40, tick_s=0.01)
    assert all(p == {"m1"} for p in history)
    last_renewal = kv.record.renewed_at  # type: ignore[union-attr]
    m1.alive = False  # m1 stops renewing (crash, partition from the KV)
    taken_at: list[float] = []

    def watch(_: int) -> None:
        if not taken_at and kv.record is not None and kv.record.holder == "m2":
            taken_at.append(clock.time())

    history = _run([m1, m2], kv, ticks=200, tick_s=0.01, on_tick=watch)
    assert all(len(p) <= 1 for p in history)
    assert kv.record is not None and kv.record.holder == "m2" and kv.record.term == 2
    assert taken_at and cfg.lease_s <= taken_at[0] - last_renewal <= cfg.lease_s + cfg.renew_s + 0.02
    # the old primary, were it still running, would see it must step down
    assert should_step_down(m1.mine, "m1", clock.time(), cfg.step_down_margin_s)
    # m1 comes back: it follows m2 and redirects writes there
    m1.alive = True
    _run([m1, m2], kv, ticks=20, tick_s=0.01)
    with pytest.raises(NotPrimary) as ei:
        ensure_primary(kv.record, "m1", clock.time(), cfg.step_down_margin_s)
    assert ei.value.primary == "m2" and ei.value.primary_address == "m2:7001"


def test_primary_that_cannot_renew_steps_down_before_anyone_takes_over() -> None:
    cfg = LeaseConfig(lease_s=0.6, renew_s=0.1, step_down_margin_s=0.05)
    clock = ManualClock(T0)
    kv = FakeLeaseKV()
    m1, m2 = Replica("m1", clock, cfg), Replica("m2", clock, cfg)
    _run([m1, m2], kv, ticks=5, tick_s=0.01)
    # the KV refuses m1's writes from now on, but m1 keeps running and checking its lease
    m1.renew = lambda kv: None  # type: ignore[method-assign]
    history = _run([m1, m2], kv, ticks=150, tick_s=0.01)
    assert all(len(p) <= 1 for p in history)
    gap = [i for i, p in enumerate(history) if not p]
    assert gap, "there is a window with no primary between step-down and takeover"
    assert history[-1] == {"m2"}


@pytest.mark.parametrize(
    ("skew_s", "margin_s", "grace_s", "overlap"),
    [
        (0.00, 0.05, 0.0, False),
        (0.04, 0.05, 0.0, False),  # follower's clock ahead, within the margin
        (0.08, 0.05, 0.05, False),  # beyond the margin, covered by the grace
        (0.12, 0.05, 0.0, True),  # beyond margin + grace: two primaries (the rule's limit)
    ],
)
def test_clock_skew_margin(skew_s: float, margin_s: float, grace_s: float, overlap: bool) -> None:
    cfg = LeaseConfig(lease_s=0.6, renew_s=0.1, step_down_margin_s=margin_s, takeover_grace_s=grace_s)
    c1, c2 = ManualClock(T0), ManualClock(T0 + skew_s)  # m2's clock runs ahead of m1's
    kv = FakeLeaseKV()
    m1, m2 = Replica("m1", c1, cfg), Replica("m2", c2, cfg)
    _run([m1], kv, ticks=1, tick_s=0.0)
    assert m1.primary()
    # m1 can no longer renew but keeps acting while its own clock says it may
    m1.renew = lambda kv: None  # type: ignore[method-assign]
    history = _run([m1, m2], kv, ticks=200, tick_s=0.005)
    assert any(len(p) == 2 for p in history) is overlap
    assert history[-1] == {"m2"}
