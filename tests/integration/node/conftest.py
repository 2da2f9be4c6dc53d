"""Fixtures for the node agent's integration tests: a real NATS, tokens, agents as processes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from fireflyer.bus.server import NatsServerProcess
from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file
from fireflyer.testing.nats import start_nats_server
from fireflyer.testing.services import ServiceProcess

HERE = Path(__file__).resolve().parent
PROG = str(HERE / "rank_prog.py")
#: a stand-in HFReduce worker: prints the ready line and stays (the real one needs its peers)
FAKE_WORKER = f"{sys.executable} -c 'import time; print(\"hfreduce worker ready\", flush=True); time.sleep(600)'"
FAST = {"FF_AGENT_HEARTBEAT_INTERVAL_S": "0.2", "FF_AGENT_POLL_INTERVAL_S": "0.05", "FF_AGENT_RESTART_BASE_S": "0.1",
        "FF_AGENT_WORKER_COMMAND": FAKE_WORKER, "FF_AGENT_ZONES": "A,A,B", "FF_AGENT_GPUS": "8",
        "FF_SCHED_ADDR": "127.0.0.1:1", "FF_LOG_FORMAT": "json"}


class Tokens(msgspec.Struct, frozen=True):
    path: Path
    service: str
    admin: str
    alice: str
    bob: str


def make_tokens(d: Path) -> Tokens:
    t = Tokens(d / "tokens.json", generate_token(), generate_token(), generate_token(), generate_token())
    write_tokens_file(t.path, [TokenEntry(token=t.service, user="svc-node", roles=["service"]),
                               TokenEntry(token=t.admin, user="root", roles=["admin"]),
                               TokenEntry(token=t.alice, user="alice", roles=["user"]),
                               TokenEntry(token=t.bob, user="bob", roles=["user"])])
    return t


def make_agent(state: Path, nats: NatsServerProcess, tokens: Tokens, instance: str = "node-1",
               **env: str) -> ServiceProcess:
    libs = str(HERE.parents[2] / "libs")
    penv = {**FAST, "FF_TOKEN": tokens.service,
            "PYTHONPATH": os.pathsep.join([libs, str(HERE.parents[2]), os.environ.get("PYTHONPATH", "")]), **env}
    return ServiceProcess("services.node", state_dir=state, nats_url=nats.url, tokens_file=tokens.path,
                          instance=instance, env=penv)


def start(svc: ServiceProcess) -> ServiceProcess:
    svc.start()
    asyncio.run(svc.wait_healthy())
    return svc


async def astart(svc: ServiceProcess) -> ServiceProcess:
    svc.start()
    await svc.wait_healthy()
    return svc


@pytest.fixture(scope="module")
def nats_mod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServerProcess]:
    srv = start_nats_server(tmp_path_factory.mktemp("nats"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return make_tokens(tmp_path_factory.mktemp("tokens"))


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, nats_mod: NatsServerProcess,
          tokens: Tokens) -> Iterator[ServiceProcess]:
    """One agent (node1, zone A, 127.0.0.2) shared by the tests of a module; each uses its own task ids."""
    svc = start(make_agent(tmp_path_factory.mktemp("agent"), nats_mod, tokens))
    yield svc
    svc.stop()
