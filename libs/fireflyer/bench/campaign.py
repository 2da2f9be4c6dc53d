"""``ff bench campaign``: every HFReduce benchmark goal judged on this machine, in one command.

On a shared 2-core VM one benchmark run says little (the machine's speed moves by tens of
percent from one minute to the next), so the README judges HFReduce's goals on a *campaign*:

- ``--rounds`` R (default 5) rounds, each running ``ff bench kernels --size 64M`` and then
  ``ff bench allreduce --sizes 4,64M --vs gloo`` for every shape (default 2x1, 2x4, 4x1).
  The shapes are *interleaved* -- round 1 runs all of them, then round 2 -- so that a slow
  stretch of the machine lands on every shape a little instead of on one shape entirely;
- every ratio in a run is taken against its anchors in the same run (Gloo, the loopback
  bound, the floor, numpy, STREAM: see those benchmarks), and each goal's figure is folded
  over the rounds into its **median**, its range, and how many rounds met it
  (:func:`fold_goals`); a goal counts as met when its median meets it;
- ``--out DIR`` keeps every run's JSON (``kernels_<r>.json``, ``allreduce_<NxK>_<r>.json``),
  so a campaign cut short still leaves its finished runs behind.

The table printed at the end has one row per goal and shape; for the goals on a ratio it adds
what the floor said in the same runs: ``gloo / floor`` is the highest ratio to Gloo any
allreduce could have had, ``numpy / read floor`` the highest ratio to numpy any fp32 kernel
could have had (reading the inputs once and nothing else); ``% of floor`` is how close ours
came.  For the share of the loopback bound it adds ``bound / tree flows``: how much more the
bound's pairs carried than the double tree's own flows, stripped of the allreduce, so the
target's share of those flows and ours, and what a bare ring allreduce over the bound's own
flows reached of the bound in the same runs (``ff bench ringref``); when the op itself went around
the ring (the runs' ``algorithm``), that bare ring is the anchor: the target's share of what it
reached, and ours.  ``--json PATH`` (``-``: stdout) writes the whole campaign: the folded goals, every shape's medians
(:func:`._runs.summarize_runs`) and every run's kernel goals.

The decisions (:func:`parse_shapes`, :func:`fold_goals`, :func:`campaign_result`) are pure;
:func:`run_campaign` does the runs through the two benchmarks' ``run_bench``, which it takes
as arguments so that tests can stand in for them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fireflyer.core.errors import FireFlyerError, InvalidArgument
from fireflyer.core.sizes import parse_size

from ._goals import GOALS
from ._jsonout import add_json_option, emit
from ._runs import fmt_size, summarize_runs

__all__ = ["DEFAULT_SHAPES", "parse_shapes", "fold_goals", "campaign_result", "run_campaign", "goal_lines", "main"]

DEFAULT_SHAPES = "2x1,2x4,4x1"
_GOAL_KERNEL_SIZE = 64 << 20  # the size the kernel goals are set at (ff bench kernels --size 64M)
_MAX_ROUNDS = 100

KernelsRun = Callable[[int], dict[str, Any]]
AllreduceRun = Callable[[int, int, list[int]], dict[str, Any]]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"2x1,2x4"`` -> ``[(2, 1), (2, 4)]`` (nodes x local ranks, each at least 1, no repeats)."""
    shapes: list[tuple[int, int]] = []
    for part in (p.strip() for p in text.split(",")):
        nodes, sep, ranks = part.lower().partition("x")
        if not sep or not nodes.isdigit() or not ranks.isdigit() or int(nodes) < 1 or int(ranks) < 1:
            raise InvalidArgument(f"--shapes: {part!r} is not NODESxRANKS (like 2x4)", value=part)
        shape = (int(nodes), int(ranks))
        if shape in shapes:
            raise InvalidArgument(f"--shapes names {part} twice", value=part)
        shapes.append(shape)
    return shapes


def _shape_name(shape: tuple[int, int]) -> str:
    return f"{shape[0]}x{shape[1]}"


