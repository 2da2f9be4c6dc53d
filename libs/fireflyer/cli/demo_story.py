"""The platform half of ``ff demo``: a training task's life on the HAI scheduler.

On the running ``ff up`` cluster under the state dir, as the cluster's user:

1. **train** — ``docs/examples/train_ddp.py`` (HaiScale DDP over HFReduce, a checkpoint every few
   steps through the checkpoint service into 3FS) is submitted with the scheduler on two nodes,
   priority LOW, and runs;
2. **preempt** — a HIGH task that needs all three nodes arrives: the scheduler interrupts the
   training task, every rank saves at one step and suspends, the HIGH task runs and finishes;
3. **resume** — the training task's next run loads that checkpoint and goes on;
4. **heal** — one node of the running task is made slow (the example's ``--slow-file`` fault
   injection): the health service names it from the collective telemetry, drains it, and the
   task restarts from its checkpoint on the two healthy nodes; the drained node is validated and
   comes back;
5. a summary: steps, allreduce bandwidth, checkpoints, preemptions, incidents.

Every step waits with a deadline and a live line of what it waits for; one that does not happen
raises :class:`StoryFailed` naming the step, with the task's log tail.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from fireflyer.core.errors import FireFlyerError

__all__ = ["StoryFailed", "story_demo"]

T = TypeVar("T")

#: the example the story trains (the same file the README and docs/haiscale.md show)
EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "train_ddp.py"


class StoryFailed(Exception):
    """A step of the story did not happen: ``step`` says which, the message what was seen."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.detail = detail


