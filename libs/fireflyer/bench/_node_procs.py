"""Simulated nodes as forked processes for the loopback anchors (:mod:`._floor`, :mod:`.flows`).

Each node process gets a pipe back to the parent and sends one message on it: ``("ok",
value)`` or ``("error", "Type: message")``.  :func:`spawn` starts them, :func:`collect`
gathers the values in node order (raising :class:`Internal` that names every node that
failed, or the first that said nothing in time), :func:`reap` makes sure none outlives the
measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from fireflyer.core.errors import Internal

__all__ = ["spawn", "collect", "reap"]


def spawn(ctx: BaseContext, nodes: int, target: Callable[..., None],
          args_of: Callable[[int], tuple[Any, ...]]) -> tuple[list[BaseProcess], list[Connection]]:
    """Start ``nodes`` daemon processes ``target(*args_of(i), pipe)``; their processes and the read
    ends of their pipes."""
    procs: list[BaseProcess] = []
    pipes: list[Connection] = []
    try:
        for i in range(nodes):
            r, w = ctx.Pipe(duplex=False)  # type: ignore[attr-defined]
            p = ctx.Process(target=target, args=(*args_of(i), w), daemon=True)  # type: ignore[attr-defined]
            p.start()
            w.close()
            procs.append(p)
            pipes.append(r)
    except BaseException:
        reap(procs)
        raise
    return procs, pipes


def collect(pipes: Sequence[Connection], timeout_s: float, what: str) -> list[Any]:
    """Every node's value, in order; Internal if a node failed or said nothing within ``timeout_s``."""
    values: list[Any] = []
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    for i, r in enumerate(pipes):
        if not r.poll(max(0.0, deadline - time.monotonic())):
            raise Internal(f"{what}: node {i} did not finish within {timeout_s:g} s", node=i)
        status, value = r.recv()
        if status == "ok":
            values.append(value)
        else:
            errors.append(f"node {i}: {value}")
    if errors:
        raise Internal(f"{what}: " + "; ".join(errors))
    return values


def reap(procs: Sequence[BaseProcess], join_s: float = 5.0) -> None:
    """Join every process, killing what has not ended after ``join_s``."""
    for p in procs:
        p.join(join_s)
        if p.is_alive():
            p.kill()
            p.join(5)
