"""``ff ui``: print the address of the local cluster's dashboard (``services/dashboard``).

``ff up`` gives the dashboard an HTTP port and records it in ``cluster.json`` as the instance's
``http_address``; this prints ``http://<that>/``.  Log in there with a token of ``tokens.json``
(``ff admin users`` lists the users).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fireflyer.core.errors import NoClusterFound, NotFound

__all__ = ["register", "dashboard_urls"]


def dashboard_urls(state_dir: Any) -> list[str]:
    """``http://host:port/`` of every dashboard instance of the cluster under ``state_dir``."""
    from fireflyer.cluster.discovery import NO_CLUSTER_HELP
    from fireflyer.cluster.records import StatePaths, read_record

    paths = StatePaths(state_dir)
    record = read_record(paths)
    if record is None:
        raise NoClusterFound(f"no Fire-Flyer cluster found (no {paths.record}): {NO_CLUSTER_HELP}",
                             missing="dashboard", state_dir=str(paths.root))
    urls = [f"http://{p.http_address}/" for p in record.processes if p.name == "dashboard" and p.http_address]
    if not urls:
        raise NotFound(f"the cluster under {paths.root} runs no dashboard: add [[service]] name = \"dashboard\" "
                       "(module services.dashboard, http = true) to its config, as deploy/local.toml does",
                       state_dir=str(paths.root))
    return urls


def _cmd(ns: argparse.Namespace) -> int:
    from fireflyer.cli.cluster_cmds import resolve_state_dir

    urls = dashboard_urls(resolve_state_dir(ns.state_dir))
    if ns.json:
        print(json.dumps({"urls": urls}))
    else:
        for u in urls:
            print(u)
    return 0


def register(sub: Any) -> None:
    from fireflyer.cli.options import add_state_dir

    p = sub.add_parser("ui", help="print the address of the local cluster's web dashboard")
    add_state_dir(p)
    p.add_argument("--json", action="store_true", help='{"urls": [...]}')
    p.set_defaults(func=_cmd)
