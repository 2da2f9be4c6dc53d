"""``ff launch``: run a program as N simulated nodes x K local ranks on one machine, torchrun-like.

    rc = Launcher(LaunchOptions(nodes=2, local_ranks=4), ["python", "train.py"]).run()

What happens, in order (the plan itself is :mod:`.launch_plan`, pure):

1. one HFReduce worker per node (``python -m fireflyer.hfreduce.worker``), node
   ``i`` listening on ``127.0.0.(i+1)``, each given the full peer list; or, when
   ``FF_COORD_ADDR`` is set (or ``ff up``'s cluster under ``--state-dir`` /
   ``FF_STATE_DIR`` / ``.ff`` runs a live coord), each told to join the
   coordination service, which assigns the node ranks (read back from the
   workers' ready lines).  The cluster is found as every client finds it
   (:func:`discover_cluster`); the ranks get its ``FF_<SVC>_ADDR``,
   ``FF_NATS_URL``, ``FF_TOKEN`` and ``FF_STATE_DIR``, and without one a line
   says they run standalone;
2. wait for every worker's ready line (``hfreduce worker ready node=R ...``)
   within a deadline; a worker that exits or stays silent fails the launch
   with its output tail and everything started so far is stopped;
3. N*K copies of the command with the rank environment of DESIGN.md §3; each
   output line is printed prefixed ``[rank R]`` (stdout to stdout, stderr to
   stderr) by a reader thread per pipe;
4. wait: the first rank that exits non-zero decides the exit code (a rank
   killed by signal S counts as 128+S) and every other process is stopped
   (SIGTERM, then SIGKILL after ``grace_s``); when every rank exits 0 the
   workers are stopped and the result is 0.  A worker dying under running
   ranks fails the job (exit code 1).  SIGINT/SIGTERM to the launcher stop
   everything (exit code 130/143).
5. with ``max_restarts`` N, a failed rank (or a dead worker) instead stops
   every process and starts them all again, up to N times, with
   ``FF_RESTART_COUNT`` 1, 2, ... and the same ``FF_JOB_ID`` (torchrun's
   ``--max-restarts``); a line says so each time.  When the restarts are
   spent, the last failure's exit code is the result.

A bare ``python`` (or ``python3``) as the command is the launching interpreter
(:func:`resolve_interpreter`), so the ranks run in the launcher's venv.

Every child runs in a session of its own, so stopping signals its whole
process group (a rank that forked helpers, a ``sh -c`` wrapper) and a Ctrl-C in
the terminal reaches only the launcher, which then stops the children in order:
ranks first, then workers.  Nothing started is left behind on any path.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from fireflyer.cluster.decisions import StopTarget
from fireflyer.cluster.procs import free_ports, observe, stop_processes
from fireflyer.core.errors import InvalidArgument, NotFound, Unavailable

from .launch_plan import (
    WORKER_MODULE,
    LaunchOptions,
    LaunchPlan,
    coord_note,
    make_plan,
    with_node_ranks,
    worker_env,
)

__all__ = ["Launcher", "LaunchOptions", "WorkerStartError", "LineSink", "print_line", "exit_code_of",
           "default_worker_prefix", "READY_PREFIX", "launch", "discover_coord", "discover_cluster",
           "resolve_interpreter"]

#: the first words of the line a worker prints on stdout once it serves
READY_PREFIX = "hfreduce worker ready"
_TAIL_LINES = 30
_POLL_S = 0.02

#: ``sink(source, stream, line)``: source is ``rank R`` or ``worker N``, stream ``stdout``/``stderr``
LineSink = Callable[[str, str, str], None]
_print_lock = threading.Lock()


def print_line(source: str, stream: str, line: str) -> None:
    """The default sink: ``[rank 3] line`` on the launcher's stdout or stderr, whole lines at a time."""
    out = sys.stdout if stream == "stdout" else sys.stderr
    with _print_lock:
        out.write(f"[{source}] {line}\n")
        out.flush()


def exit_code_of(returncode: int) -> int:
    """A Popen return code as a shell would report it: killed by signal S -> 128+S."""
    return 128 - returncode if returncode < 0 else returncode


def resolve_interpreter(cmd: Sequence[str], executable: str | None = None) -> list[str]:
    """``cmd`` with a bare ``python`` / ``python3`` replaced by the launching interpreter
    (``sys.executable``), so the ranks run in the launcher's environment (its venv), not
    whatever ``python`` is first on PATH.  Anything else (a path, ``python3.11``) is left alone."""
    out = list(cmd)
    if out and out[0] in ("python", f"python{sys.version_info.major}"):
        out[0] = executable or sys.executable or out[0]
    return out


