"""``ff plan``: rank parallel configurations of a training job, or model HFReduce's allreduce.

    ff plan --model 80b --gpus 1024 --batch 2048 [--seq 2048] --topology perlmutter
            [--top 20] [--no-memory] [--no-compute] [--efficiency 0.5] [--json]
    ff plan allreduce --topology fireflyer2 --nodes N [--json]

Models: 5b 10b 20b 40b 80b, or LAYERSxHIDDEN[/MIN_TENSOR]. Topologies: perlmutter, fireflyer2.
With --no-memory --no-compute the ranking and times are AxoNN's released communication model's.
See docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from fireflyer.core.errors import InvalidArgument

__all__ = ["register", "plan_json", "allreduce_json"]

GIB = 2**30


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help="rank parallel configurations (AxoNN's model) or model HFReduce",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", choices=["configs", "allreduce"], default="configs",
                   help="configs (default): rank (col, row, depth, data); allreduce: HFReduce's bandwidth model")
    p.add_argument("--model", default=None, help="preset (5b 10b 20b 40b 80b) or LAYERSxHIDDEN[/MIN_TENSOR]")
    p.add_argument("--gpus", type=int, default=None, help="GPU count, a power of two")
    p.add_argument("--batch", type=int, default=None, help="global batch in samples")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--topology", default=None, help="perlmutter (default for configs) or fireflyer2 "
                                                       "(default for allreduce)")
    p.add_argument("--top", type=int, default=20, help="rows to show (default 20, AxoNN's top-k)")
    p.add_argument("--no-memory", action="store_true", help="do not exclude configurations that overflow the GPU")
    p.add_argument("--no-compute", action="store_true", help="rank by communication only, no GEMM time")
    p.add_argument("--efficiency", type=float, default=None, help="GEMM fraction of peak (default 0.5)")
    p.add_argument("--nodes", type=int, default=None, help="allreduce: node count")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd)


def _need(value: Any, flag: str) -> Any:
    if value is None:
        raise InvalidArgument(f"ff plan needs {flag}", argument=flag.lstrip("-"))
    return value


def _request(ns: argparse.Namespace) -> Any:
    from fireflyer.planner.compute import DEFAULT_EFFICIENCY
    from fireflyer.planner.models import model_named
    from fireflyer.planner.search import PlanRequest
    from fireflyer.planner.topology import topology_named

    if ns.top < 1:
        raise InvalidArgument(f"--top must be at least 1, got {ns.top}", argument="top", value=ns.top)
    eff = DEFAULT_EFFICIENCY if ns.efficiency is None else ns.efficiency
    if not 0 < eff <= 1:
        raise InvalidArgument(f"--efficiency must be in (0, 1], got {eff}", argument="efficiency", value=eff)
    return PlanRequest(model=model_named(_need(ns.model, "--model")),
                       topology=topology_named(ns.topology or "perlmutter"),
                       gpus=_need(ns.gpus, "--gpus"), batch=_need(ns.batch, "--batch"), seq=ns.seq,
                       memory=not ns.no_memory, compute=not ns.no_compute, efficiency=eff)


def plan_json(result: Any, top: int) -> dict[str, Any]:
    req = result.request
    rows = []
    for rank, c in enumerate(result.ranked[:top], 1):
        row = {"rank": rank, "col": c.grid.col, "row": c.grid.row, "depth": c.grid.depth, "data": c.grid.data,
               "comm_s": c.comm_s, "comm_by_dim_s": {"col": c.comm.col, "row": c.comm.row,
                                                      "depth": c.comm.depth, "data": c.comm.data},
               "compute_s": c.compute_s, "step_s": c.step_s,
               "memory_bytes": None if c.memory is None else c.memory.total}
        rows.append(row)
    return {"model": {"name": req.model.name, "layers": req.model.layers, "hidden": req.model.hidden,
                      "min_tensor": req.model.min_tensor},
            "topology": req.topology.name, "gpus": req.gpus, "batch": req.batch, "seq": req.seq,
            "memory_term": req.memory, "compute_term": req.compute, "efficiency": req.efficiency,
            "considered": result.considered, "valid": len(result.ranked), "excluded": result.excluded,
            "configs": rows}


def allreduce_json(models: tuple[Any, ...]) -> dict[str, Any]:
    return {m.algorithm: {"nodes": m.nodes, "gpus": m.gpus, "bounds_GBps": {k: v / 1e9 for k, v in m.bounds.items()},
                          "bandwidth_GBps": m.bandwidth / 1e9, "theoretical_GBps": m.theoretical / 1e9,
                          "binding": m.binding} for m in models}


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if os.isatty(1) else 160, highlight=False)


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}" if s else "-"


def _configs(ns: argparse.Namespace) -> int:
    from rich.table import Table

    from fireflyer.planner.search import plan

    result = plan(_request(ns))
    if ns.json:
        print(json.dumps(plan_json(result, ns.top)))
        return 0
    req = result.request
    terms = [t for t, on in (("memory", req.memory), ("compute", req.compute)) if on]
    title = (f"{req.model.name} ({req.model.layers} x {req.model.hidden}, tensor >= {req.model.min_tensor}) on "
             f"{req.gpus} GPUs of {req.topology.name}, batch {req.batch} x seq {req.seq}; "
             f"ranked by {'step' if req.compute else 'communication'} time"
             + (f" (terms: {', '.join(terms)})" if terms else " (communication only)"))
    table = Table(box=None, header_style="bold", title=title, title_justify="left")
    for col in ("#", "col", "row", "depth", "data", "col ms", "row ms", "depth ms", "data ms", "comm s"):
        table.add_column(col, justify="right")
    if req.compute:
        table.add_column("gemm s", justify="right")
        table.add_column("step s", justify="right")
    if req.memory:
        table.add_column("mem GiB/GPU", justify="right")
    for rank, c in enumerate(result.ranked[:ns.top], 1):
        cells = [str(rank), *(str(v) for v in c.grid.sizes()),
                 _ms(c.comm.col), _ms(c.comm.row), _ms(c.comm.depth), _ms(c.comm.data), f"{c.comm_s:.3f}"]
        if req.compute:
            cells += [f"{c.compute_s:.3f}", f"{c.step_s:.3f}"]
        if req.memory:
            assert c.memory is not None
            cells.append(f"{c.memory.total / GIB:.1f}")
        table.add_row(*cells)
    console = _console()
    console.print(table)
    excluded = sum(result.excluded.values())
    console.print(f"{result.considered} configurations with product {req.gpus}: {len(result.ranked)} valid, "
                  f"{excluded} excluded" + (":" if excluded else ""))
    for reason, n in sorted(result.excluded.items(), key=lambda kv: (-kv[1], kv[0])):
        console.print(f"  {n:5d}  {reason}")
    return 0


def _allreduce(ns: argparse.Namespace) -> int:
    from rich.table import Table

    from fireflyer.planner.hfreduce_model import compare
    from fireflyer.planner.topology import topology_named

    models = compare(topology_named(ns.topology or "fireflyer2"), _need(ns.nodes, "--nodes"))
    if ns.json:
        print(json.dumps(allreduce_json(models)))
        return 0
    hf = models[0]
    table = Table(box=None, header_style="bold", title_justify="left",
                  title=f"allreduce bandwidth bounds, {hf.nodes} node(s), {hf.gpus} GPUs of {ns.topology or 'fireflyer2'} "
                        "(GB/s of gradient per GPU)")
    resources = sorted({k for m in models for k in m.bounds})
    for col in ("algorithm", *resources, "bound", "binds"):
        table.add_column(col, justify="left" if col in ("algorithm", "binds") else "right")
    for m in models:
        table.add_row(m.algorithm, *(f"{m.bounds[r] / 1e9:.2f}" if r in m.bounds else "-" for r in resources),
                      f"{m.bandwidth / 1e9:.2f}", m.binding)
    console = _console()
    console.print(table)
    console.print(f"HFReduce: {hf.theoretical / 1e9:.1f} GB/s theoretical (host memory / 24 operations per byte), "
                  f"{hf.bandwidth / 1e9:.1f} GB/s with everything counted; {hf.binding} binds.")
    return 0


def _cmd(ns: argparse.Namespace) -> int:
    try:
        return _allreduce(ns) if ns.what == "allreduce" else _configs(ns)
    except InvalidArgument as e:
        # bad input is a usage error: exit 2 like argparse's own
        print(f"ff plan: {e}", file=sys.stderr)
        return 2
