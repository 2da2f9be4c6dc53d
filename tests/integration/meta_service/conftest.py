"""Fixtures for the meta service: tokens, an in-process replica, real replica processes.

In-process (``meta``) is fast and runs the production runtime on the test's loop;
``replicas`` starts real ``python -m services.meta`` processes that share one
SQLite file, for concurrency and kill -9 tests.  No NATS: meta does not need it
without mgmtd.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from metasvc import Meta, Tokens, in_process_meta, meta_env

from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file
from fireflyer.testing.services import ServiceProcess


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    t = Tokens(tmp_path / "tokens.json", generate_token(), generate_token(), generate_token(), generate_token())
    write_tokens_file(t.path, [TokenEntry(token=t.admin, user="admin", roles=["admin"]),
                               TokenEntry(token=t.alice, user="alice", roles=["user"]),
                               TokenEntry(token=t.bob, user="bob", roles=["user"]),
                               TokenEntry(token=t.service, user="svc-checkpoint", roles=["service"])])
    return t


@pytest.fixture(params=["auto", "grpc"], ids=["wire", "grpc"])
async def meta(request: pytest.FixtureRequest, tmp_path: Path, tokens: Tokens) -> AsyncIterator[Meta]:
    """One in-process replica; every test using it runs once per client transport (the replica's
    wire endpoint, and gRPC), since both must give the same results and the same errors."""
    async with in_process_meta(tmp_path / "state", tokens, transport=request.param) as m:
        yield m


@pytest.fixture
def replicas(tmp_path: Path, tokens: Tokens) -> Iterator[list[ServiceProcess]]:
    """Two meta processes over one SQLite file (started; wait_healthy in the test)."""
    state = tmp_path / "state"
    url = f"sqlite:///{state / 'meta.db'}"
    env = meta_env(state, tokens, url)
    procs = [ServiceProcess("services.meta", state_dir=state, nats_url="", tokens_file=tokens.path,
                            instance=f"meta-{i}", env=env).start() for i in range(2)]
    try:
        yield procs
    finally:
        for p in procs:
            p.stop(timeout_s=5)
