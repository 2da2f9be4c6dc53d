"""Event codec: tags, versions, defaults, schema evolution, malformed input."""

from __future__ import annotations

import msgspec
import pytest

from fireflyer.bus.backoff import backoff_delay
from fireflyer.bus.events import Event, decode, encode, event_tag, schema_version
from fireflyer.core.errors import ProtocolError


class Heartbeat(Event, tag="test.heartbeat.v1"):
    node: str
    load: float = 0.0


class Suspended(Event, tag="test.suspended.v1"):
    task: int


class HeartbeatV2(Event, tag="test.heartbeat.v2"):
    node: str
    gpus: list[int]


class Untagged(Event):
    x: int = 0


def test_round_trip_keeps_fields_and_fills_id_and_time() -> None:
    ev = Heartbeat(node="n3", load=0.5)
    assert len(ev.event_id) == 32 and ev.sent_at > 0
    assert Heartbeat(node="n3").event_id != ev.event_id
    back = decode(encode(ev), Heartbeat)
    assert back == ev


def test_wire_format_is_json_with_the_tag_in_type() -> None:
    raw = msgspec.json.decode(encode(Suspended(task=4)))
    assert raw["type"] == "test.suspended.v1"
    assert raw["task"] == 4


def test_union_dispatches_on_the_tag() -> None:
    both = Heartbeat | Suspended
    assert isinstance(decode(encode(Suspended(task=1)), both), Suspended)
    assert isinstance(decode(encode(Heartbeat(node="a")), both), Heartbeat)


def test_tag_carries_the_schema_version() -> None:
    assert event_tag(Heartbeat) == "test.heartbeat.v1"
    assert schema_version(Heartbeat(node="a")) == 1
    assert schema_version(HeartbeatV2) == 2


def test_old_receivers_ignore_new_fields_and_new_receivers_default_missing_ones() -> None:
    newer = b'{"type":"test.heartbeat.v1","node":"n1","load":1.0,"temperature":71}'
    assert decode(newer, Heartbeat).node == "n1"
    older = b'{"type":"test.heartbeat.v1","node":"n1"}'
    ev = decode(older, Heartbeat)
    assert ev.load == 0.0 and ev.event_id  # defaults fill what old senders omit


def test_a_v2_message_is_not_a_v1_event() -> None:
    with pytest.raises(ProtocolError):
        decode(encode(HeartbeatV2(node="a", gpus=[0])), Heartbeat)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\xff",
        b"not json",
        b"[]",
        b'{"type":"test.heartbeat.v1"}',
        b'{"type":"test.heartbeat.v1","node":3}',
    ],
)
def test_malformed_payloads_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed event"):
        decode(data, Heartbeat | Suspended)


def test_events_are_frozen() -> None:
    ev = Heartbeat(node="a")
    with pytest.raises(AttributeError):
        ev.node = "b"  # type: ignore[misc]


def test_classes_without_a_stable_versioned_tag_are_refused() -> None:
    with pytest.raises(TypeError, match="stable tag"):
        encode(Untagged())
    with pytest.raises(TypeError, match="stable tag"):
        decode(b"{}", Untagged)
    with pytest.raises(TypeError):
        decode(b"{}", int)
    with pytest.raises(TypeError):
        encode({"type": "x"})  # type: ignore[arg-type]


def test_backoff_doubles_and_caps() -> None:
    assert backoff_delay(0, 0.25, 5.0, jitter=0) == 0.25
    assert backoff_delay(3, 0.25, 5.0, jitter=0) == 2.0
    assert backoff_delay(50, 0.25, 5.0, jitter=0) == 5.0
    for attempt in range(10):
        d = backoff_delay(attempt, 0.25, 5.0)
        assert 0.0 <= d <= 5.0 * 1.2
