"""A tree root's one-pass sum and store (:mod:`fireflyer.hfreduce._rootpass`), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from fireflyer.hfreduce._rootpass import _UNROLLED, sum_store

SPECIALS = np.array([np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38, -0.0, 0.0, 1.17e-38], np.float32)


def _addrs(arrays: list[np.ndarray]) -> np.ndarray:
    return np.array([a.ctypes.data for a in arrays], dtype=np.int64)


def _inputs(rng: np.random.Generator, g: int, n: int) -> list[np.ndarray]:
    xs = [rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 4)) for _ in range(g)]
    for t, x in enumerate(xs):  # every special against every other somewhere, overflow to Inf too
        x[:len(SPECIALS)] = np.roll(SPECIALS, t)
    return xs


def _left_to_right(xs: list[np.ndarray], divisor: int) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        acc = xs[0].copy()
        for x in xs[1:]:
            acc = acc + x
        return acc / np.float32(divisor) if divisor > 1 else acc


@pytest.mark.parametrize("divisor", [1, 3, 8])
@pytest.mark.parametrize("g,h", [*_UNROLLED[:4], (1, 1), (3, 1), (10, 9), (18, 17), (5, 5)])
@pytest.mark.parametrize("lo,hi", [(0, 4096), (5, 5), (3, 19), (17, 4001), (0, 15)])
def test_sum_store_writes_the_left_to_right_sum_to_every_output_and_nothing_else(
        g: int, h: int, lo: int, hi: int, divisor: int) -> None:
    # unrolled counts, runtime ones (1 input; more than any unrolled loop takes), ranges that
    # start and end inside a vector, a range shorter than one vector, an empty one
    rng = np.random.default_rng(g * 1000 + h * 10 + divisor)
    n = 4096
    xs = _inputs(rng, g, n)
    want = _left_to_right([x[lo:hi] for x in xs], divisor)
    outs = [rng.standard_normal(n).astype(np.float32) for _ in range(h)]
    before = [o.copy() for o in outs]
    sum_store(_addrs(xs), _addrs(outs), lo, hi, divisor, np.empty(g, np.int64), np.empty(h, np.int64))
    for o, old in zip(outs, before, strict=True):
        assert o[lo:hi].view(np.uint32).tolist() == want.view(np.uint32).tolist()
        assert np.array_equal(o[:lo].view(np.uint32), old[:lo].view(np.uint32))
        assert np.array_equal(o[hi:].view(np.uint32), old[hi:].view(np.uint32))


def test_sum_store_over_its_own_inputs_at_any_alignment_matches_the_copy_it_made() -> None:
    # the engine's root: the outputs are the first child's block and the ranks' buffers, all of
    # them inputs too; the buffers are 4 bytes off a 64-byte line here (element offsets 1..4)
    rng = np.random.default_rng(5)
    n, k = 3000, 4
    raw = [np.empty(n + 16, np.float32) for _ in range(k + 1)]
    bufs = [r[1 + t:1 + t + n] for t, r in enumerate(raw)]
    for b, x in zip(bufs, _inputs(rng, k + 1, n), strict=True):
        b[:] = x
    want = _left_to_right([b.copy() for b in bufs[:k]] + [bufs[k].copy()], 1)
    ins = _addrs(bufs)
    outs = _addrs([bufs[k], *bufs[:k]])
    sum_store(ins, outs, 0, n, 1, np.empty(k + 1, np.int64), np.empty(k + 1, np.int64))
    for b in bufs:
        assert b.view(np.uint32).tolist() == want.view(np.uint32).tolist()
