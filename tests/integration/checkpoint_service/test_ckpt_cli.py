"""``ff ckpt`` against a running checkpoint service (the CLI's main called in-process, FF_CKPT_ADDR)."""

from __future__ import annotations

import json

import pytest
from ckptsvc_harness import commit_rank

from fireflyer.cli.main import main


def test_ff_ckpt_ls_show_rm_pin_retention(ckpt_service, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    svc = ckpt_service()
    fs = svc.fs()
    with svc.client() as c:
        ids, dirs = [], []
        for step in (1, 2):
            rec = c.begin("clijob", step, 2, {"note": "x"})
            for r in range(2):
                commit_rank(c, fs, rec, r)
            ids.append(rec.id)
            dirs.append(svc.path(rec.directory))
        pending = c.begin("clijob", 3, 2)
    monkeypatch.setenv("FF_CKPT_ADDR", svc.address)
    monkeypatch.setenv("FF_TOKEN", svc.token)
    monkeypatch.delenv("FF_CHECKPOINT_LOCAL_ROOT", raising=False)

    def ff(*args: str) -> str:
        capsys.readouterr()
        assert main(["ckpt", *args]) == 0
        return capsys.readouterr().out

    out = ff("ls", "clijob")
    assert out.splitlines()[0].split() == ["ID", "STEP", "STATE", "RANKS", "SIZE", "COMMITTED", "PINNED"]
    assert ids[0] in out and ids[1] in out and pending.id not in out and "2/2" in out
    assert pending.id in ff("ls", "clijob", "--all")
    assert [r["step"] for r in json.loads(ff("ls", "clijob", "--json"))] == [1, 2]
    assert json.loads(ff("jobs", "--json")) == ["clijob"]

    shown = ff("show", ids[1], "--local-root", str(svc.local_root))
    assert f"checkpoint {ids[1]}: job clijob step 2, committed" in shown and "note=x" in shown
    assert "w" in shown and "float32" in shown and "int64" in shown
    data = json.loads(ff("show", ids[1], "--json", "--local-root", str(svc.local_root)))
    assert [s["rank"] for s in data["shards"]] == [0, 1]
    assert {(t["rank"], t["path"], t["dtype"], tuple(t["shape"])) for t in data["tensors"]} >= {
        (0, "w", "float32", (64,)), (1, "b", "int64", (2,))}

    assert "pinned" in ff("pin", ids[0])
    capsys.readouterr()
    assert main(["ckpt", "rm", ids[0]]) == 1  # pinned: refused, says why
    assert "pinned" in capsys.readouterr().err
    assert "deleted" in ff("rm", ids[0], "--force")
    assert not dirs[0].exists() and dirs[1].exists()
    assert [r["id"] for r in json.loads(ff("ls", "clijob", "--json"))] == [ids[1]]

    assert "keep the last 3" in ff("retention", "clijob")
    assert json.loads(ff("retention", "clijob", "--keep-last", "5", "--keep-every", "10", "--json")) == {
        "keep_last": 5, "keep_every": 10}

    capsys.readouterr()
    assert main(["ckpt", "show", "ckpt-none"]) == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_ff_ckpt_without_address_says_what_to_do(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("FF_CKPT_ADDR", raising=False)
    assert main(["ckpt", "--state-dir", str(tmp_path), "ls", "x"]) == 1
    assert "FF_CKPT_ADDR" in capsys.readouterr().err
    with pytest.raises(Exception, match="FF_CKPT_ADDR"):
        from fireflyer.ckpt.client import CheckpointClient

        CheckpointClient()
