"""From the HFReduce workers' telemetry stream to C4 incidents, one communicator at a time.

Each node's worker publishes its finished ops (:class:`~fireflyer.hfreduce.telemetry.OpRecord`,
in :class:`~fireflyer.hfreduce.telemetry.TelemetryBatch` es about once a second); records of one op
arrive from different nodes at different times.  :class:`CommFeed` collects them per op and hands
each op to a :class:`~fireflyer.health.c4.C4Detector` once it can be judged:

- every node has reported it finished -> :meth:`C4Detector.observe` (the slow syndromes), in op
  order, so persistence counts consecutive ops;
- some node reported it **failed** (the worker's op deadline passed: a rank never arrived or a peer
  made no progress) -> once every node reported it, or ``failed_grace_s`` after the first failure
  (the other nodes' batches are a publish interval behind), :meth:`C4Detector.poll` at the deadline
  (the hang syndromes): nodes that never entered are named -- a node whose worker sent nothing for
  the op, or whose record lists ``missing`` local ranks; earlier ops still short of a node's record
  are then dropped unjudged (the communicator failed after them: a node stopped between two
  telemetry batches never publishes its last ops, and they must not hold the failed op back);
- nothing more arrives for ``stale_s`` -> dropped (the job ended, or a node's telemetry was lost;
  the op deadline makes a real hang end as a failure, which is reported).

A new communicator generation (the job restarted, perhaps on other nodes) starts a fresh detector.
Pure: records in, :class:`~fireflyer.health.c4.Incident` s out; the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Iterable

from fireflyer.hfreduce.telemetry import OpRecord

from .c4 import C4Config, C4Detector, Incident, trace_from_records

__all__ = ["CommFeed"]


class CommFeed:
    """One communicator's ops being assembled, and its detector."""

    def __init__(self, comm: str, nnodes: int, config: C4Config, *, generation: int = 0,
                 failed_grace_s: float = 3.0, stale_s: float = 60.0, max_pending: int = 4096) -> None:
        self.comm = comm
        self.nnodes = nnodes
        self.generation = generation
        self.config = config
        self.failed_grace_s = failed_grace_s
        self.stale_s = stale_s
        self.max_pending = max_pending
        self.detector = C4Detector(config)
        #: seq -> node rank -> record, for ops not judged yet
        self._ops: dict[int, dict[int, OpRecord]] = {}
        #: seq -> when its last record arrived (the caller's clock)
        self._heard: dict[int, float] = {}
        #: seq -> when its first failed record arrived
        self._failed_at: dict[int, float] = {}
        #: the highest seq judged: records of older ops are late and ignored
        self._judged = -1
        self.ops_observed = 0
        #: ops dropped unjudged because a later op failed before every node's record of them came
        self.ops_unjudged = 0

    def add(self, node_rank: int, records: Iterable[OpRecord], now: float) -> list[Incident]:
        """Take one node's records; returns the incidents the ops they complete reveal."""
        out: list[Incident] = []
        for rec in records:
            if rec.generation != self.generation or rec.seq <= self._judged or not 0 <= node_rank < self.nnodes:
                continue
            self._ops.setdefault(rec.seq, {})[node_rank] = rec
            self._heard[rec.seq] = now
            if rec.phase == "failed":
                self._failed_at.setdefault(rec.seq, now)
        if len(self._ops) > self.max_pending:  # a node that never reports must not grow this forever
            for seq in sorted(self._ops)[: len(self._ops) - self.max_pending]:
                self._forget(seq)
        out += self._judge_ready(now)
        return out

    def tick(self, now: float) -> list[Incident]:
        """Judge failed ops whose grace passed; drop ops nothing was heard of for ``stale_s`` (never
        judged: the job ended or a node's telemetry was lost -- no evidence either way)."""
        out = self._judge_ready(now)
        for seq in [s for s, t in self._heard.items() if now - t > self.stale_s]:
            self._forget(seq)
        return out

    @property
    def pending(self) -> int:
        return len(self._ops)

    def _forget(self, seq: int) -> None:
        self._ops.pop(seq, None)
        self._heard.pop(seq, None)
        self._failed_at.pop(seq, None)

    def _failed_ready(self, seq: int, now: float) -> bool:
        """A failed op is judged once every node reported it, or ``failed_grace_s`` after its first failure."""
        return len(self._ops[seq]) == self.nnodes or now - self._failed_at[seq] >= self.failed_grace_s

    def _judge_ready(self, now: float) -> list[Incident]:
        out: list[Incident] = []
        # a failed op ready to be judged settles every op before it: the communicator failed after them,
        # so one still missing a node's record never completes -- that node's worker stopped (or died)
        # before publishing its last batch, the very node the failed op is likely to name
        settled = max((s for s in self._failed_at if self._failed_ready(s, now)), default=-1)
        for seq in sorted(self._ops):
            per_node = self._ops[seq]
            failed = seq in self._failed_at
            everyone = len(per_node) == self.nnodes
            complete = everyone and not failed and all(r.phase == "done" for r in per_node.values())
            if not (complete or (failed and (seq <= settled or self._failed_ready(seq, now)))):
                if seq < settled:
                    # partial records of an op that finished: no evidence of a hang or of slowness
                    self._forget(seq)
                    self._judged = seq
                    self.ops_unjudged += 1
                    continue
                # the slow syndromes need ops in order: later ops wait while this one can still be judged
                break
            self._forget(seq)
            self._judged = seq
            trace = trace_from_records(per_node, self.nnodes)
            trace.seq, trace.generation = seq, self.generation
            if complete:
                self.ops_observed += 1
                out += self.detector.observe(trace)
            else:
                # a worker gave up on it at its op deadline: judge it as outstanding at that deadline
                # (a failed node did not finish it, whatever time its record ended at)
                for n, r in per_node.items():
                    if r.phase == "failed":
                        trace.finish[n] = float("nan")
                out += self.detector.poll(trace, trace.t0 + self.config.deadline_s)
        return out
