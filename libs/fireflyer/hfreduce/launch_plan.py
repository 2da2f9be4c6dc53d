"""What ``ff launch`` will start, decided without starting anything.

:func:`make_plan` turns the options (nodes, local ranks, zones, chunk size ...)
and a few facts supplied by the caller (free ports, the run dir, the parent
environment) into a :class:`LaunchPlan`: one :class:`NodePlan` per node (its
loopback address, engine port, control socket and worker argv) and one
:class:`RankPlan` per rank (its environment).  Keeping this pure means every
rule -- rank numbering, the environment contract of DESIGN.md §3, zone
validation, socket-path limits -- is tested with plain values, and the
launcher (:mod:`fireflyer.hfreduce.launch`) only does I/O.

**Rendezvous.**  Node ``i`` listens on ``127.0.0.(i+1)`` (all of 127/8 is
loopback on Linux, so every simulated node has an address of its own, as real
nodes would).  Without a coordination service the launcher *is* the rendezvous:
every worker gets the full peer list in node-rank order.  With ``coord_addr``
(``FF_COORD_ADDR``) each worker instead joins coord as ``node{i}`` with its zone
and listen address, and coord assigns the node ranks (by zone, then name: see
:mod:`fireflyer.coord.layout`); the launcher reads each worker's rank from its
ready line and renumbers the ranks with :func:`with_node_ranks` before starting
them.

**CPU binding** (``cpu_bind="node"``, the default).  Real nodes do not share cores,
so each simulated node gets a share of the CPUs the launcher may use
(:func:`node_cpus`): its worker and its ranks are bound to it (when there are at
least as many CPUs as nodes; otherwise nodes share CPUs anyway and nothing is bound).  Without that the
scheduler spreads one node's rank and worker over every core, and each hand-off
between them (rank -> worker -> rank) is a cross-core wake-up; on a small VM that
costs more than the work of a small allreduce.  ``"none"`` leaves placement to the
scheduler.  Binding changes placement only: every process still runs the same code.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from fireflyer.core.errors import InvalidArgument
from fireflyer.core.sizes import parse_size
from fireflyer.hfreduce.caches import cache_bytes

__all__ = [
    "LaunchOptions",
    "NodePlan",
    "RankPlan",
    "LaunchPlan",
    "make_plan",
    "node_address",
    "parse_zones",
    "coord_note",
    "with_node_ranks",
    "node_cpus",
    "worker_env",
    "loopback_block",
    "LOOPBACK_SEND_BUF",
    "CPU_BIND_MODES",
    "MAX_NODES",
    "WORKER_MODULE",
]

#: 127.0.0.1 .. 127.0.0.254: one loopback address per simulated node
MAX_NODES = 254
#: ``python -m`` target of the per-node HFReduce worker
WORKER_MODULE = "fireflyer.hfreduce.worker"
#: ``--cpu-bind`` values: one CPU share per simulated node, or the scheduler's placement
CPU_BIND_MODES = ("node", "none")
#: sun_path is 108 bytes on Linux, including the terminating NUL
_MAX_SOCKET_PATH = 107


class LaunchOptions(msgspec.Struct, frozen=True):
    """The user's choices (``ff launch`` options), validated by :func:`make_plan`."""

    nodes: int
    local_ranks: int
    zones: tuple[str, ...] | None = None
    #: passed through to the worker as given (``4M``); validated with :func:`fireflyer.core.sizes.parse_size`
    chunk_size: str | None = None
    #: collective deadline of the workers, seconds
    timeout_s: float | None = None
    job_id: str | None = None
    #: ``node``: bind each node's worker and ranks to a share of the CPUs; ``none``: do not bind
    cpu_bind: str = "node"


class NodePlan(msgspec.Struct, frozen=True):
    node_rank: int
    name: str
    host: str
    port: int
    socket_path: str
    #: the full command line of this node's worker
    argv: tuple[str, ...]
    #: the CPUs this node's worker and ranks are bound to (None: not bound)
    cpus: tuple[int, ...] | None = None

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"


