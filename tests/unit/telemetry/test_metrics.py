"""ServiceMetrics: its own registry, the ff_ prefix and service label, scrape hooks on the loop, HTTP."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from fireflyer.core.errors import FailedPrecondition
from fireflyer.telemetry.metrics import ServiceMetrics, health_incident


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _value(m: ServiceMetrics, name: str, **labels: str) -> float | None:
    want = tuple(sorted({**labels, "service": m.service}.items()))
    return _samples(m.scrape()).get((name, want))


def test_counter_gauge_histogram_have_prefix_and_service_label() -> None:
    m = ServiceMetrics("storage", "storage-0")
    c = m.counter("storage_write_bytes", "bytes written", ("op",))
    c.labels(op="write").inc(4096)
    c.labels(op="write").inc(4096)
    g = m.gauge("storage_targets", "targets by state", ("state",))
    g.labels(state="serving").set(2)
    h = m.histogram("op_duration_seconds", "op time", buckets=(0.1, 1.0))
    h.observe(0.05)
    h.observe(0.5)
    assert _value(m, "ff_storage_write_bytes_total", op="write") == 8192
    assert _value(m, "ff_storage_targets", state="serving") == 2
    assert _value(m, "ff_op_duration_seconds_bucket", le="0.1") == 1
    assert _value(m, "ff_op_duration_seconds_count") == 2
    assert _value(m, "ff_service_info", instance="storage-0") == 1
    # process metrics come with it, also labelled
    assert (_value(m, "ff_process_cpu_seconds_total") or 0) >= 0
    # nothing landed in the library's global registry
    assert REGISTRY.get_sample_value("ff_storage_write_bytes_total", {"op": "write"}) is None


def test_two_services_in_one_process_do_not_collide() -> None:
    a, b = ServiceMetrics("meta", "meta-0"), ServiceMetrics("meta", "meta-1")
    a.counter("x", "x").inc()
    b.counter("x", "x").inc(5)
    assert _value(a, "ff_x_total") == 1 and _value(b, "ff_x_total") == 5


def test_defining_again_returns_the_same_metric_or_refuses_a_different_one() -> None:
    m = ServiceMetrics("coord")
    first = m.counter("hfreduce_bytes", "bytes", ("comm",))
    assert m.counter("ff_hfreduce_bytes", "bytes", ("comm",)) is first
    with pytest.raises(FailedPrecondition):
        m.gauge("hfreduce_bytes", "bytes", ("comm",))
    with pytest.raises(FailedPrecondition):
        m.counter("hfreduce_bytes", "bytes", ("node",))
    with pytest.raises(FailedPrecondition):
        m.counter("other", "service is added", ("service",))


def test_health_incident_helper_counts_by_kind() -> None:
    m = ServiceMetrics("health")
    health_incident(m, "xid")
    health_incident(m, "xid")
    health_incident(m, "straggler", 3)
    assert _value(m, "ff_health_incidents_total", kind="xid") == 2
    assert _value(m, "ff_health_incidents_total", kind="straggler") == 3


def test_scrape_hook_failure_does_not_break_the_scrape() -> None:
    m = ServiceMetrics("sched")
    g = m.gauge("queue", "q")
    m.on_scrape(lambda: 1 / 0)
    m.on_scrape(lambda: g.set(7))
    assert _value(m, "ff_queue") == 7


async def test_http_endpoint_runs_hooks_on_the_loop_thread() -> None:
    m = ServiceMetrics("node", "node-0")
    loop = asyncio.get_running_loop()
    m.bind_loop(loop)
    seen: list[threading.Thread] = []
    running = m.gauge("node_running_tasks", "tasks running")
    state = {"n": 0}

    def hook() -> None:
        seen.append(threading.current_thread())
        running.set(state["n"])

    m.on_scrape(hook)
    address = m.serve("127.0.0.1", 0)
    try:
        assert address.startswith("127.0.0.1:") and m.url == f"http://{address}/metrics"

        def get() -> str:
            with urllib.request.urlopen(m.url, timeout=5) as r:
                return r.read().decode()

        state["n"] = 3
        text = await asyncio.to_thread(get)
        assert _samples(text)[("ff_node_running_tasks", (("service", "node"),))] == 3
        assert seen == [threading.current_thread()]  # the loop's thread, not the HTTP server's
        state["n"] = 1
        text = await asyncio.to_thread(get)
        assert _samples(text)[("ff_node_running_tasks", (("service", "node"),))] == 1
    finally:
        await asyncio.to_thread(m.close)
    m.close()  # idempotent
