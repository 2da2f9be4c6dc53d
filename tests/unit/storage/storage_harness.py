"""An in-process CRAQ chain for tests: Replica objects wired by direct calls, a mutable
chain table standing in for mgmtd, and fault injection on forwarding."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from fireflyer.core.errors import Unavailable
from fireflyer.mgmt.model import Chain, ChainTarget, PublicState
from fireflyer.storage import (
    ChunkId,
    ChunkStore,
    ReadReq,
    Replica,
    RetryPolicy,
    UpdateAck,
    UpdateReq,
    WriteAck,
    WriteReq,
    crc32c,
    resync,
    successor_of,
)

CHAIN = 7
CHUNK = 4096
ORDER = [
    PublicState.SERVING,
    PublicState.LASTSRV,
    PublicState.SYNCING,
    PublicState.WAITING,
    PublicState.OFFLINE,
]


class SimulatedCrash(BaseException):
    """Raised from a store hook: unwinds like a crash (stores skip their cleanup)."""


class Cluster:
    def __init__(
        self,
        root: Path,
        n: int,
        *,
        retry: RetryPolicy = RetryPolicy(max_attempts=5, base_delay_s=0.0, max_delay_s=0.0),
        verify_reads: bool = False,
    ) -> None:
        self.lock = threading.RLock()
        self.chain = Chain(
            chain_id=CHAIN,
            version=1,
            targets=tuple(
                ChainTarget(target_id=t, public_state=PublicState.SERVING) for t in range(1, n + 1)
            ),
        )
        #: per-target chain views; None = follow ``self.chain`` (all targets see the same)
        self.views: dict[int, Chain] = {}
        self.down: set[int] = set()
        self.commits: list[tuple[int, ChunkId]] = []
        self.fault: Callable[[int, UpdateReq, bytes], bytes | None] | None = None
        self.on_sleep: Callable[[float], None] | None = None
        self.sleeps: list[float] = []
        self.stores: dict[int, ChunkStore] = {}
        self.replicas: dict[int, Replica] = {}
        self._seq = 0
        for t in range(1, n + 1):
            self.stores[t] = ChunkStore(
                root / f"t{t}", fsync=False, target_id=t, verify_reads=verify_reads, hook=self._hook(t)
            )
            self.replicas[t] = Replica(
                t, self.stores[t], chains=self._view(t), forward=self.forward, retry=retry, sleep=self._sleep
            )

    # -- wiring ----------------------------------------------------------------------
    def _hook(self, t: int) -> Callable[[str, ChunkId], None]:
        def hook(point: str, cid: ChunkId) -> None:
            if point == "commit_recorded":
                with self.lock:
                    self.commits.append((t, cid))

        return hook

    def _view(self, t: int) -> Callable[[int], Chain]:
        def get(chain_id: int) -> Chain:
            assert chain_id == CHAIN
            with self.lock:
                return self.views.get(t, self.chain)

        return get

    def _sleep(self, s: float) -> None:
        self.sleeps.append(s)
        if self.on_sleep is not None:
            self.on_sleep(s)

    def forward(self, target: int, req: UpdateReq, payload: bytes | bytearray | memoryview) -> UpdateAck:
        data = bytes(payload)
        if self.fault is not None:
            changed = self.fault(target, req, data)
            if changed is not None:
                data = changed
        if target in self.down:
            raise Unavailable(f"target {target} is down", target=target)
        return self.replicas[target].handle_update(req, data)

    # -- mgmtd stand-in --------------------------------------------------------------
    def set_states(self, states: dict[int, PublicState]) -> Chain:
        with self.lock:
            cur = {t.target_id: t.public_state for t in self.chain.targets}
            cur.update(states)
            order = list(self.chain.target_ids)
            order.sort(key=lambda t: ORDER.index(cur[t]))  # stable: keeps relative order
            self.chain = Chain(
                chain_id=CHAIN,
                version=self.chain.version + 1,
                targets=tuple(ChainTarget(target_id=t, public_state=cur[t]) for t in order),
            )
            return self.chain

    def fail(self, t: int) -> None:
        self.down.add(t)
        self.set_states({t: PublicState.OFFLINE})

    def recover(self, t: int, *, workers: int = 2) -> None:
        """Bring ``t`` back: syncing, resync from its predecessor, serving."""
        self.down.discard(t)
        chain = self.set_states({t: PublicState.SYNCING})
        pred = self.predecessor(chain, t)
        remote = self.stores[t]
        resync(
            self.stores[pred],
            list(remote.all_meta()),
            send_replace=lambda cid, data, ver, cv: remote.replace_full(cid, data, version=ver, chain_ver=cv),
            remove=remote.remove,
            workers=workers,
        )
        self.set_states({t: PublicState.SERVING})

    @staticmethod
    def predecessor(chain: Chain, t: int) -> int:
        for p in chain.target_ids:
            if successor_of(chain, p) == t:
                return p
        raise AssertionError(f"no predecessor of {t} in {chain}")

    # -- client ----------------------------------------------------------------------
    @property
    def head(self) -> int:
        h = self.chain.head
        assert h is not None
        return h

    def write(
        self,
        cid: ChunkId,
        offset: int,
        data: bytes,
        *,
        client: str = "c1",
        channel: int = 0,
        seq: int | None = None,
        target: int | None = None,
        chain_ver: int | None = None,
    ) -> WriteAck:
        if seq is None:
            self._seq += 1
            seq = self._seq
        req = self.write_req(cid, offset, data, client=client, channel=channel, seq=seq, chain_ver=chain_ver)
        return self.replicas[target or self.head].handle_write(req, data)

    def write_req(
        self, cid: ChunkId, offset: int, data: bytes, *, client: str = "c1", channel: int = 0, seq: int = 1,
        chain_ver: int | None = None,
    ) -> WriteReq:  # fmt: skip
        return WriteReq(
            chain_id=CHAIN,
            chain_ver=self.chain.version if chain_ver is None else chain_ver,
            chunk_id=cid,
            offset=offset,
            length=len(data),
            chunk_size=CHUNK,
            payload_crc=crc32c(data),
            client_id=client,
            channel=channel,
            seq=seq,
        )

    def read(
        self, t: int, cid: ChunkId, *, relaxed: bool = False, offset: int = 0, length: int = -1
    ) -> bytes:
        req = ReadReq(
            chain_id=CHAIN,
            chain_ver=self.chain.version,
            chunk_id=cid,
            offset=offset,
            length=length,
            relaxed=relaxed,
        )
        return self.replicas[t].handle_read(req)[1]

    def serving(self) -> tuple[int, ...]:
        return self.chain.serving()

    def close(self) -> None:
        for s in self.stores.values():
            s.close()
