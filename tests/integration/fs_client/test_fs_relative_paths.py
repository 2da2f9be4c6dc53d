"""Relative paths in the data clients: ``FileSystem``, fsspec ``ff3fs`` and ``ff fs put/get``
resolve a path without a leading ``/`` under the user's home ``/home/<user>``."""

from __future__ import annotations

import uuid
from pathlib import Path

from fireflyer.fs import FileSystem
from fireflyer.fs.fsspec_impl import FireFlyerFileSystem
from fireflyer.testing.cluster import LocalCluster, run_ff


def _user(cluster: LocalCluster) -> str:
    return next(t.user for t in cluster.tokens.tokens if "user" in t.roles)


def test_filesystem_home_whoami_and_relative_io(fs_cluster: LocalCluster, ffs: FileSystem) -> None:
    home = f"/home/{_user(fs_cluster)}"
    assert ffs.home == home  # ff up made it; whoami reports it
    me = ffs.whoami()
    assert me.home == home and me.roles == ("user",) and me.user == _user(fs_cluster)
    assert ffs.stat(home).uid == me.uid and ffs.stat(home).mode == 0o700
    d = f"rel-{uuid.uuid4().hex[:8]}"
    ffs.mkdir(f"{d}/sub", parents=True)
    assert ffs.write_bytes(f"{d}/sub/x.bin", b"in my home") == 10
    assert ffs.read_bytes(f"{home}/{d}/sub/x.bin") == b"in my home"
    assert ffs.abspath(f"{d}/sub") == f"{home}/{d}/sub" and ffs.abspath("/abs") == "/abs"
    with ffs.open(f"./{d}/t.txt", "w") as f:
        f.write("text")
    assert sorted(ffs.ls(d)) == ["sub", "t.txt"]
    assert [r.data for r in ffs.batch_read([(f"{d}/sub/x.bin", 3, 2)])] == [b"my"]
    ffs.rmtree(d)
    assert not ffs.exists(f"{home}/{d}")


def test_fsspec_relative_paths_resolve_under_the_home(fs_cluster: LocalCluster, ffs: FileSystem) -> None:
    home = f"/home/{_user(fs_cluster)}"
    fs = FireFlyerFileSystem(fs=ffs, skip_instance_cache=True)
    d = f"fss-{uuid.uuid4().hex[:8]}"
    fs.pipe_file(f"{d}/a.bin", b"abc")  # parents made as object stores do
    assert fs.cat_file(f"{d}/a.bin") == b"abc"
    assert fs.cat_file(f"ff3fs://{home}/{d}/a.bin") == b"abc"
    assert fs.ls(d, detail=False) == [f"{home}/{d}/a.bin"]
    assert fs.info(d)["name"] == f"{home}/{d}" and fs.info(d)["type"] == "directory"
    with fs.open(f"{d}/b.txt", "wb") as f:
        f.write(b"x")
    fs.mv(f"{d}/b.txt", f"{d}/c.txt")
    assert sorted(fs.ls(d, detail=False)) == [f"{home}/{d}/a.bin", f"{home}/{d}/c.txt"]
    fs.rm(d, recursive=True)
    assert not fs.exists(f"{home}/{d}")


def test_ff_fs_put_get_relative(fs_cluster: LocalCluster, tmp_path: Path) -> None:
    sd = ["--state-dir", str(fs_cluster.state_dir)]
    src = tmp_path / "in.txt"
    src.write_text("put into home\n")
    name = f"cli-{uuid.uuid4().hex[:8]}.txt"
    res = run_ff(["fs", "put", str(src), name, *sd])
    assert res.returncode == 0, res.stderr
    res = run_ff(["fs", "cat", f"/home/{_user(fs_cluster)}/{name}", *sd])
    assert res.returncode == 0 and res.stdout == "put into home\n"
    out = tmp_path / "out.txt"
    assert run_ff(["fs", "get", name, str(out), *sd]).returncode == 0
    assert out.read_text() == "put into home\n"
    assert run_ff(["fs", "rm", name, *sd]).returncode == 0
