"""``ff up`` / ``ff status`` / ``ff down``: the local cluster (see :mod:`fireflyer.cluster`).

    ff up     [--config deploy/local.toml] [--state-dir .ff]
    ff status [--state-dir .ff] [--json]
    ff down   [--state-dir .ff] [--timeout 10]
    ff metrics [--state-dir .ff] [--json] [--scrape]

The state dir is ``--state-dir``, else ``FF_STATE_DIR``, else ``.ff`` in the
working directory.  Handlers return the exit code; a FireFlyerError they raise
is printed by ``ff``'s main as ``ff <command>: <message>`` with exit code 1.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["register", "resolve_state_dir", "cmd_up", "cmd_status", "cmd_down", "cmd_metrics", "main"]

DEFAULT_STATE_DIR = ".ff"


def resolve_state_dir(arg: str | None, env: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if env is None else env
    return Path(arg or environ.get("FF_STATE_DIR") or DEFAULT_STATE_DIR)


def _console() -> Any:
    from rich.console import Console

    # wide enough that addresses and log paths are not folded when output goes to a file
    return Console(width=None if os.isatty(1) else 200)


def cmd_up(ns: argparse.Namespace) -> int:
    from fireflyer.cluster import supervisor
    from fireflyer.cluster.config import default_config_path

    config = Path(ns.config) if ns.config else default_config_path()
    return supervisor.up(config_path=config, state_dir=resolve_state_dir(ns.state_dir), env=os.environ,
                         cwd=Path.cwd(), console=_console())


def cmd_status(ns: argparse.Namespace) -> int:
    from fireflyer.cluster import supervisor

    return supervisor.status(state_dir=resolve_state_dir(ns.state_dir), console=_console(), as_json=ns.json)


def cmd_down(ns: argparse.Namespace) -> int:
    from fireflyer.cluster import supervisor

    return supervisor.down(state_dir=resolve_state_dir(ns.state_dir), timeout_s=ns.timeout, console=_console())


def cmd_metrics(ns: argparse.Namespace) -> int:
    from fireflyer.cluster import supervisor

    return supervisor.metrics(state_dir=resolve_state_dir(ns.state_dir), console=_console(), as_json=ns.json,
                              scrape=ns.scrape)


def _state_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help=f"the cluster's state dir (default: $FF_STATE_DIR or {DEFAULT_STATE_DIR})")


def register(subparsers: Any) -> None:
    """Add ``up``, ``status``, ``down`` and ``metrics`` to ``ff``'s subcommands."""
    up = subparsers.add_parser(
        "up", help="start the local cluster (nats-server and the services of the cluster file)",
        description="Start nats-server (or use FF_NATS_URL) and every service of the cluster file, wait "
                    "until each answers its health check, and record them in <state-dir>/cluster.json.")
    up.add_argument("--config", default=None, metavar="FILE",
                    help="cluster file (default: deploy/local.toml)")
    _state_dir_arg(up)
    up.set_defaults(func=cmd_up)

    st = subparsers.add_parser("status", help="show the local cluster's processes and their health",
                               description="Exit code 0 when every process runs and is healthy, 1 otherwise.")
    _state_dir_arg(st)
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.set_defaults(func=cmd_status)

    dn = subparsers.add_parser("down", help="stop the processes `ff up` started",
                               description="SIGTERM each recorded process still running (services, then "
                                           "nats), SIGKILL after --timeout; logs and data are kept.")
    _state_dir_arg(dn)
    dn.add_argument("--timeout", type=float, default=10.0, metavar="S",
                    help="seconds between SIGTERM and SIGKILL (default 10)")
    dn.set_defaults(func=cmd_down)

    mt = subparsers.add_parser("metrics", help="list each service process's Prometheus metrics URL",
                               description="The GET /metrics endpoint of every process `ff up` started "
                                           "(see docs/metrics.md).  --scrape fetches each; exit code 1 "
                                           "when one does not answer.")
    _state_dir_arg(mt)
    mt.add_argument("--json", action="store_true", help="print one JSON object")
    mt.add_argument("--scrape", action="store_true", help="fetch every endpoint and count its samples")
    mt.set_defaults(func=cmd_metrics)


def main(argv: Sequence[str] | None = None) -> int:
    """Run only these three commands (``python -m fireflyer.cli.cluster_cmds up``)."""
    import sys

    from fireflyer.core.errors import FireFlyerError

    parser = argparse.ArgumentParser(prog="ff")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(argv)
    try:
        return int(ns.func(ns))
    except FireFlyerError as e:
        print(f"ff {ns.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
