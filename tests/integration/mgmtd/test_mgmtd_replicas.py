"""Several mgmtd replicas over one KV: one primary, redirects, failover after kill -9."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from mgmtd_harness import LEASE_S, RENEW_S

from fireflyer.api.mgmtd.v1 import mgmtd_pb2 as pb
from fireflyer.api.mgmtd.v1 import mgmtd_pb2_grpc as pb_grpc
from fireflyer.core.errors import FireFlyerError
from fireflyer.mgmt.client import MgmtdClient
from fireflyer.mgmt.edits import ChainSpec, TargetSpec
from fireflyer.mgmt.lease import NotPrimary
from fireflyer.rpc import connect
from fireflyer.testing.poll import wait_for

CHAIN = ChainSpec(chain_id=1, targets=(TargetSpec(target_id=101, node_id="storage-1"),
                                       TargetSpec(target_id=102, node_id="storage-2")))


async def test_one_primary_redirects_and_kill_9_failover(start_replicas, mgmtd_kv_url, tokens):
    reps = await start_replicas(3, mgmtd_kv_url)
    primary = await reps.wait_primary()
    secondary = next(p for p in reps.procs if p is not primary)

    # a write sent to a secondary is refused, naming the primary and its address
    async with connect(secondary.address, token=tokens.admin) as ch:
        with pytest.raises(NotPrimary) as err:
            await pb_grpc.MgmtdServiceStub(ch).CreateChainTable(
                pb.CreateChainTableRequest(table_id=1, chain_ids=[1]))
    assert err.value.fields["primary"] == primary.instance
    assert err.value.fields["primary_address"] == primary.address
    assert err.value.code == "FAILED_PRECONDITION"

    # a client that only knows the secondary follows the redirect
    async with MgmtdClient([secondary.address], token=tokens.admin) as only_secondary:
        version, chains = await only_secondary.create_chains([CHAIN])
        assert only_secondary.primary_address == primary.address
    assert [c.target_ids for c in chains] == [(101, 102)]
    before = await reps.client.get_routing()
    assert before is not None and before.version == version

    # reads keep being served by every live replica while the primary dies and is replaced
    failures: list[str] = []
    answered: dict[str, int] = {}
    stop = asyncio.Event()

    async def reader(addr: str) -> None:
        async with MgmtdClient([addr], token=tokens.user, call_timeout_s=1.0) as c:
            while not stop.is_set():
                try:
                    r = await c.get_routing()
                    assert r is not None and r.version >= version
                    answered[addr] = answered.get(addr, 0) + 1
                except FireFlyerError as e:
                    failures.append(f"{addr}: {e!r}")
                await asyncio.sleep(0.02)

    survivors = [p for p in reps.procs if p is not primary]
    readers = [asyncio.create_task(reader(p.address)) for p in survivors]
    await wait_for(lambda: all(answered.get(p.address) for p in survivors), timeout_s=5, what="readers running")

    killed_at = time.monotonic()
    primary.signal(signal.SIGKILL)
    primary.wait(5.0)
    new_primary = await reps.wait_primary(timeout_s=LEASE_S + RENEW_S + 3.0)
    took = time.monotonic() - killed_at
    print(f"takeover after kill -9: {took:.2f}s")
    counts = dict(answered)
    await wait_for(lambda: all(answered[p.address] > counts[p.address] + 3 for p in survivors), timeout_s=5,
                   what="reads after the failover")
    stop.set()
    await asyncio.gather(*readers)

    assert new_primary is not primary
    # within one lease period, plus one renewal pass and a margin for process scheduling
    assert took <= LEASE_S + RENEW_S + 1.0, f"takeover took {took:.2f}s"
    assert failures == []
    view = await reps.client.get_primary(new_primary.address)
    assert view.term >= 2 and view.primary_address == new_primary.address

    # the new primary has the state and takes writes; the client finds it after its old primary died
    routing = await reps.client.get_routing()
    assert routing is not None and [c.chain_id for c in routing.chains] == [1]
    version2, table = await reps.client.create_chain_table(1, [1], "after failover")
    assert version2 == routing.version + 1 and table.version == 1


async def test_sigterm_releases_the_lease_for_a_fast_handover(start_replicas, sqlite_kv_url):
    reps = await start_replicas(2, sqlite_kv_url, FF_MGMTD_LEASE_S="30", FF_MGMTD_RENEW_S="0.3",
                                FF_MGMTD_STEP_DOWN_MARGIN_S="1")
    primary = await reps.wait_primary()
    started = time.monotonic()
    assert primary.stop(timeout_s=10.0) == 0
    other = await reps.wait_primary(timeout_s=5.0)
    assert other is not primary
    # far sooner than the 30 s lease: the stopping primary ended its lease
    assert time.monotonic() - started < 10.0
