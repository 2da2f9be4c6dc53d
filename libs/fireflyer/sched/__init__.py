"""HAI Platform's half of Fire-Flyer: the task model, the scheduling decision, and their edges.

Pure core (no I/O):

- :mod:`.model`: chains of runs, chain/rank/Slurm states, stop codes, the suspend handshake,
  priority levels, task specs and their validation, node views, quotas, the admin's knobs;
- :mod:`.policy`: ``decide(tasks, nodes, quotas, now, config) -> Decision``, one scheduling cycle;
- :mod:`.records`: what the service keeps per run and per node beside the model;
- :mod:`.lifecycle`: a run's life after the decision (start, interrupt, reports, grace times, the
  end and the chain's next run);
- :mod:`.specfile`: a task spec from a file shaped like HAI's v2 experiment file (TOML or JSON).

Edges: :mod:`.agents` (what the scheduler asks of a node agent, as a protocol), :mod:`.convert`
(protobuf <-> Structs) and :mod:`.client` (``SchedClient``).  The service is ``services/scheduler``.
"""
