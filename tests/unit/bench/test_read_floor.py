"""fireflyer.bench._read_floor: the read floor reads every byte of every input exactly once.

The loop's only output is a 64-byte XOR digest, so these tests check it against numpy's XOR
of the same bytes (zero-padded to whole 64-byte lanes): a byte skipped or read twice, a
chunk lost between threads or a tail forgotten changes the digest."""

from __future__ import annotations

import numpy as np
import pytest

from fireflyer.bench._read_floor import read_once
from fireflyer.core.errors import InvalidArgument


def digest(bufs: list[np.ndarray]) -> np.ndarray:
    out = np.zeros(64, np.uint8)
    for b in bufs:
        v = b.reshape(-1).view(np.uint8)
        padded = np.zeros(-(-v.size // 64) * 64, np.uint8)
        padded[:v.size] = v
        if padded.size:
            out ^= np.bitwise_xor.reduce(padded.reshape(-1, 64), axis=0)
    return out.view(np.uint64)


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 65, 4099, (1 << 20) + 17])
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_every_byte_is_read_once_whatever_the_threads_blocks_and_chunks(nbytes: int, k: int) -> None:
    rng = np.random.default_rng(nbytes * 31 + k)
    bufs = [rng.integers(0, 256, nbytes, dtype=np.uint8) for _ in range(k)]
    want = digest(bufs)
    for threads in (1, 2, 3):
        for block, chunk in ((256 << 10, 16 << 20), (64, 64 * k), (200, 1000)):  # 200 -> 192, chunks of one lane
            got = read_once(bufs, threads, block=block, chunk=chunk)
            assert (got == want).all(), (threads, block, chunk)


def test_any_dtype_and_shape_is_read_as_its_bytes() -> None:
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((3, 1000), dtype=np.float32) for _ in range(3)]
    assert (read_once(xs, 2, block=128, chunk=512) == digest(xs)).all()
    flipped = [x.copy() for x in xs]
    flipped[2].view(np.uint8).reshape(-1)[-1] ^= 1  # the very last byte of the last input
    assert (read_once(flipped, 2) != read_once(xs, 2)).any()


def test_no_buffers_read_nothing() -> None:
    assert (read_once([], 2) == 0).all()


def test_bad_input_is_refused() -> None:
    a = np.zeros(128, np.float32)
    with pytest.raises(InvalidArgument, match="differ in size"):
        read_once([a, np.zeros(64, np.float32)])
    with pytest.raises(InvalidArgument, match="C-contiguous") as ei:
        read_once([a, np.zeros(256, np.float32)[::2]])
    assert ei.value.argument == "bufs"
    with pytest.raises(InvalidArgument) as ei:
        read_once([a], threads=0)
    assert ei.value.argument == "threads"
