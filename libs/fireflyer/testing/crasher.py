"""A "service" that fails at start: for testing how ``ff up`` reports a crash.

``python -m fireflyer.testing.crasher [--exit-code N] [--lines N]`` writes a few
log lines and an error to stderr, then exits with code 3 (or ``--exit-code``),
the way a service with a bad setting dies during start-up.

``--hang`` instead stays up without ever serving its health check (a service
stuck in start-up) until SIGTERM, to test the ready deadline.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

__all__ = ["main", "CRASH_MESSAGE"]

CRASH_MESSAGE = "crasher: refusing to start (injected start-up failure)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fireflyer.testing.crasher")
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--lines", type=int, default=3, help="log lines written before the error")
    parser.add_argument("--hang", action="store_true", help="never become healthy; exit 0 on SIGTERM")
    ns = parser.parse_args(argv)
    instance = os.environ.get("FF_INSTANCE", "crasher")
    for i in range(ns.lines):
        print(f"crasher {instance}: start-up step {i}", flush=True)
    if ns.hang:
        print(f"crasher {instance}: hanging in start-up", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            signal.pause()
    print(f"{CRASH_MESSAGE} instance={instance}", file=sys.stderr, flush=True)
    return ns.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
