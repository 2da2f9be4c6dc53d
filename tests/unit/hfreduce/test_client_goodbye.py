"""The goodbye a communicator not closed sends at exit or on GC: once, bounded, never from a
forked child, never after an uncaught exception (issue 47, point 5)."""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest

from fireflyer.hfreduce import client
from fireflyer.hfreduce.protocol import Bye, Channel


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    chan, peer = Channel(a), Channel(b)
    yield chan, peer
    chan.close()
    peer.close()


def test_goodbye_sends_bye_and_closes(pair) -> None:
    chan, peer = pair
    client._goodbye(chan, os.getpid())
    assert chan.closed
    assert isinstance(peer.recv(), Bye)
    assert peer.recv() is None  # then EOF


def test_a_forked_child_leaves_the_parents_socket_alone(pair) -> None:
    chan, peer = pair
    client._goodbye(chan, os.getpid() + 1)  # created by another process: this is its child
    assert not chan.closed
    peer.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        peer.sock.recv(1)  # nothing was sent


def test_an_uncaught_exception_is_not_a_clean_close(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    chan, peer = pair
    monkeypatch.setattr(sys, "last_value", RuntimeError("the script failed"), raising=False)
    client._goodbye(chan, os.getpid())
    assert chan.closed
    assert peer.recv() is None  # EOF without Bye: the worker reports the failure


def test_sys_exit_is_a_clean_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "last_value", SystemExit(3), raising=False)
    assert not client._exiting_from_uncaught_exception()


def test_a_peer_that_does_not_read_cannot_hang_the_goodbye(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    chan, _peer = pair
    monkeypatch.setattr(client, "GOODBYE_S", 0.2)
    assert chan._send_lock.acquire()  # another thread is stuck sending
    try:
        t0 = time.monotonic()
        client._goodbye(chan, os.getpid())
        assert time.monotonic() - t0 < 2.0
        assert chan.closed
    finally:
        chan._send_lock.release()
