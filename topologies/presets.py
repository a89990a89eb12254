"""Named cluster presets and the builder that turns a cluster description into a Cluster."""

from __future__ import annotations

import math
from dataclasses import dataclass

from topologies import graphs
from topologies.cluster import Cluster
from topologies.hardware import GPUS, IDEAL_GPU, GPUSpec

US = 1e-6


@dataclass(frozen=True)
class ServerPreset:
    """A DGX-style server type: GPUs on NVSwitch, one NIC per GPU, non-blocking fabric."""

    gpu: str
    gpus_per_node: int
    nic_Bps: float
    """Per-GPU NIC bandwidth per direction, bytes/s."""
    nvlink_hop_latency_s: float = 1.7 * US
    """Per NVLink hop; a GPU-NVSwitch-GPU path is 2 hops = 3.4 µs, NCCL's NVLink ring step."""
    nic_hop_latency_s: float = 1.0 * US
    """GPU-NIC (PCIe) hop."""
    fabric_hop_latency_s: float = 3.8 * US
    """NIC-switch hop; a 4-hop inter-node path totals 9.6 µs, NCCL's network ring step."""
    collective_launch_s: float = 8.4 * US
    """NCCL's base latency per collective (Simple protocol), REFERENCES.md."""
    source: str = ""


SERVERS: dict[str, ServerPreset] = {
    "dgx-a100-80g": ServerPreset("A100-80GB", 8, 200e9 / 8,
                                 source="DGX A100: 8x A100-80GB, NVSwitch, 8x 200 Gb/s HDR IB"),
    "dgx-a100-40g": ServerPreset("A100-40GB", 8, 200e9 / 8,
                                 source="DGX A100: 8x A100-40GB, NVSwitch, 8x 200 Gb/s HDR IB"),
    "dgx-h100": ServerPreset("H100", 8, 400e9 / 8,
                             source="DGX H100: 8x H100 SXM, NVSwitch, 8x 400 Gb/s NDR IB"),
    "dgx-h200": ServerPreset("H200", 8, 400e9 / 8,
                             source="DGX H200: 8x H200, NVSwitch, 8x 400 Gb/s NDR IB"),
    "dgx-b200": ServerPreset("B200", 8, 400e9 / 8,
                             source="DGX B200: 8x B200, NVSwitch, 8x 400 Gb/s NDR IB"),
}
"""Server-based cluster presets."""

PRESET_NAMES = ("ideal", *SERVERS)
TOPOLOGIES = ("switch", "ring")


def server_cluster(name: str, num_gpus: int) -> Cluster:
    """A cluster of ``num_gpus`` GPUs built from the server preset ``name``."""
    p = SERVERS[name]
    gpu = GPUS[p.gpu]
    g = graphs.nvswitch_cluster(num_gpus, p.gpus_per_node, gpu.nvlink_bandwidth_Bps,
                                p.nvlink_hop_latency_s, p.nic_Bps, p.nic_hop_latency_s,
                                p.fabric_hop_latency_s)
    return Cluster(name, g, gpu, min(p.gpus_per_node, num_gpus), p.collective_launch_s)


def ideal_cluster(num_gpus: int) -> Cluster:
    """Infinitely fast GPUs and links, no latency: only the schedule shapes the timeline."""
    return Cluster("ideal", graphs.ideal(num_gpus), IDEAL_GPU, num_gpus)


def explicit_cluster(
    topology: str,
    num_gpus: int,
    gpu: GPUSpec,
    link_bandwidth_Bps: float,
    link_latency_s: float,
    collective_launch_s: float = 0.0,
) -> Cluster:
    """An explicit ``switch`` or ``ring`` topology with uniform links."""
    build = {"switch": graphs.switch, "ring": graphs.ring}[topology]
    g = build(num_gpus, link_bandwidth_Bps, link_latency_s)
    return Cluster(f"{topology}{num_gpus}", g, gpu, 1, collective_launch_s)


def is_ideal(cluster: Cluster) -> bool:
    return math.isinf(cluster.gpu.peak_bf16_flops)
