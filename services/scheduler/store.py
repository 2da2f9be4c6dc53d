"""The scheduler's records in the KV: key layout, encoding, and reads/writes inside a transaction.

    SING ("lease",)                 LeaseRecord     the leader's lease (fireflyer.mgmt.lease rules)
    SING ("next-id",)               uint64          the next run id (ids are never reused)
    RUN_ (run_id,)                  RunRecord       every run ever made
    ACTV (run_id,)                  b""             runs not finished (what a cycle reads)
    CHAN (chain_id, run_id)         b""             the runs of each chain
    NODE (name,)                    NodeRecord
    QUOT (owner, group, priority)   Quota
    CRED (chain_id,)                bytes           the submitter's token, the ranks' FF_TOKEN (never in a reply)

Values are msgpack-encoded Structs.  Every function takes an open transaction, so a change and
its indexes commit together or not at all.
"""

from __future__ import annotations

from typing import Any

from fireflyer.kv import Txn
from fireflyer.kv.keys import pack, prefix_range, unpack
from fireflyer.kv.records import decode as _decode
from fireflyer.kv.records import encode as _encode
from fireflyer.mgmt.model import LeaseRecord
from fireflyer.sched.model import FINISHED, Quota
from fireflyer.sched.records import NodeRecord, RunRecord

__all__ = ["load_lease", "save_lease", "next_id", "load_run", "save_run", "active_runs", "chain_runs",
           "all_runs", "load_node", "save_node", "load_nodes", "load_quotas", "save_quota", "clear_quota",
           "save_credential", "load_credential", "clear_credential"]

SING, RUN, ACTV, CHAN, NODE, QUOT, CRED = b"SING", b"RUN_", b"ACTV", b"CHAN", b"NODE", b"QUOT", b"CRED"
LEASE_KEY = SING + pack(("lease",))
NEXT_ID_KEY = SING + pack(("next-id",))



def load_lease(txn: Txn, *, snapshot: bool = False) -> LeaseRecord | None:
    raw = txn.get(LEASE_KEY, snapshot=snapshot)
    return None if raw is None else _decode(raw, LeaseRecord)


def save_lease(txn: Txn, record: LeaseRecord) -> None:
    txn.set(LEASE_KEY, _encode(record))


def next_id(txn: Txn) -> int:
    raw = txn.get(NEXT_ID_KEY)
    n = 1 if raw is None else int.from_bytes(raw, "big")
    txn.set(NEXT_ID_KEY, (n + 1).to_bytes(8, "big"))
    return n


def load_run(txn: Txn, run_id: int, *, snapshot: bool = False) -> RunRecord | None:
    raw = txn.get(RUN + pack((run_id,)), snapshot=snapshot)
    return None if raw is None else _decode(raw, RunRecord)


def save_run(txn: Txn, rec: RunRecord) -> None:
    t = rec.task
    txn.set(RUN + pack((t.id,)), _encode(rec))
    txn.set(CHAN + pack((t.chain_id, t.id)), b"")
    if t.chain_status == FINISHED:
        txn.clear(ACTV + pack((t.id,)))
    else:
        txn.set(ACTV + pack((t.id,)), b"")


def _ids(txn: Txn, prefix: bytes, snapshot: bool) -> list[tuple[Any, ...]]:
    begin, end = prefix_range(prefix)
    return [unpack(k[len(prefix):]) for k, _ in txn.get_range(begin, end, snapshot=snapshot)]


def active_runs(txn: Txn, *, snapshot: bool = False) -> list[RunRecord]:
    out = []
    for (run_id,) in _ids(txn, ACTV, snapshot):
        rec = load_run(txn, int(run_id), snapshot=snapshot)  # type: ignore[arg-type]
        if rec is not None:
            out.append(rec)
    return out


def chain_runs(txn: Txn, chain_id: int, *, snapshot: bool = False) -> list[RunRecord]:
    out = []
    for (run_id,) in _ids(txn, CHAN + pack((chain_id,)), snapshot):
        rec = load_run(txn, int(run_id), snapshot=snapshot)  # type: ignore[arg-type]
        if rec is not None:
            out.append(rec)
    return out


def all_runs(txn: Txn, *, snapshot: bool = True) -> list[RunRecord]:
    begin, end = prefix_range(RUN)
    return [_decode(v, RunRecord) for _, v in txn.get_range(begin, end, snapshot=snapshot)]


def load_node(txn: Txn, name: str, *, snapshot: bool = False) -> NodeRecord | None:
    raw = txn.get(NODE + pack((name,)), snapshot=snapshot)
    return None if raw is None else _decode(raw, NodeRecord)


def save_node(txn: Txn, node: NodeRecord) -> None:
    txn.set(NODE + pack((node.name,)), _encode(node))


def load_nodes(txn: Txn, *, snapshot: bool = False) -> list[NodeRecord]:
    begin, end = prefix_range(NODE)
    return [_decode(v, NodeRecord) for _, v in txn.get_range(begin, end, snapshot=snapshot)]


def _quota_key(owner: str, group: str, priority: int) -> bytes:
    return QUOT + pack((owner, group, priority))


def load_quotas(txn: Txn, *, snapshot: bool = False) -> list[Quota]:
    begin, end = prefix_range(QUOT)
    return [_decode(v, Quota) for _, v in txn.get_range(begin, end, snapshot=snapshot)]


def save_quota(txn: Txn, q: Quota) -> None:
    txn.set(_quota_key(q.owner, q.group, int(q.priority)), _encode(q))


def clear_quota(txn: Txn, owner: str, group: str, priority: int) -> bool:
    key = _quota_key(owner, group, priority)
    if txn.get(key) is None:
        return False
    txn.clear(key)
    return True


def save_credential(txn: Txn, chain_id: int, token: str) -> None:
    txn.set(CRED + pack((chain_id,)), token.encode())


def load_credential(txn: Txn, chain_id: int, *, snapshot: bool = False) -> str:
    raw = txn.get(CRED + pack((chain_id,)), snapshot=snapshot)
    return "" if raw is None else bytes(raw).decode()


def clear_credential(txn: Txn, chain_id: int) -> None:
    txn.clear(CRED + pack((chain_id,)))
