"""Publishing :class:`~fireflyer.ckpt.model.CheckpointCommitted` on JetStream.

The event's ``event_id`` is the checkpoint id and the bus puts it in ``Nats-Msg-Id``, so a
retried publish of one commit (the service's outbox retries until JetStream acks) is stored once (within the stream's duplicate window).
"""

from __future__ import annotations

from fireflyer.bus import pattern, subject
from fireflyer.ckpt.model import CheckpointCommitted, CheckpointRecord

__all__ = ["STREAM", "STREAM_SUBJECTS", "committed_subject", "committed_event"]

STREAM = "FF_CKPT"
STREAM_SUBJECTS = [pattern("ckpt", entity=">")]  # ff.ckpt.v1.>


def committed_subject(job: str) -> str:
    """``ff.ckpt.v1.job.<job>.committed`` (job names have no '.': ``check_job``)."""
    return subject("ckpt", "job", job, "committed")


def committed_event(rec: CheckpointRecord) -> CheckpointCommitted:
    return CheckpointCommitted(event_id=rec.id, id=rec.id, job=rec.job, step=rec.step, world_size=rec.world_size,
                               directory=rec.directory, nbytes=rec.nbytes, committed_at=rec.committed_at)

