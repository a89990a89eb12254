"""Named cluster presets, and builders of a Cluster from Python arguments.

An experiment file's ``cluster:`` mapping is checked by :mod:`topologies.config` and
built by :func:`topologies.build.build_cluster`, from the graphs made here. In Python,
three ways to get a :class:`~topologies.cluster.Cluster`:

- :func:`server_cluster`: a server preset (DGX A100/H100/H200/B200, GB200 NVL72
  rack) times a number of GPUs, on a scale-out fabric (default: non-blocking
  crossbar; or a fat-tree, rail-optimized or dragonfly :class:`Fabric`);
- :func:`explicit_cluster`: a named topology (``switch``, ``ring``, ``full-mesh``,
  ``torus2d``, ``torus3d``, ``fat-tree``, ``rail-optimized``, ``dragonfly``)
  with uniform links, optionally with NVSwitch servers of ``gpus_per_node``;
- :func:`cluster_from_graph`: any graph the caller built (validated), e.g.
  :func:`topologies.graphs.multi_site` of several sites.

A heterogeneous cluster mixes server types (:func:`mixed_server_cluster`): it is
built as one preset's servers, then every server's own links are set from its
preset (:func:`set_server_links`), and the cluster holds each rank's GPU spec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from base.errors import TopologyError
from topologies import graphs
from topologies.cluster import Cluster
from topologies.graphs import Fabric
from topologies.hardware import GPUS, IDEAL_GPU, GPUSpec
from topologies.links import LINKS

if TYPE_CHECKING:
    import networkx as nx

US = 1e-6
NVLS_EFFICIENCY_ATTR = "nvls_efficiency"
"""NVSwitch node attribute: :attr:`ServerPreset.nvls_efficiency` (absent: 1.0)."""
TRANSPORT_ATTR = "transport"
"""NIC node attribute: :attr:`ServerPreset.transport` (absent: InfiniBand or RoCE)."""
HOST_CPU_ATTR = "host_cpu"
"""GPU node attribute: its server's :attr:`ServerPreset.host_cpu` (absent: no host modelled,
as on explicit topologies; NCCL's network overhead is then not charged)."""


@dataclass(frozen=True)
class ServerPreset:
    """A DGX-style server type: GPUs on NVSwitch, one NIC per GPU."""

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
    nvls: bool = False
    """NVSwitch reduces in-network (NVLink SHARP: third-generation NVSwitch, Hopper and later)."""
    nvlink_efficiency: float = 1.0
    """Fraction of the NVLink peak that NCCL's transfers reach (1.0 = unmeasured, peak)."""
    nic_efficiency: float = 1.0
    """Fraction of the NIC line rate that NCCL's transfers reach (1.0 = unmeasured, peak)."""
    nvls_efficiency: float = 1.0
    """Fraction of the (effective) NVLink rate that NVLS transfers reach: the in-switch
    reduction and multicast run below the ring's rate (1.0 = unmeasured)."""
    source: str = ""
    efficiency_source: str = ""
    """Where the efficiencies come from."""
    protocol: str | None = None
    """The NCCL protocol the servers' network transport requires (``NCCL_PROTO``), which
    ring and tree collectives run under unless the cluster sets ``collective_protocol``;
    None: NCCL's choice per size."""
    gpu_power_limit_w: float | None = None
    """The board power limit the servers' GPUs run under where their owner states one below
    the TDP (:mod:`topologies.power`); None: the TDP. ``cluster.gpu_power_limit_w`` overrides
    it."""
    gpu_power_limit_source: str = ""
    """Where :attr:`gpu_power_limit_w` is stated."""
    transport: str | None = None
    """The NICs' transport where it is not InfiniBand or RoCE (``tcpxo``: Google's
    GPUDirect-TCPXO), whose NCCL settings (its fixed ``NCCL_BUFFSIZE``, its tuner's rules)
    are in ``sim/data/nccl_tuning.toml`` under ``[transport.NAME]``; a NIC attribute of the
    graph (:data:`TRANSPORT_ATTR`)."""
    host_cpu: str = "unstated"
    """The servers' host CPU as NCCL tells it apart (:data:`sim.protocols.HOST_CPUS`:
    ``intel``, ``amd``, ``arm``; ``unstated`` where the preset's sources do not say), which
    sets the network overhead a ring over several servers pays per step inside a server
    (:func:`sim.protocols.net_overhead_us`: 2 µs on AMD, 1 µs on every other host); a GPU
    attribute of the graph (:data:`HOST_CPU_ATTR`)."""
    host_cpu_source: str = ""
    """Where :attr:`host_cpu` is stated."""


