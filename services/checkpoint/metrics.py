"""checkpoint's Prometheus metrics: checkpoints saved (committed), their bytes and how long a save took.

- ``ff_checkpoint_saves_total``: checkpoints committed;
- ``ff_checkpoint_saved_bytes_total``: their tensor bytes (every rank's shards);
- ``ff_checkpoint_save_duration_seconds``: Begin to the last CommitShard (the save as the job sees it).
"""

from __future__ import annotations

from fireflyer.ckpt.model import CheckpointRecord
from fireflyer.telemetry.metrics import ServiceMetrics

__all__ = ["CheckpointMetrics", "SAVE_DURATION_BUCKETS"]

#: seconds: a small test model (tens of ms) to a large sharded one (minutes)
SAVE_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class CheckpointMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.saves = metrics.counter("checkpoint_saves", "Checkpoints committed")
        self.bytes = metrics.counter("checkpoint_saved_bytes", "Tensor bytes of committed checkpoints")
        self.duration = metrics.histogram("checkpoint_save_duration_seconds",
                                          "Checkpoint save time, Begin to commit", buckets=SAVE_DURATION_BUCKETS)

    def committed(self, rec: CheckpointRecord) -> None:
        """One checkpoint committed (called from the catalog's worker thread: the metrics are thread-safe)."""
        self.saves.inc()
        self.bytes.inc(rec.nbytes)
        if rec.committed_at >= rec.created_at > 0:
            self.duration.observe(rec.committed_at - rec.created_at)
