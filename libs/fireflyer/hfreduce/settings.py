"""Settings of the HFReduce node worker (``FF_HFREDUCE_*`` environment, ``--set`` on the CLI).

The worker's command-line flags (``--chunk-size``, ``--timeout-s`` ...) win over the
environment, which wins over the defaults here; :func:`load_worker_settings` applies
that precedence with the one loader of :mod:`fireflyer.core.settings`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from fireflyer.core import sizes
from fireflyer.core.errors import InvalidArgument, SettingsError
from fireflyer.core.settings import load_settings

__all__ = ["WorkerSettings", "parse_size", "load_worker_settings", "ENV_PREFIX", "MIN_SOCK_BUF"]

ENV_PREFIX = "FF_HFREDUCE"

_CC_NAME = re.compile(r"[a-z][a-z0-9_]{0,15}")  # TCP_CA_NAME_MAX is 16


def parse_size(text: str | int, key: str = "chunk_size") -> int:
    """``"4M"`` / ``"512k"`` / ``"4MiB"`` / ``4194304`` -> bytes (:mod:`fireflyer.core.sizes`); a bad
    one is a :class:`SettingsError` naming ``key``."""
    try:
        return sizes.parse_size(text, what=key)
    except InvalidArgument as e:
        raise SettingsError(e.message, key=key, expected="size") from None


#: the longest express poll: a reader that polls longer spends a CPU on nothing between ops
_MAX_POLL_US = 10_000.0

#: the smallest fixed socket buffer of the links (``sock_buf_size``, ``send_buf_size``): the kernel
#: doubles the value asked for, and a loopback segment is ~64 KiB, so below 64K a link holds
#: under two segments and stalls between them.  On the sixteenth VM (2026-11-26) one loopback
#: stream of 512 KiB blocks carried 2 MB/s with 32K (neither TCP_NODELAY nor TCP_QUICKACK helped:
#: not Nagle, not delayed ACKs) and 3.0-3.5 GB/s with 48K against 5.8 GB/s with 64K; 4 nodes x 1
#: rank at 64 MiB took 1.5-1.9x the time of 256K with 40K and 48K, 70x (6.4 s per op) with 32K
MIN_SOCK_BUF = 64 << 10


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Knobs of one node worker; environment names are ``FF_HFREDUCE_<FIELD>``."""

    #: bytes per pipeline chunk (local reduce, tree transfer, write-back); "4M" style
    chunk_size: str = "4M"
    #: bytes per block of a streamed op's loops (receive, reduce, send, copy out while the
    #: block is in the cache: ``_blocks.BLOCK_BYTES`` says why 512K); every node must use the same
    block_size: str = "512K"
    #: stream large float32/int ops through the engine's block loops (false: the threaded
    #: fill / fuse / write-back path, kept for comparisons)
    stream: bool = True
    #: SO_SNDBUF / SO_RCVBUF of the links between node workers; empty: the kernel's auto-tuning
    sock_buf_size: str = ""
    #: SO_SNDBUF alone (when ``sock_buf_size`` is empty; the receive side keeps auto-tuning);
    #: empty (the default): auto-tuning, right between hosts, where a connection carries at most
    #: its send buffer per round trip.  ``ff launch``, whose nodes share one host's loopback,
    #: sets 256K (``launch_plan.LOOPBACK_SEND_BUF``; the kernel doubles it): there auto-tuning lets
    #: a bulk sender run up to 4 MiB ahead per link, so with a dozen links a receiver copies data
    #: that has long left the cache.  On the fifteenth VM (2026-11-26, 2 cores, 1 MiB L2), in one
    #: process switching the links' SO_SNDBUF between ops, ten alternating rounds of 8 ops,
    #: 64 MiB fp32 took 0.83-0.91x the time of 2M on 4 nodes x 1 rank, 0.87x on 3 x 2, 0.92x on
    #: 2 x 1, level on 2 x 4; 128K-512K all did about as well
    send_buf_size: str = ""
    #: TCP congestion controls for those links, tried in order (comma list); empty: the system
    #: default.  Not BBR by default: its pacing costs CPU per byte and throughput on short
    #: links (``fireflyer.wire.conn.set_congestion``); reno is allowed to every process
    tcp_congestion: str = "cubic,reno"
    #: microseconds a two-node worker's express link polls for the next small op's frame
    #: before its reader sleeps (the engine's default, ``express.EXPRESS_POLL_S``, written out
    #: here so that reading settings does not import the kernels; its docs say why); 0: off
    express_poll_us: float = 200.0
    #: how large float32/int ops cross three or more nodes: "tree" (the double binary tree) or
    #: "ring" (reduce-scatter then allgather around the nodes, ``_ring``: fewer, longer flows,
    #: which carry more where the nodes share one host's loopback); every node must use the same
    algorithm: str = "tree"
    #: bytes per frame of a ring op, whole blocks (``_ring.RING_PIECE_BYTES`` says why 16M); every node
    #: must use the same
    ring_piece_size: str = "16M"
    #: default deadline of one collective when the rank sets none
    timeout_s: float = 60.0
    #: bearer token the node engines present to each other
    token: str = ""
    job_id: str = ""
    #: reduce threads per op (0: kernels.default_threads())
    threads: int = 0
    #: how many finished ops ``status()`` keeps
    status_ring: int = 256
    #: NATS telemetry: batch interval; empty URL disables publishing
    nats_url: str = ""
    telemetry_interval_s: float = 1.0
    #: the coordination service (``FF_COORD_ADDR``): with it and no ``--peers`` the worker
    #: joins through coord for its node rank, peers and zones (:mod:`fireflyer.coord`)
    coord_addr: str = ""

    @property
    def express_poll_s(self) -> float:
        return self.express_poll_us * 1e-6

    @property
    def chunk_bytes(self) -> int:
        return parse_size(self.chunk_size)

    @property
    def block_bytes(self) -> int:
        return parse_size(self.block_size, "block_size")

    @property
    def ring_piece_bytes(self) -> int:
        return parse_size(self.ring_piece_size, "ring_piece_size")

    @property
    def congestion_prefs(self) -> tuple[str, ...]:
        return tuple(x.strip() for x in self.tcp_congestion.split(",") if x.strip())

    @property
    def sock_buf_bytes(self) -> int | None:
        return parse_size(self.sock_buf_size, "sock_buf_size") if self.sock_buf_size else None

    @property
    def send_buf_bytes(self) -> int | None:
        return parse_size(self.send_buf_size, "send_buf_size") if self.send_buf_size else None

    def __post_init__(self) -> None:
        if parse_size(self.chunk_size) < 64:
            raise SettingsError(f"chunk_size must be at least 64 bytes, got {self.chunk_size!r}",
                                key="chunk_size", expected="size >= 64")
        if parse_size(self.block_size, "block_size") < 4096:
            raise SettingsError(f"block_size must be at least 4K, got {self.block_size!r}",
                                key="block_size", expected="size >= 4K")
        if parse_size(self.ring_piece_size, "ring_piece_size") < 4096:
            raise SettingsError(f"ring_piece_size must be at least 4K, got {self.ring_piece_size!r}",
                                key="ring_piece_size", expected="size >= 4K")
        for key in ("sock_buf_size", "send_buf_size"):
            value = getattr(self, key)
            if value and parse_size(value, key) < MIN_SOCK_BUF:
                raise SettingsError(f"{key} must be empty (auto-tuning) or at least 64K, got {value!r}: a smaller "
                                    f"buffer holds under two loopback segments (~64 KiB each) and the link stalls "
                                    f"between them", key=key, expected="size >= 64K or empty")
        bad = [x for x in self.congestion_prefs if not _CC_NAME.fullmatch(x)]
        if bad:
            raise SettingsError(f"tcp_congestion: {bad[0]!r} is not a congestion control name (a comma list such "
                                f"as 'cubic,reno', or empty for the system default)", key="tcp_congestion",
                                expected="comma list of names")
        if not 0 <= self.express_poll_us <= _MAX_POLL_US:
            raise SettingsError(f"express_poll_us must be between 0 (no polling) and {_MAX_POLL_US:g} "
                                f"microseconds, got {self.express_poll_us}", key="express_poll_us",
                                expected=f"float in [0, {_MAX_POLL_US:g}]")
        if self.algorithm not in ("tree", "ring"):
            raise SettingsError(f"algorithm must be 'tree' or 'ring', got {self.algorithm!r}", key="algorithm",
                                expected="tree or ring")
        if self.timeout_s <= 0:
            raise SettingsError(f"timeout_s must be > 0, got {self.timeout_s}", key="timeout_s",
                                expected="float > 0")


def load_worker_settings(env: Mapping[str, str] | None = None,
                         overrides: Mapping[str, Any] | None = None) -> WorkerSettings:
    """Defaults < ``FF_HFREDUCE_*`` (and ``FF_NATS_URL``/``FF_JOB_ID``/``FF_TOKEN``) < overrides."""
    import os

    environ = dict(os.environ if env is None else env)
    # the job-wide names of DESIGN.md §3 fill in when the HFReduce-specific ones are unset
    for field, name in (("NATS_URL", "FF_NATS_URL"), ("JOB_ID", "FF_JOB_ID"), ("TOKEN", "FF_TOKEN"),
                        ("COORD_ADDR", "FF_COORD_ADDR")):
        if f"{ENV_PREFIX}_{field}" not in environ and name in environ:
            environ[f"{ENV_PREFIX}_{field}"] = environ[name]
    clean = {k: v for k, v in (overrides or {}).items() if v is not None}
    return load_settings(WorkerSettings, env=environ, overrides=clean, prefix=ENV_PREFIX)
