"""The deployment files hand services their own credentials (issue 48 point 2), checked offline:
every ``FF_TOKEN`` that ``compose.yaml`` passes defaults to a ``service``-role entry of the
example secret ``deploy/tokens.example.json``, and no service gets the admin's."""

from __future__ import annotations

import re
from pathlib import Path

from fireflyer.rpc.auth import read_token_entries

ROOT = Path(__file__).resolve().parents[3]
_FF_TOKEN = re.compile(r"^\s+FF_TOKEN:\s*\$\{(FF_SVC_[A-Z_]+_TOKEN):-([^}]+)\}\s*$")


def test_compose_services_take_a_service_credential() -> None:
    entries = {e.token: e for e in read_token_entries(ROOT / "deploy" / "tokens.example.json")}
    lines = (ROOT / "compose.yaml").read_text().splitlines()
    passed = [line for line in lines if "FF_TOKEN:" in line]
    assert passed, "compose.yaml passes no FF_TOKEN"
    for line in passed:
        m = _FF_TOKEN.match(line)
        assert m is not None, f"FF_TOKEN must come from an FF_SVC_<NAME>_TOKEN variable: {line.strip()}"
        entry = entries.get(m.group(2))
        assert entry is not None and entry.roles == ["service"] and entry.user.startswith("svc-"), line


def test_compose_nats_takes_its_users_from_a_secret_made_from_the_tokens(tmp_path: Path) -> None:
    """deploy/nats.conf includes nats-auth.conf, compose mounts the nats_auth secret there, and the
    committed example has one NATS user per example token (bcrypt of the password the client derives)
    and no token in the clear; nats-server itself accepts the pair (``-t``: check the config only)."""
    import shutil
    import subprocess

    import bcrypt

    from fireflyer.bus.auth import nats_password, nats_user
    from fireflyer.bus.server import nats_server_binary

    conf = (ROOT / "deploy" / "nats.conf").read_text()
    assert 'include "nats-auth.conf"' in conf
    compose = (ROOT / "compose.yaml").read_text()
    assert re.search(r"- source: nats_auth\n\s+target: /etc/nats/nats-auth\.conf", compose), compose
    assert re.search(r"nats_auth:\n\s+file: \./deploy/nats-auth\.example\.conf", compose)
    example = (ROOT / "deploy" / "nats-auth.example.conf").read_text()
    hashes = dict(re.findall(r'user: "([^"]+)", password: "([^"]+)"', example))
    entries = read_token_entries(ROOT / "deploy" / "tokens.example.json")
    assert len(hashes) == len(entries)
    for e in entries:
        assert e.token not in example
        stored = hashes[nats_user(e.digest())]
        assert bcrypt.checkpw(nats_password(e.digest()).encode(), stored.encode()), e.user
    shutil.copy(ROOT / "deploy" / "nats.conf", tmp_path / "nats.conf")
    shutil.copy(ROOT / "deploy" / "nats-auth.example.conf", tmp_path / "nats-auth.conf")
    res = subprocess.run([nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")], capture_output=True,
                         text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
