"""What ``ff up`` / ``status`` / ``down`` print: rich tables, and a live progress
display while services start when stdout is a terminal (plain lines otherwise,
so logs and CI output stay readable)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from .decisions import StatusRow, StopOutcome
from .records import ClusterRecord

__all__ = ["StartProgress", "print_up_table", "print_status", "print_down", "print_tail", "print_metrics"]


def _short(path: str, state_dir: str) -> str:
    """A path under the state dir (named in the heading) relative to it: keeps tables narrow."""
    p = Path(path)
    return str(p.relative_to(state_dir)) if p.is_relative_to(state_dir) else path


def _heading(console: Console, text: str) -> None:
    # not a table title: those wrap at the table's width, and paths are long
    console.print(text, style="bold", highlight=False, markup=False, soft_wrap=True)


class StartProgress:
    """One line per instance: waiting -> healthy / failed."""

    def __init__(self, console: Console, instances: Sequence[str]) -> None:
        self.console = console
        self.instances = list(instances)
        self.t0 = time.monotonic()
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> StartProgress:
        if self.console.is_terminal:
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=self.console)
            self._progress.start()
            for i in self.instances:
                self._tasks[i] = self._progress.add_task(f"{i}: starting", total=1)
        else:
            self.console.print(f"waiting for {len(self.instances)} service(s) to answer health checks: "
                               f"{', '.join(self.instances)}", highlight=False)
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, instance: str, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._tasks[instance], description=f"{instance}: {text}")

    def finish(self, instance: str, ok: bool, text: str) -> None:
        line = f"{instance}: {text} ({time.monotonic() - self.t0:.1f}s)"
        if self._progress is not None:
            mark = "[green]✓[/]" if ok else "[red]✗[/]"
            self._progress.update(self._tasks[instance], description=f"{mark} {line}", completed=1)
        else:
            self.console.print(line, highlight=False, markup=False)


def print_up_table(console: Console, record: ClusterRecord) -> None:
    _heading(console, f"Fire-Flyer local cluster — {record.state_dir}")
    table = Table()
    for col in ("NAME", "INSTANCE", "PID", "ADDRESS", "LOG"):
        table.add_column(col, overflow="fold")
    n = record.nats
    table.add_row("nats", "nats", str(n.pid) if n.pid else "-", n.url,
                  _short(n.log, record.state_dir) if n.log else "(external server)")
    for p in record.processes:
        table.add_row(p.name, p.instance, str(p.pid), p.address, _short(p.log, record.state_dir))
    console.print(table)
    console.print(f"tokens: {record.tokens_file}\nspans:  {record.spans_file}\n"
                  f"stop with: ff down --state-dir {record.state_dir}", highlight=False, markup=False)


def print_tail(console: Console, title: str, lines: Iterable[str]) -> None:
    lines = list(lines)
    console.print(f"--- {title} ---" if lines else f"--- {title}: (empty) ---", highlight=False, markup=False)
    for line in lines:
        # soft_wrap: the log's own lines, not re-wrapped to the terminal width
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def print_status(console: Console, state_dir: str, rows: Sequence[StatusRow]) -> None:
    _heading(console, f"Fire-Flyer local cluster — {state_dir}")
    table = Table()
    for col in ("NAME", "INSTANCE", "PID", "ADDRESS", "STATE", "HEALTH"):
        table.add_column(col, overflow="fold")
    for r in rows:
        state = r.state if r.exit_code is None else f"{r.state} (exit {r.exit_code})"
        style = "" if r.healthy else "red"
        table.add_row(r.name, r.instance, str(r.pid) if r.pid else "-", r.address, state, r.health, style=style)
    console.print(table)
    for r in rows:
        if r.state == "crashed":
            print_tail(console, f"{r.instance} crashed; last lines of {r.log}", r.log_tail)
            if r.restart_command:
                # the same port and store: every service reconnects to it by itself
                console.print(f"restart {r.instance} on {r.address} with: {shlex.join(r.restart_command)}",
                              highlight=False, markup=False, soft_wrap=True)


def print_metrics(console: Console, state_dir: str, rows: Sequence[Mapping[str, object]]) -> None:
    """``ff metrics``: each process's Prometheus URL (and, after ``--scrape``, what it answered)."""
    _heading(console, f"Prometheus endpoints — {state_dir}")
    table = Table()
    scraped = any("scrape" in r for r in rows)
    for col in ("NAME", "INSTANCE", "URL", *(("SCRAPE",) if scraped else ())):
        table.add_column(col, overflow="fold")
    for r in rows:
        cells = [str(r["name"]), str(r["instance"]), str(r["url"] or "-")]
        if scraped:
            cells.append(str(r.get("scrape", "")))
        table.add_row(*cells, style="red" if r.get("error") else "")
    console.print(table)


def print_down(console: Console, title: str, pids: Mapping[str, int | None],
               outcomes: Mapping[str, StopOutcome]) -> None:
    _heading(console, title)
    table = Table()
    for col in ("PROCESS", "PID", "RESULT"):
        table.add_column(col)
    for label, outcome in outcomes.items():
        pid = pids.get(label)
        style = "red" if outcome is StopOutcome.SURVIVED else ""
        table.add_row(label, str(pid) if pid else "-", outcome.value, style=style)
    console.print(table)
