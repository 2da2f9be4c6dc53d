"""The floor of an allreduce on this machine: the bytes any allreduce must move, moved as cheaply as possible.

``ff bench allreduce`` compares HFReduce with Gloo; a ratio alone cannot say whether a
goal like "5x Gloo" is still within reach of *any* implementation on the machine at
hand.  This anchor measures, in the same run, what every allreduce of ``S`` bytes over
``n`` nodes x ``k`` local ranks (zero-copy buffers, one result per rank) must at least do:

- **net**: each node sends and receives ``2(n-1)/n * S`` bytes -- the per-node minimum of
  any allreduce (the lower bound that ring reduce-scatter + allgather attains).  Measured
  as one-way TCP streams around a ring of the nodes' loopback addresses
  (``127.0.0.(i+1)`` sends to the next node), all nodes at once, 1 MiB ``sendall`` /
  ``recv_into`` from and into buffers that stay in the cache: the loopback copies and
  nothing else.
- **mem**: each node reads its ``k`` ranks' buffers once and writes ``k`` results once:
  ``k`` copies of ``S`` bytes with non-temporal stores (:mod:`fireflyer.hfreduce.copies`, the cheapest way
  to write memory that is not read back soon), all nodes at once, so they share the
  memory bus as a real op's nodes do.

Each node runs in a process of its own, bound to the same CPU share as the benchmark's
nodes (:func:`~fireflyer.hfreduce.launch_plan.node_cpus`).  ``floor_s = net_s + mem_s``
where a node has at most one CPU (bound to one, or nodes >= CPUs): the loopback copies
are CPU work of the sender's and receiver's cores, so on one core the two parts cannot
overlap.  With several CPUs per node they could, and the floor is ``max(net_s, mem_s)``.
Each part is the best of a few trials (a trial's time is that of its slowest node): like
the loopback bound, it is a ceiling of speed that load from neighbours only lowers.

``gloo_time / floor_s`` is then the highest ratio to Gloo that any allreduce moving
these bytes through this machine's loopback could have reached in the run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

import numpy as np

from fireflyer.hfreduce.copies import _fan_out
from fireflyer.hfreduce.launch_plan import node_cpus
from fireflyer.wire.conn import tune_socket

from ._node_procs import collect, reap, spawn

__all__ = ["Floor", "ring_bytes", "combine", "measure_floor", "loopback_pair", "loopback_capacity", "SocketBuffers"]

#: (``buf_bytes``, ``send_buf_bytes``) of :func:`fireflyer.wire.conn.tune_socket`: None, None is the
#: kernel's auto-tuning
SocketBuffers = tuple[int | None, int | None]

_PIECE = 1 << 20  # bytes per sendall / recv_into (the loopback anchor's size)
_COPY_BLOCK = 128 << 10  # source bytes per block of the non-temporal copy (as copies.copy_into)


@dataclass(frozen=True)
class Floor:
    """Seconds of the two parts (best trial each) and how they add up on this placement."""

    net_s: float
    mem_s: float
    overlap: bool  # several CPUs per node: the parts may run at once

    @property
    def time_s(self) -> float:
        return max(self.net_s, self.mem_s) if self.overlap else self.net_s + self.mem_s


def ring_bytes(nodes: int, size: int) -> int:
    """Bytes each node must send (and receive) in any allreduce of ``size`` bytes over ``nodes``."""
    return 0 if nodes < 2 else -(-2 * (nodes - 1) * size // nodes)


def combine(per_node: Sequence[Sequence[float]]) -> float:
    """Best trial of ``per_node[node][trial]`` seconds, a trial lasting as long as its slowest node."""
    if not per_node or not per_node[0]:
        raise ValueError("no trials")
    trials = len(per_node[0])
    if any(len(x) != trials for x in per_node):
        raise ValueError("every node must report every trial")
    return min(max(node[t] for node in per_node) for t in range(trials))


def _overlaps(nodes: int, cpu_bind: str, allowed: Sequence[int]) -> bool:
    """Can a node's network and memory work run at once (several CPUs per node)?"""
    shares = node_cpus(nodes, allowed) if cpu_bind == "node" else [None] * nodes
    if all(s is not None for s in shares):
        return min(len(s) for s in shares if s is not None) > 1
    return len(allowed) > nodes


# -- the node processes --------------------------------------------------------------------------------------------

