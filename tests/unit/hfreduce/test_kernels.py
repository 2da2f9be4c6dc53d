"""fireflyer.hfreduce.kernels against a numpy / ml_dtypes reference, bit for bit.

The reference accumulates in float32 in input order (``acc = x0.astype(f32);
acc = acc + x1.astype(f32); ...``), divides by k for avg, and rounds once with
``astype`` (numpy for float16, ml_dtypes for bfloat16 / float8).  max / min use
``np.where((acc > x) | isnan(acc), acc, x)``, which is ``np.maximum`` as this
numpy computes it (NaN propagates, ties keep the later operand) written out so
the test does not depend on how a given numpy build orders ±0.

NaN lanes: where the reference is NaN the kernel must be NaN too, but the
payload and sign are not compared for reductions with arithmetic: when both
operands of an add are NaN, x86 returns the first one's payload and LLVM may
commute an fadd, so which NaN survives is unspecified.  Conversions with no
arithmetic (``cast_into``, decode) are compared bit for bit, NaNs included.
"""

from __future__ import annotations

import json
import threading

import ml_dtypes
import numpy as np
import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.hfreduce import kernels
from fireflyer.hfreduce.kernels import (
    OPS,
    SUPPORTED_DTYPES,
    cast_into,
    dtype_from_name,
    reduce_into,
    reduce_range,
)

F32 = np.float32
FLOATS = [dt for dt in SUPPORTED_DTYPES if dt.kind != "i"]
LOWP = [dt for dt in FLOATS if dt != np.float32]
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
N = kernels.BLOCK + 37  # crosses a block boundary and leaves a ragged tail


def _is_int(dt: np.dtype) -> bool:
    return np.dtype(dt).kind == "i"


def reference(inputs: list[np.ndarray], op: str, out_dtype: np.dtype) -> np.ndarray:
    if _is_int(inputs[0].dtype):
        acc = inputs[0].copy()
        for x in inputs[1:]:
            acc = _step(acc, x, op)
        return acc // len(inputs) if op == "avg" else acc
    with np.errstate(all="ignore"):
        acc = inputs[0].astype(F32)
        for x in inputs[1:]:
            acc = _step(acc, x.astype(F32), op)
        if op == "avg":
            acc = acc / F32(len(inputs))
        return acc.astype(out_dtype)


