"""``ff echo TEXT``: call the diagnostic echo service of a local cluster.

It checks the whole control path in one command: the token (auth), the gRPC
channel, tracing (the reply carries the trace id) and, with ``--publish``, a
NATS event that every echo instance handles inside the same trace.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from fireflyer.cluster.discovery import NO_CLUSTER_HELP
from fireflyer.core.errors import NoClusterFound, NotFound

__all__ = ["register", "resolve_target", "call_echo"]


def resolve_target(state_dir: Path | str | None, *, address: str | None, token: str | None,
                   role: str) -> tuple[str, str]:
    """(address, token): explicit values win, then FF_TOKEN, then the cluster's records (the state
    dir is ``state_dir``, else FF_STATE_DIR, else .ff; see ``fireflyer.cluster.discovery``)."""
    from fireflyer.cluster.discovery import find_cluster, state_dir_of
    from fireflyer.cluster.records import StatePaths, read_record

    paths = StatePaths(state_dir_of(state_dir))
    if address is None:
        record = read_record(paths)
        if record is None:
            raise NoClusterFound(f"no Fire-Flyer cluster found (no {paths.record}): {NO_CLUSTER_HELP}",
                                 missing="echo", state_dir=str(paths.root))
        echo = next((p for p in record.processes if p.name == "echo"), None)
        if echo is None:
            raise NotFound(f"the cluster under {paths.root} runs no echo service", state_dir=str(paths.root))
        address = echo.address
    c = find_cluster(paths.root, token=token, role=role, need=("token",))
    assert c.token is not None
    return address, c.token


async def call_echo(address: str, token: str, text: str, *, publish: str = "", sleep_s: float = 0.0,
                    timeout_s: float = 10.0) -> Any:
    from fireflyer.api.echo.v1 import echo_pb2, echo_pb2_grpc
    from fireflyer.rpc import connect

    async with connect(address, token=token) as channel:
        stub = echo_pb2_grpc.EchoServiceStub(channel)
        return await stub.Echo(echo_pb2.EchoRequest(text=text, sleep_s=sleep_s, publish_subject=publish),
                               timeout=timeout_s)


def _cmd(ns: argparse.Namespace) -> int:
    from fireflyer.cli.cluster_cmds import resolve_state_dir
    from fireflyer.cluster.records import StatePaths
    from fireflyer.core.config import TelemetrySettings
    from fireflyer.telemetry import setup_tracing, shutdown_tracing, tracer

    state_dir = resolve_state_dir(ns.state_dir)
    address, token = resolve_target(state_dir, address=ns.address, token=ns.token, role=ns.role)
    publish = ""
    if ns.publish:
        from fireflyer.testing.echo import published_subject

        publish = published_subject(ns.publish)
    # the CLI is a traced process too: its span is the root of the call's trace
    spans = StatePaths(state_dir).spans
    if spans.parent.is_dir():
        setup_tracing("ff", f"ff-echo:{os.getpid()}", state_dir=state_dir,
                      settings=TelemetrySettings(span_file=str(spans)), batch=False)

    async def run() -> Any:
        with tracer(__name__).start_as_current_span("ff echo"):
            return await call_echo(address, token, ns.text, publish=publish, sleep_s=ns.sleep)

    try:
        reply = asyncio.run(run())
    finally:
        shutdown_tracing()
    print(f"{reply.text}  (user={reply.user} roles={','.join(reply.roles)} trace={reply.trace_id or '-'})")
    return 0


def register(subparsers: Any) -> None:
    from fireflyer.cli.options import add_cluster_options

    p = subparsers.add_parser("echo", help="call the diagnostic echo service (auth, tracing, NATS)")
    p.add_argument("text")
    add_cluster_options(p, address_help="host:port of an echo service (default: from cluster.json)", role="user")
    p.add_argument("--publish", metavar="ID", default="", help="also publish an event on ff.echo.v1.echo.ID.published")
    p.add_argument("--sleep", type=float, default=0.0, metavar="S", help="the service waits S seconds first")
    p.set_defaults(func=_cmd)
