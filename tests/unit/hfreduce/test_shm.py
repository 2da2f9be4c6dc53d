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
