"""``ff task``, ``ff nodes`` and ``ff quota`` (the ``ff`` entry point's main, in this process)
against running scheduler replicas found through FF_SCHED_ADDR."""

from __future__ import annotations

import json
import threading

import pytest

from fireflyer.cli.main import main


@pytest.fixture
def cli(sched, tokens, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    h = sched(replicas=2)
    for name, zone in (("n1", "A"), ("n2", "A"), ("n3", "B")):
        h.register(name, zone=zone)
    monkeypatch.setenv("FF_SCHED_ADDR", ",".join(h.addresses()))
    monkeypatch.setenv("FF_TOKEN", tokens["alice"])

    def ff(*args: str, code: int = 0, token: str | None = None) -> str:
        capsys.readouterr()
        if token is not None:
            monkeypatch.setenv("FF_TOKEN", tokens[token])
        try:
            got = main(list(args))
        finally:
            monkeypatch.setenv("FF_TOKEN", tokens["alice"])
        captured = capsys.readouterr()
        assert got == code, captured
        return captured.out if code == 0 else captured.err
    return h, ff


def test_submit_ls_status_logs_stop(cli) -> None:  # type: ignore[no-untyped-def]
    h, ff = cli
    out = ff("task", "submit", "-n", "2", "-p", "HIGH", "--name", "llama", "--grace", "3,20", "--signal", "SIGUSR1",
             "--max-restarts", "2", "--", "python", "train.py", "--lr", "3e-4")
    assert out.startswith("submitted task ") and "2 node(s), HIGH" in out
    tid = int(out.split()[2])
    chain = h.wait_chain(tid, lambda c: len(h.agents.ranks_of(c.runs[-1].id)) == 2, "running")
    spec = chain.runs[-1].spec
    assert list(spec.command) == ["python", "train.py", "--lr", "3e-4"] and spec.user == "alice"
    assert (spec.grace_ack_s, spec.grace_final_s, spec.signal, spec.max_restarts) == (3.0, 20.0, "SIGUSR1", 2)

    listing = ff("task", "ls")
    assert "llama" in listing and "RUNNING" in listing and str(tid) in listing
    status = ff("task", "status", str(tid))
    assert "RUN" in status and "ranks of run" in status and "n1" in status and "python train.py" in status
    data = json.loads(ff("task", "status", str(tid), "--json"))
    assert data["chain_id"] == str(tid) and [r["rank"] for r in data["runs"][-1]["ranks"]] == ["0", "1"]

    run_id = chain.runs[-1].id
    h.run(h.agents.write(run_id, 1, "loss 0.5\n"))
    assert "loss 0.5" in ff("task", "logs", str(tid), "--rank", "1")

    # -f follows until the rank ends
    got: list[str] = []
    follower = threading.Thread(target=lambda: got.append(str(main(["task", "logs", str(tid), "-f"]))))
    follower.start()
    h.run(h.agents.write(run_id, 0, "step 2\n"))
    h.run(h.agents.exit(run_id, 0, 0))
    follower.join(15)
    assert got == ["0"]

    assert "stopping" in ff("task", "stop", str(tid))
    h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "finished", "stopped")
    assert "no tasks" in ff("task", "ls")
    assert "CANCELLED" in ff("task", "ls", "--all")


