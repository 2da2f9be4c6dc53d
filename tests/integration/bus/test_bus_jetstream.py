"""JetStream through a real nats-server: durable delivery, restarts, redelivery, junk."""

from __future__ import annotations

import logging

import pytest
from nats.aio.msg import Msg

from fireflyer.bus import Bus, Event, NatsServerProcess, pattern, subject
from fireflyer.core.config import NatsSettings
from fireflyer.core.errors import FailedPrecondition, NotFound
from fireflyer.testing.nats import unique_name
from fireflyer.testing.poll import wait_for


class TaskState(Event, tag="bustest.task_state.v1"):
    task: int
    state: str


FAST = {"fetch_timeout_s": 0.25, "nak_delay_s": 0.05}


async def make_stream(bus: Bus, domain: str) -> str:
    name = unique_name("S")
    await bus.ensure_stream(name, [pattern(domain, entity="task", ident=">")])
    return name


def collector() -> tuple[list[TaskState], object]:
    got: list[TaskState] = []

    async def handler(ev: TaskState, msg: Msg) -> None:
        got.append(ev)

    return got, handler


async def test_durable_round_trip_acks_after_handling(bus: Bus, unique_domain: str) -> None:
    stream = await make_stream(bus, unique_domain)
    got, handler = collector()
    consumer = await bus.consume(stream, "sched", handler, types=TaskState, **FAST)
    seqs = [
        await bus.publish_durable(
            subject(unique_domain, "task", str(i), "state"), TaskState(task=i, state="run")
        )
        for i in range(3)
    ]
    assert seqs == [1, 2, 3]
    await wait_for(lambda: len(got) == 3, timeout_s=5, what="3 durable events")
    assert [e.task for e in got] == [0, 1, 2]

    async def all_acked() -> bool:
        info = await consumer.info()
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(all_acked, timeout_s=5, what="all acked")


async def test_messages_published_while_consumer_is_down_arrive_when_it_returns(
    bus: Bus, unique_domain: str
) -> None:
    stream = await make_stream(bus, unique_domain)
    got, handler = collector()
    consumer = await bus.consume(stream, "sched", handler, types=TaskState, **FAST)
    await bus.publish_durable(subject(unique_domain, "task", "1", "state"), TaskState(task=1, state="a"))
    await wait_for(lambda: len(got) == 1, timeout_s=5, what="first")
    await consumer.stop()
    assert not consumer.running

    for i in (2, 3):
        await bus.publish_durable(
            subject(unique_domain, "task", str(i), "state"), TaskState(task=i, state="b")
        )
    await bus.flush()
    assert len(got) == 1  # nobody is consuming

    await bus.consume(stream, "sched", handler, types=TaskState, **FAST)
    await wait_for(lambda: len(got) == 3, timeout_s=5, what="backlog delivered")
    assert [e.task for e in got] == [1, 2, 3]  # exactly once each here, in order


async def test_durable_state_survives_a_server_restart_with_consumer_stopped(
    nats_server: NatsServerProcess, bus: Bus, unique_domain: str
) -> None:
    stream = await make_stream(bus, unique_domain)
    got, handler = collector()
    consumer = await bus.consume(stream, "sched", handler, types=TaskState, **FAST)
    await bus.publish_durable(subject(unique_domain, "task", "1", "state"), TaskState(task=1, state="a"))
    await wait_for(lambda: len(got) == 1, timeout_s=5, what="first")
    await consumer.stop()
    await bus.publish_durable(subject(unique_domain, "task", "2", "state"), TaskState(task=2, state="old"))

    nats_server.restart()
    await wait_for(lambda: bus.stats.reconnects >= 1 and bus.is_connected, timeout_s=10, what="reconnect")
    # publish_durable retries until JetStream has recovered its streams
    await bus.publish_durable(subject(unique_domain, "task", "3", "state"), TaskState(task=3, state="new"))

    await bus.consume(stream, "sched", handler, types=TaskState, **FAST)
    await wait_for(lambda: len(got) == 3, timeout_s=10, what="old and new after restart")
    assert [e.task for e in got] == [1, 2, 3], "the durable's ack floor survived: 1 is not redelivered"


async def test_running_consumer_rides_through_a_server_restart(
    nats_server: NatsServerProcess, bus: Bus, nats_settings: NatsSettings, unique_domain: str
) -> None:
    stream = await make_stream(bus, unique_domain)
    got, handler = collector()
    await bus.consume(stream, "sched", handler, types=TaskState, **FAST)
    await bus.publish_durable(subject(unique_domain, "task", "1", "state"), TaskState(task=1, state="before"))
    await wait_for(lambda: len(got) == 1, timeout_s=5, what="before restart")

    nats_server.restart()
    # a second process publishes after the restart; the consumer's fetch loop must recover
    other = await Bus.connect(nats_settings, name="publisher", wait_s=5)
    try:
        await other.publish_durable(
            subject(unique_domain, "task", "2", "state"), TaskState(task=2, state="after")
        )
    finally:
        await other.close()
    await wait_for(lambda: len(got) == 2, timeout_s=15, what="event published after restart")
    assert [e.task for e in got] == [1, 2]


