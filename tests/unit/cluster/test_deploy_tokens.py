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