class RankPlan(msgspec.Struct, frozen=True):
    rank: int
    node_rank: int
    local_rank: int
    #: the complete environment of the rank process (parent environment included)
    env: dict[str, str]


class LaunchPlan(msgspec.Struct, frozen=True):
    job_id: str
    run_dir: str
    nodes: tuple[NodePlan, ...]
    ranks: tuple[RankPlan, ...]
    master_addr: str
    master_port: int

    @property
    def world_size(self) -> int:
        return len(self.ranks)


def node_address(node_rank: int) -> str:
    """The loopback address of a simulated node: node 0 is 127.0.0.1."""
    if not 0 <= node_rank < MAX_NODES:
        raise InvalidArgument(f"node rank {node_rank} has no loopback address (at most {MAX_NODES} nodes)",
                              node=node_rank)
    return f"127.0.0.{node_rank + 1}"


#: the links' SO_SNDBUF of simulated nodes (``FF_HFREDUCE_SEND_BUF_SIZE``): on loopback a sender
#: that auto-tunes to 4 MiB runs so far ahead that its receiver copies from memory, not the
#: cache (see :class:`fireflyer.hfreduce.settings.WorkerSettings`); between hosts the kernel's
#: auto-tuning stays the default, as a fixed buffer caps a connection at one buffer per round trip
LOOPBACK_SEND_BUF = "256K"


#: the streamed block (``FF_HFREDUCE_BLOCK_SIZE``) of simulated nodes that reduce several local
#: ranks on cores with at most :data:`SMALL_L2` of L2 (see :func:`loopback_block`)
SMALL_L2_BLOCK = "256K"
SMALL_L2 = 512 << 10


def loopback_block(local_ranks: int, l2_bytes: int | None) -> str | None:
    """The block size the launcher gives its workers, or None for the worker's default (512K).

    A node with several local ranks reduces them block by block into an output block that
    its socket then sends; with 512 KiB of L2 a 512K block no longer stays there while the
    ranks' lines stream past.  On such a VM (AMD Zen 3, 2026-11-26; blocks switched between
    ops of one launch, twelve alternating rounds of six 64 MiB ops) 256K took 0.94-0.95x the
    time of 512K on 2 nodes x 4 ranks, 0.98x on 2 x 2 and 1.00x on 4 x 2, but 1.01-1.03x
    with one rank per node (nothing to reduce locally: the larger block only saves socket
    calls), and 128K 1.02x on 2 x 4.  With 1 MiB of L2 512K was the faster one by 4-6% on
    2 x 4 (the tenth and twelfth VMs).  The workers must agree on the block (it is part of
    the layout their links check), which the launcher's do: one host, one L2.  That is also
    why this is not the worker's own default: hosts with different caches would refuse to
    connect.  Unknown L2 (None, 0): the default.
    """
    if local_ranks >= 2 and l2_bytes and 0 < l2_bytes <= SMALL_L2:
        return SMALL_L2_BLOCK
    return None


def loopback_algorithm(nodes: int) -> str | None:
    """The algorithm the launcher gives its workers (``FF_HFREDUCE_ALGORITHM``), or None for the
    worker's default (the double binary tree).

    Simulated nodes share one host's loopback and CPUs, where a ring's ``n`` flows carry more
    than the trees' ``4(n-1)`` (:mod:`._ring`).  Measured on the twenty-seventh VM (AMD Zen 4,
    2026-11-27; two launches each, alternating): with one rank per node the ring took 0.72x the
    trees' time on 4 nodes at 64 MiB (69-74 ms against 95-102) and 0.96x on 5, but with two
    ranks per node on 3 nodes 1.1-1.2x, when the ring reduced the ranks in numpy passes of its
    own.  Since its frames go through the trees' block loops (``587ed0a``) and its steps overlap
    block by block (``fecdf29``), on the twenty-ninth VM (the same model; ``ff bench allreduce
    --sizes 64M``, tree and ring alternating, mean op of about a second of ops): 3 x 2 ring
    58.9/61.3/57.6 ms against 75.4/61.0/59.8, 4 x 2 94.8/80.0/84.1 against 126.1/111.8/100.0,
    3 x 4 84.4/87.8 against 86.8/95.6, 4 x 4 131.6/120.9 against 140.9/138.5.  So: the ring on
    three or more nodes, whatever the ranks per node (with two, both are a single exchange)."""
    return "ring" if nodes >= 3 else None


