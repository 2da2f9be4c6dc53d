"""Fixtures for coord integration tests: a real NATS, tokens, coord as a process over a SQLite KV."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from coord_harness import TIMING  # noqa: E402

from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file  # noqa: E402
from fireflyer.testing.services import ServiceProcess  # noqa: E402


@pytest.fixture
def token_file(tmp_path: Path) -> tuple[Path, str]:
    tok = generate_token()
    path = write_tokens_file(tmp_path / "tokens.json", [TokenEntry(token=tok, user="alice", roles=["user"])])
    return path, tok


@pytest.fixture
def coord_proc(tmp_path: Path, nats_server, token_file) -> Iterator[ServiceProcess]:  # type: ignore[no-untyped-def]
    svc = ServiceProcess("services.coord", state_dir=tmp_path, nats_url=nats_server.url, tokens_file=token_file[0],
                         instance="coord-0", env={**TIMING, "FF_COORD_KV_URL": f"sqlite:///{tmp_path}/coord.db"})
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
def job_env(coord_proc: ServiceProcess, nats_server, token_file) -> dict[str, str]:  # type: ignore[no-untyped-def]
    libs = str(Path(__file__).resolve().parents[3] / "libs")
    env = dict(os.environ, FF_COORD_ADDR=coord_proc.address, FF_NATS_URL=nats_server.url, FF_TOKEN=token_file[1],
               PYTHONUNBUFFERED="1", FF_HFREDUCE_TELEMETRY_INTERVAL_S="0.2")
    env["PYTHONPATH"] = os.pathsep.join([libs, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
