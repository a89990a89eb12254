"""Pure generators of cluster graphs.

A cluster graph is a :class:`networkx.DiGraph`. Nodes carry ``kind`` (``gpu``,
``nvswitch``, ``nic``, ``switch``); GPU nodes also carry ``rank`` (global GPU
index) and ``host`` (server index). Every physical link appears as two directed
edges, each with its own ``bandwidth_Bps`` (per direction) and ``latency_s``
(per hop). Paths add the latency of every hop they cross.
"""

from __future__ import annotations

import math

import networkx as nx

from sim.errors import TopologyError


def gpu_node(rank: int) -> str:
    """Graph node name of GPU ``rank``."""
    return f"gpu{rank}"


def _link(g: nx.DiGraph, u: str, v: str, bandwidth_Bps: float, latency_s: float) -> None:
    if not bandwidth_Bps > 0:
        raise TopologyError(f"link {u}-{v}: bandwidth {bandwidth_Bps} B/s must be > 0")
    if latency_s < 0:
        raise TopologyError(f"link {u}-{v}: latency {latency_s} s must be >= 0")
    g.add_edge(u, v, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s)
    g.add_edge(v, u, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s)


def _add_gpus(g: nx.DiGraph, n: int, gpus_per_host: int) -> None:
    for r in range(n):
        g.add_node(gpu_node(r), kind="gpu", rank=r, host=r // gpus_per_host)


def switch(n: int, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """n GPUs on one non-blocking switch; a GPU-to-GPU path has 2 hops."""
    if n < 1:
        raise TopologyError(f"switch topology needs num_gpus >= 1, got {n}")
    g = nx.DiGraph(name=f"switch{n}")
    _add_gpus(g, n, gpus_per_host=1)
    g.add_node("switch", kind="switch")
    for r in range(n):
        _link(g, gpu_node(r), "switch", bandwidth_Bps, latency_s)
    return g


def ring(n: int, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """n GPUs in a bidirectional ring: GPU i linked to GPU (i + 1) mod n."""
    if n < 2:
        raise TopologyError(f"ring topology needs num_gpus >= 2, got {n}")
    g = nx.DiGraph(name=f"ring{n}")
    _add_gpus(g, n, gpus_per_host=1)
    for r in range(n):
        nxt = (r + 1) % n
        if not g.has_edge(gpu_node(r), gpu_node(nxt)):
            _link(g, gpu_node(r), gpu_node(nxt), bandwidth_Bps, latency_s)
    return g


def nvswitch_cluster(
    num_gpus: int,
    gpus_per_node: int,
    nvlink_Bps: float,
    nvlink_latency_s: float,
    nic_Bps: float,
    nic_latency_s: float,
    fabric_latency_s: float,
) -> nx.DiGraph:
    """DGX-style servers: GPUs on one NVSwitch per server, one NIC per GPU, a non-blocking fabric.

    Intra-server path: gpu -> nvswitch -> gpu (2 NVLink hops). Inter-server path:
    gpu -> nic -> fabric -> nic -> gpu (GPU-NIC hops are PCIe, modelled at the NIC
    rate; NIC-fabric hops at the NIC rate). The fabric is one ideal crossbar: full
    bisection bandwidth, as in a non-blocking fat-tree.
    """
    if num_gpus < 1:
        raise TopologyError(f"num_gpus must be >= 1, got {num_gpus}")
    per_node = min(gpus_per_node, num_gpus)
    if num_gpus % per_node:
        raise TopologyError(
            f"num_gpus={num_gpus} is not a multiple of gpus_per_node={gpus_per_node}"
        )
    hosts = num_gpus // per_node
    g = nx.DiGraph(name=f"nvswitch{hosts}x{per_node}")
    _add_gpus(g, num_gpus, per_node)
    if hosts > 1:
        g.add_node("fabric", kind="switch")
    for h in range(hosts):
        sw = f"host{h}/nvswitch"
        g.add_node(sw, kind="nvswitch", host=h)
        for local in range(per_node):
            r = h * per_node + local
            _link(g, gpu_node(r), sw, nvlink_Bps, nvlink_latency_s)
            if hosts > 1:
                nic = f"host{h}/nic{local}"
                g.add_node(nic, kind="nic", host=h)
                _link(g, gpu_node(r), nic, nic_Bps, nic_latency_s)
                _link(g, nic, "fabric", nic_Bps, fabric_latency_s)
    return g


def ideal(n: int) -> nx.DiGraph:
    """Infinitely fast, latency-free switch (for schedule studies)."""
    return switch(n, math.inf, 0.0)
