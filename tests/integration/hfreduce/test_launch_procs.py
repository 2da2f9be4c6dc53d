"""The launcher with real processes: a stand-in worker script and ``python -c`` ranks.

The stand-in prints the worker's ready line and sleeps until SIGTERM; env vars
make it fail at start, stay silent or die later, so every failure path of the
launcher is exercised without the real HFReduce engine.  After every test no
process the launcher started (nor anything in their sessions) may remain.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fireflyer.cluster.procs import observe
from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce import launch as launch_mod
from fireflyer.hfreduce.launch import Launcher, WorkerStartError
from fireflyer.hfreduce.launch_plan import LaunchOptions
from fireflyer.testing.poll import wait_until

STAND_IN = textwrap.dedent("""
    import argparse, os, signal, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--node-rank", type=int); p.add_argument("--socket"); p.add_argument("--peers")
    a, _ = p.parse_known_args()
    me = str(a.node_rank)
    if os.environ.get("STANDIN_FAIL_NODE") == me:
        print("boom: cannot bind", a.peers.split(",")[a.node_rank], flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *x: sys.exit(0))
    if os.environ.get("STANDIN_SILENT_NODE") != me:
        print(f"hfreduce worker ready node={me} socket={a.socket} listen={a.peers.split(',')[a.node_rank]}",
              flush=True)
    print(f"pid={os.getpid()}", flush=True)
    print(f"cpus={sorted(os.sched_getaffinity(0))}", flush=True)
    print(f"send_buf={os.environ.get('FF_HFREDUCE_SEND_BUF_SIZE', '<unset>')}", flush=True)
    if os.environ.get("STANDIN_DIE_NODE") == me:
        time.sleep(0.5)
        print("engine crashed", flush=True)
        sys.exit(5)
    while True:
        time.sleep(1)
""")


def sessions_alive(sids: list[int]) -> list[int]:
    """Pids of live (non-zombie) processes whose session is one of ``sids``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2:].split()
        if rest[0] not in ("Z", "X") and int(rest[3]) in sids:
            found.append(int(d.name))
    return found


def assert_nothing_left(pids: list[int]) -> None:
    assert pids, "the launcher started nothing"
    assert [p for p in pids if (i := observe(p)) is not None and not i.zombie] == []
    assert sessions_alive(pids) == []


_STARTED: list[Launcher] = []


@pytest.fixture(autouse=True)
def _reap_on_failure() -> Iterator[None]:
    """If a test fails with processes still running, kill them so they do not outlive the test run."""
    yield
    for la in _STARTED:
        for pid in la.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for c in la.workers + la.ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(5)
    _STARTED.clear()


@pytest.fixture
def stand_in(tmp_path: Path) -> list[str]:
    path = tmp_path / "stand_in_worker.py"
    path.write_text(STAND_IN)
    return [sys.executable, str(path)]


class Lines:
    def __init__(self) -> None:
        self.got: list[tuple[str, str, str]] = []

    def __call__(self, source: str, stream: str, line: str) -> None:
        self.got.append((source, stream, line))

    def of(self, source: str, stream: str | None = None) -> list[str]:
        return [ln for s, st, ln in self.got if s == source and (stream is None or st == stream)]


def make(stand_in: list[str], code: str, *, nodes: int = 2, local: int = 2, env: dict[str, str] | None = None,
         **kw) -> tuple[Launcher, Lines]:  # type: ignore[no-untyped-def]
    lines = Lines()
    full_env = dict(os.environ, **(env or {}))
    opts = LaunchOptions(nodes=nodes, local_ranks=local, cpu_bind=kw.pop("cpu_bind", "node"))
    la = Launcher(opts, [sys.executable, "-c", code], sink=lines,
                  env=full_env, worker_prefix=stand_in, grace_s=kw.pop("grace_s", 2.0), handle_signals=False, **kw)
    _STARTED.append(la)
    return la, lines


