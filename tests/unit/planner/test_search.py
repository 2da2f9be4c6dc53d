"""Enumeration, the memory and compute terms, and refused input."""

from __future__ import annotations

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.planner.comm import Grid
from fireflyer.planner.compute import compute_s, step_flops
from fireflyer.planner.memory import memory_per_gpu
from fireflyer.planner.models import MODELS, ModelShape, model_named
from fireflyer.planner.search import (
    EXCLUDED_BATCH,
    EXCLUDED_MEMORY,
    EXCLUDED_TENSOR,
    PlanRequest,
    plan,
    powers_of_two,
)
from fireflyer.planner.topology import GIB, topology_named

PERL = topology_named("perlmutter")


def test_presets():
    assert [(m.layers, m.hidden, m.min_tensor) for m in MODELS.values()] == [
        (24, 4096, 4), (32, 5120, 8), (32, 7168, 16), (38, 9216, 32), (42, 12288, 64)]
    assert model_named("80B") is MODELS["80b"]
    assert model_named("24x4096/4") == ModelShape(name="24x4096/4", layers=24, hidden=4096, min_tensor=4)
    assert model_named("2x64").min_tensor == 1


def test_enumeration_counts_every_excluded_configuration_with_its_reason():
    # 16 GPUs: (col, row, depth, data) powers of two with product 16 -> C(4+3, 3) = 35 ordered
    # splits of 2^4 into four factors. min tensor 4 removes those with data 16 or 8 (1 + 3 = 4 configs:
    # tensor 1 once, tensor 2 three ways); batch 4 removes depth x data > 4 among the rest.
    model = ModelShape(name="t", layers=2, hidden=256, min_tensor=4)
    p = plan(PlanRequest(model=model, topology=PERL, gpus=16, batch=4, memory=False, compute=False))
    assert p.considered == 35
    assert p.excluded[EXCLUDED_TENSOR] == 4
    for c in p.ranked:
        assert c.grid.gpus == 16 and c.grid.tensor >= 4 and 4 % (c.grid.depth * c.grid.data) == 0
    assert len(p.ranked) + sum(p.excluded.values()) == 35
    # the same constraints written as a set comprehension over all 4-tuples
    valid = {(c, r, d, x) for c in powers_of_two(16) for r in powers_of_two(16) for d in powers_of_two(16)
             for x in powers_of_two(16) if c * r * d * x == 16 and c * r * d >= 4 and 4 % (d * x) == 0}
    assert {c.grid.sizes() for c in p.ranked} == valid
    assert p.excluded[EXCLUDED_BATCH] == 35 - 4 - len(valid)


def test_memory_terms_by_hand():
    # 1 layer, H = 1024: 12 Mi weights. tensor 4 -> 3 Mi weights per GPU: 2 + 4 + 12 bytes each.
    model = ModelShape(name="t", layers=1, hidden=1024)
    m = memory_per_gpu(model, Grid(2, 1, 2, 1), batch=2, seq=512)
    mi = 2**20
    assert (m.parameters, m.gradients, m.optimizer) == (6 * mi, 12 * mi, 36 * mi)
    # gathered mlp tile 4 H^2 / (col*row) bf16, twice: 2 * 4 Mi / 2 * 2 = 8 MiB
    assert m.gathered == 8 * mi
    # 512 tokens per depth slice; input H/col, then 3H/row + H/col + 8H/row + H/col, bf16
    assert m.activations == 512 * 2 * (512 + 3 * 1024 + 512 + 8 * 1024 + 512)


def test_memory_term_excludes_what_does_not_fit_and_off_restores_the_released_ranking():
    on = plan(PlanRequest(model=model_named("80b"), topology=PERL, gpus=1024, batch=2048, compute=False))
    off = plan(PlanRequest(model=model_named("80b"), topology=PERL, gpus=1024, batch=2048, memory=False,
                           compute=False))
    assert on.excluded[EXCLUDED_MEMORY] > 0 and EXCLUDED_MEMORY not in off.excluded
    budget = 0.9 * PERL.gpu_memory_bytes
    assert all(c.memory is not None and c.memory.total <= budget for c in on.ranked)
    kept = {c.grid for c in on.ranked}
    assert [c.grid for c in off.ranked if c.grid in kept] == [c.grid for c in on.ranked]
    # pure data parallelism beyond the minimum would not fit 80B in 40 GiB: (1,1,64,16) holds 76e9 / 64 * 18 B
    assert memory_per_gpu(model_named("80b"), Grid(1, 1, 64, 16), 2048, 2048).total > 20 * GIB


def test_compute_term_adds_gemm_time():
    model = model_named("5b")
    # 8 flops per weight per token (forward, backward, recompute)
    assert step_flops(model, 128, 2048) == 8 * 128 * 2048 * 12 * 4096**2 * 24
    t = compute_s(model, 64, 128, 2048, PERL, efficiency=0.5)
    assert t == pytest.approx(step_flops(model, 128, 2048) / 64 / 156e12)
    p = plan(PlanRequest(model=model, topology=PERL, gpus=64, batch=128, memory=False, efficiency=0.5))
    assert all(c.step_s == pytest.approx(c.comm_s + t) for c in p.ranked)
    with pytest.raises(InvalidArgument, match="efficiency"):
        compute_s(model, 64, 128, 2048, PERL, efficiency=0)


@pytest.mark.parametrize(("gpus", "batch", "model", "argument"), [
    (1000, 2048, "80b", "gpus"),     # not a power of two
    (32, 2048, "80b", "gpus"),       # not divisible by the minimum tensor degree 64
    (1024, 100, "80b", "batch"),     # 1024 / 64 = 16 slices do not divide 100
    (1024, 0, "80b", "batch"),
])
def test_bad_input_names_the_argument(gpus, batch, model, argument):
    req = PlanRequest(model=model_named(model), topology=PERL, gpus=gpus, batch=batch)
    with pytest.raises(InvalidArgument) as e:
        plan(req)
    assert e.value.fields["argument"] == argument
    assert f"--{argument}" in str(e.value)


def test_fewer_gpus_than_a_node_are_fine():
    p = plan(PlanRequest(model=model_named("1x64"), topology=PERL, gpus=2, batch=8))
    assert {c.grid.sizes() for c in p.ranked} == {(2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)}


def test_unknown_presets():
    with pytest.raises(InvalidArgument, match="--model"):
        model_named("7b")
    with pytest.raises(InvalidArgument, match="--topology"):
        topology_named("frontier")
    assert topology_named("fireflyer2").gpus_per_node == 8
