"""The local cluster: ``ff up`` / ``ff status`` / ``ff down`` on one state dir.

- :mod:`.config`     the cluster file (``deploy/local.toml``): nats and the services to run
- :mod:`.discovery`  how every client finds the cluster (arguments, ``FF_*``, the state dir)
- :mod:`.records`    what ``ff up`` writes under the state dir (cluster.json, tokens.json) and the lock
- :mod:`.decisions`  pure rules: is a pid still ours, may up start, what down signals, status rows
- :mod:`.procs`      observing, spawning and stopping processes
- :mod:`.supervisor` up / status / down themselves
- :mod:`.report`     tables and the start-up progress display
"""

from typing import TYPE_CHECKING

from fireflyer.core.lazy import lazy_attributes

# (lazy: a process that needs one helper of a submodule -- an HFReduce worker takes
# ``procs.free_ports`` -- must not pay for the supervisor's gRPC and NATS imports)
__getattr__ = lazy_attributes(__name__, {
    "ClusterConfig": "config", "NatsSection": "config", "ServiceEntry": "config",
    "load_cluster_config": "config", "parse_cluster_config": "config",
    "ClusterRecord": "records", "NatsRecord": "records", "ProcessRecord": "records", "StatePaths": "records",
    "TokensFile": "records", "read_record": "records", "read_tokens": "records",
    "Cluster": "discovery", "find_cluster": "discovery",
    "collect_status": "supervisor", "down": "supervisor", "status": "supervisor", "up": "supervisor",
})

if TYPE_CHECKING:
    from .config import ClusterConfig, NatsSection, ServiceEntry, load_cluster_config, parse_cluster_config
    from .discovery import Cluster, find_cluster
    from .records import (
        ClusterRecord,
        NatsRecord,
        ProcessRecord,
        StatePaths,
        TokensFile,
        read_record,
        read_tokens,
    )
    from .supervisor import collect_status, down, status, up


__all__ = [
    "Cluster",
    "find_cluster",
    "ClusterConfig",
    "NatsSection",
    "ServiceEntry",
    "load_cluster_config",
    "parse_cluster_config",
    "ClusterRecord",
    "NatsRecord",
    "ProcessRecord",
    "StatePaths",
    "TokensFile",
    "read_record",
    "read_tokens",
    "collect_status",
    "up",
    "status",
    "down",
]