def _stream(tx: socket.socket | None, rx: socket.socket | None, nbytes: int, src: memoryview, sink: memoryview) -> None:
    """Send ``nbytes`` on ``tx`` (a thread) while receiving ``nbytes`` from ``rx``."""
    def send() -> None:
        left = nbytes
        while left:
            m = min(left, len(src))
            tx.sendall(src[:m])  # type: ignore[union-attr]
            left -= m

    t = threading.Thread(target=send, daemon=True) if tx is not None and nbytes else None
    if t is not None:
        t.start()
    left = nbytes if rx is not None else 0
    while left:
        got = rx.recv_into(sink[:min(left, len(sink))], 0, socket.MSG_WAITALL)  # type: ignore[union-attr]
        if not got:
            raise ConnectionError("floor: the previous node went away")
        left -= got
    if t is not None:
        t.join()


def _node_main(cpus: tuple[int, ...] | None, tx: socket.socket | None, rx: socket.socket | None, net_bytes: int,
               size: int, k: int, trials: int, barrier: object, out: object) -> None:
    """One node: ``trials`` x (all nodes stream, then all nodes copy); its times go to ``out``."""
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        src = memoryview(np.ones(_PIECE, dtype=np.uint8))
        sink = memoryview(np.empty(_PIECE, dtype=np.uint8))
        bufs = [np.ones(size, dtype=np.uint8) for _ in range(k + 1)]  # touched: no page faults in the timing
        addrs = np.array([b.ctypes.data for b in bufs], dtype=np.int64)
        _fan_out(addrs[1:2], addrs[0], min(size, 1 << 16), _COPY_BLOCK)  # (compiled before the clock runs)
        net, mem = [], []
        for _ in range(trials):
            barrier.wait()  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            _stream(tx, rx, net_bytes, src, sink)
            net.append(time.perf_counter() - t0)
            barrier.wait()  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            for j in range(k):  # rank j's buffer read once, a result written once
                _fan_out(addrs[j + 1:j + 2], int(addrs[j]), size, _COPY_BLOCK)
            mem.append(time.perf_counter() - t0)
        out.send(("ok", (net, mem)))  # type: ignore[attr-defined]
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        barrier.abort()  # type: ignore[attr-defined]
        out.send(("error", f"{type(e).__name__}: {e}"))  # type: ignore[attr-defined]
    finally:
        for s in (tx, rx):
            if s is not None:
                s.close()


def loopback_pair(src: int, dst: int, congestion: Sequence[str] = (),
                  buffers: SocketBuffers = (None, None)) -> tuple[socket.socket, socket.socket]:
    """A connected (tx, rx) TCP pair from simulated node ``src``'s loopback address to node
    ``dst``'s (``127.0.0.(i+1)``, as ``ff launch`` gives them), tuned as the workers' links
    are (:func:`~fireflyer.wire.conn.tune_socket`): no Nagle, the links' congestion control,
    ``buffers`` = (``buf_bytes``, ``send_buf_bytes``)."""
    with socket.create_server((f"127.0.0.{dst % 254 + 1}", 0)) as listener:
        tx = socket.create_connection(listener.getsockname(), source_address=(f"127.0.0.{src % 254 + 1}", 0))
        rx, _ = listener.accept()
    for s in (tx, rx):
        tune_socket(s, io_timeout_s=None, buf_bytes=buffers[0], congestion=congestion, send_buf_bytes=buffers[1])
    return tx, rx


def _ring(nodes: int, congestion: Sequence[str], buffers: SocketBuffers) -> list[tuple[socket.socket, socket.socket]]:
    """One connected (tx, rx) pair per ring edge i -> i+1."""
    pairs: list[tuple[socket.socket, socket.socket]] = []
    try:
        for i in range(nodes):
            pairs.append(loopback_pair(i, (i + 1) % nodes, congestion, buffers))
    except BaseException:
        for tx, rx in pairs:
            tx.close()
            rx.close()
        raise
    return pairs


