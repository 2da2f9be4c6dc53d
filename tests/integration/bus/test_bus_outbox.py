"""The outbox and the reconnect against a real nats-server killed with -9 and restarted on its port."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats.aio.msg import Msg

from fireflyer.bus import Bus, Event, NatsServerProcess, Outbox, pattern, subject
from fireflyer.core.config import NatsSettings
from fireflyer.testing.nats import unique_name
from fireflyer.testing.poll import wait_for


class Committed(Event, tag="outboxtest.committed.v1"):
    n: int


async def test_every_event_appended_across_a_kill_9_is_delivered_once_in_order(
    nats_server: NatsServerProcess, bus: Bus, nats_settings: NatsSettings, unique_domain: str, tmp_path: Path
) -> None:
    stream = unique_name("S")
    await bus.ensure_stream(stream, [pattern(unique_domain, entity=">")])
    box = Outbox(bus, path=tmp_path / "outbox.db", name="test", attempt_timeout_s=0.5, max_retry_wait_s=0.5)
    await box.start()
    sent: list[str] = []

    async def commit(n: int) -> None:
        # as the checkpoint service does: from a worker thread, and it must not wait for NATS
        ev = Committed(n=n)
        t0 = time.monotonic()
        await asyncio.to_thread(box.append, subject(unique_domain, "job", "j1", "committed"), ev)
        assert time.monotonic() - t0 < 0.5, "append waited on the bus"
        sent.append(ev.event_id)

    for n in range(5):
        await commit(n)
    await wait_for(lambda: box.stats.sent >= 2, timeout_s=10, what="some published before the crash")

    port = nats_server.port
    nats_server.kill()  # kill -9, mid-stream
    for n in range(5, 10):
        await commit(n)
    await wait_for(lambda: box.stats.failures >= 1, timeout_s=10, what="a failed attempt while NATS is away")
    assert box.pending >= 5

    nats_server.start()  # its command line again: the same port and store
    assert nats_server.port == port
    for n in range(10, 15):
        await commit(n)
    assert await box.wait_empty(15.0), f"still unsent after the restart: {box.pending_ids()}"
    await box.stop()

    got: list[str] = []

    async def on_msg(ev: Committed, msg: Msg) -> None:
        got.append(ev.event_id)

    reader = await Bus.connect(nats_settings, name="reader")
    try:
        await reader.consume(stream, "reader", on_msg, types=Committed, fetch_timeout_s=0.25)
        await wait_for(lambda: len(got) >= len(sent), timeout_s=10, what="every committed event")
        info = await reader.js.stream_info(stream)
    finally:
        await reader.close()
    assert got == sent, "each event once, in the order appended"
    assert info.state.messages == len(sent)


async def test_outbox_left_unsent_by_a_stopped_service_goes_out_after_its_restart(
    nats_server: NatsServerProcess, bus: Bus, unique_domain: str, tmp_path: Path
) -> None:
    stream = unique_name("S")
    await bus.ensure_stream(stream, [pattern(unique_domain, entity=">")])
    path = tmp_path / "outbox.db"
    nats_server.kill()
    first = Outbox(bus, path=path, attempt_timeout_s=0.2)
    await first.start()
    ids = []
    for n in range(3):
        ev = Committed(n=n)
        first.append(subject(unique_domain, "job", "j2", "committed"), ev)
        ids.append(ev.event_id)
    await first.stop()  # the service stops while NATS is still away

    nats_server.start()
    second = Outbox(bus, path=path)
    assert second.pending_ids() == ids
    await second.start()
    assert await second.wait_empty(15.0)
    await second.stop()
    info = await bus.js.stream_info(stream)
    assert info.state.messages == 3


async def test_subscriber_receives_again_within_seconds_after_kill_9_and_restart(
    nats_server: NatsServerProcess, unique_domain: str
) -> None:
    # the default reconnect settings (not the tests' fast ones): what services run with
    settings = NatsSettings(url=nats_server.url)
    sub_bus = await Bus.connect(settings, name="sub")
    pub_bus = await Bus.connect(settings, name="pub")
    subj = subject(unique_domain, "node", "n1", "beat")
    got: list[int] = []

    async def on_beat(ev: Committed, msg: Msg) -> None:
        got.append(ev.n)

    try:
        await sub_bus.subscribe(subj, on_beat, types=Committed)
        await sub_bus.flush()  # the server knows the subscription before anyone publishes
        await pub_bus.publish(subj, Committed(n=1))
        await wait_for(lambda: got == [1], timeout_s=5, what="before the crash")
        nats_server.kill()
        await wait_for(lambda: not sub_bus.is_connected, timeout_s=5, what="the loss noticed")
        nats_server.start()
        t0 = time.monotonic()
        await wait_for(lambda: sub_bus.is_connected and pub_bus.is_connected, timeout_s=5,
                       what="both reconnected within seconds")
        await sub_bus.flush()  # the subscription is restored on the server
        await pub_bus.publish(subj, Committed(n=2))
        await wait_for(lambda: got == [1, 2], timeout_s=5, what="delivery after the restart")
        assert time.monotonic() - t0 < 5.0
    finally:
        await sub_bus.close()
        await pub_bus.close()
