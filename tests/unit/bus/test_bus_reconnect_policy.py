"""The reconnect policy Bus hands to nats-py: which server next, and after how long."""

from __future__ import annotations

from urllib.parse import urlparse

from nats.aio.client import Client, Server

from fireflyer.bus import Bus
from fireflyer.core.config import NatsSettings


def test_reconnect_prefers_the_least_failed_server_and_backs_off_exponentially() -> None:
    settings = NatsSettings(
        url="nats://a:4222,nats://b:4222", reconnect_wait_s=0.25, max_reconnect_wait_s=5.0
    )
    bus = Bus(Client(), settings, "unit")
    a = Server(uri=urlparse("nats://a:4222"), reconnects=3)
    b = Server(uri=urlparse("nats://b:4222"), reconnects=1)
    chosen, delay = bus._pick_server([a, b], {})
    assert chosen is b
    assert 0.5 * 0.8 <= delay <= 0.5 * 1.2  # 0.25 * 2**1, +-20% jitter

    fresh = Server(uri=urlparse("nats://a:4222"), reconnects=0)
    assert bus._pick_server([fresh], {})[1] <= 0.25 * 1.2  # first retry comes quickly
    worn = Server(uri=urlparse("nats://a:4222"), reconnects=40)
    assert bus._pick_server([worn], {})[1] <= 5.0 * 1.2  # capped at max_reconnect_wait_s