def test_suspend_resume_priority_and_spec_file(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    h, ff = cli
    f = tmp_path / "exp.toml"
    f.write_text('name = "from-file"\npriority = "LOW"\n[spec]\nentrypoint = "train.py"\nparameters = "--epochs 3"\n'
                 '[resource]\nnode_count = 1\n[options]\nwhole_life_state = 4\n')
    out = ff("task", "submit", "-f", str(f), "-p", "NORMAL")
    tid = int(out.split()[2])
    run = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running", "running").runs[-1]
    assert list(run.spec.command) == ["python", "train.py", "--epochs", "3"] and run.spec.priority == "NORMAL"
    assert run.whole_life_state == 4 and run.spec.name == "from-file"
    assert "suspending" in ff("task", "suspend", str(tid))
    h.run(h.agents.go_suspend(run.id))
    h.wait_chain(tid, lambda c: len(c.runs) == 2, "requeued and held")
    assert "(held)" in ff("task", "ls")
    assert "released" in ff("task", "resume", str(tid))
    h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running", "resumed")
    assert "priority HIGH" in ff("task", "priority", str(tid), "high")

    bad = tmp_path / "bad.toml"
    bad.write_text('[resource]\nimage = "x"\n')
    assert "resource.image" in ff("task", "submit", "-f", str(bad), code=1)


def test_submit_from_a_yaml_spec_file(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """HAI's v2 experiment file as HAI writes it (YAML); a syntax error names the file and line."""
    h, ff = cli
    f = tmp_path / "exp.yaml"
    f.write_text("name: from-yaml\npriority: LOW\nspec:\n  entrypoint: train.py\n  parameters: --epochs 3\n"
                 "resource:\n  node_count: 1\noptions:\n  whole_life_state: 2\n")
    tid = int(ff("task", "submit", "-f", str(f)).split()[2])
    run = h.wait_chain(tid, lambda c: c.runs[-1].chain_status == "running", "running").runs[-1]
    assert list(run.spec.command) == ["python", "train.py", "--epochs", "3"] and run.spec.priority == "LOW"
    assert run.whole_life_state == 2 and run.spec.name == "from-yaml"
    ff("task", "stop", str(tid))
    bad = tmp_path / "bad.yml"
    bad.write_text("name: x\nresource:\n  node_count: [1\n")
    err = ff("task", "submit", "-f", str(bad), code=1)
    assert f"{bad}:" in err and "not valid YAML" in err, err


def test_bad_input_and_other_users(cli) -> None:  # type: ignore[no-untyped-def]
    h, ff = cli
    assert "nodes" in ff("task", "submit", "-n", "9", "--", "x", code=1)
    assert "command" in ff("task", "submit", "-n", "1", code=1)
    assert "priority" in ff("task", "submit", "-p", "URGENT", "--", "x", code=1)
    assert "grace" in ff("task", "submit", "--grace", "soon", "--", "x", code=1)
    assert "group" in ff("task", "submit", "-g", "nope", "--", "x", code=1)
    tid = int(ff("task", "submit", "--", "x").split()[2])
    err = ff("task", "stop", str(tid), code=1, token="bob")
    assert "belongs to alice" in err
    assert "no task 999" in ff("task", "status", "999", code=1)
    assert str(tid) in ff("task", "ls", token="root")


def test_nodes_and_quota(cli) -> None:  # type: ignore[no-untyped-def]
    h, ff = cli
    out = ff("nodes")
    assert "n1" in out and "n3" in out and "enabled" in out
    err = ff("nodes", "--drain", "n3", "--reason", "x", code=1)
    assert "admin" in err
    assert "reason" in ff("nodes", "--drain", "n3", code=1, token="root")
    assert "drained" in ff("nodes", "--drain", "n3", "--reason", "ECC errors", token="root")
    nodes = {n["name"]: n for n in json.loads(ff("nodes", "--json"))}
    assert nodes["n3"]["state"] == "drained" and nodes["n3"]["reason"] == "ECC errors"
    assert "enabled" in ff("nodes", "--enable", "n3", token="root")
    assert "no node 'n9'" in ff("nodes", "--enable", "n9", code=1, token="root")

    assert "admin" in ff("quota", "--set", "alice", "default", "HIGH", "2", code=1)
    assert "2 node(s)" in ff("quota", "--set", "alice", "default", "HIGH", "2", token="root")
    ff("task", "submit", "-p", "HIGH", "--", "x")
    h.wait_chain(h.run(h.client("alice").list())[0].chain_id, lambda c: c.runs[-1].chain_status == "running", "runs")
    out = ff("quota")
    assert "alice" in out and "HIGH" in out
    assert json.loads(ff("quota", "--json")) == [
        {"owner": "alice", "group": "default", "priority": "HIGH", "used": "1", "limit": "2"}]
    assert "removed" in ff("quota", "--remove", "alice", "default", "HIGH", token="root")


def test_a_cluster_without_nodes_says_so(sched, tokens, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    h = sched()
    monkeypatch.setenv("FF_SCHED_ADDR", ",".join(h.addresses()))
    monkeypatch.setenv("FF_TOKEN", tokens["alice"])
    assert main(["nodes"]) == 0 and "no nodes have registered" in capsys.readouterr().out
    assert main(["task", "submit", "--", "x"]) == 1
    assert "no node has registered" in capsys.readouterr().err


def test_without_a_scheduler_says_what_to_set(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("FF_SCHED_ADDR", raising=False)
    assert main(["task", "--state-dir", str(tmp_path), "ls"]) == 1
    assert "FF_SCHED_ADDR" in capsys.readouterr().err
