"""Calls from this storage node to others: the CRAQ ``forward`` and the resync/remove ops.

A :class:`~fireflyer.storage.client_min.ConnectionPool` (shared with the client) holds
:class:`fireflyer.wire.Connection` s per peer address.  A wire server handles the
requests of one connection one after another, and a forwarding head holds the chunk
lock until its successor answers, so each call takes a connection *exclusively* from the
pool (a new one when none is idle, up to ``max_per_peer``): updates of different chunks
travel in parallel instead of queueing behind one slow chunk.

Timeouts are explicit: ``connect_timeout_s`` for a new connection, ``request_timeout_s``
per call.  A call that fails with Unavailable or DeadlineExceeded closes its connection
(the stream may be mid-frame) and re-raises; :class:`~fireflyer.storage.craq.Replica`
retries with backoff, re-reading the chain each time, so a dead or stopped successor is
skipped as soon as mgmtd moves it out.  Errors the successor raised on purpose
(VersionGap, ChainVersionMismatch, ...) arrive typed and leave the connection in the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from fireflyer.storage import UpdateAck, UpdateReq
from fireflyer.storage.client_min import ConnectionPool
from fireflyer.storage.protocol import OP_UPDATE, UpdateMsg, to_meta
from fireflyer.wire import Reply

__all__ = ["ConnectionPool", "Forwarder"]

Buffer = bytes | bytearray | memoryview


class Forwarder:
    """``forward(target, UpdateReq, payload) -> UpdateAck`` over the pool, addresses from routing."""

    def __init__(self, pool: ConnectionPool, address_of: Callable[[int], tuple[str, int]]) -> None:
        self.pool = pool
        self.address_of = address_of

    def __call__(self, target: int, req: UpdateReq, payload: Buffer) -> UpdateAck:
        reply = self.pool.call(self.address_of(target), OP_UPDATE, payload if len(payload) else None,
                               meta=to_meta(UpdateMsg(target=target, req=req)))
        return msgspec.convert(reply.meta, UpdateAck)

    def call(self, target: int, op: str, payload: Any = None, *, meta: dict[str, Any],
             timeout_s: float | None = None) -> Reply:
        return self.pool.call(self.address_of(target), op, payload, meta=meta, timeout_s=timeout_s)
