"""``_node_procs``: the anchors' node processes report one value each, or say why not; none outlives a run."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from fireflyer.bench._node_procs import collect, reap, spawn
from fireflyer.core.errors import Internal

CTX = mp.get_context("fork")


def _node(i: int, behaviour: str, out: object) -> None:
    if behaviour == "fail" and i == 1:
        out.send(("error", "OSError: no route"))  # type: ignore[attr-defined]
    elif behaviour == "hang" and i == 1:
        time.sleep(60)
    else:
        out.send(("ok", i * 10))  # type: ignore[attr-defined]


def test_values_come_back_in_node_order() -> None:
    procs, pipes = spawn(CTX, 3, _node, lambda i: (i, "ok"))
    try:
        assert collect(pipes, 10, "demo") == [0, 10, 20]
    finally:
        reap(procs)
    assert not any(p.is_alive() for p in procs)


def test_a_failed_node_is_named_with_its_reason() -> None:
    procs, pipes = spawn(CTX, 3, _node, lambda i: (i, "fail"))
    try:
        with pytest.raises(Internal, match="demo: node 1: OSError: no route"):
            collect(pipes, 10, "demo")
    finally:
        reap(procs)


def test_a_silent_node_is_named_and_reaped() -> None:
    procs, pipes = spawn(CTX, 2, _node, lambda i: (i, "hang"))
    with pytest.raises(Internal, match="demo: node 1 did not finish within 0.5 s"):
        collect(pipes, 0.5, "demo")
    t0 = time.monotonic()
    reap(procs, join_s=0.2)  # waits that long for each, then kills
    assert not any(p.is_alive() for p in procs) and time.monotonic() - t0 < 5
