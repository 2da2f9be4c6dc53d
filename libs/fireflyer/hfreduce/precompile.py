"""``python -m fireflyer.hfreduce.precompile``: fill numba's compile cache for HFReduce.

``make setup`` runs it once, so that no process compiles on its first op: the reduce kernels
(:func:`.kernels.warm_up`, every input format) and the block loops (:func:`._blocks.warm_up`).
Cold, each takes 25-35 s on a 2-vCPU VM; from a filled cache, about a second
together.  The cache lives beside the sources (``__pycache__``), as numba's ``cache=True`` puts
it, so a fresh checkout or a new virtualenv fills it again.
"""

from __future__ import annotations

import time

from . import _blocks, kernels

__all__ = ["main"]


def main() -> int:
    for what, warm in (("reduce kernels", kernels.warm_up), ("block loops", _blocks.warm_up)):
        t0 = time.perf_counter()
        warm()
        print(f"hfreduce {what} compiled or loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