def worker_env(base_env: Mapping[str, str], local_ranks: int = 1, l2_bytes: int | None = None,
               nodes: int = 1) -> dict[str, str]:
    """The environment of the launcher's workers: ``base_env``, with the loopback links' send
    buffer (:data:`LOOPBACK_SEND_BUF`) unless ``FF_HFREDUCE_SEND_BUF_SIZE`` is set there (even
    empty: auto-tuning asked for), the block of :func:`loopback_block` for ``local_ranks``
    per node and this host's L2 (``l2_bytes``; None: read from sysfs) unless
    ``FF_HFREDUCE_BLOCK_SIZE`` is set there, and the algorithm of :func:`loopback_algorithm` for
    ``nodes`` unless ``FF_HFREDUCE_ALGORITHM`` is set there."""
    env = dict(base_env)
    env.setdefault("FF_HFREDUCE_SEND_BUF_SIZE", LOOPBACK_SEND_BUF)
    block = loopback_block(local_ranks, cache_bytes(2) if l2_bytes is None else l2_bytes)
    if block is not None:
        env.setdefault("FF_HFREDUCE_BLOCK_SIZE", block)
    algorithm = loopback_algorithm(nodes)
    if algorithm is not None:
        env.setdefault("FF_HFREDUCE_ALGORITHM", algorithm)
    return env


def node_cpus(nodes: int, allowed: Sequence[int]) -> list[tuple[int, ...] | None]:
    """Each node's CPU share, out of the CPUs ``allowed`` (the launcher's affinity).

    Contiguous groups whose sizes differ by at most one.  None for every node (no
    binding) when there is nothing to split (one node) or too little: with fewer
    CPUs than nodes, nodes would have to share CPUs anyway, and a fixed pairing only
    takes the balancing away from the scheduler.
    """
    cpus = sorted(set(allowed))
    if nodes < 1:
        raise InvalidArgument(f"need at least one node, got {nodes}", nodes=nodes)
    if nodes == 1 or nodes > len(cpus):
        return [None] * nodes
    base, extra = divmod(len(cpus), nodes)
    out: list[tuple[int, ...] | None] = []
    start = 0
    for i in range(nodes):
        size = base + (i < extra)
        out.append(tuple(cpus[start:start + size]))
        start += size
    return out


def parse_zones(text: str | None, nodes: int) -> tuple[str, ...] | None:
    """``"A,A,B"`` -> ``("A", "A", "B")``; the list must name exactly one zone per node."""
    if text is None or text == "":
        return None
    zones = tuple(z.strip() for z in text.split(","))
    if any(not z for z in zones):
        raise InvalidArgument(f"--zones {text!r} has an empty zone name", value=text)
    if len(zones) != nodes:
        raise InvalidArgument(
            f"--zones names {len(zones)} zone(s) ({text}) but --nodes is {nodes}: give one zone per node, "
            "in node-rank order", zones=len(zones), nodes=nodes)
    return zones


def coord_note(env: Mapping[str, str]) -> str | None:
    """The line the launcher prints when the workers meet through the coordination service."""
    addr = env.get("FF_COORD_ADDR")
    if not addr:
        return None
    return f"ff launch: rendezvous through the coordination service at {addr} (FF_COORD_ADDR)"


