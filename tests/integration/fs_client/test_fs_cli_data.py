"""``ff fs put|get|cat|du|cp`` end to end against the running cluster."""

from __future__ import annotations

import os
from pathlib import Path

from fsc_common import CHUNK

from fireflyer.testing.cluster import LocalCluster, run_ff


def test_ff_fs_put_get_cat_du_cp(fs_cluster: LocalCluster, workdir: str, tmp_path: Path) -> None:
    sd = ["--state-dir", str(fs_cluster.state_dir)]
    src = tmp_path / "in.bin"
    data = os.urandom(2 * CHUNK + 99)
    src.write_bytes(data)
    res = run_ff(["fs", "put", str(src), f"{workdir}/x.bin", *sd])
    assert res.returncode == 0, res.stderr
    res = run_ff(["fs", "cp", f"{workdir}/x.bin", f"{workdir}/y.bin", *sd])
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out.bin"
    res = run_ff(["fs", "get", f"{workdir}/y.bin", str(out), *sd])
    assert res.returncode == 0, res.stderr
    assert out.read_bytes() == data
    (tmp_path / "small.txt").write_text("hello 3fs\n")
    assert run_ff(["fs", "put", str(tmp_path / "small.txt"), f"{workdir}/s.txt", *sd]).returncode == 0
    res = run_ff(["fs", "cat", f"{workdir}/s.txt", *sd])
    assert res.returncode == 0 and res.stdout == "hello 3fs\n"
    res = run_ff(["fs", "du", "-s", workdir, *sd])
    assert res.returncode == 0 and res.stdout.split()[0] == str(2 * len(data) + 10)
    res = run_ff(["fs", "cat", f"{workdir}/missing", *sd])
    assert res.returncode == 1 and "missing" in res.stderr
