"""pytest fixtures for a real NATS: a ``nats-server`` per test and a connected Bus.

    async def test_roundtrip(bus, nats_server, unique_subject_prefix):
        subj = f"{unique_subject_prefix}.hello"
        ...
        nats_server.restart()      # fault injection: JetStream state survives
        nats_server.kill()         # kill -9

Each test gets its own server on a free port (``--port -1``, the port read back
from the log) with JetStream stored under ``tmp_path``, so tests never share
state and ``pytest -n auto`` is safe.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fireflyer.bus.connection import Bus
from fireflyer.bus.server import NatsServerProcess
from fireflyer.core.config import NatsSettings

__all__ = [
    "nats_server",
    "nats_settings",
    "bus",
    "unique_domain",
    "unique_subject_prefix",
    "unique_name",
    "start_nats_server",
    "fast_nats_settings",
]


def unique_name(prefix: str = "t") -> str:
    """A token unique to this call, valid in subjects and stream/consumer names."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def start_nats_server(store_dir: Path) -> NatsServerProcess:
    """Start a JetStream-enabled server on a free port, storing under ``store_dir``."""
    srv = NatsServerProcess(store_dir=store_dir)
    srv.start()
    return srv


def fast_nats_settings(url: str) -> NatsSettings:
    """Settings tuned for tests: quick reconnects, so a restarted server is found fast."""
    return NatsSettings(
        url=url,
        connect_timeout_s=2.0,
        reconnect_wait_s=0.05,
        max_reconnect_wait_s=0.5,
        max_reconnect_attempts=-1,
        drain_timeout_s=2.0,
    )


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A real nats-server with JetStream in ``tmp_path``; stopped after the test."""
    srv = start_nats_server(tmp_path / "nats")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def nats_settings(nats_server: NatsServerProcess) -> NatsSettings:
    """:class:`NatsSettings` pointing at :func:`nats_server`, with fast reconnects."""
    return fast_nats_settings(nats_server.url)


@pytest.fixture
async def bus(nats_settings: NatsSettings) -> AsyncIterator[Bus]:
    """A :class:`Bus` connected to :func:`nats_server`; closed after the test."""
    b = await Bus.connect(nats_settings, name="pytest")
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
def unique_domain() -> str:
    """A subject domain token no other test uses: ``subject(unique_domain, "node", "n1", "hb")``."""
    return unique_name("t")


@pytest.fixture
def unique_subject_prefix(unique_domain: str) -> str:
    """``ff.<unique_domain>``: prefix for hand-written subjects no other test uses."""
    return f"ff.{unique_domain}"
