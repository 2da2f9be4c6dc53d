"""A random sequence of file operations, applied to 3FS and to a local directory, must agree."""

from __future__ import annotations

import os
import random
from pathlib import Path

from fsc_common import CHUNK

from fireflyer.fs import FileSystem


def test_random_operations_match_a_local_directory(ffs: FileSystem, workdir: str, local_dir: Path) -> None:
    rng = random.Random(20240814)
    names = ["a", "b", "c", "d"]
    ops = 0
    for _ in range(120):
        name, other = rng.choice(names), rng.choice(names)
        remote, local = f"{workdir}/{name}", local_dir / name
        op = rng.choice(["create", "write", "pwrite", "pwrite", "truncate", "rename", "unlink", "read", "append"])
        exists = local.exists()
        if op == "create":
            data = rng.randbytes(rng.randrange(0, 3 * CHUNK))
            ffs.write_bytes(remote, data)
            local.write_bytes(data)
        elif not exists:
            continue
        elif op in ("write", "pwrite"):
            off = rng.randrange(0, 4 * CHUNK)
            data = rng.randbytes(rng.randrange(1, CHUNK + 10))
            with ffs.open(remote, "r+b", buffering=0) as f:
                f.pwrite(data, off)
            fd = os.open(local, os.O_WRONLY)
            try:
                os.pwrite(fd, data, off)
            finally:
                os.close(fd)
        elif op == "append":
            data = rng.randbytes(rng.randrange(1, 5000))
            with ffs.open(remote, "ab") as f:
                f.write(data)
            with open(local, "ab") as lf:
                lf.write(data)
        elif op == "truncate":
            n = rng.randrange(0, 4 * CHUNK)
            ffs.truncate(remote, n)
            os.truncate(local, n)
        elif op == "rename":
            ffs.rename(remote, f"{workdir}/{other}")
            local.rename(local_dir / other)
        elif op == "unlink":
            ffs.unlink(remote)
            local.unlink()
        elif op == "read":
            size = local.stat().st_size
            off = rng.randrange(0, size + 10)
            n = rng.randrange(0, 2 * CHUNK)
            with ffs.open(remote, "rb", buffering=0) as f:
                got = f.pread(n, off)
            with open(local, "rb") as lf:
                lf.seek(off)
                assert got == lf.read(n), f"read {name} [{off}, +{n})"
        ops += 1
        assert sorted(ffs.ls(workdir)) == sorted(p.name for p in local_dir.iterdir())
    assert ops > 60
    for p in local_dir.iterdir():
        assert ffs.stat(f"{workdir}/{p.name}").length == p.stat().st_size
        assert ffs.read_bytes(f"{workdir}/{p.name}") == p.read_bytes(), p.name