async def test_handler_failure_is_redelivered_then_acked(
    bus: Bus, unique_domain: str, caplog: pytest.LogCaptureFixture
) -> None:
    stream = await make_stream(bus, unique_domain)
    attempts: list[int] = []
    done: list[int] = []

    async def flaky(ev: TaskState, msg: Msg) -> None:
        attempts.append(msg.metadata.num_delivered)
        if len(attempts) < 3:
            raise RuntimeError("transient")
        done.append(ev.task)

    consumer = await bus.consume(stream, "sched", flaky, types=TaskState, max_deliver=5, **FAST)
    await bus.publish_durable(subject(unique_domain, "task", "7", "state"), TaskState(task=7, state="x"))
    await wait_for(lambda: done == [7], timeout_s=10, what="success on the third try")
    assert attempts == [1, 2, 3]
    assert bus.stats.handler_errors_total == 2

    async def settled() -> bool:
        info = await consumer.info()
        return info.num_ack_pending == 0 and info.num_redelivered == 0

    await wait_for(settled, timeout_s=5, what="acked after success")
    assert sum(r.getMessage() == "bus.handler_failed" for r in caplog.records) == 2


async def test_poison_message_is_given_up_after_max_deliver(
    bus: Bus, unique_domain: str, caplog: pytest.LogCaptureFixture
) -> None:
    stream = await make_stream(bus, unique_domain)
    got: list[int] = []

    async def handler(ev: TaskState, msg: Msg) -> None:
        if ev.state == "poison":
            raise ValueError("cannot handle")
        got.append(ev.task)

    await bus.consume(stream, "sched", handler, types=TaskState, max_deliver=2, **FAST)
    await bus.publish_durable(subject(unique_domain, "task", "1", "state"), TaskState(task=1, state="poison"))
    await bus.publish_durable(subject(unique_domain, "task", "2", "state"), TaskState(task=2, state="fine"))
    await wait_for(lambda: bus.stats.gave_up_total == 1 and got == [2], timeout_s=10, what="gave up on 1")
    assert bus.stats.handler_errors_total == 2
    assert any(r.getMessage() == "bus.gave_up" for r in caplog.records)


async def test_malformed_durable_messages_are_terminated_and_the_consumer_goes_on(
    bus: Bus, unique_domain: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fireflyer.bus")
    stream = await make_stream(bus, unique_domain)
    got, handler = collector()
    consumer = await bus.consume(stream, "sched", handler, types=TaskState, **FAST)
    subj = subject(unique_domain, "task", "1", "state")
    await bus.js.publish(subj, b"\x00\x01 not json")  # raw, past the typed API
    await bus.js.publish(subj, b'{"type":"bustest.task_state.v1","task":"one"}')
    await bus.publish_durable(subj, TaskState(task=1, state="ok"))

    await wait_for(lambda: len(got) == 1 and bus.stats.malformed_total == 2, timeout_s=5, what="junk skipped")
    assert bus.stats.malformed[subj] == 2
    assert sum(r.getMessage() == "bus.malformed" for r in caplog.records) == 2

    async def nothing_pending() -> bool:
        info = await consumer.info()
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(nothing_pending, timeout_s=5, what="junk terminated, not left for redelivery")


async def test_ensure_stream_is_idempotent_and_updates_subjects(bus: Bus, unique_domain: str) -> None:
    name = unique_name("S")
    first = [pattern(unique_domain, entity="task", ident=">")]
    await bus.ensure_stream(name, first, max_age_s=3600)
    await bus.ensure_stream(name, first, max_age_s=3600)
    both = first + [pattern(unique_domain, entity="node", ident=">")]
    await bus.ensure_stream(name, both, max_age_s=3600)
    info = await bus.js.stream_info(name)
    assert set(info.config.subjects or ()) == set(both)
    assert info.config.max_age == pytest.approx(3600)
    seq = await bus.publish_durable(
        subject(unique_domain, "node", "n1", "verdict"), TaskState(task=0, state="x")
    )
    assert seq == 1


async def test_republishing_the_same_event_is_deduplicated(bus: Bus, unique_domain: str) -> None:
    stream = await make_stream(bus, unique_domain)
    ev = TaskState(task=1, state="x")
    subj = subject(unique_domain, "task", "1", "state")
    assert await bus.publish_durable(subj, ev) == 1
    assert await bus.publish_durable(subj, ev) == 1  # a retry of the same event_id is not stored twice
    assert (await bus.js.stream_info(stream)).state.messages == 1


async def test_publish_without_a_stream_and_consume_of_a_missing_stream(bus: Bus, unique_domain: str) -> None:
    with pytest.raises(NotFound, match="ensure_stream"):
        await bus.publish_durable(
            subject(unique_domain, "task", "1", "state"), TaskState(task=1, state="x"), timeout_s=0.3
        )
    _, handler = collector()
    with pytest.raises(NotFound):
        await bus.consume(unique_name("S"), "d", handler, types=TaskState)
    with pytest.raises(FailedPrecondition):
        await bus.ensure_stream(unique_name("S"), ["ff.>", "ff.x.>"])  # overlapping subjects