def _step(acc: np.ndarray, x: np.ndarray, op: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op in ("sum", "avg"):
            return acc + x
    nan = np.isnan(acc) if acc.dtype.kind == "f" else np.zeros(acc.shape, bool)
    keep = (acc > x) if op == "max" else (acc < x)
    return np.where(keep | nan, acc, x)


def assert_same(out: np.ndarray, ref: np.ndarray, *, nan_bits: bool = False) -> None:
    assert out.dtype == ref.dtype
    u = UINT[out.dtype.itemsize]
    ob, rb = out.view(u), ref.view(u)
    if out.dtype.kind != "i" and not nan_bits:
        rnan = np.isnan(ref.astype(F32))
        onan = np.isnan(out.astype(F32))
        bad = np.flatnonzero(rnan != onan)
        assert bad.size == 0, f"NaN-ness differs at {bad[:5]}: out={out[bad[:5]]} ref={ref[bad[:5]]}"
        ob, rb = ob[~rnan], rb[~rnan]
    bad = np.flatnonzero(ob != rb)
    assert bad.size == 0, f"{bad.size} lanes differ, first {bad[:5]}: out={ob[bad[:5]]} ref={rb[bad[:5]]}"


def random_inputs(dt: np.dtype, k: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if _is_int(dt):
        info = np.iinfo(dt)
        return [rng.integers(info.min, info.max, n, dtype=dt, endpoint=True) for _ in range(k)]
    if dt.itemsize < 4:
        # random bit patterns: every code of the format, NaN/Inf/subnormals included
        return [rng.integers(0, 1 << (8 * dt.itemsize), n).astype(UINT[dt.itemsize]).view(dt) for _ in range(k)]
    # float32: mostly ordinary values (so sums mean something) plus random bit patterns
    xs = []
    for _ in range(k):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(F32)
        pick = rng.random(n) < 0.05
        x[pick] = rng.integers(0, 1 << 32, int(pick.sum()), dtype=np.uint64).astype(np.uint32).view(F32)
        xs.append(x)
    return xs


@pytest.mark.parametrize("k", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=str)
def test_random_bit_exact(dt: np.dtype, op: str, k: int) -> None:
    xs = random_inputs(dt, k, N, seed=k * 31 + OPS.index(op))
    out = np.empty(N, dt)
    assert reduce_into(out, xs, op) is out
    assert_same(out, reference(xs, op, dt))


@pytest.mark.parametrize("dt", LOWP, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_low_precision_into_float32_partials(dt: np.dtype, op: str) -> None:
    xs = random_inputs(dt, 5, N, seed=7)
    out = np.empty(N, F32)
    reduce_into(out, xs, op)
    assert_same(out, reference(xs, op, np.dtype(F32)))


@pytest.mark.parametrize("dt", LOWP, ids=str)
def test_float32_partials_into_low_precision(dt: np.dtype) -> None:
    xs = random_inputs(np.dtype(F32), 3, N, seed=11)
    out = np.empty(N, dt)
    reduce_into(out, xs, "sum")
    assert_same(out, reference(xs, "sum", dt))


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_cast_from_float32_rne_bits_exact_with_nan_payloads(dt: np.dtype) -> None:
    rng = np.random.default_rng(3)
    src = rng.integers(0, 1 << 32, 300_000, dtype=np.uint64).astype(np.uint32).view(F32)
    # plus every float32 whose top 16 bits are arbitrary and low bits at the rounding edges
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    edges = np.concatenate([hi | low for low in (0, 0x7FFF, 0x8000, 0x8001, 0x0FFF, 0x1000, 0x1001,
                                                 0x0800, 0xFFFF)]).view(F32)
    for s in (src, edges):
        out = np.empty(s.size, dt)
        cast_into(out, s)
        with np.errstate(all="ignore"):
            ref = s.astype(dt)
        assert_same(out, ref, nan_bits=True)


@pytest.mark.parametrize("dt", LOWP, ids=str)
def test_decode_every_code_exactly(dt: np.dtype) -> None:
    u = UINT[dt.itemsize]
    codes = np.arange(1 << (8 * dt.itemsize), dtype=np.uint64).astype(u).view(dt)
    out = np.empty(codes.size, F32)
    cast_into(out, codes)
    assert_same(out, codes.astype(F32), nan_bits=True)
    back = np.empty(codes.size, dt)  # round trip through the kernel: lowp -> lowp
    cast_into(back, codes)
    with np.errstate(all="ignore"):
        ref = codes.astype(F32).astype(dt)
    assert_same(back, ref, nan_bits=True)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_special_values(dt: np.dtype) -> None:
    fi = ml_dtypes.finfo(dt)
    big, tiny, sub = F32(fi.max), F32(fi.smallest_normal), F32(fi.smallest_subnormal)
    a = np.array([np.nan, -np.nan, np.inf, -np.inf, np.inf, 0.0, -0.0, -0.0, big, -big, big,
                  sub, -sub, tiny, sub, 1.0, -1.0, sub * 3, tiny - sub, 0.0], F32)
    b = np.array([1.0, 2.0, 1.0, 1.0, -np.inf, -0.0, 0.0, -0.0, big, -big, -big,
                  sub, sub, -tiny, -sub, -1.0, np.nan, sub, sub, -np.inf], F32)
    with np.errstate(all="ignore"):
        xs = [a.astype(dt), b.astype(dt)]
    for op in OPS:
        out = np.empty(a.size, dt)
        reduce_into(out, xs, op)
        assert_same(out, reference(xs, op, dt))
    out = np.empty(a.size, dt)
    reduce_into(out, xs, "sum")
    r = out.astype(F32)
    assert np.isnan(r[0]) and np.isnan(r[4]) and np.isnan(r[16])  # NaN stays NaN; inf - inf is NaN
    if dt == ml_dtypes.float8_e4m3fn:
        assert np.isnan(r[2]) and np.isnan(r[3])  # Inf inputs are already NaN in e4m3fn
    else:
        assert r[2] == np.inf and r[3] == -np.inf
    assert str(r[5]) == "0.0" and str(r[7]) == "-0.0"  # -0 + 0 = +0, -0 + -0 = -0
    if dt == ml_dtypes.float8_e4m3fn:
        assert np.isnan(r[8]) and np.isnan(r[9])  # no Inf in e4m3fn: overflow is NaN
    else:
        assert r[8] == np.inf and r[9] == -np.inf  # overflow saturates to Inf


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_integer_wraps_and_avg_floors(dt: type) -> None:
    info = np.iinfo(dt)
    xs = [np.array([info.max, info.min, -7, 7, -8, 5], dt), np.array([1, -1, 0, 0, 0, 0], dt),
          np.array([0, 0, 0, 0, 0, 1], dt)]
    out = np.empty(6, dt)
    reduce_into(out, xs, "sum")
    assert out.tolist() == [info.min, info.max, -7, 7, -8, 6]
    reduce_into(out, xs, "avg")
    assert out.tolist() == [info.min // 3, info.max // 3, -3, 2, -3, 2]  # floor, like np.floor_divide
    assert_same(out, reference(xs, "avg", np.dtype(dt)))


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16, np.int64], ids=str)
def test_deterministic_across_thread_counts_and_runs(dt: type) -> None:
    n = 1_500_003
    xs = random_inputs(np.dtype(dt), 3, n, seed=5)
    outs = []
    for threads in (1, 2, 3, 1):
        out = np.empty(n, dt)
        reduce_into(out, xs, "sum", threads=threads)
        outs.append(out.view(UINT[out.dtype.itemsize]))
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    assert_same(outs[0].view(dt), reference(xs, "sum", np.dtype(dt)))


def test_concurrent_callers_from_python_threads() -> None:
    n = 600_000
    xs = random_inputs(np.dtype(F32), 4, n, seed=9)
    ref = reference(xs, "sum", np.dtype(F32))
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                out = np.empty(n, F32)
                reduce_into(out, xs, "sum", threads=2)
                assert_same(out, ref)
                out2 = np.empty(n, F32)
                reduce_range(out2, xs, "sum", 0, n)
                assert_same(out2, ref)
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("dt", [np.float32, np.float16, ml_dtypes.float8_e5m2, np.int32], ids=str)
@pytest.mark.parametrize("pos", [0, 2])
def test_out_may_alias_an_input(dt: type, pos: int) -> None:
    xs = random_inputs(np.dtype(dt), 5, N, seed=13)
    ref = reference(xs, "sum", np.dtype(dt))
    reduce_into(xs[pos], xs, "sum")
    assert_same(xs[pos], ref)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 12])
