"""mgmtd, the 3FS cluster manager: lease-elected primary over a shared KV, node registry,
chain updater, routing info over gRPC and NATS.  See ``app`` (settings), ``loops`` (the
replica's behaviour), ``store`` (KV layout), ``servicer`` (gRPC edge)."""
