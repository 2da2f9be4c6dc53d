"""Bit-exact scalar conversions between float32 and the low-precision formats.

Numba's CPU target has no float16 arithmetic and knows nothing of bfloat16 or
float8, so the kernels keep those buffers as ``uint16`` / ``uint8`` and convert
in registers with the functions below.  They are written branch-free in spirit
(both sides of every ``x if c else y`` are cheap and side-effect free) so LLVM
can if-convert them into vector selects and vectorize the loops that call them.

The reference is what numpy / ml_dtypes do, bit for bit:

* **decode** (format -> float32) is exact.  Subnormals are rebuilt as
  ``float32(mantissa) * 2**-k`` rather than by multiplying a denormal float32 by a
  power of two, which would hit the slow microcode assist Intel CPUs take on
  denormal operands.  NaN: float16 keeps its payload without quieting (numpy's
  software conversion); bfloat16 is a plain shift; the float8 NaNs decode to the
  canonical quiet NaN with the sign (ml_dtypes).
* **encode** (float32 -> format) rounds to nearest even.  Normal results round the
  float32 bit pattern as an integer (add half an ulp minus one plus the kept lsb,
  shift); results below the format's smallest normal use the "magic add": adding
  ``M = 2**(emin + 23 - mbits)`` makes the FPU round ``|x|`` to the subnormal ulp
  (the FPU's own round-to-nearest-even), and ``bits(|x| + M) - bits(M)`` is the
  subnormal code.  Overflow follows the format: float16 / bfloat16 / e5m2
  become Inf; e4m3fn, which has no Inf, becomes NaN (0x7f) as ml_dtypes does.
  NaN: float16 keeps the top payload bits (forced non-zero, numpy); bfloat16 and
  float8 become the canonical quiet NaN with the sign (ml_dtypes).

All integer work is done in 32-bit lanes (``_u`` below): numba would otherwise
widen every operation with an integer literal to int64, which halves the lanes per
vector register and, measured on the AVX-512 CI machine, doubles the cost of a
decode.  ``_u(...)`` casts are free (LLVM folds the zext/trunc pairs).

Both rely on the default floating-point environment (round to nearest, no
flush-to-zero / denormals-are-zero), which numba keeps when ``fastmath`` is off.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jitcache import drop_stale

# Format codes shared with ``kernels`` (runtime ints, so one compiled kernel
# serves every dtype instead of one specialization per dtype).
F32 = 0
F16 = 1
BF16 = 2
E4M3 = 3
E5M2 = 4
I32 = 5
I64 = 6

_u = np.uint32
_F32 = np.float32


@njit(cache=True)
def f32_bits(x: float) -> int:
    return _F32(x).view(_u)


@njit(cache=True)
def bits_f32(u: int) -> float:
    return _u(u).view(_F32)


@njit(cache=True)
def _sel(c: bool, a: int, b: int) -> int:
    """``a if c else b`` on uint32 (both sides already computed: a vector select)."""
    return _u(a) if c else _u(b)


# ---------------------------------------------------------------- decode


@njit(cache=True)
def dec_f16(h: int) -> float:
    h = _u(_u(h) & _u(0xFFFF))
    s = _u(_u(h & _u(0x8000)) << _u(16))
    e = _u(h & _u(0x7C00))
    nb = _u(_u(_u(h & _u(0x7FFF)) << _u(13)) + _u(0x38000000))  # rebias 15 -> 127
    nb = _sel(e == _u(0x7C00), _u(nb + _u(0x38000000)), nb)  # Inf/NaN: exponent to 255, payload kept
    sb = f32_bits(_F32(h & _u(0x3FF)) * _F32(2.0**-24))
    return bits_f32(_u(_sel(e == _u(0), sb, nb) | s))


@njit(cache=True)
def dec_bf16(h: int) -> float:
    return bits_f32(_u(_u(_u(h) & _u(0xFFFF)) << _u(16)))


@njit(cache=True)
def dec_e4m3(v: int) -> float:
    v = _u(_u(v) & _u(0xFF))
    s = _u(_u(v & _u(0x80)) << _u(24))
    em = _u(v & _u(0x7F))
    nb = _u(_u(em << _u(20)) + _u(0x3C000000))  # rebias 7 -> 127
    sb = f32_bits(_F32(em & _u(7)) * _F32(2.0**-9))
    b = _sel(em < _u(8), sb, nb)
    b = _sel(em == _u(0x7F), _u(0x7FC00000), b)
    return bits_f32(_u(b | s))


@njit(cache=True)
def dec_e5m2(v: int) -> float:
    v = _u(_u(v) & _u(0xFF))
    s = _u(_u(v & _u(0x80)) << _u(24))
    em = _u(v & _u(0x7F))
    nb = _u(_u(em << _u(21)) + _u(0x38000000))  # rebias 15 -> 127
    special = _sel(em == _u(0x7C), _u(0x7F800000), _u(0x7FC00000))
    nb = _sel(em >= _u(0x7C), special, nb)
    sb = f32_bits(_F32(em & _u(3)) * _F32(2.0**-16))
    b = _sel(em < _u(4), sb, nb)
    return bits_f32(_u(b | s))


# ---------------------------------------------------------------- encode
# Each ``norm`` below may wrap around in uint32 for inputs that select another
# branch (subnormal, NaN); the selected value never does.


@njit(cache=True)
def enc_f16(x: float) -> int:
    u = f32_bits(x)
    s = _u(_u(u >> _u(16)) & _u(0x8000))
    a = _u(u & _u(0x7FFFFFFF))
    lsb = _u(_u(a >> _u(13)) & _u(1))
    norm = _u(_u(_u(a + _u(0xFFF)) + lsb) >> _u(13)) - _u(0x1C000)
    norm = min(_u(norm), _u(0x7C00))
    sub = _u(f32_bits(bits_f32(a) + _F32(0.5)) - _u(0x3F000000))
    c = _sel(a < _u(0x38800000), sub, norm)  # below 2**-14: subnormal
    nan = _u(_u(0x7C00) | max(_u(_u(a >> _u(13)) & _u(0x3FF)), _u(1)))
    c = _sel(a > _u(0x7F800000), nan, c)
    return _u(c | s)


@njit(cache=True)
def enc_bf16(x: float) -> int:
    u = f32_bits(x)
    lsb = _u(_u(u >> _u(16)) & _u(1))
    r = _u(_u(_u(_u(u + _u(0x7FFF)) + lsb) >> _u(16)) & _u(0xFFFF))
    nan = _u(_u(_u(u >> _u(16)) & _u(0x8000)) | _u(0x7FC0))
    return _sel(_u(u & _u(0x7FFFFFFF)) > _u(0x7F800000), nan, r)


@njit(cache=True)
def enc_e4m3(x: float) -> int:
    u = f32_bits(x)
    s = _u(_u(u >> _u(24)) & _u(0x80))
    a = _u(u & _u(0x7FFFFFFF))
    # Inf, NaN and every overflow land at or above 0x7f after rounding: NaN.
    lsb = _u(_u(a >> _u(20)) & _u(1))
    norm = min(_u(_u(_u(_u(a + _u(0x7FFFF)) + lsb) >> _u(20)) - _u(960)), _u(0x7F))
    sub = _u(f32_bits(bits_f32(a) + _F32(16384.0)) - _u(0x46800000))
    c = _sel(a < _u(0x3C800000), sub, norm)  # below 2**-6: subnormal
    return _u(c | s)


@njit(cache=True)
def enc_e5m2(x: float) -> int:
    u = f32_bits(x)
    s = _u(_u(u >> _u(24)) & _u(0x80))
    a = _u(u & _u(0x7FFFFFFF))
    lsb = _u(_u(a >> _u(21)) & _u(1))
    norm = min(_u(_u(_u(_u(a + _u(0xFFFFF)) + lsb) >> _u(21)) - _u(448)), _u(0x7C))
    sub = _u(f32_bits(bits_f32(a) + _F32(128.0)) - _u(0x43000000))
    c = _sel(a < _u(0x38800000), sub, norm)  # below 2**-14: subnormal
    c = _sel(a > _u(0x7F800000), _u(0x7E), c)
    return _u(c | s)


#: the sources this module's jitted code is compiled from (:mod:`.jitcache`)
JIT_SOURCES = (__file__,)
drop_stale(__file__, f32_bits, JIT_SOURCES)
