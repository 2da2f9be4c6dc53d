"""``ff bench ddp``: step time of haiscale DDP, of stock torch DDP on the hfreduce backend, and of
torch DDP on Gloo, in the same launch on the same ranks; and how much of haiscale's allreduce
time backward hid.

    ff bench ddp --nodes 2 --local-ranks 2 --model mlp --steps 20 --json

One ``ff launch``-style run (the HFReduce workers, N x K ranks of
:mod:`fireflyer.bench._ddp_rank`).  Per variant the result is the slowest rank's median
step time.  ``hidden_share`` is ``1 - exposed / alone``: ``exposed`` is the median time from
backward's last gradient to the end of haiscale's waits (the communication backward did
not hide), ``alone`` the median time the same buckets take to reduce with nothing else
running; both from timestamps.  ``ratio_vs_gloo`` is haiscale's step time over torch+Gloo's
(issue 50's goal: at most 0.7).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fireflyer.bench._jsonout import add_json_option, emit

__all__ = ["main", "bench_ddp", "summarise"]

GOAL_RATIO = 0.7
VARIANTS = ("haiscale", "torch_hfreduce", "torch_gloo")


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold the ranks' JSON: the slowest rank per variant, the hidden share, the ratio to Gloo."""
    out: dict[str, Any] = {"ranks": len(ranks), "params": ranks[0]["params"], "buckets": ranks[0]["buckets"]}
    for v in VARIANTS:
        out[f"{v}_step_ms"] = max(r[v]["step_ms"] for r in ranks)
    exposed = max(r["haiscale"].get("exposed_comm_ms", 0.0) for r in ranks)
    alone = max(r["haiscale"]["comm_alone_ms"] for r in ranks)
    out["exposed_comm_ms"] = exposed
    out["comm_alone_ms"] = alone
    out["hidden_share"] = max(0.0, 1.0 - exposed / alone) if alone > 0 else None
    out["ratio_vs_gloo"] = out["haiscale_step_ms"] / out["torch_gloo_step_ms"]
    out["goal_ratio"] = GOAL_RATIO
    out["goal_met"] = out["ratio_vs_gloo"] <= GOAL_RATIO
    return out


def bench_ddp(nodes: int = 2, local_ranks: int = 2, model: str = "mlp", steps: int = 20,
              warmup: int = 3, bucket_cap_mb: float = 25.0) -> dict[str, Any]:
    from fireflyer.hfreduce.launch import Launcher
    from fireflyer.hfreduce.launch_plan import LaunchOptions

    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ffddp") as out:
        cmd = [sys.executable, "-m", "fireflyer.bench._ddp_rank", out, model, str(steps), str(warmup), str(bucket_cap_mb)]
        la = Launcher(LaunchOptions(nodes=nodes, local_ranks=local_ranks), cmd,
                      sink=lambda src, stream, line: lines.append(f"[{src}] {line}"), handle_signals=False)
        rc = la.run()
        files = sorted(Path(out).glob("rank*.json"))
        if rc != 0 or len(files) != nodes * local_ranks:
            tail = "\n".join(lines[-30:])
            raise RuntimeError(f"ff bench ddp: the ranks failed (exit {rc}, {len(files)} results):\n{tail}")
        ranks = [json.loads(f.read_text()) for f in files]
    result = {"bench": "ddp", "nodes": nodes, "local_ranks": local_ranks, "model": model, "steps": steps,
              "bucket_cap_mb": bucket_cap_mb, **summarise(ranks)}
    return result


def _print(r: dict[str, Any]) -> None:
    print(f"ddp {r['model']} ({r['params']:,} params, {r['buckets']} buckets), {r['nodes']} nodes x "
          f"{r['local_ranks']} ranks, median step of the slowest rank:")
    for v in VARIANTS:
        print(f"  {v:16s} {r[f'{v}_step_ms']:8.2f} ms")
    hidden = "n/a" if r["hidden_share"] is None else f"{100 * r['hidden_share']:.0f}%"
    print(f"  haiscale / torch+gloo: {r['ratio_vs_gloo']:.2f} (goal <= {GOAL_RATIO}); allreduce hidden behind "
          f"backward: {hidden} (exposed {r['exposed_comm_ms']:.2f} ms of {r['comm_alone_ms']:.2f} ms)")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ff bench ddp", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--local-ranks", type=int, default=2)
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="bucket cap of every variant (default 25)")
    add_json_option(p)
    ns = p.parse_args(argv)
    result = bench_ddp(ns.nodes, ns.local_ranks, ns.model, ns.steps, ns.warmup, ns.bucket_cap_mb)
    return emit(ns.json, result, lambda: _print(result))
