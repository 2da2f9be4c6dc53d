"""``ff bench flows``: what loopback carries for an allreduce's pattern of flows, stripped of the allreduce.

The loopback bound of ``ff bench allreduce`` measures ``n`` one-way pairs.  An allreduce over
the double binary tree keeps more flows busy at once -- each tree's ``n - 1`` edges, both
ways: twelve for 4 nodes -- and on a machine whose CPUs do the copies, more concurrent flows
carry less in aggregate.  This benchmark measures that directly, for patterns of directed
flows among ``--nodes`` node processes (each on its loopback address ``127.0.0.(i+1)``, as
``ff launch`` gives them):

- ``ring``: node i sends to node i+1 (``n`` flows, the bound's and the floor's shape);
- ``tree``: every edge of both trees of :func:`~fireflyer.hfreduce.trees.double_binary_tree`, both directions
  (``4(n-1)`` flows: the streams a large HFReduce op keeps busy);
- ``ring3``: the ring three times over (``3n`` balanced flows: as many as the tree's for
  4 nodes, none of its uneven load).

Each flow is its own TCP connection, tuned as the workers' links are (their congestion
control and send buffer, from the launcher's environment), with a thread per flow end that
moves ``--piece`` bytes per ``sendall`` / ``recv_into(MSG_WAITALL)`` from and into a buffer of
``--buffer`` bytes per thread: 64M walks memory the way a rank's buffers do, 1M stays in the
cache.  Senders run for ``--seconds``; the figure is the bytes received per second, summed
over the flows.  ``--rounds`` interleaves the patterns (round 1 runs each, then round 2) and
the table gives each pattern's median and range, and its median against the first pattern's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from fireflyer.core.errors import FireFlyerError, InvalidArgument
from fireflyer.core.sizes import parse_size
from fireflyer.hfreduce.launch_plan import worker_env
from fireflyer.hfreduce.settings import load_worker_settings
from fireflyer.hfreduce.trees import double_binary_tree

from ._floor import SocketBuffers, loopback_pair
from ._jsonout import STDOUT, add_json_option, emit
from ._node_procs import collect, reap, spawn

__all__ = ["PATTERNS", "pattern_flows", "measure_flows", "links_setup", "main"]

PATTERNS = ("ring", "tree", "ring3")
Flow = tuple[int, int]  # (sending node, receiving node)


def pattern_flows(pattern: str, nodes: int) -> list[Flow]:
    """The directed flows of ``pattern`` over ``nodes`` nodes (see the module docs)."""
    if nodes < 2:
        raise InvalidArgument(f"flows need at least 2 nodes, got {nodes}", nodes=nodes)
    ring = [(i, (i + 1) % nodes) for i in range(nodes)]
    if pattern == "ring":
        return ring
    if pattern == "ring3":
        return ring * 3
    if pattern == "tree":
        flows: list[Flow] = []
        for tree in double_binary_tree(nodes).trees:
            for nd in tree.nodes:
                if nd.parent >= 0:
                    flows += [(nd.rank, nd.parent), (nd.parent, nd.rank)]
        return flows
    raise InvalidArgument(f"unknown flow pattern {pattern!r} (one of {', '.join(PATTERNS)})", value=pattern)


def _node_main(node: int, flows: Sequence[Flow], socks: Sequence[tuple[socket.socket, socket.socket]],
               buf_bytes: int, piece: int, ready: Any, seconds: float, out: Any) -> None:
    """One node: a thread per end of its flows; sends ``piece`` at a time for ``seconds``.

    Every buffer is allocated and touched before the nodes meet at ``ready`` and the clock
    starts: faulting in 24 buffers of 64 MiB (twelve flows, both ends) takes longer than a
    short trial, and inside it made a one-second trial read anywhere from 2% to 100% of the
    rate.
    """
    got = [0]
    lock = threading.Lock()

    def send(s: socket.socket, src: memoryview, stop: float) -> None:
        off = 0
        try:
            while time.time() < stop:
                s.sendall(src[off:off + piece])
                off = (off + piece) % buf_bytes
        finally:
            s.shutdown(socket.SHUT_WR)  # the receiver's end of the run

    def recv(s: socket.socket, sink: memoryview) -> None:
        off = n = 0
        while (k := s.recv_into(sink[off:off + piece], piece, socket.MSG_WAITALL)) > 0:
            n += k
            off = (off + k) % buf_bytes
        with lock:
            got[0] += n

    try:
        tx = [t for (a, _), (t, _) in zip(flows, socks, strict=True) if a == node]
        rx = [r for (_, b), (_, r) in zip(flows, socks, strict=True) if b == node]
        bufs = [memoryview(np.ones(buf_bytes, np.uint8)) for _ in range(len(tx) + len(rx))]  # (ones: touched)
        ready.wait()
        stop = time.time() + seconds
        ends = [threading.Thread(target=send, args=(t, b, stop)) for t, b in zip(tx, bufs, strict=False)]
        ends += [threading.Thread(target=recv, args=(r, b)) for r, b in zip(rx, bufs[len(tx):], strict=True)]
        for t in ends:
            t.start()
        for t in ends:
            t.join()
        out.send(("ok", got[0]))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        out.send(("error", f"{type(e).__name__}: {e}"))


def measure_flows(flows: Sequence[Flow], nodes: int, *, buf_bytes: int, piece: int, seconds: float,
                  congestion: Sequence[str] = (), buffers: SocketBuffers = (None, None),
                  timeout_s: float = 60.0) -> float:
    """Aggregate bytes per second that ``flows`` carried at once among ``nodes`` node processes."""
    if piece < 1 or buf_bytes < piece or seconds <= 0:
        raise InvalidArgument(f"need 0 < piece <= buffer and seconds > 0 (piece {piece}, buffer {buf_bytes}, "
                              f"seconds {seconds})")
    socks: list[tuple[socket.socket, socket.socket]] = []
    procs: list[BaseProcess] = []
    try:
        for a, b in flows:
            socks.append(loopback_pair(a, b, congestion, buffers))
        ctx = mp.get_context("fork")
        ready = ctx.Barrier(nodes, timeout=timeout_s)  # every node's buffers in place before the clock starts
        procs, pipes = spawn(ctx, nodes, _node_main, lambda i: (i, flows, socks, buf_bytes, piece, ready, seconds))
        for tx, rx in socks:  # the children hold their own copies
            tx.close()
            rx.close()
        socks = []
        return sum(collect(pipes, seconds + timeout_s, "flows")) / seconds
    finally:
        for tx, rx in socks:
            tx.close()
            rx.close()
        reap(procs)


def links_setup() -> tuple[tuple[str, ...], SocketBuffers]:
    """The congestion control and socket buffers the launcher's workers give their links."""
    ws = load_worker_settings(env=worker_env(os.environ))
    return ws.congestion_prefs, (ws.sock_buf_bytes, ws.send_buf_bytes)