TCPXO_NIC_HOP_S = 10.85 * US
"""GPUDirect-TCPXO's per-message cost at each end of a route between VMs, in place of the
1 µs PCIe hop of InfiniBand servers. No published latency of the transport was found; this
is read from the one log of two A3 Mega VMs (lessizzmore/create-a3mega-ztan-fork, file
ztan-NCCL-test-result, all_reduce_perf -g 1 under Google's tuner: the tree under Simple),
whose all-reduces of 8 B to 256 B take 122-124 µs: the tree crosses between the VMs twice
(up to the root and back down), four NIC hops, and with NCCL's launch and NVLink steps
(79.6 µs here) four hops of 10.85 µs give 123 µs."""


def _source(*links: str) -> str:
    """The sources of the link generations ``links`` (:data:`topologies.links.LINKS`)."""
    return "; ".join(f"{name} {LINKS[name].fraction:.3f}: {LINKS[name].source}"
                     for name in links)


def _fractions(nvlink: str, nic: str, nvls: str | None = None) -> dict:
    """A preset's efficiency keywords from its link generations."""
    out = {"nvlink_efficiency": LINKS[nvlink].fraction, "nic_efficiency": LINKS[nic].fraction,
           "efficiency_source": _source(nvlink, nic, *((nvls,) if nvls else ()))}
    if nvls:
        out["nvls_efficiency"] = LINKS[nvls].fraction
    return out


_DGX_A100_CPU = ("NVIDIA DGX A100 User Guide (DU-09821-001), Introduction, Hardware Overview: "
                 "'Dual AMD Rome 7742, 128 cores total' (2x AMD EPYC 7742)")
_DGX_H100_CPU = ("NVIDIA DGX H100/H200 User Guide, Introduction, Hardware Overview: 'Dual Intel "
                 "Xeon Platinum 8480C Processors, 112 cores total'")

