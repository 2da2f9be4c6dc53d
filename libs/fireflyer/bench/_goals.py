"""The goals an ``ff bench allreduce`` run is judged against, read from its own JSON.

HFReduce's benchmark goals on a 2-core machine (2 nodes x 4 ranks at 64 MiB at least 5x
Gloo; 4 nodes x 1 rank at least Gloo's speed and 80% of the loopback bound; the 4-byte
allreduce over 2 nodes no slower than Gloo) are each read from one figure of one size of
one shape.  :func:`goals` lists those that apply to a run, each with its figure, target and
verdict, so a run (or the medians of ``--runs N``, :mod:`._runs`) says by itself what
it met -- the same shape of list as ``ff bench kernels`` writes.

Pure functions over the JSON object, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Goal", "GOALS", "goals", "missed"]


@dataclass(frozen=True)
class Goal:
    """``key`` of the entry of ``size_bytes`` is at least ``target`` in a fp32 run of ``nodes``
    nodes (and ``local_ranks`` ranks each, None: any)."""

    name: str
    nodes: int
    local_ranks: int | None
    size_bytes: int
    key: str
    target: float


GOALS: tuple[Goal, ...] = (
    Goal("2x4 64M vs Gloo", 2, 4, 64 << 20, "ratio", 5.0),
    Goal("4x1 64M vs Gloo", 4, 1, 64 << 20, "ratio", 1.0),
    Goal("4x1 64M of the loopback bound", 4, 1, 64 << 20, "fraction_of_bound", 0.8),
    Goal("2 nodes 4 B vs Gloo", 2, None, 4, "ratio", 1.0),
)


def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals that apply to ``result`` (a run's or a summary's JSON object) and whose figure
    it has: ``{"goal", "value", "target", "met"}`` each, in :data:`GOALS` order."""
    if result.get("dtype") != "fp32":
        return []
    out: list[dict[str, Any]] = []
    by_size = {e["size_bytes"]: e for e in result.get("results", [])}
    for g in GOALS:
        if result.get("nodes") != g.nodes or g.local_ranks not in (None, result.get("local_ranks")):
            continue
        value = by_size.get(g.size_bytes, {}).get(g.key)
        if isinstance(value, (int, float)):
            out.append({"goal": g.name, "value": value, "target": g.target, "met": value >= g.target})
    return out


def missed(listed: list[dict[str, Any]]) -> list[str]:
    """Names of the goals in ``listed`` that were not met."""
    return [g["goal"] for g in listed if not g["met"]]
