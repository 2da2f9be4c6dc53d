"""``ff bench kv``: small read-modify-write transactions per second from N threads.

    ff bench kv --url sqlite:////tmp/kv.db --clients 8 --ops 2000 --json

``bench_kv(url, clients=8, ops=2000)`` runs ``ops`` transactions spread over
``clients`` threads; each reads and rewrites its own client's counter key and
reads a shared key snapshot-free (the shape of a meta ``stat`` + ``setattr``), so
conflicts are rare and the figure measures the backend's commit path.  Returns one
dict (print it as JSON); quote ratios between backends, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from fireflyer.bench._jsonout import add_json_option, emit
from fireflyer.kv import Txn, open_kv
from fireflyer.kv.keys import pack

__all__ = ["bench_kv", "main"]


def bench_kv(url: str, clients: int = 8, ops: int = 2000, **options: Any) -> dict[str, Any]:
    kv = open_kv(url, **options)
    try:
        run_id = os.urandom(4).hex()
        shared = pack(("bench", run_id, "shared"))
        kv.run(lambda t: t.set(shared, b"x"))
        per_client = max(ops // clients, 1)
        errors: list[BaseException] = []

        def client(i: int) -> None:
            key = pack(("bench", run_id, "c", i))

            def txn(t: Txn) -> None:
                t.get(shared)
                n = int.from_bytes(t.get(key) or b"\0", "big")
                t.set(key, (n + 1).to_bytes(8, "big"))

            try:
                for _ in range(per_client):
                    kv.run(txn, max_retries=100)
            except BaseException as e:  # reported, not swallowed
                errors.append(e)

        before = kv.stats.as_dict()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        after = kv.stats.as_dict()
        total = per_client * clients
        return {
            "bench": "kv_small_txn",
            "backend": kv.backend,
            "clients": clients,
            "txns": total,
            "seconds": round(elapsed, 4),
            "txn_per_s": round(total / elapsed, 1),
            "conflicts": after["conflicts"] - before["conflicts"],
            "retries": after["retries"] - before["retries"],
            "cpu_count": os.cpu_count(),
        }
    finally:
        kv.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ff bench kv", description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--url", default=None, help="KV to measure (default: a fresh SQLite file in the temp dir)")
    p.add_argument("--clients", type=int, default=8, help="client threads (default 8)")
    p.add_argument("--ops", type=int, default=2000, help="transactions in all (default 2000)")
    add_json_option(p)
    ns = p.parse_args(argv)
    if ns.clients < 1 or ns.ops < 1:
        p.error("--clients and --ops must be >= 1")
    if ns.url:
        result = bench_kv(ns.url, clients=ns.clients, ops=ns.ops)
    else:
        with tempfile.TemporaryDirectory(prefix="ff-bench-kv-") as d:
            result = bench_kv(f"sqlite:///{d}/kv.db", clients=ns.clients, ops=ns.ops)
    return emit(ns.json, result, lambda: print(json.dumps(result, indent=2)))


if __name__ == "__main__":
    raise SystemExit(main())
