"""Memory: STREAM-like bandwidth (triad) and pattern tests that name the bad address.

Bandwidth: ``a = b + s*c`` over float64 arrays, best of ``repeats``; 24 bytes move per element
(two reads, one write), the STREAM convention.  Pattern tests over a uint64 buffer, as memtest86
does them: *walking ones* (each of the 64 bits alone, in every word), *address in address* (each
word holds its own address: catches aliased or swapped address lines), *moving inversions* (fill
with a pattern, then block by block ascending: verify, write the complement; descending: verify the
complement, write the pattern back).  A mismatch reports the word's virtual address, its offset in
the buffer, the expected and read values and the bits that differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import numpy as np

from .result import Baseline, CheckResult, Status, slow_down

__all__ = ["BW_INJECTIONS", "PATTERN_INJECTIONS", "BW_METRIC", "BitFlip", "Mismatch", "check_memory_bandwidth",
           "check_memory_pattern", "pattern_tests"]

BW_INJECTIONS = ("slow",)
PATTERN_INJECTIONS = ("bitflip",)
BW_METRIC = "mem_triad_gbps"


def check_memory_bandwidth(baseline: Baseline, *, mib: int = 64, repeats: int = 5, inject: str = "") -> CheckResult:
    """Triad over three arrays of ``mib`` MiB each (make them larger than the last-level cache)."""
    if inject and inject not in BW_INJECTIONS:
        raise ValueError(f"check_memory_bandwidth: unknown injection {inject!r}; known: {', '.join(BW_INJECTIONS)}")
    n = max(1, mib * (1 << 20) // 8)
    b = np.arange(n, dtype=np.float64)
    c = np.full(n, 2.0)
    a = np.empty(n)
    s = 3.0
    best = float("inf")
    t_all = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.multiply(c, s, out=a)
        np.add(a, b, out=a)
        dt = time.perf_counter() - t0
        if inject == "slow":  # memory at a twentieth of its speed (channels lost, say)
            dt = slow_down(dt, baseline.expected_s(BW_METRIC, 24 * n / 1e9))
        best = min(best, dt)
    wall = time.perf_counter() - t_all
    idx = np.linspace(0, n - 1, num=min(n, 1024), dtype=np.int64)
    correct = bool(np.array_equal(a[idx], b[idx] + s * c[idx]))
    gbps = 24 * n / best / 1e9
    ok, ev = baseline.judge(BW_METRIC, gbps)
    evidence = {**ev, "bytes_per_pass": 24 * n, "best_s": best, "repeats": repeats}
    if not correct:
        return CheckResult("memory_bandwidth", Status.FAIL, "triad result is wrong", evidence, wall, inject)
    if not ok:
        return CheckResult("memory_bandwidth", Status.FAIL, f"triad {gbps:.2f} GB/s < {ev['threshold']:.2f} GB/s "
                           f"({baseline.fraction:.0%} of the baseline)", evidence, wall, inject)
    return CheckResult("memory_bandwidth", Status.PASS, f"triad {gbps:.2f} GB/s", evidence, wall, inject)


class BitFlip(msgspec.Struct, frozen=True):
    """A fault to inject: flip ``bit`` of word ``word`` after the test writes and before it verifies."""

    word: int
    bit: int = 13


class Mismatch(msgspec.Struct, frozen=True):
    test: str
    offset: int
    address: int
    expected: int
    got: int

    @property
    def bits(self) -> int:
        return self.expected ^ self.got


Hook = Callable[[np.ndarray], None]


def _verify(test: str, buf: np.ndarray, want: np.ndarray | np.uint64, start: int = 0) -> Mismatch | None:
    bad = np.flatnonzero(buf != want)
    if not bad.size:
        return None
    i = int(bad[0])
    expected = int(want if np.ndim(want) == 0 else want[i])
    base = buf.__array_interface__["data"][0]
    return Mismatch(test, (start + i) * 8, base + i * 8, expected, int(buf[i]))


def _walking_ones(buf: np.ndarray, hook: Hook) -> Mismatch | None:
    for bit in range(64):
        pattern = np.uint64(1 << bit)
        buf.fill(pattern)
        hook(buf)
        m = _verify(f"walking ones (bit {bit})", buf, pattern)
        if m:
            return m
    return None


def _address_in_address(buf: np.ndarray, hook: Hook) -> Mismatch | None:
    base = buf.__array_interface__["data"][0]
    want = np.uint64(base) + np.arange(buf.size, dtype=np.uint64) * np.uint64(8)
    buf[:] = want
    hook(buf)
    return _verify("address in address", buf, want)


def _moving_inversions(buf: np.ndarray, hook: Hook, block: int = 4096) -> Mismatch | None:
    for pattern in (np.uint64(0), np.uint64(0x5555555555555555)):
        inv = ~pattern
        buf.fill(pattern)
        hook(buf)
        starts = range(0, buf.size, block)
        for s in starts:  # ascending: verify the pattern, write its complement
            view = buf[s:s + block]
            m = _verify("moving inversions (up)", view, pattern, s)
            if m:
                return msgspec.structs.replace(m, address=buf.__array_interface__["data"][0] + m.offset)
            view[:] = inv
        hook(buf)
        for s in reversed(starts):  # descending: verify the complement, write the pattern back
            view = buf[s:s + block]
            m = _verify("moving inversions (down)", view, inv, s)
            if m:
                return msgspec.structs.replace(m, address=buf.__array_interface__["data"][0] + m.offset)
            view[:] = pattern
    return None


def pattern_tests() -> dict[str, Callable[[np.ndarray, Hook], Mismatch | None]]:
    return {"walking_ones": _walking_ones, "address_in_address": _address_in_address,
            "moving_inversions": _moving_inversions}


def check_memory_pattern(*, mib: float = 16, tests: tuple[str, ...] = ("walking_ones", "address_in_address",
                                                                       "moving_inversions"),
                         inject: str | BitFlip = "") -> CheckResult:
    """Run the pattern ``tests`` over a buffer of ``mib`` MiB.  ``inject="bitflip"`` (or a
    :class:`BitFlip`) flips one bit between every write and its verification."""
    if isinstance(inject, str) and inject and inject not in PATTERN_INJECTIONS:
        raise ValueError(f"check_memory_pattern: unknown injection {inject!r}; known: {', '.join(PATTERN_INJECTIONS)}")
    words = max(64, int(mib * (1 << 20)) // 8)
    flip = inject if isinstance(inject, BitFlip) else BitFlip(word=words // 3) if inject else None
    if flip is not None and not 0 <= flip.word < words:
        raise ValueError(f"check_memory_pattern: BitFlip word {flip.word} is outside the {words}-word buffer")

    def hook(buf: np.ndarray) -> None:
        if flip is not None:
            buf[flip.word] ^= np.uint64(1 << flip.bit)

    buf = np.empty(words, dtype=np.uint64)
    t0 = time.perf_counter()
    table = pattern_tests()
    done = []
    for name in tests:
        m = table[name](buf, hook)
        if m is not None:
            evidence = {"test": m.test, "offset": m.offset, "address": f"{m.address:#x}", "expected": f"{m.expected:#x}",
                        "got": f"{m.got:#x}", "bits": f"{m.bits:#x}", "buffer_bytes": words * 8, "passed": done}
            return CheckResult("memory_pattern", Status.FAIL, f"{m.test}: word at {m.address:#x} (offset {m.offset}) "
                               f"reads {m.got:#x}, wrote {m.expected:#x}", evidence, time.perf_counter() - t0,
                               "bitflip" if flip else "")
        done.append(name)
    return CheckResult("memory_pattern", Status.PASS, f"{', '.join(done)} clean over {words * 8} bytes",
                       {"buffer_bytes": words * 8, "passed": done}, time.perf_counter() - t0, "bitflip" if flip else "")
