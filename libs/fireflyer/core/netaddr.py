"""``host:port`` strings: splitting them, and the address a client should dial for a bind.

Every listener in the system (gRPC servers, wire servers, storage data planes) reports the
address it is reachable at, and every client splits the addresses it is given; one place
does both so an IPv6 literal or a wildcard bind is handled the same way everywhere.
"""

from __future__ import annotations

from fireflyer.core.errors import InvalidArgument

__all__ = ["split_address", "dial_address"]

#: wildcard binds and where a process on the same host reaches them.  An IPv6 wildcard may
#: listen IPv6-only (asyncio sets IPV6_V6ONLY), so it is dialled on ::1, not 127.0.0.1.
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host without brackets, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"address {address!r} is not host:port", address=address)
    return host.strip("[]"), int(port)


def dial_address(bind_host: str, port: int) -> str:
    """The ``host:port`` clients should dial for a listener bound on ``bind_host``."""
    host = _WILDCARDS.get(bind_host, bind_host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"
