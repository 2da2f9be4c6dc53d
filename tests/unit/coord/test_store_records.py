"""coord's KV records (a 1,250-node record is cut into parts)."""

from __future__ import annotations

from pathlib import Path

from fireflyer.coord.model import JoinSpec
from fireflyer.coord.rendezvous import Rendezvous
from fireflyer.kv import open_kv
from services.coord.store import encode as encode_rec
from services.coord.store import load_all, save


def test_large_record_roundtrips_in_parts_and_shrinks(tmp_path: Path) -> None:
    rv = Rendezvous()
    out = None
    for i in range(1250):
        out = rv.join(JoinSpec(job="big", name="default", node=f"node{i}", zone=f"z{i % 2}", address=f"h{i}:1",
                               nnodes=1250), 0.0, 10.0)
    assert out is not None and out.formed is not None
    big = out.formed
    kv = open_kv(f"sqlite:///{tmp_path}/c.db")
    try:
        kv.run(lambda txn: save(txn, [encode_rec(big)]))
        [back] = kv.run(load_all)
        assert back == big
        big.members = big.members[:3]
        kv.run(lambda txn: save(txn, [encode_rec(big)]))  # fewer parts: the old ones are gone
        [back] = kv.run(load_all)
        assert len(back.members) == 3
    finally:
        kv.close()
