"""The node agent's domain library: what ``services/node`` decides, without doing any I/O.

- :mod:`~fireflyer.node.model`: the task and rank records the agent keeps (and persists).
- :mod:`~fireflyer.node.env`: the environment of a task's rank (DESIGN.md §3).
- :mod:`~fireflyer.node.policy`: restart backoff, the stop escalation plan, rediscovery.
- :mod:`~fireflyer.node.events`: the agent's NATS events and their subjects.
- :mod:`~fireflyer.node.suspend`: the suspend flag file a task's processes poll.
"""
