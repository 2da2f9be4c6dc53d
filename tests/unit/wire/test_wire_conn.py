"""FramedSocket alone: framing across arbitrary read boundaries, partial sends, timeouts."""

import socket
import threading
import time

import numpy as np
import pytest

from fireflyer.core.errors import DeadlineExceeded, InvalidArgument, ProtocolError
from fireflyer.wire.conn import FramedSocket, Idle, PeerClosed, as_bytes_view, set_io_timeout
from fireflyer.wire.frame import FrameLimits, Request, encode_head


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_frames_split_at_any_byte_boundary(pair):
    a, b = pair
    fs = FramedSocket(b, peer="p", limits=FrameLimits(), io_timeout_s=5)
    frames = b"".join(
        bytes(encode_head(Request(rid=i, op="op", meta={"k": "v" * (i * 37 % 3000)}), 3)) + b"abc"
        for i in range(1000)
    )

    def send() -> None:
        for off in range(0, len(frames), 777):  # pieces that cut prefixes and headers
            a.sendall(frames[off:off + 777])

    t = threading.Thread(target=send)
    t.start()
    for i in range(1000):
        header, n = fs.read_header()
        buf = bytearray(n)
        fs.recv_into(memoryview(buf))
        assert header.rid == i and header.meta["k"] == "v" * (i * 37 % 3000) and buf == b"abc"
    t.join(10)


class _TrickleSocket:
    """Accepts at most 7 bytes per sendmsg, as a kernel under pressure may."""

    def __init__(self) -> None:
        self.out = bytearray()

    def sendmsg(self, buffers) -> int:
        data = b"".join(bytes(b) for b in buffers)[:7]
        self.out += data
        return len(data)


def test_partial_sends_resume_where_they_stopped():
    sock = _TrickleSocket()
    fs = FramedSocket(sock, peer="p", limits=FrameLimits(), io_timeout_s=None)  # type: ignore[arg-type]
    payload = bytes(range(256)) * 3
    fs.send_frame(Request(rid=1, op="put"), memoryview(payload))
    head = bytes(encode_head(Request(rid=1, op="put"), len(payload)))
    assert bytes(sock.out) == head + payload


def test_idle_closed_stalled_and_truncated(pair):
    a, b = pair
    fs = FramedSocket(b, peer="p", limits=FrameLimits(), io_timeout_s=0.05)
    set_io_timeout(b, 0.05)  # the kernel enforces it; FramedSocket only reports it
    with pytest.raises(Idle):
        fs.read_header()  # nothing sent: idle, not an error
    a.sendall(bytes(encode_head(Request(rid=1, op="x"), 10))[:5])
    with pytest.raises(DeadlineExceeded) as ei:
        fs.read_header()  # a frame started and stopped: stalled
    assert ei.value.reason == "stalled" and fs.broken

    c, d = socket.socketpair()
    fs2 = FramedSocket(d, peer="q", limits=FrameLimits(), io_timeout_s=5)
    c.close()
    with pytest.raises(PeerClosed):
        fs2.read_header()
    d.close()

    e, f = socket.socketpair()
    fs3 = FramedSocket(f, peer="r", limits=FrameLimits(), io_timeout_s=5)
    e.sendall(bytes(encode_head(Request(rid=1, op="x"), 10)) + b"12345")
    e.close()
    fs3.read_header()
    with pytest.raises(ProtocolError) as pe:
        fs3.recv_into(memoryview(bytearray(10)))
    assert pe.value.reason == "truncated"
    f.close()


def test_buffer_views():
    arr = np.zeros((4, 4), dtype=np.float64)
    view = as_bytes_view(arr, writable=True)
    assert view.format == "B" and len(view) == 128
    with pytest.raises(InvalidArgument):
        as_bytes_view(b"read only", writable=True)
    with pytest.raises(InvalidArgument):
        as_bytes_view(arr[:, ::2])


def test_congestion_control_is_the_first_the_kernel_allows() -> None:
    """reno is built into every Linux kernel and allowed to every process; a name the kernel
    does not know is skipped; with none settable the socket keeps the system default."""
    from fireflyer.wire.conn import congestion_of, set_congestion, tune_socket

    with socket.socket() as s, socket.socket() as fresh:
        system = congestion_of(fresh)
        assert system  # Linux says which one a socket uses
        assert set_congestion(s, []) is None and congestion_of(s) == system
        assert set_congestion(s, ["no_such_cc"]) is None and congestion_of(s) == system
        assert set_congestion(s, ["no_such_cc", "reno", "cubic"]) == "reno"
        assert congestion_of(s) == "reno"
    with socket.socket() as s:
        tune_socket(s, io_timeout_s=None, congestion=("no_such_cc", "reno"))
        assert congestion_of(s) == "reno"