def fold_goals(per_run: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each run's goal list (``{"goal", "value", "target", "met"}``, as both benchmarks write
    them) folded over the runs: per goal, in first-seen order, the ``median`` of its values,
    their ``range``, ``runs`` that had it, ``runs_met``, ``target`` and ``met`` (the median
    meets the target)."""
    values: dict[str, list[float]] = {}
    targets: dict[str, float] = {}
    for goals in per_run:
        for g in goals:
            values.setdefault(g["goal"], []).append(float(g["value"]))
            targets[g["goal"]] = float(g["target"])
    out = []
    for name, vs in values.items():
        med = statistics.median(vs)
        out.append({"goal": name, "median": med, "range": [min(vs), max(vs)], "runs": len(vs),
                    "runs_met": sum(v >= targets[name] for v in vs), "target": targets[name],
                    "met": med >= targets[name]})
    return out


def _floor_context(summary: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    """The medians, at the goal's size, of what its anchor said in the same runs: for a goal on
    the ratio to Gloo the floor's, for one on the share of the loopback bound the tree flows'
    (where the runs measured them), which say what share of that anchor the target needed."""
    spec = next((g for g in GOALS if g.name == goal["goal"]), None)
    entry = None if spec is None else next((e for e in summary["results"] if e["size_bytes"] == spec.size_bytes),
                                           None)
    if spec is None or entry is None:
        return {}
    if spec.key == "ratio" and entry.get("gloo_over_floor") is not None:
        return {"gloo_over_floor": entry["gloo_over_floor"], "fraction_of_floor": entry.get("fraction_of_floor")}
    if spec.key == "fraction_of_bound" and summary.get("algorithm") == "ring" \
            and entry.get("ring_ref_fraction_of_bound"):
        # the op went around a ring: its anchor is the bare ring over the same flows, not the trees';
        # per run ours / the reference's share of the same bound (= the reference's time / ours)
        shares = [e["fraction_of_bound"] / e["ring_ref_fraction_of_bound"] for run in summary.get("per_run", [])
                  for e in run if e["size_bytes"] == spec.size_bytes
                  and e.get("fraction_of_bound") and e.get("ring_ref_fraction_of_bound")]
        return {"algorithm": "ring", "ring_ref_fraction_of_bound": entry["ring_ref_fraction_of_bound"],
                "fraction_of_ring_ref": statistics.median(shares) if shares else None}
    if spec.key == "fraction_of_bound" and entry.get("bound_over_tree_flows") is not None:
        return {"bound_over_tree_flows": entry["bound_over_tree_flows"],
                "fraction_of_tree_flows": entry.get("fraction_of_tree_flows"),
                "ring_ref_fraction_of_bound": entry.get("ring_ref_fraction_of_bound")}
    return {}


def _read_floor_context(per_run: Sequence[Sequence[dict[str, Any]]], name: str) -> dict[str, Any]:
    """For a kernel goal whose runs carry the read floor (fp32 k=8 vs numpy): its medians over
    the runs, which say what share of the floor the target needed."""
    runs = [g for goals in per_run for g in goals if g["goal"] == name and g.get("numpy_over_floor") is not None]
    if not runs:
        return {}
    fractions = [g["fraction_of_floor"] for g in runs if g.get("fraction_of_floor") is not None]
    return {"numpy_over_floor": statistics.median(g["numpy_over_floor"] for g in runs),
            "fraction_of_floor": statistics.median(fractions) if fractions else None}


def campaign_result(kernel_docs: Sequence[dict[str, Any]],
                    allreduce_docs: dict[tuple[int, int], list[dict[str, Any]]]) -> dict[str, Any]:
    """The campaign's JSON object from its runs (pure): folded goals, per-shape summaries."""
    goals: list[dict[str, Any]] = []
    if kernel_docs:
        per_run = [d.get("goals", []) for d in kernel_docs]
        for g in fold_goals(per_run):
            goals.append({"bench": "kernels", "shape": None, **g, **_read_floor_context(per_run, g["goal"])})
    shapes: dict[str, Any] = {}
    for shape, docs in allreduce_docs.items():
        if not docs:
            continue
        summary = summarize_runs(docs)
        shapes[_shape_name(shape)] = summary
        for g in fold_goals([d.get("goals", []) for d in docs]):
            goals.append({"bench": "allreduce", "shape": _shape_name(shape), **g, **_floor_context(summary, g)})
    first = kernel_docs[0] if kernel_docs else next((d[0] for d in allreduce_docs.values() if d), {})
    kernel_rows = [x for d in kernel_docs for x in d.get("results", [])]
    return {"bench": "campaign", "rounds": max([len(kernel_docs), *map(len, allreduce_docs.values())]),
            "goals": goals, "missed": [_label(g) for g in goals if not g["met"]],
            # every kernel result of every round equal to numpy's reference, bit for bit (None: no kernel runs)
            "kernels_bit_exact": all(x.get("bit_exact") is True for x in kernel_rows) if kernel_rows else None,
            "allreduce": shapes, "kernels_goals_per_run": [d.get("goals", []) for d in kernel_docs],
            "git_sha": first.get("git_sha"), "cpu_count": first.get("cpu_count")}


