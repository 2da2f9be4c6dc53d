"""HFReduce's bandwidth model against the Fire-Flyer paper's section IV-D figures."""

from __future__ import annotations

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.planner.hfreduce_model import compare, hfreduce_allreduce, nccl_ring_allreduce
from fireflyer.planner.topology import topology_named

FF2 = topology_named("fireflyer2")


def test_theoretical_bound_is_host_memory_over_24():
    # paper: 320 GB/s of memory bandwidth, 24 memory operations per byte -> about 13.3 GB/s
    one = hfreduce_allreduce(FF2, 1)
    assert one.bounds["host memory"] == pytest.approx(320e9 / 24)
    assert one.bandwidth / 1e9 == pytest.approx(13.3, abs=0.05)
    assert one.binding == "host memory" and "network" not in one.bounds


@pytest.mark.parametrize("nodes", [2, 16, 180])
def test_with_the_network_about_12_and_the_nic_binds(nodes):
    # one 200 Gb/s NIC (25 GB/s); a double binary tree sends and receives 2 bytes per byte -> 12.5
    m = hfreduce_allreduce(FF2, nodes)
    assert m.theoretical / 1e9 == pytest.approx(13.33, abs=0.01)
    assert m.bandwidth / 1e9 == pytest.approx(12.5)
    assert 11.5 < m.bandwidth / 1e9 < 12.6  # "about 12 GB/s"
    assert m.binding == "network"
    assert m.bounds["pcie"] > m.bounds["host memory"]  # PCIe 4.0 x16 is not the bottleneck


def test_nccl_ring_on_the_same_pcie_topology():
    # 16 nodes x 8 GPUs = 128 in one ring: every GPU link and NIC carries 2 * 127/128 bytes per byte
    ring = nccl_ring_allreduce(FF2, 16)
    assert ring.gpus == 128
    assert ring.bounds["network"] == pytest.approx(25e9 / (2 * 127 / 128))
    assert ring.bounds["pcie"] == pytest.approx(FF2.pcie_Bps / (2 * 127 / 128))
    assert ring.binding == "network"
    hf, ring2 = compare(FF2, 16)
    assert hf.algorithm == "hfreduce" and ring2 == ring
    # the ring loads each GPU's PCIe link twice as much as HFReduce does
    assert hf.bounds["pcie"] / ring.bounds["pcie"] == pytest.approx(2 * 127 / 128)


def test_bad_input():
    with pytest.raises(InvalidArgument, match="--nodes"):
        hfreduce_allreduce(FF2, 0)
    with pytest.raises(InvalidArgument, match="perlmutter"):
        hfreduce_allreduce(topology_named("perlmutter"), 2)
