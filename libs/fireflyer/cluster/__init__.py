"""The local cluster: ``ff up`` / ``ff status`` / ``ff down`` on one state dir.

- :mod:`.config`     the cluster file (``deploy/local.toml``): nats and the services to run
- :mod:`.records`    what ``ff up`` writes under the state dir (cluster.json, tokens.json) and the lock
- :mod:`.decisions`  pure rules: is a pid still ours, may up start, what down signals, status rows
- :mod:`.procs`      observing, spawning and stopping processes
- :mod:`.supervisor` up / status / down themselves
- :mod:`.report`     tables and the start-up progress display
"""

from .config import ClusterConfig, NatsSection, ServiceEntry, load_cluster_config, parse_cluster_config
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
