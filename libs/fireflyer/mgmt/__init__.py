"""The decision logic of the 3FS cluster manager (mgmtd), free of I/O.

- :mod:`~fireflyer.mgmt.model`: records stored in the KV and sent in routing info
  (nodes, targets, chains, chain tables, the lease).
- :mod:`~fireflyer.mgmt.chains`: the chain update (3FS ``generateNewChain``) driven by the
  rule table :data:`~fireflyer.mgmt.chains.RULES`.
- :mod:`~fireflyer.mgmt.lease`: primary election over one lease record; :class:`NotPrimary`.
- :mod:`~fireflyer.mgmt.registry`: heartbeats and heartbeat failures, with typed events.

Events and the time go in, decisions come out; ``services/mgmtd`` adapts them to the KV,
gRPC and NATS (DESIGN.md §2).
"""

from .chains import RULES, Context, Rule, apply_to_routing, decide_targets, next_chain, update_chains
from .lease import (
    LeaseAction,
    LeaseConfig,
    LeaseDecision,
    NotPrimary,
    decide_lease,
    ensure_primary,
    is_primary,
    should_step_down,
)
from .model import (
    Chain,
    ChainTable,
    ChainTarget,
    LeaseRecord,
    LocalState,
    NodeInfo,
    NodeStatus,
    NodeType,
    PublicState,
    RoutingInfo,
    TargetInfo,
)
from .registry import (
    Heartbeat,
    NodeFailed,
    NodeRecovered,
    NodeRegistered,
    RegistryState,
    TargetReport,
    TargetStateChanged,
    apply_heartbeat,
    local_states,
    scan_failures,
)

__all__ = [
    "RULES",
    "Chain",
    "ChainTable",
    "ChainTarget",
    "Context",
    "Heartbeat",
    "LeaseAction",
    "LeaseConfig",
    "LeaseDecision",
    "LeaseRecord",
    "LocalState",
    "NodeFailed",
    "NodeInfo",
    "NodeRecovered",
    "NodeRegistered",
    "NodeStatus",
    "NodeType",
    "NotPrimary",
    "PublicState",
    "RegistryState",
    "RoutingInfo",
    "Rule",
    "TargetInfo",
    "TargetReport",
    "TargetStateChanged",
    "apply_heartbeat",
    "apply_to_routing",
    "decide_lease",
    "decide_targets",
    "ensure_primary",
    "is_primary",
    "local_states",
    "next_chain",
    "scan_failures",
    "should_step_down",
    "update_chains",
]
