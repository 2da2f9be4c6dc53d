"""The rendezvous state machine: every bad-input case, generations and liveness, on a fake clock."""

from __future__ import annotations

import msgspec
import pytest

from fireflyer.coord.model import ABORTED, ACTIVE, ENDED, FORMING, JoinSpec
from fireflyer.coord.rendezvous import LivenessConfig, Rendezvous
from fireflyer.core.errors import (
    Aborted,
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)

T0 = 1000.0


def spec(node: str, *, nnodes: int = 2, zone: str = "", restart: int = 0, world: int = 0, k: int = 2,
         addr: str | None = None, expected: tuple[str, ...] = ()) -> JoinSpec:
    return JoinSpec(job="j", name="default", node=node, zone=zone, local_world_size=k,
                    address=addr if addr is not None else f"{node}:7000", nnodes=nnodes, world_size=world,
                    restart_count=restart, expected_nodes=expected)


def form(rv: Rendezvous, nodes: list[str], now: float = T0, **kw: object):
    out = None
    for n in nodes:
        out = rv.join(spec(n, nnodes=len(nodes), **kw), now, now + 30)  # type: ignore[arg-type]
    assert out is not None and out.formed is not None
    return out.formed


def test_forms_when_all_joined_and_ranks_are_deterministic() -> None:
    rv = Rendezvous()
    a = rv.join(spec("node10", nnodes=3), T0, T0 + 30)
    assert a.formed is None and a.record is not None and a.record.state == FORMING
    rv.join(spec("node2", nnodes=3), T0, T0 + 30)
    out = rv.join(spec("node1", nnodes=3), T0, T0 + 30)
    rec = out.formed
    assert rec is not None and rec.state == ACTIVE and rec.generation == 1
    assert [m.node for m in rec.members] == ["node1", "node2", "node10"]  # natural order, not join order
    assert [m.first_rank for m in rec.members] == [0, 2, 4]  # ranks = node_rank * K + local
    assert rec.world_size == 6 and out.dirty == [rec]


def test_zones_sort_first_and_give_one_cross_zone_pair() -> None:
    rv = Rendezvous()
    zones = {"a0": "B", "a1": "A", "a2": "B", "a3": "A"}
    out = None
    for n, z in zones.items():
        out = rv.join(spec(n, nnodes=4, zone=z), T0, T0 + 30)
    rec = out.formed  # type: ignore[union-attr]
    assert [(m.zone, m.node) for m in rec.members] == [("A", "a1"), ("A", "a3"), ("B", "a0"), ("B", "a2")]
    assert rec.cross_zone_pairs == 1
    dt = rv.trees[rec.comm]
    pairs = dt.cross_zone_pairs([m.zone for m in rec.members])
    assert len(pairs) == 1


def test_nnodes_disagreement_is_failed_precondition_naming_both() -> None:
    rv = Rendezvous()
    rv.join(spec("n0", nnodes=2), T0, T0 + 30)
    with pytest.raises(FailedPrecondition) as e:
        rv.join(spec("n1", nnodes=3), T0, T0 + 30)
    assert "nnodes=3" in str(e.value) and "nnodes=2" in str(e.value) and "n0" in str(e.value)


def test_world_size_disagreement_is_failed_precondition_naming_both() -> None:
    rv = Rendezvous()
    rv.join(spec("n0", world=4), T0, T0 + 30)
    with pytest.raises(FailedPrecondition, match=r"world_size=6.*world_size=4"):
        rv.join(spec("n1", world=6), T0, T0 + 30)


def test_duplicate_node_name_is_already_exists() -> None:
    rv = Rendezvous()
    rv.join(spec("n0", nnodes=3), T0, T0 + 30)
    with pytest.raises(AlreadyExists, match="n0"):
        rv.join(spec("n0", nnodes=3, addr="other:1"), T0, T0 + 30)
    # the same node retrying (same address) replaces its earlier join
    out = rv.join(spec("n0", nnodes=3), T0, T0 + 30)
    assert [m.node for m in out.record.members] == ["n0"]  # type: ignore[union-attr]
    rec = form(Rendezvous(), ["x", "y"])
    rv2 = Rendezvous()
    rv2.comms[rec.comm] = rec
    with pytest.raises(AlreadyExists, match="already a member"):
        rv2.join(spec("x"), T0, T0 + 30)
    with pytest.raises(FailedPrecondition, match="already formed"):
        rv2.join(spec("z"), T0, T0 + 30)


def test_deadline_lists_missing_nodes() -> None:
    rv = Rendezvous()
    rv.join(spec("n0", nnodes=3, expected=("n0", "n1", "n2")), T0, T0 + 5)
    rv.join(spec("n1", nnodes=3, expected=("n0", "n1", "n2")), T0, T0 + 8)
    assert not rv.expire(T0 + 4).failed
    out = rv.expire(T0 + 5)
    [(w, err)] = out.failed
    assert w.node == "n0" and isinstance(err, DeadlineExceeded)
    assert "missing nodes: n2" in str(err)
    # without expected names it says how many are missing
    rv2 = Rendezvous()
    rv2.join(spec("n0", nnodes=3), T0, T0 + 1)
    [(_, err2)] = rv2.expire(T0 + 2).failed
    assert "missing 2 of 3 nodes" in str(err2)
    # everyone gave up: the next join may set a new shape
    assert rv2.join(spec("n0", nnodes=1), T0 + 3, T0 + 9).formed is not None


