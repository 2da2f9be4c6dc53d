"""Pure rules of up/status/down, without processes."""

from __future__ import annotations

import pytest

from fireflyer.cluster.decisions import (
    MGMTD_PHASE,
    NATS_PHASE,
    ProcInfo,
    StopOutcome,
    StopTarget,
    UpVerdict,
    decide_up,
    is_ours,
    nats_status_row,
    parse_proc_stat,
    status_exit_code,
    status_row,
    stop_outcome,
    stop_phase,
    stop_targets,
    tail_lines,
)
from fireflyer.cluster.records import ClusterRecord, NatsRecord, ProcessRecord


def _proc(instance: str, pid: int, ticks: int | None = 100) -> ProcessRecord:
    return ProcessRecord(name=instance.rsplit("-", 1)[0], instance=instance, module="m", pid=pid, start_ticks=ticks,
                         address="127.0.0.1:1", log=f"/l/{instance}.log", started_at=0.0)


def _record(*procs: ProcessRecord, managed: bool = True) -> ClusterRecord:
    nats = (NatsRecord(url="nats://127.0.0.1:5", managed=True, pid=10, start_ticks=50, port=5)
            if managed else NatsRecord(url="nats://elsewhere:4222", managed=False))
    return ClusterRecord(state_dir="/s", config="/c", started_at=0.0, nats=nats, processes=list(procs),
                         tokens_file="/s/tokens.json", spans_file="/s/spans.jsonl")


def test_parse_proc_stat_with_awkward_command_name() -> None:
    # comm may hold spaces and ')' — fields are counted after the last ')'
    fields = ["S", *[str(i) for i in range(4, 22)], "987654", "0"]
    text = "4242 (we ird) name) " + " ".join(fields) + "\n"
    assert parse_proc_stat(text) == ("S", 987654)


@pytest.mark.parametrize(
    ("recorded", "seen", "ours"),
    [
        (100, ProcInfo(7, 100), True),
        (100, ProcInfo(7, 101), False),  # pid recycled: someone else's process
        (100, None, False),  # gone
        (100, ProcInfo(7, 100, zombie=True), False),  # exited, not yet reaped
        (None, ProcInfo(7, 5), True),  # no start time recorded: pid is all we have
        (100, ProcInfo(7, None), True),
    ],
)
def test_is_ours(recorded: int | None, seen: ProcInfo | None, ours: bool) -> None:
    assert is_ours(recorded, seen) is ours


def test_decide_up() -> None:
    assert decide_up(None, {}).verdict is UpVerdict.FRESH
    rec = _record(_proc("echo-0", 20), _proc("meta-0", 21))
    assert decide_up(rec, {"echo-0": False, "meta-0": False, "nats": False}).verdict is UpVerdict.STALE
    d = decide_up(rec, {"echo-0": False, "meta-0": True, "nats": True})
    assert d.verdict is UpVerdict.REFUSE and d.alive == ["meta-0", "nats"]


def test_decide_up_ignores_external_nats() -> None:
    rec = _record(_proc("echo-0", 20), managed=False)
    assert decide_up(rec, {"echo-0": False, "nats": True}).verdict is UpVerdict.STALE


def test_stop_targets_services_newest_first_then_nats() -> None:
    rec = _record(_proc("a-0", 20), _proc("b-0", 21, ticks=7), _proc("c-0", 22))
    targets, gone = stop_targets(rec, {"a-0": True, "b-0": True, "c-0": False, "nats": True})
    assert targets == [StopTarget("b-0", 21, 7), StopTarget("a-0", 20, 100), StopTarget("nats", 10, 50, phase=NATS_PHASE)]
    assert gone == ["c-0"]


def test_stop_targets_mgmtd_after_the_services_that_report_to_it() -> None:
    rec = _record(_proc("mgmtd-0", 20), _proc("storage-0", 21), _proc("mgmtd-1", 22), _proc("meta-0", 23))
    targets, _ = stop_targets(rec, dict.fromkeys(["mgmtd-0", "storage-0", "mgmtd-1", "meta-0", "nats"], True))
    assert [(t.label, t.phase) for t in targets] == [("meta-0", 0), ("mgmtd-1", MGMTD_PHASE), ("storage-0", 0),
                                                      ("mgmtd-0", MGMTD_PHASE), ("nats", NATS_PHASE)]
    assert 0 < MGMTD_PHASE < NATS_PHASE and stop_phase("storage") == 0 and stop_phase("mgmtd") == MGMTD_PHASE


def test_stop_targets_never_external_nats() -> None:
    rec = _record(_proc("a-0", 20), managed=False)
    targets, gone = stop_targets(rec, {"a-0": True, "nats": True})
    assert [t.label for t in targets] == ["a-0"] and gone == []


def test_stop_outcome() -> None:
    assert stop_outcome(gone_after_term=True, gone_after_kill=False) is StopOutcome.STOPPED
    assert stop_outcome(gone_after_term=False, gone_after_kill=True) is StopOutcome.KILLED
    assert stop_outcome(gone_after_term=False, gone_after_kill=False) is StopOutcome.SURVIVED


def test_status_rows_and_exit_code() -> None:
    ok = status_row(name="echo", instance="echo-0", pid=5, address="a", log="l", alive=True, health="SERVING")
    assert ok.state == "running" and ok.healthy
    sick = status_row(name="echo", instance="echo-1", pid=6, address="a", log="l", alive=True, health="NOT_SERVING")
    assert not sick.healthy
    silent = status_row(name="echo", instance="echo-2", pid=6, address="a", log="l", alive=True, health=None)
    assert silent.health == "unreachable"
    dead = status_row(name="echo", instance="echo-3", pid=7, address="a", log="l", alive=False, health=None,
                      log_tail=["boom"])
    assert dead.state == "crashed" and dead.log_tail == ["boom"] and not dead.healthy
    nats = nats_status_row(url="nats://h:1", managed=True, pid=3, log="n", alive=True, reachable=True)
    assert nats.healthy
    ext = nats_status_row(url="nats://h:1", managed=False, pid=None, log=None, alive=True, reachable=True)
    assert ext.state == "external" and ext.healthy
    assert status_exit_code([nats, ok]) == 0
    assert status_exit_code([nats, ok, sick]) == 1
    assert status_exit_code([nats, dead]) == 1
    assert status_exit_code([]) == 1


def test_tail_lines() -> None:
    text = "".join(f"line {i}\n" for i in range(30))
    assert tail_lines(text, 3) == ["line 27", "line 28", "line 29"]
    assert tail_lines("", 5) == []
    assert tail_lines("a\nb", 0) == []


def test_every_service_learns_every_services_addresses():
    from fireflyer.cluster.supervisor import address_env

    env = address_env([("mgmtd", "127.0.0.1:1"), ("mgmtd", "127.0.0.1:2"), ("meta", "127.0.0.1:3"),
                       ("checkpoint", "127.0.0.1:4"), ("scheduler", "127.0.0.1:5")])
    assert env == {"FF_MGMTD_ADDR": "127.0.0.1:1,127.0.0.1:2", "FF_META_ADDR": "127.0.0.1:3",
                   "FF_CKPT_ADDR": "127.0.0.1:4", "FF_SCHED_ADDR": "127.0.0.1:5"}