def default_worker_prefix() -> list[str]:
    """How a worker is started, before its arguments; tests substitute a stand-in script."""
    return [sys.executable, "-m", WORKER_MODULE]


class WorkerStartError(Unavailable):
    """A node worker exited or stayed silent at start: fields ``node``, ``exit_code``; the message has its output."""


class _Interrupted(BaseException):
    """Raised in the main thread by our SIGINT/SIGTERM handler; carries the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Child:
    """One process we started: its Popen, identity for safe signalling, reader threads, output tail."""

    def __init__(self, label: str, popen: subprocess.Popen[bytes]) -> None:
        self.label = label
        self.popen = popen
        info = observe(popen.pid)
        self.target = StopTarget(label, popen.pid, info.start_ticks if info else None)
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.threads: list[threading.Thread] = []
        self.ready = threading.Event()
        self.ready_line = ""

    def read(self, pipe: IO[bytes], stream: str, sink: LineSink, ready_prefix: str | None = None) -> None:
        t = threading.Thread(target=self._pump, args=(pipe, stream, sink, ready_prefix),
                             name=f"ff-launch-{self.label}-{stream}", daemon=True)
        t.start()
        self.threads.append(t)

    def _pump(self, pipe: IO[bytes], stream: str, sink: LineSink, ready_prefix: str | None) -> None:
        with pipe:
            while True:
                raw = pipe.readline(1 << 16)
                if not raw:
                    return
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self.tail.append(line)
                if ready_prefix is not None and not self.ready.is_set() and line.startswith(ready_prefix):
                    self.ready_line = line
                    self.ready.set()
                    continue
                try:
                    sink(self.label, stream, line)
                except Exception:  # noqa: BLE001 - a broken sink must not stop draining the pipe
                    pass

    def tail_text(self) -> str:
        lines = list(self.tail)
        return "\n".join(f"    {ln}" for ln in lines) if lines else "    (no output)"


class Launcher:
    """Start the workers and ranks of one ``ff launch`` and see them through to the end; see the module docs.

    ``run()`` returns the exit code; it raises :class:`WorkerStartError` (or
    another ``FireFlyerError``) when the job cannot start, after stopping
    whatever it had started.  ``pids`` lists every process started, for tests.
    """

    def __init__(self, opts: LaunchOptions, cmd: Sequence[str], *, run_dir: str | Path | None = None,
                 grace_s: float = 5.0, ready_timeout_s: float = 60.0, sink: LineSink = print_line,
                 env: dict[str, str] | None = None, worker_prefix: Sequence[str] | None = None,
                 handle_signals: bool = True, start_workers: bool = True, deadline_s: float | None = None,
                 state_dir: str | Path | None = None, max_restarts: int = 0) -> None:
        if not cmd:
            raise InvalidArgument("no command to launch: give it after '--' (ff launch ... -- python train.py)")
        if max_restarts < 0:
            raise InvalidArgument(f"--max-restarts must be >= 0, got {max_restarts}", value=max_restarts)
        self.opts = opts
        self.cmd = resolve_interpreter(cmd)
        #: the local cluster to hand to the ranks (None: FF_STATE_DIR of ``env``, else ./.ff)
        self.state_dir = state_dir
        #: relaunch every rank (and the workers) this many times after a failure (torchrun's --max-restarts)
        self.max_restarts = max_restarts
        #: restarts done so far in this run
        self.restarts = 0
        self.grace_s = grace_s
        self.ready_timeout_s = ready_timeout_s
        self.sink = sink
        self.env = dict(os.environ if env is None else env)
        self.worker_prefix = list(worker_prefix) if worker_prefix is not None else default_worker_prefix()
        self.handle_signals = handle_signals
        #: False runs the ranks alone (a torch.distributed/Gloo program needs no HFReduce worker)
        self.start_workers = start_workers
        #: whole-job limit in seconds: past it everything is stopped and the exit code is 124 (like timeout(1))
        self.deadline_s = deadline_s
        self._given_run_dir = Path(run_dir) if run_dir is not None else None
        self.workers: list[_Child] = []
        self.ranks: list[_Child] = []
        self.plan: LaunchPlan | None = None
        self._stopping = False
        self._earlier: list[_Child] = []  # processes of attempts before a restart (already stopped)

    @property
    def pids(self) -> list[int]:
        return [c.popen.pid for c in self._earlier + self.workers + self.ranks]

    # -- the whole job -------------------------------------------------------------------------------------------

    def run(self) -> int:
        found, note = discover_cluster(self.env, self.state_dir)
        self.env.update(found)
        if note:
            self.sink("launch", "stderr", note)
        note = coord_note(self.env) if self.start_workers else None
        if note:
            self.sink("launch", "stderr", note)
        run_dir, created = self._make_run_dir()
        restore = self._install_signal_handlers()
        # one job id for every attempt, so a relaunched job finds its own checkpoints
        job_id = self.opts.job_id or f"launch-{secrets.token_hex(4)}"
        first_restart = int(self.env.get("FF_RESTART_COUNT") or 0)
        try:
            while True:
                self.plan = self._plan(run_dir, job_id, first_restart + self.restarts)
                if self.start_workers:
                    self._start_workers(self.plan)
                    if self.env.get("FF_COORD_ADDR"):
                        self.plan = with_node_ranks(self.plan, self._coord_ranks())
                self._start_ranks(self.plan)
                code, failed = self._wait()
                if code == 0 or failed is None or self.restarts >= self.max_restarts:
                    return code
                self.restarts += 1
                self.sink("launch", "stderr", f"ff launch: {failed} exited with {code}; restarting "
                                              f"({self.restarts}/{self.max_restarts})")
                self._stop_all()
                self._earlier += self.workers + self.ranks
                self.workers, self.ranks = [], []
        except _Interrupted as e:
            self.sink("launch", "stderr", f"got {signal.Signals(e.signum).name}: stopping every process")
            return 128 + e.signum
        finally:
            self._stopping = True
            self._stop_all()
            restore()
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _make_run_dir(self) -> tuple[Path, bool]:
        if self._given_run_dir is not None:
            self._given_run_dir.mkdir(parents=True, exist_ok=True)
            return self._given_run_dir.resolve(), False
        # under /tmp, short: the node sockets live here and sun_path allows 107 bytes
        return Path(tempfile.mkdtemp(prefix="ff-launch-", dir="/tmp" if os.path.isdir("/tmp") else None)), True

    def _plan(self, run_dir: Path, job_id: str | None = None, restart_count: int = 0) -> LaunchPlan:
        job_id = job_id or self.opts.job_id or f"launch-{secrets.token_hex(4)}"
        # one call on the wildcard address: distinct ports, each free on every address, so torch's
        # store (which listens on all of them) cannot collide with a worker's listener
        *ports, master_port = free_ports(self.opts.nodes + 1, "0.0.0.0")
        coord = self.env.get("FF_COORD_ADDR") if self.start_workers else None
        return make_plan(self.opts, run_dir=run_dir, ports=ports, master_port=master_port, job_id=job_id,
                         token=secrets.token_hex(16), base_env=self.env, worker_prefix=self.worker_prefix,
                         coord_addr=coord or None, restart_count=restart_count, cpus=_allowed_cpus(),
                         coord_restart_count=self._coord_restart_count(coord, job_id, restart_count) if coord
                         else None)

    def _coord_restart_count(self, coord: str, job_id: str, restart_count: int) -> int:
        """The restart count the workers join coord with: ours, raised past the one coord keeps for
        the job's communicator when an earlier run of the same job (``--job NAME`` relaunched, or
        the attempt before a restart) left one there -- coord refuses a join from an "older run"."""
        import asyncio

        from fireflyer.coord import CoordClient
        from fireflyer.coord.model import comm_id

        async def current() -> int | None:
            async with CoordClient(coord, token=self.env.get("FF_TOKEN") or None) as c:
                try:
                    return (await asyncio.wait_for(c.get(comm_id(job_id, "default")), 10.0)).restart_count
                except NotFound:
                    return None

        try:
            found = asyncio.run(current())
        except Exception as e:  # noqa: BLE001 -- best effort: a join with ours still works for a fresh job
            self.sink("launch", "stderr", f"ff launch: could not read {job_id}/default from coord ({e}); "
                                          f"joining with restart count {restart_count}")
            return restart_count
        return restart_count if found is None else max(restart_count, found + 1)

    def _coord_ranks(self) -> dict[int, int]:
        """Planned node index -> the node rank coord gave that worker (``node=R`` of its ready line)."""
        out = {}
        for i, w in enumerate(self.workers):
            m = re.search(r"\bnode=(\d+)", w.ready_line)
            if m is None:
                raise WorkerStartError(f"the worker of node {i} printed no node rank: {w.ready_line!r}", node=i,
                                       exit_code=None)
            out[i] = int(m.group(1))
        return out

    # -- workers -------------------------------------------------------------------------------------------------

    def _start_workers(self, plan: LaunchPlan) -> None:
        env = worker_env(self.env, local_ranks=self.opts.local_ranks, nodes=self.opts.nodes)
        env.setdefault("PYTHONUNBUFFERED", "1")
        for node in plan.nodes:
            child = _Child(f"worker {node.node_rank}", self._popen(node.argv, env, merge_stderr=True, cpus=node.cpus))
            self.workers.append(child)
            assert child.popen.stdout is not None
            child.read(child.popen.stdout, "stderr", self.sink, ready_prefix=READY_PREFIX)
        deadline = time.monotonic() + self.ready_timeout_s
        while not all(w.ready.is_set() for w in self.workers):
            for node, w in zip(plan.nodes, self.workers, strict=True):
                rc = w.popen.poll()
                if rc is not None and not w.ready.is_set():
                    for t in w.threads:
                        t.join(1.0)  # let the reader catch the last words
                    raise WorkerStartError(
                        f"the worker of node {node.node_rank} ({node.listen}) exited with code "
                        f"{exit_code_of(rc)} before it was ready; its output:\n{w.tail_text()}",
                        node=node.node_rank, exit_code=exit_code_of(rc))
            if time.monotonic() >= deadline:
                late = [n.node_rank for n, w in zip(plan.nodes, self.workers, strict=True) if not w.ready.is_set()]
                tails = "\n".join(f"  node {i}:\n{self.workers[i].tail_text()}" for i in late)
                raise WorkerStartError(
                    f"worker(s) of node(s) {late} printed no ready line within {self.ready_timeout_s:g} s; "
                    f"their output:\n{tails}", node=late[0], exit_code=None)
            time.sleep(_POLL_S)

    # -- ranks ---------------------------------------------------------------------------------------------------

    def _start_ranks(self, plan: LaunchPlan) -> None:
        cpus = {n.node_rank: n.cpus for n in plan.nodes}  # (a rank runs beside its node's worker)
        for r in plan.ranks:
            try:
                popen = self._popen(self.cmd, r.env, merge_stderr=False, cpus=cpus.get(r.node_rank))
            except OSError as e:
                raise InvalidArgument(f"cannot start rank {r.rank}: {self.cmd[0]}: {e.strerror or e}",
                                      rank=r.rank, command=self.cmd[0]) from e
            child = _Child(f"rank {r.rank}", popen)
            self.ranks.append(child)
            assert popen.stdout is not None and popen.stderr is not None
            child.read(popen.stdout, "stdout", self.sink)
            child.read(popen.stderr, "stderr", self.sink)

    def _wait(self) -> tuple[int, str | None]:
        """Poll until every rank exited 0 (-> 0) or one failed / a worker died (-> its code and
        label, which a restart may retry); past the deadline -> (124, None)."""
        done: set[int] = set()
        deadline = time.monotonic() + self.deadline_s if self.deadline_s is not None else None
        can_restart = self.restarts < self.max_restarts
        while len(done) < len(self.ranks):
            if deadline is not None and time.monotonic() >= deadline:
                self.sink("launch", "stderr", f"the job ran past its {self.deadline_s:g} s limit; stopping every process")
                return 124, None
            for i, r in enumerate(self.ranks):
                if i in done:
                    continue
                rc = r.popen.poll()
                if rc is None:
                    continue
                done.add(i)
                if rc != 0:
                    code = exit_code_of(rc)
                    if not can_restart:
                        self.sink("launch", "stderr", f"{r.label} exited with code {code}; stopping every other process")
                    return code, r.label
            for w in self.workers:
                rc = w.popen.poll()
                if rc is not None:
                    for t in w.threads:
                        t.join(1.0)
                    self.sink("launch", "stderr", f"{w.label} exited with code {exit_code_of(rc)} while ranks "
                              f"were running; stopping every process. Its output:\n{w.tail_text()}")
                    return 1, w.label
            time.sleep(_POLL_S)
        return 0, None

    # -- processes -----------------------------------------------------------------------------------------------

    @staticmethod
    def _popen(argv: Sequence[str], env: dict[str, str], *, merge_stderr: bool,
               cpus: Sequence[int] | None = None) -> subprocess.Popen[bytes]:
        """Start a child; with ``cpus``, bound to them from its first instruction.

        The affinity is set on this thread just around the fork (a child inherits its
        parent thread's mask, and the kernel applies it per thread), so no thread of the
        child ever runs elsewhere and no unsafe ``preexec_fn`` is needed.
        """
        with _bound(cpus):
            return subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                                    start_new_session=True, close_fds=True)

    def _stop_all(self) -> None:
        """Ranks first, then workers (phase 1); SIGTERM, SIGKILL after the grace; then drain the pipes."""
        targets = [StopTarget(c.target.label, c.target.pid, c.target.start_ticks, phase=0) for c in self.ranks]
        targets += [StopTarget(c.target.label, c.target.pid, c.target.start_ticks, phase=1) for c in self.workers]
        children = [c.popen for c in self.ranks + self.workers]
        if targets:
            stop_processes(targets, timeout_s=self.grace_s, children=children)
        # a process a rank left behind (its session leader already exited, so the group signal above
        # skipped it) would keep the output pipe open and outlive the job: kill it by pid
        _kill_sessions({c.popen.pid for c in self.ranks + self.workers})
        for c in self.ranks + self.workers:
            try:
                c.popen.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL failed: nothing more we can do
                pass
            for t in c.threads:
                t.join(2.0)

    def _install_signal_handlers(self) -> Callable[[], None]:
        """SIGINT/SIGTERM raise :class:`_Interrupted` in the main thread (once; not while stopping)."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handler(signum: int, frame: FrameType | None) -> None:
            if not self._stopping:
                self._stopping = True
                raise _Interrupted(signum)

        previous: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)

        def restore() -> None:
            for sig, h in previous.items():
                signal.signal(sig, h)

        return restore


