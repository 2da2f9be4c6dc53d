"""The client's per-I/O read check: CRC in transit, buffer bounds, bytes vs views."""

from __future__ import annotations

import os

from fireflyer.storage import BadRequest, ChunkCorrupted, crc32c
from fireflyer.storage.client_min import StorageClient
from fireflyer.storage.protocol import IoResult


def test_result_checks_crc_and_hands_over_data() -> None:
    data = os.urandom(5000)
    ok = IoResult(length=len(data), crc=crc32c(data), version=3)
    # no buffer: bytes
    r = StorageClient._result(ok, 7, memoryview(data), None, False)
    assert r.error is None and isinstance(r.data, bytes) and r.data == data and r.version == 3
    # into a larger buffer (scratch path): copied, result is a view of its head
    dest = memoryview(bytearray(6000))
    r = StorageClient._result(ok, 7, memoryview(data), dest, False)
    assert r.error is None and bytes(r.data) == data and bytes(dest[:5000]) == data
    # already landed in the buffer: no copy, a view of it
    buf = bytearray(data)
    r = StorageClient._result(ok, 7, memoryview(buf), memoryview(buf), True)
    assert r.error is None and r.data.obj is buf


def test_result_detects_corruption_in_transit_and_overflow() -> None:
    data = bytearray(os.urandom(5000))
    res = IoResult(length=len(data), crc=crc32c(data))
    data[10] ^= 0x40  # a bit flipped after the server computed the CRC
    for dest, landed in ((None, False), (memoryview(bytearray(5000)), False), (memoryview(data), True)):
        r = StorageClient._result(res, 7, memoryview(data), dest, landed)
        assert isinstance(r.error, ChunkCorrupted) and r.target == 7
    good = bytes(data)
    r = StorageClient._result(IoResult(length=5000, crc=crc32c(good)), 7, memoryview(good),
                              memoryview(bytearray(100)), False)
    assert isinstance(r.error, BadRequest)
