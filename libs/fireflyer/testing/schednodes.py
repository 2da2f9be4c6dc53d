"""In-process node agents for scheduler tests: :class:`FakeNodeAgents` implements
:class:`fireflyer.sched.agents.NodeAgents` and answers back as a real agent would, through the
``report`` callback (tests wire it to the scheduler's ``NodeService.Report`` over gRPC).

What it does per call, keyed by (run id, rank) so repeats are no-ops:

- ``start``: the rank runs (``running``), its log gets a first line, ``running`` is reported;
  a node in ``fail_start`` refuses with Unavailable instead; one in ``lose_starts`` / ``lose_next_start`` loses it;
- ``suspend``: the run's flag is raised on that node (``flags``); nothing is reported (the test
  plays the runtime: :meth:`ack`, :meth:`go_suspend`);
- ``stop``: every rank of the run on that node ends ``stopped`` with exit code -15 (SIGTERM),
  reported; with ``ignore_stop`` it records the call only (a hung agent);
- ``logs``: the rank's chunks so far, then, with ``follow``, new ones until the rank ends.

``calls`` records every call in order, as ``(what, node, run id, detail)``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

from fireflyer.core.errors import Unavailable
from fireflyer.sched.agents import NodeRef, RankLaunch

__all__ = ["FakeNodeAgents", "Reporter"]

#: report(run_id, rank, node, state, exit_code, suspend_code, whole_life_state)
Reporter = Callable[[int, int, str, str, int, int, int], Awaitable[None]]


class FakeNodeAgents:
    def __init__(self, report: Reporter | None = None) -> None:
        self.report = report
        self.calls: list[tuple[str, str, int, object]] = []
        self.running: dict[tuple[int, int], str] = {}  # (run, rank) -> node
        self.launches: dict[tuple[int, int], RankLaunch] = {}
        self.flags: set[tuple[int, str]] = set()  # (run, node) with the suspend flag up
        self.fail_start: set[str] = set()
        #: nodes whose next start (``lose_next_start``), or every start (``lose_starts``), is lost on
        #: the way: recorded, no error, nothing runs
        self.lose_next_start: set[str] = set()
        self.lose_starts: set[str] = set()
        self.ignore_stop = False
        self._logs: dict[tuple[int, int], list[bytes]] = defaultdict(list)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the NodeAgents protocol -------------------------------------------------------------------
    async def start(self, node: NodeRef, launch: RankLaunch) -> None:
        self.calls.append(("start", node.name, launch.task_id, launch.rank))
        if node.name in self.fail_start:
            raise Unavailable(f"node agent {node.name} is not reachable (fake)", node=node.name)
        if node.name in self.lose_starts or node.name in self.lose_next_start:
            self.lose_next_start.discard(node.name)
            return
        key = (launch.task_id, launch.rank)
        if key in self.launches:
            return
        self.launches[key] = launch
        self.running[key] = node.name
        await self._log(key, f"run {launch.task_id} rank {launch.rank} on {node.name}: {' '.join(launch.command)}\n")
        self._send(launch.task_id, launch.rank, node.name, "running", 0)

    async def suspend(self, node: NodeRef, task_id: int, signal: str = "") -> None:
        self.calls.append(("suspend", node.name, task_id, signal))
        self.flags.add((task_id, node.name))

    async def stop(self, node: NodeRef, task_id: int, grace_s: float) -> None:
        self.calls.append(("stop", node.name, task_id, grace_s))
        if self.ignore_stop:
            return
        for (run, rank), where in list(self.running.items()):
            if run == task_id and where == node.name:
                await self._end((run, rank), "stopped", -15)

    async def logs(self, node: NodeRef, task_id: int, rank: int, follow: bool) -> AsyncIterator[bytes]:
        key = (task_id, rank)
        sent = 0
        while True:
            chunks = self._logs[key]
            while sent < len(chunks):
                yield chunks[sent]
                sent += 1
            if not follow or key not in self.running:
                return
            async with self._changed:
                await self._changed.wait_for(lambda n=sent: len(self._logs[key]) > n or key not in self.running)

    # -- the test plays the runtime and the processes ------------------------------------------------
    async def write(self, task_id: int, rank: int, text: str) -> None:
        await self._log((task_id, rank), text)

    async def ack(self, task_id: int) -> None:
        """The runtime saw the suspend flag (``receive_suspend_command()`` returned True)."""
        node = self.running.get((task_id, 0), "")
        await self._report(task_id, 0, node, "", 0, 2, -1)

    async def go_suspend(self, task_id: int, whole_life_state: int = -1) -> None:
        node = self.running.get((task_id, 0), "")
        await self._report(task_id, 0, node, "", 0, 3, whole_life_state)

    async def exit(self, task_id: int, rank: int, code: int) -> None:
        await self._end((task_id, rank), "succeeded" if code == 0 else "failed", code)

    async def exit_all(self, task_id: int, code: int) -> None:
        for run, rank in sorted(k for k in self.running if k[0] == task_id):
            await self.exit(run, rank, code)

    def ranks_of(self, task_id: int) -> dict[int, str]:
        return {rank: node for (run, rank), node in self.running.items() if run == task_id}

    async def settle(self) -> None:
        """Wait for the reports sent so far."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- internals ------------------------------------------------------------------------------------
    async def _end(self, key: tuple[int, int], state: str, code: int) -> None:
        node = self.running.pop(key, None)
        if node is None:
            return
        await self._log(key, f"exited with {code}\n")
        self._send(key[0], key[1], node, state, code)

    async def _log(self, key: tuple[int, int], text: str) -> None:
        async with self._changed:
            self._logs[key].append(text.encode())
            self._changed.notify_all()

    def _send(self, run: int, rank: int, node: str, state: str, code: int) -> None:
        # as a task: an agent reports on its own schedule, not inside the scheduler's call to it
        task = asyncio.get_running_loop().create_task(self._report(run, rank, node, state, code, 0, -1))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self, run: int, rank: int, node: str, state: str, code: int, suspend: int, wls: int) -> None:
        if self.report is not None:
            await self.report(run, rank, node, state, code, suspend, wls)