def _allowed_cpus() -> list[int]:
    """The CPUs this process may run on (empty where the platform cannot say or bind)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return []


@contextlib.contextmanager
def _bound(cpus: Sequence[int] | None) -> Iterator[None]:
    """Run the block with this thread bound to ``cpus`` (nothing when None), then restore its mask."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _session_members(sids: set[int]) -> list[int]:
    """Live processes whose session id is one of ``sids`` (our children are session leaders)."""
    found: list[int] = []
    for d in Path("/proc").iterdir() if sids and os.path.isdir("/proc") else ():
        if not d.name.isdigit():
            continue
        try:
            state, sid = parse_proc_session(d.joinpath("stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        if sid in sids and state not in ("Z", "X"):
            found.append(int(d.name))
    return found


def parse_proc_session(text: str) -> tuple[str, int]:
    """(state letter, session id) from the text of ``/proc/<pid>/stat`` (field 6, after the last ')')."""
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[3])


def _kill_sessions(sids: set[int]) -> None:
    """SIGKILL every process still in one of our children's sessions, then wait (bounded) for them to go."""
    strays = _session_members(sids)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while strays and time.monotonic() < deadline:
        strays = [p for p in strays if (i := observe(p)) is not None and not i.zombie]
        if strays:
            time.sleep(_POLL_S)


def discover_cluster(env: dict[str, str], state_dir: str | Path | None = None) -> tuple[dict[str, str], str | None]:
    """(variables to add to ``env``, a note to print) for the cluster the ranks should use.

    The cluster is found as every client finds it (:func:`fireflyer.cluster.discovery.find_cluster`:
    the ``FF_*`` variables of ``env``, else the local cluster of ``state_dir`` / ``FF_STATE_DIR`` /
    ``.ff``), counting only processes that still run.  The variables are its ``FF_<SVC>_ADDR``,
    ``FF_NATS_URL``, ``FF_TOKEN`` (the user's) and ``FF_STATE_DIR``, only those ``env`` does not set.
    With no cluster at all the note says the ranks run standalone.
    """
    from fireflyer.cluster.discovery import find_cluster, state_dir_of
    from fireflyer.core.errors import FireFlyerError

    root = state_dir_of(state_dir, env)
    try:
        cluster = find_cluster(state_dir, env=env, live_only=True)
    except FireFlyerError as e:  # an unreadable record: say so, and run without it
        return {}, f"ff launch: the cluster under {root} is unreadable ({e}); the ranks run standalone"
    if not (cluster.meta or cluster.mgmtd or cluster.ckpt or cluster.coord or cluster.sched):
        return {}, (f"ff launch: no Fire-Flyer cluster found (no live services in {root}/cluster.json, no "
                    "FF_*_ADDR): the ranks run standalone; pass --state-dir DIR or set FF_STATE_DIR to use one")
    return {k: v for k, v in cluster.env().items() if not env.get(k)}, None


def discover_coord(env: dict[str, str]) -> dict[str, str]:
    """The service variables of a running ``ff up`` cluster with a live coord (``{}`` without one):
    :func:`discover_cluster` for callers that only want the cluster when coord runs."""
    found, _ = discover_cluster(env)
    return found if found.get("FF_COORD_ADDR") else {}


def launch(opts: LaunchOptions, cmd: Sequence[str], **kw: Any) -> int:
    """``Launcher(opts, cmd, **kw).run()``: the exit code of the job."""
    return Launcher(opts, cmd, **kw).run()

