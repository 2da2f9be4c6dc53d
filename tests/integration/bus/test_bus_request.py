"""Request/reply over a real nats-server: typed replies, typed errors, deadlines."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from fireflyer.bus import Bus, Event, subject
from fireflyer.core.errors import (
    DeadlineExceeded,
    FireFlyerError,
    Internal,
    NotFound,
    ProtocolError,
    Unavailable,
)
from fireflyer.testing.poll import wait_for


class Lookup(Event, tag="bustest.lookup.v1"):
    key: str


class Found(Event, tag="bustest.found.v1"):
    key: str
    value: int


async def serve_lookup(bus: Bus, subj: str, *, queue: str | None = None) -> list[str]:
    seen: list[str] = []

    async def handler(req: Lookup, msg: Msg) -> Found:
        seen.append(req.key)
        if req.key == "missing":
            raise NotFound(f"no key {req.key}", key=req.key, shard=3)
        if req.key == "boom":
            raise RuntimeError("disk on fire")
        if req.key == "slow":
            await asyncio.Event().wait()  # never answers
        if req.key == "bad-reply":
            return "not an event"  # type: ignore[return-value]
        return Found(key=req.key, value=len(req.key))

    await bus.serve(subj, handler, types=Lookup, queue=queue)
    return seen


async def test_request_gets_a_typed_reply(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")
    await serve_lookup(bus, subj)
    reply = await bus.request(subj, Lookup(key="abc"), reply_types=Found, timeout_s=2)
    assert reply == Found(key="abc", value=3, event_id=reply.event_id, sent_at=reply.sent_at)


async def test_handler_errors_come_back_typed_with_fields(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")
    await serve_lookup(bus, subj)
    with pytest.raises(NotFound) as ei:
        await bus.request(subj, Lookup(key="missing"), reply_types=Found, timeout_s=2)
    assert ei.value.fields == {"key": "missing", "shard": 3}
    assert "no key missing" in str(ei.value)

    with pytest.raises(Internal, match="RuntimeError: disk on fire"):
        await bus.request(subj, Lookup(key="boom"), reply_types=Found, timeout_s=2)
    with pytest.raises(Internal, match="non-event"):
        await bus.request(subj, Lookup(key="bad-reply"), reply_types=Found, timeout_s=2)
    assert bus.stats.handler_errors_total == 2


async def test_timeout_is_deadline_exceeded(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")
    await serve_lookup(bus, subj)
    with pytest.raises(DeadlineExceeded, match="within 0.2s"):
        await bus.request(subj, Lookup(key="slow"), reply_types=Found, timeout_s=0.2)


async def test_no_responders_is_unavailable(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")
    with pytest.raises(Unavailable, match="no service is serving") as ei:
        await bus.request(subj, Lookup(key="a"), reply_types=Found, timeout_s=2)
    assert ei.value.fields["subject"] == subj


async def test_malformed_request_gets_a_protocol_error_and_server_keeps_serving(
    bus: Bus, unique_domain: str
) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")
    seen = await serve_lookup(bus, subj)
    with pytest.raises(ProtocolError, match="malformed event"):
        await bus.request(subj, Found(key="wrong type", value=0), reply_types=Found, timeout_s=2)
    raw = await bus.nc.request(subj, b"\x00garbage", timeout=2)
    assert raw.headers and "Ff-Error" in raw.headers
    await bus.nc.publish(subj, b'{"type":"bustest.lookup.v1","key":"no-reply-subject"}')
    assert (await bus.request(subj, Lookup(key="ok"), reply_types=Found, timeout_s=2)).value == 2
    await wait_for(lambda: bus.stats.malformed_total == 3, timeout_s=5, what="3 malformed")
    assert seen == ["ok"]


async def test_reply_of_the_wrong_type_is_a_protocol_error(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")
    await serve_lookup(bus, subj)
    with pytest.raises(ProtocolError):
        await bus.request(subj, Lookup(key="abc"), reply_types=Lookup, timeout_s=2)


async def test_queue_group_spreads_requests_over_replicas(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")
    one = await serve_lookup(bus, subj, queue="kv")
    two = await serve_lookup(bus, subj, queue="kv")
    for i in range(40):
        await bus.request(subj, Lookup(key=f"k{i}"), reply_types=Found, timeout_s=2)
    assert len(one) + len(two) == 40
    assert one and two


async def test_error_root_is_preserved_for_unknown_kinds(bus: Bus, unique_domain: str) -> None:
    subj = subject(unique_domain, "kv", "0", "lookup")

    async def handler(req: Lookup, msg: Msg) -> Found:
        raise FireFlyerError("plain root error", where="here")

    await bus.serve(subj, handler, types=Lookup)
    with pytest.raises(FireFlyerError, match="plain root error") as ei:
        await bus.request(subj, Lookup(key="a"), reply_types=Found, timeout_s=2)
    assert ei.value.fields == {"where": "here"}
