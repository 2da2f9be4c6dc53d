"""The ``ff`` command.

    ff up | status | down        the local cluster (see fireflyer.cluster)
    ff demo                      bring a cluster up, show it working, bring it down
    ff health xid FILE           Xid counts and shares per category in a kernel log
    ff echo TEXT                 call the diagnostic echo service (auth, tracing, NATS)
    ff bench <what> [...]        benchmarks (--json [PATH]: one JSON line on stdout, or a file)
    ff version

Each subcommand lives in its own module with a ``register(subparsers)``
function; a handler takes the parsed namespace and returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fireflyer import __version__
from fireflyer.core.errors import FireFlyerError

__all__ = ["main", "build_parser"]

#: ``ff bench <what>`` -> module with ``main(argv) -> int``; later issues add entries
BENCHES: dict[str, str] = {
    "wire": "fireflyer.bench.wire",
    "kernels": "fireflyer.bench.kernels",
    "campaign": "fireflyer.bench.campaign",
    "flows": "fireflyer.bench.flows",
    "ringref": "fireflyer.bench.ringref",
    "allreduce": "fireflyer.bench.allreduce",
    "meta": "fireflyer.bench.meta",
    "coord": "fireflyer.bench.coord",
    "fs": "fireflyer.bench.fs",
    "fs-small": "fireflyer.bench.fs_small",
    "incast": "fireflyer.bench.incast",
    "ckpt": "fireflyer.bench.ckpt",
    "kv": "fireflyer.bench.kv",
    "sched": "fireflyer.bench.sched",
    "ddp": "fireflyer.bench.ddp",
    "health": "fireflyer.bench.health",
}

#: modules that add subcommands; imported lazily so ``ff --help`` stays fast
COMMAND_MODULES = [
    "fireflyer.cli.cluster_cmds",
    "fireflyer.cli.demo",
    "fireflyer.cli.echo",
    "fireflyer.cli.fs",
    "fireflyer.cli.launch",
    "fireflyer.cli.admin",
    "fireflyer.cli.coord",
    "fireflyer.cli.ckpt",
    "fireflyer.cli.task",
    "fireflyer.cli.health",
    "fireflyer.cli.plan",
    "fireflyer.cli.trace",
    "fireflyer.cli.ui",
]


def _bench(ns: argparse.Namespace) -> int:
    module = importlib.import_module(BENCHES[ns.what])
    return int(module.main(ns.bench_args) or 0)


def _version(ns: argparse.Namespace) -> int:
    print(f"fireflyer {__version__}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ff", description="Fire-Flyer: AI-HPC training infrastructure")
    parser.add_argument("--version", action="version", version=f"fireflyer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)

    bench = sub.add_parser("bench", help="run a benchmark (--json [PATH]: one JSON line on stdout, or written to PATH)",
                           description="Benchmarks: " + ", ".join(sorted(BENCHES)))
    bench.add_argument("what", choices=sorted(BENCHES))
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments of that benchmark (--help)")
    bench.set_defaults(func=_bench)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not getattr(ns, "func", None):
        parser.print_help()
        return 2
    try:
        return int(ns.func(ns) or 0)
    except FireFlyerError as e:
        print(f"ff {ns.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
