"""Storage bandwidth through 3FS, with read-back verification.

Takes a file-system object with the 3FS client's calls (``fireflyer.fs.FileSystem``, or
:class:`fireflyer.ckpt.localfs.LocalFS` for a local directory): ``mkdir``, ``write_bytes`` (3FS
writes only to existing files, so each file is created empty first), ``batch_write``,
``batch_read`` and, if it has one, ``rmtree`` to clean up.  Each file holds seeded random bytes;
the read-back is compared byte for byte and a difference names the file and offset.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np

from .result import Baseline, CheckResult, Status, slow_down

__all__ = ["INJECTIONS", "WRITE_METRIC", "READ_METRIC", "check_storage"]

INJECTIONS = ("corrupt", "slow")
WRITE_METRIC = "storage_write_mbps"
READ_METRIC = "storage_read_mbps"


def _nbytes(ios: Any) -> int:
    return sum(memoryview(d).nbytes for _, _, d in ios)


class _Injected:
    """The file system with a fault: reads come back with one flipped byte, or writes are slow."""

    def __init__(self, fs: Any, inject: str, baseline: Baseline) -> None:
        self.fs, self.inject, self.baseline = fs, inject, baseline

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def batch_write(self, ios: Any) -> Any:
        t0 = time.perf_counter()
        out = self.fs.batch_write(ios)
        if self.inject == "slow":  # a storage path at a twentieth of its speed
            slow_down(time.perf_counter() - t0, self.baseline.expected_s(WRITE_METRIC, _nbytes(ios) / 1e6))
        return out

    def batch_read(self, ios: Any) -> Any:
        t0 = time.perf_counter()
        out = self.fs.batch_read(ios)
        if self.inject == "slow":
            slow_down(time.perf_counter() - t0, self.baseline.expected_s(READ_METRIC, sum(n for _, _, n in ios) / 1e6))
        if self.inject == "corrupt" and out and getattr(out[0], "error", None) is None:
            data = np.frombuffer(out[0].data, dtype=np.uint8).copy()
            data[len(data) // 2] ^= 0x40  # a flipped bit on the wire or on disk
            out[0].data = memoryview(data)
        return out


def check_storage(fs: Any, baseline: Baseline, *, directory: str = "/health", files: int = 4, mib: float = 4,
                  seed: int = 0, inject: str = "") -> CheckResult:
    """Write ``files`` files of ``mib`` MiB under ``directory``, read them back, compare, remove them."""
    if inject and inject not in INJECTIONS:
        raise ValueError(f"check_storage: unknown injection {inject!r}; known: {', '.join(INJECTIONS)}")
    if inject:
        fs = _Injected(fs, inject, baseline)
    size = max(1, int(mib * (1 << 20)))
    run = f"{directory.rstrip('/')}/check-{uuid.uuid4().hex[:12]}"
    rng = np.random.default_rng(seed)
    blobs = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(files)]
    paths = [f"{run}/f{i}" for i in range(files)]
    t_all = time.perf_counter()
    try:
        fs.mkdir(run, parents=True, exist_ok=True)
        for p in paths:
            fs.write_bytes(p, b"")
        t0 = time.perf_counter()
        wres = fs.batch_write([(p, 0, memoryview(b)) for p, b in zip(paths, blobs, strict=True)])
        t_write = time.perf_counter() - t0
        werr = [(p, r.error) for p, r in zip(paths, wres, strict=True) if getattr(r, "error", None) is not None]
        if werr:
            return CheckResult("storage", Status.FAIL, f"write {werr[0][0]} failed: {werr[0][1]}",
                               {"path": werr[0][0], "failed_writes": len(werr)}, time.perf_counter() - t_all, inject)
        t0 = time.perf_counter()
        rres = fs.batch_read([(p, 0, size) for p in paths])
        t_read = time.perf_counter() - t0
        for p, b, r in zip(paths, blobs, rres, strict=True):
            if getattr(r, "error", None) is not None:
                return CheckResult("storage", Status.FAIL, f"read {p} failed: {r.error}", {"path": p},
                                   time.perf_counter() - t_all, inject)
            got = np.frombuffer(r.data, dtype=np.uint8)
            if got.size != size or not np.array_equal(got, b):
                diff = np.flatnonzero(got[:size] != b[:got.size])
                off = int(diff[0]) if diff.size else min(got.size, size)
                evidence = {"path": p, "offset": off, "expected": int(b[off]) if off < size else None,
                            "got": int(got[off]) if off < got.size else None, "length": int(got.size)}
                return CheckResult("storage", Status.FAIL, f"read-back of {p} differs at offset {off} "
                                   f"(length {got.size} of {size})", evidence, time.perf_counter() - t_all, inject)
    except Exception as e:  # noqa: BLE001 - a file system that cannot be used is the finding
        return CheckResult("storage", Status.ERROR, f"storage check under {run} failed: {e}", {"directory": run},
                           time.perf_counter() - t_all, inject)
    finally:
        rmtree = getattr(fs, "rmtree", None)
        if rmtree is not None:
            try:
                rmtree(run)
            except Exception:  # noqa: BLE001, S110 - cleanup of a check directory must not hide the verdict
                pass
    total = files * size
    write_mbps, read_mbps = total / t_write / 1e6, total / t_read / 1e6
    ok_w, ev_w = baseline.judge(WRITE_METRIC, write_mbps)
    ok_r, ev_r = baseline.judge(READ_METRIC, read_mbps)
    evidence = {"write": ev_w, "read": ev_r, WRITE_METRIC: write_mbps, READ_METRIC: read_mbps, "bytes": total,
                "files": files}
    wall = time.perf_counter() - t_all
    if not (ok_w and ok_r):
        slow = [f"{what} {v:.0f} MB/s < {ev['threshold']:.0f}" for what, v, ok, ev in
                (("write", write_mbps, ok_w, ev_w), ("read", read_mbps, ok_r, ev_r)) if not ok]
        return CheckResult("storage", Status.FAIL, "; ".join(slow) + f" ({baseline.fraction:.0%} of the baseline)",
                           evidence, wall, inject)
    return CheckResult("storage", Status.PASS, f"{files} files of {size} bytes verified; write {write_mbps:.0f} MB/s, "
                       f"read {read_mbps:.0f} MB/s", evidence, wall, inject)