def test_unknown_communicator_is_not_found() -> None:
    rv = Rendezvous()
    for call in (lambda: rv.heartbeat("j/x", 1, "n0", T0), lambda: rv.leave("j/x", 1, "n0", T0),
                 lambda: rv.abort("j/x", 0, "", "r", T0), lambda: rv.get("j/x")):
        with pytest.raises(NotFound):
            call()


def test_bad_join_fields_are_invalid_argument() -> None:
    rv = Rendezvous()
    with pytest.raises(InvalidArgument):
        rv.join(spec(""), T0, T0 + 1)
    with pytest.raises(InvalidArgument, match="address"):
        rv.join(spec("n0", addr=""), T0, T0 + 1)
    with pytest.raises(InvalidArgument, match="expected"):
        rv.join(spec("n9", expected=("n0", "n1")), T0, T0 + 1)


def test_generations_and_stale_members() -> None:
    rv = Rendezvous()
    g1 = form(rv, ["n0", "n1"])
    assert rv.abort(g1.comm, 1, "n0", "boom", T0).aborted == [g1]
    assert g1.state == ABORTED and "node n0" in g1.reason and "boom" in g1.reason
    g2 = form(rv, ["n0", "n1"], now=T0 + 1)
    assert g2.generation == 2
    with pytest.raises(FailedPrecondition, match="stale generation 1"):
        rv.heartbeat(g2.comm, 1, "n0", T0 + 2)
    with pytest.raises(FailedPrecondition, match="stale generation 1"):
        rv.leave(g2.comm, 1, "n0", T0 + 2)
    # a higher restart count supersedes the active generation
    out = rv.join(spec("n0", restart=1), T0 + 3, T0 + 30)
    assert out.aborted == [g2] and "superseded" in g2.reason
    assert out.record is not None and out.record.generation == 3 and out.record.state == FORMING
    with pytest.raises(FailedPrecondition, match="older run"):
        rv.join(spec("n1", restart=0), T0 + 3, T0 + 30)


def test_superseding_a_forming_generation_fails_its_waiters() -> None:
    rv = Rendezvous()
    rv.join(spec("n0", nnodes=3), T0, T0 + 30)
    out = rv.join(spec("n0", nnodes=3, restart=1), T0, T0 + 30)
    assert [(w.node, type(e)) for w, e in out.failed] == [("n0", Aborted)]
    assert out.record is not None and out.record.generation == 2


def test_leave_ends_when_everyone_left_without_aborting() -> None:
    rv = Rendezvous()
    rec = form(rv, ["n0", "n1"])
    out = rv.leave(rec.comm, 1, "n0", T0)
    assert rec.state == ACTIVE and not out.aborted and rec.member("n0").left  # type: ignore[union-attr]
    assert not rv.scan(T0 + 100).aborted or rec.state == ABORTED  # n1 silent: liveness still watches it
    rv2 = Rendezvous()
    rec2 = form(rv2, ["n0", "n1"])
    rv2.leave(rec2.comm, 1, "n0", T0)
    out2 = rv2.leave(rec2.comm, 1, "n1", T0)
    assert rec2.state == ENDED and not out2.aborted and out2.dirty == [rec2]


def test_liveness_aborts_naming_the_silent_node() -> None:
    rv = Rendezvous(LivenessConfig(interval_s=1.0, misses=3))
    rec = form(rv, ["n0", "n1", "n2"])
    for t in (1, 2, 3):
        rv.heartbeat(rec.comm, 1, "n0", T0 + t)
        rv.heartbeat(rec.comm, 1, "n2", T0 + t)
        assert not rv.scan(T0 + t).aborted  # n1, last seen at formation (T0), is within 3 s
    out = rv.scan(T0 + 3.5)
    assert out.aborted == [rec] and rec.culprit == "n1"
    assert "node n1 (node rank 1" in rec.reason and "missed heartbeats" in rec.reason
    # an aborted generation answers heartbeats with its state (the fallback path of members)
    assert rv.heartbeat(rec.comm, 1, "n0", T0 + 5).state == ABORTED


def test_restart_counts_members_as_seen_at_load() -> None:
    rv = Rendezvous(LivenessConfig(interval_s=1.0, misses=3))
    rec = form(rv, ["n0", "n1"])
    rv2 = Rendezvous(LivenessConfig(interval_s=1.0, misses=3, restart_grace_s=2.0))
    rv2.load([rec], T0 + 100)
    assert not rv2.scan(T0 + 104.5).aborted  # 3 s limit + 2 s grace
    assert rv2.scan(T0 + 105.5).aborted == [rec]
    g2 = form(rv2, ["n0", "n1"], now=T0 + 105)
    assert g2.generation == 2


def test_a_live_communicator_belongs_to_the_user_who_made_it() -> None:
    from fireflyer.core.errors import PermissionDenied

    rv = Rendezvous()
    out = rv.join(msgspec.structs.replace(spec("node0"), owner="alice"), T0, T0 + 30)
    assert out.record is not None and out.record.owner == "alice"
    with pytest.raises(PermissionDenied, match="belongs to user 'alice'"):
        rv.join(msgspec.structs.replace(spec("node1"), owner="bob"), T0, T0 + 30)
    with pytest.raises(PermissionDenied):  # not by superseding it with a higher restart count either
        rv.join(msgspec.structs.replace(spec("node1", restart=1), owner="bob"), T0, T0 + 30)
    formed = rv.join(msgspec.structs.replace(spec("node1"), owner="alice"), T0, T0 + 30).formed
    assert formed is not None and formed.owner == "alice"
