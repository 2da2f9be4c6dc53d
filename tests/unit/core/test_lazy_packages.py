"""The packages that re-export their submodules' names load them on first use.

Checked: every name in ``__all__`` resolves, to the very object its submodule defines; an
unknown name is an ``AttributeError`` (so ``hasattr`` and ``from pkg import submodule`` keep
working); and the processes that only need the light parts -- an HFReduce worker, a
training rank's client -- import neither gRPC nor nats-py (about a quarter of a second each on
the 2-vCPU VMs, paid by every node worker and rank).
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ["fireflyer.bus", "fireflyer.rpc", "fireflyer.cluster"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_resolves_to_its_submodules_object(name: str) -> None:
    pkg = importlib.import_module(name)
    assert pkg.__all__
    for attr in pkg.__all__:
        value = getattr(pkg, attr)
        home = getattr(value, "__module__", None)
        if home and home.startswith(name + "."):
            assert getattr(importlib.import_module(home), attr) is value, f"{name}.{attr}"


@pytest.mark.parametrize("name", PACKAGES)
def test_unknown_names_are_attribute_errors(name: str) -> None:
    pkg = importlib.import_module(name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018
    assert not hasattr(pkg, "no_such_name")


def test_star_import_and_submodule_import_still_work() -> None:
    ns: dict[str, object] = {}
    exec("from fireflyer.bus import *", ns)  # noqa: S102
    assert {"Bus", "Event", "subject"} <= set(ns)
    from fireflyer.cluster import supervisor

    assert callable(supervisor.up)


def test_worker_and_client_import_neither_grpc_nor_nats() -> None:
    code = ("import sys, fireflyer.hfreduce.worker, fireflyer.hfreduce.client; "
            "print(','.join(m for m in ('grpc', 'nats') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"
