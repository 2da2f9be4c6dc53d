"""Micro-benchmark: small read-modify-write transactions per second from N threads.

``bench_kv(url, clients=8, ops=2000)`` runs ``ops`` transactions spread over
``clients`` threads; each reads and rewrites its own client's counter key and
reads a shared key snapshot-free (the shape of a meta ``stat`` + ``setattr``), so
conflicts are rare and the figure measures the backend's commit path.  Returns one
dict (print it as JSON); quote ratios between backends, not absolute numbers.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from fireflyer.kv.api import Txn, open_kv
from fireflyer.kv.keys import pack

__all__ = ["bench_kv"]


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
