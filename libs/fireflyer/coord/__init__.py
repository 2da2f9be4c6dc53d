"""``fireflyer.coord``: collective coordination (rendezvous, trees, liveness, telemetry).

Pure logic -- :mod:`.rendezvous` (joins, generations, liveness with the time passed
in), :mod:`.layout` (ranks and trees), :mod:`.opstats` (telemetry aggregation) --
and the clients of ``services/coord``: :class:`CoordClient` (async RPCs) and
:class:`CoordMembership` (a worker's join / heartbeat / abort watch on a thread).
"""

from .client import CoordClient, CoordMembership
from .convert import CommView, JoinResult, NodeView
from .layout import TreeView, assign_ranks, build_trees
from .model import (
    ABORTED,
    ACTIVE,
    ENDED,
    FORMING,
    CommAborted,
    CommRecord,
    JoinSpec,
    Member,
    aborted_subject,
    comm_id,
    telemetry_subject,
)
from .opstats import OpStatsReport, OpStatsStore, aggregate
from .rendezvous import LivenessConfig, Outcome, Rendezvous

__all__ = [
    "ABORTED", "ACTIVE", "ENDED", "FORMING", "CommAborted", "CommRecord", "CommView", "CoordClient",
    "CoordMembership", "JoinResult", "JoinSpec", "LivenessConfig", "Member", "NodeView", "OpStatsReport",
    "OpStatsStore", "Outcome", "Rendezvous", "TreeView", "aborted_subject", "aggregate", "assign_ranks",
    "build_trees", "comm_id", "telemetry_subject",
]
