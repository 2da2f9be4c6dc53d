"""Several clients against two meta processes over one KV end with one consistent namespace.

Eight clients, each with a ``MetaClient`` spreading calls over both replicas, run
random create / rename / unlink / mkdir in *shared* directories.  Each client uses
only names with its own prefix for files (so it can keep an exact model of them)
while the directories, and the races to make them, are shared.  Afterwards a tree
walk must show: no duplicate and no lost entries, every listed entry stat-able with
the id the listing gave, directory parent pointers that match the walk, statfs
counts that match it, and for every client exactly the files its own successful
calls left (by inode id).  The second test kills one replica with SIGKILL in the
middle and expects the same, with every call having succeeded through failover.
"""

from __future__ import annotations

import asyncio
import errno as E
import os
import random
import signal
from dataclasses import dataclass, field

import pytest
from metasvc import Tokens

from fireflyer.core.errors import FsError
from fireflyer.fs import MetaClient
from fireflyer.meta import FileType
from fireflyer.testing.services import ServiceProcess

DIRS = [f"/t/d{i}" for i in range(6)]
CLIENTS = 8
OPS_PER_CLIENT = 60


@dataclass
class Model:
    """What one client knows for sure: its own files (path -> inode id) and dirs seen to exist."""

    me: int
    files: dict[str, int] = field(default_factory=dict)
    dirs_made: set[str] = field(default_factory=set)  # mkdir returned success to this client
    dirs_known: set[str] = field(default_factory=set)  # success or EEXIST: exists for good (no rmdir)
    ops: int = 0


async def _client(meta: MetaClient, model: Model, rng: random.Random, n_ops: int,
                  halfway: asyncio.Event | None = None) -> None:
    seq = 0
    for k in range(n_ops):
        if halfway is not None and k == n_ops // 2:
            halfway.set()
        d = rng.choice(DIRS)
        choice = rng.random()
        try:
            if choice < 0.2:
                try:
                    await meta.mkdir(d)
                    model.dirs_made.add(d)
                except FsError as e:
                    assert e.errno == E.EEXIST, e
                model.dirs_known.add(d)
            elif choice < 0.55 or not model.files:
                seq += 1
                path = f"{d}/c{model.me}_{seq}"
                try:
                    res = await meta.create(path, flags=os.O_CREAT | os.O_EXCL)
                except FsError as e:
                    # only a directory no one has made yet may be missing
                    assert e.errno == E.ENOENT and d not in model.dirs_known, e
                    continue
                assert res.created
                model.files[path] = res.inode.id
                model.dirs_known.add(d)
            elif choice < 0.8:
                src = rng.choice(sorted(model.files))
                seq += 1
                dst = f"{d}/c{model.me}_{seq}"
                try:
                    await meta.rename(src, dst)
                except FsError as e:
                    assert e.errno == E.ENOENT and d not in model.dirs_known, e
                    continue
                model.files[dst] = model.files.pop(src)
                model.dirs_known.add(d)
            else:
                victim = rng.choice(sorted(model.files))
                await meta.unlink(victim)
                del model.files[victim]
        finally:
            model.ops += 1


async def _walk(meta: MetaClient) -> tuple[dict[str, tuple[int, FileType]], set[str]]:
    """Every entry under / (path -> (id, type)), checking each against stat; and the dirs."""
    found: dict[str, tuple[int, FileType]] = {}
    dirs = {"/"}
    pending = ["/"]
    while pending:
        d = pending.pop()
        dir_inode = await meta.stat(d)
        entries = await meta.listdir(d)
        names = [e.name for e in entries]
        assert len(names) == len(set(names)), f"duplicate entries in {d}: {names}"
        assert names == sorted(names, key=lambda n: n.encode())
        for e in entries:
            path = f"{d.rstrip('/')}/{e.name}"
            st = await meta.lstat(path)
            assert (st.id, st.type) == (e.inode_id, e.type), f"{path}: listed {e}, stat {st}"
            assert path not in found
            found[path] = (e.inode_id, e.type)
            if e.type is FileType.DIR:
                assert (st.parent, st.name) == (dir_inode.id, e.name), f"{path}: parent pointer {st.parent}"
                dirs.add(path)
                pending.append(path)
            else:
                assert st.nlink == 1
    return found, dirs


async def _check(meta: MetaClient, models: list[Model]) -> None:
    found, dirs = await _walk(meta)
    files = {p: i for p, (i, t) in found.items() if t is FileType.FILE}
    # every client's files, by inode id, exactly as its own calls left them
    for m in models:
        mine = {p: i for p, i in files.items() if p.rsplit("/", 1)[1].startswith(f"c{m.me}_")}
        assert mine == m.files, f"client {m.me}: namespace {mine} != model {m.files}"
    assert len(set(files.values())) == len(files), "one inode listed under two names"
    # directories: each made exactly once (one success, the rest EEXIST), none lost
    made = [d for m in models for d in m.dirs_made]
    assert len(made) == len(set(made)), f"a mkdir succeeded twice: {sorted(made)}"
    assert dirs == {"/", "/t", *made}
    st = await meta.statfs()
    assert (st.files, st.dirs, st.symlinks) == (len(files), len(dirs), 0)
    assert st.inodes == len(found) + 1


async def _run(replicas: list[ServiceProcess], tokens: Tokens, *, kill_one: bool) -> list[Model]:
    for p in replicas:
        await p.wait_healthy(timeout_s=30)
    addresses = [p.address for p in replicas]
    async with await MetaClient.connect(addresses, tokens.admin) as admin:
        await admin.mkdir("/t", 0o777)
    models = [Model(i) for i in range(CLIENTS)]
    seed = random.randrange(1 << 30)
    halfway = asyncio.Event()
    clients = [await MetaClient.connect(addresses, tokens.bob, failover_timeout_s=20.0) for _ in range(CLIENTS)]
    try:
        work = [asyncio.create_task(_client(c, m, random.Random(seed + i), OPS_PER_CLIENT,
                                            halfway if i == 0 else None))
                for i, (c, m) in enumerate(zip(clients, models, strict=True))]
        if kill_one:
            await asyncio.wait_for(halfway.wait(), 60)
            os.kill(replicas[0].pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*work), 120)
        failovers = sum(c.failovers for c in clients)
        per_replica = {a: sum(c.calls_by_replica()[a] for c in clients) for a in addresses}
    finally:
        for c in clients:
            await c.close()
    assert all(m.ops == OPS_PER_CLIENT for m in models), f"seed {seed}"
    async with await MetaClient.connect([p.address for p in replicas if p.returncode is None],
                                        tokens.admin) as admin:
        await _check(admin, models)
    assert all(n > 0 for n in per_replica.values()), f"a replica got no calls: {per_replica}"
    if kill_one:
        assert replicas[0].wait(5) == -signal.SIGKILL
        assert failovers > 0
    return models


@pytest.mark.slow
async def test_eight_clients_two_replicas_consistent_namespace(replicas: list[ServiceProcess],
                                                               tokens: Tokens) -> None:
    models = await _run(replicas, tokens, kill_one=False)
    assert sum(len(m.files) for m in models) > 0


@pytest.mark.slow
async def test_replica_killed_mid_run_clients_fail_over(replicas: list[ServiceProcess], tokens: Tokens) -> None:
    await _run(replicas, tokens, kill_one=True)
