"""A data-plane server process killed with SIGKILL: outstanding requests fail with Unavailable.

The server runs in a real child process, so the kernel tears its sockets down the way a crash
does (no goodbye frame, no orderly shutdown in our code).
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from fireflyer.core.errors import Unavailable
from fireflyer.testing.poll import wait_until
from fireflyer.wire import Connection

SERVER = textwrap.dedent(
    """
    import sys, threading
    from fireflyer.wire import WireServer

    def handle(req):
        data = req.recv_payload()
        if req.op == "hang":
            threading.Event().wait()   # never answers
        req.reply(data)

    server = WireServer(handle, authenticate=lambda t: "svc" if t == "tok" else None)
    print(server.start(), flush=True)
    sys.stdin.read()                    # lives until killed or its stdin closes
    """
)


@pytest.fixture
def server_process():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"server did not start: {line!r}"
        yield proc, int(line)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_sigkill_fails_outstanding_requests_with_unavailable(server_process):
    proc, port = server_process
    conn = Connection.connect("127.0.0.1", port, token="tok", timeout_s=10)
    try:
        assert bytes(conn.request("echo", b"alive", timeout_s=10).payload) == b"alive"
        pending = [conn.submit("hang", b"x" * 1000, timeout_s=30)]
        # more requests from other threads queue up behind the hanging one
        more: list = []
        threads = [threading.Thread(target=lambda: more.append(conn.submit("echo", b"y" * 100_000, timeout_s=30)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        wait_until(lambda: conn.outstanding() == 4, timeout_s=10, what="4 requests outstanding")

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

        for p in pending + more:
            with pytest.raises(Unavailable) as ei:
                p.result(timeout_s=10)
            assert ei.value.peer == f"127.0.0.1:{port}" and f"127.0.0.1:{port}" in str(ei.value)
        with pytest.raises(Unavailable):
            conn.request("echo", b"after")
    finally:
        conn.close()


def test_reconnecting_after_a_restart_works(server_process):
    proc, port = server_process
    with Connection.connect("127.0.0.1", port, token="tok", timeout_s=10) as conn:
        big = os.urandom(3 << 20)
        assert bytes(conn.request("echo", big, checksum=True, timeout_s=30).payload) == big
