"""The dashboard in headless Chromium (docs/dashboard.md): log in with a token, every page loads, a
submitted task is on the tasks page, its trace opens as a waterfall with one row per span, and
another user's token sees neither the task nor the trace.  Screenshot: docs/img/dashboard.png.

Needs chromium and chromedriver (Debian: ``apt-get install chromium chromium-driver``; ``make
setup`` installs them).  Under CI a missing browser fails the test instead of skipping it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.cli.ui import dashboard_urls
from fireflyer.sched.client import SchedClient
from fireflyer.testing.cluster import REPO_ROOT, LocalCluster, run_ff, started_cluster

pytestmark = pytest.mark.timeout(150)

CLUSTER_TOML = """
[cluster]
ready_timeout_s = 40.0
stop_timeout_s = 5.0

[nats]
port = 0

[[service]]
name = "scheduler"
module = "services.scheduler"
replicas = 1
env = { FF_SCHEDULER_TICK_S = "0.2", FF_GRACE_S = "1" }

[[service]]
name = "node"
module = "services.node"
replicas = 1
env = { FF_AGENT_ZONES = "A", FF_GRACE_S = "1" }

[[service]]
name = "dashboard"
module = "services.dashboard"
http = true
env = { FF_GRACE_S = "1" }
"""


def _browser() -> Any:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        msg = "chromium and chromedriver are needed: apt-get install -y chromium chromium-driver (make setup does)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,900"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def _poll(check: Any, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what} (last: {last!r})")


def _sched(cluster: LocalCluster, token: str, fn: Any) -> Any:
    async def go() -> Any:
        async with SchedClient(cluster.addresses("scheduler"), token=token) as c:
            return await fn(c)
    return asyncio.run(go())


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with started_cluster(CLUSTER_TOML, tmp_path / "state", env={"OTEL_BSP_SCHEDULE_DELAY": "200"}) as c:
        yield c


def test_dashboard_pages_tasks_and_trace_waterfall_per_user(cluster: LocalCluster, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser = _browser()
    try:
        [url] = dashboard_urls(cluster.state_dir)
        res = run_ff(["ui", "--state-dir", str(cluster.state_dir)])
        assert res.returncode == 0 and res.stdout.strip() == url, res
        user = cluster.user_token
        _poll(lambda: _sched(cluster, user, lambda c: c.nodes()), "the node agent registered", 30)
        chain = _sched(cluster, user, lambda c: c.submit(pb.TaskSpec(
            name="dash<b>", nodes=1, command=[sys.executable, "-c", "print('hello <from> the rank')"])))
        task = int(chain.chain_id)
        _poll(lambda: _sched(cluster, user, lambda c: c.get(task)).runs[-1].slurm_state == "COMPLETED",
              "the task completes", 30)

        def login(token: str) -> None:
            browser.get(url + "login")
            browser.find_element(By.ID, "token").send_keys(token)
            browser.find_element(By.ID, "login").click()
            _poll(lambda: browser.current_url.endswith("/tasks") or "not valid" in browser.page_source,
                  "the login's answer", 10)

        # not logged in: every page sends you to the login form; a wrong token is refused
        browser.get(url + "tasks")
        assert browser.current_url.endswith("/login")
        login("not-a-token")
        assert "not valid" in browser.page_source
        login(user)
        for path, title in [("", "cluster"), ("nodes", "nodes"), ("tasks", "tasks"), ("checkpoints", "checkpoints"),
                            ("incidents", "incidents"), ("traces", "traces")]:
            browser.get(url + path)
            assert browser.find_element(By.TAG_NAME, "h2").text == title, browser.page_source
        browser.get(url)
        assert "SERVING" in browser.page_source and "dashboard-0" in browser.page_source
        browser.get(url + "nodes")
        assert "node0" in browser.page_source

        browser.get(url + "tasks")
        links = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "a.task")]
        assert str(task) in links
        assert "dash<b>" in browser.find_element(By.TAG_NAME, "table").text  # escaped, shown as text
        browser.find_element(By.LINK_TEXT, str(task)).click()
        _poll(lambda: "hello <from> the rank" in browser.find_element(By.ID, "log").text or browser.refresh(),
              "the rank's log on the task page", 10)

        # the task's trace: scheduler, agent and rank spans, one row each (spans arrive in batches)
        def trace_link() -> Any:
            browser.refresh()
            found = browser.find_elements(By.ID, "trace-link")
            return found[0].get_attribute("href") if found else None
        trace_url = _poll(trace_link, "a trace link on the task page", 15)

        def waterfall() -> Any:
            browser.get(trace_url)
            rows = browser.find_elements(By.CSS_SELECTOR, "#waterfall tr.span")
            names = [r.find_element(By.TAG_NAME, "td").text for r in rows]
            return rows if {"task.submit", "scheduler.start_rank", "node.start_rank"} <= set(names) else None
        rows = _poll(waterfall, "the waterfall with the scheduler's and the agent's spans", 15)
        assert len(rows) == len({r.get_attribute("data-span-id") for r in rows})
        assert all(r.find_elements(By.CSS_SELECTOR, ".wf .bar") for r in rows)
        (REPO_ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(REPO_ROOT / "docs" / "img" / "dashboard.png"))
        trace_id = trace_url.rsplit("/", 1)[1]

        # another user: sees neither the task nor its trace
        res = run_ff(["admin", "users", "add", "mallory", "--json"], env={"FF_STATE_DIR": str(cluster.state_dir)})
        assert res.returncode == 0, res
        other = json.loads(res.stdout)["token"]
        browser.delete_all_cookies()
        _poll(lambda: (login(other), browser.get_cookie("ff_token"))[1],
              "the new user's token is accepted (the tokens file is re-read)", 10)
        def tasks_page() -> bool:  # the scheduler re-reads the tokens file about once a second
            browser.get(url + "tasks")
            return browser.find_element(By.TAG_NAME, "h2").text == "tasks"
        _poll(tasks_page, "the tasks page for the new user", 10)
        assert str(task) not in [a.text for a in browser.find_elements(By.CSS_SELECTOR, "a.task")]
        browser.get(url + f"tasks/{task}")
        assert "hello" not in browser.page_source
        browser.get(url + f"traces/{trace_id}")
        assert not browser.find_elements(By.CSS_SELECTOR, "#waterfall tr.span")
        browser.get(url + "traces")
        assert trace_id[:16] not in browser.page_source
    finally:
        browser.quit()
