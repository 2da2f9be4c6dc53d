"""Checkpoint jobs have owners, through the service (issue 48, point 3): with three tokens
(alice and bob, users; root, an admin), bob's raw gRPC calls and ``ff ckpt`` commands on
alice's job are refused with PERMISSION_DENIED naming her, nothing of her checkpoints comes
back and nothing changes; alice and the admin may do everything."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from ckptsvc_harness import commit_rank

from fireflyer.api.checkpoint.v1 import checkpoint_pb2 as pb
from fireflyer.api.checkpoint.v1 import checkpoint_pb2_grpc as pb_grpc
from fireflyer.ckpt.client import CheckpointClient
from fireflyer.ckpt.model import CkptState, RetentionPolicy
from fireflyer.cli.main import main
from fireflyer.core.errors import PermissionDenied
from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file

TOKENS = {"alice": generate_token(), "bob": generate_token(), "root": generate_token()}


@pytest.fixture
def token_file(tmp_path: Path) -> tuple[Path, str]:
    """Overrides conftest's: three callers; the service itself presents alice's (a local root)."""
    entries = [TokenEntry(token=TOKENS["alice"], user="alice", roles=["user"]),
               TokenEntry(token=TOKENS["bob"], user="bob", roles=["user"]),
               TokenEntry(token=TOKENS["root"], user="root", roles=["admin"])]
    return write_tokens_file(tmp_path / "tokens.json", entries), TOKENS["alice"]


def _raw_calls(address: str, token: str, calls: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """Each (method, request) on a bare stub with ``token``; (status code name, details) each."""
    async def run() -> list[tuple[str, str]]:
        out = []
        async with grpc.aio.insecure_channel(address) as ch:
            stub = pb_grpc.CheckpointServiceStub(ch)
            for method, req in calls:
                try:
                    reply = await getattr(stub, method)(req, metadata=(("authorization", f"Bearer {token}"),),
                                                        timeout=10)
                    out.append(("OK", str(reply)))
                except grpc.aio.AioRpcError as e:
                    out.append((e.code().name, e.details() or ""))
        return out
    return asyncio.run(run())


def _alices_job(svc: Any) -> tuple[list[str], str]:
    with CheckpointClient(svc.address, token=TOKENS["alice"]) as c:
        ids = []
        for step in (1, 2):
            rec = c.begin("alicejob", step, 2)
            for r in range(2):
                commit_rank(c, svc.fs(), rec, r)
            ids.append(rec.id)
        pending = c.begin("alicejob", 3, 2)
    return ids, pending.id


def test_raw_grpc_calls_of_another_user_are_refused(ckpt_service) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    ids, pending = _alices_job(svc)
    calls = [
        ("List", pb.ListRequest(job="alicejob", include_all=True)),
        ("Latest", pb.LatestRequest(job="alicejob")),
        ("Get", pb.GetRequest(id=ids[0])),
        ("ListShards", pb.ListShardsRequest(id=ids[0])),
        ("GetRetention", pb.GetRetentionRequest(job="alicejob")),
        ("SetRetention", pb.SetRetentionRequest(job="alicejob", keep_last=1)),
        ("Pin", pb.PinRequest(id=ids[0], pinned=True)),
        ("Delete", pb.DeleteRequest(id=ids[0], force=True)),
        ("Begin", pb.BeginRequest(job="alicejob", step=10, world_size=1)),
        ("CommitShard", pb.CommitShardRequest(id=pending, rank=0, index_digest="0" * 32, nbytes=1)),
        ("Abort", pb.AbortRequest(id=pending, reason="bob was here")),
    ]
    got = _raw_calls(svc.address, TOKENS["bob"], calls)
    for (method, _), (code, details) in zip(calls, got, strict=True):
        assert code == "PERMISSION_DENIED", (method, code, details)
        assert "belongs to user 'alice'" in details, (method, details)
        assert ids[1] not in details and "/ckpt" not in details, (method, details)  # whose, not what
    # bob's job list does not show hers
    assert _raw_calls(svc.address, TOKENS["bob"], [("ListJobs", pb.ListJobsRequest())]) == [("OK", "")]

    # nothing changed: alice still has both, unpinned, retention as it was, the pending one pending
    with CheckpointClient(svc.address, token=TOKENS["alice"]) as c:
        recs = c.list("alicejob", include_all=True)
        assert [r.id for r in recs if r.committed] == ids and not any(r.pinned for r in recs)
        assert all(r.owner == "alice" for r in recs)
        assert c.get(pending).state is CkptState.PENDING
        assert c.retention("alicejob") == RetentionPolicy()
        assert c.jobs() == ["alicejob"]
    assert all(svc.path(r.directory).exists() for r in recs)

    # the Python client raises the typed error
    with CheckpointClient(svc.address, token=TOKENS["bob"]) as c, pytest.raises(PermissionDenied) as ei:
        c.delete(ids[0], force=True)
    assert ei.value.fields.get("owner") == "alice"


def test_owner_and_admin_may_do_everything(ckpt_service) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    ids, pending = _alices_job(svc)
    with CheckpointClient(svc.address, token=TOKENS["bob"]) as c:
        rec = c.begin("bobjob", 1, 1)
        commit_rank(c, svc.fs(), rec, 0)
        assert c.jobs() == ["bobjob"]
    with CheckpointClient(svc.address, token=TOKENS["root"]) as c:
        assert c.jobs() == ["alicejob", "bobjob"]
        assert [r.id for r in c.list("alicejob")] == ids
        assert c.pin(ids[0], True).pinned and not c.pin(ids[0], False).pinned
        assert c.set_retention("alicejob", RetentionPolicy(keep_last=5)).keep_last == 5
        assert c.abort(pending).state is CkptState.ABORTED
        first_dir = svc.path(c.get(ids[0]).directory)
        assert first_dir.exists()
        c.delete(ids[0], force=True)
        assert not first_dir.exists()
    with CheckpointClient(svc.address, token=TOKENS["alice"]) as c:
        assert [r.id for r in c.list("alicejob")] == [ids[1]]
        assert c.pin(ids[1], True).pinned
        c.delete(ids[1], force=True)
        assert c.list("alicejob") == []


def test_ff_ckpt_commands_of_another_user_are_refused(ckpt_service, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    ids, _pending = _alices_job(svc)
    monkeypatch.setenv("FF_CKPT_ADDR", svc.address)
    monkeypatch.delenv("FF_CHECKPOINT_LOCAL_ROOT", raising=False)

    def ff(user: str, *args: str) -> tuple[int, str, str]:
        monkeypatch.setenv("FF_TOKEN", TOKENS[user])
        capsys.readouterr()
        rc = main(["ckpt", *args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    for args in (("ls", "alicejob"), ("ls", "alicejob", "--all"), ("show", ids[0]), ("pin", ids[0]),
                 ("unpin", ids[0]), ("retention", "alicejob"), ("retention", "alicejob", "--keep-last", "1"),
                 ("rm", ids[0]), ("rm", ids[0], "--force")):
        rc, out, err = ff("bob", *args)
        assert rc == 1 and out == "", (args, out)
        assert "belongs to user 'alice'" in err and ids[1] not in err, (args, err)
    rc, out, _ = ff("bob", "jobs")
    assert rc == 0 and "alicejob" not in out

    rc, out, _ = ff("alice", "jobs")
    assert rc == 0 and out.split() == ["alicejob"]
    rc, out, _ = ff("alice", "show", ids[0], "--local-root", str(svc.local_root))
    assert rc == 0 and "owner:      alice" in out
    assert ff("alice", "pin", ids[0])[0] == 0
    rc, out, _ = ff("root", "ls", "alicejob")
    assert rc == 0 and ids[0] in out and ids[1] in out
    assert ff("root", "rm", ids[0], "--force")[0] == 0
    assert ff("alice", "rm", ids[1])[0] == 0
    rc, out, _ = ff("alice", "ls", "alicejob")
    assert rc == 0 and ids[0] not in out and ids[1] not in out
