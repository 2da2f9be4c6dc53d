"""``ff bench ringref``: a bare ring allreduce against the loopback bound, in one run.

The loopback bound of ``ff bench allreduce`` is ``C/(2(n-1))``: what an allreduce would reach
if every byte a bandwidth-optimal algorithm must move -- ``2(n-1)/n * S`` sent by each node,
the ring's traffic -- went at the aggregate rate ``C`` of ``n`` one-way loopback pairs.  How
close can an allreduce get to it on this machine?  This benchmark answers with the algorithm
the bound describes, stripped of everything HFReduce adds:

- ``n`` node processes on their loopback addresses (``127.0.0.(i+1)``), node ``i`` sending to
  ``i+1`` over one TCP connection tuned as the workers' links are -- the bound's ``n`` flows;
- each node holds one float32 buffer of ``S`` bytes (no local ranks, no shared memory, no
  fingerprints, no deadlines); a ring reduce-scatter then allgather moves it in ``2(n-1)``
  steps of ``S/n``, each step pipelined in ``--chunk`` pieces: a sender thread sends a piece
  as soon as the receiver (the node's other thread) has reduced the piece it depends on;
- reduce-scatter pieces are received into a scratch piece and added with numpy; allgather
  pieces are received straight into place.

Every op's result is checked (each node starts from ``i + 1``, so every element must be
``n(n+1)/2``).  A round measures ``C`` as ``ff bench allreduce`` does
(:func:`~._floor.loopback_capacity`, the best of the links' buffers and the
kernel's auto-tuning), then ``--ops`` ring ops after a warm-up; the round's time is the
median op (an op lasts as long as its slowest node).  ``fraction_of_bound`` = the op's algbw / the
bound.  ``--rounds`` repeats that; the summary is the median (range) over rounds.

It is a reference, not an allreduce to use: it answers whether a goal stated against the bound
is within reach of the bound's own algorithm on this machine, and how far HFReduce's double
tree (``ff bench allreduce``, 4(n-1) flows) is from it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from fireflyer.core.errors import FireFlyerError, Internal, InvalidArgument
from fireflyer.core.sizes import parse_size
from fireflyer.hfreduce._ring import (
    ring_steps,  # (the engine's ring schedule: the reference runs the same steps)
)
from fireflyer.wire.conn import set_io_timeout

from ._floor import SocketBuffers, loopback_capacity, loopback_pair
from ._jsonout import STDOUT, add_json_option, emit
from ._node_procs import collect, reap, spawn
from .flows import links_setup

__all__ = ["ring_steps", "measure_ring_ops", "main"]

_ITEM = 4  # float32


def _recv_exact(rx: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        try:
            k = rx.recv_into(view[got:], len(view) - got)
        except (BlockingIOError, TimeoutError):  # SO_RCVTIMEO ran out
            raise TimeoutError("ring reference: the previous node sent nothing within the I/O timeout") from None
        if not k:
            raise ConnectionError("ring reference: the previous node went away")
        got += k


def _one_op(node: int, nodes: int, buf: np.ndarray, scratch: np.ndarray, pieces: list[tuple[int, int]],
            tx: socket.socket, rx: socket.socket) -> None:
    """One ring allreduce of ``buf`` in place; the sender on a thread, the receiver on this one."""
    seg = len(buf) // nodes
    steps = ring_steps(node, nodes)
    done = [threading.Event() for _ in range(len(steps) * len(pieces))]
    failed: list[BaseException] = []
    whole = memoryview(buf).cast("B")

    def sender() -> None:
        try:
            for s, (out, _, _) in enumerate(steps):
                for p, (a, b) in enumerate(pieces):
                    if s:
                        while not done[(s - 1) * len(pieces) + p].wait(1.0):
                            if failed:
                                return
                    tx.sendall(whole[(out * seg + a) * _ITEM:(out * seg + b) * _ITEM])
        except BaseException as e:  # noqa: BLE001 - re-raised by the receiving thread
            failed.append(e)

    th = threading.Thread(target=sender, daemon=True)
    th.start()
    sview = memoryview(scratch).cast("B")
    try:
        for s, (_, into, reduce) in enumerate(steps):
            for p, (a, b) in enumerate(pieces):
                dst = buf[into * seg + a:into * seg + b]
                if reduce:
                    _recv_exact(rx, sview[:(b - a) * _ITEM])
                    np.add(dst, scratch[:b - a], out=dst)
                else:
                    _recv_exact(rx, memoryview(dst).cast("B"))
                done[s * len(pieces) + p].set()
    except BaseException:
        failed.append(ConnectionError("receiver failed"))
        raise
    th.join()
    if failed:
        raise failed[0]


def _node_main(node: int, nodes: int, count: int, piece: int, ops: int, tx: socket.socket, rx: socket.socket,
               start: Any, out: Any) -> None:
    """Node ``node``: a warm-up op, then ``ops`` timed ops, each checked; sends the op times."""
    try:
        seg = count // nodes
        pieces = [(a, min(a + piece, seg)) for a in range(0, seg, piece)]
        buf = np.empty(count, np.float32)
        scratch = np.empty(max(1, min(piece, seg)), np.float32)
        expect = nodes * (nodes + 1) / 2
        times: list[float] = []
        for k in range(ops + 1):
            buf.fill(node + 1)
            start.wait()  # every node ready before any clock starts
            t0 = time.perf_counter()
            _one_op(node, nodes, buf, scratch, pieces, tx, rx)
            if k:
                times.append(time.perf_counter() - t0)
            if not np.all(buf == expect):
                bad = int(np.flatnonzero(buf != expect)[0])
                raise Internal(f"ring reference: op {k} left {buf[bad]} at element {bad}, expected {expect}")
        out.send(("ok", times))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        out.send(("error", f"{type(e).__name__}: {e}"))


def measure_ring_ops(nodes: int, size: int, *, piece_bytes: int, ops: int, congestion: Sequence[str] = (),
                     buffers: SocketBuffers = (None, None), timeout_s: float = 120.0) -> list[float]:
    """Seconds of each of ``ops`` ring allreduces of ``size`` bytes (float32) over ``nodes`` node
    processes, an op lasting as long as its slowest node."""
    if nodes < 2:
        raise InvalidArgument(f"a ring needs at least 2 nodes, got {nodes}", nodes=nodes)
    if size % (nodes * _ITEM) or size <= 0:
        raise InvalidArgument(f"--size must be a positive multiple of {nodes * _ITEM} bytes (nodes x 4), "
                              f"got {size}", value=size)
    if piece_bytes < _ITEM or ops < 1:
        raise InvalidArgument(f"need a chunk of at least 4 bytes and at least one op (chunk {piece_bytes}, "
                              f"ops {ops})")
    socks: list[tuple[socket.socket, socket.socket]] = []
    procs: list[BaseProcess] = []
    try:
        for i in range(nodes):
            socks.append(loopback_pair(i, (i + 1) % nodes, congestion, buffers))
            for s in socks[-1]:  # a node that stops without exiting fails its neighbours' I/O, not hangs it
                set_io_timeout(s, timeout_s)
        ctx = mp.get_context("fork")
        start = ctx.Barrier(nodes, timeout=timeout_s)
        procs, pipes = spawn(ctx, nodes, _node_main,
                             lambda i: (i, nodes, size // _ITEM, piece_bytes // _ITEM, ops, socks[i][0],
                                        socks[(i - 1) % nodes][1], start))
        for tx, rx in socks:  # the children hold their own copies
            tx.close()
            rx.close()
        socks = []
        per_node = collect(pipes, timeout_s * (ops + 1) + 10.0, "ring reference")
        return [max(t[k] for t in per_node) for k in range(ops)]
    finally:
        for tx, rx in socks:
            tx.close()
            rx.close()
        reap(procs)


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: Sequence[str] | None = None) -> int:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="ff bench ringref", description=doc.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="node processes (default 4)")
    p.add_argument("--size", default="64M", help="bytes per node's buffer, float32 (default 64M)")
    p.add_argument("--chunk", default="512K", help="bytes per pipelined piece (default 512K, the workers' block)")
    p.add_argument("--ops", type=int, default=5, help="timed ops per round, after one warm-up (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each with its own anchor (default 3)")
    add_json_option(p)
    ns = p.parse_args(argv)
    rounds: list[dict[str, Any]] = []
    try:
        size, piece = parse_size(ns.size, what="--size"), parse_size(ns.chunk, what="--chunk")
        if ns.rounds < 1:
            raise InvalidArgument(f"--rounds must be at least 1, got {ns.rounds}", value=ns.rounds)
        cc, links = links_setup()
        bufs = list(dict.fromkeys([links, (None, None)]))  # the bound's anchor tries both, as ff bench allreduce's
        for r in range(ns.rounds):
            if ns.json != STDOUT:
                print(f"ff bench ringref: round {r + 1} of {ns.rounds}: the loopback anchor, then {ns.ops} ops",
                      file=sys.stderr, flush=True)
            cap = loopback_capacity(ns.nodes, size, congestion=cc, buffers=bufs)
            op_s = statistics.median(measure_ring_ops(ns.nodes, size, piece_bytes=piece, ops=ns.ops,
                                                      congestion=cc, buffers=bufs[0]))
            bound = cap / (2 * (ns.nodes - 1))
            rounds.append({"time_s": op_s, "algbw_GBps": size / op_s / 1e9, "loopback_GBps": cap / 1e9,
                           "bound_GBps": bound / 1e9, "fraction_of_bound": size / op_s / bound})
    except FireFlyerError as e:
        print(f"ff bench ringref: {e}", file=sys.stderr)
        return 1
    result = {"bench": "ringref", "nodes": ns.nodes, "size_bytes": size, "chunk_bytes": piece, "ops": ns.ops,
              "congestion": list(cc), "socket_buffers": {"buf_bytes": bufs[0][0], "send_buf_bytes": bufs[0][1]},
              "rounds": rounds,
              **{k: _summary([x[k] for x in rounds]) for k in ("time_s", "bound_GBps", "fraction_of_bound")}}
    return emit(ns.json, result, lambda: _print_ringref(ns, result))


def _print_ringref(ns: argparse.Namespace, result: dict[str, Any]) -> None:
    t, f = result["time_s"], result["fraction_of_bound"]
    print(f"ring reference allreduce, {ns.nodes} nodes, {ns.size} float32 per node, {ns.chunk} pieces, "
          f"{ns.rounds} rounds of {ns.ops} ops")
    print(f"  op {t['median'] * 1e3:.1f} ms ({t['min'] * 1e3:.1f}-{t['max'] * 1e3:.1f}), "
          f"{100 * f['median']:.0f}% of the loopback bound ({100 * f['min']:.0f}-{100 * f['max']:.0f}%), "
          f"bound {result['bound_GBps']['median']:.3f} GB/s")


if __name__ == "__main__":
    raise SystemExit(main())