def test_tune_socket_fixes_the_send_buffer_alone_or_both() -> None:
    """``send_buf_bytes`` fixes SO_SNDBUF only (the kernel doubles it) and leaves SO_RCVBUF as a fresh
    socket has it; ``buf_bytes`` fixes both and wins over ``send_buf_bytes``."""
    from fireflyer.wire.conn import tune_socket

    def bufs(s: socket.socket) -> tuple[int, int]:
        return s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF), s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    with socket.socket() as fresh, socket.socket() as s, socket.socket() as both:
        tune_socket(s, io_timeout_s=None, send_buf_bytes=96 << 10)
        assert bufs(s) == (192 << 10, bufs(fresh)[1])
        tune_socket(both, io_timeout_s=None, buf_bytes=64 << 10, send_buf_bytes=96 << 10)
        assert bufs(both) == (128 << 10, 128 << 10)


def test_poll_for_returns_when_bytes_come_or_the_budget_ends_and_never_sleeps_past_it(pair):
    a, b = pair
    fs = FramedSocket(b, peer="p", limits=FrameLimits(), io_timeout_s=5)
    t0 = time.perf_counter()
    assert fs.poll_for(0.02) is False  # nothing came: the budget, then no more
    took = time.perf_counter() - t0
    assert 0.02 <= took < 1.0

    timer = threading.Timer(0.01, lambda: a.sendall(bytes(encode_head(Request(rid=7, op="x"), 0))))
    timer.start()
    t0 = time.perf_counter()
    assert fs.poll_for(5.0) is True  # bytes arrived while polling: back long before the budget
    assert time.perf_counter() - t0 < 2.0
    timer.join()
    assert fs.poll_for(0.0) is True  # still unread: ready at once, even with no budget
    header, _ = fs.read_header()
    assert header.rid == 7

    a.sendall(bytes(encode_head(Request(rid=8, op="x"), 0)) * 2)
    fs.read_header()  # reads ahead: the second frame sits in the buffer, not the socket
    assert fs.poll_for(0.0) is True
    assert fs.read_header()[0].rid == 8

    a.close()  # the peer's close counts as "there": read_header says what happened
    assert fs.poll_for(5.0) is True
    with pytest.raises(PeerClosed):
        fs.read_header()


def _woken(tid: int) -> int:
    """How often thread ``tid`` of this process went to sleep and was woken (Linux)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("voluntary_ctxt_switches:")).split()[1])


def test_a_reader_waiting_for_a_frame_sleeps_while_its_socket_sends() -> None:
    """A thread blocked in recv() is woken each time the socket's send buffer drains (about
    once per 512 KiB sent on loopback); one waiting for the next frame must sleep through that,
    wake when the frame comes, and still wake when the socket is shut down."""
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
    fs = FramedSocket(a, peer="p", limits=FrameLimits(), io_timeout_s=None)
    tid: list[int] = []
    got: list[object] = []

    def reader() -> None:
        tid.append(threading.get_native_id())
        try:
            got.append(fs.read_header()[0])
        except Exception as e:  # noqa: BLE001 - checked below
            got.append(e)

    def drain() -> None:
        sink = bytearray(1 << 20)
        while b.recv_into(sink):
            pass

    sent = 256 * (512 << 10)  # 128 MiB, in the blocks of a streamed op
    try:
        threading.Thread(target=drain, daemon=True).start()
        r = threading.Thread(target=reader, daemon=True)
        r.start()
        while not tid:
            time.sleep(0.01)
        time.sleep(0.1)  # asleep, waiting for a frame
        before = _woken(tid[0])
        block = bytes(512 << 10)
        for _ in range(sent // len(block)):
            a.sendall(block)
        woken = _woken(tid[0]) - before
        assert not got and woken <= 8, f"the idle reader woke {woken} times while the socket sent"
        b.sendall(bytes(encode_head(Request(rid=9, op="x"), 0)))
        r.join(5.0)
        assert isinstance(got[0], Request) and got[0].rid == 9

        r = threading.Thread(target=reader, daemon=True)
        r.start()
        time.sleep(0.1)
        fs.shutdown()  # wakes the waiting reader, as it woke one asleep in recv()
        r.join(5.0)
        assert not r.is_alive() and isinstance(got[1], PeerClosed), got[1]
    finally:
        a.close()
        b.close()
