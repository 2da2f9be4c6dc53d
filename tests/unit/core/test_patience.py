"""Patience: a wait logs at INFO, escalates to WARNING after its grace, and says when it recovered."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fireflyer.core.log import get_logger
from fireflyer.core.patience import Patience


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, dict[str, Any]]]:
    caplog.set_level(logging.DEBUG, logger="test.patience")
    out: list[tuple[int, str, dict[str, Any]]] = []

    class H(logging.Handler):
        def emit(self, r: logging.LogRecord) -> None:
            out.append((r.levelno, r.ff_event, dict(r.ff_fields)))  # type: ignore[attr-defined]

    h = H()
    logging.getLogger("test.patience").addHandler(h)
    yield out
    logging.getLogger("test.patience").removeHandler(h)


def _p(clock: Clock, **kw: Any) -> Patience:
    return Patience(get_logger("test.patience"), "svc.heartbeat_failed", clock=clock, **kw)


def test_within_the_grace_new_reasons_are_info_and_repeats_debug(lines) -> None:
    clock = Clock()
    p = _p(clock, grace_s=30.0)
    assert p.failed("no primary") == logging.INFO
    clock.t += 2
    assert p.failed("no primary") == logging.DEBUG
    clock.t += 2
    assert p.failed("chain table 1 does not exist") == logging.INFO
    assert [lv for lv, _, _ in lines] == [logging.INFO, logging.DEBUG, logging.INFO]
    assert lines[-1][2] == {"error": "chain table 1 does not exist", "failures": 3, "waited_s": 4.0}
    p.ok()  # never escalated: nothing to say
    assert len(lines) == 3 and p.since is None and p.failures == 0


def test_a_wait_past_the_grace_is_a_warning_then_repeats_every_repeat_s(lines) -> None:
    clock = Clock()
    p = _p(clock, grace_s=30.0, repeat_s=10.0)
    p.failed("no primary")
    clock.t += 29.9
    assert p.failed("no primary") == logging.DEBUG
    clock.t += 0.1
    assert p.failed("no primary") == logging.WARNING and p.escalated
    assert lines[-1][2]["waited_s"] == 30.0
    clock.t += 5
    assert p.failed("no primary") == logging.DEBUG
    assert p.failed("another reason") == logging.WARNING  # a new reason past the grace
    clock.t += 10
    assert p.failed("another reason") == logging.WARNING  # the same one, repeat_s later
    p.ok()
    assert lines[-1][:2] == (logging.INFO, "svc.heartbeat_recovered")
    assert lines[-1][2]["failures"] == 6
    # a new run starts a new grace
    assert p.failed("no primary") == logging.INFO and not p.escalated


def test_zero_grace_warns_at_once_and_bad_grace_is_refused() -> None:
    p = _p(Clock(), grace_s=0.0)
    assert p.failed("x") == logging.WARNING
    with pytest.raises(ValueError, match="grace_s"):
        _p(Clock(), grace_s=-1)
