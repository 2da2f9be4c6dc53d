"""An asyncio client of the scheduler service (``ff task``, ``ff nodes``, ``ff quota`` use it).

    async with SchedClient() as c:          # FF_SCHED_ADDR (comma separated) + FF_TOKEN, or the cluster of FF_STATE_DIR / .ff
        chain = await c.submit(spec)        # an ff.scheduler.v1.Chain
        await c.stop(chain.chain_id)

Replicas: reads go to any replica that answers; a write that reaches a follower comes back as
:class:`~fireflyer.mgmt.lease.NotPrimary` naming the leader, and the client retries there (and
keeps calling the leader first); while no replica leads (a takeover) it asks again for up to
``leader_wait_s``.  A replica that does not answer (UNAVAILABLE) is skipped.  Replies
are the ``ff.scheduler.v1`` messages (the CLI prints them as they are).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fireflyer.api.scheduler.v1 import scheduler_pb2 as pb
from fireflyer.api.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from fireflyer.core.errors import FireFlyerError, Unavailable
from fireflyer.mgmt.lease import NotPrimary

__all__ = ["SchedClient"]

_STUBS = {"task": pb_grpc.TaskServiceStub, "node": pb_grpc.NodeServiceStub, "quota": pb_grpc.QuotaServiceStub}


class SchedClient:
    """Calls to the scheduler's replicas; close it (``async with``) when done.

    Addresses: ``addresses``, else ``FF_SCHED_ADDR``, else the scheduler of the local cluster
    (``state_dir`` / ``FF_STATE_DIR`` / ``.ff``); the token ``token`` (``""``: none), else
    ``FF_TOKEN``, else that cluster's ``role`` token.  With none, NoClusterFound says what to set."""

    def __init__(self, addresses: str | Sequence[str] | None = None, *, token: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, role: str = "user", timeout_s: float = 30.0, leader_wait_s: float = 15.0) -> None:
        from fireflyer.cluster.discovery import find_cluster

        cluster = find_cluster(state_dir, sched=addresses, token=token, need=("sched",), role=role)
        self.addresses: list[str] = list(cluster.sched)
        self.token = cluster.token or ""
        self.timeout_s = timeout_s
        self.leader_wait_s = leader_wait_s
        self._channels: dict[str, Any] = {}

    async def __aenter__(self) -> SchedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            await ch.close()

    def _stub(self, address: str, kind: str) -> Any:
        from fireflyer.rpc import connect

        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = connect(address, token=self.token)
        return _STUBS[kind](ch)

    async def _call(self, kind: str, method: str, request: Any, *, timeout_s: float | None = None) -> Any:
        # while no replica holds a live lease (a takeover: at most a lease's length), ask again
        deadline = asyncio.get_running_loop().time() + self.leader_wait_s
        while True:
            try:
                return await self._call_once(kind, method, request, timeout_s)
            except NotPrimary:
                # (the leader it names was tried too: it is dead or deposed, and the lease runs out)
                if asyncio.get_running_loop().time() >= deadline:
                    raise
            await asyncio.sleep(0.2)

    async def _call_once(self, kind: str, method: str, request: Any, timeout_s: float | None) -> Any:
        tried: list[str] = []
        queue = list(self.addresses)
        last: FireFlyerError | None = None
        while queue:
            address = queue.pop(0)
            if address in tried:
                continue
            tried.append(address)
            try:
                return await getattr(self._stub(address, kind), method)(request, timeout=timeout_s or self.timeout_s)
            except NotPrimary as e:
                last = e
                leader = str(e.fields.get("primary_address") or "")
                if leader and leader not in tried:
                    self._prefer(leader)
                    queue.insert(0, leader)
            except Unavailable as e:
                last = e
        assert last is not None
        if isinstance(last, Unavailable):
            raise Unavailable(f"no scheduler replica answered (tried {', '.join(tried)}): {last}",
                              addresses=",".join(tried)) from last
        raise last

    def _prefer(self, leader: str) -> None:
        if leader in self.addresses:
            self.addresses.remove(leader)
        self.addresses.insert(0, leader)

    # -- tasks --------------------------------------------------------------------------------------------
    async def submit(self, spec: pb.TaskSpec, *, request_id: str | None = None) -> pb.Chain:
        """Submit ``spec``; every retry of this call carries one request id, so a reply lost on the way
        (a leader that died after its commit) does not make the task twice."""
        req = pb.CreateRequest(spec=spec, request_id=request_id or uuid.uuid4().hex)
        return (await self._call("task", "Create", req)).chain

    async def get(self, task_id: int) -> pb.Chain:
        return (await self._call("task", "Get", pb.GetRequest(id=task_id))).chain

    async def list(self, *, user: str = "", include_finished: bool = False, limit: int = 0) -> list[pb.Chain]:
        req = pb.ListRequest(user=user, include_finished=include_finished, limit=limit)
        return list((await self._call("task", "List", req)).chains)

    async def stop(self, task_id: int) -> pb.Chain:
        return (await self._call("task", "Stop", pb.TaskIdRequest(id=task_id))).chain

    async def suspend(self, task_id: int) -> pb.Chain:
        return (await self._call("task", "Suspend", pb.TaskIdRequest(id=task_id))).chain

    async def resume(self, task_id: int) -> pb.Chain:
        return (await self._call("task", "Resume", pb.TaskIdRequest(id=task_id))).chain

    async def set_priority(self, task_id: int, priority: str) -> pb.Chain:
        req = pb.UpdatePriorityRequest(id=task_id, priority=priority)
        return (await self._call("task", "UpdatePriority", req)).chain

    async def logs(self, task_id: int, rank: int = 0, *, follow: bool = False,
                   timeout_s: float | None = None, restart: int | None = None) -> AsyncIterator[bytes]:
        """The rank's output (with ``follow``, until the rank ends or ``timeout_s`` passes); for a
        chain id its newest run's, or with ``restart`` the run with that restart count (0: the first)."""
        req = pb.LogsRequest(id=task_id, rank=rank, follow=follow)
        if restart is not None:
            req.restart = restart
        last: FireFlyerError | None = None
        for address in list(self.addresses):
            stub = self._stub(address, "task")
            try:
                call = stub.StreamLogs(req, timeout=timeout_s or (86400.0 if follow else self.timeout_s))
                async for chunk in call:
                    yield chunk.data
                return
            except Unavailable as e:
                last = e
        raise Unavailable(f"no scheduler replica answered: {last}") from last

    # -- nodes and quotas -----------------------------------------------------------------------------------
    async def nodes(self) -> list[pb.Node]:
        return list((await self._call("node", "List", pb.NodeListRequest())).nodes)

    async def set_node_state(self, name: str, state: str, reason: str = "", *, evict: bool = False) -> pb.Node:
        """Enable or drain a node; ``evict`` (with drained) also stops the run holding it, which is requeued."""
        req = pb.SetNodeStateRequest(name=name, state=state, reason=reason, evict=evict)
        return (await self._call("node", "SetState", req)).node

    async def register_node(self, request: pb.RegisterNodeRequest) -> pb.RegisterNodeReply:
        return await self._call("node", "Register", request)

    async def report(self, request: pb.ReportRequest) -> None:
        await self._call("node", "Report", request)

    async def quotas(self, owner: str = "") -> list[pb.Quota]:
        return list((await self._call("quota", "Get", pb.QuotaGetRequest(owner=owner))).quotas)

    async def set_quota(self, quota: pb.Quota, *, remove: bool = False) -> list[pb.Quota]:
        return list((await self._call("quota", "Set", pb.QuotaSetRequest(quota=quota, remove=remove))).quotas)

    async def used(self, owner: str = "") -> list[pb.QuotaUse]:
        return list((await self._call("quota", "Used", pb.QuotaGetRequest(owner=owner))).used)
