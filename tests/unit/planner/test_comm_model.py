"""The communication model: hand-computed small cases and the released AxoNN model's figures.

Expected values for the presets were worked out by hand from the formulas of AxoNN's released
model (axonn-ai/Megatron-AxoNN, examples/comm_model.py at 8a4ae24; GiB and "GB/s" = 2**30 B/s
there); the rankings were read off that model run with the same inputs (seq 2048, batch
128 / 512 / 2048), whose stable sort leaves ties in (col, row, depth, data) order.
"""

from __future__ import annotations

import msgspec
import pytest

from fireflyer.planner.comm import Grid, placements, step_comm
from fireflyer.planner.models import ModelShape, model_named
from fireflyer.planner.search import PlanRequest, plan
from fireflyer.planner.topology import GIB, topology_named

PERL = topology_named("perlmutter")
REL = 1e-12


def _plan(model: str, gpus: int, batch: int):
    return plan(PlanRequest(model=model_named(model), topology=PERL, gpus=gpus, batch=batch,
                            memory=False, compute=False))


def test_column_only_pair_by_hand():
    # 1 layer, H = 1024, 1024 tokens, col = 2 on an NVLink pair (76 GiB/s). A 2-rank ring
    # all-reduce moves M bytes. Non-transposed qkv (3H) and mlp-up (4H): two all-reduces of
    # m*K*H*2 bytes each -> 2*2*(3+4) mH = 28 mH; transposed attn-out and mlp-down put their
    # narrow side (m*H*2 bytes, once) on col -> 4 mH. 32 mH bytes = 2**25 B = 1/32 GiB.
    model = ModelShape(name="t", layers=1, hidden=1024)
    t = step_comm(model, Grid(2, 1, 1, 1), 1, 1024, PERL)
    assert t.col == pytest.approx(1 / 32 / 76, rel=REL)
    assert t.row == t.depth == t.data == 0


def test_row_only_pair_by_hand():
    # row = 2: narrow side of qkv and mlp-up (m*H*2 bytes once each: 4 mH) plus the wide side of
    # attn-out (K=1) and mlp-down (K=4), twice each: 2*2*(1+4) mH = 20 mH; 24 mH bytes in all.
    model = ModelShape(name="t", layers=1, hidden=1024)
    t = step_comm(model, Grid(1, 2, 1, 1), 1, 1024, PERL)
    assert t.row == pytest.approx(24 / 1024 / 76, rel=REL)


def test_depth_and_data_by_hand_with_placement():
    # 2 layers, H = 1024 -> 12 H^2 = 12 Mi weights per layer (24 MiB bf16, 48 MiB fp32 grads).
    # depth = 4 with nothing inside: whole Perlmutter node, 225 GiB/s; 2 all-gathers + 1
    # reduce-scatter = 3 * 3/4 * 24 MiB. data = 2 with 4 ranks inside: crosses nodes, 80/4 = 20
    # GiB/s; all-reduce of the 48/4 MiB shard = 2 * 1/2 * 12 MiB.
    model = ModelShape(name="t", layers=2, hidden=1024)
    t = step_comm(model, Grid(1, 1, 4, 2), 8, 16, PERL)
    assert t.depth == pytest.approx(2 * 3 * 0.75 * (24 / 1024) / 225, rel=REL)
    assert t.data == pytest.approx(2 * (12 / 1024) / 20, rel=REL)
    assert t.col == t.row == 0


def test_grad_accumulation_repeats_the_depth_gathers():
    model = ModelShape(name="t", layers=2, hidden=1024)
    one = step_comm(model, Grid(1, 1, 4, 2), 8, 16, PERL)
    four = step_comm(model, Grid(1, 1, 4, 2), 8, 16, PERL, grad_acc=4)
    assert four.depth == pytest.approx(4 * one.depth, rel=REL)
    assert four.data == one.data


def test_perlmutter_bandwidth_table():
    bw = {(ip, p): PERL.bandwidth(ip, p) / GIB for ip in (1, 2, 4, 8) for p in (2, 4, 8, 16)}
    assert [bw[1, 2], bw[1, 4], bw[1, 8], bw[1, 16]] == [76, 225, 80, 80]
    assert [bw[2, 2], bw[2, 4], bw[2, 8]] == [76, 40, 40]
    assert {bw[4, p] for p in (2, 4, 8, 16)} == {20} == {bw[8, p] for p in (2, 4, 8, 16)}