def test_all_ranks_succeed_output_prefixed_workers_stopped(stand_in: list[str]) -> None:
    code = ("import os, sys; e = os.environ; print('out', e['FF_RANK'], e['FF_LOCAL_RANK'], e['FF_NODE_RANK'],"
            " e['FF_HFREDUCE_SOCKET'].rsplit('/', 1)[1]); print('err', e['RANK'], file=sys.stderr)")
    la, lines = make(stand_in, code)
    assert la.run() == 0
    for r in range(4):
        node, local = divmod(r, 2)
        assert lines.of(f"rank {r}", "stdout") == [f"out {r} {local} {node} node{node}.sock"]
        assert lines.of(f"rank {r}", "stderr") == [f"err {r}"]
    # workers got SIGTERM and exited 0 (the stand-in's SIGTERM handler), after every rank finished
    assert [w.popen.returncode for w in la.workers] == [0, 0]
    assert [ln for ln in lines.of("worker 0") if ln.startswith("pid=")]
    assert_nothing_left(la.pids)
    assert la.plan is not None and not Path(la.plan.run_dir).exists()  # temp run dir removed


def test_workers_get_the_loopback_send_buffer_unless_the_environment_says(stand_in: list[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's nodes share loopback: their workers' links get a fixed 256K SO_SNDBUF, unless
    FF_HFREDUCE_SEND_BUF_SIZE is set, even empty (auto-tuning); the ranks' environment is left alone."""
    monkeypatch.delenv("FF_HFREDUCE_SEND_BUF_SIZE", raising=False)
    code = "import os; print('rank sees', os.environ.get('FF_HFREDUCE_SEND_BUF_SIZE', '<unset>'))"
    la, lines = make(stand_in, code, nodes=2, local=1)
    assert la.run() == 0
    assert [ln for n in range(2) for ln in lines.of(f"worker {n}") if ln.startswith("send_buf=")] == \
        ["send_buf=256K"] * 2
    assert lines.of("rank 0", "stdout") == ["rank sees <unset>"]
    for given in ("", "1M"):
        la, lines = make(stand_in, code, nodes=1, local=1, env={"FF_HFREDUCE_SEND_BUF_SIZE": given})
        assert la.run() == 0
        assert f"send_buf={given}" in lines.of("worker 0")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding needs at least two CPUs to split")
def test_each_node_runs_on_its_own_cpu_share(stand_in: list[str]) -> None:
    from fireflyer.hfreduce.launch_plan import node_cpus

    code = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"
    mine = os.sched_getaffinity(0)
    la, lines = make(stand_in, code + "; import time; time.sleep(0.3)")
    assert la.run() == 0
    shares = node_cpus(2, sorted(mine))
    assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])
    for r in range(4):  # every rank beside its node's worker
        assert lines.of(f"rank {r}", "stdout") == [f"cpus {list(shares[r // 2])}"]  # type: ignore[arg-type]
    for n in range(2):
        assert f"cpus={list(shares[n])}" in lines.of(f"worker {n}")  # type: ignore[arg-type]
    # the launcher's own mask is back as it was (it is only narrowed around each fork)
    assert os.sched_getaffinity(0) == mine
    assert la.plan is not None and [n.cpus for n in la.plan.nodes] == shares
    la2, lines2 = make(stand_in, code, nodes=2, local=1, cpu_bind="none")
    assert la2.run() == 0
    every = sorted(os.sched_getaffinity(0))
    assert lines2.of("rank 0", "stdout") == lines2.of("rank 1", "stdout") == [f"cpus {every}"]


def test_first_nonzero_exit_code_stops_everything(stand_in: list[str]) -> None:
    # rank 2 fails fast; the rest would sleep a minute, and rank 1 also ignores SIGTERM (needs SIGKILL),
    # and rank 3 forked a grandchild that must go too
    code = textwrap.dedent("""
        import os, signal, subprocess, sys, time
        r = int(os.environ['FF_RANK'])
        if r == 2:
            time.sleep(0.3); sys.exit(7)
        if r == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if r == 3:
            subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
        print('sleeping', flush=True)
        time.sleep(60)
    """)
    la, lines = make(stand_in, code, grace_s=0.5)
    t0 = time.monotonic()
    assert la.run() == 7
    assert time.monotonic() - t0 < 20
    assert any("rank 2 exited with code 7" in ln for ln in lines.of("launch"))
    assert la.ranks[1].popen.returncode == -signal.SIGKILL
    assert_nothing_left(la.pids)


def test_stray_grandchild_of_a_successful_rank_is_killed(stand_in: list[str]) -> None:
    # the rank exits 0 at once but leaves a child holding its stdout: the launcher must neither hang on the
    # pipe nor leave the child behind
    code = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('parent done')")
    la, lines = make(stand_in, code, nodes=1, local=1)
    t0 = time.monotonic()
    assert la.run() == 0
    assert time.monotonic() - t0 < 15
    assert lines.of("rank 0", "stdout") == ["parent done"]
    assert_nothing_left(la.pids)


