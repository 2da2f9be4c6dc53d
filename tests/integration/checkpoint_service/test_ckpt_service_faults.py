"""Faults around the checkpoint service: a writer killed mid-checkpoint, a service killed with -9
(also between a commit's records and its manifest), and bad input mapped to status codes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from ckptsvc_harness import commit_rank, committed_events, write_rank

from fireflyer.api.checkpoint.v1 import checkpoint_pb2 as pb
from fireflyer.api.checkpoint.v1 import checkpoint_pb2_grpc as pb_grpc
from fireflyer.ckpt import CheckpointCorrupted, LocalFS
from fireflyer.ckpt.catalog import Catalog
from fireflyer.ckpt.model import MANIFEST_NAME, CkptState
from fireflyer.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from fireflyer.kv import open_kv
from fireflyer.testing.poll import wait_until

HARNESS = Path(__file__).with_name("ckptsvc_harness.py")


def test_killed_writer_leaves_latest_alone_and_is_swept(ckpt_service) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service(FF_CHECKPOINT_ABANDON_AFTER_S="1.5")
    with svc.client() as c:
        first = c.begin("bert", 10, 1)
        commit_rank(c, svc.fs(), first, 0)

        writer = subprocess.Popen([sys.executable, str(HARNESS), svc.address, svc.token, str(svc.local_root),
                                   "bert", "20", "4", "0,2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            line = writer.stdout.readline()  # type: ignore[union-attr]
            assert line.startswith("committed "), line
            partial = line.split()[1]
            writer.send_signal(signal.SIGKILL)
            writer.wait(10)
        finally:
            writer.kill()
        rec = c.get(partial)
        assert rec.state is CkptState.PENDING and rec.ranks_committed == 2
        assert svc.path(rec.directory).is_dir()
        assert c.latest("bert").id == first.id

        # idle past abandon_after_s: the sweep aborts it and removes its files
        wait_until(lambda: c.get(partial).state is CkptState.ABORTED, timeout_s=15, what="partial checkpoint aborted")
        aborted = c.get(partial)
        assert "abandoned" in aborted.reason and "2 of 4 ranks" in aborted.reason
        assert not svc.path(rec.directory).exists()
        assert c.latest("bert").id == first.id and [r.step for r in c.list("bert")] == [10]
        with pytest.raises(FailedPrecondition):  # a late rank of the dead job cannot revive it
            commit_rank(c, svc.fs(), rec, 1)


def test_service_killed_restarts_from_kv_and_finishes_interrupted_commit(ckpt_service, tmp_path) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    with svc.client() as c:
        done = c.begin("t5", 1, 2)
        for r in range(2):
            commit_rank(c, svc.fs(), done, r)
        pending = c.begin("t5", 2, 2)
        commit_rank(c, svc.fs(), pending, 0)
    svc.proc.signal(signal.SIGKILL)
    svc.proc.wait(10)

    # While it is down, a commit dies between its records and its manifest: every rank's shard is
    # recorded, the record says committing, MANIFEST was never written (a process crashed there).
    class Crash(Exception):
        pass

    class ManifestCrash(LocalFS):
        def write_bytes(self, path: str, data: object) -> int:
            if path.endswith(MANIFEST_NAME):
                raise Crash("the process dies before writing MANIFEST")
            return super().write_bytes(path, data)

    kv = open_kv(svc.kv_url)
    try:
        cat = Catalog(kv, ManifestCrash(svc.local_root))
        digest, nbytes = write_rank(svc.fs(), pending, 1)
        with pytest.raises(Crash):
            cat.commit_shard(pending.id, 1, digest, nbytes)
        assert cat.get(pending.id).state is CkptState.COMMITTING
    finally:
        kv.close()

    svc.restart()
    with svc.client() as c:
        # the start-up sweep finished the commit: manifest, committed record, event
        assert c.latest("t5").id == pending.id
        assert [r.step for r in c.list("t5")] == [1, 2]
        assert (svc.path(pending.directory) / MANIFEST_NAME).exists()
        assert c.get(done.id).ranks_committed == 2
        assert {e.step for e in committed_events(svc.nats_url, "t5", expect=2)} == {1, 2}


def test_bad_input_maps_to_status_codes_and_commits_nothing(ckpt_service) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    fs = svc.fs()
    with svc.client() as c:
        with pytest.raises(NotFound) as nf:
            c.list("never-saved")
        assert nf.value.code == "NOT_FOUND"
        with pytest.raises(NotFound):
            c.latest("never-saved")
        with pytest.raises(InvalidArgument):
            c.begin("bad/job", 1, 1)
        with pytest.raises(InvalidArgument):
            c.begin("ok", -1, 1)

        first = c.begin("vit", 5, 2)
        commit_rank(c, fs, first, 0)
        commit_rank(c, fs, first, 1)
        with pytest.raises(FailedPrecondition) as back:
            c.begin("vit", 3, 2)
        assert "step 5" in str(back.value) and back.value.fields["latest_step"] == 5
        with pytest.raises(AlreadyExists):
            c.begin("vit", 5, 2)

        rec = c.begin("vit", 6, 2)
        digest, nbytes = write_rank(fs, rec, 0)
        with pytest.raises(InvalidArgument) as outside:
            c.commit_shard(rec.id, 2, digest, nbytes)
        assert "outside" in str(outside.value)
        with pytest.raises(InvalidArgument):
            c.commit_shard(rec.id, -1, digest, nbytes)
        with pytest.raises(CheckpointCorrupted) as corrupt:
            c.commit_shard(rec.id, 0, "0" * 32, nbytes)
        assert corrupt.value.code == "DATA_LOSS" and corrupt.value.fields["rank"] == 0
        with pytest.raises(FailedPrecondition) as missing:
            c.commit_shard(rec.id, 1, digest, nbytes)  # rank 1 wrote no index
        assert "missing" in str(missing.value)
        # nothing of step 6 counted: no shard recorded, still pending, Latest unchanged
        assert c.shards(rec.id) == [] and c.get(rec.id).ranks_committed == 0
        assert c.get(rec.id).state is CkptState.PENDING and c.latest("vit").id == first.id

        # a plain gRPC client (no Fire-Flyer error mapping) sees the real status codes
        async def raw() -> list[grpc.StatusCode]:
            codes = []
            async with grpc.aio.insecure_channel(svc.address) as ch:
                stub = pb_grpc.CheckpointServiceStub(ch)
                md = (("authorization", f"Bearer {svc.token}"),)
                for call in (stub.CommitShard(pb.CommitShardRequest(id=rec.id, rank=0, index_digest="f" * 32,
                                                                    nbytes=1), metadata=md, timeout=10),
                             stub.Latest(pb.LatestRequest(job="never-saved"), metadata=md, timeout=10),
                             stub.Begin(pb.BeginRequest(job="vit", step=4, world_size=2), metadata=md, timeout=10),
                             stub.Begin(pb.BeginRequest(job=".bad", step=4, world_size=2), metadata=md, timeout=10),
                             stub.ListJobs(pb.ListJobsRequest(), timeout=10)):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await call
                    codes.append(e.value.code())
            return codes

        assert asyncio.run(raw()) == [grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND,
                                      grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
                                      grpc.StatusCode.UNAUTHENTICATED]
        assert [r.step for r in c.list("vit", include_all=True)] == [5, 6]
        assert len(committed_events(svc.nats_url, "vit", expect=1)) == 1
