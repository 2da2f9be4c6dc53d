"""Splitting host:port strings and the dial address of a bind."""

from __future__ import annotations

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.core.netaddr import dial_address, split_address


@pytest.mark.parametrize(("address", "expected"), [
    ("127.0.0.1:7000", ("127.0.0.1", 7000)),
    ("meta-0.local:1", ("meta-0.local", 1)),
    ("[::1]:9000", ("::1", 9000)),
    ("[fe80::1]:65535", ("fe80::1", 65535)),
])
def test_split_address(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


@pytest.mark.parametrize("bad", ["", "host", "host:", ":80", "host:http", "host:0", "host:65536", "host:-1"])
def test_split_address_refuses_what_is_not_host_port(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="not host:port"):
        split_address(bad)


@pytest.mark.parametrize(("host", "expected"), [
    ("10.1.2.3", "10.1.2.3:80"),
    ("0.0.0.0", "127.0.0.1:80"),  # wildcard binds are dialled on loopback
    ("", "127.0.0.1:80"),
    ("::", "[::1]:80"),  # an IPv6 wildcard may be IPv6-only
    ("[::]", "[::1]:80"),
    ("::1", "[::1]:80"),
    ("[::1]", "[::1]:80"),
])
def test_dial_address(host: str, expected: str) -> None:
    assert dial_address(host, 80) == expected
    assert split_address(dial_address(host, 80))[1] == 80
