"""Several runs of ``ff bench allreduce`` summarized: per size, the median of every figure and its range.

On a shared 2-core VM one run of the benchmark says little: the machine's speed moves by tens
of percent from one minute to the next (the README's HFReduce sections), and a goal like
"≥ 5x Gloo" is judged on the median of several runs, each ratio taken against its anchor in the
same run.  ``ff bench allreduce --runs N`` runs the whole benchmark N times back to back
(anchors, ours and Gloo each time) and :func:`summarize_runs` folds the N JSON objects into one:

- ``results``: one entry per size, as a single run's, where every number is **its own median**
  over the runs that have it (so ``ratio`` is the median of the runs' ratios, not
  ``algbw_GBps / gloo_algbw_GBps`` of the medians; ``None`` where no run has the figure);
- each entry's ``range``: ``[min, max]`` over the runs of the figures a goal is read from
  (:data:`RANGE_KEYS`), and ``runs_with``: how many runs had each of them;
- ``runs``: N, and ``per_run``: every run's own ``results``, untouched;
- ``goals``: the goals judged on the medians (:func:`._goals.goals`).

Pure functions, no I/O: the runs are made by :mod:`.allreduce`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from fireflyer.core.errors import InvalidArgument

from ._goals import goals

__all__ = ["RANGE_KEYS", "summarize_runs", "spread_lines", "fmt_size"]

#: figures whose spread over the runs the summary keeps (the ones the goals are read from)
RANGE_KEYS = ("time_s", "gloo_time_s", "ratio", "fraction_of_bound", "fraction_of_floor", "gloo_over_floor")

#: per-size keys that are the same in every run (not medians)
_SAME_KEYS = ("size_bytes", "dtype", "nodes", "local_ranks")


def _median_entry(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    first = entries[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key in _SAME_KEYS:
            out[key] = value
            continue
        values = [e.get(key) for e in entries]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers:
            out[key] = statistics.median(numbers)
        elif all(isinstance(v, str) for v in values if v is not None) and any(v is not None for v in values):
            out[key] = next(v for v in values if v is not None)  # e.g. gloo_note: the same words every run
        else:
            out[key] = None
    for e in entries[1:]:  # keys only a later run has (a note that the first run lacked)
        for key, value in e.items():
            out.setdefault(key, value)
    ranges: dict[str, list[float] | None] = {}
    runs_with: dict[str, int] = {}
    for key in RANGE_KEYS:
        numbers = [e[key] for e in entries if isinstance(e.get(key), (int, float))]
        ranges[key] = [min(numbers), max(numbers)] if numbers else None
        runs_with[key] = len(numbers)
    out["range"] = ranges
    out["runs_with"] = runs_with
    return out


def summarize_runs(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One JSON object for N runs of the same benchmark (see the module docs).

    Raises :class:`InvalidArgument` when there are no runs or they are not of the same
    benchmark (shape, dtype, sizes): medians across different benchmarks mean nothing.
    """
    if not docs:
        raise InvalidArgument("no runs to summarize", argument="docs")
    first = docs[0]
    shape = [(d.get("nodes"), d.get("local_ranks"), d.get("dtype"), d.get("vs"),
              [e["size_bytes"] for e in d["results"]]) for d in docs]
    if any(s != shape[0] for s in shape[1:]):
        raise InvalidArgument("the runs are not of one benchmark (nodes, local ranks, dtype, vs and sizes must "
                              "match)", argument="docs")
    results = [_median_entry([d["results"][i] for d in docs]) for i in range(len(first["results"]))]
    shas = sorted({str(d.get("git_sha")) for d in docs})
    summary = {**first, "results": results, "runs": len(docs), "per_run": [d["results"] for d in docs],
               "git_sha": first.get("git_sha") if len(shas) == 1 else ",".join(shas)}
    summary["goals"] = goals(summary)
    return summary


def fmt_size(n: int) -> str:
    """``67108864`` -> ``64M`` (exact multiples only), else the plain number of bytes."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _fmt(key: str, x: float) -> str:
    if key.startswith("fraction"):
        return f"{x * 100:.0f}%"
    if key.endswith("_s"):
        return f"{x * 1e6:.0f} us" if x < 1e-2 else f"{x * 1e3:.1f} ms"
    return f"{x:.2f}x"


def spread_lines(summary: dict[str, Any]) -> list[str]:
    """Human lines under the table of a multi-run summary: per size, each goal figure's median and range."""
    lines = [f"medians of {summary['runs']} runs (each figure its own median); range over the runs in brackets:"]
    for e in summary["results"]:
        parts = []
        for key in ("ratio", "fraction_of_bound", "fraction_of_floor"):
            r = e["range"].get(key)
            if r is not None and e.get(key) is not None:
                parts.append(f"{key.replace('fraction_of_', '% of ')} {_fmt(key, e[key])} "
                             f"[{_fmt(key, r[0])}-{_fmt(key, r[1])}]")
        t = e["range"].get("time_s")
        if t is not None:
            parts.insert(0, f"time {_fmt('time_s', e['time_s'])} [{_fmt('time_s', t[0])}-{_fmt('time_s', t[1])}]")
        lines.append(f"  {fmt_size(e['size_bytes'])}: " + ", ".join(parts))
    return lines