def test_big_float32_sum_non_temporal_path(k: int) -> None:
    # out at least _STREAM_MIN_BYTES: the float32 sum takes the non-temporal store path; odd
    # element offsets make out and the inputs start off a 64-byte boundary (scalar head / tail)
    n = kernels._STREAM_MIN_BYTES // 4 + 1000 + 37
    rng = np.random.default_rng(k)
    xs = [rng.standard_normal(n + 3, dtype=F32)[i % 3:i % 3 + n] for i in range(k)]
    ref = reference(xs, "sum", np.dtype(F32))
    for off in (0, 1):
        out = np.empty(n + 1, F32)[off:off + n]
        for threads in (1, 2):
            out[...] = np.nan
            reduce_into(out, xs, "sum", threads=threads)
            assert_same(out, ref)
    reduce_into(xs[k - 1], xs, "sum")  # in place into the last input (read in the same pass)
    assert_same(xs[k - 1], ref)


@pytest.mark.parametrize("k", [8, 9, 13, 16])
@pytest.mark.parametrize("block", [16, 1000, 4096, 1 << 16])
def test_non_temporal_sum_is_the_same_for_every_block_length(block: int, k: int) -> None:
    # the block is the machine's (stream_block); whatever it is, the bits are the reference's,
    # with ragged last blocks and an out that starts off a 64-byte boundary; k = 8 is one pass,
    # 9, 13 and 16 fold the first inputs into the accumulators (one, two and two passes) first
    n = 3 * 4096 + 37
    xs = random_inputs(np.dtype(F32), k, n, seed=block + k)
    ref = reference(xs, "sum", np.dtype(F32))
    out = np.empty(n + 1, F32)[1:]
    out[...] = np.nan
    addrs = np.array([x.ctypes.data for x in xs], dtype=np.int64)
    acc = (np.full(block, np.nan, F32), np.full(block, np.nan, F32))
    kernels._reduce_stream(out.ctypes.data, addrs, 0, n, *acc)
    assert_same(out, ref)
    out[...] = np.nan
    kernels._reduce_stream(out.ctypes.data, addrs, 5, n - 3, *acc)
    assert_same(out[5:n - 3], ref[5:n - 3])
    assert np.isnan(out[:5]).all() and np.isnan(out[n - 3:]).all()