def _validate(opts: LaunchOptions) -> None:
    if not 1 <= opts.nodes <= MAX_NODES:
        raise InvalidArgument(f"--nodes must be between 1 and {MAX_NODES}, got {opts.nodes}", nodes=opts.nodes)
    if opts.local_ranks < 1:
        raise InvalidArgument(f"--local-ranks must be at least 1, got {opts.local_ranks}",
                              local_ranks=opts.local_ranks)
    if opts.zones is not None and len(opts.zones) != opts.nodes:
        raise InvalidArgument(
            f"--zones names {len(opts.zones)} zone(s) ({','.join(opts.zones)}) but --nodes is {opts.nodes}: "
            "give one zone per node", zones=len(opts.zones), nodes=opts.nodes)
    if opts.chunk_size is not None and parse_size(opts.chunk_size, what="--chunk-size") <= 0:
        raise InvalidArgument(f"--chunk-size must be positive, got {opts.chunk_size}", value=opts.chunk_size)
    if opts.timeout_s is not None and not opts.timeout_s > 0:
        raise InvalidArgument(f"--timeout-s must be positive, got {opts.timeout_s}", value=opts.timeout_s)
    if opts.cpu_bind not in CPU_BIND_MODES:
        raise InvalidArgument(f"--cpu-bind must be one of {', '.join(CPU_BIND_MODES)}, got {opts.cpu_bind!r}",
                              value=opts.cpu_bind)


def make_plan(opts: LaunchOptions, *, run_dir: str | Path, ports: Sequence[int], master_port: int,
              job_id: str, token: str | None = None, base_env: Mapping[str, str] | None = None,
              worker_prefix: Sequence[str] | None = None, coord_addr: str | None = None,
              restart_count: int = 0, cpus: Sequence[int] = (), coord_restart_count: int | None = None) -> LaunchPlan:
    """The plan for ``opts``: ``ports[i]`` is node ``i``'s engine port, free on its address.

    ``job_id`` is used unless ``opts.job_id`` names one.  ``base_env`` is the
    environment every rank inherits (the launcher's own: service addresses such
    as ``FF_NATS_URL`` pass through); the rank variables are set on top of it.
    ``worker_prefix`` is how a worker starts before its arguments (default
    ``python -m fireflyer.hfreduce.worker``; tests put a stand-in there).
    ``coord_addr``: workers join the coordination service (node ``i`` as ``node{i}``)
    instead of getting ``--peers``; the node ranks in the plan are then provisional
    until :func:`with_node_ranks` applies coord's.  ``cpus``: the CPUs the launcher
    may use, split among the nodes when ``opts.cpu_bind`` is ``node`` (empty: no binding).
    ``restart_count`` is the ranks' ``FF_RESTART_COUNT``; ``coord_restart_count`` (default the
    same) the one the workers join coord with, which must exceed what an earlier run of the job
    left there.
    """
    _validate(opts)
    if len(ports) != opts.nodes:
        raise InvalidArgument(f"need one engine port per node: {len(ports)} ports for {opts.nodes} nodes")
    job = opts.job_id or job_id
    run = Path(run_dir)
    peers = ",".join(f"{node_address(i)}:{ports[i]}" for i in range(opts.nodes))
    shares = node_cpus(opts.nodes, cpus) if opts.cpu_bind == "node" and cpus else [None] * opts.nodes
    nodes: list[NodePlan] = []
    for i in range(opts.nodes):
        sock = str(run / f"node{i}.sock")
        if len(sock.encode()) > _MAX_SOCKET_PATH:
            raise InvalidArgument(
                f"socket path {sock} is {len(sock.encode())} bytes, over the {_MAX_SOCKET_PATH}-byte limit of "
                "Unix sockets: choose a shorter --run-dir", path=sock)
        argv = [*(worker_prefix or (sys.executable, "-m", WORKER_MODULE)), "--nnodes", str(opts.nodes),
                "--local-world-size", str(opts.local_ranks), "--socket", sock, "--job-id", job]
        if coord_addr:
            argv += ["--coord", coord_addr, "--node-name", f"node{i}", "--listen", f"{node_address(i)}:{ports[i]}",
                     "--restart-count", str(restart_count if coord_restart_count is None else coord_restart_count)]
            if opts.zones is not None:
                argv += ["--zone", opts.zones[i]]
        else:
            argv += ["--node-rank", str(i), "--peers", peers]
            if opts.zones is not None:
                argv += ["--zones", ",".join(opts.zones)]
        if opts.chunk_size is not None:
            argv += ["--chunk-size", opts.chunk_size]
        if opts.timeout_s is not None:
            argv += ["--timeout-s", f"{opts.timeout_s:g}"]
        if token:
            argv += ["--token", token]
        nodes.append(NodePlan(i, f"node{i}", node_address(i), ports[i], sock, tuple(argv), shares[i]))

    base = dict(base_env if base_env is not None else {})
    world = opts.nodes * opts.local_ranks
    ranks: list[RankPlan] = []
    for node in nodes:
        for local in range(opts.local_ranks):
            rank = node.node_rank * opts.local_ranks + local
            env = dict(base)
            env.update({
                "FF_JOB_ID": job,
                "FF_RANK": str(rank),
                "FF_WORLD_SIZE": str(world),
                "FF_LOCAL_RANK": str(local),
                "FF_LOCAL_WORLD_SIZE": str(opts.local_ranks),
                "FF_NODE_RANK": str(node.node_rank),
                "FF_NNODES": str(opts.nodes),
                "FF_NODE_NAME": node.name,
                "FF_HFREDUCE_SOCKET": node.socket_path,
                "FF_RESTART_COUNT": str(restart_count),
                # torch.distributed conventions, so a torchrun program runs unchanged
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(opts.local_ranks),
                "GROUP_RANK": str(node.node_rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master_port),
            })
            # rank output is read line by line through a pipe: do not let Python buffer it
            env.setdefault("PYTHONUNBUFFERED", "1")
            ranks.append(RankPlan(rank, node.node_rank, local, env))
    return LaunchPlan(job, str(run), tuple(nodes), tuple(ranks), "127.0.0.1", master_port)


