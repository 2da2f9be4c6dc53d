import io
import json

import pytest

from fireflyer.core import ManualClock, configure_logging, get_logger, id_time_ms, new_id


def test_ids_are_unique_sortable_and_carry_time():
    a = new_id("ckpt", now_ms=1_000)
    b = new_id("ckpt", now_ms=2_000)
    assert a.startswith("ckpt-") and a < b and id_time_ms(a) == 1_000
    assert len({new_id() for _ in range(1000)}) == 1000


def test_manual_clock_moves_only_when_told():
    c = ManualClock(start=100.0)
    assert c.time() == 100.0 and c.monotonic() == 0.0
    c.advance(2.5)
    assert c.time() == 102.5 and c.monotonic() == 2.5
    with pytest.raises(ValueError):
        c.advance(-1)


def test_log_lines_are_one_json_object_per_event():
    buf = io.StringIO()
    configure_logging(level="info", fmt="json", service="svc", instance="svc-0", stream=buf)
    log = get_logger("fireflyer.test")
    log.info("thing.happened", n=3, who="me")
    log.debug("hidden")
    lines = buf.getvalue().strip().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["event"] == "thing.happened" and rec["n"] == 3 and rec["service"] == "svc"
    assert rec["instance"] == "svc-0" and rec["level"] == "info"
