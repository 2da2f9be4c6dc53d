"""``ff bench allreduce`` fills numba's cache with the block loops before it starts any worker."""

from __future__ import annotations

from typing import Any

import pytest

from fireflyer.bench import allreduce as ba


class _Stop(Exception):
    pass


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(ba._blocks, "warm_up", lambda: seen.append("warm_up"))

    def first_run(mode: str, *args: Any, **kwargs: Any) -> dict[int, list[dict[str, Any]]]:
        seen.append(f"run {mode}")
        raise _Stop  # nothing past the first launch matters here

    monkeypatch.setattr(ba, "_run_ranks", first_run)
    return seen


def test_several_nodes_warm_the_block_loops_before_the_workers_start(calls: list[str]) -> None:
    with pytest.raises(_Stop):
        ba.run_bench(nodes=2, local_ranks=1, sizes=[4], bound=False, floor=False)
    assert calls == ["warm_up", "run hfreduce"]


def test_one_node_or_streaming_off_has_no_block_loops_to_warm(calls: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(_Stop):
        ba.run_bench(nodes=1, local_ranks=2, sizes=[4], bound=False, floor=False)
    monkeypatch.setenv("FF_HFREDUCE_STREAM", "false")
    with pytest.raises(_Stop):
        ba.run_bench(nodes=2, local_ranks=1, sizes=[4], bound=False, floor=False)
    assert calls == ["run hfreduce", "run hfreduce"]