def with_node_ranks(plan: LaunchPlan, assigned: Mapping[int, int]) -> LaunchPlan:
    """The plan renumbered with coord's node ranks: ``assigned[i]`` is the rank of planned node ``i``.

    Nodes are reordered by their new rank and every rank's environment gets the
    matching FF_RANK/RANK/FF_NODE_RANK/GROUP_RANK (global rank = node rank * K + local).
    """
    n = len(plan.nodes)
    if sorted(assigned.get(i, -1) for i in range(n)) != list(range(n)):
        raise InvalidArgument(f"coord assigned node ranks {dict(assigned)} to {n} nodes: not a permutation of "
                              f"0..{n - 1}", assigned=str(dict(assigned)))
    k = len(plan.ranks) // n if n else 0
    nodes = sorted((msgspec.structs.replace(nd, node_rank=assigned[nd.node_rank]) for nd in plan.nodes),
                   key=lambda nd: nd.node_rank)
    ranks: list[RankPlan] = []
    for old in sorted(plan.ranks, key=lambda r: (assigned[r.node_rank], r.local_rank)):
        node_rank = assigned[old.node_rank]
        rank = node_rank * k + old.local_rank
        env = dict(old.env)
        env.update({"FF_RANK": str(rank), "RANK": str(rank), "FF_NODE_RANK": str(node_rank),
                    "GROUP_RANK": str(node_rank)})
        ranks.append(RankPlan(rank, node_rank, old.local_rank, env))
    return msgspec.structs.replace(plan, nodes=tuple(nodes), ranks=tuple(ranks))