SERVERS: dict[str, ServerPreset] = {
    "dgx-a100-80g": ServerPreset("A100-80GB", 8, 200e9 / 8,
                                 source="DGX A100: 8x A100-80GB, NVSwitch, 8x 200 Gb/s HDR IB",
                                 host_cpu="amd", host_cpu_source=_DGX_A100_CPU,
                                 **_fractions("nvlink3", "ib-hdr")),
    "dgx-a100-40g": ServerPreset("A100-40GB", 8, 200e9 / 8,
                                 source="DGX A100: 8x A100-40GB, NVSwitch, 8x 200 Gb/s HDR IB",
                                 host_cpu="amd", host_cpu_source=_DGX_A100_CPU,
                                 **_fractions("nvlink3", "ib-hdr")),
    "jean-zay-a100": ServerPreset("A100-80GB", 8, 100e9 / 8,
                                  source="Jean Zay's gpu_p5 servers (IDRIS), where BLOOM-176B "
                                         "trained: 8x A100 80GB on NVLink, 4 Omni-Path 100 Gb/s "
                                         "links a server (bigscience-workshop/bigscience "
                                         "train/tr11-176B-ml/README.md, Hardware; give "
                                         "nics_per_node: 4)",
                                  host_cpu="amd",
                                  host_cpu_source="bigscience-workshop/bigscience train/"
                                                  "tr11-176B-ml/README.md, Hardware: 'CPU: "
                                                  "AMD'",
                                  **_fractions("nvlink3", "opa-100")),
    "dgx-h100": ServerPreset("H100", 8, 400e9 / 8, nvls=True,
                             source="DGX H100: 8x H100 SXM, NVSwitch, 8x 400 Gb/s NDR IB",
                             host_cpu="intel", host_cpu_source=_DGX_H100_CPU,
                             **_fractions("nvlink4", "ib-ndr", "nvls4")),
    "dgx-h200": ServerPreset("H200", 8, 400e9 / 8, nvls=True,
                             source="DGX H200: 8x H200, NVSwitch, 8x 400 Gb/s NDR IB",
                             host_cpu="intel", host_cpu_source=_DGX_H100_CPU,
                             **_fractions("nvlink4", "ib-ndr", "nvls4")),
    "hgx-h800": ServerPreset("H800", 8, 400e9 / 8, nvls=True,
                             source="HGX H800: 8x H800 SXM (NVLink 400 GB/s total), NVSwitch, "
                                    "8x 400 Gb/s InfiniBand (DeepSeek-AI 2024, DeepSeek-V3 "
                                    "report sec. 3.1)",
                             **_fractions("nvlink4", "ib-ndr", "nvls4")),
    "grand-teton-h100": ServerPreset("H100-96GB", 8, 400e9 / 8, nvls=True,
                                     source="Meta Grand Teton: 8x H100 96GB on NVLink, 400 Gb/s "
                                            "RDMA per GPU (pytorch/torchtitan benchmarks/"
                                            "llama3_h100_202412_torchtitan.md)",
                                     gpu_power_limit_w=500.0,
                                     gpu_power_limit_source="pytorch/torchtitan benchmarks/"
                                     "llama3_h100_202412_torchtitan.md, Hardware: \"We used the "
                                     "default 500W power limit, although tuning it up to 700W "
                                     "TDP can potentially provide further speedups\"",
                                     **_fractions("nvlink4", "ib-ndr", "nvls4")),
    "dgx-b200": ServerPreset("B200", 8, 400e9 / 8, nvls=True,
                             source="DGX B200: 8x B200, NVSwitch, 8x 400 Gb/s NDR IB",
                             host_cpu="intel",
                             host_cpu_source="NVIDIA DGX B200 User Guide, Introduction, "
                                             "Hardware Overview: '2 x Intel Xeon 8570' "
                                             "(docs.nvidia.com/dgx/dgxb200-user-guide)",
                             **_fractions("nvlink5", "ib-ndr", "nvls5")),
    "a3-mega": ServerPreset("H100", 8, 200e9 / 8, nic_hop_latency_s=TCPXO_NIC_HOP_S,
                            protocol="simple", transport="tcpxo",
                            source="Google Cloud a3-megagpu-8g VM: 8x H100 80GB on NVLink 4 "
                                   "(NVSwitch), 8 GPU NICs of 200 Gb/s on GPUDirect-TCPXO (1600 "
                                   "Gb/s a VM: Google's A3 bootcamp, saltysoup/a3-bootcamp-ce); "
                                   "NCCL "
                                   "as Google's TCPXO environment runs it: NCCL_PROTO=Simple "
                                   "('TCPX only supports Simple protocol'), NCCL_NVLS_ENABLE=0 "
                                   "(no NVLS or NVLSTree, so nvls is off here although the "
                                   "NVSwitch has it), NCCL_ALGO=Ring,Tree, NCCL_BUFFSIZE=8388608 "
                                   "(apple/axlearn, axlearn/cloud/gcp/jobset_utils.py, 'The "
                                   "NCCL_FASTRAK config cannot be changed', after Google's "
                                   "AI-Hypercomputer/gpu-recipes; the same variables in Google's "
                                   "cluster-toolkit and GKE TCPXO recipes). Google's tuner "
                                   "(a3plus_tuner_config.textproto; apple/axlearn, axlearn/cloud/"
                                   "gcp/nccl/a3_mega/tuner_config.txtpb) runs all-reduce on two "
                                   "VMs as Tree/Simple, the other collectives as Ring/Simple",
                            **_fractions("nvlink4", "tcpxo-200g")),
    "gb200-nvl72": ServerPreset("GB200", 72, 400e9 / 8, nvls=True,
                                source="GB200 NVL72 rack: 72 Blackwell GPUs in one NVLink5 "
                                       "domain (18 NVSwitch chips, one node here), one 400 Gb/s "
                                       "ConnectX-7 per GPU (unverified)",
                                host_cpu="arm",
                                host_cpu_source="NVIDIA GB200 NVL72: 36 Grace CPUs (Arm "
                                                "Neoverse V2) beside the 72 Blackwell GPUs",
                                **_fractions("nvlink5", "ib-ndr", "nvls5")),
}
"""Server-based cluster presets (an NVL72 rack counts as one 72-GPU server)."""

