"""Core NATS publish/subscribe through a real nats-server."""

from __future__ import annotations

import logging

import pytest
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from fireflyer.bus import Bus, Event, NatsServerProcess, pattern, subject
from fireflyer.core.config import NatsSettings
from fireflyer.core.errors import Unavailable
from fireflyer.testing.nats import fast_nats_settings
from fireflyer.testing.poll import wait_for


class Beat(Event, tag="bustest.beat.v1"):
    node: str
    n: int = 0


class Other(Event, tag="bustest.other.v1"):
    text: str


async def test_round_trip_with_wildcard_subscription(bus: Bus, unique_domain: str) -> None:
    got: list[tuple[Beat | Other, str]] = []

    async def on_event(ev: Beat | Other, msg: Msg) -> None:
        got.append((ev, msg.subject))

    await bus.subscribe(pattern(unique_domain, entity="node"), on_event, types=Beat | Other)
    sent = [Beat(node="n1", n=1), Other(text="hi"), Beat(node="n2", n=2)]
    for ev in sent:
        ident = ev.node if isinstance(ev, Beat) else "x"
        await bus.publish(subject(unique_domain, "node", ident, "beat"), ev)
    await wait_for(lambda: len(got) == 3, timeout_s=5, what="3 events")
    assert [e for e, _ in got] == sent  # typed, equal, in order
    assert got[0][1] == subject(unique_domain, "node", "n1", "beat")
    assert bus.stats.delivered_total == 3 and bus.stats.malformed_total == 0


async def test_queue_group_splits_messages_without_duplicates(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "node", "n1", "beat")
    a: list[int] = []
    b: list[int] = []
    everyone: list[int] = []

    def collect(into: list[int]):  # noqa: ANN202 - a handler factory
        async def handler(ev: Beat, msg: Msg) -> None:
            into.append(ev.n)

        return handler

    await bus.subscribe(subj, collect(a), types=Beat, queue="workers")
    await bus.subscribe(subj, collect(b), types=Beat, queue="workers")
    await bus.subscribe(subj, collect(everyone), types=Beat)  # not in the group: sees all
    for i in range(60):
        await bus.publish(subj, Beat(node="n1", n=i))
    await wait_for(lambda: len(a) + len(b) == 60 and len(everyone) == 60, timeout_s=5, what="60 each")
    assert a and b, "both queue members get a share"
    assert sorted(a + b) == list(range(60)), "each message to exactly one member"


async def test_malformed_payloads_are_counted_logged_and_survived(
    bus: Bus, unique_domain: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fireflyer.bus")
    subj = subject(unique_domain, "node", "n1", "beat")
    got: list[Beat] = []

    async def on_beat(ev: Beat, msg: Msg) -> None:
        got.append(ev)

    await bus.subscribe(subj, on_beat, types=Beat)
    await bus.publish(subj, Beat(node="n1", n=1))
    for junk in (b"", b"\xff\xfe\x00", b'{"type":"bustest.beat.v1","node":7}', b'{"type":"nope.v1"}'):
        await bus.nc.publish(subj, junk)  # raw bytes, past the typed API
    # a garbage trace header must not break delivery either
    await bus.nc.publish(subj, b'{"type":"bustest.beat.v1","node":"n1","n":2}', headers={"traceparent": "zz"})
    await bus.publish(subj, Beat(node="n1", n=3))

    await wait_for(lambda: len(got) == 3, timeout_s=5, what="valid events after junk")
    assert [e.n for e in got] == [1, 2, 3]
    assert bus.stats.malformed_total == 4
    assert bus.stats.malformed[subj] == 4
    records = [r for r in caplog.records if r.getMessage() == "bus.malformed"]
    assert len(records) == 4
    assert records[0].ff_fields["subject"] == subj  # type: ignore[attr-defined]


async def test_handler_exceptions_are_counted_and_not_fatal(
    bus: Bus, unique_domain: str, caplog: pytest.LogCaptureFixture
) -> None:
    subj = subject(unique_domain, "node", "n1", "beat")
    got: list[int] = []

    async def flaky(ev: Beat, msg: Msg) -> None:
        if ev.n % 2:
            raise RuntimeError(f"odd {ev.n}")
        got.append(ev.n)

    await bus.subscribe(subj, flaky, types=Beat)
    for i in range(6):
        await bus.publish(subj, Beat(node="n1", n=i))
    await wait_for(
        lambda: bus.stats.handler_errors_total == 3 and len(got) == 3, timeout_s=5, what="6 handled"
    )
    assert got == [0, 2, 4]
    assert any(r.getMessage() == "bus.handler_failed" for r in caplog.records)


async def test_trace_context_travels_in_headers(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "node", "n1", "beat")
    seen: list[tuple[int, str | None]] = []

    async def on_beat(ev: Beat, msg: Msg) -> None:
        ctx = trace.get_current_span().get_span_context()
        seen.append((ctx.trace_id, (msg.headers or {}).get("traceparent")))

    await bus.subscribe(subj, on_beat, types=Beat)
    # a private provider: the sender's span is real without touching global state
    sender = TracerProvider().get_tracer("test")
    with sender.start_as_current_span("send") as span:
        await bus.publish(subj, Beat(node="n1"), headers={"x-extra": "1"})
        trace_id = span.get_span_context().trace_id
    await wait_for(lambda: seen, timeout_s=5, what="traced event")
    got_trace, header = seen[0]
    assert header is not None and f"{trace_id:032x}" in header
    assert got_trace == trace_id, "the handler runs inside the sender's trace"


async def test_subscription_resumes_after_server_restart(
    nats_server: NatsServerProcess, bus: Bus, unique_domain: str
) -> None:
    subj = subject(unique_domain, "node", "n1", "beat")
    got: list[int] = []

    async def on_beat(ev: Beat, msg: Msg) -> None:
        got.append(ev.n)

    sub = await bus.subscribe(subj, on_beat, types=Beat)
    await bus.publish(subj, Beat(node="n1", n=1))
    await wait_for(lambda: got == [1], timeout_s=5, what="first event")

    nats_server.restart()
    await wait_for(lambda: bus.stats.reconnects >= 1 and bus.is_connected, timeout_s=10, what="reconnect")
    assert bus.stats.disconnects >= 1
    await bus.publish(subj, Beat(node="n1", n=2))
    await wait_for(lambda: got == [1, 2], timeout_s=5, what="event after restart")

    await sub.unsubscribe()
    await sub.unsubscribe()  # idempotent
    await bus.publish(subj, Beat(node="n1", n=3))
    await bus.flush()
    assert got == [1, 2]


async def test_connect_to_nothing_is_unavailable_quickly() -> None:
    settings: NatsSettings = fast_nats_settings("nats://127.0.0.1:1")
    with pytest.raises(Unavailable, match="cannot connect to NATS"):
        await Bus.connect(settings, name="nobody", wait_s=0.3)


async def test_close_is_idempotent_and_publish_after_close_is_unavailable(
    nats_settings: NatsSettings, unique_domain: str
) -> None:
    b = await Bus.connect(nats_settings, name="closing")
    assert b.is_connected
    await b.drain()
    await b.close()
    assert b.is_closed and not b.is_connected
    with pytest.raises(Unavailable):
        await b.publish(subject(unique_domain, "node", "n1", "beat"), Beat(node="n1"))
