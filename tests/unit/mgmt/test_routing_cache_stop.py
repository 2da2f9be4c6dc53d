"""RoutingCache.stop() returns even when a routing update wakes the cache as it is cancelled.

A storage node stopping cleanly reports its targets offline; the routing update that follows
(its own or another node's) wakes every cache at about the moment the node stops its own.  With
``asyncio.wait_for`` around the wake-up, that cancel could be lost on Python 3.11 and the node
hung until ``ff down``'s SIGKILL (10 s per node in the fs benchmarks).  Here the wake-up and the
cancel land in the same loop iteration, many times over, under the event loop the services run.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from fireflyer.mgmt.client import RoutingCache


class _NoNews:
    """A client whose routing never changes (what the cache pulls on a kick)."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_routing(self, version: int) -> None:
        self.calls += 1
        await asyncio.sleep(0)


@pytest.mark.parametrize("loop_impl", ["asyncio", "uvloop"])
def test_stop_returns_when_a_kick_lands_with_the_cancel(loop_impl: str) -> None:
    async def main() -> int:
        client = _NoNews()
        for i in range(300):
            cache = RoutingCache(client, pull_interval_s=5.0)  # type: ignore[arg-type]
            cache._task = asyncio.create_task(cache._loop())
            for _ in range(i % 3):  # the race at a few phases of the loop
                await asyncio.sleep(0)
            cache._kick.set()  # an update arrives ...
            await asyncio.wait_for(cache.stop(), 2.0)  # ... as the node stops: must not hang
        return client.calls

    if loop_impl == "uvloop":
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            r.run(main())
    else:
        asyncio.run(main())