def test_rank_killed_by_signal_reports_128_plus_signal(stand_in: list[str]) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL) if os.environ['FF_RANK'] == '0' else None"
    la, _ = make(stand_in, code, nodes=1, local=2)
    assert la.run() == 128 + signal.SIGKILL
    assert_nothing_left(la.pids)


def test_worker_failing_at_start_is_an_error_with_its_output(stand_in: list[str]) -> None:
    la, _ = make(stand_in, "print('never')", nodes=3, local=1, env={"STANDIN_FAIL_NODE": "1"})
    with pytest.raises(WorkerStartError) as e:
        la.run()
    msg = str(e.value)
    assert "node 1" in msg and "code 3" in msg and "boom: cannot bind 127.0.0.2:" in msg
    assert e.value.node == 1 and e.value.exit_code == 3
    assert la.ranks == []  # no rank was started
    assert_nothing_left(la.pids)


def test_silent_worker_times_out_naming_the_node(stand_in: list[str]) -> None:
    la, _ = make(stand_in, "print('never')", nodes=2, local=1, env={"STANDIN_SILENT_NODE": "0"},
                 ready_timeout_s=1.5)
    with pytest.raises(WorkerStartError, match=r"node\(s\) \[0\] printed no ready line") as e:
        la.run()
    assert "pid=" in str(e.value)  # its output tail is in the message
    assert la.ranks == []
    assert_nothing_left(la.pids)


def test_worker_dying_under_running_ranks_fails_the_job(stand_in: list[str]) -> None:
    la, lines = make(stand_in, "import time; time.sleep(60)", nodes=2, local=1, env={"STANDIN_DIE_NODE": "1"})
    assert la.run() == 1
    assert any("worker 1 exited with code 5" in ln and "engine crashed" in ln for ln in lines.of("launch"))
    assert_nothing_left(la.pids)


def test_command_not_found_stops_the_workers(stand_in: list[str]) -> None:
    la = Launcher(LaunchOptions(nodes=2, local_ranks=1), ["/nonexistent/ff-test-binary"], sink=Lines(),
                  worker_prefix=stand_in, handle_signals=False)
    _STARTED.append(la)
    with pytest.raises(InvalidArgument, match="cannot start rank 0"):
        la.run()
    assert_nothing_left(la.pids)


def test_job_deadline_stops_everything(stand_in: list[str]) -> None:
    la, lines = make(stand_in, "import time; time.sleep(60)", nodes=1, local=2, deadline_s=0.5)
    assert la.run() == 124
    assert any("past its 0.5 s limit" in ln for ln in lines.of("launch"))
    assert_nothing_left(la.pids)


