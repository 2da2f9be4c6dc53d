"""Start services for tests: in-process (fast) or as real processes.

As a process (signals, exit codes, its own tracer)::

    svc = ServiceProcess("fireflyer.testing.echo", state_dir=tmp, nats_url=url,
                         tokens_file=tokens, instance="echo-0").start()
    await svc.wait_healthy()

In-process::

    async with running_service(EchoService(settings)) as ctx:
        channel = connect(ctx.server.address, token=admin)

The service runs on the test's event loop with the same runtime as in
production (``fireflyer.core.runtime.serve``) but without signal handlers;
leaving the block stops it the way SIGTERM would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from fireflyer.core.errors import DeadlineExceeded
from fireflyer.core.runtime import Service, ServiceContext, serve
from fireflyer.testing.poll import wait_for

__all__ = ["running_service", "ServiceProcess", "started_processes"]

#: every ServiceProcess started in this process and not yet collected (for failure reports)
_STARTED: weakref.WeakSet[ServiceProcess] = weakref.WeakSet()


def started_processes() -> list[ServiceProcess]:
    """The ServiceProcesses this process has started that are still referenced, oldest first."""
    return sorted(_STARTED, key=lambda p: p.started_at)


@contextlib.asynccontextmanager
async def running_service(service: Service, *, start_timeout_s: float = 15.0) -> AsyncIterator[ServiceContext]:
    stop = asyncio.Event()
    ready: asyncio.Future[ServiceContext] = asyncio.get_running_loop().create_future()

    def on_ready(ctx: ServiceContext) -> None:
        if not ready.done():
            ready.set_result(ctx)

    task = asyncio.create_task(serve(service, stop=stop, ready=on_ready, install_signals=False),
                               name=f"service:{service.name}")
    done, _ = await asyncio.wait({task, ready}, timeout=start_timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises the start-up error
        raise RuntimeError(f"service {service.name} returned before it was ready")
    if not done:
        stop.set()
        task.cancel()
        raise DeadlineExceeded(f"service {service.name} not ready within {start_timeout_s}s", service=service.name)
    try:
        yield ready.result()
    finally:
        stop.set()
        await task


class ServiceProcess:
    """A service as a real child process (``python -m module``) on a free port.

    For tests that need what only a process has: signals, exit codes, a
    separate tracer provider.  ``env`` adds to the FF_* environment built from
    the arguments; the log goes to ``<state_dir>/logs/<instance>.log``.
    """

    def __init__(self, module: str, *, state_dir: Path, nats_url: str, tokens_file: Path | None,
                 instance: str, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> None:
        from fireflyer.cluster.procs import free_ports

        self.module = module
        self.instance = instance
        self.state_dir = Path(state_dir)
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = self.state_dir / "logs" / f"{instance}.log"
        self.env = {
            **os.environ,
            "FF_STATE_DIR": str(self.state_dir),
            "FF_NATS_URL": nats_url,
            "FF_RPC_HOST": "127.0.0.1",
            "FF_RPC_PORT": str(self.port),
            "FF_INSTANCE": instance,
            "FF_TELEMETRY_SPAN_FILE": str(self.state_dir / "spans.jsonl"),
            "PYTHONUNBUFFERED": "1",
            # a native crash (SIGSEGV, SIGABRT) then leaves the Python stacks in the log
            "PYTHONFAULTHANDLER": "1",
        }
        if tokens_file is not None:
            self.env["FF_AUTH_TOKENS_FILE"] = str(tokens_file)
        self.env.update(env or {})
        if module in ("services.meta", "services.storage") and "FF_CAPABILITY_KEY_FILE" not in (env or {}):
            # as ff up: meta and the storage nodes of one state dir share its capability key
            from fireflyer.storage.capability import write_key_file

            key = self.state_dir / "capability.key"
            write_key_file(key)
            self.env["FF_CAPABILITY_KEY_FILE"] = str(key)
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> ServiceProcess:
        from fireflyer.cluster.procs import spawn

        self.proc = spawn([sys.executable, "-m", self.module, *self.args], env=self.env, cwd=Path.cwd(),
                          log_path=self.log_path)
        self.started_at = time.monotonic()
        _STARTED.add(self)
        return self

    #: how often a service that lost its port to another process is restarted on a fresh one
    PORT_RETRIES = 3

    async def wait_healthy(self, timeout_s: float = 20.0) -> None:
        """Wait until the service answers health checks as SERVING.

        The port was free when it was picked, but another process can bind it before the service
        does (``free_ports``); a service that exits because of that is started again on a fresh
        port (``address`` changes), up to :attr:`PORT_RETRIES` times.
        """
        from fireflyer.core.errors import Unavailable
        from fireflyer.rpc import check_health

        retries = [self.PORT_RETRIES]

        async def serving() -> bool:
            if self.returncode is not None:
                if retries[0] > 0 and self._lost_its_port():
                    retries[0] -= 1
                    self._restart_on_a_fresh_port()
                    return False
                raise RuntimeError(f"{self.instance} exited with {self.returncode} during start:\n{self.log()}")
            try:
                return await check_health(self.address, timeout_s=1.0) == "SERVING"
            except Unavailable:
                return False

        await wait_for(serving, timeout_s=timeout_s, interval_s=0.05, what=f"{self.instance} serving")

    def _lost_its_port(self) -> bool:
        return self.env.get("FF_RPC_PORT") == str(self.port) and f"cannot listen on 127.0.0.1:{self.port}" in self.log()

    def _restart_on_a_fresh_port(self) -> None:
        from fireflyer.cluster.procs import free_ports

        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        self.env["FF_RPC_PORT"] = str(self.port)
        self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def state(self) -> str:
        """"running", "not started", or how it ended ("exited with -9 (SIGKILL)"): a log that
        stops short says nothing of a death by signal, the exit status does."""
        code = self.returncode
        if self.proc is None:
            return "not started"
        if code is None:
            return "running"
        if code < 0:
            try:
                return f"exited with {code} ({signal.Signals(-code).name})"
            except ValueError:
                pass
        return f"exited with {code}"

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=timeout_s)
