"""The framed TCP data plane (DESIGN.md §1), shared by 3FS storage I/O and HFReduce transfers.

    server = WireServer(handler, authenticate=lambda token: users.get(token))
    port = server.start()
    with Connection.connect("127.0.0.1", port, token=token) as conn:
        reply = conn.request("read", meta={"chunk": 7}, into=buffer)

A frame is a 20-byte prefix (magic, version, sizes), a msgpack header (tagged msgspec Structs:
hello / welcome / req / resp / error) and a raw payload sent with ``sendmsg`` and received with
``recv_into`` straight into the caller's buffer.  Modules:

- :mod:`.frame`  pure encode/parse of prefix and header, limits (no I/O);
- :mod:`.conn`   one framed blocking socket: zero-copy send/receive, kernel-side I/O timeouts;
- :mod:`.server` :class:`WireServer` (thread per connection, auth on connect, handler API);
- :mod:`.client` :class:`Connection` (many requests in flight, matched by request id);
- :mod:`.bench`  ``ff bench wire``: throughput against raw sockets measured in the same run.
"""

from .client import Connection, PendingRequest, Reply, connect
from .conn import FileRegion
from .frame import FrameLimits
from .server import Authenticate, Handler, ServerRequest, WireServer

__all__ = [
    "Connection",
    "PendingRequest",
    "Reply",
    "connect",
    "FrameLimits",
    "FileRegion",
    "WireServer",
    "ServerRequest",
    "Handler",
    "Authenticate",
]