PRESET_NAMES = ("ideal", *SERVERS)
TOPOLOGIES = ("switch", "ring", "full-mesh", "torus2d", "torus3d", "fat-tree", "rail-optimized",
              "dragonfly")
"""Named explicit topologies."""
FABRIC_OF_TOPOLOGY = {"switch": "crossbar", "fat-tree": "fat-tree",
                      "rail-optimized": "rail-optimized", "dragonfly": "dragonfly"}
"""Topologies that are scale-out fabrics, usable under a server preset."""


@dataclass(frozen=True)
class CollectiveSettings:
    """How collectives run on a cluster (see :class:`~topologies.cluster.Cluster`)."""

    launch_s: float | None = None
    """Per-collective launch latency; None: the preset's (NCCL's 8.4 µs) or 0."""
    step_s: float = 0.0
    """Extra software latency per collective step."""
    algos: Mapping[str, str] = field(default_factory=dict)
    """Per-op algorithm overrides, e.g. ``{"all_reduce": "tree"}``."""
    granularity: str = "stream"
    ecmp: str = "dst-mod-k"
    protocol: str = "auto"
    """NCCL protocol of ring and tree collectives (``auto``: per size)."""

    def cluster_kwargs(self, default_launch_s: float,
                       default_protocol: str | None = None) -> dict:
        """The Cluster's keywords; ``default_protocol``: the servers' transport's
        (:attr:`ServerPreset.protocol`), which ``auto`` gives way to."""
        protocol = (default_protocol if self.protocol == "auto" and default_protocol
                    else self.protocol)
        return {"collective_launch_s": default_launch_s if self.launch_s is None
                else self.launch_s,
                "collective_step_s": self.step_s, "collective_algos": dict(self.algos),
                "collective_granularity": self.granularity, "ecmp": self.ecmp,
                "collective_protocol": protocol}


def server_graph(name: str, num_gpus: int, fabric: Fabric | None = None,
                 nics_per_node: int | None = None, nic_Bps: float | None = None) -> nx.DiGraph:
    """The graph of ``num_gpus`` GPUs of server preset ``name`` on ``fabric``, with
    ``nics_per_node`` of the preset's NICs per server (default: one per GPU), each of line
    rate ``nic_Bps`` per direction (default: the preset's; NCCL's efficiency on it kept)."""
    p = SERVERS[name]
    gpu = GPUS[p.gpu]
    rate = p.nic_Bps if nic_Bps is None else nic_Bps
    g = graphs.nvswitch_cluster(num_gpus, p.gpus_per_node,
                                gpu.nvlink_bandwidth_Bps * p.nvlink_efficiency,
                                p.nvlink_hop_latency_s, rate * p.nic_efficiency,
                                p.nic_hop_latency_s, p.fabric_hop_latency_s, nvls=p.nvls,
                                fabric=fabric, nics_per_node=nics_per_node)
    if p.nvls and p.nvls_efficiency != 1.0:
        for _, d in g.nodes(data=True):
            if d.get("kind") == "nvswitch":
                d[NVLS_EFFICIENCY_ATTR] = p.nvls_efficiency
    if p.transport is not None:
        for _, d in g.nodes(data=True):
            if d.get("kind") == "nic":
                d[TRANSPORT_ATTR] = p.transport
    for _, d in g.nodes(data=True):
        if d.get("kind") == "gpu":
            d[HOST_CPU_ATTR] = p.host_cpu
    return g