def _label(g: dict[str, Any]) -> str:
    return f"{g['shape']}: {g['goal']}" if g.get("shape") else g["goal"]


def run_campaign(*, rounds: int, shapes: Sequence[tuple[int, int]], sizes: list[int], kernel_size: int | None,
                 kernels: KernelsRun, allreduce: AllreduceRun, out_dir: Path | None = None,
                 progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the rounds (``kernel_size`` None: no kernel benchmark), saving each run's JSON in
    ``out_dir``; the :func:`campaign_result` of them all."""
    if not 1 <= rounds <= _MAX_ROUNDS:
        raise InvalidArgument(f"--rounds must be between 1 and {_MAX_ROUNDS}, got {rounds}", value=rounds)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    kernel_docs: list[dict[str, Any]] = []
    ar_docs: dict[tuple[int, int], list[dict[str, Any]]] = {s: [] for s in shapes}

    def keep(doc: dict[str, Any], name: str) -> dict[str, Any]:
        if out_dir is not None:
            (out_dir / name).write_text(json.dumps(doc, indent=2) + "\n")
        return doc

    for r in range(1, rounds + 1):
        if kernel_size is not None:
            t0 = time.monotonic()
            progress(f"round {r} of {rounds}: kernels, {fmt_size(kernel_size)} per buffer")
            kernel_docs.append(keep(kernels(kernel_size), f"kernels_{r}.json"))
            progress(f"round {r} of {rounds}: kernels done in {time.monotonic() - t0:.0f} s")
        for shape in shapes:
            t0 = time.monotonic()
            progress(f"round {r} of {rounds}: allreduce {_shape_name(shape)} vs gloo, sizes "
                     f"{','.join(fmt_size(s) for s in sizes)}")
            doc = allreduce(shape[0], shape[1], sizes)
            ar_docs[shape].append(keep(doc, f"allreduce_{_shape_name(shape)}_{r}.json"))
            progress(f"round {r} of {rounds}: allreduce {_shape_name(shape)} done in {time.monotonic() - t0:.0f} s")
    return {**campaign_result(kernel_docs, ar_docs), "shapes": [_shape_name(s) for s in shapes], "sizes": sizes,
            "kernel_size_bytes": kernel_size}


def goal_lines(result: dict[str, Any]) -> list[str]:
    """The campaign's verdicts as a markdown table (one row per goal and shape)."""
    lines = [f"HFReduce goals over {result['rounds']} interleaved rounds (git {str(result.get('git_sha'))[:10]}): "
             "median (range), rounds that met the goal"]
    ksize = result.get("kernel_size_bytes")
    if ksize is not None and ksize != _GOAL_KERNEL_SIZE:
        lines.append(f"(kernels measured at {fmt_size(ksize)} per buffer; their goals are set at "
                     f"{fmt_size(_GOAL_KERNEL_SIZE)})")
    lines += ["", "| goal | median | range | rounds met | target | verdict | floor (same runs) |",
             "|---|---:|---:|---:|---:|---|---|"]
    for g in result["goals"]:
        # a goal on a fraction (of the bound, of STREAM add: a target below 1) reads as a percentage
        fmt: Callable[[float], str] = (lambda v: f"{v * 100:.0f}%") if g["target"] < 1 else (lambda v: f"{v:.2f}x")
        lines.append(f"| {_label(g)} | {fmt(g['median'])} | {fmt(g['range'][0])}–{fmt(g['range'][1])} | "
                     f"{g['runs_met']} of {g['runs']} | {fmt(g['target'])} | {'met' if g['met'] else 'MISSED'} | "
                     f"{_floor_text(g)} |")
    lines.append("")
    lines.append("missed at the median: " + (", ".join(result["missed"]) or "none"))
    if result.get("kernels_bit_exact") is not None:
        lines.append("kernels bit-exact against numpy in every round: " + ("yes" if result["kernels_bit_exact"] else "NO"))
    return lines


def _floor_text(g: dict[str, Any]) -> str:
    """The anchor column of a goal: on the ratio to Gloo the allreduce floor, on the ratio to
    numpy the read floor, on the share of the loopback bound what the tree's own flows carried
    and, where the runs measured it, the bare ring's share of the bound (for an op on the ring,
    the bare ring alone: the same algorithm without HFReduce around it)."""
    if g.get("algorithm") == "ring":
        ring, ours = g["ring_ref_fraction_of_bound"], g.get("fraction_of_ring_ref")
        return (f"on the ring; a bare ring allreduce reached {ring * 100:.0f}% of the bound: the target needs "
                f"{g['target'] / ring * 100:.0f}% of what it reached" + (f", ours at {ours * 100:.0f}%" if ours else ""))
    if g.get("bound_over_tree_flows") is not None:
        x, ours = g["bound_over_tree_flows"], g.get("fraction_of_tree_flows")
        ring = g.get("ring_ref_fraction_of_bound")
        return (f"bound / tree flows {x:.2f}x: the target needs {g['target'] * x * 100:.0f}% of what the tree's "
                "flows carry" + (f", ours at {ours * 100:.0f}%" if ours else "")
                + (f"; a bare ring allreduce reached {ring * 100:.0f}% of the bound" if ring else ""))
    for key, anchor in (("gloo_over_floor", "gloo / floor"), ("numpy_over_floor", "numpy / read floor")):
        if g.get(key) is not None:
            need = g["target"] / g[key]
            return (f"{anchor} {g[key]:.2f}x: the target needs {need * 100:.0f}% of the floor"
                    + (f", ours at {g['fraction_of_floor'] * 100:.0f}%" if g.get("fraction_of_floor") else ""))
    return ""


def _real_kernels(size: int) -> dict[str, Any]:
    from .kernels import run_bench
    return run_bench(size)


def _real_allreduce(nodes: int, local_ranks: int, sizes: list[int]) -> dict[str, Any]:
    from .allreduce import run_bench
    return run_bench(nodes=nodes, local_ranks=local_ranks, sizes=sizes, vs="gloo")


def main(argv: Sequence[str] | None = None, *, kernels: KernelsRun = _real_kernels,
         allreduce: AllreduceRun = _real_allreduce) -> int:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="ff bench campaign", description=doc.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"NODESxRANKS comma list (default {DEFAULT_SHAPES})")
    p.add_argument("--sizes", default="4,64M", help="allreduce sizes, K/M/G suffixes (default 4,64M)")
    p.add_argument("--kernel-size", default="64M", help="bytes per buffer of ff bench kernels (default 64M)")
    p.add_argument("--no-kernels", action="store_true", help="skip ff bench kernels")
    p.add_argument("--out", metavar="DIR", default=None, help="keep every run's JSON in this directory")
    add_json_option(p, "the campaign")
    ns = p.parse_args(argv)
    try:
        shapes = parse_shapes(ns.shapes)
        sizes = [parse_size(s, what="--sizes") for s in ns.sizes.split(",")]
        ksize = None if ns.no_kernels else parse_size(ns.kernel_size, what="--kernel-size")
        result = run_campaign(rounds=ns.rounds, shapes=shapes, sizes=sizes, kernel_size=ksize, kernels=kernels,
                              allreduce=allreduce, out_dir=Path(ns.out) if ns.out else None,
                              progress=lambda s: print(f"ff bench campaign: {s}", file=sys.stderr, flush=True))
    except FireFlyerError as e:
        print(f"ff bench campaign: {e}", file=sys.stderr)
        if ns.out:
            print(f"ff bench campaign: the runs that finished are in {ns.out}", file=sys.stderr)
        return 1
    return emit(ns.json, result, lambda: print("\n".join(goal_lines(result))))


if __name__ == "__main__":
    raise SystemExit(main())
