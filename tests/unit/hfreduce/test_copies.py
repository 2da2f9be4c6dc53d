"""``copies.copy_into``: the write-back's fan-out copy is byte-exact for any alignment and size."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce import copies


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 4097, copies.NT_MIN_BYTES - 1, copies.NT_MIN_BYTES,
                                    copies.NT_MIN_BYTES + 3 * 64 + 5, (3 << 20) + 17])
@pytest.mark.parametrize("shift", [0, 1, 7, 60])
def test_every_destination_gets_the_source_bytes(nbytes: int, shift: int) -> None:
    rng = np.random.default_rng(nbytes + shift)
    pool = rng.integers(0, 256, size=nbytes + 256, dtype=np.uint8)
    src = pool[5:5 + nbytes]
    # destinations at different offsets mod 64 (each gets its own aligned body) and one of them shifted
    backing = [np.full(nbytes + 256, 0xAB, np.uint8) for _ in range(3)]
    dsts = [backing[0][shift:shift + nbytes], backing[1][64:64 + nbytes], backing[2][33:33 + nbytes]]
    copies.copy_into(dsts, src)
    for b, d, off in zip(backing, dsts, (shift, 64, 33), strict=True):
        assert np.array_equal(d, src)
        assert (b[:off] == 0xAB).all() and (b[off + nbytes:] == 0xAB).all()  # nothing outside is touched


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int64])
def test_bits_are_copied_as_they_are(dtype: type) -> None:
    n = (copies.NT_MIN_BYTES // np.dtype(dtype).itemsize) + 1001
    raw = np.random.default_rng(1).integers(0, 256, size=n * np.dtype(dtype).itemsize, dtype=np.uint8)
    src = raw.view(dtype)  # NaN payloads, -0.0, subnormals included
    dsts = [np.empty(n, dtype) for _ in range(4)]
    copies.copy_into(dsts, src)
    for d in dsts:
        assert d.view(np.uint8).tobytes() == raw.tobytes()


def test_bad_arguments_are_refused_and_nothing_is_written() -> None:
    src = np.arange(1 << 18, dtype=np.float32)
    good = np.zeros_like(src)
    with pytest.raises(InvalidArgument, match="dsts\\[1\\] is float64"):
        copies.copy_into([good, np.zeros(src.size, np.float64)], src)
    with pytest.raises(InvalidArgument, match="overlaps src"):
        copies.copy_into([good, src[:]], src)
    ro = np.zeros_like(src)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgument, match="read-only"):
        copies.copy_into([good, ro], src)
    with pytest.raises(InvalidArgument, match="contiguous"):
        copies.copy_into([np.zeros(2 * src.size, np.float32)[::2]], src)
    assert not good.any()
