"""``python -m services.scheduler`` as processes: two replicas over one SQLite file elect one leader,
``ff task`` reaches them through FF_SCHED_ADDR, SIGKILL of the leader hands over within the lease;
bad settings fail start-up naming the key."""

from __future__ import annotations

import signal
import time

import pytest

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.core.errors import SettingsError
from fireflyer.sched.client import SchedClient
from fireflyer.testing.poll import wait_for
from fireflyer.testing.services import ServiceProcess
from services.scheduler.app import SchedulerSection, SchedulerSettings, core_config

ENV = {"FF_SCHEDULER_LEASE_S": "1.5", "FF_SCHEDULER_RENEW_S": "0.2", "FF_SCHEDULER_STEP_DOWN_MARGIN_S": "0.3",
       "FF_SCHEDULER_TICK_S": "0.2", "FF_GRACE_S": "1"}


async def test_two_processes_one_leader_and_sigkill_failover(tmp_path, tokens) -> None:  # type: ignore[no-untyped-def]
    procs = [ServiceProcess("services.scheduler", state_dir=tmp_path, nats_url="", tokens_file=tokens.path,
                            instance=f"scheduler-{i}", env=ENV).start() for i in range(2)]
    try:
        for p in procs:
            await p.wait_healthy(timeout_s=30)
        svc = SchedClient([p.address for p in procs], token=tokens["svc-node"])
        await svc.register_node(pb.RegisterNodeRequest(name="n1", group="default", zone="A"))
        alice = SchedClient([p.address for p in procs], token=tokens["alice"])
        tid = (await alice.submit(pb.TaskSpec(nodes=1, command=["x"]))).chain_id
        # no agents in these processes: the start fails, the run is unschedulable and requeued
        await wait_for(lambda: _runs(alice, tid, 2), timeout_s=10, what="the run requeued after its failed start")
        # ... and waits before the next try instead of looping
        nxt = (await alice.get(tid)).runs[-1]
        assert nxt.reason_code == "backoff" and nxt.restart_count == 1, nxt
        holder = await _lease_holder(tmp_path)
        leader = next(p for p in procs if p.instance == holder)
        leader.signal(signal.SIGKILL)
        leader.wait(5)
        killed = time.monotonic()
        chain = await alice.get(tid)
        assert chain.chain_id == tid and chain.runs[0].stop_reasons == ["UNSCHEDULABLE"]
        # the survivor takes the writes within the lease
        await svc.register_node(pb.RegisterNodeRequest(name="n2", group="default", zone="A"))
        assert time.monotonic() - killed < 1.5 + 2.0
        await svc.close()
        await alice.close()
    finally:
        for p in procs:
            p.stop(timeout_s=5)


async def _runs(c: SchedClient, tid: int, n: int) -> bool:
    return len((await c.get(tid)).runs) >= n


async def _lease_holder(tmp_path) -> str:  # type: ignore[no-untyped-def]
    from fireflyer.kv import aopen_kv
    from services.scheduler import store

    kv = await aopen_kv(f"sqlite:///{tmp_path}/scheduler.db")
    try:
        rec = await kv.arun(lambda t: store.load_lease(t, snapshot=True))
    finally:
        kv.close()
    assert rec is not None
    return rec.holder


@pytest.mark.parametrize(("section", "key"), [
    (dict(lease_s=1.0, renew_s=2.0), "scheduler.renew_s"),
    (dict(tick_s=0.0), "scheduler.tick_s"),
    (dict(grace_ack_s=-1.0), "scheduler.grace_ack_s"),
    (dict(grace_final_s=7200.0), "scheduler.grace_final_s"),
    (dict(auto_fallback="SOON"), "scheduler.auto_fallback"),
    (dict(node_timeout_s=0.5), "scheduler.node_timeout_s"),
])
def test_bad_settings_name_the_key(section, key) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SettingsError) as e:
        core_config(SchedulerSettings(scheduler=SchedulerSection(**section)), "scheduler-0")
    assert e.value.fields["key"] == key