def server_cluster(name: str, num_gpus: int, fabric: Fabric | None = None,
                   collectives: CollectiveSettings | None = None,
                   nics_per_node: int | None = None) -> Cluster:
    """A cluster of ``num_gpus`` GPUs built from the server preset ``name``.

    ``fabric`` defaults to a non-blocking crossbar at the NIC rate; a fabric
    given with infinite bandwidth takes the NIC rate.
    """
    p = SERVERS[name]
    c = collectives or CollectiveSettings()
    g = server_graph(name, num_gpus, fabric, nics_per_node)
    return Cluster(name, g, GPUS[p.gpu], min(p.gpus_per_node, num_gpus),
                   **c.cluster_kwargs(p.collective_launch_s, p.protocol))


def ideal_cluster(num_gpus: int) -> Cluster:
    """Infinitely fast GPUs and links, no latency: only the schedule shapes the timeline."""
    return Cluster("ideal", graphs.ideal(num_gpus), IDEAL_GPU, num_gpus)


def explicit_graph(
    topology: str,
    num_gpus: int,
    link_bandwidth_Bps: float,
    link_latency_s: float,
    *,
    gpus_per_node: int = 1,
    nvlink_bandwidth_Bps: float | None = None,
    nvlink_latency_s: float = 1.7 * US,
    nvls: bool = False,
    dims: Sequence[int] = (),
    fabric: Fabric | None = None,
    nics_per_node: int | None = None,
) -> nx.DiGraph:
    """The graph of a named topology with uniform links of ``link_bandwidth_Bps``.

    ``switch``, ``fat-tree``, ``rail-optimized`` and ``dragonfly`` are fabrics:
    with ``gpus_per_node`` > 1 the GPUs sit in NVSwitch servers (NVLink at
    ``nvlink_bandwidth_Bps``) with one NIC per GPU on the fabric (``nics_per_node``: that
    many, shared), else each GPU
    is its own fabric endpoint. ``fabric`` supplies the fabric's shape
    parameters (its kind, bandwidth and latency are taken from here).
    ``ring``, ``full-mesh`` and the tori link GPUs directly (``dims``: torus
    sizes, whose product must be ``num_gpus``).
    """
    if topology not in TOPOLOGIES:
        raise TopologyError(f"topology {topology!r} is not one of {', '.join(TOPOLOGIES)}")
    if topology.startswith("torus"):
        want = int(topology[-2])
        if len(dims) != want:
            raise TopologyError(f"{topology} needs dims of {want} sizes, got {list(dims)}")
        if math.prod(dims) != num_gpus:
            raise TopologyError(f"{topology} dims {list(dims)} hold {math.prod(dims)} GPUs, "
                                f"not num_gpus={num_gpus}")
        return graphs.torus(dims, link_bandwidth_Bps, link_latency_s)
    if topology == "ring":
        return graphs.ring(num_gpus, link_bandwidth_Bps, link_latency_s)
    if topology == "full-mesh":
        return graphs.full_mesh(num_gpus, link_bandwidth_Bps, link_latency_s)
    base = fabric or Fabric()
    f = replace(base, kind=FABRIC_OF_TOPOLOGY[topology], bandwidth_Bps=link_bandwidth_Bps,
                latency_s=link_latency_s)
    if gpus_per_node > 1:
        if nvlink_bandwidth_Bps is None:
            raise TopologyError("gpus_per_node > 1 needs an NVLink bandwidth")
        return graphs.nvswitch_cluster(num_gpus, gpus_per_node, nvlink_bandwidth_Bps,
                                       nvlink_latency_s, link_bandwidth_Bps, link_latency_s,
                                       link_latency_s, nvls=nvls, fabric=f,
                                       nics_per_node=nics_per_node)
    if topology == "switch":
        return graphs.switch(num_gpus, link_bandwidth_Bps, link_latency_s)
    return graphs.gpu_fabric(num_gpus, f)


