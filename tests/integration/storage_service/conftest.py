"""Fixtures for the storage service tests: a real mgmtd + 3 storage processes (stor_svc_harness)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from stor_svc_harness import StorageCluster, new_cluster


@pytest.fixture
async def cluster(tmp_path: Path, nats_server) -> AsyncIterator[StorageCluster]:
    c = new_cluster(tmp_path, nats_server.url)
    try:
        await c.start()
        yield c
    except BaseException:
        for p in [c.mgmtd, *c.storage]:
            if p is not None:
                print(f"---- {p.instance} ({p.state()}) log ----\n{p.log()[-6000:]}")
        raise
    finally:
        await c.close()
