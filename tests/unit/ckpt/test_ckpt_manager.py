"""CheckpointManager over the real Catalog (SQLite KV) and LocalFS: saves, loads, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest
import torch

from fireflyer.ckpt import CheckpointCorrupted, CheckpointManager, CkptState, LocalFS, decode_index
from fireflyer.ckpt.index import TensorEntry, index_name
from fireflyer.ckpt.localfs import LocalResult
from fireflyer.core.clock import ManualClock
from fireflyer.core.errors import FailedPrecondition, FsError, InvalidArgument, NotFound


def assert_same(a, b, path="") -> None:
    if isinstance(a, dict):
        assert type(b) is dict and list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
        return
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.contiguous().reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path
    else:
        assert a == b or (a != a and b != b), path


def nested_state(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(3, 5, generator=g), "b": torch.randn(5, generator=g).bfloat16(),
                  "h": torch.randn(4, generator=g).half(), "idx": torch.arange(7, dtype=torch.int64),
                  "f8": torch.randn(4, generator=g).to(torch.float8_e4m3fn), "t": torch.randn(4, 3, generator=g).t()},
        "np": [np.arange(6, dtype=np.float16).reshape(2, 3), np.ones((2, 2), dtype=ml_dtypes.bfloat16),
               np.full(3, 0.5, dtype=ml_dtypes.float8_e5m2), np.float32(1.5)],
        0: ("x", 1, 2.5, None, True, b"raw", float("nan")),
        "step": 10,
    }


@pytest.fixture
def mgr(tmp_path):
    m = CheckpointManager("job-a", root=tmp_path, shard_bytes=256, io_threads=3)
    yield m
    m.close()


def test_round_trip_and_snapshot_isolation(mgr):
    state = nested_state()
    expected = nested_state()
    fut = mgr.save(1, state)
    state["model"]["w"].add_(100)  # training goes on right after save returns
    state["np"][0] += 1
    rec = fut.result()
    assert rec.committed and rec.step == 1 and mgr.last_saved_step == 1
    assert_same(expected, mgr.load())
    assert mgr.latest().id == rec.id
    assert [r.step for r in mgr.list()] == [1]


def test_keys_subset_and_step_selection(mgr):
    mgr.save(1, nested_state(1), blocking=True).result()
    mgr.save(2, nested_state(2), blocking=True).result()
    part = mgr.load(keys=["model/w", ("np", 1)])
    assert list(part) == ["model", "np"] and list(part["model"]) == ["w"]
    assert_same(nested_state(2)["model"]["w"], part["model"]["w"])
    assert part["np"][0] is None and part["np"][1].dtype == ml_dtypes.bfloat16
    assert_same(nested_state(1), mgr.load(step=1))
    with pytest.raises(NotFound, match="job-a.*step 7"):
        mgr.load(step=7)


def test_adam_state_round_trips_and_resumes(tmp_path):
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(model, opt, seed):
        opt.zero_grad()
        model(torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))).pow(2).mean().backward()
        opt.step()

    model, opt = make()
    for i in range(3):
        step(model, opt, i)
    with CheckpointManager("adam", root=tmp_path) as m:
        m.save(3, {"model": model.state_dict(), "optim": opt.state_dict()}, blocking=True).result()
        loaded = m.load()
    assert_same(opt.state_dict(), loaded["optim"])
    model2, opt2 = make()
    model2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["optim"])
    step(model, opt, 9)
    step(model2, opt2, 9)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_replicated_state_from_rank0_loads_on_any_rank(tmp_path):
    with CheckpointManager("rep", root=tmp_path, rank=0, world_size=1) as m:
        m.save(5, nested_state(), blocking=True).result()
    with CheckpointManager("rep", root=tmp_path, rank=3, world_size=4) as m3:
        assert m3.rank == 3
        assert_same(nested_state(), m3.load())


def test_rank_and_world_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FF_RANK", "2")
    monkeypatch.setenv("FF_WORLD_SIZE", "4")
    with CheckpointManager("env", root=tmp_path) as m:
        assert (m.rank, m.world_size) == (2, 4)
    monkeypatch.setenv("FF_RANK", "x")
    with pytest.raises(InvalidArgument, match="FF_RANK"):
        CheckpointManager("env", root=tmp_path)


def test_no_catalog_configured(monkeypatch, tmp_path):
    from fireflyer.core.errors import NoClusterFound

    for var in ("FF_CKPT_ADDR", "FF_META_ADDR", "FF_MGMTD_ADDR", "FF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FF_STATE_DIR", str(tmp_path / "none"))
    with pytest.raises(NoClusterFound, match="no Fire-Flyer cluster found.*FF_CKPT_ADDR.*pass root=DIR") as e:
        CheckpointManager("nocat")
    assert e.value.job == "nocat" and e.value.missing.startswith("ckpt")


def test_bad_input_writes_nothing(mgr, tmp_path):
    mgr.save(5, {"x": torch.ones(3)}, blocking=True).result()
    dirs = sorted(os.listdir(tmp_path / "job-a"))
    with pytest.raises(FailedPrecondition, match="step 3"):
        mgr.save(3, {"x": torch.ones(3)})
    with pytest.raises(InvalidArgument, match="step"):
        mgr.save(-1, {"x": torch.ones(3)})
    with open(__file__) as f, pytest.raises(InvalidArgument, match="opt/file"):
        mgr.save(6, {"x": torch.ones(3), "opt": {"file": f}})
    with pytest.raises(InvalidArgument, match="fn"):
        mgr.save(6, {"fn": lambda: 0})
    assert [r.step for r in mgr.list(include_all=True)] == [5]
    assert sorted(os.listdir(tmp_path / "job-a")) == dirs
    assert mgr.save(6, {"x": torch.zeros(3)}, blocking=True).result().committed  # still usable


class FailingFS(LocalFS):
    """Fails the first ``fail`` batch writes (a full disk, a lost storage target)."""

    fail = 1

    def batch_write(self, ios):
        if self.fail:
            self.fail -= 1
            return [LocalResult(error=FsError(f"write {p}: no space left", errno=28, path=p)) for p, _o, _d in ios]
        return super().batch_write(ios)


def test_write_failure_aborts_and_manager_stays_usable(tmp_path):
    with CheckpointManager("fail", root=tmp_path, fs=FailingFS(tmp_path), io_threads=1) as m:
        fut = m.save(1, {"x": torch.ones(4)})
        with pytest.raises(FsError, match="no space"):
            fut.result()
        recs = m.list(include_all=True)
        assert [(r.step, r.state) for r in recs] == [(1, CkptState.ABORTED)]
        assert not os.path.exists(tmp_path / recs[0].directory.lstrip("/"))
        assert m.latest() is None
        assert m.save(1, {"x": torch.ones(4)}, blocking=True).result().committed  # the same step again
        assert m.last_saved_step == 1


def test_corrupted_shard_names_tensor_and_checkpoint(mgr, tmp_path):
    rec = mgr.save(1, nested_state(), blocking=True).result()
    directory = tmp_path / rec.directory.lstrip("/")
    index = decode_index((directory / index_name(0)).read_bytes())
    e = next(e for e in index.entries if isinstance(e, TensorEntry) and e.path == "model/w")
    shard = directory / index.shards[e.shard].name
    data = bytearray(shard.read_bytes())
    data[e.offset + 5] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupted) as err:
        mgr.load()
    msg = str(err.value)
    assert "model/w" in msg and rec.id in msg and "step 1" in msg
    assert err.value.checkpoint == rec.id
    assert_same(nested_state()["np"], mgr.load(keys=["np"])["np"])  # the intact part still loads


def test_corrupted_index_is_caught_by_its_committed_digest(mgr, tmp_path):
    rec = mgr.save(1, nested_state(), blocking=True).result()
    path = tmp_path / rec.directory.lstrip("/") / index_name(0)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # still decodes, or not: either way it is not what rank 0 committed
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupted, match="does not match the digest") as err:
        mgr.load()
    assert err.value.checkpoint == rec.id and rec.id in str(err.value)


def test_maybe_save_saves_at_its_first_call_then_every_interval(tmp_path):
    clock = ManualClock()
    with CheckpointManager("iv", root=tmp_path, interval_s=10, clock=clock) as m:
        clock.advance(3)
        first = m.maybe_save(1, {"x": torch.ones(2)})  # the first call saves, whatever the interval
        assert first is not None and first.result().step == 1
        clock.advance(9.5)
        assert m.maybe_save(2, {"x": torch.ones(2)}) is None
        clock.advance(0.5)
        fut = m.maybe_save(3, {"x": torch.ones(2)})
        assert fut is not None and fut.result().step == 3
        clock.advance(5)
        m.save(4, {"x": torch.ones(2)}, blocking=True)  # an explicit save restarts the interval
        clock.advance(9)
        assert m.maybe_save(5, {"x": torch.ones(2)}) is None
        clock.advance(1)
        assert m.maybe_save(6, {"x": torch.ones(2)}).result().step == 6
        assert [r.step for r in m.list()] == [3, 4, 6]  # keep_last=3 by default


def test_maybe_save_with_the_default_interval_saves_in_a_short_job(tmp_path):
    clock = ManualClock()
    with CheckpointManager("short", root=tmp_path, clock=clock) as m:
        assert m.interval_s == 300.0
        saved = [s for s in range(20) if (clock.advance(1.0), m.maybe_save(s, {"x": torch.ones(2)}))[1]]
        m.wait()
        assert saved == [0] and m.latest().step == 0  # a 20 s job still has a checkpoint


def test_maybe_save_with_interval_zero_saves_every_call(tmp_path):
    with CheckpointManager("every", root=tmp_path, interval_s=0, clock=ManualClock()) as m:
        for step in range(3):
            assert m.maybe_save(step, {"x": torch.ones(2)}) is not None
        m.wait()
        assert [r.step for r in m.list()] == [0, 1, 2]


def test_retention_keep_last(tmp_path):
    with CheckpointManager("ret", root=tmp_path, keep_last=2) as m:
        for step in range(1, 5):
            m.save(step, {"x": torch.full((3,), float(step))})
        m.wait()
        assert [r.step for r in m.list()] == [3, 4]
        assert len(os.listdir(tmp_path / "ret")) == 2
        assert torch.equal(m.load()["x"], torch.full((3,), 4.0))


# -- several processes -----------------------------------------------------------------------------
RANK_SCRIPT = textwrap.dedent("""
    import sys, torch
    from fireflyer.ckpt import CheckpointManager

    def rank_state(rank):
        g = torch.Generator().manual_seed(100 + rank)
        return {"rank": rank, "w": torch.randn(64, 33, generator=g),
                "opt": [torch.randn(5, generator=g).bfloat16(), torch.arange(rank + 3)]}

    if __name__ == "__main__":
        root, rank = sys.argv[1], int(sys.argv[2])
        with CheckpointManager("multi", root=root, rank=rank, world_size=4, shard_bytes=4096) as m:
            m.save(7, rank_state(rank), blocking=True).result()