@pytest.mark.parametrize(("l2", "block"), [
    (1 << 20, 1 << 16),  # two 256 KiB accumulators: half of a 1 MiB L2
    (2 << 20, 1 << 16),  # capped
    (512 << 10, 1 << 15),
    (768 << 10, 1 << 15),  # rounded down to a power of two
    (256 << 10, 1 << 14),
    (32 << 10, 1 << 14),  # floor
    (None, 1 << 14),  # unknown
    (0, 1 << 14),
])
def test_stream_block_fills_half_of_l2(l2: int | None, block: int) -> None:
    assert kernels.stream_block(l2) == block


def test_reduce_range_touches_only_its_range() -> None:
    xs = random_inputs(np.dtype(F32), 3, N, seed=17)
    out = np.full(N, 7.0, F32)
    reduce_range(out, xs, "max", 100, N - 5)
    ref = reference(xs, "max", np.dtype(F32))
    assert_same(out[100:N - 5], ref[100:N - 5])
    assert (out[:100] == 7.0).all() and (out[N - 5:] == 7.0).all()
    with pytest.raises(InvalidArgument) as ei:
        reduce_range(out, xs, "sum", 5, N + 1)
    assert ei.value.argument == "start"


def test_dtype_names() -> None:
    assert dtype_from_name("fp32") == np.float32 == dtype_from_name("float32")
    assert dtype_from_name("bf16") == ml_dtypes.bfloat16 == dtype_from_name("bfloat16")
    assert dtype_from_name("fp8_e4m3") == ml_dtypes.float8_e4m3fn
    assert dtype_from_name("fp8_e5m2") == ml_dtypes.float8_e5m2 == dtype_from_name(ml_dtypes.float8_e5m2)
    assert dtype_from_name("FP16") == np.float16
    for bad in ("fp64", np.float64):
        with pytest.raises(InvalidArgument):
            dtype_from_name(bad)


def _bad_cases() -> list[tuple[str, object, object, object, str]]:
    a = np.zeros(10, F32)
    b = np.zeros(10, F32)
    return [
        ("length", a, [b, np.zeros(9, F32)], "sum", "inputs[1]"),
        ("dtype", a, [b, np.zeros(10, np.float16)], "sum", "inputs[1]"),
        ("k0", a, [], "sum", "inputs"),
        ("k17", a, [b] * 17, "sum", "inputs"),
        ("op", a, [b], "prod", "op"),
        ("noncontig-in", a, [b, np.zeros(20, F32)[::2]], "sum", "inputs[1]"),
        ("noncontig-out", np.zeros(20, F32)[::2], [b], "sum", "out"),
        ("2d", np.zeros((2, 5), F32), [b], "sum", "out"),
        ("readonly", np.frombuffer(bytes(40), F32), [b], "sum", "out"),
        ("not-array", [0.0] * 10, [b], "sum", "out"),
        ("unsupported", np.zeros(10, np.float64), [np.zeros(10, np.float64)], "sum", "out"),
        ("int-out-float-in", np.zeros(10, np.int32), [b], "sum", "out"),
        ("overlap", a[1:], [a[:-1]], "sum", "out"),
        ("inputs-array", a, np.zeros((2, 10), F32), "sum", "inputs"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_names_the_argument(case: tuple[str, object, object, object, str]) -> None:
    _, out, inputs, op, argument = case
    with pytest.raises(InvalidArgument) as ei:
        reduce_into(out, inputs, op)  # type: ignore[arg-type]
    assert ei.value.argument == argument, ei.value


def test_bad_threads_and_cast_of_ints() -> None:
    a = np.zeros(4, F32)
    with pytest.raises(InvalidArgument) as ei:
        reduce_into(a, [a], threads=0)
    assert ei.value.argument == "threads"
    with pytest.raises(InvalidArgument) as ei:
        cast_into(np.zeros(4, np.int32), a)
    assert ei.value.argument == "out"


def _kernel_path(monkeypatch: pytest.MonkeyPatch, out: np.ndarray, xs: list[np.ndarray], op: str) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(kernels, "SMALL_ELEMS", -1)
        return reduce_into(out, xs, op)


@pytest.mark.parametrize("dt", [np.float32, np.int32, np.int64], ids=str)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_small_calls_match_the_kernels_bit_for_bit(monkeypatch: pytest.MonkeyPatch, dt: type, op: str) -> None:
    """Small same-dtype calls run in numpy (_reduce_small): same bits as the kernels, NaN payloads,
    -0.0 / +0.0 ties and every alias of out included."""
    dt = np.dtype(dt)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3e38, -3e38, 1e-45], F32)
    payload = np.array([0x7FC00001, 0xFFC12345, 0x7F800001], np.uint32).view(F32)  # NaNs with payloads
    for n in (0, 1, 7, 64, kernels.SMALL_ELEMS):
        for k in (1, 2, 3, 5):
            xs = random_inputs(dt, k, n, seed=n * 7 + k)
            sp = np.concatenate([special, payload])
            if dt == F32 and n >= sp.size ** 2 and k >= 2:
                xs[0][:sp.size ** 2] = np.repeat(sp, sp.size)  # every special against every special
                xs[1][:sp.size ** 2] = np.tile(sp, sp.size)
                for x in xs[2:]:
                    x[:sp.size ** 2] = np.random.default_rng(n + k).choice(sp, sp.size ** 2)
            for alias in (None, *sorted({0, 1, k - 1} & set(range(k)))):
                ins = [x.copy() for x in xs]
                out = np.full(n, 5, dt) if alias is None else ins[alias]
                assert kernels._reduce_small(out, ins, op) or n > kernels.SMALL_ELEMS
                ins2 = [x.copy() for x in xs]
                want = _kernel_path(monkeypatch, np.full(n, 5, dt) if alias is None else ins2[alias], ins2, op)
                assert out.view(UINT[dt.itemsize]).tolist() == want.view(UINT[dt.itemsize]).tolist(), (n, k, alias)


