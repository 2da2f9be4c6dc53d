"""Helpers for the wire tests: servers on port 0 that stop at teardown, raw peers, log lookups."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fireflyer.wire import Connection, WireServer
from fireflyer.wire.frame import (
    PREFIX,
    FrameLimits,
    Header,
    Hello,
    Welcome,
    decode_header,
    encode_head,
    parse_prefix,
)

TOKEN = "tok-alice"


def authenticate(token: str) -> str | None:
    return {"tok-alice": "alice", "tok-bob": "bob"}.get(token)


@pytest.fixture
def wire_server() -> Iterator[Callable[..., WireServer]]:
    """``wire_server(handler, **kw)`` -> a started server; all are stopped at teardown."""
    started: list[WireServer] = []

    def make(handler: Callable[..., Any], **kw: Any) -> WireServer:
        kw.setdefault("authenticate", authenticate)
        server = WireServer(handler, **kw)
        server.start()
        started.append(server)
        return server

    yield make
    for s in started:
        s.stop(timeout_s=2)


@pytest.fixture
def connect() -> Iterator[Callable[..., Connection]]:
    """``connect(server, **kw)`` -> a Connection closed at teardown."""
    conns: list[Connection] = []

    def make(server: WireServer, **kw: Any) -> Connection:
        kw.setdefault("token", TOKEN)
        kw.setdefault("timeout_s", 5.0)
        conn = Connection.connect("127.0.0.1", server.port, **kw)
        conns.append(conn)
        return conn

    yield make
    for c in conns:
        c.close()


@pytest.fixture
def wire_logs(caplog: pytest.LogCaptureFixture) -> Callable[[str], list[dict[str, Any]]]:
    """``wire_logs("wire.frame_rejected")`` -> the fields of each such record so far."""
    caplog.set_level(logging.DEBUG, logger="fireflyer.wire")

    def records(event: str) -> list[dict[str, Any]]:
        return [dict(r.ff_fields) for r in list(caplog.records) if getattr(r, "ff_event", None) == event]

    return records


class RawPeer:
    """A hand-driven client socket, for sending frames a real Connection never would."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def hello(self, token: str = TOKEN) -> Header:
        self.sock.sendall(encode_head(Hello(token=token), 0))
        header, _ = self.read_frame()
        assert isinstance(header, Welcome), header
        return header

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError(f"closed with {len(self.buf)} of {n} bytes")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_frame(self) -> tuple[Header, bytes]:
        hlen, plen = parse_prefix(self._read(PREFIX.size), FrameLimits())
        header = decode_header(self._read(hlen))
        return header, self._read(plen)

    def wait_closed(self) -> None:
        """Read (and drop) until the server closes the connection; fails on timeout."""
        try:
            while self.sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            pass  # closed with our bytes unread: the kernel resets instead of a FIN

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_peer() -> Iterator[Callable[[int], RawPeer]]:
    peers: list[RawPeer] = []

    def make(port: int) -> RawPeer:
        p = RawPeer(port)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()
