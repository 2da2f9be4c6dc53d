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

Both rely on the default floating-point environment (round to nearest, no
flush-to-zero / denormals-are-zero), which numba keeps when ``fastmath`` is off.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Format codes shared with ``kernels`` (runtime ints, so one compiled kernel
# serves every dtype instead of one specialization per dtype).
F32 = 0
F16 = 1
BF16 = 2
E4M3 = 3
E5M2 = 4
I32 = 5
I64 = 6

_U32 = np.uint32
_F32 = np.float32


@njit(cache=True)
def f32_bits(x: float) -> int:
    return _F32(x).view(_U32)


@njit(cache=True)
def bits_f32(u: int) -> float:
    return _U32(u).view(_F32)


# ---------------------------------------------------------------- decode


@njit(cache=True)
def dec_f16(h: int) -> float:
    h = np.int64(h)
    s = (h & 0x8000) << 16
    e = h & 0x7C00
    nb = ((h & 0x7FFF) << 13) + 0x38000000  # rebias 15 -> 127
    nb = nb + 0x38000000 if e == 0x7C00 else nb  # Inf/NaN: exponent to 255, payload kept
    sb = np.int64(f32_bits(_F32(h & 0x3FF) * _F32(2.0**-24)))
    b = sb if e == 0 else nb
    return bits_f32(b | s)


@njit(cache=True)
def dec_bf16(h: int) -> float:
    return bits_f32(np.int64(h) << 16)


@njit(cache=True)
def dec_e4m3(v: int) -> float:
    v = np.int64(v)
    s = (v & 0x80) << 24
    em = v & 0x7F
    nb = (em << 20) + 0x3C000000  # rebias 7 -> 127
    sb = np.int64(f32_bits(_F32(em & 7) * _F32(2.0**-9)))
    b = sb if em < 8 else nb
    b = 0x7FC00000 if em == 0x7F else b
    return bits_f32(b | s)


@njit(cache=True)
def dec_e5m2(v: int) -> float:
    v = np.int64(v)
    s = (v & 0x80) << 24
    em = v & 0x7F
    nb = (em << 21) + 0x38000000  # rebias 15 -> 127
    nb = (0x7F800000 if em == 0x7C else 0x7FC00000) if em >= 0x7C else nb
    sb = np.int64(f32_bits(_F32(em & 3) * _F32(2.0**-16)))
    b = sb if em < 4 else nb
    return bits_f32(b | s)


# ---------------------------------------------------------------- encode


@njit(cache=True)
def enc_f16(x: float) -> int:
    u = np.int64(f32_bits(x))
    s = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    norm = min(((a + 0xFFF + ((a >> 13) & 1)) >> 13) - 0x1C000, 0x7C00)
    sub = np.int64(f32_bits(bits_f32(a) + _F32(0.5))) - 0x3F000000
    c = sub if a < 0x38800000 else norm  # below 2**-14: subnormal
    c = (0x7C00 | max((a >> 13) & 0x3FF, 1)) if a > 0x7F800000 else c
    return c | s


@njit(cache=True)
def enc_bf16(x: float) -> int:
    u = np.int64(f32_bits(x))
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    nan = ((u >> 16) & 0x8000) | 0x7FC0
    return nan if (u & 0x7FFFFFFF) > 0x7F800000 else r


@njit(cache=True)
def enc_e4m3(x: float) -> int:
    u = np.int64(f32_bits(x))
    s = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    # Inf, NaN and every overflow land at or above 0x7f after rounding: NaN.
    norm = min(((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960, 0x7F)
    sub = np.int64(f32_bits(bits_f32(a) + _F32(16384.0))) - 0x46800000
    c = sub if a < 0x3C800000 else norm  # below 2**-6: subnormal
    return c | s


@njit(cache=True)
def enc_e5m2(x: float) -> int:
    u = np.int64(f32_bits(x))
    s = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    norm = min(((a + 0xFFFFF + ((a >> 21) & 1)) >> 21) - 448, 0x7C)
    sub = np.int64(f32_bits(bits_f32(a) + _F32(128.0))) - 0x43000000
    c = sub if a < 0x38800000 else norm  # below 2**-14: subnormal
    c = 0x7E if a > 0x7F800000 else c
    return c | s
