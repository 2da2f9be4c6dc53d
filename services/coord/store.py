"""coord's records in the KV: one communicator's current generation under one key prefix.

    COMM (job, name, part)   bytes part of the msgpack CommRecord (part = 0, 1, ...)

A record of a large communicator (1,250 nodes is ~120 KB) is over the KV's 100 KB
value limit (as FoundationDB's), so it is cut into parts of at most ``PART_BYTES``;
a write clears the communicator's range first, all in one transaction.

Only generations that formed are written (active, then aborted or ended): a
forming generation's joins are RPCs in flight, which a coord restart ends anyway.
Heartbeat times are not written (they change every second and a restarted coord
counts every member as seen at start).  A restarted coord reads every record back
(:func:`load_all`), so Get/List keep answering and the next generation of a
communicator continues the numbering.
"""

from __future__ import annotations

import msgspec

from fireflyer.coord.model import CommRecord
from fireflyer.kv import KV, Txn
from fireflyer.kv.keys import pack, prefix_range, unpack

__all__ = ["COMM", "PART_BYTES", "comm_key", "encode", "load_all", "save", "CoordStore"]

COMM = b"COMM"
PART_BYTES = 90_000
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(CommRecord)


def comm_key(job: str, name: str) -> bytes:
    """The prefix of one communicator's parts."""
    return COMM + pack((job, name))


def encode(rec: CommRecord) -> tuple[bytes, bytes]:
    return comm_key(rec.job, rec.name), _enc.encode(rec)


def load_all(txn: Txn) -> list[CommRecord]:
    begin, end = prefix_range(COMM)
    parts: dict[tuple[object, ...], list[bytes]] = {}
    for k, v in txn.get_range(begin, end, snapshot=True):
        job, name, _part = unpack(k[len(COMM):])
        parts.setdefault((job, name), []).append(v)  # keys sort by part number
    return [_dec.decode(b"".join(chunks)) for chunks in parts.values()]


def save(txn: Txn, items: list[tuple[bytes, bytes]]) -> None:
    for prefix, data in items:
        txn.clear_range(*prefix_range(prefix))
        for i in range(0, max(len(data), 1), PART_BYTES):
            txn.set(prefix + pack((i // PART_BYTES,)), data[i:i + PART_BYTES])


class CoordStore:
    """Async reads/writes of the records; writes are encoded at call time and applied in call order."""

    def __init__(self, kv: KV) -> None:
        import asyncio

        self.kv = kv
        self._lock = asyncio.Lock()

    async def load(self) -> list[CommRecord]:
        return await self.kv.arun(load_all)  # type: ignore[no-any-return]

    async def save(self, records: list[CommRecord]) -> None:
        if not records:
            return
        items = list({k: v for k, v in (encode(r) for r in records)}.items())  # snapshot now, last wins
        async with self._lock:
            await self.kv.arun(lambda txn: save(txn, items))
