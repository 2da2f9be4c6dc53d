"""NodeEngine across real processes: a node killed with SIGKILL mid-op.

Each node reports to the test over its *own* pipe.  (A shared ``multiprocessing.Queue``
made this test hang under load: its writers share one cross-process lock, and a node
SIGKILLed while its queue feeder thread held that lock left it held forever, so no
survivor could report its error -- "survivors that never raised: {0, 2, 3}".)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

CTX = mp.get_context("spawn")
#: ops each node reports before the kill (after that only its error: the victim dies silent)
WARM_OPS = 3


def node_main(rank: int, n: int, ports: Any, barrier: Any, out: Connection) -> None:
    """One node: allreduce 4 MiB back to back until something fails; report the first ops and the error."""
    from fireflyer.hfreduce.engine import NodeEngine
    from fireflyer.hfreduce.types import Fingerprint

    srv = socket.create_server(("127.0.0.1", 0))
    ports[rank] = srv.getsockname()[1]
    barrier.wait()
    addrs = [f"127.0.0.1:{ports[i]}" for i in range(n)]
    eng = NodeEngine(node_rank=rank, addresses=addrs, listen=srv, chunk_bytes=256 << 10, timeout_s=30,
                     token="t")
    eng.start(20)
    work = np.ones(1 << 20, dtype=np.float32)
    i = 0
    try:
        while True:
            work[:] = rank
            eng.allreduce(work, "sum", Fingerprint("kill", i, "sum", "float32", work.size))
            assert work[0] == n * (n - 1) / 2
            if i < WARM_OPS:
                out.send(("op", i, 0.0, {}))
            i += 1
    except Exception as e:  # noqa: BLE001 - reported to the test
        fields = dict(getattr(e, "fields", {}))
        fields["message"] = str(e)
        out.send(("err", type(e).__name__, time.time(), fields))
    finally:
        eng.close()
        out.close()


def test_killed_node_is_named_by_every_survivor() -> None:
    n, victim = 4, 1
    ports = CTX.Array("i", n)
    barrier = CTX.Barrier(n)
    pipes = [CTX.Pipe(duplex=False) for _ in range(n)]
    procs = [CTX.Process(target=node_main, args=(r, n, ports, barrier, pipes[r][1]), daemon=True)
             for r in range(n)]
    for p in procs:
        p.start()
    for _, w in pipes:
        w.close()  # the children hold the write ends: EOF here when a child is gone
    readers = {pipes[r][0]: r for r in range(n)}
    try:
        done = [0] * n
        deadline = time.monotonic() + 60
        while min(done) < WARM_OPS:
            ready = wait(list(readers), timeout=max(0.0, deadline - time.monotonic()))
            assert ready, f"nodes never finished {WARM_OPS} ops: done={done}"
            for conn in ready:
                kind, *rest = conn.recv()
                assert kind == "op", rest
                done[readers[conn]] += 1  # type: ignore[index]
        os.kill(procs[victim].pid, signal.SIGKILL)
        t_kill = time.time()
        errors: dict[int, tuple[str, float, dict[str, Any]]] = {}
        live = {c: r for c, r in readers.items() if r != victim}
        limit = time.monotonic() + 15  # far above the 3 s asserted below: a hang, not slowness, trips it
        while len(errors) < n - 1:
            ready = wait([c for c, r in live.items() if r not in errors],
                         timeout=max(0.0, limit - time.monotonic()))
            if not ready:
                raise AssertionError(f"survivors that never raised: {set(live.values()) - set(errors)}")
            for conn in ready:
                rank = live[conn]  # type: ignore[index]
                try:
                    kind, name, when, fields = conn.recv()
                except EOFError:
                    raise AssertionError(f"node {rank} exited without reporting an error "
                                         f"(exit code {procs[rank].exitcode})") from None
                assert kind == "err", (rank, kind, name)
                errors[rank] = (name, when, fields)
        for rank, (name, when, fields) in errors.items():
            assert when - t_kill < 3.0, (rank, name, when - t_kill)
            assert name in ("PeerLost", "CollectiveAborted"), (rank, name, fields)
            culprit = fields["peer"] if name == "PeerLost" else fields["culprit"]
            assert culprit == victim, (rank, name, fields)
            assert f"node {victim}" in fields["message"]
        assert any(name == "PeerLost" for name, _, _ in errors.values())
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        for r, _ in pipes:
            r.close()
    assert all(p.exitcode is not None for p in procs)
