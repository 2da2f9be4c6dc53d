"""services.health.detectors: telemetry batches and node advice become incidents for the core."""

from __future__ import annotations

import asyncio

from fireflyer.coord.convert import CommView, NodeView
from fireflyer.core.clock import ManualClock
from fireflyer.core.errors import NotFound
from fireflyer.core.log import get_logger
from fireflyer.health.c4 import C4Config
from fireflyer.health.events import NodeAdvice
from fireflyer.health.records import Blame, IncidentRecord
from fireflyer.hfreduce.telemetry import OpRecord, TelemetryBatch
from services.health.detectors import AdviceDetector, TelemetryDetector

CFG = C4Config(deadline_s=10.0, persist_k=3, persist_n=6)


def view(generation: int = 0, nodes: tuple[str, ...] = ("node0", "node1", "node2")) -> CommView:
    return CommView(comm="42/ddp", job="42", name="ddp", generation=generation, state="formed", reason="", culprit="",
                    nnodes=len(nodes), world_size=len(nodes), restart_count=generation,
                    nodes=tuple(NodeView(node=n, zone="A", node_rank=i, local_world_size=1, first_rank=i,
                                         address="", left=False) for i, n in enumerate(nodes)),
                    created_at=0.0, formed_at=0.0, ended_at=0.0, depth=1, cross_zone_pairs=0)


class Lookup:
    def __init__(self, v: CommView | None) -> None:
        self.v, self.calls = v, 0

    async def get(self, comm: str) -> CommView:
        self.calls += 1
        if self.v is None:
            raise NotFound(f"no communicator {comm}")
        return self.v


def batch(node: int, seqs: range, lag: float = 0.0, generation: int = 0) -> TelemetryBatch:
    recs = [OpRecord(comm="42/ddp", generation=generation, seq=s, kind="allreduce", op="sum", dtype="float32",
                     count=8, nbytes=32, node_rank=node, phase="done", started_at=100.0 + s + lag,
                     arrivals={0: 100.0 + s + lag}, finished_at=100.0 + s + 1.5) for s in seqs]
    return TelemetryBatch(comm="42/ddp", node_rank=node, records=recs)


def detector(lookup: Lookup) -> tuple[TelemetryDetector, list[IncidentRecord]]:
    got: list[IncidentRecord] = []

    async def report(rec: IncidentRecord) -> None:
        got.append(rec)
    return TelemetryDetector(CFG, lookup=lookup, report=report, clock=ManualClock(), log=get_logger("t")), got


def test_a_slow_node_is_reported_by_name_with_its_job() -> None:
    lookup = Lookup(view())
    det, got = detector(lookup)

    async def go() -> None:
        for n in range(3):
            await det.on_batch(batch(n, range(0, 8), lag=0.8 if n == 1 else 0.0))
    asyncio.run(go())
    assert len(got) == 1, got
    inc = got[0]
    assert (inc.kind, inc.blame, inc.node, inc.job) == ("c4.noncomm_slow", Blame.NODE, "node1", "42")
    assert inc.evidence["node_ranks"] == [1] and inc.evidence["comm"] == "42/ddp" and "1=node1" in inc.summary
    assert lookup.calls == 1, "coord is asked once per generation"


def test_a_restarted_generation_gets_a_fresh_detector_and_view() -> None:
    lookup = Lookup(view())
    det, got = detector(lookup)

    async def go() -> None:
        for n in range(3):
            await det.on_batch(batch(n, range(0, 2), lag=0.8 if n == 1 else 0.0))
        lookup.v = view(generation=1, nodes=("node0", "node2", "node1"))
        for n in range(3):  # node rank 1 is node2 now: its lag must be its own, not node1's history
            await det.on_batch(batch(n, range(0, 1), lag=0.8 if n == 1 else 0.0, generation=1))
    asyncio.run(go())
    assert got == [] and lookup.calls == 2 and det.feeds["42/ddp"].generation == 1


def test_a_communicator_coord_does_not_know_is_skipped_for_a_while() -> None:
    lookup = Lookup(None)
    det, got = detector(lookup)

    async def go() -> None:
        for _ in range(5):
            await det.on_batch(batch(0, range(0, 3)))
    asyncio.run(go())
    assert got == [] and lookup.calls == 1


def test_advice_blames_the_node_or_the_job() -> None:
    got: list[IncidentRecord] = []

    async def report(rec: IncidentRecord) -> None:
        got.append(rec)
    adv = AdviceDetector(report=report, log=get_logger("t"))

    async def go() -> None:
        await adv.on_advice(NodeAdvice(node="node2", action="drain", source="flashcut", interface="ib0",
                                       reason="3 link flaps in 600 s"))
        await adv.on_advice(NodeAdvice(node="node1", action="restart_job", source="xid", pci="0000:3b:00",
                                       pid=4242, reason="Xid 13: graphics engine exception"))
        await adv.on_advice(NodeAdvice(node="node1", action="none", source="xid"))
    asyncio.run(go())
    assert [(r.kind, r.blame, r.node) for r in got] == [("flashcut.drain", Blame.NODE, "node2"),
                                                        ("xid.restart_job", Blame.JOB, "")]
    assert "ib0" in got[0].summary and got[1].evidence["pid"] == 4242
