"""``ff bench health --e2e``'s pure parts: reading steps from a rank's log, the summary, the flag."""

from __future__ import annotations

import pytest

from fireflyer.bench.health import main as health_main
from fireflyer.bench.health_e2e import start_step, steps_done, summarize

LOG = """rank 0 start at step 0 restart 0 whole_life_state 0
step 0 restart 0
step 1 restart 0
rank 0 saved step 2
step 2 restart 0
step 3 restart 1
rank 0 start at step 2 restart 1 whole_life_state 0
step 2 restart 1
"""


def test_steps_done_counts_the_run_of_that_restart() -> None:
    assert steps_done(LOG, 0) == 3
    assert steps_done(LOG, 1) == 4
    assert steps_done("rank 0 start at step 0 restart 0\n", 0) is None
    assert steps_done("step 7 restart 0 and more\n", 0) is None  # only whole lines count


def test_start_step_is_what_the_run_loaded() -> None:
    assert start_step(LOG, 0) == 0
    assert start_step(LOG, 1) == 2
    assert start_step(LOG, 2) is None


def _run(restart_s: float, interval: float, lost: int) -> dict[str, float]:
    return {"named_s": 2.0, "ranks_running_s": restart_s - 0.5, "restart_s": restart_s, "back_s": 9.0,
            "steps_lost": lost, "checkpoint_interval_s": interval, "restart_over_interval": restart_s / interval}


def test_summarize_takes_medians_and_worst() -> None:
    s = summarize([_run(4.0, 1.0, 3), _run(6.0, 1.0, 7), _run(5.0, 1.0, 5)])
    assert s["restart_s_median"] == 5.0 and s["restart_over_interval_median"] == 5.0
    assert s["restart_over_interval_max"] == 6.0 and s["steps_lost_max"] == 7 and s["steps_lost_median"] == 5


def test_e2e_refuses_bad_arguments_before_touching_a_cluster() -> None:
    with pytest.raises(SystemExit) as e:
        health_main(["--e2e", "--iterations", "0", "--state-dir", "/nonexistent"])
    assert e.value.code == 2
