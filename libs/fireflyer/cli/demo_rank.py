"""One rank of ``ff demo``'s allreduce step (run by ``ff launch``; see :mod:`.demo_allreduce`).

Every rank fills a shared-memory buffer with ``rank + 1``, allreduces it (sum) a few
times, checks every element against ``world * (world + 1) / 2`` and prints one line:
``allreduce ok: <n> x float32, sum <s>, best <t> ms``.  A bfloat16 ``avg`` shows the
low-precision path (reduced in float32, rounded once).  Exit code 1 on a wrong result.
"""

from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

COUNT = 1 << 20  # 4 MiB of float32


def main() -> int:
    from fireflyer import hfreduce

    comm = hfreduce.init()
    try:
        world, rank = comm.world_size, comm.rank
        want = world * (world + 1) / 2
        x = comm.empty(COUNT, np.float32)
        best = float("inf")
        for _ in range(3):
            x[...] = rank + 1
            t0 = time.perf_counter()
            comm.allreduce(x, op="sum")
            best = min(best, time.perf_counter() - t0)
            if not (x == want).all():
                print(f"rank {rank}: allreduce gave {x[:4]}..., expected {want} everywhere", flush=True)
                return 1
        y = np.full(1000, rank + 1, ml_dtypes.bfloat16)
        comm.allreduce(y, op="avg")
        avg = float(y[0])
        if not (y == ml_dtypes.bfloat16(want / world)).all():
            print(f"rank {rank}: bfloat16 avg gave {avg}, expected {want / world}", flush=True)
            return 1
        comm.barrier()
        print(f"allreduce ok: {COUNT} x float32, sum {want:g}, best {best * 1e3:.1f} ms; "
              f"bfloat16 avg {avg:g}", flush=True)
        return 0
    finally:
        comm.close()


if __name__ == "__main__":
    sys.exit(main())
