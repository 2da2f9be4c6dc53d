"""Waiting for storage to serve: a fresh cluster's chains appear a little after ``ff up``.

Storage services register their targets by heartbeat and node 0 makes the chains
(``FF_STORAGE_INIT_CHAINS``) after start-up, so tools that write right after start (``ff demo``,
benchmarks, test fixtures) wait until mgmtd's routing shows the chains with every target serving
and a chain table holding them: node 0 creates the chains first and their table right after, and
meta places files through tables, so chains alone are not yet writable.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fireflyer.core.errors import DeadlineExceeded, FireFlyerError
from fireflyer.mgmt.model import PublicState

from .client_min import MgmtdRouting

__all__ = ["wait_chains_serving"]


def wait_chains_serving(mgmtd: Sequence[str], token: str, *, count: int | None = None,
                        timeout_s: float = 60.0, interval_s: float = 0.1) -> int:
    """Block until the routing has ``count`` chains (any number > 0 when None), every target
    SERVING, and at least one chain table; returns the chain count.  :class:`DeadlineExceeded` after ``timeout_s``."""
    routing = MgmtdRouting(list(mgmtd), token=token)
    deadline = time.monotonic() + timeout_s
    seen = "no routing yet"
    try:
        while True:
            try:
                r = routing.get()
                serving = all(s is PublicState.SERVING for c in r.chains for s in c.states)
                if r.chains and serving and r.chain_tables and (count is None or len(r.chains) == count):
                    return len(r.chains)
                seen = (f"{len(r.chains)} chains, {'all' if serving else 'not all'} targets serving, "
                        f"{len(r.chain_tables)} chain tables")
            except FireFlyerError as e:
                seen = f"mgmtd: {e}"
            if time.monotonic() > deadline:
                want = "serving chains" if count is None else f"{count} serving chains"
                raise DeadlineExceeded(f"no {want} after {timeout_s:g}s ({seen}); see `ff status` and the "
                                       "storage logs", timeout_s=timeout_s)
            time.sleep(interval_s)
    finally:
        routing.close()
