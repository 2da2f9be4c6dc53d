"""``ff demo``: bring a local cluster up, tell the Fire-Flyer story on it, bring it down.

``ff up`` of the default cluster (deploy/local.toml: every service, 3 storage nodes, 3 compute
nodes in two zones), ``ff status``, one authenticated echo call that publishes a NATS event (its
trace is drawn at the end), then the story of :mod:`.demo_story`: a HaiScale DDP training task
submitted to the scheduler checkpoints to 3FS, is preempted by a HIGH task, resumes from its
checkpoint, loses a node to an injected slowdown that the health service names and drains, and
finishes on the healthy nodes; a summary table; ``ff down`` (``--keep`` leaves the cluster up to
explore, with the dashboard's address), and the echo call's trace across processes, read back from
the cluster's span file after ``ff down`` flushed it.  A step that does not happen ends the demo
with a non-zero exit, the step's name and the task's log tail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["register", "run_demo", "trace_tree"]


def trace_tree(spans: Sequence[Any], trace_id: str) -> list[str]:
    """Lines drawing the spans of one trace as a tree (parents first, by start time)."""
    mine = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start_ns)
    ids = {s.span_id for s in mine}
    children: dict[str | None, list[Any]] = {}
    for s in mine:
        parent = s.parent_span_id if s.parent_span_id in ids else None
        children.setdefault(parent, []).append(s)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in children.get(parent, []):
            ms = (s.end_ns - s.start_ns) / 1e6
            lines.append(f"{'  ' * depth}{s.name}  [{s.instance or s.service}] {s.kind.lower()} {ms:.1f} ms")
            walk(s.span_id, depth + 1)

    walk(None, 0)
    return lines


def run_demo(*, state_dir: Path, config: Path, console: Any, keep: bool = False) -> int:
    from fireflyer.cli.demo_story import StoryFailed, story_demo
    from fireflyer.cli.echo import call_echo, resolve_target
    from fireflyer.cluster import supervisor
    from fireflyer.cluster.records import StatePaths
    from fireflyer.core.config import TelemetrySettings
    from fireflyer.telemetry import read_spans, setup_tracing, shutdown_tracing, trace_id_hex, tracer
    from fireflyer.testing.echo import published_subject

    paths = StatePaths(state_dir)
    console.rule("[bold]ff up")
    rc = supervisor.up(config_path=config, state_dir=state_dir, env=os.environ, cwd=Path.cwd(), console=console)
    if rc != 0:
        return rc
    trace_id = ""
    kept = False
    down_rc = 0
    try:
        console.rule("[bold]ff status")
        rc = supervisor.status(state_dir=state_dir, console=console, as_json=False)
        if rc != 0:
            return rc

        console.rule("[bold]ff echo (authenticated gRPC call that publishes a NATS event)")
        setup_tracing("ff", f"ff-demo:{os.getpid()}", state_dir=state_dir,
                      settings=TelemetrySettings(span_file=str(paths.spans)), batch=False)
        address, token = resolve_target(state_dir, address=None, token=None, role="user")

        async def call() -> Any:
            with tracer("fireflyer.cli.demo").start_as_current_span("ff demo"):
                return trace_id_hex(), await call_echo(address, token, "hello, Fire-Flyer",
                                                       publish=published_subject("demo"))

        trace_id, reply = asyncio.run(call())
        console.print(f"reply: {reply.text!r} for user {reply.user} (roles {', '.join(reply.roles)})")
        console.print(f"trace id: {trace_id} (the service saw {reply.trace_id})")

        try:
            story_demo(state_dir, console)
        except StoryFailed as e:
            console.print(f"[red bold]the demo failed at step {e.step!r}[/red bold]")
            console.print(e.detail, markup=False, highlight=False)
            console.print(f"service logs: {paths.root / 'logs'}")
            rc = 1
        shutdown_tracing()
        dashboard = _dashboard_address(state_dir)
        if dashboard:
            console.print(f"dashboard: {dashboard} (log in with the user token of {paths.tokens})")
        kept = keep and rc == 0
    finally:
        if not kept:
            console.rule("[bold]ff down")
            down_rc = supervisor.down(state_dir=state_dir, timeout_s=10.0, console=console)
    if kept:
        console.print(f"the cluster stays up (--keep): `ff status --state-dir {state_dir}`, "
                      f"`ff down --state-dir {state_dir}` when done")
        return 0
    # services flush their spans when they stop, so the whole trace is on disk now
    console.rule(f"[bold]trace {trace_id}")
    lines = trace_tree(list(read_spans(paths.spans)), trace_id)
    for line in lines:
        console.print(line, highlight=False, markup=False)
    instances = {ln.rsplit("[", 1)[1].split("]")[0] for ln in lines}
    console.print(f"{len(lines)} spans from {len(instances)} processes; spans file: {paths.spans}")
    if len(instances) < 2:
        console.print("[red]the trace did not cross processes[/red]")
        return 1
    return rc or down_rc


def _dashboard_address(state_dir: Path) -> str:
    """The local cluster's dashboard URL, or "" when it runs none."""
    from fireflyer.cluster.records import StatePaths, read_record

    record = read_record(StatePaths(state_dir))
    if record is None:
        return ""
    address = next((p.http_address for p in record.processes if p.name == "dashboard" and p.http_address), "")
    return f"http://{address}/" if address else ""


def _cmd(ns: argparse.Namespace) -> int:
    from fireflyer.cli.cluster_cmds import _console
    from fireflyer.cluster.config import default_config_path

    config = Path(ns.config) if ns.config else default_config_path()
    return run_demo(state_dir=Path(ns.state_dir), config=config, console=_console(), keep=ns.keep)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="bring a local cluster up, show it working, bring it down")
    p.add_argument("--state-dir", default=".ff-demo", metavar="DIR", help="state dir (default .ff-demo)")
    p.add_argument("--config", default=None, metavar="FILE", help="cluster file (default deploy/local.toml)")
    p.add_argument("--keep", action="store_true", help="leave the cluster up after the story, to explore")
    p.set_defaults(func=_cmd)