def explicit_cluster(
    topology: str,
    num_gpus: int,
    gpu: GPUSpec,
    link_bandwidth_Bps: float,
    link_latency_s: float,
    collective_launch_s: float = 0.0,
    *,
    collectives: CollectiveSettings | None = None,
    **shape: object,
) -> Cluster:
    """A named topology with uniform links (see :func:`explicit_graph` for ``shape``)."""
    g = explicit_graph(topology, num_gpus, link_bandwidth_Bps, link_latency_s,
                       **shape)  # type: ignore[arg-type]
    per_node = int(shape.get("gpus_per_node", 1))  # type: ignore[call-overload]
    c = collectives or CollectiveSettings()
    return Cluster(f"{topology}{num_gpus}", g, gpu, min(per_node, num_gpus),
                   **c.cluster_kwargs(collective_launch_s))


def cluster_from_graph(name: str, graph: nx.DiGraph, gpu: GPUSpec, gpus_per_node: int = 1,
                       collectives: CollectiveSettings | None = None) -> Cluster:
    """A cluster on a caller-built graph, validated: GPU nodes with ranks 0..n-1 and hosts,
    every link with a positive ``bandwidth_Bps`` and a non-negative ``latency_s``, and the
    reverse of every link present."""
    for v, d in graph.nodes(data=True):
        if d.get("kind") not in ("gpu", "nvswitch", "nic", "pcie", "switch"):
            raise TopologyError(f"node {v!r}: kind {d.get('kind')!r} is not one of gpu, "
                                "nvswitch, nic, pcie, switch")
        if d["kind"] == "gpu" and ("rank" not in d or "host" not in d):
            raise TopologyError(f"GPU node {v!r} needs 'rank' and 'host' attributes")
    for u, v, d in graph.edges(data=True):
        bw, lat = d.get("bandwidth_Bps"), d.get("latency_s")
        if bw is None or not bw > 0 or lat is None or lat < 0:
            raise TopologyError(f"link {u}-{v}: needs bandwidth_Bps > 0 and latency_s >= 0, "
                                f"got {bw} and {lat}")
        if not graph.has_edge(v, u):
            raise TopologyError(f"link {u}-{v} has no reverse link {v}-{u}")
    c = collectives or CollectiveSettings()
    return Cluster(name, graph, gpu, gpus_per_node, **c.cluster_kwargs(0.0))


# ---------------------------------------------------------------------- mixed clusters


@dataclass(frozen=True)
class ServerLinks:
    """One server's own link rates in a mixed cluster; None leaves the graph's value."""

    nvlink_Bps: float | None = None
    """GPU-NVSwitch links, per direction."""
    nvlink_latency_s: float | None = None
    nic_Bps: float | None = None
    """GPU-NIC links (and, where the fabric's rate is not given, NIC-fabric links)."""
    nic_latency_s: float | None = None
    nvls: bool | None = None
    """Whether the server's NVSwitch reduces in-network."""
    nvls_efficiency: float | None = None
    """Fraction of the NVLink rate NVLS transfers reach (:attr:`ServerPreset.nvls_efficiency`)."""
    host_cpu: str | None = None
    """The server's host CPU (:attr:`ServerPreset.host_cpu`), set on its GPUs."""

    @classmethod
    def of_preset(cls, name: str) -> ServerLinks:
        """The links of server preset ``name``, as :func:`server_graph` builds them."""
        p = SERVERS[name]
        return cls(GPUS[p.gpu].nvlink_bandwidth_Bps * p.nvlink_efficiency,
                   p.nvlink_hop_latency_s, p.nic_Bps * p.nic_efficiency, p.nic_hop_latency_s,
                   p.nvls, p.nvls_efficiency, p.host_cpu)


