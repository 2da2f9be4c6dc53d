"""coord's Prometheus metrics: HFReduce bandwidth from the collective telemetry workers send.

``ff_hfreduce_bytes_total{comm,kind}`` and ``ff_hfreduce_op_duration_seconds{comm,kind}``;
``rate(bytes) / rate(duration_sum)`` is the algorithm bandwidth of a communicator.
"""

from __future__ import annotations

from collections.abc import Iterable

from fireflyer.hfreduce.telemetry import OpRecord
from fireflyer.telemetry.metrics import ServiceMetrics

__all__ = ["CoordMetrics", "OP_DURATION_BUCKETS"]

#: seconds: a small allreduce on one host (~100 us) to a multi-GB one across nodes
OP_DURATION_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)


class CoordMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.bytes = metrics.counter("hfreduce_bytes", "Bytes reduced by finished HFReduce ops (each op once)",
                                     ("comm", "kind"))
        self.duration = metrics.histogram("hfreduce_op_duration_seconds",
                                          "HFReduce op duration, start to finish on node rank 0",
                                          ("comm", "kind"), buckets=OP_DURATION_BUCKETS)
        self.failed = metrics.counter("hfreduce_op_errors", "HFReduce ops that ended with an error",
                                      ("comm", "kind"))

    def observe(self, comm: str, records: Iterable[OpRecord]) -> None:
        """Count a telemetry batch's ops.  Every node reports each op; node rank 0's record
        (which every communicator has) stands for the op, so an op counts once."""
        for rec in records:
            if rec.node_rank != 0:
                continue
            if rec.error:
                self.failed.labels(comm=comm, kind=rec.kind).inc()
                continue
            self.bytes.labels(comm=comm, kind=rec.kind).inc(rec.nbytes)
            if rec.finished_at > rec.started_at > 0:
                self.duration.labels(comm=comm, kind=rec.kind).observe(rec.finished_at - rec.started_at)
