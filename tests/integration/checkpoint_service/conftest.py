"""Fixtures for checkpoint-service tests: a real NATS, a token, the service as a process over a local root."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ckptsvc_harness import CkptService  # noqa: E402

from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file  # noqa: E402


@pytest.fixture
def token_file(tmp_path: Path) -> tuple[Path, str]:
    tok = generate_token()
    path = write_tokens_file(tmp_path / "tokens.json", [TokenEntry(token=tok, user="alice", roles=["user"])])
    return path, tok


@pytest.fixture
def ckpt_service(tmp_path: Path, nats_server, token_file) -> Iterator[Callable[..., CkptService]]:  # type: ignore[no-untyped-def]
    """``ckpt_service(**env)`` starts the service (SQLite KV and a local root under tmp_path unless
    env names others) and waits until it serves; every one started is stopped at the end."""
    started: list[CkptService] = []

    def start(**env: str) -> CkptService:
        svc = CkptService(tmp_path, nats_url=nats_server.url, tokens_file=token_file[0], token=token_file[1],
                          instance=f"checkpoint-{len(started)}", env=env)
        started.append(svc)
        svc.start()
        return svc

    yield start
    for svc in started:
        svc.stop()