def set_server_links(graph: nx.DiGraph, per_host: Sequence[ServerLinks], *,
                     nic_fabric_links: bool = True) -> None:
    """Set each server's links in place from ``per_host[host]`` (hosts as the ``host``
    attribute of :mod:`topologies.graphs` numbers them, so a multi-site graph works too).

    Links are told apart by their end nodes' kinds: GPU-NVSwitch (NVLink), GPU-NIC, and
    NIC-switch (the server's port on the fabric; changed only with ``nic_fabric_links``,
    when the fabric runs at the NICs' own rates).
    """
    nodes = graph.nodes
    if len({d["host"] for _, d in nodes(data=True) if d.get("kind") == "gpu"}) != len(per_host):
        raise TopologyError(f"{len(per_host)} server types for a graph of a different number "
                            "of servers")
    for _, d in nodes(data=True):
        if d.get("kind") == "nvswitch" and per_host[d["host"]].nvls is not None:
            d["nvls"] = per_host[d["host"]].nvls
        if d.get("kind") == "nvswitch" and per_host[d["host"]].nvls_efficiency is not None:
            d[NVLS_EFFICIENCY_ATTR] = per_host[d["host"]].nvls_efficiency
        if d.get("kind") == "gpu" and per_host[d["host"]].host_cpu is not None:
            d[HOST_CPU_ATTR] = per_host[d["host"]].host_cpu
    for u, v, d in graph.edges(data=True):
        ku, kv = nodes[u].get("kind"), nodes[v].get("kind")
        kinds = {ku, kv}
        if kinds == {"gpu", "nvswitch"}:
            links = per_host[nodes[u]["host"]]
            bw, lat = links.nvlink_Bps, links.nvlink_latency_s
        elif kinds == {"gpu", "nic"}:
            links = per_host[nodes[u]["host"]]
            bw, lat = links.nic_Bps, links.nic_latency_s
        elif nic_fabric_links and "nic" in kinds and "gpu" not in kinds:
            links = per_host[nodes[u if ku == "nic" else v]["host"]]
            bw, lat = links.nic_Bps, None
        else:
            continue
        if bw is not None:
            d["bandwidth_Bps"] = bw
        if lat is not None:
            d["latency_s"] = lat


def expand_groups(groups: Sequence[tuple[GPUSpec, int]], gpus_per_node: int
                  ) -> tuple[GPUSpec, ...]:
    """Each rank's GPU spec for ``(gpu, servers)`` groups of ``gpus_per_node`` GPUs, in
    order."""
    return tuple(spec for spec, servers in groups for _ in range(servers * gpus_per_node))


def mixed_server_graph(groups: Sequence[tuple[str, int]], fabric: Fabric | None = None
                       ) -> nx.DiGraph:
    """Servers of several presets on one fabric: ``groups`` lists ``(preset, servers)`` in
    rank order. The presets must have the same GPUs per server. The fabric runs at the
    fastest preset's NIC rate (or ``fabric``'s bandwidth); each server's NVLink, NICs,
    NIC port on the fabric (unless ``fabric`` sets the bandwidth) and NVLS are its own."""
    if not groups:
        raise TopologyError("a mixed cluster needs at least one group of servers")
    per_node = {name: SERVERS[name].gpus_per_node for name, _ in groups}
    if len(set(per_node.values())) > 1:
        shown = ", ".join(f"{name}: {n}" for name, n in per_node.items())
        raise TopologyError(f"server presets of one cluster need the same GPUs per server, "
                            f"got {shown}")
    n = next(iter(per_node.values()))
    base = max((name for name, _ in groups), key=lambda name: SERVERS[name].nic_Bps
               * SERVERS[name].nic_efficiency)
    graph = server_graph(base, n * sum(count for _, count in groups), fabric)
    hosts = [ServerLinks.of_preset(name) for name, count in groups for _ in range(count)]
    set_server_links(graph, hosts,
                     nic_fabric_links=fabric is None or fabric.bandwidth_Bps is None)
    return graph


def mixed_server_cluster(groups: Sequence[tuple[str, int]], fabric: Fabric | None = None,
                         collectives: CollectiveSettings | None = None) -> Cluster:
    """A heterogeneous cluster of server presets (:func:`mixed_server_graph`), e.g.
    ``[("dgx-a100-80g", 2), ("dgx-h100", 2)]``: ranks 0-15 on A100s, 16-31 on H100s."""
    graph = mixed_server_graph(groups, fabric)
    n = SERVERS[groups[0][0]].gpus_per_node
    gpus = expand_groups([(GPUS[SERVERS[name].gpu], count) for name, count in groups], n)
    c = collectives or CollectiveSettings()
    name = "+".join(f"{count}x{preset}" for preset, count in groups)
    return Cluster(name, graph, gpus[0], n,
                   **c.cluster_kwargs(SERVERS[groups[0][0]].collective_launch_s), gpus=gpus)
