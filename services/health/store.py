"""The health service's records in the KV: key layout, encoding, reads and writes inside a transaction.

    SING ("next", kind)           uint64            the next incident / validation number
    NODE (name,)                  NodeHealth        each node's health state
    BASE (name,)                  Baseline          each node's throughputs from its first good runs
    INCI (id,)                    IncidentRecord    every incident (ids inc-<n>, in order)
    VALI (id,)                    ValidationRecord  every validation (ids val-<n>)

Values are msgpack-encoded Structs; ids carry a zero-padded number so key order is time order.
"""

from __future__ import annotations

from typing import TypeVar

from fireflyer.health.checks import Baseline
from fireflyer.health.records import IncidentRecord, ValidationRecord
from fireflyer.health.states import NodeHealth
from fireflyer.kv import Txn
from fireflyer.kv.keys import pack, prefix_range
from fireflyer.kv.records import decode as _decode
from fireflyer.kv.records import encode as _encode

__all__ = ["next_id", "load_node", "save_node", "load_nodes", "load_baseline", "save_baseline", "load_incident",
           "save_incident", "load_incidents", "load_validation", "save_validation", "load_validations"]

SING, NODE, BASE, INCI, VALI = b"SING", b"NODE", b"BASE", b"INCI", b"VALI"
T = TypeVar("T")


def next_id(txn: Txn, kind: str) -> str:
    """``inc-000001``, ``val-000001`` ...: never reused."""
    key = SING + pack(("next", kind))
    raw = txn.get(key)
    n = 1 if raw is None else int.from_bytes(raw, "big")
    txn.set(key, (n + 1).to_bytes(8, "big"))
    return f"{kind}-{n:06d}"


def _get(txn: Txn, prefix: bytes, ident: str, cls: type[T], snapshot: bool) -> T | None:
    raw = txn.get(prefix + pack((ident,)), snapshot=snapshot)
    return None if raw is None else _decode(raw, cls)


def _all(txn: Txn, prefix: bytes, cls: type[T], snapshot: bool) -> list[T]:
    begin, end = prefix_range(prefix)
    return [_decode(v, cls) for _, v in txn.get_range(begin, end, snapshot=snapshot)]


def load_node(txn: Txn, name: str, *, snapshot: bool = False) -> NodeHealth | None:
    return _get(txn, NODE, name, NodeHealth, snapshot)


def save_node(txn: Txn, h: NodeHealth) -> None:
    txn.set(NODE + pack((h.name,)), _encode(h))


def load_nodes(txn: Txn, *, snapshot: bool = False) -> list[NodeHealth]:
    return _all(txn, NODE, NodeHealth, snapshot)


def load_baseline(txn: Txn, name: str, *, snapshot: bool = False) -> Baseline | None:
    return _get(txn, BASE, name, Baseline, snapshot)


def save_baseline(txn: Txn, name: str, b: Baseline) -> None:
    txn.set(BASE + pack((name,)), _encode(b))


def load_incident(txn: Txn, ident: str, *, snapshot: bool = False) -> IncidentRecord | None:
    return _get(txn, INCI, ident, IncidentRecord, snapshot)


def save_incident(txn: Txn, inc: IncidentRecord) -> None:
    txn.set(INCI + pack((inc.id,)), _encode(inc))


def load_incidents(txn: Txn, *, snapshot: bool = False) -> list[IncidentRecord]:
    return _all(txn, INCI, IncidentRecord, snapshot)


def load_validation(txn: Txn, ident: str, *, snapshot: bool = False) -> ValidationRecord | None:
    return _get(txn, VALI, ident, ValidationRecord, snapshot)


def save_validation(txn: Txn, v: ValidationRecord) -> None:
    txn.set(VALI + pack((v.id,)), _encode(v))


def load_validations(txn: Txn, *, snapshot: bool = False) -> list[ValidationRecord]:
    return _all(txn, VALI, ValidationRecord, snapshot)
