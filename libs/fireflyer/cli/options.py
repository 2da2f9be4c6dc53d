"""The options every ``ff`` command that talks to the cluster shares, and how they find it.

    add_state_dir(p)                        --state-dir DIR
    add_cluster_options(p, address_help=..) --state-dir, --address, --token (and --role when asked)
    cluster_of(ns, need=("meta",), address_for="meta")   -> fireflyer.cluster.discovery.Cluster

The precedence is :func:`fireflyer.cluster.discovery.find_cluster`'s: ``--address`` / ``--token``,
then ``FF_<SVC>_ADDR`` / ``FF_TOKEN``, then the local cluster of ``--state-dir`` /
``FF_STATE_DIR`` / ``.ff``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

__all__ = ["add_state_dir", "add_cluster_options", "cluster_of"]

STATE_DIR_HELP = "the cluster's state dir (default: $FF_STATE_DIR, else .ff)"


def add_state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=None, metavar="DIR", help=STATE_DIR_HELP)


def add_cluster_options(parser: argparse.ArgumentParser, *, address_help: str | None = None,
                        role: str | None = None) -> None:
    """``--state-dir``, ``--token`` and, with ``address_help``, ``--address``; with ``role`` (its
    default), ``--role`` choosing which token of ``tokens.json`` to use."""
    add_state_dir(parser)
    if address_help is not None:
        parser.add_argument("--address", default=None, help=address_help)
    parser.add_argument("--token", default=None, help="bearer token (default: $FF_TOKEN, else the state dir's "
                                                      "tokens.json)")
    if role is not None:
        parser.add_argument("--role", choices=["admin", "user"], default=role,
                            help=f"which token of tokens.json to use (default {role})")


def cluster_of(ns: argparse.Namespace, *, need: Iterable[str] = (), address_for: str | None = None,
               role: str | None = None, **kw: Any) -> Any:
    """The cluster for parsed options ``ns``: ``--address`` names ``address_for``'s service."""
    from fireflyer.cluster.discovery import find_cluster

    if address_for is not None and getattr(ns, "address", None):
        kw[address_for] = ns.address
    return find_cluster(getattr(ns, "state_dir", None), need=need, token=getattr(ns, "token", None),
                        role=role or getattr(ns, "role", None) or "user", **kw)
