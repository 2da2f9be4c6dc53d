"""Fixtures for tests that run services as real processes."""

from pathlib import Path

import pytest

from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file


class Tokens:
    def __init__(self, path: Path, admin: str, user: str) -> None:
        self.path, self.admin, self.user = path, admin, user


@pytest.fixture
def tokens(tmp_path) -> Tokens:
    admin, user = generate_token(), generate_token()
    path = write_tokens_file(tmp_path / "tokens.json", [
        TokenEntry(token=admin, user="root-admin", roles=["admin"]),
        TokenEntry(token=user, user="alice", roles=["user"]),
    ])
    return Tokens(path, admin, user)
