"""The CUDA path under numba's simulator: device arrays go D2H into shared staging and back.

The ranks run with ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported, in their
environment); the workers are ordinary.  On a real GPU the same code pins the staging
segment and copies on a stream; here the simulator checks plumbing and bits.
"""

from __future__ import annotations

from hfr_cluster import Cluster

from fireflyer.hfreduce.shm import list_segments


def test_client_cuda_device_arrays_under_simulator() -> None:
    c = Cluster(2, 2, chunk="1k", env={"NUMBA_ENABLE_CUDASIM": "1"}).start()
    try:
        res = c.ranks("cuda", timeout_s=60).results()
    finally:
        codes = c.stop()
    assert sorted(res) == [0, 1, 2, 3], res
    for o in res.values():
        assert o["ok"], o
        assert o["ok_sum"], o
        assert o["bcast"] == [0] * 33, o
    assert codes == [0, 0]
    assert list_segments() == []
