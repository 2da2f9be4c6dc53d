"""Helpers of the checkpoint-service tests: the service process, rank writers, JetStream reads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from fireflyer.ckpt import LocalFS, save
from fireflyer.ckpt.catalog import index_digest
from fireflyer.ckpt.client import CheckpointClient
from fireflyer.ckpt.index import index_name
from fireflyer.ckpt.model import CheckpointCommitted, CheckpointRecord
from fireflyer.testing.services import ServiceProcess

__all__ = ["CkptService", "write_rank", "commit_rank", "committed_events", "FAST"]

#: a quick sweep, so abandoned checkpoints go within a second or two of abandon_after_s
FAST = {"FF_CHECKPOINT_SWEEP_INTERVAL_S": "0.2"}


class CkptService:
    """The checkpoint service as a real process; ``local_root`` is where checkpoint files land."""

    def __init__(self, tmp_path: Path, *, nats_url: str, tokens_file: Path, token: str, instance: str,
                 env: dict[str, str]) -> None:
        self.local_root = Path(env.get("FF_CHECKPOINT_LOCAL_ROOT", str(tmp_path / "ckptfs")))
        self.kv_url = env.get("FF_CHECKPOINT_KV_URL", f"sqlite:///{tmp_path}/checkpoint.db")
        self.token = token
        self.nats_url = nats_url
        self._args = dict(state_dir=tmp_path, nats_url=nats_url, tokens_file=tokens_file, instance=instance,
                          env={**FAST, **env, "FF_CHECKPOINT_LOCAL_ROOT": str(self.local_root),
                               "FF_CHECKPOINT_KV_URL": self.kv_url})
        self.proc = ServiceProcess("services.checkpoint", **self._args)  # type: ignore[arg-type]

    @property
    def address(self) -> str:
        return self.proc.address

    def start(self) -> CkptService:
        self.proc.start()
        asyncio.run(self.proc.wait_healthy(30.0))
        return self

    def restart(self) -> CkptService:
        """A new process over the same KV and files (after a stop or a kill)."""
        self.proc.stop()
        self.proc = ServiceProcess("services.checkpoint", **self._args)  # type: ignore[arg-type]
        return self.start()

    def stop(self) -> None:
        self.proc.stop()

    def client(self) -> CheckpointClient:
        return CheckpointClient(self.address, token=self.token)

    def fs(self) -> LocalFS:
        return LocalFS(self.local_root)

    def path(self, directory: str) -> Path:
        return self.local_root / directory.lstrip("/")


def write_rank(fs: LocalFS, rec: CheckpointRecord, rank: int, *, n: int = 64) -> tuple[str, int]:
    """Write rank ``rank``'s shards and index; returns (index digest, tensor bytes)."""
    state = {"w": np.full((n,), rank, dtype=np.float32), "b": np.arange(rank + 1, dtype=np.int64), "step": rec.step}
    index = save(fs, rec.directory, state, rank=rank, shard_bytes=1 << 20, align=64)
    data = fs.read_bytes(f"{rec.directory}/{index_name(rank)}")
    return index_digest(data), index.tensor_bytes()


def commit_rank(client: CheckpointClient, fs: LocalFS, rec: CheckpointRecord, rank: int) -> CheckpointRecord:
    digest, nbytes = write_rank(fs, rec, rank)
    return client.commit_shard(rec.id, rank, digest, nbytes)


async def _read_stream(nats_url: str, subject: str, expect: int, timeout_s: float) -> list[CheckpointCommitted]:
    from fireflyer.bus import Bus
    from fireflyer.testing.nats import fast_nats_settings, unique_name

    bus = await Bus.connect(fast_nats_settings(nats_url), name="ckpt-test-reader")
    try:
        # a fresh durable consumer from the start of the stream: every event ever stored on the subject
        psub = await bus.js.pull_subscribe(subject, durable=unique_name("reader"), stream="FF_CKPT")
        got: list[CheckpointCommitted] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # after the expected count, one more fetch must come back empty: nothing was stored twice
        while True:
            try:
                msgs = await psub.fetch(16, timeout=0.5 if len(got) >= expect else 1.0)
            except TimeoutError:
                if len(got) >= expect or loop.time() > deadline:
                    return got
                continue
            for m in msgs:
                got.append(msgspec.json.decode(m.data, type=CheckpointCommitted))
                await m.ack()
    finally:
        await bus.close()


def committed_events(nats_url: str, job: str, *, expect: int, timeout_s: float = 10.0) -> list[CheckpointCommitted]:
    """Every CheckpointCommitted stored for ``job`` (waits for ``expect`` of them, then checks for more)."""
    return asyncio.run(_read_stream(nats_url, f"ff.ckpt.v1.job.{job}.committed", expect, timeout_s))


def state_of(client: CheckpointClient, ckpt_id: str) -> Any:
    return client.get(ckpt_id).state


def writer_main(argv: list[str]) -> int:
    """A training process that begins a checkpoint, commits some of its ranks, says so, and hangs
    (waiting on stdin) until it is killed: ``ADDRESS TOKEN LOCAL_ROOT JOB STEP WORLD RANK,RANK...``."""
    import sys

    address, token, root, job, step, world, ranks = argv
    with CheckpointClient(address, token=token) as c:
        fs = LocalFS(root)
        rec = c.begin(job, int(step), int(world))
        for rank in map(int, ranks.split(",")):
            commit_rank(c, fs, rec, rank)
        print(f"committed {rec.id}", flush=True)
        sys.stdin.read()  # the test kills us here
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(writer_main(sys.argv[1:]))
