"""A real nats-server run with the config ``ff up`` writes (fireflyer.cluster.natsauth): the Bus
connects with credentials derived from its token, a user stays in its namespace and request/reply
works through its own inbox, and ``sync_nats_auth`` (what ``ff admin users`` calls) makes the server
refuse a revoked token at its next connect.  A server without auth ignores the credentials."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from fireflyer.bus import Bus
from fireflyer.bus.events import Event
from fireflyer.bus.server import NatsServerProcess
from fireflyer.bus.subjects import owned, subject
from fireflyer.cluster.natsauth import sync_nats_auth, write_nats_config
from fireflyer.core.errors import DeadlineExceeded, Unavailable
from fireflyer.rpc.auth import TokenEntry
from fireflyer.testing.nats import fast_nats_settings
from fireflyer.testing.poll import wait_for


class Ping(Event, tag="test.auth.ping.v1"):
    n: int


class Pong(Event, tag="test.auth.pong.v1"):
    n: int


SVC = TokenEntry(token="svc-secret-token", user="svc-echo", roles=["service"])
BOB = TokenEntry(token_sha256=hashlib.sha256(b"bob-secret-token").hexdigest(), user="bob")


@pytest.fixture
def auth_nats(tmp_path: Path) -> Iterator[NatsServerProcess]:
    conf = write_nats_config(tmp_path, [SVC, BOB])
    srv = NatsServerProcess(store_dir=tmp_path / "store", config_file=conf, pid_file=tmp_path / "nats.pid")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


async def test_user_and_service_on_an_auth_server(auth_nats: NatsServerProcess) -> None:
    settings = fast_nats_settings(auth_nats.url)
    with pytest.raises(Unavailable) as anon:
        await Bus.connect(settings, name="anon", wait_s=2.0)
    assert "Authorization" in str(anon.value)

    svc = await Bus.connect(settings, name="svc", token=SVC.token)
    bob = await Bus.connect(settings, name="bob", token="bob-secret-token")
    try:
        # a service answers requests in bob's namespace; bob's reply comes back on his own inbox
        subj = owned("bob", subject("test", "svc", "x", "ping"))

        async def answer(ev: Ping, msg: object) -> Pong:
            return Pong(n=ev.n + 1)

        await svc.serve(subj, answer, types=Ping)
        await svc.flush()

        async def answered() -> Pong | None:
            # (a server under load has been seen to answer "no responders" right after the flush)
            try:
                return await bob.request(subj, Ping(n=1), reply_types=Pong, timeout_s=2.0)
            except Unavailable:
                return None
        reply = await wait_for(answered, timeout_s=10, interval_s=0.2, what="the service's answer")
        assert reply.n == 2
        await svc.ensure_stream("FF_TEST", ["ff.test.v1.>"])
        assert (await svc.js.stream_info("FF_TEST")).config.name == "FF_TEST"
        # outside his namespace bob's requests never reach anyone
        with pytest.raises((DeadlineExceeded, Unavailable)):
            await bob.request(subject("test", "svc", "x", "ping"), Ping(n=1), reply_types=Pong, timeout_s=1.0)
    finally:
        await bob.close()
        await svc.close()


async def test_sync_nats_auth_reloads_the_server(auth_nats: NatsServerProcess, tmp_path: Path) -> None:
    settings = fast_nats_settings(auth_nats.url)
    b = await Bus.connect(settings, name="bob", token="bob-secret-token")
    await b.close()
    revoked = msgspec.structs.replace(BOB, revoked=True)
    assert sync_nats_auth(tmp_path / "tokens.json", [SVC, revoked])

    async def refused() -> bool:
        try:
            c = await Bus.connect(settings, name="bob", token="bob-secret-token", wait_s=1.0)
        except Unavailable:
            return True
        await c.close()
        return False

    await wait_for(refused, timeout_s=10, interval_s=0.1, what="the revoked token refused")
    s = await Bus.connect(settings, name="svc", token=SVC.token)
    await s.close()


async def test_a_server_without_auth_ignores_the_credentials(nats_server: NatsServerProcess) -> None:
    b = await Bus.connect(fast_nats_settings(nats_server.url), name="any", token="whatever")
    try:
        sub_got: list[Ping] = []

        async def on(ev: Ping, msg: object) -> None:
            sub_got.append(ev)

        await b.subscribe(">", on, types=Ping)
        await b.publish(subject("test", "x", "y", "z"), Ping(n=3))
        await wait_for(lambda: sub_got, timeout_s=5, what="the message")
    finally:
        await b.close()
