"""The express path's pieces that need no sockets: which ops take it, and its two-input sum."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fireflyer.hfreduce import kernels
from fireflyer.hfreduce.express import EXPRESS_BYTES, add_pair, eligible


@pytest.mark.parametrize("kind", ["allreduce", "reduce"])
def test_small_allreduces_and_reduces_are_eligible_by_their_carried_bytes(kind: str) -> None:
    f32, bf16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)
    assert eligible(kind, f32, 1) and eligible(kind, f32, 0)
    assert eligible(kind, f32, EXPRESS_BYTES // 4)
    assert not eligible(kind, f32, EXPRESS_BYTES // 4 + 1)
    # bfloat16 travels as float32 partials: half as many elements fit
    assert eligible(kind, bf16, EXPRESS_BYTES // 4)
    assert not eligible(kind, bf16, EXPRESS_BYTES // 4 + 1)


def test_broadcasts_are_eligible_by_the_int32_words_they_travel_as() -> None:
    u8, bf16, i64 = np.dtype(np.uint8), np.dtype(ml_dtypes.bfloat16), np.dtype(np.int64)
    assert eligible("broadcast", bf16, 0) and eligible("broadcast", u8, 1)
    # a broadcast's bytes travel as they are (no float32 partials): twice as many bfloat16 fit
    assert eligible("broadcast", bf16, EXPRESS_BYTES // 2)
    assert not eligible("broadcast", bf16, EXPRESS_BYTES // 2 + 1)
    assert eligible("broadcast", i64, EXPRESS_BYTES // 8) and not eligible("broadcast", i64, EXPRESS_BYTES // 8 + 1)
    # padded to whole words: one byte past the limit is one word too many
    assert eligible("broadcast", u8, EXPRESS_BYTES) and not eligible("broadcast", u8, EXPRESS_BYTES + 1)


def test_barriers_are_always_eligible_and_unknown_kinds_never() -> None:
    f32 = np.dtype(np.float32)
    assert eligible("barrier", f32, 0)  # an exchange of nothing
    assert not eligible("alltoall", f32, 1)


def _specials(dt: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    if dt.kind == "f":
        pool = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 1e-38],
                        dtype=dt)
        x = rng.standard_normal(n).astype(dt) * dt.type(1e3)
    else:
        info = np.iinfo(dt)
        pool = np.array([0, 1, -1, info.max, info.min, info.max - 1], dtype=dt)
        x = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    pick = rng.random(n) < 0.3
    x[pick] = pool[rng.integers(0, len(pool), int(pick.sum()))]
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
@pytest.mark.parametrize("n", [0, 1, 7, kernels.SMALL_ELEMS])
def test_the_pair_sum_has_the_kernels_bits_in_place_either_way_round(dtype: type, n: int) -> None:
    rng = np.random.default_rng(n)
    dt = np.dtype(dtype)
    a, b = _specials(dt, n, rng), _specials(dt, n, rng)
    want = a.copy()
    kernels.reduce_into(want, [a.copy(), b], "sum", threads=1)
    for first_is_out in (True, False):  # out is the first input (node 0) or the second (node 1)
        x, y = a.copy(), b.copy()
        out = x if first_is_out else y
        add_pair(x, y, out)
        assert out.tobytes() == want.tobytes()
