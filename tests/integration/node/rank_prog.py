"""A task rank for the node agent's tests: ``python rank_prog.py MODE [ARG]``.

- ``env``: print the rank variables as one JSON line, then exit 0;
- ``wait FILE``: print ``start``, wait until FILE exists, print ``more``, exit 0;
- ``suspend``: print ``ready``, poll the suspend flag, print ``suspend seen: <reason>``, exit 0;
- ``usr1``: print ``ready``, wait for SIGUSR1, print ``got SIGUSR1``, exit 0;
- ``stubborn``: ignore SIGTERM, print ``ready``, sleep until killed;
- ``sleep``: print ``ready``, sleep until killed (SIGTERM ends it with -15);
- ``exit N``: exit with code N.
"""

import json
import os
import signal
import sys
import time

from fireflyer.node.suspend import read_flag, suspend_requested

KEYS = ("FF_JOB_ID", "FF_TASK_ID", "FF_RANK", "FF_WORLD_SIZE", "FF_LOCAL_RANK", "FF_LOCAL_WORLD_SIZE", "FF_NODE_RANK",
        "FF_NNODES", "FF_NODE_NAME", "FF_RESTART_COUNT", "FF_SCHED_ADDR", "FF_SUSPEND_FILE", "FF_HFREDUCE_SOCKET",
        "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID", "SLURM_PROCID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
        "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FF_TOKEN", "TASK_VAR", "RANK_VAR")


def main() -> int:
    mode = sys.argv[1]
    if mode == "env":
        print(json.dumps({k: os.environ.get(k) for k in KEYS}), flush=True)
        return 0
    if mode == "wait":
        print("start", flush=True)
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.02)
        print("more", flush=True)
        return 0
    if mode == "suspend":
        print("ready", flush=True)
        while not suspend_requested():
            time.sleep(0.02)
        flag = read_flag(os.environ["FF_SUSPEND_FILE"])
        print(f"suspend seen: {flag.reason if flag else '?'}", flush=True)
        return 0
    if mode == "usr1":
        got = []
        signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
        print("ready", flush=True)
        while not got:
            time.sleep(0.02)
        print("got SIGUSR1", flush=True)
        return 0
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode in ("stubborn", "sleep"):
        print("ready", flush=True)
        while True:
            time.sleep(1)
    if mode == "exit":
        return int(sys.argv[2])
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    raise SystemExit(main())
