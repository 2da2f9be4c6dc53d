"""``wait_chains_serving``: chains with every target serving are not enough without their table.

Node 0 creates a fresh cluster's chains and then, in a second mutation, their chain table;
meta places files through tables, so a writer released between the two got "chain table 1
does not exist" (seen once in CI).  The routing source is faked so the gap is deterministic.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fireflyer.core.errors import DeadlineExceeded
from fireflyer.mgmt.model import PublicState
from fireflyer.storage import serving


def _routing(*, tables: int, state: PublicState = PublicState.SERVING) -> Any:
    chains = [SimpleNamespace(states=(state, state)) for _ in range(2)]
    return SimpleNamespace(chains=chains, chain_tables=[object()] * tables)


class _FakeRouting:
    answers: list[Any] = []

    def __init__(self, addresses: list[str], token: str) -> None:
        self.closed = False

    def get(self) -> Any:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def close(self) -> None:
        self.closed = True


def test_waits_for_the_chain_table_not_just_serving_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "MgmtdRouting", _FakeRouting)
    _FakeRouting.answers = [_routing(tables=0), _routing(tables=0), _routing(tables=1)]
    assert serving.wait_chains_serving(["m"], "t", count=2, timeout_s=5, interval_s=0.001) == 2
    assert len(_FakeRouting.answers) == 1  # it read past both table-less answers


def test_times_out_naming_the_missing_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "MgmtdRouting", _FakeRouting)
    _FakeRouting.answers = [_routing(tables=0)]
    with pytest.raises(DeadlineExceeded, match="0 chain tables"):
        serving.wait_chains_serving(["m"], "t", count=2, timeout_s=0.05, interval_s=0.001)


def test_times_out_while_a_target_is_not_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "MgmtdRouting", _FakeRouting)
    _FakeRouting.answers = [_routing(tables=1, state=PublicState.SYNCING)]
    with pytest.raises(DeadlineExceeded, match="not all targets serving"):
        serving.wait_chains_serving(["m"], "t", count=2, timeout_s=0.05, interval_s=0.001)
