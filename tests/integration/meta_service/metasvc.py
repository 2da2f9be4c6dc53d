"""Shared helpers of the meta service tests (imported by conftest and the tests)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fireflyer.core.settings import load_settings
from fireflyer.fs import MetaClient
from fireflyer.storage.capability import write_key_file
from fireflyer.testing.services import running_service
from services.meta.app import MetaService, MetaSettings


@dataclass(frozen=True)
class Tokens:
    path: Path
    admin: str
    alice: str  # role user, listed in [meta.users] as uid/gid 1000
    bob: str  # role user, not listed: uid from the name hash
    service: str  # svc-checkpoint, role service: the cluster's own process, root in the file system


@dataclass(frozen=True)
class Meta:
    address: str
    tokens: Tokens
    service: Any
    kv_url: str
    #: how clients call it: "auto" (over its wire endpoint) or "grpc"
    transport: str = "auto"

    async def client(self, token: str) -> MetaClient:
        return await MetaClient.connect(self.address, token, failover_timeout_s=2.0, transport=self.transport)


USERS_JSON = '{"alice": {"uid": 1000, "gid": 1000, "groups": [100]}}'


def meta_env(state: Path, tokens: Tokens, kv_url: str) -> dict[str, str]:
    return {"FF_STATE_DIR": str(state), "FF_NATS_URL": "", "FF_AUTH_TOKENS_FILE": str(tokens.path),
            "FF_META_KV_URL": kv_url, "FF_META_USERS": USERS_JSON, "FF_GRACE_S": "1",
            "FF_TELEMETRY_SPAN_FILE": str(state / "spans.jsonl")}


@contextlib.asynccontextmanager
async def in_process_meta(state: Path, tokens: Tokens, *, transport: str = "auto",
                          **env: str) -> AsyncIterator[Meta]:
    """One meta replica on the test's loop (production runtime), SQLite under ``state``."""
    url = f"sqlite:///{state / 'meta.db'}"
    write_key_file(state / "capability.key")  # as ff up: the key meta signs chunk capabilities with
    settings = load_settings(MetaSettings, env={**meta_env(state, tokens, url), "FF_INSTANCE": "meta-inproc", **env})
    service = MetaService(settings)
    async with running_service(service) as ctx:
        yield Meta(ctx.server.address, tokens, service, url, transport=transport)
