"""HFReduce's allreduce bandwidth on a topology, against NCCL's ring on the same PCIe topology.

HFReduce (Fire-Flyer paper, section IV-D) copies each GPU's gradients to host memory, sums the
node's copies on the CPU, runs a double binary tree between nodes over the NIC, and copies the
result back to every GPU. Its bandwidth (algorithm bandwidth: gradient bytes per GPU / time) is
bounded by whichever resource saturates first:

* host memory: the paper counts 24 memory reads and writes per byte of gradient on an 8-GPU node
  (device-to-host writes, the reduction's reads and write, the network's reads and writes, the
  host-to-device reads), so the bound is host memory bandwidth / 24; 320 GB/s gives 13.3 GB/s;
* PCIe: each GPU moves its gradient down once and the result up once over its own link, so one
  byte per direction per byte of gradient: the link's bandwidth;
* network (more than one node): in a double binary tree each half of the buffer goes up one tree
  and down it; a node is inner in one tree (two children) and a leaf in the other, so it sends and
  receives 2 bytes per byte of gradient: NIC bandwidth / 2.

NCCL's ring on the same machine runs every GPU in one ring: each GPU link and each NIC carries
2 (p-1)/p bytes per byte of gradient in each direction, and the hops between GPUs that are not
bridged go over PCIe through the host. Bandwidth terms only: latency, PCIe peer-to-peer quirks and
the copy engines' overheads, which make measured NCCL much slower on such machines (the paper
measures 1.6-4.8 GB/s at 186 MiB), are outside the model.
"""

from __future__ import annotations

import msgspec

from fireflyer.core.errors import InvalidArgument
from fireflyer.planner.topology import Topology

__all__ = ["AllreduceModel", "hfreduce_allreduce", "nccl_ring_allreduce", "compare", "MEMORY_OPS_PER_BYTE"]

#: memory reads and writes per byte of gradient on an 8-GPU node (paper section IV-D)
MEMORY_OPS_PER_BYTE = 24


class AllreduceModel(msgspec.Struct, frozen=True, kw_only=True):
    """Upper bounds (bytes/s of gradient per GPU) per resource; the smallest binds."""

    algorithm: str
    nodes: int
    gpus: int
    bounds: dict[str, float]

    @property
    def binding(self) -> str:
        return min(self.bounds, key=lambda k: self.bounds[k])

    @property
    def bandwidth(self) -> float:
        return self.bounds[self.binding]

    @property
    def theoretical(self) -> float:
        """The bound without the network (the paper's 'theoretical' figure)."""
        rest = [v for k, v in self.bounds.items() if k != "network"]
        return min(rest) if rest else self.bandwidth


def _check(topo: Topology, nodes: int) -> None:
    if nodes < 1:
        raise InvalidArgument(f"--nodes must be at least 1, got {nodes}", argument="nodes", value=nodes)
    if topo.host_memory_Bps <= 0 or topo.pcie_Bps <= 0:
        raise InvalidArgument(f"topology {topo.name!r} has no host memory / PCIe figures for HFReduce's model; "
                              "use fireflyer2", argument="topology", value=topo.name)


def hfreduce_allreduce(topo: Topology, nodes: int, *, memory_ops: int = MEMORY_OPS_PER_BYTE) -> AllreduceModel:
    _check(topo, nodes)
    bounds = {
        "host memory": topo.host_memory_Bps / memory_ops,
        "pcie": topo.pcie_Bps,
    }
    if nodes > 1:
        bounds["network"] = topo.node_network_Bps / 2
    return AllreduceModel(algorithm="hfreduce", nodes=nodes, gpus=nodes * topo.gpus_per_node, bounds=bounds)


def nccl_ring_allreduce(topo: Topology, nodes: int) -> AllreduceModel:
    _check(topo, nodes)
    p = nodes * topo.gpus_per_node
    per_byte = 2 * (p - 1) / p if p > 1 else 1.0
    bounds = {"pcie": topo.pcie_Bps / per_byte}
    if nodes > 1:
        bounds["network"] = topo.node_network_Bps / per_byte
    return AllreduceModel(algorithm="nccl-ring", nodes=nodes, gpus=p, bounds=bounds)


def compare(topo: Topology, nodes: int) -> tuple[AllreduceModel, AllreduceModel]:
    return hfreduce_allreduce(topo, nodes), nccl_ring_allreduce(topo, nodes)
