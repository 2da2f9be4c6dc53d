"""Node health: validators, kernel-log (Xid) events, network flash cuts and C4-style job-telemetry detection."""
