"""Node health: find broken hardware before it breaks a job, and read what the kernel reports.

- :mod:`.xid` — NVIDIA Xid events from kernel logs (dmesg, ``dmesg -T``, journal shapes), the Xid
  table as data (category, actions, who is to blame) and counts per category;
- :mod:`.checks` — the validator's checks (hardware and links, CPU stress, memory bandwidth and
  patterns, GEMM with checksums, intra-node allreduce, storage bandwidth), each returning a
  :class:`~.checks.result.CheckResult` with evidence and each with a fault-injection switch, and
  ``run_level`` running them at DCGM-like levels against a per-node baseline;
- :mod:`.c4` — C4-style detection of hung and slow nodes and links from collective telemetry
  (:mod:`.synth` makes synthetic traces for it); :mod:`.flashcut` — network link flaps;
- :mod:`.events` — what node agents publish (XidEvent, LinkEvent, NodeAdvice and their subjects);
  :mod:`.xidwatch` — the node-side Xid policy (floods, repeats, advice).

See docs/health.md and docs/health-c4.md.  Submodules are imported on use, so ``import fireflyer.health`` stays light.
"""