def measure_floor(nodes: int, local_ranks: int, size: int, *, cpu_bind: str = "node", trials: int = 3,
                  timeout_s: float = 120.0, congestion: Sequence[str] = (),
                  buffers: SocketBuffers = (None, None)) -> Floor:
    """Measure both parts of the floor for ``size`` bytes (see the module docs); the streams
    use the first of the ``congestion`` controls the kernel allows (empty: the system default)
    and the socket ``buffers`` (:func:`loopback_pair`)."""
    if nodes < 1 or local_ranks < 1 or size < 1 or trials < 1:
        raise ValueError("nodes, local_ranks, size and trials must be positive")
    allowed = sorted(os.sched_getaffinity(0))
    shares = node_cpus(nodes, allowed) if cpu_bind == "node" else [None] * nodes
    _fan_out(np.zeros(0, dtype=np.int64), 0, 0, _COPY_BLOCK)  # compile (or load) once, before the fork
    ctx = mp.get_context("fork")  # the children need only this module's functions and the sockets
    pairs = _ring(nodes, congestion, buffers) if nodes > 1 else []
    barrier = ctx.Barrier(nodes, timeout=timeout_s)
    net_bytes = ring_bytes(nodes, size)
    procs: list[BaseProcess] = []
    try:
        procs, pipes = spawn(ctx, nodes, _node_main, lambda i: (
            shares[i], pairs[i][0] if pairs else None, pairs[i - 1][1] if pairs else None, net_bytes, size,
            local_ranks, trials, barrier))
        for tx, rx in pairs:  # the children hold their own copies
            tx.close()
            rx.close()
        pairs = []
        net, mem = zip(*collect(pipes, timeout_s, "floor"), strict=True)
    finally:
        for tx, rx in pairs:
            tx.close()
            rx.close()
        reap(procs)
    return Floor(net_s=combine(net) if nodes > 1 else 0.0, mem_s=combine(mem),
                 overlap=_overlaps(nodes, cpu_bind, allowed))


# -- the loopback anchor (the bound of ff bench allreduce and ringref) -----------------------------------------

def loopback_capacity(pairs: int, size: int, *, target_bytes: float = 5e8, repeats: int = 4,
                      congestion: Sequence[str] = (),
                      buffers: Sequence[SocketBuffers] = ((None, None),)) -> float:
    """Aggregate bytes/s of ``pairs`` concurrent one-way TCP streams over loopback, each ``sendall(size)`` x rounds.

    Pair ``i`` runs from 127.0.0.(i+1) to the next address, like node to node.
    Every receiver fills a preallocated buffer with ``recv_into``; the clock
    runs from releasing all senders together to the last byte received.  The
    best of ``repeats`` trials is kept: it is a ceiling, and on a shared machine
    a neighbour's burst only ever lowers a trial.  ``congestion``: the links' congestion
    controls (as the workers': see :func:`fireflyer.bench.allreduce.tcp_congestion`), so the bound stays a ceiling.
    ``buffers``: socket buffer settings (:data:`SocketBuffers`) the trials take
    in turn -- the links' and the kernel's auto-tuning -- so that C is the best of either.
    """
    n = max(1, repeats)
    return max(_loopback_trial(pairs, size, target_bytes, congestion, buffers[i % len(buffers)]) for i in range(n))


def _loopback_trial(pairs: int, size: int, target_bytes: float, congestion: Sequence[str] = (),
                    buffers: SocketBuffers = (None, None)) -> float:
    rounds = max(3, int(target_bytes / (pairs * size)))
    payload = memoryview(bytearray(os.urandom(min(size, 1 << 20)) * (size // min(size, 1 << 20) + 1))[:size])
    conns: list[tuple[socket.socket, socket.socket]] = []
    try:
        for i in range(pairs):
            conns.append(loopback_pair(i, i + 1, congestion, buffers))
        go = threading.Barrier(2 * pairs + 1, timeout=120)
        done = threading.Barrier(pairs + 1, timeout=120)

        def send(tx: socket.socket) -> None:
            go.wait()
            for _ in range(rounds):
                tx.sendall(payload)

        def recv(rx: socket.socket) -> None:
            sink = memoryview(bytearray(size))
            go.wait()
            for _ in range(rounds):
                off = 0
                while off < size:
                    n = rx.recv_into(sink[off:off + (1 << 20)], 0, socket.MSG_WAITALL)
                    if not n:
                        raise ConnectionError("loopback anchor: sender went away")
                    off += n
            done.wait()

        threads = [threading.Thread(target=send, args=(tx,), daemon=True) for tx, _ in conns]
        threads += [threading.Thread(target=recv, args=(rx,), daemon=True) for _, rx in conns]
        for t in threads:
            t.start()
        go.wait()
        t0 = time.perf_counter()
        done.wait()
        elapsed = time.perf_counter() - t0
        for t in threads:
            t.join(10)
        return pairs * rounds * size / elapsed
    finally:
        for tx, rx in conns:
            tx.close()
            rx.close()
