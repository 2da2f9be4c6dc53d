"""storage's Prometheus metrics: data-plane throughput and this node's targets by chain state.

- ``ff_storage_write_bytes_total{op}``: payload bytes received by write ops (``write`` and
  ``batch_write`` from clients, ``update`` forwarded along a chain, ``sync_replace`` of a resync);
- ``ff_storage_read_bytes_total{op}``: bytes served (``read``, ``batch_read``; ``local``:
  bytes of short-circuit local reads, handed over as descriptors);
- ``ff_storage_targets{state}``: this node's targets by their public state in the routing it
  holds (serving, syncing, waiting, lastsrv, offline; ``none`` while in no chain).

The byte counters are bumped on the wire server's threads (prometheus_client's values are
thread-safe); the gauge is sampled on the loop at scrape time.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any

from fireflyer.storage.protocol import (
    OP_BATCH_READ,
    OP_BATCH_WRITE,
    OP_READ,
    OP_SYNC_REPLACE,
    OP_UPDATE,
    OP_WRITE,
)
from fireflyer.telemetry.metrics import ServiceMetrics

__all__ = ["StorageMetrics", "WRITE_OPS"]

#: data-plane op -> label of the bytes it receives
WRITE_OPS = {OP_WRITE: "write", OP_BATCH_WRITE: "batch_write", OP_UPDATE: "update", OP_SYNC_REPLACE: "sync_replace"}
_READ_OPS = {OP_READ: "read", OP_BATCH_READ: "batch_read", "local": "local"}


class StorageMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        written = metrics.counter("storage_write_bytes", "Payload bytes received by storage write ops", ("op",))
        read = metrics.counter("storage_read_bytes", "Bytes served by storage read ops", ("op",))
        # children bound once: the data plane's hot path only adds
        self._written = {op: written.labels(op=label) for op, label in WRITE_OPS.items()}
        self._read = {op: read.labels(op=label) for op, label in _READ_OPS.items()}
        self._targets = metrics.gauge("storage_targets", "This node's targets by public chain state", ("state",))
        self._seen_states: set[str] = set()

    def wrote(self, op: str, nbytes: int) -> None:
        child = self._written.get(op)
        if child is not None and nbytes > 0:
            child.inc(nbytes)

    def read(self, op: str, nbytes: int) -> None:
        if nbytes > 0:
            self._read[op].inc(nbytes)

    def set_targets(self, states: Iterable[Any]) -> None:
        """``states``: each local target's public state (None: in no chain)."""
        tally = Tally("none" if s is None else str(getattr(s, "name", s)).lower() for s in states)
        for state in self._seen_states - tally.keys():
            self._targets.labels(state=state).set(0)
        for state, n in tally.items():
            self._targets.labels(state=state).set(n)
        self._seen_states |= tally.keys()
