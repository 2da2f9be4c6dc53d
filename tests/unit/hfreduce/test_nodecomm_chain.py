"""NodeComm._run_fast: ops that complete inside their own post hand the next op to the running
loop instead of nesting a call per op (a stream of thousands would overflow the stack)."""

from __future__ import annotations

import sys
import threading

from fireflyer.hfreduce.nodecomm import NodeComm


def _bare_comm() -> NodeComm:
    comm = object.__new__(NodeComm)  # only what _run_fast touches
    comm._tls = threading.local()
    comm.cond = threading.Condition()
    comm.busy = True
    comm.next_seq = 0
    comm._posted = None
    comm.error = None
    comm.key = "t/default"
    comm.node_rank = 0
    comm.express = None
    return comm


def test_a_stream_of_ops_completing_inside_their_post_runs_flat_and_in_order() -> None:
    comm = _bare_comm()
    ran: list[int] = []
    depth: list[int] = []
    total = 5000

    def run_op(seq: int, subs: dict, *, chain: bool = False) -> None:
        # a posted op whose data had already arrived: it completes (and releases) inside the post,
        # and its completion claims the next op, as release() does
        ran.append(seq)
        depth.append(len(_stack()))
        comm._posted = (seq, 1.0, 0.0)
        comm.next_seq = seq + 1
        comm._posted = None
        if seq + 1 < total:
            comm._run_fast(seq + 1, {})
        return None

    comm._run_op = run_op  # type: ignore[method-assign]
    comm._run_fast(0, {})
    assert ran == list(range(total))
    assert max(depth) - min(depth) <= 2, "each op ran one level deeper than the last"
    assert comm._tls.driving is False


def test_a_posted_op_still_in_flight_keeps_the_communicator_busy() -> None:
    comm = _bare_comm()

    def run_op(seq: int, subs: dict, *, chain: bool = False) -> None:
        comm._posted = (seq, 1.0, 0.0)  # posted; completes later on another thread
        return None

    comm._run_op = run_op  # type: ignore[method-assign]
    comm._run_fast(0, {})
    assert comm.busy, "an op in flight must keep busy (its completion clears it)"


def _stack() -> list[object]:
    f, out = sys._getframe(), []
    while f is not None:
        out.append(f)
        f = f.f_back
    return out
