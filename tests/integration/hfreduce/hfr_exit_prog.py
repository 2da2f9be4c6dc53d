"""One rank (of a 1-node, 1-rank communicator) that ends without ``comm.close()``.

    python hfr_exit_prog.py SOCKET MODE

MODE ``exit``: one allreduce, then the interpreter exits normally; ``hang``: one allreduce,
then sleeps (the test kills it); ``raise``: one allreduce, then an uncaught exception;
``drop``: one allreduce, the last reference dropped, then a second communicator of the same
rank and name (which the worker accepts only once the first one said goodbye).
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np

from fireflyer import hfreduce


def _init(sock: str) -> hfreduce.Communicator:
    return hfreduce.init(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, nnodes=1,
                         socket=sock, job_id="test", timeout_s=10.0, env={})


def main() -> None:
    sock, mode = sys.argv[1], sys.argv[2]
    comm = _init(sock)
    x = np.arange(8, dtype=np.float32)
    comm.allreduce(x)
    print("allreduced", flush=True)
    if mode == "hang":
        time.sleep(120)
    elif mode == "raise":
        raise RuntimeError("the training script failed")
    elif mode == "drop":
        del comm
        gc.collect()
        end = time.monotonic() + 10.0
        while True:
            try:
                again = _init(sock)
                break
            except Exception as e:  # noqa: BLE001 - "already joined" until the goodbye is handled
                if time.monotonic() > end:
                    raise SystemExit(f"no second communicator: {e}") from e
                time.sleep(0.05)
        again.allreduce(x)
        again.close()
        print("reinit ok", flush=True)


if __name__ == "__main__":
    main()
