"""Helpers for the NodeEngine tests: N engines on 127.0.0.1 in threads of this process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fireflyer.hfreduce.engine import NodeEngine
from fireflyer.hfreduce.express import XOp
from fireflyer.hfreduce.types import Fingerprint


def make_engines(n: int, *, zones: Sequence[str] | None = None, chunk_bytes: int = 4096,
                 timeout_s: float = 10.0, start: bool = True, tokens: Sequence[str] | None = None,
                 skip: Sequence[int] = (), **engine_kw: Any) -> list[NodeEngine]:
    """``n`` engines with listeners bound to port 0; started concurrently unless ``start`` is False.

    Nodes in ``skip`` get an address but no engine (their port is bound and closed:
    connecting to it is refused); their slot in the returned list is ``None``.
    ``engine_kw`` goes to every :class:`NodeEngine`.
    """
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    engines: list[Any] = []
    for i in range(n):
        if i in skip:
            listeners[i].close()
            engines.append(None)
            continue
        engines.append(NodeEngine(node_rank=i, addresses=addrs, zones=zones, listen=listeners[i],
                                  chunk_bytes=chunk_bytes, timeout_s=timeout_s,
                                  token=tokens[i] if tokens else "secret", **engine_kw))
    if start:
        errs = run_all([(lambda e=e: e.start()) if e is not None else None for e in engines], timeout_s + 10)
        bad = [e for e in errs if isinstance(e, BaseException)]
        if bad:
            close_all(engines)
            raise bad[0]
    return engines


def run_all(fns: Sequence[Callable[[], Any] | None], join_s: float) -> list[Any]:
    """Run each fn in its own thread; results or exceptions, in order (``None`` fns give None).

    Asserts that every thread finished within ``join_s``: the engine must never hang.
    """
    out: list[Any] = [None] * len(fns)

    def body(i: int, fn: Callable[[], Any]) -> None:
        try:
            out[i] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out[i] = e

    threads = [threading.Thread(target=body, args=(i, fn), daemon=True) for i, fn in enumerate(fns) if fn]
    for t in threads:
        t.start()
    deadline = time.monotonic() + join_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads still running after {join_s} s: {hung}"
    return out


def allreduce_all(engines: Sequence[NodeEngine | None], arrays: Sequence[np.ndarray | None], op: str, *,
                  seq: int = 0, comm: str = "c", fps: Sequence[Fingerprint | None] | None = None,
                  join_s: float = 30.0, **kw: Any) -> list[Any]:
    """Allreduce on every engine at once (``None`` array: that node does not call)."""
    fns: list[Callable[[], Any] | None] = []
    for i, (e, a) in enumerate(zip(engines, arrays, strict=True)):
        if e is None or a is None:
            fns.append(None)
            continue
        fp = fps[i] if fps is not None and fps[i] is not None else Fingerprint(comm, seq, op, str(a.dtype), a.size)
        fns.append(lambda e=e, a=a, fp=fp: e.allreduce(a, op, fp, **kw))
    return run_all(fns, join_s)


def close_all(engines: Sequence[NodeEngine | None]) -> None:
    for e in engines:
        if e is not None:
            e.close()


def odd_one_out(what: str, n: int, bad: int, count: int) -> tuple[list[np.ndarray], list[Fingerprint]]:
    """``n`` float32 buffers of ones and their fingerprints, node ``bad``'s differing in ``what``:
    ``count`` (one element fewer), ``small`` (10 elements), ``dtype`` (int32), ``seq``, ``op`` (max)
    or ``root`` (every node runs a reduce, node ``bad`` naming another root: the same bytes)."""
    arrs = [np.ones(count, dtype=np.float32) for _ in range(n)]
    fps = [Fingerprint("c", 7, "sum", "float32", count) for _ in range(n)]
    if what == "root":
        fps = [Fingerprint("c", 7, "sum", "float32", count, "reduce", 1 if i == bad else 0) for i in range(n)]
        return arrs, fps
    if what in ("count", "small"):
        c = count - 1 if what == "count" else 10
        arrs[bad] = np.ones(c, dtype=np.float32)
        fps[bad] = Fingerprint("c", 7, "sum", "float32", c)
    elif what == "dtype":
        arrs[bad] = np.ones(count, dtype=np.int32)
        fps[bad] = Fingerprint("c", 7, "sum", "int32", count)
    elif what == "seq":
        fps[bad] = Fingerprint("c", 8, "sum", "float32", count)
    elif what == "op":
        fps[bad] = Fingerprint("c", 7, "max", "float32", count)
    else:
        raise ValueError(f"no such difference: {what!r}")
    return arrs, fps


def express_op(seq: int, x: np.ndarray, done: list[XOp], *, count: int | None = None, redop: str = "sum",
               divisor: int = 1) -> XOp:
    """Express op ``seq`` over ``x`` (its own partial and result), reported into ``done``."""
    fpw: list[object] = ["t/x", seq, redop, str(x.dtype), x.size if count is None else count, "allreduce"]
    return XOp(seq, fpw, x, [x], narrow=False, redop=redop, divisor=divisor, on_done=done.append)


def wait_until(cond: Callable[[], object], what: str, timeout_s: float = 5.0) -> None:
    """Poll ``cond`` until it holds; fail with ``what`` after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.002)
