"""Plain data of the coordination service: join requests, communicator records, events.

A communicator is identified by ``"<job>/<name>"`` (the same key the HFReduce worker
uses for its per-node communicators, so a worker's telemetry for the job's
``default`` communicator lands on coord's record of the same name).  Each formation
is a *generation*; a :class:`CommRecord` is the current generation of one
communicator, which is also what the service stores in the KV.
"""

from __future__ import annotations

import msgspec

from fireflyer.bus.events import Event
from fireflyer.bus.subjects import owned, subject
from fireflyer.core.errors import InvalidArgument

__all__ = ["FORMING", "ACTIVE", "ABORTED", "ENDED", "STATES", "JoinSpec", "Member", "CommRecord",
           "CommAborted", "comm_id", "split_comm_id", "comm_subject_token", "aborted_subject",
           "telemetry_subject"]

FORMING, ACTIVE, ABORTED, ENDED = "forming", "active", "aborted", "ended"
STATES = (FORMING, ACTIVE, ABORTED, ENDED)


class JoinSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one node says when it joins (the Join request, validated)."""

    job: str
    name: str
    node: str
    zone: str = ""
    local_world_size: int = 1
    address: str = ""
    nnodes: int
    world_size: int = 0
    restart_count: int = 0
    expected_nodes: tuple[str, ...] = ()
    #: the Fire-Flyer user who joined (set by coord from the caller's token, never by the caller):
    #: the communicator's NATS subjects are in that user's namespace
    owner: str = ""

    @property
    def comm(self) -> str:
        return comm_id(self.job, self.name)

    def check(self) -> None:
        for field in ("job", "name", "node"):
            value = getattr(self, field)
            if not value or any(c.isspace() for c in value):
                raise InvalidArgument(f"join: {field} must be a non-empty name without spaces, got {value!r}",
                                      field=field)
        if "/" in self.job:
            raise InvalidArgument(f"join: job {self.job!r} must not contain '/'", field="job")
        if self.nnodes < 1:
            raise InvalidArgument(f"join: nnodes must be >= 1, got {self.nnodes}", field="nnodes")
        if self.local_world_size < 1:
            raise InvalidArgument(f"join: local_world_size must be >= 1, got {self.local_world_size}",
                                  field="local_world_size")
        if self.nnodes > 1 and not self.address:
            raise InvalidArgument(f"join: node {self.node} gives no data-plane address, which a "
                                  f"{self.nnodes}-node communicator needs", field="address")
        if self.expected_nodes and self.node not in self.expected_nodes:
            raise InvalidArgument(f"join: node {self.node} is not among the expected nodes "
                                  f"{list(self.expected_nodes)}", field="node")


class Member(msgspec.Struct, kw_only=True):
    """One node of a communicator generation; ranks are set when the generation forms."""

    node: str
    zone: str = ""
    address: str = ""
    local_world_size: int = 1
    node_rank: int = -1
    first_rank: int = 0
    left: bool = False


class CommRecord(msgspec.Struct, kw_only=True):
    """The current generation of one communicator (stored in the KV once active)."""

    job: str
    name: str
    generation: int
    state: str = FORMING
    nnodes: int
    world_size: int = 0
    restart_count: int = 0
    #: join order while forming, node-rank order once active
    members: list[Member] = msgspec.field(default_factory=list)
    expected_nodes: tuple[str, ...] = ()
    reason: str = ""
    culprit: str = ""
    created_at: float = 0.0
    formed_at: float = 0.0
    ended_at: float = 0.0
    depth: int = 0
    cross_zone_pairs: int = 0
    #: the user of the join that created this generation; "" for records stored before owners
    owner: str = ""

    @property
    def comm(self) -> str:
        return comm_id(self.job, self.name)

    def member(self, node: str) -> Member | None:
        return next((m for m in self.members if m.node == node), None)

    @property
    def live(self) -> bool:
        return self.state in (FORMING, ACTIVE)


class CommAborted(Event, tag="coord.comm_aborted.v1"):
    """Published on ``ff.coord.v1.comm.<token>.aborted`` when a generation is aborted."""

    comm: str
    generation: int
    reason: str
    #: the node named as the cause ("" when an operator aborted)
    culprit: str = ""


def comm_id(job: str, name: str) -> str:
    return f"{job}/{name}"


def split_comm_id(comm: str) -> tuple[str, str]:
    job, sep, name = comm.partition("/")
    if not sep or not job or not name:
        raise InvalidArgument(f"communicator id {comm!r} is not of the form JOB/NAME", comm=comm)
    return job, name


def comm_subject_token(comm: str) -> str:
    """The communicator id as one subject token, as the HFReduce worker's telemetry does it."""
    from fireflyer.hfreduce.telemetry import comm_token

    return comm_token(comm)


def _scoped(owner: str, value: str) -> str:
    # a communicator's events live in its owner's namespace, the only one the owner's NATS user
    # may read or write (fireflyer.bus.auth); no owner: the cluster-wide subject
    return owned(owner, value) if owner else value


def aborted_subject(comm: str, owner: str = "") -> str:
    return _scoped(owner, subject("coord", "comm", comm_subject_token(comm), "aborted"))


def telemetry_subject(comm: str, owner: str = "") -> str:
    return _scoped(owner, subject("coord", "comm", comm_subject_token(comm), "telemetry"))