# Top of the released model's ranking, by hand:
#  80b: (1,1,1024,1): 42 layers * 3 * 1023/1024 * (12 * 12288^2 * 2 B = 3.375 GiB) / 80 = 5.3104339599609375
#       (1,1,512,2): 42 * [3 * 511/512 * 3.375 / 80 + (3.375 * 2 / 512) / 20] = 5.332928466796875
#  20b: (1,1,256,1): 32 * 3 * 255/256 * (12 * 7168^2 * 2 B = 1.1484375 GiB) / 80 = 1.37274169921875
#   5b: (1,1,64,1):  24 * 3 * 63/64 * (12 * 4096^2 * 2 B = 0.375 GiB) / 80 = 0.3322265625
RELEASED_TOP = {
    ("80b", 1024, 2048): [((1, 1, 1024, 1), 5.3104339599609375), ((1, 1, 512, 2), 5.332928466796875)],
    ("20b", 256, 512): [((1, 1, 256, 1), 1.37274169921875)],
    ("5b", 64, 128): [((1, 1, 64, 1), 0.3322265625)],
}

# The released model's first eight (col, row, depth, data), read off its output for these inputs.
RELEASED_ORDER = {
    ("80b", 1024, 2048): [(1, 1, 1024, 1), (1, 1, 512, 2), (1, 1, 256, 4), (1, 1, 128, 8), (1, 1, 64, 16),
                          (1, 2, 512, 1), (1, 4, 256, 1), (1, 4, 128, 2)],
}
RELEASED_COUNTS = {("5b", 64, 128): 80, ("20b", 256, 512): 145, ("80b", 1024, 2048): 230}


@pytest.mark.parametrize("case", sorted(RELEASED_TOP))
def test_released_model_top_times(case):
    ranked = _plan(*case).ranked
    for (sizes, seconds), cand in zip(RELEASED_TOP[case], ranked, strict=False):
        assert cand.grid.sizes() == sizes
        assert cand.comm_s == pytest.approx(seconds, rel=REL)


@pytest.mark.parametrize("case", sorted(RELEASED_COUNTS))
def test_released_model_counts_and_tensor_exclusions(case):
    p = _plan(*case)
    assert len(p.ranked) == RELEASED_COUNTS[case]
    assert set(p.excluded) <= {"tensor degree below the model's minimum"}


def test_released_model_order_80b():
    p = _plan("80b", 1024, 2048)
    assert [c.grid.sizes() for c in p.ranked[:8]] == RELEASED_ORDER[("80b", 1024, 2048)]
    # first configuration with a row dimension: the released model gives 6.5487 s
    assert p.ranked[5].comm_s == pytest.approx(6.548663972553455, rel=1e-12)


@pytest.mark.parametrize("case", sorted(RELEASED_COUNTS))
def test_ranking_is_sorted_and_deterministic(case):
    a, b = _plan(*case), _plan(*case)
    assert [c.grid for c in a.ranked] == [c.grid for c in b.ranked]
    times = [c.comm_s for c in a.ranked]
    assert times == sorted(times)


def test_ties_keep_enumeration_order():
    # 80b with batch 16: the released model has exactly tied configurations; a stable sort keeps
    # them in (col, row, depth, data) order
    ranked = _plan("80b", 1024, 16).ranked
    for x, y in zip(ranked, ranked[1:], strict=False):
        if x.comm_s == y.comm_s:
            assert x.grid.sizes() < y.grid.sizes()


def test_fireflyer2_puts_a_size_two_innermost_group_on_the_nvlink_pair():
    ff2 = topology_named("fireflyer2")
    assert ff2.link_name(1, 2) == "nvlink" and ff2.bandwidth(1, 2) == 600e9
    assert ff2.link_name(2, 2) == "intra-node" and ff2.bandwidth(2, 2) < 40e9
    assert ff2.link_name(8, 2) == "network" and ff2.bandwidth(8, 2) == 25e9 / 8
    # tensor parallelism of 2 on 64 GPUs (HaiScale's practice): the best such layout is a size-2
    # col or row group with nothing inside it, i.e. on the bridged pair, not depth = 2
    model = ModelShape(name="t", layers=30, hidden=4096, min_tensor=2)
    req = PlanRequest(model=model, topology=ff2, gpus=64, batch=64, memory=False, compute=False)
    best = next(c for c in plan(req).ranked if c.grid.tensor == 2)
    assert best.grid.depth == 1 and best.grid.data == 32
    dim, (inner, size) = next((d, ps) for d, ps in placements(best.grid).items() if d in ("col", "row") and ps[1] == 2)
    assert (inner, size) == (1, 2) and ff2.link_name(inner, size) == "nvlink"
    # without the bridges the same group would run over PCIe, far slower
    bare = msgspec.structs.replace(ff2, nvlink_pair_Bps=0.0)
    slow = step_comm(model, best.grid, 64, 2048, bare)
    assert getattr(slow, dim) > 10 * getattr(best.comm, dim)
