"""The services' own metrics: each class fed what its service feeds it, then scraped."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fireflyer.ckpt.model import CheckpointRecord, CkptState
from fireflyer.hfreduce.telemetry import OpRecord
from fireflyer.mgmt.model import PublicState
from fireflyer.sched.model import NodeView
from fireflyer.storage.protocol import OP_BATCH_READ, OP_QUERY_LAST, OP_UPDATE, OP_WRITE
from fireflyer.telemetry.metrics import ServiceMetrics
from services.checkpoint.metrics import CheckpointMetrics
from services.coord.metrics import CoordMetrics
from services.scheduler.metrics import QueueView, SchedulerMetrics, queue_view
from services.storage.metrics import StorageMetrics


def _get(m: ServiceMetrics, name: str, **labels: str) -> float | None:
    want = {**labels, "service": m.service}
    for f in text_string_to_metric_families(m.scrape()):
        for s in f.samples:
            if s.name == name and s.labels == want:
                return s.value
    return None


def _op(node_rank: int, seq: int, nbytes: int, secs: float, error: str = "") -> OpRecord:
    return OpRecord(comm="job-1", seq=seq, kind="allreduce", op="sum", dtype="float32", count=nbytes // 4,
                    nbytes=nbytes, node_rank=node_rank, started_at=100.0, finished_at=100.0 + secs, error=error)


def test_coord_counts_each_op_once_from_node_rank_0() -> None:
    m = ServiceMetrics("coord")
    cm = CoordMetrics(m)
    cm.observe("job-1", [_op(0, 1, 4096, 0.002), _op(1, 1, 4096, 0.003), _op(0, 2, 1 << 20, 0.02)])
    cm.observe("job-1", [_op(0, 3, 4096, 0.0, error="timed out")])
    labels = {"comm": "job-1", "kind": "allreduce"}
    assert _get(m, "ff_hfreduce_bytes_total", **labels) == 4096 + (1 << 20)
    assert _get(m, "ff_hfreduce_op_duration_seconds_count", **labels) == 2
    assert abs((_get(m, "ff_hfreduce_op_duration_seconds_sum", **labels) or 0) - 0.022) < 1e-9
    assert _get(m, "ff_hfreduce_op_errors_total", **labels) == 1


def test_storage_bytes_and_targets_by_state() -> None:
    m = ServiceMetrics("storage")
    sm = StorageMetrics(m)
    sm.wrote(OP_WRITE, 1000)
    sm.wrote(OP_UPDATE, 1000)
    sm.wrote(OP_QUERY_LAST, 50)  # not a write op: not counted
    sm.read(OP_BATCH_READ, 300)
    sm.read("local", 200)
    assert _get(m, "ff_storage_write_bytes_total", op="write") == 1000
    assert _get(m, "ff_storage_write_bytes_total", op="update") == 1000
    assert _get(m, "ff_storage_read_bytes_total", op="batch_read") == 300
    assert _get(m, "ff_storage_read_bytes_total", op="local") == 200
    sm.set_targets([PublicState.SERVING, PublicState.SERVING, None])
    assert _get(m, "ff_storage_targets", state="serving") == 2 and _get(m, "ff_storage_targets", state="none") == 1
    sm.set_targets([PublicState.SERVING, PublicState.OFFLINE, PublicState.SYNCING])
    assert _get(m, "ff_storage_targets", state="serving") == 1
    assert _get(m, "ff_storage_targets", state="none") == 0  # a state gone reads 0, not its old value
    assert _get(m, "ff_storage_targets", state="offline") == 1


def test_scheduler_reports_queue_and_nodes_only_as_leader() -> None:
    m = ServiceMetrics("scheduler")
    state: dict[str, object] = {"leader": True, "view": None}
    SchedulerMetrics(m, is_leader=lambda: bool(state["leader"]), view=lambda: state["view"])  # type: ignore[arg-type,return-value]
    assert _get(m, "ff_scheduler_leader") == 1 and _get(m, "ff_scheduler_pending_tasks", reason="quota") is None
    view = queue_view(["quota", "quota", "nodes", "held"],
                      [NodeView(name="n0", task=7), NodeView(name="n1"), NodeView(name="n2", state="drained")])
    assert view == QueueView(pending={"quota": 2, "nodes": 1, "held": 1},
                             nodes={("enabled", "busy"): 1, ("enabled", "free"): 1, ("drained", "free"): 1})
    state["view"] = view
    assert _get(m, "ff_scheduler_pending_tasks", reason="quota") == 2
    assert _get(m, "ff_scheduler_nodes", state="enabled", busy="busy") == 1
    state["view"] = queue_view(["nodes"], [NodeView(name="n0", task=7)])
    assert _get(m, "ff_scheduler_pending_tasks", reason="quota") is None  # gone with its runs
    assert _get(m, "ff_scheduler_pending_tasks", reason="nodes") == 1
    state["leader"] = False
    assert _get(m, "ff_scheduler_leader") == 0 and _get(m, "ff_scheduler_pending_tasks", reason="nodes") is None


def test_checkpoint_counts_committed_saves_bytes_and_duration() -> None:
    m = ServiceMetrics("checkpoint")
    cm = CheckpointMetrics(m)
    assert _get(m, "ff_checkpoint_saves_total") == 0
    cm.committed(CheckpointRecord(id="c1", job="j", step=1, world_size=2, directory="/ckpt/j/1",
                                  state=CkptState.COMMITTED, created_at=10.0, committed_at=12.5, nbytes=1 << 20))
    assert _get(m, "ff_checkpoint_saves_total") == 1
    assert _get(m, "ff_checkpoint_saved_bytes_total") == 1 << 20
    assert _get(m, "ff_checkpoint_save_duration_seconds_sum") == 2.5
    assert _get(m, "ff_checkpoint_save_duration_seconds_bucket", le="2.5") == 1
    assert _get(m, "ff_checkpoint_save_duration_seconds_bucket", le="1.0") == 0
