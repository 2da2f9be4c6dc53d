"""C4-style syndrome classifier over per-operation collective telemetry (health-planner §1, §6.1).

BSP training is periodic: every collective is a synchronisation point whose timing is
comparable across nodes, so a node or link at fault shows up as the odd one out of an op.
:class:`C4Detector` is fed one :class:`OpTrace` per collective (built from coord's
:class:`~fireflyer.hfreduce.telemetry.OpRecord` s by :func:`trace_from_records`) and names:

- **non-communication hang**: op ``s`` is outstanding past ``deadline_s`` and some nodes
  never entered it -> those nodes (stuck compute, data loader, a dead process);
- **communication hang**: every node entered, the op makes no progress -> the common
  endpoint of the stalled connections (a node's NIC) or, when they are one pair, that link;
- **non-communication slow**: a node's arrival lag is an outlier by a robust z-score
  (``(x - median) / (1.4826 * MAD)``) in ``persist_k`` of its last ``persist_n`` ops ->
  that node (throttled GPU/CPU, noisy neighbour); with two nodes there is no majority to score
  against, so the later one counts when it is ``two_node_min_lag_s`` behind the other;
- **communication slow**: outlier cells of the op's transfer-time matrix (``src -> dst``
  seconds in socket calls): two or more in one row or column -> that node's NIC, a lone
  cell -> that link; again only when it persists ``persist_k`` of ``persist_n`` ops.

Both slow syndromes also need an absolute excess (``min_*_excess_s`` and a fraction of the
op's median, Greyhound's >=10 % guard), so a tight MAD on a quiet cluster does not turn
microseconds into incidents.  Each (syndrome, target) is reported once until :meth:`C4Detector.clear`.

Pure: traces in, :class:`Incident` s out; no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import numpy as np

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce.telemetry import OpRecord

__all__ = ["C4Config", "OpTrace", "Incident", "C4Detector", "robust_z", "trace_from_records",
           "NONCOMM_HANG", "COMM_HANG", "NONCOMM_SLOW", "COMM_SLOW", "SYNDROMES",
           "DRAIN_AND_RESTART", "RESTART_AVOIDING_LINK", "WATCH_LINK"]

NONCOMM_HANG = "noncomm_hang"
COMM_HANG = "comm_hang"
NONCOMM_SLOW = "noncomm_slow"
COMM_SLOW = "comm_slow"
SYNDROMES = (NONCOMM_HANG, COMM_HANG, NONCOMM_SLOW, COMM_SLOW)

#: a node at fault: take it out of scheduling, restart the task from its latest checkpoint elsewhere
DRAIN_AND_RESTART = "drain_node_restart_from_checkpoint"
#: a link that stopped the job: restart from the checkpoint on nodes whose path avoids it, have it repaired
RESTART_AVOIDING_LINK = "restart_from_checkpoint_avoiding_link"
#: a slow link: the job still runs; report it for repair (rerouting is C4P's business, not ours)
WATCH_LINK = "report_link_for_repair"

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution is 0.6745 sigma


class C4Config(msgspec.Struct, frozen=True, kw_only=True):
    #: an op outstanding this long (from its first arrival) is hung
    deadline_s: float = 30.0
    #: robust z-score above which a node's lag or a transfer cell is an outlier
    z_threshold: float = 6.0
    #: a slow syndrome needs an outlier in ``persist_k`` of the last ``persist_n`` ops
    persist_k: int = 3
    persist_n: int = 5
    #: floor of the MAD (seconds), so identical timings do not make every wobble infinite
    mad_floor_s: float = 1e-4
    #: an arrival lag must also exceed the median by this much, and by ``min_rel_excess`` of the op time
    min_lag_excess_s: float = 0.02
    #: two nodes have no majority to score against: the later one is an outlier when it arrives this
    #: much after the other (and ``min_rel_excess`` of the op time), persisting like any slow syndrome
    two_node_min_lag_s: float = 0.25
    #: a transfer cell must exceed the median cell by this much, and by ``min_rel_excess`` of it
    min_edge_excess_s: float = 0.01
    min_rel_excess: float = 0.1
    #: outlier cells in one row (or column) needed to blame the node's NIC rather than links
    nic_min_cells: int = 2
    #: ... and the share of that node's cells in the row (column) they must make up
    nic_min_share: float = 0.5
    #: a node whose outlier cells change peers from op to op is its NIC when they come in this many of
    #: the last ``persist_n`` ops (stricter than ``persist_k``: a node has several cells for noise to hit)
    nic_spread_k: int = 4

    def validate(self) -> C4Config:
        if self.deadline_s <= 0 or self.z_threshold <= 0:
            raise InvalidArgument(f"C4Config: deadline_s ({self.deadline_s}) and z_threshold "
                                  f"({self.z_threshold}) must be > 0; fix the health config")
        if not 1 <= self.persist_k <= self.persist_n or not 1 <= self.nic_spread_k <= self.persist_n:
            raise InvalidArgument(f"C4Config: need 1 <= persist_k ({self.persist_k}) and nic_spread_k "
                                  f"({self.nic_spread_k}) <= persist_n ({self.persist_n}); fix the health config")
        return self


class OpTrace(msgspec.Struct, kw_only=True):
    """One collective across the communicator's ``nodes`` nodes, as arrays (compact and fast).

    ``arrival[n]`` / ``finish[n]``: seconds after ``t0`` (wall time of the first arrival) at which
    node ``n`` entered / finished the op, NaN when it has not.  Edge ``i`` is connection
    ``edge_src[i] -> edge_dst[i]``: ``edge_s[i]`` seconds node ``src`` spent in socket calls with
    ``dst`` (NaN while unfinished) and ``edge_stalled[i]`` when it has pending work and made no
    progress since the last sample (the transport layer's view; only meaningful while pending).
    """

    seq: int
    t0: float
    arrival: Any  # np.ndarray float64 [nodes]
    finish: Any  # np.ndarray float64 [nodes]
    edge_src: Any = None  # np.ndarray int [edges]
    edge_dst: Any = None
    edge_s: Any = None  # np.ndarray float64 [edges]
    edge_stalled: Any = None  # np.ndarray bool [edges]
    generation: int = 0

    @property
    def nodes(self) -> int:
        return len(self.arrival)

    @property
    def complete(self) -> bool:
        return not bool(np.isnan(self.finish).any())


class Incident(msgspec.Struct, kw_only=True):
    """What the detector names: a node (``nodes``) or a link (``link = [a, b]``), why, and what to do."""

    syndrome: str
    #: "node" or "link"
    target: str
    nodes: list[int]
    link: list[int] = msgspec.field(default_factory=list)
    #: the op at which it was named, and the ops whose evidence made it
    seq: int = 0
    ops: list[int] = msgspec.field(default_factory=list)
    scores: dict[str, float] = msgspec.field(default_factory=dict)
    action: str = DRAIN_AND_RESTART
    #: wall time of the evidence (op start + what was measured), for detection-delay figures
    at: float = 0.0
    detail: str = ""

    def key(self) -> tuple[str, str, tuple[int, ...]]:
        return (self.syndrome, self.target, tuple(self.link) if self.link else tuple(self.nodes))


def robust_z(x: np.ndarray, mad_floor: float) -> tuple[np.ndarray, float, float]:
    """``(z, median, scaled MAD)`` of ``x`` (finite values): z = (x - median) / max(1.4826 MAD, floor)."""
    med = float(np.median(x))
    mad = max(_MAD_TO_SIGMA * float(np.median(np.abs(x - med))), mad_floor)
    return (x - med) / mad, med, mad


class _Persist:
    """Per key: the ops (seq) of its outlier hits among the last ``n`` ops seen."""

    def __init__(self, k: int, n: int) -> None:
        self.k, self.n = k, n
        self.hits: dict[tuple[Any, ...], deque[int]] = {}

    def hit(self, key: tuple[Any, ...], seq: int) -> list[int] | None:
        q = self.hits.setdefault(key, deque())
        q.append(seq)
        while q and q[0] <= seq - self.n:
            q.popleft()
        return list(q) if len(q) >= self.k else None

    def age(self, seq: int) -> None:
        """Forget keys with no hit in the window (bounded memory on long runs)."""
        stale = [k for k, q in self.hits.items() if not q or q[-1] <= seq - self.n]
        for k in stale:
            del self.hits[k]


class C4Detector:
    """Streaming classifier for one communicator: :meth:`observe` each finished op,
    :meth:`poll` the oldest outstanding one.  Returns the new incidents."""

    def __init__(self, config: C4Config | None = None) -> None:
        self.config = (config or C4Config()).validate()
        self._persist = _Persist(self.config.persist_k, self.config.persist_n)
        self._reported: set[tuple[str, str, tuple[int, ...]]] = set()
        self._ops_seen = 0

    def clear(self, key: tuple[str, str, tuple[int, ...]] | None = None) -> None:
        """Allow an incident to be reported again (all of them without ``key``), e.g. after the restart."""
        if key is None:
            self._reported.clear()
        else:
            self._reported.discard(key)

    def _new(self, inc: Incident) -> list[Incident]:
        k = inc.key()
        if k in self._reported:
            return []
        self._reported.add(k)
        return [inc]

    # -- hangs ------------------------------------------------------------------------------------

    def poll(self, op: OpTrace, now: float) -> list[Incident]:
        """Classify ``op`` if it is still outstanding ``deadline_s`` after its first arrival."""
        cfg = self.config
        # (a hair of slack: ``t0 + deadline - t0`` is not always ``deadline`` in floating point)
        if op.complete or now - op.t0 < cfg.deadline_s - 1e-9:
            return []
        waited = now - op.t0
        missing = np.flatnonzero(np.isnan(op.arrival))
        if len(missing):
            entered = op.nodes - len(missing)
            return self._new(Incident(
                syndrome=NONCOMM_HANG, target="node", nodes=[int(n) for n in missing], seq=op.seq, ops=[op.seq],
                scores={"waited_s": waited, "entered": float(entered), "missing": float(len(missing))},
                at=now, detail=f"{len(missing)} of {op.nodes} nodes never entered op {op.seq} "
                               f"while {entered} waited {waited:.1f}s in it"))
        return self._comm_hang(op, now, waited)

    def _comm_hang(self, op: OpTrace, now: float, waited: float) -> list[Incident]:
        cfg = self.config
        unfinished = np.flatnonzero(np.isnan(op.finish))
        base = {"waited_s": waited, "unfinished": float(len(unfinished))}
        stalled = np.flatnonzero(op.edge_stalled) if op.edge_stalled is not None else np.array([], dtype=int)
        if not len(stalled):
            # no transport view: all we can say is who has not finished
            return self._new(Incident(
                syndrome=COMM_HANG, target="node", nodes=[int(n) for n in unfinished], seq=op.seq, ops=[op.seq],
                scores=base | {"stalled_edges": 0.0}, at=now, action=DRAIN_AND_RESTART,
                detail=f"all nodes entered op {op.seq}, {len(unfinished)} not finished after {waited:.1f}s; "
                       "no per-connection progress reported, so no endpoint can be named"))
        src, dst = op.edge_src[stalled], op.edge_dst[stalled]
        pairs = {(int(min(a, b)), int(max(a, b))) for a, b in zip(src, dst, strict=True)}
        # the common endpoint: the node on every stalled pair (with two or more peers it is the node,
        # with one pair both ends qualify, and the pair itself is what we can name)
        counts: dict[int, int] = {}
        for a, b in pairs:
            counts[a] = counts.get(a, 0) + 1
            counts[b] = counts.get(b, 0) + 1
        best = max(counts, key=lambda n: (counts[n], -n))
        scores = base | {"stalled_edges": float(len(stalled)), "stalled_pairs": float(len(pairs)),
                         "endpoint_share": counts[best] / len(pairs)}
        if len(pairs) == 1:
            a, b = next(iter(pairs))
            return self._new(Incident(
                syndrome=COMM_HANG, target="link", nodes=[a, b], link=[a, b], seq=op.seq, ops=[op.seq],
                scores=scores, at=now, action=RESTART_AVOIDING_LINK,
                detail=f"op {op.seq}: all entered, only connection {a}<->{b} has pending work and no progress"))
        if counts[best] == len(pairs) or counts[best] / len(pairs) >= cfg.nic_min_share:
            return self._new(Incident(
                syndrome=COMM_HANG, target="node", nodes=[best], seq=op.seq, ops=[op.seq], scores=scores,
                at=now, action=DRAIN_AND_RESTART,
                detail=f"op {op.seq}: {counts[best]} of {len(pairs)} stalled connections end at node {best}"))
        return self._new(Incident(
            syndrome=COMM_HANG, target="node", nodes=sorted(counts), seq=op.seq, ops=[op.seq], scores=scores,
            at=now, action=DRAIN_AND_RESTART,
            detail=f"op {op.seq}: {len(pairs)} stalled connections with no common endpoint"))

    # -- slow -------------------------------------------------------------------------------------

    def observe(self, op: OpTrace) -> list[Incident]:
        """Score a finished op; returns slow incidents once they persist."""
        cfg = self.config
        out: list[Incident] = []
        self._ops_seen += 1
        idx = np.flatnonzero(np.isfinite(op.arrival))
        arr = op.arrival[idx]
        span = float(np.nanmax(op.finish)) if op.nodes else 0.0
        late: list[int] = []
        if len(arr) >= 3:
            z, med, mad = robust_z(arr, cfg.mad_floor_s)
            guard = med + max(cfg.min_lag_excess_s, cfg.min_rel_excess * span)
            for n in np.flatnonzero((z > cfg.z_threshold) & (arr > guard)):
                node = int(idx[n])
                late.append(node)
                ops = self._persist.hit(("lag", node), op.seq)
                if ops is not None:
                    out += self._new(Incident(
                        syndrome=NONCOMM_SLOW, target="node", nodes=[node], seq=op.seq, ops=ops,
                        scores={"z": float(z[n]), "lag_s": float(arr[n] - med), "mad_s": mad},
                        at=op.t0 + float(arr[n]), action=DRAIN_AND_RESTART,
                        detail=f"node {node} arrived {arr[n] - med:.3f}s after the median node (z {z[n]:.1f}) "
                               f"in {len(ops)} of the last {cfg.persist_n} ops"))
        elif len(arr) == 2:
            lag = float(abs(arr[1] - arr[0]))
            n = 1 if arr[1] > arr[0] else 0
            if lag > max(cfg.two_node_min_lag_s, cfg.min_rel_excess * span):
                node = int(idx[n])
                late.append(node)
                ops = self._persist.hit(("lag", node), op.seq)
                if ops is not None:
                    out += self._new(Incident(
                        syndrome=NONCOMM_SLOW, target="node", nodes=[node], seq=op.seq, ops=ops,
                        scores={"lag_s": lag}, at=op.t0 + float(arr[n]), action=DRAIN_AND_RESTART,
                        detail=f"node {node} arrived {lag:.3f}s after the other node of two in {len(ops)} of "
                               f"the last {cfg.persist_n} ops"))
        if op.edge_s is not None and len(op.edge_s) >= 3:
            out += self._edges(op, late)
        if self._ops_seen % (4 * cfg.persist_n) == 0:
            self._persist.age(op.seq)
        return out

    def _edges(self, op: OpTrace, late: list[int]) -> list[Incident]:
        cfg = self.config
        ok = np.isfinite(op.edge_s)
        if late:
            # a late node's peers spend the wait in socket calls with it: its cells are explained by
            # its arrival, not by its NIC (C4 reads arrival before the transfer matrix for this reason)
            ok &= ~np.isin(op.edge_src, late) & ~np.isin(op.edge_dst, late)
        keep = np.flatnonzero(ok)
        if len(keep) < 3:
            return []
        s = op.edge_s[keep]
        z, med, mad = robust_z(s, cfg.mad_floor_s)
        guard = med + max(cfg.min_edge_excess_s, cfg.min_rel_excess * med)
        bad = np.flatnonzero((z > cfg.z_threshold) & (s > guard))
        if not len(bad):
            return []
        src, dst = op.edge_src[keep], op.edge_dst[keep]
        n = op.nodes
        out_deg = np.bincount(src, minlength=n)
        in_deg = np.bincount(dst, minlength=n)
        row = np.bincount(src[bad], minlength=n)
        col = np.bincount(dst[bad], minlength=n)
        nic = set()
        for node in np.flatnonzero(row >= cfg.nic_min_cells):
            if row[node] >= cfg.nic_min_share * out_deg[node]:
                nic.add(int(node))
        for node in np.flatnonzero(col >= cfg.nic_min_cells):
            if col[node] >= cfg.nic_min_share * in_deg[node]:
                nic.add(int(node))
        out: list[Incident] = []
        zmax: dict[tuple[Any, ...], float] = {}
        for i in bad:
            a, b = int(src[i]), int(dst[i])
            key: tuple[Any, ...] = ("nic", a) if a in nic else ("nic", b) if b in nic else ("link", min(a, b), max(a, b))
            zmax[key] = max(zmax.get(key, 0.0), float(z[i]))
        hits = {key: self._persist.hit(key, op.seq) for key in zmax}
        # a NIC that is only somewhat slow shows as a different one of its cells in each op, so no
        # single link persists: the node is the NIC when it had outlier cells in ``nic_spread_k`` of
        # the last ``persist_n`` ops, with ``nic_min_cells`` peers or more, none of them a persistent link
        for key in [k for k in zmax if k[0] == "link" and hits[k] is None]:
            for end in key[1:]:
                spread = self._spread(end, op.seq)
                if spread is not None and ("nic", end) not in hits:
                    hits[("nic", end)] = spread
                    zmax[("nic", end)] = zmax[key]
        for key, zk in list(zmax.items()):
            ops = hits[key]
            if ops is None:
                continue
            if key[0] == "link":
                # a NIC slightly slow shows as a different one of its cells in each op: a node that
                # is an endpoint of outlier links to several peers within the window is the NIC
                node = self._nic_across_ops(key[1], key[2], op.seq)
                for end in key[1:]:  # a NIC already named explains its links (reported once: no new incident)
                    if (COMM_SLOW, "node", (end,)) in self._reported:
                        node = end
                if node is not None:
                    key = ("nic", node)
            if key[0] == "nic":
                node = key[1]
                out += self._new(Incident(
                    syndrome=COMM_SLOW, target="node", nodes=[node], seq=op.seq, ops=ops,
                    scores={"z": zk, "row_cells": float(row[node]), "col_cells": float(col[node]),
                            "median_s": med, "mad_s": mad},
                    at=op.t0 + float(np.nanmax(op.finish)), action=DRAIN_AND_RESTART,
                    detail=f"node {node}'s connections are transfer-time outliers (row {row[node]}/{out_deg[node]}, "
                           f"column {col[node]}/{in_deg[node]}) in {len(ops)} of the last {cfg.persist_n} ops: its NIC"))
            else:
                a, b = key[1], key[2]
                out += self._new(Incident(
                    syndrome=COMM_SLOW, target="link", nodes=[a, b], link=[a, b], seq=op.seq, ops=ops,
                    scores={"z": zk, "median_s": med, "mad_s": mad},
                    at=op.t0 + float(np.nanmax(op.finish)), action=WATCH_LINK,
                    detail=f"link {a}<->{b} is a transfer-time outlier (z {zk:.1f}) in {len(ops)} of the last "
                           f"{cfg.persist_n} ops while both nodes' other connections are normal"))
        return out

    def _spread(self, node: int, seq: int) -> list[int] | None:
        """The ops in which ``node`` had outlier cells, when they make the spread-NIC pattern (see :meth:`_edges`)."""
        cfg = self.config
        ops: set[int] = set()
        partners = 0
        for key, q in self._persist.hits.items():
            if key[0] != "link" or node not in key[1:]:
                continue
            recent = [s for s in q if s > seq - self._persist.n]
            if not recent:
                continue
            if len(recent) >= cfg.persist_k:
                return None  # one link explains it
            partners += 1
            ops.update(recent)
        if len(ops) >= cfg.nic_spread_k and partners >= cfg.nic_min_cells:
            return sorted(ops)
        return None

    def _nic_across_ops(self, a: int, b: int, seq: int) -> int | None:
        """``a`` or ``b`` when it is the endpoint of recent outlier links to ``nic_min_cells`` peers or more."""
        peers: dict[int, set[int]] = {a: set(), b: set()}
        for key, q in self._persist.hits.items():
            # a partner link counts with two hits in the window: one is what noise gives now and then
            if key[0] != "link" or len(q) < 2 or q[-1] <= seq - self._persist.n:
                continue
            for end, other in ((key[1], key[2]), (key[2], key[1])):
                if end in peers:
                    peers[end].add(other)
        best = max((a, b), key=lambda n: (len(peers[n]), -n))
        return best if len(peers[best]) >= self.config.nic_min_cells else None

    def feed(self, ops: Iterable[OpTrace], now: float | None = None) -> list[Incident]:
        """Observe finished ops in order; poll unfinished ones at ``now`` (default: never hung)."""
        out: list[Incident] = []
        for op in ops:
            if op.complete:
                out += self.observe(op)
            elif now is not None:
                out += self.poll(op, now)
        return out


def trace_from_records(per_node: Mapping[int, OpRecord], nodes: int, *,
                       stalled: Iterable[tuple[int, int]] = ()) -> OpTrace:
    """The :class:`OpTrace` of one op from coord's per-node records (``OpStatsStore.ops()`` values).

    A node without a record, or whose record has no arrival, has not entered; a record not in
    ``done``/``failed`` has not finished.  Edges come from each record's ``stats.peers``
    (``transfer_s``).  ``OpRecord`` carries no per-connection progress, so ``stalled`` (pairs
    ``src -> dst`` with pending work and no progress) is passed in by whoever samples the
    transport; without it a communication hang names the unfinished nodes only.
    """
    if nodes < 1:
        raise InvalidArgument(f"trace_from_records: nodes must be >= 1, got {nodes}")
    entered: dict[int, float] = {}
    done: dict[int, float] = {}
    for n, rec in per_node.items():
        t = max(rec.arrivals.values()) if rec.arrivals else rec.started_at
        if t and not rec.missing:
            entered[n] = t
        if rec.phase in ("done", "failed") and rec.finished_at:
            done[n] = rec.finished_at
    t0 = min(entered.values()) if entered else 0.0
    arrival = np.full(nodes, np.nan)
    finish = np.full(nodes, np.nan)
    for n, t in entered.items():
        if 0 <= n < nodes:
            arrival[n] = t - t0
    for n, t in done.items():
        if 0 <= n < nodes:
            finish[n] = t - t0
    src: list[int] = []
    dst: list[int] = []
    secs: list[float] = []
    for n, rec in sorted(per_node.items()):
        if rec.stats is None:
            continue
        for peer, ps in sorted(rec.stats.peers.items()):
            src.append(n)
            dst.append(int(peer))
            secs.append(ps.transfer_s)
    stalled_set = set(stalled)
    for a, b in stalled_set:
        if (a, b) not in set(zip(src, dst, strict=True)):
            src.append(a)
            dst.append(b)
            secs.append(float("nan"))
    any_rec = next(iter(per_node.values()), None)
    return OpTrace(
        seq=any_rec.seq if any_rec else 0, generation=any_rec.generation if any_rec else 0, t0=t0,
        arrival=arrival, finish=finish, edge_src=np.array(src, dtype=np.int64),
        edge_dst=np.array(dst, dtype=np.int64), edge_s=np.array(secs, dtype=np.float64),
        edge_stalled=np.array([(a, b) in stalled_set for a, b in zip(src, dst, strict=True)], dtype=bool))