def test_small_path_leaves_odd_calls_to_the_kernels() -> None:
    a = np.zeros(8, F32)
    assert not kernels._reduce_small(a[1:], [a[:-1]], "sum")  # partial overlap: the kernel path raises
    assert not kernels._reduce_small(a, [a], "avg")  # avg divides: kernel path
    assert not kernels._reduce_small(np.zeros(8, np.float16), [np.zeros(8, np.float16)], "sum")
    assert not kernels._reduce_small(np.zeros(kernels.SMALL_ELEMS + 1, F32), [np.zeros(kernels.SMALL_ELEMS + 1, F32)],
                                     "sum")
    assert kernels._reduce_small(a, [np.ones(8, F32)], "sum") and (a == 1).all()


def test_small_path_is_as_quiet_as_the_kernels_on_overflow_and_inf_minus_inf() -> None:
    import warnings

    out = np.empty(2, F32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's RuntimeWarning would reach the worker's log per op
        reduce_into(out, [np.array([3e38, np.inf], F32), np.array([3e38, -np.inf], F32)], "sum")
    assert out[0] == np.inf and np.isnan(out[1])


@pytest.mark.parametrize(("nchunks", "parts"), [(0, 2), (1, 3), (7, 1), (50, 3)])
def test_share_chunks_runs_every_chunk_once_on_at_most_parts_workers(nchunks: int, parts: int) -> None:
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def run(worker: int, chunk: int) -> None:
        with lock:
            seen.append((worker, chunk))

    kernels._share_chunks(nchunks, parts, run)
    assert sorted(c for _, c in seen) == list(range(nchunks))
    assert {w for w, _ in seen} <= set(range(parts))


def test_share_chunks_raises_a_workers_error_after_the_others_finish() -> None:
    done: list[int] = []

    def run(worker: int, chunk: int) -> None:
        if chunk == 3:
            raise ValueError("chunk 3 failed")
        done.append(chunk)

    with pytest.raises(ValueError, match="chunk 3 failed"):
        kernels._share_chunks(20, 3, run)
    assert sorted(done) == [c for c in range(20) if c != 3]  # the other workers took the rest


_SIGNATURES = """
import json
from numba import typeof
from fireflyer.hfreduce import kernels, precompile
precompile.main()
print(json.dumps({
    "typed": sorted(str(s[0]) for s in kernels._reduce_typed.signatures),
    "tags": sorted(str(typeof(t)) for t in kernels._TAGS.values()),
    "int": len(kernels._reduce_int.signatures),
    "stream": len(kernels._reduce_stream.signatures),
    "nt": kernels._NT_STORES,
}))
"""


def test_precompile_reaches_every_kernel_specialization() -> None:
    """``make setup``'s precompile step (in a fresh process, so nothing else compiled them first)
    leaves a specialization of every kernel that a process can reach: one per input format, the
    integer kernel and the streaming float32 sum."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SIGNATURES], capture_output=True, text=True, timeout=110, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("hfreduce reduce kernels compiled or loaded in "), out.stdout
    assert lines[1].startswith("hfreduce block loops compiled or loaded in "), out.stdout
    got = json.loads(lines[-1])
    assert got["typed"] == got["tags"] and len(got["tags"]) == 5, got
    assert got["int"] == 1, got
    assert got["stream"] == (1 if got["nt"] else 0), got
