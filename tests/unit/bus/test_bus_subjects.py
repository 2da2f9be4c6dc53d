"""Subject builders and parser: pure functions, no server."""

from __future__ import annotations

import pytest

from fireflyer.bus.subjects import SubjectParts, parse, pattern, subject
from fireflyer.core.errors import InvalidArgument


def test_subject_follows_the_design_shape() -> None:
    assert subject("node", "node", "n3", "heartbeat") == "ff.node.v1.node.n3.heartbeat"
    assert subject("sched", "task", 42, "suspend") == "ff.sched.v1.task.42.suspend"
    assert subject("health", "node", "n3", "verdict", version=2) == "ff.health.v2.node.n3.verdict"


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"domain": "no.de"}, "domain"),
        ({"entity": ""}, "entity"),
        ({"ident": "gpu01.rack2"}, "ident"),
        ({"ident": "a b"}, "ident"),
        ({"ident": "*"}, "ident"),
        ({"event": ">"}, "event"),
        ({"event": "beat\n"}, "event"),
    ],
)
def test_subject_rejects_bad_tokens_naming_them(kwargs: dict[str, str], bad: str) -> None:
    args = {"domain": "node", "entity": "node", "ident": "n3", "event": "heartbeat"} | kwargs
    with pytest.raises(InvalidArgument) as ei:
        subject(args["domain"], args["entity"], args["ident"], args["event"])
    assert ei.value.fields["token"] == bad
    assert bad in str(ei.value)


@pytest.mark.parametrize("version", [0, -1, True, "1"])
def test_subject_rejects_bad_versions(version: object) -> None:
    with pytest.raises(InvalidArgument):
        subject("node", "node", "n3", "heartbeat", version=version)  # type: ignore[arg-type]


def test_pattern_wildcards() -> None:
    assert pattern("node") == "ff.node.v1.*.*.*"
    assert pattern("node", event="heartbeat") == "ff.node.v1.*.*.heartbeat"
    assert pattern("sched", entity="task", ident="42") == "ff.sched.v1.task.42.*"
    assert pattern("sched", entity="task", ident=">") == "ff.sched.v1.task.>"
    assert pattern("sched", entity=">") == "ff.sched.v1.>"
    assert pattern("sched", event=">") == "ff.sched.v1.*.*.>"
    assert pattern("coord", version=2, entity="comm") == "ff.coord.v2.comm.*.*"


def test_pattern_rejects_tail_wildcard_before_literal_tokens() -> None:
    with pytest.raises(InvalidArgument, match="last token"):
        pattern("sched", entity=">", event="suspend")
    with pytest.raises(InvalidArgument):
        pattern("sched", ident="a.b")


def test_parse_round_trips() -> None:
    s = subject("coord", "comm", "c7", "telemetry", version=3)
    assert parse(s) == SubjectParts(domain="coord", version=3, entity="comm", ident="c7", event="telemetry")


@pytest.mark.parametrize(
    "bad",
    [
        "ff.node.v1.node.n3",
        "xx.node.v1.node.n3.heartbeat",
        "ff.node.1.node.n3.hb",
        "ff.node.v0.node.n3.hb",
        "ff.node.v1.node.*.hb",
    ],
)
def test_parse_rejects_foreign_subjects(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        parse(bad)


def test_owned_subjects_carry_the_user() -> None:
    from fireflyer.bus.subjects import owned, owned_pattern, owner_of, strip_owner, user_namespace

    s = owned("bob", subject("coord", "comm", "j1-main", "telemetry"))
    assert s == "ff.user.bob.coord.v1.comm.j1-main.telemetry"
    assert owner_of(s) == "bob" and strip_owner(s) == "ff.coord.v1.comm.j1-main.telemetry"
    assert owner_of("ff.coord.v1.comm.j1-main.telemetry") is None
    assert owned_pattern(pattern("coord", entity="comm", event="telemetry")) == "ff.user.*.coord.v1.comm.*.telemetry"
    assert user_namespace("a.b") == "ff.user.a~b"
    with pytest.raises(InvalidArgument):
        owned("b>b", "ff.x.v1.a.b.c")
    with pytest.raises(InvalidArgument):
        owned("bob", "nats.x")
