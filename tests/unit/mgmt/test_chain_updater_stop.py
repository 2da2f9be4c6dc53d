"""The mgmtd chain updater ends when cancelled, even as a wake-up lands with the cancel.

The updater waits for a wake-up (a heartbeat or scan changed the registry) or its interval.
With ``asyncio.wait_for`` around that wait, a cancel landing in the same loop iteration as
the wake-up could be lost on Python 3.11: the loop ran another chain update and went back
to sleep for a whole interval, and whoever awaited the cancelled task hung with it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvloop

from fireflyer.core.clock import ManualClock
from fireflyer.core.log import get_logger
from fireflyer.kv import open_kv
from fireflyer.mgmt.lease import LeaseConfig
from services.mgmtd.loops import CoreConfig, MgmtdCore


def _core(tmp_path: Path) -> MgmtdCore:
    cfg = CoreConfig(node_id="mgmtd-0", cluster_id="t", lease=LeaseConfig(),
                     fail_interval_s=60.0, scan_interval_s=60.0,
                     chain_update_interval_s=60.0)  # a lost cancel would sleep this long
    return MgmtdCore(cfg, kv=open_kv(f"sqlite:///{tmp_path}/mgmtd.db"), bus=None, clock=ManualClock(),
                     log=get_logger("test.mgmtd"), address=lambda: "127.0.0.1:1")


@pytest.mark.parametrize("loop_impl", ["asyncio", "uvloop"])
def test_updater_ends_when_a_wake_up_lands_with_the_cancel(tmp_path: Path, loop_impl: str) -> None:
    async def main() -> int:
        core = _core(tmp_path / loop_impl)
        await core.lease_pass()  # the only replica: takes the lease, starts its primary loops
        assert core.is_primary()
        registry = core.registry
        core.step_down("the test drives the updater itself")  # stops the primary's own loops
        core.registry = registry  # the updater runs while a registry is held
        cancelled = 0
        for i in range(200):
            task = asyncio.create_task(core._update_loop())
            for _ in range(i % 3):  # the race at a few phases of the loop
                await asyncio.sleep(0)
            core._wake.set()  # a heartbeat changed something ...
            task.cancel()  # ... as the replica steps down
            done, _ = await asyncio.wait({task}, timeout=2.0)
            assert done, f"iteration {i}: the chain updater did not end within 2 s of its cancel"
            cancelled += int(task.cancelled())
        await core.release()
        return cancelled

    (tmp_path / loop_impl).mkdir()
    if loop_impl == "uvloop":
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            assert r.run(main()) == 200
    else:
        assert asyncio.run(main()) == 200
