"""``ff bench wire``: data-plane throughput against raw sockets, measured in the same run.

    ff bench wire --size 64M --repeats 5 --json

What is timed, for both sides over loopback: the client sends ``size`` bytes and waits for a
small acknowledgement from the receiver, which received every byte into one preallocated buffer.

- **wire**: ``Connection.request("put", payload)``; the server's handler receives the payload
  with ``recv_payload(into=sink)`` and replies with an empty response.  That is the shape of a
  storage write or an HFReduce chunk transfer, with auth, framing, request ids and the reader
  thread all included.
- **raw** (the anchor): one ``sendall`` of the same buffer, a receiver thread looping
  ``recv_into`` over a memoryview of the same kind of sink, then a one-byte ack; the same socket
  options (TCP_NODELAY, same buffer sizes) and the same threads (sender in the caller, receiver in
  its own thread).  The anchor's loop receives with ``MSG_WAITALL`` in the same chunk size as the
  wire does: a plain ``recv_into`` loop (one call per socket-buffer's worth) is measurably slower
  and would flatter the wire; the anchor should be the best plain sockets do.

Rounds alternate wire / raw so that a noisy neighbour hurts both alike; one untimed warm-up round
each comes first.  The JSON reports GB/s (1e9 bytes per second) best and median, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fireflyer.bench._jsonout import add_json_option, emit
from fireflyer.core.sizes import parse_size, size_arg
from fireflyer.wire.client import Connection
from fireflyer.wire.conn import CHUNK, tune_socket
from fireflyer.wire.frame import FrameLimits
from fireflyer.wire.server import ServerRequest, WireServer

__all__ = ["run_bench", "main"]

_TOKEN = "bench-token"


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class _RawPair:
    """A loopback TCP pair with a receiver thread: the anchor."""

    def __init__(self, size: int, buf_bytes: int | None) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        self.tx = socket.create_connection(listener.getsockname())
        self.rx, _ = listener.accept()
        listener.close()
        for s in (self.tx, self.rx):
            tune_socket(s, io_timeout_s=None, buf_bytes=buf_bytes)
        self.size = size
        self.sink = memoryview(bytearray(size))
        self._go = threading.Semaphore(0)
        self._stop = False
        self._thread = threading.Thread(target=self._receive, name="bench-raw-rx", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while True:
            self._go.acquire()
            if self._stop:
                return
            off, n = 0, self.size
            while off < n:
                got = self.rx.recv_into(self.sink[off:off + CHUNK], 0, socket.MSG_WAITALL)
                if not got:
                    return
                off += got
            self.rx.sendall(b"k")

    def round(self, payload: memoryview) -> float:
        self._go.release()
        t0 = time.perf_counter()
        self.tx.sendall(payload)
        if self.tx.recv(1) != b"k":
            raise ConnectionError("raw anchor receiver went away")
        return time.perf_counter() - t0

    def close(self) -> None:
        self._stop = True
        self._go.release()
        self.tx.close()
        self._thread.join(5)
        self.rx.close()


def run_bench(size_bytes: int, *, repeats: int = 5, buf_bytes: int | None = None) -> dict[str, Any]:
    """Time ``repeats`` rounds of each side; return the figures (see the module docs)."""
    if size_bytes <= 0 or repeats <= 0:
        raise ValueError("size_bytes and repeats must be positive")
    # real bytes, not calloc's untouched zero pages (reading those is cheaper than real data)
    payload = memoryview(bytearray(size_bytes))
    block = os.urandom(min(size_bytes, 1 << 20))
    for off in range(0, size_bytes, len(block)):
        payload[off:off + len(block)] = block[:size_bytes - off]
    sink = memoryview(bytearray(size_bytes))

    def handle(req: ServerRequest) -> None:
        req.recv_payload(into=sink)

    limits = FrameLimits(max_payload_bytes=max(size_bytes, FrameLimits().max_payload_bytes))
    server = WireServer(handle, authenticate=lambda t: "bench" if t == _TOKEN else None, limits=limits,
                        buf_bytes=buf_bytes, name="bench")
    port = server.start()
    conn = Connection.connect("127.0.0.1", port, token=_TOKEN, limits=limits, buf_bytes=buf_bytes)
    raw = _RawPair(size_bytes, buf_bytes)

    def wire_round() -> float:
        t0 = time.perf_counter()
        conn.request("put", payload)
        return time.perf_counter() - t0

    wire_s: list[float] = []
    raw_s: list[float] = []
    try:
        wire_round()
        raw.round(payload)  # warm-up: page faults of the buffers, TCP window growth
        for _ in range(repeats):
            wire_s.append(wire_round())
            raw_s.append(raw.round(payload))
    finally:
        raw.close()
        conn.close()
        server.stop()

    def gbps(seconds: float) -> float:
        return size_bytes / seconds / 1e9

    wire_best, wire_med = gbps(min(wire_s)), gbps(statistics.median(wire_s))
    raw_best, raw_med = gbps(min(raw_s)), gbps(statistics.median(raw_s))
    return {
        "bench": "wire",
        "mode": "request with payload + empty reply, loopback, one connection",
        "size_bytes": size_bytes,
        "repeats": repeats,
        "wire_gbps_best": round(wire_best, 3),
        "wire_gbps_median": round(wire_med, 3),
        "raw_gbps_best": round(raw_best, 3),
        "raw_gbps_median": round(raw_med, 3),
        "ratio_best": round(wire_best / raw_best, 3),
        "ratio_median": round(wire_med / raw_med, 3),
        "socket_buf_bytes": buf_bytes,
        "git_sha": _git_sha(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": sys.platform,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ff bench wire", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=size_arg, default=parse_size("64M"),
                        help="bytes per round, K/M/G suffixes (default 64M)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of each side (default 5)")
    parser.add_argument("--buf-bytes", type=size_arg, default=None,
                        help="fixed SO_SNDBUF/SO_RCVBUF for both sides (default: kernel auto-tuning)")
    add_json_option(parser)
    ns = parser.parse_args(argv)
    result = run_bench(ns.size, repeats=ns.repeats, buf_bytes=ns.buf_bytes)
    return emit(ns.json, result, lambda: print(
        f"wire {result['wire_gbps_best']:.2f} GB/s best, {result['wire_gbps_median']:.2f} median;  "
              f"raw sockets {result['raw_gbps_best']:.2f} best, {result['raw_gbps_median']:.2f} median;  "
              f"ratio {result['ratio_best']:.2f} best, {result['ratio_median']:.2f} median "
              f"({ns.size} bytes x {ns.repeats})"))


if __name__ == "__main__":
    raise SystemExit(main())
