"""Readahead of sequential reads: exact segments only, dropped on a seek, failures read again."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fireflyer.fs.readahead import Readahead

DATA = bytes(range(256)) * 397 + b"tail"  # an odd length


class Source:
    def __init__(self, fail_at: set[int] | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.fail_at = fail_at or set()
        self.lock = threading.Lock()

    def fetch(self, offset: int, dest: memoryview) -> None:
        with self.lock:
            self.calls.append((offset, len(dest)))
        if offset in self.fail_at:
            raise OSError("injected read failure")
        dest[:] = DATA[offset:offset + len(dest)]


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as p:
        yield p


def _read_all(ra: Readahead, n: int) -> bytes:
    out, off = bytearray(), 0
    while off < len(DATA):
        k = min(n, len(DATA) - off)
        got = ra.read(off, k, len(DATA))
        out += got if got is not None else DATA[off:off + k]  # a miss: the caller reads itself
        off += k
    return bytes(out)


def test_sequential_reads_are_served_from_segments(pool) -> None:
    src = Source()
    ra = Readahead(src.fetch, pool.submit, window=40000, depth=4)
    assert _read_all(ra, 10000) == DATA
    assert ra.misses == 1 and ra.hits == len(DATA) // 10000  # only the first read was the caller's
    assert all(off % 10000 == 0 for off, _ in src.calls)
    assert max(off for off, _ in src.calls) < len(DATA)  # nothing past the end
    # into a caller's buffer: copied, count returned; recycled buffers give the same bytes again
    ra2 = Readahead(src.fetch, pool.submit, window=40000, depth=2)
    buf = bytearray(5000)
    assert ra2.read(0, 5000, len(DATA), into=memoryview(buf)) is None
    for off in range(5000, 60000, 5000):
        assert ra2.read(off, 5000, len(DATA), into=memoryview(buf)) == 5000
        assert buf == DATA[off:off + 5000]


def test_a_seek_or_another_size_drops_segments(pool) -> None:
    src = Source()
    ra = Readahead(src.fetch, pool.submit, window=40000, depth=4)
    assert ra.read(0, 1000, len(DATA)) is None
    assert ra.read(1000, 1000, len(DATA)) == DATA[1000:2000]
    assert ra.read(50000, 1000, len(DATA)) is None  # a seek: everything dropped, nothing used
    assert ra.read(51000, 500, len(DATA)) is None  # sequential but a different size: not an exact segment
    assert ra.read(51500, 500, len(DATA)) == DATA[51500:52000]
    ra.close()


def test_a_failed_segment_is_read_by_the_caller(pool) -> None:
    src = Source(fail_at={2000})
    ra = Readahead(src.fetch, pool.submit, window=8000, depth=4)
    assert ra.read(0, 1000, len(DATA)) is None
    assert ra.read(1000, 1000, len(DATA)) == DATA[1000:2000]
    assert ra.read(2000, 1000, len(DATA)) is None  # its prefetch failed: the caller reads (and sees errors)
    assert ra.read(3000, 1000, len(DATA)) == DATA[3000:4000]
