"""Where GPUs sit and how fast a group of them can run a ring collective.

A topology answers one question for the communication model: the bandwidth of a ring over a
group of ``p`` GPUs when the dimensions placed inside that group (faster-varying ranks) multiply
to ``ip``. Ranks are placed column first, then row, then depth, then data (AxoNN's order), so a
group's members are ``ip`` ranks apart and the group spans ``ip * p`` consecutive ranks.

* inside one node (``ip * p <= gpus_per_node``): a measured table entry if there is one, else
  the NVLink bridge for a pair of neighbours (``ip == 1, p == 2``), else the PCIe path;
* across nodes: the node's network bandwidth shared by the ``min(ip, gpus_per_node)`` rings that
  leave the node at the same time (the same number of concurrent groups cross every node).

The Perlmutter preset reproduces the table released with AxoNN's communication model (measured
values inside a node, 80 GB/s per node across nodes). Its numbers are kept in the released model's
unit, 2**30 bytes per second, so that times equal the released model's exactly.
"""

from __future__ import annotations

import msgspec

from fireflyer.core.errors import InvalidArgument

__all__ = ["Topology", "TOPOLOGIES", "topology_named", "GIB", "GB"]

GIB = float(2**30)
GB = 1e9


class Topology(msgspec.Struct, frozen=True, kw_only=True):
    """One cluster kind. Bandwidths are bytes per second, one direction, per ring."""

    name: str
    gpus_per_node: int
    #: network bandwidth of one node (all its NICs together)
    node_network_Bps: float
    #: GPU-to-GPU bandwidth inside a node when no table entry or NVLink bridge applies
    intra_node_Bps: float
    #: bandwidth of a bridged pair of neighbouring GPUs (0: no bridges)
    nvlink_pair_Bps: float = 0.0
    #: measured ring bandwidths inside a node: ((ip, p, bytes/s), ...); they win over the rules
    measured: tuple[tuple[int, int, float], ...] = ()
    #: per-GPU resources for the memory and compute terms
    gpu_memory_bytes: float = 40 * GIB
    gpu_peak_flops: float = 312e12
    #: host resources for HFReduce's model (fireflyer.planner.hfreduce_model)
    host_memory_Bps: float = 0.0
    pcie_Bps: float = 0.0
    nics_per_node: int = 1
    description: str = ""

    def bandwidth(self, inner: int, size: int) -> float:
        """Ring bandwidth (bytes/s) of a group of ``size`` GPUs whose neighbours are ``inner`` ranks apart."""
        if inner < 1 or size < 2:
            raise InvalidArgument(f"a ring group needs inner >= 1 and size >= 2, got inner={inner} size={size}",
                                  inner=inner, size=size)
        for ip, p, bps in self.measured:
            if ip == inner and p == size:
                return bps
        if inner * size <= self.gpus_per_node:
            if inner == 1 and size == 2 and self.nvlink_pair_Bps > 0:
                return self.nvlink_pair_Bps
            return self.intra_node_Bps
        # every node has min(inner, gpus_per_node) of these rings leaving it at once
        return self.node_network_Bps / min(inner, self.gpus_per_node)

    def link_name(self, inner: int, size: int) -> str:
        """What carries that group's traffic, for tables: nvlink, intra-node, network."""
        if inner * size > self.gpus_per_node:
            return "network"
        if inner == 1 and size == 2 and self.nvlink_pair_Bps > 0:
            return "nvlink"
        return "intra-node"


# Perlmutter: 4 A100-40GB per node on NVLink 3, 4 Slingshot NICs. Intra-node entries are the
# measured ones released beside AxoNN's model (GB/s there = 2**30 B/s): pair 76, whole node 225,
# two pairs 76. The cross-node rule with 80 per node gives the released 80/40/20.
PERLMUTTER = Topology(
    name="perlmutter",
    gpus_per_node=4,
    node_network_Bps=80 * GIB,
    intra_node_Bps=225 * GIB,
    measured=((1, 2, 76 * GIB), (1, 4, 225 * GIB), (2, 2, 76 * GIB)),
    gpu_memory_bytes=40 * GIB,
    gpu_peak_flops=312e12,
    description="4 A100 40GB per node (NVLink), 4 NICs; AxoNN's released bandwidth table",
)

# Fire-Flyer 2: 8 PCIe A100 per node, NVLink bridges between pairs (600 GB/s), PCIe 4.0 x16 to
# the CPUs (16 GT/s x 16 lanes with 128b/130b coding: 31.5 GB/s per direction), one 200 Gb/s
# InfiniBand NIC, 320 GB/s of host memory bandwidth (paper section IV-D).
PCIE4_X16_BPS = 16e9 * 16 * 128 / 130 / 8
FIREFLYER2 = Topology(
    name="fireflyer2",
    gpus_per_node=8,
    node_network_Bps=200e9 / 8,
    intra_node_Bps=PCIE4_X16_BPS,
    nvlink_pair_Bps=600 * GB,
    gpu_memory_bytes=40 * GIB,
    gpu_peak_flops=312e12,
    host_memory_Bps=320 * GB,
    pcie_Bps=PCIE4_X16_BPS,
    nics_per_node=1,
    description="8 PCIe A100 per node, NVLink-bridged pairs, PCIe 4.0, one 200 Gb/s IB NIC",
)

TOPOLOGIES: dict[str, Topology] = {t.name: t for t in (PERLMUTTER, FIREFLYER2)}


def topology_named(name: str) -> Topology:
    try:
        return TOPOLOGIES[name.lower()]
    except KeyError:
        raise InvalidArgument(f"unknown topology {name!r} (--topology); known: {', '.join(sorted(TOPOLOGIES))}",
                              argument="topology", value=name) from None