class Story:
    """The story's state: clients, the two tasks, and what was measured on the way."""

    def __init__(self, state_dir: Path, console: Any, *, steps: int, step_s: float) -> None:
        from fireflyer.cluster.records import StatePaths, read_tokens

        self.state_dir = state_dir
        self.console = console
        self.steps = steps
        self.step_s = step_s
        tokens = read_tokens(StatePaths(state_dir).tokens)
        user, admin = tokens.for_role("user"), tokens.for_role("admin")
        if user is None or admin is None:
            raise StoryFailed("setup", f"{StatePaths(state_dir).tokens} has no user or admin token")
        self.user, self.admin = user.token, admin.token
        self.slow_file = state_dir / "demo-slow-node"
        self.slow_file.unlink(missing_ok=True)
        self.train = 0
        self.step = "setup"
        self.facts: dict[str, str] = {}

    # -- plumbing ---------------------------------------------------------------------------------------
    def sched(self, fn: Callable[[Any], Coroutine[Any, Any, T]], *, admin: bool = False) -> T:
        from fireflyer.sched.client import SchedClient

        async def go() -> T:
            async with SchedClient(None, token=self.admin if admin else self.user, state_dir=self.state_dir,
                                   role="admin" if admin else "user") as c:
                return await fn(c)
        return asyncio.run(go())

    def chain(self, task: int) -> Any:
        return self.sched(lambda c: c.get(task))

    def log(self, task: int, rank: int = 0, restart: int | None = None) -> str:
        async def go(c: Any) -> str:
            return b"".join([d async for d in c.logs(task, rank, restart=restart)]).decode(errors="replace")
        try:
            return self.sched(go)
        except FireFlyerError as e:
            return f"(no log: {e})"

    def wait(self, what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.5) -> T:
        """Poll ``probe`` until it returns something truthy, showing ``what`` and the time spent."""
        t0 = time.monotonic()
        last_error = ""
        with self.console.status(f"{what} ...") as status:
            while True:
                try:
                    got = probe()
                except FireFlyerError as e:  # a takeover or a slow service: try again within the deadline
                    got, last_error = None, str(e)
                if got:
                    self.console.print(f"  [green]✓[/green] {what} ({time.monotonic() - t0:.1f} s)")
                    return got
                spent = time.monotonic() - t0
                if spent > timeout_s:
                    raise StoryFailed(self.step, f"{what}: not within {timeout_s:.0f} s"
                                      + (f" (last error: {last_error})" if last_error else ""))
                status.update(f"{what} ... {spent:.0f} s")
                time.sleep(every_s)

    def submit(self, **fields: Any) -> int:
        from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb

        chain = self.sched(lambda c: c.submit(pb.TaskSpec(**fields)))
        return int(chain.chain_id)

    def newest(self, task: int) -> Any:
        return self.chain(task).runs[-1]

    def running_on_all(self, task: int, restart: int) -> Any:
        r = self.newest(task)
        return r if (r.restart_count == restart and r.slurm_state == "RUNNING" and r.ranks
                     and all(k.state == "running" for k in r.ranks)) else None

    # -- the story --------------------------------------------------------------------------------------
    def run_train(self) -> None:
        self.step = "train"
        self.console.rule("[bold]1. a training task: HaiScale DDP over HFReduce, checkpoints to 3FS")
        cmd = [sys.executable, str(EXAMPLE), "--steps", str(self.steps), "--save-every", "5",
               "--step-s", str(self.step_s), "--slow-file", str(self.slow_file)]
        # min_runtime_s: the cluster's default (HAI's 15 min) protects a fresh run from preemption;
        # the story cannot wait that long
        self.train = self.submit(name="train-mlp", nodes=2, priority="LOW", grace_ack_s=30.0, grace_final_s=60.0,
                                 min_runtime_s=5.0, max_restarts=3, command=cmd)
        self.console.print(f"ff task submit -n 2 -p LOW -- python {EXAMPLE.name} ...  -> task {self.train}")
        run = self.wait("the scheduler places it on two nodes and its ranks run",
                        lambda: self.running_on_all(self.train, 0), 120)
        self.console.print(f"  run {run.id} on {', '.join(run.nodes)}")
        self.wait("it trains and saves a checkpoint", lambda: "checkpoint" in self.log(self.train), 180)

    def run_preempt(self) -> None:
        self.step = "preempt"
        self.console.rule("[bold]2. a HIGH task that needs every node preempts it")
        code = "import os, time; time.sleep(3); print('urgent rank', os.environ['FF_NODE_RANK'], 'done')"
        t0 = time.monotonic()
        high = self.submit(name="urgent", nodes=3, priority="HIGH", command=[sys.executable, "-c", code])
        self.console.print(f"ff task submit -n 3 -p HIGH ...  -> task {high}")

        saved = self.wait("the training task is interrupted, saves at one step on every rank and suspends",
                          lambda: _saved_step(self.log(self.train, restart=0)), 120)
        first = self.chain(self.train).runs[0]
        self.console.print(f"  run {first.id}: {first.slurm_state}, stop reasons {'|'.join(first.stop_reasons)}; "
                           f"every rank saved step {saved}")
        if "INTERRUPT" not in first.stop_reasons:
            raise StoryFailed(self.step, f"the training run stopped for {first.stop_reasons}, not an interrupt")
        self.wait("the HIGH task runs on all three nodes and completes",
                  lambda: self.newest(high).slurm_state == "COMPLETED", 120)
        self.facts["preemption"] = f"HIGH submitted -> done in {time.monotonic() - t0:.1f} s; LOW saved step {saved}"
        self.facts["saved_step"] = str(saved)

    def run_resume(self) -> None:
        self.step = "resume"
        self.console.rule("[bold]3. the training task resumes from its checkpoint")
        self.wait("its next run starts", lambda: self.running_on_all(self.train, 1), 120)
        line = self.wait("it loads the checkpoint and goes on",
                         lambda: next((ln for ln in self.log(self.train).splitlines() if "resumed job" in ln), None),
                         120)
        self.console.print(f"  {line.strip()}")
        if f"at step {self.facts['saved_step']}" not in line:
            raise StoryFailed(self.step, f"resumed at another step than the saved {self.facts['saved_step']}: {line}")

    def run_heal(self) -> None:
        from fireflyer.health.client import HealthClient

        self.step = "heal"
        self.console.rule("[bold]4. a slow node: the health service names it, drains it, the task moves")
        run = self.newest(self.train)
        victim = run.nodes[-1]
        self.slow_file.write_text(f"{victim}\n1.0\n")
        t0 = time.monotonic()
        self.console.print(f"  fault injected: every step on {victim} now takes 1 s longer")

        async def incidents() -> list[Any]:
            async with HealthClient(None, token=self.admin, state_dir=self.state_dir, role="admin") as h:
                return list(await h.incidents())

        def named() -> Any:
            return next((i for i in asyncio.run(incidents()) if i.node == victim), None)
        inc = self.wait(f"the health service names {victim}", named, 120)
        self.console.print(f"  incident {inc.id}: {inc.kind} on {inc.node} — {inc.summary} "
                           f"({time.monotonic() - t0:.1f} s after the fault)")
        self.slow_file.unlink(missing_ok=True)  # the node "recovers": its validation can pass
        moved = self.wait("the task restarts from its checkpoint on the healthy nodes",
                          lambda: (r := self.running_on_all(self.train, 2)) and victim not in r.nodes and r, 180)
        self.console.print(f"  run {moved.id} on {', '.join(moved.nodes)}; restart after {time.monotonic() - t0:.1f} s")
        self.facts["incident"] = f"{inc.kind} on {victim}, named {inc.id}"
        self.facts["heal_s"] = f"{time.monotonic() - t0:.1f}"
        self.wait(f"{victim} passes validation and is back in service",
                  lambda: any(n.name == victim and n.state == "enabled" for n in self.sched(lambda c: c.nodes(),
                                                                                         admin=True)), 180)

    def run_finish(self) -> None:
        self.step = "finish"
        self.console.rule("[bold]5. the training task finishes")
        self.wait(f"it trains to step {self.steps}", lambda: self.newest(self.train).slurm_state == "COMPLETED",
                  300, 1.0)
        done = next((ln for ln in self.log(self.train).splitlines() if ln.startswith("done:")), "")
        if "parameters identical" not in done:
            raise StoryFailed(self.step, "the last run did not end with identical parameters:\n"
                              + _tail(self.log(self.train)))
        self.console.print(f"  {done}")

    def summary(self) -> Any:
        from rich.table import Table

        chain = self.chain(self.train)
        t = Table(title="the story in figures", box=None, header_style="bold", title_justify="left")
        t.add_column("WHAT")
        t.add_column("FIGURE", overflow="fold")
        t.add_row("training", f"{self.steps} steps, {len(chain.runs)} runs "
                              f"({', '.join('+'.join(r.nodes) for r in chain.runs)})")
        t.add_row("allreduce", self.allreduce_figure())
        t.add_row("checkpoints", self.checkpoint_figure())
        t.add_row("preemptions", self.facts.get("preemption", "-"))
        t.add_row("incidents", self.facts.get("incident", "-") +
                  (f"; task running again {self.facts['heal_s']} s after the fault" if "heal_s" in self.facts else ""))
        return t

    def allreduce_figure(self) -> str:
        from fireflyer.cli.coord import resolve_coord
        from fireflyer.coord.client import CoordClient

        address, token = resolve_coord(self.state_dir, address=None, token=self.user)
        runs = {str(r.id) for r in self.chain(self.train).runs}  # each run has its own communicator

        async def go() -> str:
            async with CoordClient(address, token=token) as c:
                comms = [v for v in await c.list() if v.job in runs]
                rates = []
                for v in comms:
                    rep, _ = await c.op_stats(v.comm)
                    rates += [o.nbytes / (o.span_s - o.max_lag_s) for o in rep.recent
                              if o.kind == "allreduce" and not o.error and o.nbytes >= 4096
                              and o.span_s - o.max_lag_s > 0]
                if not rates:
                    return "-"
                return f"{len(rates)} allreduces of gradients, median {statistics.median(rates) / 1e6:.0f} MB/s"
        try:
            return asyncio.run(go())
        except FireFlyerError as e:
            return f"- ({e})"

    def checkpoint_figure(self) -> str:
        from fireflyer.ckpt.client import CheckpointClient
        from fireflyer.cluster.discovery import find_cluster

        c = find_cluster(self.state_dir, need=("ckpt",), token=self.user)
        with CheckpointClient(c.ckpt[0], token=self.user) as client:
            jobs = [j for j in client.jobs() if j == f"task-{self.train}"]  # (train_ddp.py's job name)
            recs = [r for j in jobs for r in client.list(j, include_all=True)]
        committed = [r for r in recs if r.committed]
        if not committed:
            return "-"
        took = [r.committed_at - r.created_at for r in committed if r.committed_at]
        return (f"newest {len(committed)} kept (keep_last 2) of one every 5 steps and at each suspend, "
                f"{committed[-1].nbytes / 1e3:.0f} kB each, save median {statistics.median(took) * 1e3:.0f} ms"
                if took else f"{len(committed)} kept")


def _saved_step(log: str) -> int | None:
    for line in log.splitlines():
        if line.startswith("suspend requested: every rank saved step "):
            return int(line.split("saved step ")[1].split(";")[0])
    return None


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.splitlines()[-n:])


def story_demo(state_dir: Path, console: Any, *, steps: int = 120, step_s: float = 0.2) -> None:
    """Tell the story on the cluster under ``state_dir``; raises :class:`StoryFailed` at the first
    step that does not happen (with the training task's log tail)."""
    story = Story(state_dir, console, steps=steps, step_s=step_s)
    try:
        try:
            story.run_train()
            story.run_preempt()
            story.run_resume()
            story.run_heal()
            story.run_finish()
        except FireFlyerError as e:  # a refusal or an unreachable service: the step did not happen
            raise StoryFailed(story.step, f"{type(e).__name__}: {e}") from e
    except StoryFailed as e:
        if story.train:
            e.detail += "\nthe training task's log (newest run, rank 0):\n" + _tail(story.log(story.train))
        raise
    console.print(story.summary())