""")


def _python(script: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_four_ranks_commit_one_checkpoint(tmp_path):
    procs = [_python(RANK_SCRIPT, str(tmp_path), str(r)) for r in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    ns: dict = {}
    exec(RANK_SCRIPT, ns)  # the same rank_state
    for r in range(4):
        with CheckpointManager("multi", root=tmp_path, rank=r, world_size=4) as m:
            recs = m.list(include_all=True)
            assert [(x.step, x.state, x.world_size, x.ranks_committed) for x in recs] == \
                [(7, CkptState.COMMITTED, 4, 4)]
            assert_same(ns["rank_state"](r), m.load())


KILL_SCRIPT = textwrap.dedent("""
    import sys, threading, torch
    from fireflyer.ckpt import CheckpointManager

    root, marker = sys.argv[1], sys.argv[2]
    armed = []

    def pause_after_first_io():
        if armed:
            open(marker, "w").close()
            threading.Event().wait()  # the parent kills us here, mid-save

    state = {"a": torch.ones(1024), "b": torch.zeros(1024), "c": torch.arange(1024)}
    with CheckpointManager("killed", root=root, shard_bytes=4096, io_threads=1,
                           after_write=pause_after_first_io) as m:
        m.save(1, state, blocking=True).result()
        armed.append(True)
        m.save(2, state).result()
""")


def test_writer_killed_mid_save_is_swept(tmp_path):
    marker = tmp_path / "paused"
    p = _python(KILL_SCRIPT, str(tmp_path / "root"), str(marker))
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert p.poll() is None, p.communicate()[1].decode()
            assert time.monotonic() < deadline, "the writer never reached its first shard I/O"
            time.sleep(0.02)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=60)
    root = tmp_path / "root"
    with CheckpointManager("killed", root=root) as m:  # the real clock: not abandoned yet
        recs = m.list(include_all=True)
        assert [(r.step, r.state) for r in recs] == [(1, CkptState.COMMITTED), (2, CkptState.PENDING)]
        partial = root / recs[1].directory.lstrip("/")
        assert partial.exists() and any(n.endswith(".bin") for n in os.listdir(partial))
        assert m.latest().step == 1
    clock = ManualClock(start=time.time() + 3600)
    with CheckpointManager("killed", root=root, clock=clock, abandon_after_s=60) as m:
        assert not partial.exists()
        assert [(r.step, r.state) for r in m.list(include_all=True)] == \
            [(1, CkptState.COMMITTED), (2, CkptState.ABORTED)]
        assert m.latest().step == 1
        assert torch.equal(m.load()["c"], torch.arange(1024))
