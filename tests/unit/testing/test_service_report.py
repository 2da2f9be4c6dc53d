"""A failed test's report names each service process it started and how that process ended."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

FAILING_TESTS = textwrap.dedent("""
    import signal
    from fireflyer.testing.poll import wait_until
    from fireflyer.testing.services import ServiceProcess

    def _start(tmp_path, name):
        return ServiceProcess("fireflyer.testing.crasher", state_dir=tmp_path, nats_url="nats://127.0.0.1:1",
                              tokens_file=None, instance=name, args=["--hang"]).start()

    def test_one_dies_by_signal(tmp_path):
        victim, other = _start(tmp_path, "victim-0"), _start(tmp_path, "bystander-0")
        try:
            wait_until(lambda: "victim-0" in victim.log(), timeout_s=20, what="victim logging")
            victim.signal(signal.SIGKILL)
            victim.wait(10)
            assert False, "the service went away"
        finally:
            other.stop()

    def test_passes_quietly(tmp_path):
        p = _start(tmp_path, "quiet-0")
        p.stop()
""")


def test_the_report_of_a_failed_test_says_which_service_died_and_how(tmp_path: Path) -> None:
    (tmp_path / "test_services_fail.py").write_text(FAILING_TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "fireflyer.testing.service_report", "-p", "no:cacheprovider",
         "-q", "-rA", str(tmp_path / "test_services_fail.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    report = out[out.index("service processes"):]
    assert "victim-0 (fireflyer.testing.crasher, pid " in report, out
    assert "exited with -9 (SIGKILL)" in report.split("bystander-0")[0], out
    # the bystander, stopped by the test's own finally (SIGTERM: 0 once its handler is in, else -15)
    bystander = report[report.index("bystander-0 (fireflyer.testing.crasher"):].splitlines()[0]
    assert "): exited with 0;" in bystander or "): exited with -15 (SIGTERM);" in bystander, out
    # a passing test gets no such section
    assert "quiet-0" not in out, out