def test_cli_prefixes_output_and_propagates_code(stand_in: list[str], monkeypatch: pytest.MonkeyPatch,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    from fireflyer.cli.main import main

    monkeypatch.setattr(launch_mod, "default_worker_prefix", lambda: list(stand_in))
    monkeypatch.delenv("FF_COORD_ADDR", raising=False)  # coord mode is covered by tests/integration/coord
    code = "import os, sys; print('hi', os.environ['WORLD_SIZE']); sys.exit(int(os.environ['RANK']) + 4)"
    rc = main(["launch", "--nodes", "1", "--local-ranks", "2", "--grace", "1", "--", sys.executable, "-c", code])
    out, err = capfd.readouterr()
    assert rc in (4, 5)  # the first to exit non-zero
    assert "[rank 0] hi 2" in out or "[rank 1] hi 2" in out
    assert main(["launch", "--nodes", "2", "--zones", "A", "--", "true"]) == 1
    assert "--zones names 1 zone(s)" in capfd.readouterr().err


def test_sigterm_to_the_launcher_stops_everything(stand_in: list[str], tmp_path: Path) -> None:
    script = tmp_path / "run_launcher.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from fireflyer.hfreduce.launch import Launcher
        from fireflyer.hfreduce.launch_plan import LaunchOptions
        code = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(60)"
        sys.exit(Launcher(LaunchOptions(nodes=2, local_ranks=1), [sys.executable, "-c", code],
                          worker_prefix={stand_in!r}, grace_s=1.0).run())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        while len(pids) < 2:
            line = proc.stdout.readline()
            assert line, f"launcher ended early: {proc.communicate(timeout=10)}"
            if "] pid " in line:
                pids.append(int(line.rsplit(" ", 1)[1]))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        err = proc.stderr.read() if proc.stderr else ""
        worker_pids = [int(ln.rsplit("=", 1)[1]) for ln in err.splitlines() if "] pid=" in ln]
        assert len(worker_pids) == 2 and "got SIGTERM" in err
        wait_until(lambda: not sessions_alive(pids + worker_pids), timeout_s=5, what="children gone")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- --job and --max-restarts (issue 47 point 3) ------------------------------------------------------------

_FAILS_ONCE = textwrap.dedent("""
    import os, sys
    e = os.environ
    print('job', e['FF_JOB_ID'], 'restart', e['FF_RESTART_COUNT'], flush=True)
    if e['FF_RANK'] == '1' and e['FF_RESTART_COUNT'] == '0':
        sys.exit(3)
""")


def _printed(lines: Lines, rank: int) -> list[tuple[str, str]]:
    return [(ln.split()[1], ln.split()[3]) for ln in lines.of(f"rank {rank}", "stdout") if ln.startswith("job ")]


def test_max_restarts_relaunches_every_rank_with_a_stable_job_id(stand_in: list[str]) -> None:
    la, lines = make(stand_in, _FAILS_ONCE, nodes=2, local=1, max_restarts=2,
                     env={"FF_RESTART_COUNT": ""})
    la.opts = LaunchOptions(nodes=2, local_ranks=1, job_id="myjob")
    assert la.run() == 0
    assert la.restarts == 1
    assert lines.of("launch", "stderr").count("ff launch: rank 1 exited with 3; restarting (1/2)") == 1
    for r in (0, 1):
        seen = _printed(lines, r)
        assert {job for job, _ in seen} == {"myjob"}
        assert ("myjob", "1") in seen  # every rank ran again, with the restart counted
    assert ("myjob", "0") in _printed(lines, 1)
    assert len(la.pids) == 2 * (2 + 2)  # two attempts of 2 workers + 2 ranks, all stopped
    assert_nothing_left(la.pids)


def test_generated_job_id_is_kept_across_restarts(stand_in: list[str]) -> None:
    la, lines = make(stand_in, _FAILS_ONCE, nodes=1, local=2, max_restarts=1)
    assert la.run() == 0
    jobs = {job for r in (0, 1) for job, _ in _printed(lines, r)}
    assert len(jobs) == 1 and jobs.pop().startswith("launch-")
    assert_nothing_left(la.pids)


def test_restarts_spent_give_the_failing_rank_code(stand_in: list[str]) -> None:
    code = "import os, sys; print('restart', os.environ['FF_RESTART_COUNT'], flush=True); sys.exit(4)"
    la, lines = make(stand_in, code, nodes=1, local=1, max_restarts=2)
    assert la.run() == 4
    assert la.restarts == 2
    assert [ln for ln in lines.of("launch") if "restarting" in ln] == [
        "ff launch: rank 0 exited with 4; restarting (1/2)", "ff launch: rank 0 exited with 4; restarting (2/2)"]
    assert lines.of("rank 0", "stdout") == ["restart 0", "restart 1", "restart 2"]
    assert any("rank 0 exited with code 4; stopping" in ln for ln in lines.of("launch"))
    assert_nothing_left(la.pids)


def test_cli_takes_job_and_max_restarts(stand_in: list[str], monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from fireflyer.cli.main import main

    monkeypatch.setattr(launch_mod, "default_worker_prefix", lambda: stand_in)
    for var in ("FF_RESTART_COUNT", "FF_META_ADDR", "FF_MGMTD_ADDR", "FF_CKPT_ADDR", "FF_COORD_ADDR", "FF_SCHED_ADDR"):
        monkeypatch.delenv(var, raising=False)
    rc = main(["launch", "--state-dir", str(tmp_path / "none"), "--job", "named", "--max-restarts", "1",
               "--grace", "1", "--", "python", "-c", _FAILS_ONCE.replace("'1'", "'0'")])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "[rank 0] job named restart 0" in out and "[rank 0] job named restart 1" in out
    assert "ff launch: rank 0 exited with 3; restarting (1/1)" in err
    # no cluster in that state dir: one line says the ranks run standalone
    assert err.count("no Fire-Flyer cluster found") == 1 and "standalone" in err
