"""Every service's Prometheus endpoint on an ``ff up`` cluster (issue 53.4).

One instance of each service plus the echo service; ``ff up`` gives each a metrics port and
records it in cluster.json (``ff metrics`` lists them).  After a file is put through 3FS and
a task is submitted, every endpoint is scraped over HTTP and parsed with
prometheus_client's parser: each has the gRPC request metrics of the calls it served and
its own domain metrics with plausible values.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.sched.client import SchedClient
from fireflyer.testing.cluster import LocalCluster, run_ff, started_cluster
from fireflyer.testing.poll import wait_until

pytestmark = [pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc"),
              pytest.mark.timeout(120)]

CLUSTER_TOML = """
[cluster]
ready_timeout_s = 60.0
stop_timeout_s = 5.0

[nats]
port = 0

[[service]]
name = "mgmtd"
module = "services.mgmtd"
env = { FF_MGMTD_SCAN_INTERVAL_S = "1", FF_GRACE_S = "1" }

[[service]]
name = "meta"
module = "services.meta"
env = { FF_META_ROOT_STRIPE_SIZE = "1", FF_GRACE_S = "1" }

[[service]]
name = "storage"
module = "services.storage"
env = { FF_STORAGE_TARGET_COUNT = "1", FF_STORAGE_FSYNC = "false", FF_STORAGE_HEARTBEAT_INTERVAL_S = "1", FF_STORAGE_ROUTING_PULL_S = "1", FF_STORAGE_INIT_CHAINS = "nodes=1,replicas=1,table=1", FF_GRACE_S = "1" }

[[service]]
name = "coord"
module = "services.coord"

[[service]]
name = "checkpoint"
module = "services.checkpoint"
env = { FF_GRACE_S = "1" }

[[service]]
name = "scheduler"
module = "services.scheduler"
env = { FF_SCHEDULER_TICK_S = "0.2", FF_GRACE_S = "1" }

[[service]]
name = "node"
module = "services.node"
env = { FF_GRACE_S = "1" }

[[service]]
name = "echo"
module = "fireflyer.testing.echo"
"""

SERVICES = ("mgmtd", "meta", "storage", "coord", "checkpoint", "scheduler", "node", "echo")


def _scrape(url: str) -> dict[str, Any]:
    """name -> family, from GET ``url`` parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fams: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    """The sum of ``sample``'s values whose labels include ``labels``."""
    f = fams.get(family)
    assert f is not None, f"no family {family}; have {sorted(fams)}"
    return sum(s.value for s in f.samples if s.name == sample and labels.items() <= s.labels.items())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(CLUSTER_TOML, tmp_path_factory.mktemp("metrics") / "state") as c:
        yield c


def test_every_service_serves_request_and_domain_metrics(cluster: LocalCluster, tmp_path: Path) -> None:
    # ff metrics lists one URL per process, the ones cluster.json records
    res = run_ff(["metrics", "--state-dir", str(cluster.state_dir), "--json"])
    assert res.returncode == 0, res.stdout + res.stderr
    urls = {p["name"]: p["url"] for p in json.loads(res.stdout)["processes"]}
    assert sorted(urls) == sorted(SERVICES)
    for p in cluster.record.processes:
        assert p.metrics and urls[p.name] == f"http://{p.metrics}/metrics"
        assert p.metrics.split(":")[0] == p.address.split(":")[0]  # the gRPC server's host

    # some work: a file through meta and storage, a task through the scheduler and a node agent
    cluster.wait_chains_serving(1, timeout_s=40)
    src = tmp_path / "data.bin"
    src.write_bytes(bytes(range(256)) * 1024)
    put = run_ff(["fs", "put", str(src), "/metrics.bin", "--state-dir", str(cluster.state_dir), "--role", "admin"],
                 env={"FF_TOKEN": "", "FF_META_ADDR": ""})
    assert put.returncode == 0, put.stdout + put.stderr

    async def submit() -> int:
        async with SchedClient(cluster.addresses("scheduler"), token=cluster.user_token) as s:
            await _until_async(lambda: s.nodes(), "the node agent registered")
            chain = await s.submit(pb.TaskSpec(name="m", nodes=1, priority="LOW",
                                               command=[sys.executable, "-c", "import time; time.sleep(1)"]))
            return int(chain.chain_id)
    assert asyncio.run(submit()) > 0

    scraped = {name: _scrape(url) for name, url in urls.items()}
    for name, fams in scraped.items():
        # every service answered gRPC health checks (ff up's readiness probe) and says who it is
        assert _value(fams, "ff_rpc_server_requests", "ff_rpc_server_requests_total",
                      method="grpc.health.v1.Health/Check", code="OK", service=name) >= 1, name
        assert _value(fams, "ff_service_info", "ff_service_info", service=name) == 1
        assert "ff_rpc_server_duration_seconds" in fams and "ff_rpc_server_inflight" in fams
        assert _value(fams, "ff_process_resident_memory_bytes", "ff_process_resident_memory_bytes") > 1e6

    # the file went through meta (create, layout) and storage (its bytes)
    meta_ok = sum(s.value for s in scraped["meta"]["ff_rpc_server_requests"].samples
                  if s.name.endswith("_total") and s.labels["method"].startswith("ff.meta.") and s.labels["code"] == "OK")
    assert meta_ok >= 2
    assert _value(scraped["storage"], "ff_storage_write_bytes", "ff_storage_write_bytes_total") >= src.stat().st_size
    assert _value(scraped["storage"], "ff_storage_targets", "ff_storage_targets", state="serving") == 1

    # the scheduler took the submit and, as the leader, reports its one node
    assert _value(scraped["scheduler"], "ff_rpc_server_requests", "ff_rpc_server_requests_total",
                  method="ff.scheduler.v1.TaskService/Create", code="OK") == 1
    assert _value(scraped["scheduler"], "ff_scheduler_leader", "ff_scheduler_leader") == 1
    wait_until(lambda: _value(_scrape(urls["scheduler"]), "ff_scheduler_nodes", "ff_scheduler_nodes") == 1,
               timeout_s=10, what="the leader reports its node")
    assert "ff_scheduler_pending_tasks" in scraped["scheduler"]
    # the node agent runs the task (or has run it: then it is kept as succeeded)
    wait_until(lambda: _value(_scrape(urls["node"]), "ff_node_tasks", "ff_node_tasks") == 1,
               timeout_s=20, what="the node agent reports the task")
    assert "ff_node_running_tasks" in scraped["node"]
    # no collective and no checkpoint ran: their metrics are there, at zero
    assert "ff_hfreduce_bytes" in scraped["coord"] and "ff_hfreduce_op_duration_seconds" in scraped["coord"]
    assert _value(scraped["checkpoint"], "ff_checkpoint_saves", "ff_checkpoint_saves_total") == 0
    assert "ff_checkpoint_save_duration_seconds" in scraped["checkpoint"]

    # ff metrics --scrape fetches every endpoint
    res = run_ff(["metrics", "--state-dir", str(cluster.state_dir), "--scrape"])
    assert res.returncode == 0 and res.stdout.count(" samples") == len(SERVICES), res.stdout + res.stderr


async def _until_async(fn: Any, what: str, timeout_s: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            got = await fn()
        except Exception:  # noqa: BLE001 -- the scheduler elects its leader shortly after ff up
            got = None
        if got:
            return got
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.2)
