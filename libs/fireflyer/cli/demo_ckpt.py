"""The checkpoint part of ``ff demo``: a tiny training loop saves through the cluster.

A model and its Adam optimizer train a few steps; every step is saved by a
:class:`~fireflyer.ckpt.CheckpointManager` whose catalog is the cluster's checkpoint service
and whose data goes to 3FS (with the user token, as a training job would), with
``keep_last=2`` (a later demo on the same state dir continues the job's steps); then the
latest checkpoint is loaded into a fresh model and optimizer and
compared bit for bit, and the job's checkpoints are listed as ``ff ckpt ls`` shows them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["checkpoint_demo"]


def checkpoint_demo(state_dir: Path, console: Any, *, steps: int = 3) -> bool:
    """Run the demo against the ``ff up`` cluster under ``state_dir``; True when the load matched."""
    try:
        import torch
    except ImportError:
        console.print("torch is not installed (pip install 'fireflyer[torch]'): checkpoint demo skipped")
        return True
    from fireflyer.ckpt import CheckpointManager
    from fireflyer.ckpt.client import CheckpointClient
    from fireflyer.cli.ckpt import ls_table
    from fireflyer.cluster.records import StatePaths, read_record, read_tokens
    from fireflyer.fs import connect
    from fireflyer.storage.serving import wait_chains_serving

    paths = StatePaths(state_dir)
    record = read_record(paths)
    assert record is not None
    tokens = read_tokens(paths.tokens)
    user = tokens.for_role("user") or tokens.for_role("admin")
    admin = tokens.for_role("admin")
    assert user is not None and admin is not None
    mgmtd = [p.address for p in record.processes if p.name == "mgmtd"]
    ckpt_addr = next((p.address for p in record.processes if p.name == "checkpoint"), None)
    if ckpt_addr is None or not mgmtd:
        console.print("the cluster file has no checkpoint service or mgmtd: checkpoint demo skipped")
        return True
    chains = wait_chains_serving(mgmtd, admin.token)
    console.print(f"3FS: {chains} storage chains serving")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fs = connect(state_dir=state_dir, token=user.token)
    client = CheckpointClient(ckpt_addr, token=user.token)
    try:
        with CheckpointManager("demo", catalog=client, fs=fs, keep_last=2) as mgr:
            # a cluster state dir outlives `ff down`: a second demo resumes the job's step count
            # (the catalog refuses a step below the newest committed one)
            last = mgr.latest()
            first = 1 if last is None else last.step + 1
            if last is not None:
                console.print(f"job demo has checkpoints up to step {last.step} from an earlier run: "
                              f"continuing at step {first}")
            for step in range(first, first + steps):
                opt.zero_grad()
                model(torch.randn(64, 256)).pow(2).mean().backward()
                opt.step()
                t0 = time.perf_counter()
                fut = mgr.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "step": step})
                stall = time.perf_counter() - t0
                rec = fut.result()
                console.print(f"step {step}: save returned after {stall * 1e3:.1f} ms; {rec.state.value} "
                              f"{rec.id} in {rec.directory} ({rec.nbytes / 1e6:.1f} MB) after "
                              f"{(time.perf_counter() - t0) * 1e3:.0f} ms")
            loaded = mgr.load()
        fresh = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
        fresh.load_state_dict(loaded["model"])
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
        fresh_opt.load_state_dict(loaded["optim"])
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(),
                                                       strict=True))
        same = same and all(torch.equal(a["exp_avg_sq"], b["exp_avg_sq"]) for a, b in
                            zip(opt.state_dict()["state"].values(), fresh_opt.state_dict()["state"].values(),
                                strict=True))
        console.print(f"loaded step {loaded['step']} into a fresh model and optimizer: "
                      f"{'bit-identical' if same else 'DIFFERENT'}")
        console.print(ls_table(client.list("demo")), highlight=False, markup=False)
        return same
    finally:
        client.close()
        fs.close()
