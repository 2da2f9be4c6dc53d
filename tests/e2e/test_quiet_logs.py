"""Normal life is INFO or DEBUG (issue 47, point 5): ``ff up`` of the default cluster, the
cluster forming (mgmtd electing a primary, storage making the chain tables, the checkpoint
service waiting for them), a file written and read through the data plane by short-lived
clients, and ``ff down`` leave no WARNING or ERROR line in any service's log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fireflyer.testing.cluster import REPO_ROOT, LocalCluster, run_ff, started_cluster
from fireflyer.testing.poll import wait_until

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

LOUD = {"warning", "error", "critical"}


def _events(logs: Path) -> list[dict[str, object]]:
    """Every JSON log line of every service (nats.log is the NATS server's own format)."""
    out = []
    for f in sorted(logs.glob("*.log")):
        if f.name == "nats.log":
            continue
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                d["_file"] = f.name
                out.append(d)
    return out


def _saw(logs: Path, event: str) -> bool:
    return any(e.get("event") == event for e in _events(logs))


def _ff_fs(c: LocalCluster, *args: str):  # type: ignore[no-untyped-def]
    res = run_ff(["fs", *args, "--state-dir", str(c.state_dir), "--role", "admin"],
                 env={"FF_TOKEN": "", "FF_META_ADDR": ""})
    assert res.returncode == 0, f"ff fs {' '.join(args)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def test_up_forming_io_and_down_log_no_warnings(tmp_path: Path) -> None:
    state = tmp_path / "ff-state"
    logs = state / "logs"
    with started_cluster(REPO_ROOT / "deploy" / "local.toml", state) as c:
        # formed: storage made chain table 1 and the checkpoint service gave /ckpt its chunk size
        wait_until(lambda: _saw(logs, "storage.chains_created") and _saw(logs, "checkpoint.chunk_size"),
                   timeout_s=90, what="the cluster formed (chains created, checkpoint chunk size set)")
        src = tmp_path / "data.bin"
        src.write_bytes(bytes(range(256)) * 4096)
        _ff_fs(c, "mkdir", "-p", "/quiet")
        _ff_fs(c, "put", str(src), "/quiet/data.bin")
        dst = tmp_path / "back.bin"
        _ff_fs(c, "get", "/quiet/data.bin", str(dst))
        assert dst.read_bytes() == src.read_bytes()
    # (started_cluster ran ff down and checked it succeeded)
    events = _events(logs)
    assert any(e.get("event") == "service.stopped" for e in events)
    loud = [e for e in events if e.get("level") in LOUD]
    assert not loud, "warnings/errors in a normal run:\n" + "\n".join(
        f"{e['_file']}: {e.get('level')} {e.get('event')} {e.get('error', '')}" for e in loud)