def main(argv: Sequence[str] | None = None) -> int:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="ff bench flows", description=doc.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="node processes (default 4)")
    p.add_argument("--patterns", default="ring,tree,ring3", help=f"comma list of {', '.join(PATTERNS)} "
                   "(default all; ratios are against the first)")
    p.add_argument("--buffer", default="64M", help="bytes of buffer per flow end (default 64M: out of the cache)")
    p.add_argument("--piece", default="512K", help="bytes per sendall / recv_into (default 512K, the block)")
    p.add_argument("--seconds", type=float, default=2.0, help="sending time per measurement (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    add_json_option(p)
    ns = p.parse_args(argv)
    try:
        patterns = [x.strip() for x in ns.patterns.split(",")]
        flows = {x: pattern_flows(x, ns.nodes) for x in patterns}
        buf, piece = parse_size(ns.buffer, what="--buffer"), parse_size(ns.piece, what="--piece")
        if ns.rounds < 1:
            raise InvalidArgument(f"--rounds must be at least 1, got {ns.rounds}", value=ns.rounds)
        cc, bufs = links_setup()
        rates: dict[str, list[float]] = {x: [] for x in patterns}
        for r in range(ns.rounds):
            for x in patterns:
                if ns.json != STDOUT:
                    print(f"ff bench flows: round {r + 1} of {ns.rounds}: {x} ({len(flows[x])} flows)",
                          file=sys.stderr, flush=True)
                rates[x].append(measure_flows(flows[x], ns.nodes, buf_bytes=buf, piece=piece, seconds=ns.seconds,
                                              congestion=cc, buffers=bufs) / 1e9)
    except FireFlyerError as e:
        print(f"ff bench flows: {e}", file=sys.stderr)
        return 1
    med = {x: statistics.median(v) for x, v in rates.items()}
    result = {"bench": "flows", "nodes": ns.nodes, "buffer_bytes": buf, "piece_bytes": piece,
              "seconds": ns.seconds, "rounds": ns.rounds, "congestion": list(cc),
              "socket_buffers": {"buf_bytes": bufs[0], "send_buf_bytes": bufs[1]},
              "patterns": [{"pattern": x, "flows": len(flows[x]), "GBps": rates[x], "median_GBps": med[x],
                            "vs_first": med[x] / med[patterns[0]]} for x in patterns]}
    return emit(ns.json, result, lambda: _print_flows(ns, result, patterns))


def _print_flows(ns: argparse.Namespace, result: dict[str, Any], patterns: list[str]) -> None:
    print(f"loopback flows among {ns.nodes} node processes, {ns.buffer} buffers, {ns.piece} pieces, "
          f"{ns.rounds} interleaved rounds of {ns.seconds:g} s")
    for e in result["patterns"]:
        runs = ", ".join(f"{v:.2f}" for v in e["GBps"])
        print(f"  {e['pattern']:>6}: {e['flows']:3d} flows, median {e['median_GBps']:.2f} GB/s ({runs}), "
              f"{e['vs_first']:.2f}x {patterns[0]}")


if __name__ == "__main__":
    raise SystemExit(main())
