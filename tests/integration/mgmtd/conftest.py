"""Fixtures for mgmtd integration tests: replicas as real processes over one KV."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from mgmtd_harness import MODULE, TIMING, Replicas, Tokens

from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file
from fireflyer.testing.services import ServiceProcess


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    admin, user, service, other = generate_token(), generate_token(), generate_token(), generate_token()
    path = write_tokens_file(tmp_path / "tokens.json", [
        TokenEntry(token=admin, user="root-admin", roles=["admin"]),
        TokenEntry(token=user, user="alice", roles=["user"]),
        TokenEntry(token=service, user="svc-storage", roles=["service"]),
        TokenEntry(token=other, user="svc-meta", roles=["service"]),
    ])
    return Tokens(path, admin, user, service, other)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def mgmtd_kv_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The shared KV of the replicas: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/mgmtd.db"
    dsn = request.getfixturevalue("pg_dsn")
    schema = request.getfixturevalue("pg_schema")
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"


@pytest.fixture
def sqlite_kv_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/mgmtd.db"


@pytest.fixture
async def start_replicas(tmp_path: Path, nats_server, tokens: Tokens
                         ) -> AsyncIterator[Callable[..., asyncio.Future[Replicas]]]:
    started: list[Replicas] = []

    async def start(n: int, kv_url: str, **env: str) -> Replicas:
        procs = [ServiceProcess(MODULE, state_dir=tmp_path, nats_url=nats_server.url, tokens_file=tokens.path,
                                instance=f"mgmtd-{i}", env={**TIMING, "FF_MGMTD_KV_URL": kv_url, **env}).start()
                 for i in range(n)]
        r = Replicas(procs, tokens)
        started.append(r)
        await asyncio.gather(*(p.wait_healthy(timeout_s=30.0) for p in procs))
        return r

    try:
        yield start  # type: ignore[misc]
    finally:
        for r in started:
            await r.client.close()
            await r.service_client.close()
            for p in r.procs:
                p.stop(timeout_s=5.0)
