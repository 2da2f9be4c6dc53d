"""Shared helpers of the meta service tests (imported by conftest and the tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fireflyer.fs import MetaClient


@dataclass(frozen=True)
class Tokens:
    path: Path
    admin: str
    alice: str  # role user, listed in [meta.users] as uid/gid 1000
    bob: str  # role user, not listed: uid from the name hash


@dataclass(frozen=True)
class Meta:
    address: str
    tokens: Tokens
    service: Any
    kv_url: str

    async def client(self, token: str) -> MetaClient:
        return await MetaClient.connect(self.address, token, failover_timeout_s=2.0)


USERS_JSON = '{"alice": {"uid": 1000, "gid": 1000, "groups": [100]}}'


def meta_env(state: Path, tokens: Tokens, kv_url: str) -> dict[str, str]:
    return {"FF_STATE_DIR": str(state), "FF_NATS_URL": "", "FF_AUTH_TOKENS_FILE": str(tokens.path),
            "FF_META_KV_URL": kv_url, "FF_META_USERS": USERS_JSON, "FF_GRACE_S": "1",
            "FF_TELEMETRY_SPAN_FILE": str(state / "spans.jsonl")}
