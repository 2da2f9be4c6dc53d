"""The rank <-> worker control protocol: framing, tagged messages, EOF and bad input."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from fireflyer.core.errors import ProtocolError
from fireflyer.hfreduce.protocol import (
    MAX_MESSAGE,
    Channel,
    Done,
    Failed,
    Hello,
    StatusReply,
    Submit,
    decode,
    encode,
)
from fireflyer.hfreduce.telemetry import OpRecord


def test_protocol_roundtrip_every_message_over_a_socketpair() -> None:
    a, b = socket.socketpair()
    ca, cb = Channel(a), Channel(b)
    msgs = [
        Hello(comm="c", rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1, nnodes=2, pid=7),
        Submit(seq=5, kind="allreduce", op="sum", dtype="bfloat16", count=11, seg=2, offset=64),
        Done(seq=5, record=OpRecord(comm="c", seq=5, kind="allreduce", op="sum", dtype="bfloat16", count=11,
                                    arrivals={0: 1.5, 1: 2.5})),
        Failed(seq=6, error={"kind": "FingerprintMismatch", "message": "x", "fields": {"node": 1}}),
        StatusReply(req=1, recent=[], pending=[], worker={"pid": 1}),
    ]
    for m in msgs:
        ca.send(m)
    for m in msgs:
        assert cb.recv() == m
    ca.close()
    assert cb.recv() is None  # EOF reads as None: the peer is gone
    cb.close()


def test_protocol_frame_is_length_prefixed_msgpack() -> None:
    data = encode(Submit(seq=1, kind="barrier", op="sum", dtype="int32", count=0))
    (n,) = struct.unpack(">I", data[:4])
    assert n == len(data) - 4
    assert decode(data[4:]).seq == 1


def test_protocol_bad_input_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode(b"\x81\xa1t\xa4nope")
    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", MAX_MESSAGE + 1))
    with pytest.raises(ProtocolError):
        Channel(b).recv()
    a.close()
    b.close()


def test_protocol_truncated_message_is_eof() -> None:
    a, b = socket.socketpair()
    a.sendall(encode(Submit(seq=1, kind="barrier", op="sum", dtype="int32", count=0))[:-2])
    a.close()
    assert Channel(b).recv() is None
    b.close()


def test_protocol_buffered_recv_batches_splits_and_large_messages() -> None:
    """recv reads ahead into a reused buffer: queued messages, byte-by-byte arrival and a
    message larger than the buffer all come out whole and in order."""
    a, b = socket.socketpair()
    try:
        rx = Channel(b)
        subs = [Submit(seq=i, kind="allreduce", op="sum", dtype="float32", count=i, seg=0, offset=0, root=-1,
                       timeout_s=1.0) for i in range(50)]
        big = Failed(seq=7, error={"message": "x" * (200 << 10)})
        def write() -> None:
            a.sendall(b"".join(encode(m) for m in subs[:40]))  # many in one read
            for byte in b"".join(encode(m) for m in subs[40:]):  # one byte at a time
                a.sendall(bytes([byte]))
            a.sendall(encode(big) + encode(subs[0]))  # larger than the read buffer

        writer = threading.Thread(target=write)
        writer.start()  # concurrently: the socket holds only so many bytes (or 1-byte sends)
        got = [rx.recv() for _ in range(52)]
        writer.join()
        assert got[:50] == subs and got[50] == big and got[51] == subs[0]
        a.close()
        assert rx.recv() is None
    finally:
        a.close()
        b.close()
