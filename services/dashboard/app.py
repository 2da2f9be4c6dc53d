"""The Fire-Flyer web dashboard: server-rendered pages over the cluster's services (docs/dashboard.md).

    python -m services.dashboard     # under ff up: FF_HTTP_HOST / FF_HTTP_PORT, recorded in cluster.json

It runs on the standard service runtime (gRPC health on FF_RPC_PORT, so ``ff up`` waits for it like
any service) plus an HTTP server (:mod:`.http`).  A user logs in with a bearer token, kept in an
HttpOnly cookie; every backend call is made *with that token*, so the owner rules are the services'
own: a user sees their own tasks and checkpoints, an admin all.  The token is checked against the
cluster's tokens file (``FF_AUTH_TOKENS_FILE``) at login and on every request.

Pages: cluster (cluster.json's processes and their gRPC health), nodes (the scheduler's view, plus
the health service's if one runs), tasks (chains, runs, ranks; a task page with a log tail through
the scheduler's StreamLogs and a link to its trace), checkpoints, incidents (health service,
optional), traces (from the span file; a user sees the traces of their own task submissions).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import quote

import msgspec

from fireflyer.cluster.records import StatePaths, read_record
from fireflyer.core.config import ServiceSettings
from fireflyer.core.errors import FireFlyerError
from fireflyer.core.runtime import Service, ServiceContext, run_service
from fireflyer.rpc.auth import Principal, TokenStore
from fireflyer.telemetry import read_spans
from fireflyer.telemetry.traces import find_trace, group_traces, recent_traces, waterfall

from . import views
from .http import Request, Response, esc, serve_http

__all__ = ["DashboardService", "Dashboard", "main", "COOKIE"]

COOKIE = "ff_token"
#: how much of a rank's log the task page shows
LOG_TAIL_BYTES = 16 * 1024


class HttpSection(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    #: 0: a free port (ff up sets FF_HTTP_PORT)
    port: int = 0


class DashboardSettings(ServiceSettings, frozen=True, kw_only=True):
    http: HttpSection = msgspec.field(default_factory=HttpSection)


class Dashboard:
    """Request handling: the routes, each reading the services with the caller's token."""

    def __init__(self, *, state_dir: str, tokens_file: str, span_file: str, sched_addrs: list[str],
                 ckpt_addr: str, health_addr: str) -> None:
        self.paths = StatePaths(state_dir)
        self.tokens = TokenStore.watch(tokens_file) if tokens_file else None
        self.span_file = span_file
        self.sched_addrs = sched_addrs
        self.ckpt_addr = ckpt_addr
        self.health_addr = health_addr

    # -- auth ------------------------------------------------------------------------------------
    def who(self, req: Request) -> tuple[str, Principal] | None:
        token = req.cookies.get(COOKIE, "")
        if not token or self.tokens is None:
            return None
        p = self.tokens.lookup(token)
        return (token, p) if p is not None else None

    async def handle(self, req: Request) -> Response:
        if req.path == "/login":
            return await self.login(req)
        if req.path == "/logout" and req.method == "POST":
            return Response.redirect("/login", cookie=f"{COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict")
        session = self.who(req)
        if session is None:
            return Response.redirect("/login")
        token, p = session
        routes = {"/": self.cluster_page, "/nodes": self.nodes_page, "/tasks": self.tasks_page,
                  "/checkpoints": self.ckpt_page, "/incidents": self.incidents_page, "/traces": self.traces_page}
        try:
            if req.path in routes:
                title, body = await routes[req.path](req, token, p)
            elif req.path.startswith("/tasks/"):
                title, body = await self.task_page(req.path.removeprefix("/tasks/"), req, token, p)
            elif req.path.startswith("/traces/"):
                title, body = await self.trace_page(req.path.removeprefix("/traces/"), token, p)
            else:
                return Response(status=404, body=views.page("not found", "<p>no such page</p>", user=p.user))
        except FireFlyerError as e:  # a service refused or is down: say so on the page
            return Response(status=502, body=views.page("error", f"<p class='bad' id='error'>{esc(e)}</p>",
                                                        user=p.user))
        return Response(body=views.page(title, body, user=p.user))

    async def login(self, req: Request) -> Response:
        if req.method != "POST":
            return Response(body=views.login_page())
        token = req.form.get("token", "").strip()
        if not token or self.tokens is None or self.tokens.lookup(token) is None:
            return Response(status=401, body=views.login_page("that token is not valid here"))
        return Response.redirect("/tasks", cookie=f"{COOKIE}={quote(token)}; Path=/; HttpOnly; SameSite=Strict")

    # -- pages -----------------------------------------------------------------------------------
    async def cluster_page(self, req: Request, token: str, p: Principal) -> tuple[str, str]:
        from fireflyer.rpc.health import check_health

        record = read_record(self.paths)
        if record is None:
            return "cluster", "<p class='bad'>no cluster.json in the state dir</p>"

        async def health(addr: str) -> str:
            try:
                return await check_health(addr, timeout_s=1.0)
            except Exception as e:  # noqa: BLE001 -- shown in the table
                return f"unreachable ({type(e).__name__})"
        states = await asyncio.gather(*(health(x.address) for x in record.processes))
        rows = [(x.name, x.instance, x.address, x.http_address, str(x.pid),
                 f"<span class='{'ok' if s == 'SERVING' else 'bad'}'>{esc(s)}</span>")
                for x, s in zip(record.processes, states, strict=True)]
        rows = [tuple(esc(c) for c in r[:5]) + (r[5],) for r in rows]
        return "cluster", (f"<p>state dir {esc(record.state_dir)} · NATS {esc(record.nats.url)} · started "
                           f"{esc(views.fmt_time(record.started_at))}</p>"
                           + views.table(["service", "instance", "gRPC", "HTTP", "pid", "health"], rows, raw=True))

    async def _sched(self, token: str, fn: Any) -> Any:
        from fireflyer.sched.client import SchedClient

        async with SchedClient(self.sched_addrs, token=token, timeout_s=5.0, leader_wait_s=3.0) as c:
            return await fn(c)

    async def nodes_page(self, req: Request, token: str, p: Principal) -> tuple[str, str]:
        nodes = await self._sched(token, lambda c: c.nodes())
        rows = [(n.name, n.group, n.zone, n.state + (" (lost)" if n.lost else ""), n.reason,
                 str(n.task) if n.task else "", str(n.gpus), views.fmt_time(n.last_seen_at)) for n in nodes]
        body = views.table(["node", "group", "zone", "state", "reason", "task", "gpus", "last seen"], rows)
        body += "<h3>health</h3>" + await self._health_section(token, "ListNodes", "ListNodesRequest")
        return "nodes", body

    async def _health_section(self, token: str, method: str, request: str) -> str:
        """The health service's answer as a table, when that service runs (it is optional)."""
        from fireflyer.api.health.v1 import health_pb2 as hpb
        from fireflyer.api.health.v1 import health_pb2_grpc as hpb_grpc

        if not self.health_addr:
            return "<p class='dim'>no health service in this cluster</p>"
        from google.protobuf.json_format import MessageToDict

        from fireflyer.rpc import connect

        try:
            async with connect(self.health_addr.split(",")[0], token=token) as ch:
                stub = hpb_grpc.HealthServiceStub(ch)
                reply = MessageToDict(await getattr(stub, method)(getattr(hpb, request)(), timeout=5.0))
        except FireFlyerError as e:
            return f"<p class='bad'>health service: {esc(e)}</p>"
        items = next((v for v in reply.values() if isinstance(v, list)), [])
        if not items:
            return "<p class='dim'>none</p>"
        keys = sorted({k for it in items for k in it})
        return views.table(keys, [[_cell(it.get(k, "")) for k in keys] for it in items])

    async def tasks_page(self, req: Request, token: str, p: Principal) -> tuple[str, str]:
        chains = await self._sched(token, lambda c: c.list(include_finished=True, limit=200))
        rows = []
        for ch in chains:
            r = ch.runs[-1] if ch.runs else None
            ranks = " ".join(f"{k.rank}:{k.state}" for k in r.ranks) if r else ""
            rows.append((f"<a class='task' href='/tasks/{ch.chain_id}'>{ch.chain_id}</a>", esc(ch.user), esc(ch.name),
                         esc(r.slurm_state if r else ""), esc(r.priority if r else ""), str(len(ch.runs)),
                         esc(", ".join(r.nodes) if r else ""), esc(ranks),
                         esc(views.fmt_time(r.submitted_at) if r else ""), esc(r.reason if r else "")))
        body = views.table(["task", "user", "name", "state", "priority", "runs", "nodes", "ranks", "submitted",
                            "reason"], rows, raw=True) if rows else "<p class='dim'>no tasks</p>"
        return "tasks", body

    async def task_page(self, ident: str, req: Request, token: str, p: Principal) -> tuple[str, str]:
        if not ident.isdigit():
            return "task", "<p class='bad'>not a task id</p>"
        task = int(ident)
        try:
            ch = await self._sched(token, lambda c: c.get(task))
        except FireFlyerError as e:
            return f"task {task}", f"<p class='bad'>{esc(e)}</p>"
        rows = [(str(r.id), str(r.restart_count), r.slurm_state, r.chain_status, ", ".join(r.nodes),
                 " ".join(f"{k.rank}@{k.node}:{k.state}" + (f"({k.exit_code})" if k.state not in ("running", "created")
                                                           else "") for k in r.ranks),
                 ", ".join(r.stop_reasons), r.reason) for r in ch.runs]
        body = (f"<p>user {esc(ch.user)} · name {esc(ch.name)}</p>"
                + views.table(["run", "restart", "state", "chain status", "nodes", "ranks", "stop", "reason"], rows))
        trace = self._task_trace(task)
        if trace:
            body += f"<p><a id='trace-link' href='/traces/{esc(trace)}'>trace {esc(trace[:16])}</a></p>"
        rank = int(req.query.get("rank", "0")) if req.query.get("rank", "0").isdigit() else 0
        try:
            data = await self._sched(token, lambda c: _collect(c.logs(task, rank)))
            text = data[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
        except FireFlyerError as e:
            text = f"(no log: {e})"
        body += f"<h3>log of rank {rank} (last {LOG_TAIL_BYTES // 1024} KiB)</h3><pre id='log'>{esc(text)}</pre>"
        return f"task {task}", body

    def _spans(self) -> list[Any]:
        return list(read_spans(self.span_file))

    def _task_trace(self, task: int) -> str:
        """The trace of task ``task``'s submission (the scheduler's ``task.submit`` span names it)."""
        for s in self._spans():
            if s.name == "task.submit" and s.attributes.get("ff.task_id") == task:
                return s.trace_id
        return ""

    def _visible(self, spans: list[Any], p: Principal) -> bool:
        """A user sees the traces of their own submissions; an admin every trace."""
        if p.has_role("admin"):
            return True
        return any(s.name == "task.submit" and s.attributes.get("ff.user") == p.user for s in spans)

    async def ckpt_page(self, req: Request, token: str, p: Principal) -> tuple[str, str]:
        if not self.ckpt_addr:
            return "checkpoints", "<p class='dim'>no checkpoint service in this cluster</p>"
        from fireflyer.api.checkpoint.v1 import checkpoint_pb2 as cpb
        from fireflyer.api.checkpoint.v1 import checkpoint_pb2_grpc as cgrpc
        from fireflyer.rpc import connect

        rows = []
        async with connect(self.ckpt_addr.split(",")[0], token=token) as ch:
            stub = cgrpc.CheckpointServiceStub(ch)
            jobs = (await stub.ListJobs(cpb.ListJobsRequest(), timeout=5.0)).jobs
            for job in jobs:
                for c in (await stub.List(cpb.ListRequest(job=job, include_all=True), timeout=5.0)).checkpoints:
                    rows.append((c.job, str(c.step), cpb.CkptState.Name(c.state), f"{c.ranks_committed}/{c.world_size}",
                                 f"{c.nbytes:,}", "yes" if c.pinned else "", views.fmt_time(c.created_at), c.id))
        return "checkpoints", (views.table(["job", "step", "state", "ranks", "bytes", "pinned", "created", "id"], rows)
                               if rows else "<p class='dim'>no checkpoints</p>")

    async def incidents_page(self, req: Request, token: str, p: Principal) -> tuple[str, str]:
        return "incidents", await self._health_section(token, "ListIncidents", "ListIncidentsRequest")

    async def traces_page(self, req: Request, token: str, p: Principal) -> tuple[str, str]:
        groups = group_traces(self._spans())
        visible = [s for t, s in groups.items() if self._visible(s, p)]
        every = req.query.get("all") == "1"
        sums = recent_traces((s for ss in visible for s in ss), limit=100, users_only=not every)
        rows = [(f"<a class='trace' href='/traces/{esc(s.trace_id)}'>{esc(s.trace_id[:16])}</a>", esc(s.root),
                 esc(", ".join(s.services)), str(s.span_count), esc(views.fmt_s(s.duration_s)),
                 esc(views.fmt_time(s.start_ns / 1e9))) for s in sums]
        switch = ("<p><a href='/traces'>only traces people started</a></p>" if every else
                  "<p class='dim'>traces people started (task submissions, ff commands); "
                  "<a href='/traces?all=1'>all traces</a> adds the services' own loops</p>")
        return "traces", switch + (views.table(["trace", "root span", "services", "spans", "duration", "start"], rows,
                                               raw=True) if rows else f"<p class='dim'>no traces in {esc(self.span_file)}</p>")

    async def trace_page(self, trace_id: str, token: str, p: Principal) -> tuple[str, str]:
        spans = find_trace(self._spans(), trace_id)
        if not spans or not self._visible(spans, p):
            return "trace", "<p class='bad'>no such trace (or not yours)</p>"
        return f"trace {spans[0].trace_id[:16]}", views.waterfall_html(waterfall(spans))


def _cell(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, list) else str(v)


async def _collect(chunks: Any) -> bytes:
    return b"".join([c async for c in chunks])


class DashboardService(Service):
    """The dashboard on the service runtime (gRPC health for ff up) with its HTTP server beside it."""

    name = "dashboard"
    settings_type = DashboardSettings
    uses_bus = False

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.server: asyncio.AbstractServer | None = None

    async def start(self, ctx: ServiceContext) -> None:
        s: DashboardSettings = self.settings  # type: ignore[assignment]
        env = os.environ
        state = s.state_dir  # StatePaths makes it absolute
        dash = Dashboard(state_dir=str(state), tokens_file=s.auth.tokens_file or "",
                         span_file=s.telemetry.span_file or str(StatePaths(state).spans),
                         sched_addrs=[a for a in env.get("FF_SCHED_ADDR", "").split(",") if a],
                         ckpt_addr=env.get("FF_CKPT_ADDR", ""), health_addr=env.get("FF_HEALTH_ADDR", ""))
        host = env.get("FF_HTTP_HOST") or s.http.host
        port = int(env.get("FF_HTTP_PORT") or s.http.port)
        self.server = await serve_http(dash.handle, host, port,
                                       on_error=lambda e: ctx.log.warning("dashboard.page_failed", error=repr(e)))
        bound = self.server.sockets[0].getsockname()
        ctx.log.info("dashboard.serving", url=f"http://{bound[0]}:{bound[1]}/")

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    return run_service(DashboardService, argv)



