"""Shared-memory segments: sharing, unlink-after-map hand-over, stale sweeping."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fireflyer.hfreduce import shm
from fireflyer.hfreduce.shm import SHM_DIR, Segment, list_segments, page_round, sweep_stale


def test_shm_create_attach_share_then_unlink_leaves_nothing() -> None:
    a = Segment.create(1000)
    assert a.nbytes == page_round(1000) and a.name in list_segments()
    b = Segment.attach(a.name, a.nbytes)
    b.unlink()  # the worker unlinks as soon as it has mapped
    assert a.name not in list_segments()
    x = a.array(np.float32, 10, offset=16)
    y = b.array(np.float32, 10, offset=16)
    x[:] = np.arange(10)
    assert np.array_equal(y, np.arange(10))  # still shared after the unlink
    assert a.contains(int(x.ctypes.data), x.nbytes) and not a.contains(a.address + a.nbytes, 1)
    with pytest.raises(ValueError):
        a.array(np.float32, a.nbytes, offset=0)
    del x, y
    a.close()
    b.close()


def test_shm_array_reuses_the_last_view_only_for_the_same_request() -> None:
    a = Segment.create(4096)
    try:
        f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
        x = a.array(f32, 8, 64)
        assert a.array(f32, 8, 64) is x  # the same request: the same view
        x[:] = 1.5
        for other in (a.array(i32, 8, 64), a.array(f32, 4, 64), a.array(f32, 8, 96)):
            assert other is not x
        y = a.array(i32, 8, 64)  # a different dtype over the same bytes sees them as that dtype
        assert y.dtype == i32 and np.array_equal(y, np.full(8, np.float32(1.5)).view(np.int32))
        assert a.array(f32, 8, 96).ctypes.data == x.ctypes.data + 32
        with pytest.raises(ValueError):  # a bad range is still refused, never served from the cache
            a.array(f32, 4096, 0)
        del x, y
    finally:
        a.unlink()
        a.close()
    with pytest.raises(ValueError, match="closed"):  # closing forgets the cached view too
        a.array(np.dtype(np.float32), 8, 96)


def test_shm_attach_checks_name_and_size() -> None:
    with pytest.raises(ValueError):
        Segment.attach("../etc/passwd", 10)
    a = Segment.create(10)
    try:
        with pytest.raises(ValueError):
            Segment.attach(a.name, a.nbytes + 1)
    finally:
        a.unlink()
        a.close()


def test_shm_sweep_removes_segments_of_dead_processes() -> None:
    code = "from fireflyer.hfreduce.shm import Segment; print(Segment.create(10).name)"
    name = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.strip()
    mine = Segment.create(10)
    try:
        assert name in list_segments()
        removed = sweep_stale()
        assert name in removed and name not in list_segments()
        assert mine.name in list_segments()  # our own pid is alive
    finally:
        mine.unlink()
        mine.close()
    assert not (SHM_DIR / name).exists()
    assert shm.PREFIX == "ffhr-"
