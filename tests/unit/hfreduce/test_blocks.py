"""The streamed-chunk block loops (:mod:`fireflyer.hfreduce._blocks`) over real socket pairs."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fireflyer.hfreduce import _blocks as B
from fireflyer.hfreduce.kernels import _FORMATS, _OP_CODE

MAGIC = 0x4646424B << 32
_NO_SYNC = (B.new_sync(), B.NO_SYNC)  # the last two arguments of a loop that neither waits nor publishes


def marker(block: int, aborted: bool = False) -> bytes:
    return struct.pack("<q", MAGIC | block << 1 | int(aborted))


def framed(data: bytes, block_bytes: int, *, abort_at: int | None = None) -> bytes:
    """``data`` as a streamed frame: blocks, each followed by its marker (``abort_at``: the
    sender stops there with an aborted block of the same size)."""
    out = bytearray()
    for i, off in enumerate(range(0, len(data), block_bytes)):
        block = data[off:off + block_bytes]
        if abort_at == i:
            return bytes(out + b"\0" * len(block) + marker(i, True))
        out += block + marker(i)
    return bytes(out)


def unframed(wire: bytes, block_bytes: int, nbytes: int) -> bytes:
    """The payload of a streamed frame, checking every marker."""
    out = bytearray()
    pos, i = 0, 0
    while len(out) < nbytes:
        n = min(block_bytes, nbytes - len(out))
        out += wire[pos:pos + n]
        assert wire[pos + n:pos + n + 8] == marker(i), f"block {i}: bad marker"
        pos += n + 8
        i += 1
    assert pos == len(wire)
    return bytes(out)


def _sender(sock: socket.socket, data: bytes) -> threading.Thread:
    th = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    th.start()
    return th


def _receiver(sock: socket.socket, n: int, out: list[bytes]) -> threading.Thread:
    def body() -> None:
        buf = bytearray()
        while len(buf) < n:
            got = sock.recv(n - len(buf))
            if not got:
                break
            buf += got
        out.append(bytes(buf))

    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th


def _ref(inputs: list[np.ndarray], op: str) -> np.ndarray:
    fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = fn(acc, x)  # left to right, in the dtype (float32 / wrapping ints): the kernels' bits
    return acc


def _addrs(arrays: list[np.ndarray]) -> np.ndarray:
    return np.array([a.ctypes.data for a in arrays], dtype=np.int64)


def _data(rng: np.random.Generator, dtype: np.dtype, n: int) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)


def _run_up(dt: np.dtype, op: str, own: list[np.ndarray], kids: list[bytes], a: int, b: int, blk: int, *,
            root: bool, work: np.ndarray | None = None, mirrors: list[np.ndarray] = (), divisor: int = 1,
            pre_cut: list[int] | None = None, abort: int = 0, sub: int = 256,
            times_out: list[np.ndarray] | None = None,
            scratch_out: list[np.ndarray] | None = None) -> tuple[int, np.ndarray, list[bytes], list[bytes]]:
    """up_chunk with the children's frames arriving on socket pairs; (rc, io, what the parent got
    or [], what each child got down or []); the loop's ``times`` are appended to ``times_out``,
    its scratch block (0xAB bytes before the call) to ``scratch_out``."""
    m = len(kids)
    links = [socket.socketpair() for _ in range(m)]
    cuts = pre_cut or [0] * m
    pre = np.zeros((max(1, m), max(cuts, default=0) or 1), dtype=np.uint8)
    pre_len = np.zeros(max(1, m), dtype=np.int64)
    threads = []
    for i, ((_, theirs), wire) in enumerate(zip(links, kids, strict=True)):
        pre[i, :cuts[i]] = np.frombuffer(wire[:cuts[i]], dtype=np.uint8)
        pre_len[i] = cuts[i]
        threads.append(_sender(theirs, wire[cuts[i]:]))
    wire_len = B.framed_bytes(b - a, blk, dt.itemsize)
    up = socket.socketpair()
    got_up: list[bytes] = []
    downs: list[list[bytes]] = [[] for _ in range(m)]
    if root:
        threads += [_receiver(theirs, wire_len, downs[i]) for i, (_, theirs) in enumerate(links)]
    else:
        threads.append(_receiver(up[1], wire_len, got_up))
    slots = [np.empty(blk * dt.itemsize, dtype=np.uint8) for _ in range(m)]  # (referenced: the loop gets addresses)
    scratch = np.full(blk * dt.itemsize, 0xAB, dtype=np.uint8)
    if scratch_out is not None:
        scratch_out.append(scratch)
    io = B.new_io(m)
    times = np.zeros(4)
    rc = B.up_chunk(_FORMATS[dt], _OP_CODE[op], dt.itemsize, _addrs(own),
                    np.array([s.fileno() for s, _ in links], dtype=np.int64), pre, pre_len, _addrs(slots),
                    scratch.ctypes.data, 0 if work is None else work.ctypes.data, -1 if root else up[0].fileno(),
                    _addrs(list(mirrors)), divisor, a, b, blk, io, np.array([abort], dtype=np.int64), times, sub, *_NO_SYNC)
    if rc != B.OK:  # nothing more is coming: let the receivers finish with what they have
        for s in [up[0], *(s for s, _ in links)]:
            s.shutdown(socket.SHUT_WR)
    for th in threads:
        th.join(10)
    assert times.min() >= 0
    if times_out is not None:
        times_out.append(times)
    return rc, io, got_up, [d[0] if d else b"" for d in downs]


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("k,m", [(1, 0), (1, 1), (3, 2), (4, 1), (16, 2), (20, 1)])
def test_up_chunk_at_an_interior_node_sends_the_reduce_of_ranks_then_children(dtype: str, op: str, k: int,
                                                                            m: int) -> None:
    rng = np.random.default_rng(k * 10 + m)
    dt = np.dtype(dtype)
    count, a, b, blk = 5000, 1234, 4321, 333  # a range inside the buffer, blocks that do not divide it
    own = [_data(rng, dt, count) for _ in range(k)]
    kids = [_data(rng, dt, b - a) for _ in range(m)]
    wires = [framed(x.tobytes(), blk * dt.itemsize) for x in kids]
    rc, io, got_up, _ = _run_up(dt, op, own, wires, a, b, blk, root=False, pre_cut=[0, 5, 1500][:m])
    assert rc == B.OK
    want = _ref([x[a:b] for x in own] + kids, op)  # more than 16 inputs: same bits, several passes
    assert unframed(got_up[0], blk * dt.itemsize, want.nbytes) == want.tobytes()
    for i in range(m):
        assert io[B.IO_GOT + i] == len(wires[i])  # prefix bytes count as taken
    assert io[B.IO_FAIL_FD] == -1 and io[B.IO_WAIT_FD] == -1
    assert io[B.IO_DONE] == -(-(b - a) // blk)


@pytest.mark.parametrize("dtype,divisor", [("float32", 1), ("float32", 6), ("int32", 6), ("int64", 3)])
def test_up_chunk_at_the_root_finalises_in_work_sends_down_and_fills_the_mirrors(dtype: str, divisor: int) -> None:
    rng = np.random.default_rng(divisor)
    dt = np.dtype(dtype)
    count, a, b, blk = 3000, 100, 2900, 256
    own = [_data(rng, dt, count) for _ in range(3)]
    before = own[0].copy()
    kids = [_data(rng, dt, b - a) for _ in range(2)]
    want = _ref([x[a:b] for x in own] + kids, "sum")  # (before the call: own[0] is the output too)
    if divisor > 1:
        want = np.floor_divide(want, dt.type(divisor)) if dt.kind == "i" else np.divide(want, dt.type(divisor))
    mirrors = [np.zeros(count, dtype=dt) for _ in range(2)]
    rc, _, _, downs = _run_up(dt, "sum", own, [framed(x.tobytes(), blk * dt.itemsize) for x in kids], a, b, blk,
                              root=True, work=own[0], mirrors=mirrors, divisor=divisor)
    assert rc == B.OK
    assert own[0][a:b].tobytes() == want.tobytes()  # in place: work is the first input
    assert np.array_equal(own[0][:a], before[:a]) and np.array_equal(own[0][b:], before[b:])  # nothing outside
    for i in range(2):
        assert unframed(downs[i], blk * dt.itemsize, want.nbytes) == want.tobytes()
        assert mirrors[i][a:b].tobytes() == want.tobytes()
        assert not mirrors[i][:a].any() and not mirrors[i][b:].any()


@pytest.mark.parametrize("op,divisor", [("sum", 1), ("sum", 7), ("max", 1), ("min", 1)])
@pytest.mark.parametrize("k,m,sub", [(2, 1, 256), (4, 1, 1024), (5, 2, 64), (9, 2, 256), (14, 2, 512), (4, 1, 0)])
def test_a_root_whose_outputs_are_its_inputs_stores_each_result_over_them_in_place(op: str, divisor: int, k: int,
                                                                                 m: int, sub: int) -> None:
    # the engine's usual streamed allreduce: work is rank 0's buffer and the mirrors are the other
    # ranks' buffers, which are also the inputs: the loop stores the results over the inputs
    # sub-block by sub-block (no staged copy: T_COPY stays 0); blocks and the range cut the
    # sub-blocks anywhere (sub 0: the loop's default)
    rng = np.random.default_rng(k * 100 + m * 10 + divisor)
    dt = np.dtype(np.float32)
    count, a, b, blk = 4000, 77, 3991, 700
    own = [_data(rng, dt, count) for _ in range(k)]
    before = [x.copy() for x in own]
    kids = [_data(rng, dt, b - a) for _ in range(m)]
    want = _ref([x[a:b] for x in own] + kids, op)
    if divisor > 1:
        want = np.divide(want, dt.type(divisor))
    times: list[np.ndarray] = []
    scratch: list[np.ndarray] = []
    rc, _, _, downs = _run_up(dt, op, own, [framed(x.tobytes(), blk * 4) for x in kids], a, b, blk,
                              root=True, work=own[0], mirrors=own[1:], divisor=divisor, sub=sub, times_out=times,
                              scratch_out=scratch)
    assert rc == B.OK
    for x, old in zip(own, before, strict=True):
        assert x[a:b].tobytes() == want.tobytes()
        assert np.array_equal(x[:a], old[:a]) and np.array_equal(x[b:], old[b:])
    for d in downs:
        assert unframed(d, blk * 4, want.nbytes) == want.tobytes()
    assert times[0][B.T_COPY] == 0 and times[0][B.T_REDUCE] > 0
    # a sum (avg: a divided sum) takes one pass per vector, whose result lands in the first
    # child's block and goes down from there: the scratch block is never written
    assert (scratch[0] == 0xAB).all() == (op == "sum")


@pytest.mark.parametrize("keep,mirrored", [(True, 3), (False, 0), (False, 2)])
def test_down_chunk_lands_in_work_forwards_to_the_children_and_fills_the_mirrors(keep: bool, mirrored: int) -> None:
    # keep False: a reduce's node that wants no copy of its own (work is DISCARD): the final
    # blocks go to the children and the mirrors only
    rng = np.random.default_rng(7 + mirrored)
    count, a, b, blk = 70_000, 5_000, 69_999, 16_384  # several blocks, a short last one
    raw = rng.standard_normal(b - a).astype(np.float32).tobytes()
    wire = framed(raw, blk * 4)
    up = socket.socketpair()
    pre = np.frombuffer(wire[:1500], dtype=np.uint8).copy()
    tx = _sender(up[1], wire[1500:])
    links = [socket.socketpair() for _ in range(2)]
    outs: list[list[bytes]] = [[], []]
    rxs = [_receiver(theirs, len(wire), outs[i]) for i, (_, theirs) in enumerate(links)]
    work = np.zeros(count, np.float32)
    mirrors = [np.zeros(count, np.float32) for _ in range(mirrored)]
    io = B.new_io(1)
    times = np.zeros(4)
    scratch = np.empty(blk * 4, np.uint8)
    rc = B.down_chunk(up[0].fileno(), pre, work.ctypes.data if keep else B.DISCARD, scratch.ctypes.data,
                      np.array([s.fileno() for s, _ in links], np.int64), _addrs(mirrors), 4, a, b, blk, io,
                      np.zeros(1, np.int64), times, *_NO_SYNC)
    for th in [tx, *rxs]:
        th.join(10)
    assert rc == B.OK
    if keep:
        assert work[a:b].tobytes() == raw and not work[:a].any() and not work[b:].any()
    assert all(o[0] == wire for o in outs)  # forwarded as framed
    assert all(mm[a:b].tobytes() == raw and not mm[:a].any() and not mm[b:].any() for mm in mirrors)
    assert io[B.IO_GOT] == len(wire)
    assert times[B.T_COPY] > 0 or not (keep or mirrored)


@pytest.mark.parametrize("k,m,mirrored,divisor", [(3, 2, 2, 1), (2, 1, 0, 1), (16, 2, 1, 1), (1, 1, 1, 5)])
def test_a_root_that_discards_work_sends_down_and_fills_the_mirrors_without_touching_work(
        k: int, m: int, mirrored: int, divisor: int) -> None:
    # a reduce on a node without its root: the result goes down and into the mirrors (the root's
    # buffer, when it is here) and nowhere else; ``work`` is not even an address (DISCARD)
    rng = np.random.default_rng(k * 10 + m)
    dt = np.dtype(np.float32)
    count, a, b, blk = 3000, 100, 2900, 256
    own = [_data(rng, dt, count) for _ in range(k)]
    before = [x.copy() for x in own]
    kids = [_data(rng, dt, b - a) for _ in range(m)]
    mirrors = [np.zeros(count, dtype=dt) for _ in range(mirrored)]
    rc, _, _, downs = _run_up(dt, "sum", own, [framed(x.tobytes(), blk * 4) for x in kids], a, b, blk,
                              root=True, work=None, mirrors=mirrors, divisor=divisor)
    assert rc == B.OK
    # the same loop finalising in a work buffer of its own: the bits to expect
    work = np.zeros(count, dtype=dt)
    rc, _, _, want_downs = _run_up(dt, "sum", own, [framed(x.tobytes(), blk * 4) for x in kids], a, b, blk,
                                   root=True, work=work, divisor=divisor)
    assert rc == B.OK
    want = work[a:b].tobytes()
    assert downs == want_downs and all(unframed(d, blk * 4, b * 4 - a * 4) == want for d in downs)
    for mm in mirrors:
        assert mm[a:b].tobytes() == want and not mm[:a].any() and not mm[b:].any()
    assert all(np.array_equal(x, old) for x, old in zip(own, before, strict=True))  # the inputs stay as they were


def test_a_root_that_discards_work_ends_its_frames_with_aborted_blocks_from_its_scratch() -> None:
    # the aborted block's bytes may be any: without a work buffer they come from the scratch block
    dt = np.dtype(np.float32)
    rc, _, _, downs = _run_up(dt, "sum", [np.ones(4000, dt)], [framed(np.ones(4000, dt).tobytes(), 1024)] * 2,
                              0, 4000, 256, root=True, work=None, abort=1)
    assert rc == B.ABORTED
    assert all(len(d) == 1032 and d[-8:] == marker(0, True) for d in downs)


def test_a_peer_that_closes_mid_frame_fails_the_loop_naming_its_socket_and_what_was_taken() -> None:
    up = socket.socketpair()
    wire = framed(b"\1" * 4000, 1024)
    up[1].sendall(wire[:1500])
    up[1].close()  # then EOF
    io = B.new_io(1)
    work = np.zeros(1000, np.float32)  # (referenced: the loop only gets its address)
    rc = B.down_chunk(up[0].fileno(), np.zeros(0, np.uint8), work.ctypes.data, 0, np.zeros(0, np.int64),
                      np.zeros(0, np.int64), 4, 0, 1000, 256, io, np.zeros(1, np.int64), np.zeros(4), *_NO_SYNC)
    assert rc == B.FAILED
    assert io[B.IO_FAIL_FD] == up[0].fileno() and io[B.IO_ERRNO] == 0  # 0: the peer closed
    assert io[B.IO_GOT] == 1500 and io[B.IO_DONE] == 1
    assert io[B.IO_WAIT_FD] == -1


def test_an_aborted_block_from_a_child_stops_the_up_loop_with_its_socket_and_frame_consumed() -> None:
    dt = np.dtype(np.float32)
    own = [np.ones(4000, dt)]
    kids = [framed(np.ones(4000, dt).tobytes(), 1024), framed(np.ones(4000, dt).tobytes(), 1024, abort_at=2)]
    rc, io, got_up, _ = _run_up(dt, "sum", own, kids, 0, 4000, 256, root=False)
    assert rc == B.PEER_ABORTED
    assert io[B.IO_DONE] == 2 and io[B.IO_GOT + 1] == 3 * (1024 + 8)  # the aborted block ends its frame
    assert io[B.IO_FAIL_FD] >= 0  # the child's socket (the parent's, after the abort went up, is not it)
    # two good blocks went up, then our own frame ended with an aborted block too
    assert len(got_up[0]) == 3 * (1024 + 8) and got_up[0][-8:] == marker(2, True)
    assert got_up[0][1024:1032] == marker(0) and got_up[0][2056:2064] == marker(1)


def test_our_abort_ends_every_outgoing_frame_with_an_aborted_block() -> None:
    dt = np.dtype(np.float32)
    rc, _, _, downs = _run_up(dt, "sum", [np.ones(4000, dt)], [framed(np.ones(4000, dt).tobytes(), 1024)] * 2,
                              0, 4000, 256, root=True, work=np.ones(4000, dt), abort=1)
    assert rc == B.ABORTED
    assert all(len(d) == 1032 and d[-8:] == marker(0, True) for d in downs)


def test_a_wrong_marker_is_a_framing_error() -> None:
    up = socket.socketpair()
    wire = bytearray(framed(b"\1" * 2048, 1024))
    wire[1024 + 8 + 1024:] = marker(5)  # block 1 claims to be block 5
    up[1].sendall(bytes(wire))
    io = B.new_io(1)
    work = np.zeros(512, np.float32)
    rc = B.down_chunk(up[0].fileno(), np.zeros(0, np.uint8), work.ctypes.data, 0, np.zeros(0, np.int64),
                      np.zeros(0, np.int64), 4, 0, 512, 256, io, np.zeros(1, np.int64), np.zeros(4), *_NO_SYNC)
    assert rc == B.BAD_FRAME and io[B.IO_FAIL_FD] == up[0].fileno() and io[B.IO_DONE] == 1


def test_the_abort_flag_stops_a_loop_before_its_first_block() -> None:
    up = socket.socketpair()
    io = B.new_io(1)
    work = np.zeros(100, np.float32)
    rc = B.down_chunk(up[0].fileno(), np.zeros(0, np.uint8), work.ctypes.data, 0, np.zeros(0, np.int64),
                      np.zeros(0, np.int64), 4, 0, 100, 10, io, np.ones(1, np.int64), np.zeros(4), *_NO_SYNC)
    assert rc == B.ABORTED
    assert io[B.IO_GOT] == 0 and io[B.IO_DONE] == 0


def test_framed_bytes_counts_one_marker_per_block() -> None:
    assert B.framed_bytes(0, 256, 4) == 0
    assert B.framed_bytes(1, 256, 4) == 4 + 8
    assert B.framed_bytes(512, 256, 4) == 2048 + 16
    assert B.framed_bytes(513, 256, 8) == 513 * 8 + 24


def _framed_socket(wire: bytes) -> tuple[object, socket.socket]:
    """A FramedSocket whose peer has sent ``wire`` and then ``NEXT``, and closed its side."""
    from fireflyer.wire.conn import FramedSocket
    from fireflyer.wire.frame import FrameLimits

    a, b = socket.socketpair()
    _sender(a, wire + b"NEXT").join()
    a.shutdown(socket.SHUT_WR)
    return FramedSocket(b, peer="p", limits=FrameLimits(), io_timeout_s=5), a


# blocks of 100, 100 and 50 bytes, each with an 8-byte marker: 274 bytes whole, 216 when the
# sender stops at block 1; ``got`` is what the loop took (mid-block, mid-marker, on a boundary).
# Not the aborted block's own marker, half read: that one cannot be checked (see drain_frame)
_DRAIN_CASES = [(got, abort_at) for abort_at in (None, 1, 2)
                for got in (0, 5, 100, 105, 108, 110, 116, 212, 260)
                if got < (216 if abort_at == 1 else 274) and (abort_at, got) != (1, 212)]


@pytest.mark.parametrize("got,abort_at", _DRAIN_CASES)
def test_draining_a_frame_stops_at_an_aborted_block_and_leaves_the_next_frame(got: int, abort_at: int | None) -> None:
    """The rest of a frame a loop left is read block by block: a frame its sender ended early
    (an aborted block) is over there, and what follows -- the abort frame -- is left alone."""
    block_bytes, data = 100, bytes(range(250))
    wire = framed(data, block_bytes, abort_at=abort_at)
    plen = B.framed_bytes(len(data), block_bytes, 1)
    assert got < len(wire)
    fs, peer = _framed_socket(wire)
    try:
        fs.discard(got)  # what the loop took
        ended = B.drain_frame(fs, plen, got, block_bytes)
        assert ended == (abort_at is not None)
        rest = memoryview(bytearray(4))
        fs.recv_into(rest)
        assert bytes(rest) == b"NEXT"
    finally:
        fs.close()
        peer.close()


def test_draining_a_frame_with_a_wrong_marker_is_a_framing_error() -> None:
    from fireflyer.core.errors import ProtocolError

    wire = bytearray(framed(bytes(200), 100))
    wire[108 + 100:108 + 108] = marker(5)  # block 1's marker says block 5
    fs, peer = _framed_socket(bytes(wire))
    try:
        with pytest.raises(ProtocolError, match="block 1 of a streamed frame had a wrong marker"):
            B.drain_frame(fs, B.framed_bytes(200, 100, 1), 0, 100)
    finally:
        fs.close()
        peer.close()


def test_a_child_lost_mid_frame_fails_the_root_which_ends_every_frame_going_down() -> None:
    dt = np.dtype(np.float32)
    good = framed(np.ones(2000, dt).tobytes(), 1024)
    links = [socket.socketpair() for _ in range(2)]
    links[0][1].sendall(good)
    links[1][1].sendall(good[:1032 + 100])  # one block and a bit, then nothing more from child 1
    links[1][1].shutdown(socket.SHUT_WR)
    outs: list[list[bytes]] = [[], []]
    rxs = [_receiver(theirs, len(good), outs[i]) for i, (_, theirs) in enumerate(links)]
    work = np.ones(2000, dt)
    io = B.new_io(2)
    slots = [np.empty(1024, np.uint8) for _ in range(2)]
    rc = B.up_chunk(_FORMATS[dt], 0, 4, _addrs([work]), np.array([s.fileno() for s, _ in links], np.int64),
                    np.zeros((2, 1), np.uint8), np.zeros(2, np.int64), _addrs(slots), 0, work.ctypes.data, -1,
                    np.zeros(0, np.int64), 1, 0, 2000, 256, io, np.zeros(1, np.int64), np.zeros(4), 256, *_NO_SYNC)
    for s, _ in links:
        s.shutdown(socket.SHUT_WR)
    for th in rxs:
        th.join(10)
    assert rc == B.FAILED and io[B.IO_FAIL_FD] == links[1][0].fileno() and io[B.IO_ERRNO] == 0
    assert io[B.IO_DONE] == 1 and io[B.IO_GOT + 1] == 1032 + 100
    for got in (outs[0][0], outs[1][0]):  # block 0 went down to both, then an aborted block 1
        assert len(got) == 2 * 1032 and got[1024:1032] == marker(0) and got[-8:] == marker(1, True)


def test_the_plain_fan_out_of_machines_without_non_temporal_stores_copies_to_every_destination() -> None:
    # x86 writes mirrors with _fan_out; elsewhere _plain_fan_out, which this machine never picks
    src = np.arange(1000, dtype=np.uint8)
    dsts = [np.zeros(1000, np.uint8) for _ in range(3)]
    B._plain_fan_out(_addrs(dsts), src.ctypes.data, 777, 777)
    for d in dsts:
        assert d[:777].tobytes() == src[:777].tobytes() and not d[777:].any()


def test_in_place_sub_blocks_fill_at_most_three_quarters_of_l1d_in_powers_of_two() -> None:
    # 4 ranks and a child (5 float32 streams) plus the two accumulators: 28 bytes per element
    assert B.in_place_sub(5, 48 << 10) == 1024  # 28 KiB of 36 KiB
    assert B.in_place_sub(5, 32 << 10) == 512  # 1024 would be 28 KiB of 24 KiB
    assert B.in_place_sub(11, 48 << 10) == 512  # more ranks, smaller sub-blocks
    assert B.in_place_sub(17, 1 << 10) == 64  # never below the floor ...
    assert B.in_place_sub(1, 1 << 30) == 4096  # ... nor above the cap
    for inputs in range(1, 18):
        for l1d in (32 << 10, 48 << 10, 64 << 10):
            sub = B.in_place_sub(inputs, l1d)
            assert sub & (sub - 1) == 0
            assert sub == 64 or sub * 4 * (inputs + 2) <= 0.75 * l1d


def test_l1d_bytes_reads_the_level_1_data_cache_from_sysfs(tmp_path: Path) -> None:
    for name, level, kind, size in (("index0", "1", "Data", "48K"), ("index1", "1", "Instruction", "32K"),
                                    ("index2", "2", "Unified", "2048K")):
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert B.l1d_bytes(str(tmp_path)) == 48 << 10
    (tmp_path / "index0" / "size").write_text("garbage\n")
    assert B.l1d_bytes(str(tmp_path)) == 32 << 10  # unreadable: the smallest L1d measured
    assert B.l1d_bytes(str(tmp_path / "missing")) == 32 << 10


# ------------------------------------------------------------------ one loop behind another (the ring)

def _gated_sender(work: np.ndarray, out: socket.socket, blk: int, sync: np.ndarray, after: int,
                  abort: np.ndarray, io: np.ndarray) -> tuple[threading.Thread, list[int]]:
    """An up loop that sends ``work`` as it is (one input, no children) to ``out``, each block
    gated on ``sync``, on a thread; the list gets its return code."""
    rc: list[int] = []
    scratch = np.empty(blk * 4, np.uint8)

    def body() -> None:
        rc.append(B.up_chunk(_FORMATS[work.dtype], 0, 4, _addrs([work]), np.zeros(0, np.int64),
                             np.zeros((1, 0), np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int64),
                             scratch.ctypes.data, work.ctypes.data, out.fileno(), np.zeros(0, np.int64), 1,
                             0, work.size, blk, io, abort, np.zeros(4), 256, sync, after))

    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th, rc


def test_a_gated_loop_sends_each_block_only_once_the_publishing_loop_has_landed_it() -> None:
    """The ring's sender forwards blocks of ``work`` as its reader lands them: a block sent
    early would carry the sentinel, not the data."""
    blk, count = 256, 256 * 6 + 100
    data = np.arange(count, dtype=np.float32)
    wire = framed(data.tobytes(), blk * 4)
    work = np.full(count, -1.0, np.float32)
    sync = B.new_sync()
    up, down = socket.socketpair(), socket.socketpair()
    got: list[bytes] = []
    rx = _receiver(down[1], len(wire), got)
    tx, rc = _gated_sender(work, down[0], blk, sync, 0, np.zeros(1, np.int64), B.new_io(0))

    def feed() -> None:  # block by block, slowly: the sender must keep waiting
        for off in range(0, len(wire), blk * 4 + 8):
            up[1].sendall(wire[off:off + blk * 4 + 8])
            threading.Event().wait(0.02)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    io = B.new_io(1)
    assert B.down_chunk(up[0].fileno(), np.zeros(0, np.uint8), work.ctypes.data, 0, np.zeros(0, np.int64),
                        np.zeros(0, np.int64), 4, 0, count, blk, io, np.zeros(1, np.int64), np.zeros(4), sync,
                        B.PUBLISH) == B.OK
    for th in (feeder, tx, rx):
        th.join(10)
    assert rc == [B.OK] and int(sync[0]) == 7 and int(sync[1]) == 0  # seven blocks, nobody asleep
    assert got[0] == wire


def test_a_gated_loop_waits_for_its_offset_and_an_abort_ends_its_frame() -> None:
    """``after`` counts blocks published before this frame's: with 5 published and ``after`` 3,
    blocks 0 and 1 go at once and block 2 waits -- until the engine fails, when the frame
    ends with an aborted block 2 (within the gate's nap)."""
    blk = 256
    work = np.ones(blk * 4, np.float32)
    sync = B.new_sync()
    sync[0] = 5
    out = socket.socketpair()
    abort, io = np.zeros(1, np.int64), B.new_io(0)
    tx, rc = _gated_sender(work, out[0], blk, sync, 3, abort, io)
    until = time.monotonic() + 10
    while not (io[B.IO_DONE] == 2 and int(sync[1]) == 1) and time.monotonic() < until:
        time.sleep(0.01)
    tx.join(0.2)
    assert tx.is_alive() and io[B.IO_DONE] == 2 and int(sync[1]) == 1  # asleep on the count, still
    abort[0] = 1
    tx.join(2)
    assert rc == [B.ABORTED] and io[B.IO_DONE] == 2
    out[0].shutdown(socket.SHUT_WR)
    got: list[bytes] = []
    _receiver(out[1], 3 * (blk * 4 + 8), got).join(5)
    block = work[:blk].tobytes()
    assert got[0] == block + marker(0) + block + marker(1) + got[0][-(blk * 4 + 8):-8] + marker(2, True)


def test_an_in_place_sum_of_two_matches_numpy_to_the_bit_specials_included() -> None:
    """``_reduce`` with the output as its first input (a ring's reduce-scatter with one rank)
    takes one in-place pass: the same bits as numpy's float32 add, NaN, Inf and subnormals too."""
    from fireflyer.hfreduce._lowp import F32

    rng = np.random.default_rng(7)
    n = 10_007
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -0.0, 0.0], np.float32)
    x[:8], y[:8] = specials, specials[::-1]
    x[8:16], y[8:16] = specials, specials
    with np.errstate(over="ignore", invalid="ignore"):
        want = x + y
    for a, b in ((0, n), (3, 4097), (n - 1, n), (5, 5)):
        got = x.copy()
        B._reduce(F32, _OP_CODE["sum"], 4, got.ctypes.data, _addrs([got, y]), a, b)
        exp = x.copy()
        exp[a:b] = want[a:b]
        assert got.view(np.uint32).tolist() == exp.view(np.uint32).tolist(), (a, b)
