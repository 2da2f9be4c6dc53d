"""HAI Platform's half of Fire-Flyer, pure core: the task model and the scheduling decision.

- :mod:`.model`: chains of runs, chain/rank/Slurm states, stop codes, the suspend handshake,
  priority levels, task specs and their validation, node views, quotas, the admin's knobs;
- :mod:`.policy`: ``decide(tasks, nodes, quotas, now, config) -> Decision``, one scheduling cycle.

No I/O here: the scheduler service (a later slice) feeds these from its store and acts on them.
"""
