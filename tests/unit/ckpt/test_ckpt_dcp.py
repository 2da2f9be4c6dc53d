"""torch.distributed.checkpoint over LocalFS through FFStorageWriter / FFStorageReader."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fireflyer.ckpt import CheckpointCorrupted, LocalFS
from fireflyer.ckpt.dcp import METADATA_NAME, FFStorageReader, FFStorageWriter

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def trained(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    return model, opt


def test_dcp_round_trip_model_and_optimizer(tmp_path):
    fs = LocalFS(tmp_path)
    model, opt = trained(0)
    msd, osd = get_state_dict(model, opt)
    extra = {"bf": torch.randn(5).bfloat16(), "i": torch.arange(4), "note": "x", "step": 3}
    dcp.save({"model": msd, "optim": osd, "extra": extra}, storage_writer=FFStorageWriter("ck/1", fs=fs))
    assert (tmp_path / "ck" / "1" / METADATA_NAME).exists()

    model2, opt2 = trained(1)  # different values, same structure
    msd2, osd2 = get_state_dict(model2, opt2)
    target = {"model": msd2, "optim": osd2,
              "extra": {"bf": torch.zeros(5, dtype=torch.bfloat16), "i": torch.zeros(4, dtype=torch.int64),
                        "note": "", "step": 0}}
    bf_before = target["extra"]["bf"]
    dcp.load(target, storage_reader=FFStorageReader("ck/1", fs=fs))
    assert target["extra"]["bf"] is bf_before and torch.equal(bf_before, extra["bf"])  # filled in place
    assert torch.equal(target["extra"]["i"], extra["i"]) and target["extra"]["step"] == 3
    assert target["extra"]["note"] == "x"
    set_state_dict(model2, opt2, model_state_dict=target["model"], optim_state_dict=target["optim"])
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    for k in s1:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1[k][name], s2[k][name])


def test_dcp_detects_corruption_and_missing_checkpoint(tmp_path):
    fs = LocalFS(tmp_path)
    w = torch.arange(1000, dtype=torch.float32)
    dcp.save({"w": w}, storage_writer=FFStorageWriter("ck", fs=fs))
    data_file = next(p for p in (tmp_path / "ck").iterdir() if p.name.endswith("_data"))
    raw = bytearray(data_file.read_bytes())
    raw[100] ^= 1
    data_file.write_bytes(bytes(raw))
    # DCP wraps each rank's error in its CheckpointException (a BaseException)
    with pytest.raises(CheckpointException) as e:
        dcp.load({"w": torch.zeros(1000)}, storage_reader=FFStorageReader("ck", fs=fs))
    assert isinstance(rank_error(e.value), CheckpointCorrupted) and "CRC32C" in str(rank_error(e.value))
    with pytest.raises(CheckpointException) as e:
        dcp.load({"w": torch.zeros(1000)}, storage_reader=FFStorageReader("nothing", fs=fs))
    assert "no DCP checkpoint at nothing" in str(rank_error(e.value))  # our NotFound, wrapped by DCP


def rank_error(exc: CheckpointException) -> BaseException:
    return next(iter(exc.failures.values()))[0]
