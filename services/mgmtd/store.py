"""mgmtd's records in the KV: key layout, encoding, and reads/writes inside a transaction.

Keys follow 3FS's mgmtd (research/3fs.md §1): a 4-byte record prefix, then the id
packed order-preservingly (:func:`fireflyer.kv.keys.pack`), so each kind is one
contiguous, id-ordered range::

    SING ("lease",)              LeaseRecord             the primary's lease
    SING ("routing-version",)    uint64 big-endian       bumped with every change below
    NODE (node_id,)              NodeInfo
    TGIF (target_id,)            TargetInfo
    CHIF (chain_id,)             Chain
    CHIT (table_id, version)     ChainTable              every version is kept

Values are msgpack-encoded :mod:`fireflyer.mgmt.model` Structs.  Every function takes
an open :class:`~fireflyer.kv.Txn`; callers run them inside ``kv.run``/``kv.arun``, so a
routing change and its version bump commit together or not at all, and a writer that
reads the lease in the same transaction (``ensure_primary``) conflicts with a takeover.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import msgspec

from fireflyer.kv import Txn
from fireflyer.kv.keys import pack, prefix_range
from fireflyer.mgmt.model import Chain, ChainTable, LeaseRecord, NodeInfo, RoutingInfo, TargetInfo

__all__ = [
    "SING",
    "NODE",
    "TGIF",
    "CHIF",
    "CHIT",
    "LEASE_KEY",
    "VERSION_KEY",
    "load_lease",
    "save_lease",
    "load_version",
    "load_routing",
    "write_routing",
    "RoutingReader",
]

SING, NODE, TGIF, CHIF, CHIT = b"SING", b"NODE", b"TGIF", b"CHIF", b"CHIT"
LEASE_KEY = SING + pack(("lease",))
VERSION_KEY = SING + pack(("routing-version",))

T = TypeVar("T", bound=msgspec.Struct)
_enc = msgspec.msgpack.Encoder()
_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def _decode(data: bytes, cls: type[T]) -> T:
    dec = _decoders.get(cls)
    if dec is None:
        dec = _decoders[cls] = msgspec.msgpack.Decoder(cls)
    return dec.decode(data)  # type: ignore[no-any-return]


def node_key(node_id: str) -> bytes:
    return NODE + pack((node_id,))


def target_key(target_id: int) -> bytes:
    return TGIF + pack((target_id,))


def chain_key(chain_id: int) -> bytes:
    return CHIF + pack((chain_id,))


def table_key(table_id: int, version: int) -> bytes:
    return CHIT + pack((table_id, version))


def load_lease(txn: Txn, *, snapshot: bool = False) -> LeaseRecord | None:
    raw = txn.get(LEASE_KEY, snapshot=snapshot)
    return None if raw is None else _decode(raw, LeaseRecord)


def save_lease(txn: Txn, record: LeaseRecord) -> None:
    txn.set(LEASE_KEY, _enc.encode(record))


def load_version(txn: Txn, *, snapshot: bool = False) -> int:
    raw = txn.get(VERSION_KEY, snapshot=snapshot)
    return 0 if raw is None else int.from_bytes(raw, "big")


def _scan(txn: Txn, prefix: bytes, cls: type[T], snapshot: bool) -> tuple[T, ...]:
    begin, end = prefix_range(prefix)
    return tuple(_decode(v, cls) for _, v in txn.get_range(begin, end, snapshot=snapshot))


def load_routing(txn: Txn, *, snapshot: bool = False) -> RoutingInfo:
    """The whole routing info at the transaction's snapshot (ids ascending, as the keys sort)."""
    return RoutingInfo(
        version=load_version(txn, snapshot=snapshot),
        nodes=_scan(txn, NODE, NodeInfo, snapshot),
        targets=_scan(txn, TGIF, TargetInfo, snapshot),
        chains=_scan(txn, CHIF, Chain, snapshot),
        chain_tables=_scan(txn, CHIT, ChainTable, snapshot),
    )


K = TypeVar("K", bound=Hashable)


def _diff(txn: Txn, old: Iterable[T], new: Iterable[T], ident: Callable[[T], K],
          key: Callable[[K], bytes]) -> int:
    before = {ident(x): x for x in old}
    after = {ident(x): x for x in new}
    n = 0
    for i, rec in after.items():
        if before.get(i) != rec:
            txn.set(key(i), _enc.encode(rec))
            n += 1
    for i in before.keys() - after.keys():
        txn.clear(key(i))
        n += 1
    return n


def write_routing(txn: Txn, old: RoutingInfo, new: RoutingInfo) -> int:
    """Write the records of ``new`` that differ from ``old`` (read in this txn) and the version.

    Returns how many records were written or removed.
    """
    n = _diff(txn, old.nodes, new.nodes, lambda x: x.node_id, node_key)
    n += _diff(txn, old.targets, new.targets, lambda x: x.target_id, target_key)
    n += _diff(txn, old.chains, new.chains, lambda x: x.chain_id, chain_key)
    n += _diff(txn, old.chain_tables, new.chain_tables, lambda x: (x.table_id, x.version),
               lambda k: table_key(*k))
    if new.version != old.version:
        txn.set(VERSION_KEY, new.version.to_bytes(8, "big"))
    return n


class RoutingReader:
    """Reads routing info for GetRoutingInfo, re-reading the records only when the version moved.

    Any replica serves reads this way: one snapshot read of the version key per call,
    and the full scan only after a change.  Not thread safe; call :meth:`read` from one
    thread at a time (``kv.arun`` of it from one event loop is fine: a stale cache
    entry is only ever replaced by a newer one).
    """

    def __init__(self) -> None:
        self._cached: RoutingInfo | None = None

    def read(self, txn: Txn) -> RoutingInfo:
        cached = self._cached
        if cached is not None and load_version(txn, snapshot=True) == cached.version:
            return cached
        routing = load_routing(txn, snapshot=True)
        if cached is None or routing.version >= cached.version:
            self._cached = routing
        return routing
