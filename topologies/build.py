"""A validated ``cluster:`` description (:mod:`topologies.config`) turned into a Cluster.

:func:`build_cluster` is pure: the same description gives an equal cluster. The
description's keys were checked when it was parsed; what only the graph builders can
tell (a fabric too small for its shape, NICs that do not divide a server's GPUs) is a
:class:`~base.errors.ConfigError` naming the cluster.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

from base.collector import gc_paused
from base.errors import ConfigError, TopologyError
from topologies.cluster import Cluster
from topologies.config import (
    ClusterConfig,
    ExplicitLinks,
    GpuNodesCluster,
    IdealCluster,
    Networked,
    PresetCluster,
    PresetNodesCluster,
    ServerFabric,
    TopologyCluster,
)
from topologies.digraph import building
from topologies.graphs import Fabric, multi_site
from topologies.hardware import DEFAULT_GPU, GPUS, GPUSpec, gpu_spec
from topologies.power import capped
from topologies.presets import (
    FABRIC_OF_TOPOLOGY,
    SERVERS,
    CollectiveSettings,
    ServerLinks,
    explicit_graph,
    ideal_cluster,
    mixed_server_graph,
    server_graph,
    set_server_links,
)
from topologies.variability import paced

if TYPE_CHECKING:
    import networkx as nx

CLUSTER_CACHE = 4
"""Clusters :func:`build_cluster` keeps, by description (the least recently used go
first, and released, :meth:`~topologies.cluster.Cluster.release`): a 16,384-GPU one with
its routes holds some hundred MB."""

_CLUSTERS: OrderedDict[ClusterConfig, Cluster] = OrderedDict()
"""The kept clusters, least recently used first."""


def build_cluster(c: ClusterConfig) -> Cluster:
    """The Cluster of a ``cluster:`` description, one site after another on the WAN.

    Built once per description and shared (with its caches of routes and of what layers
    above derive from it, :attr:`Cluster.memo`) by every experiment on it: its graph is
    frozen (:meth:`Cluster.freeze`), and a changed cluster is a new object
    (:meth:`Cluster.with_link_changes`, :meth:`Cluster.subset`). A description that does
    not hash (a list inside) is built each time."""
    try:
        hash(c)
    except TypeError:
        return _built(c)
    return _cached(c)


def _built(c: ClusterConfig) -> Cluster:
    """:func:`build_cluster`, uncached: its graph a :class:`topologies.digraph.Graph`
    (:func:`topologies.digraph.building`; the cluster's :attr:`~topologies.cluster.Cluster.
    graph`, its networkx twin, made on first use), so a run imports no networkx."""
    try:
        with building():
            return _built_graphs(c)
    except TopologyError as exc:
        raise ConfigError(f"cluster: {exc}") from None


def _built_graphs(c: ClusterConfig) -> Cluster:
    """:func:`_built` within :func:`topologies.digraph.building`."""
    if isinstance(c, IdealCluster):
        return ideal_cluster(c.num_gpus)
    if isinstance(c, PresetCluster | TopologyCluster):
        return _uniform_cluster(c)
    return _mixed_cluster(c)


def _cached(c: ClusterConfig) -> Cluster:
    """:func:`build_cluster` of a hashable description, its graph frozen, kept
    (:data:`CLUSTER_CACHE`); the one it lets go is released
    (:meth:`~topologies.cluster.Cluster.release`: its cycles broken, freed when its last
    user drops it)."""
    cluster = _CLUSTERS.get(c)
    if cluster is not None:
        _CLUSTERS.move_to_end(c)
        return cluster
    with gc_paused():  # the graph's many small dicts hold no cycles worth a scan
        cluster = _built(c)
    cluster.freeze()
    _CLUSTERS[c] = cluster
    if len(_CLUSTERS) > CLUSTER_CACHE:
        _CLUSTERS.popitem(last=False)[1].release()
    return cluster


def _collective_settings(c: Networked) -> CollectiveSettings:
    algos = {op: algo for op, algo in (c.collectives.model_dump() if c.collectives else {}
                                       ).items() if algo is not None}
    return CollectiveSettings(
        launch_s=None if c.collective_launch_us is None else c.collective_launch_us * 1e-6,
        step_s=(c.collective_step_us or 0.0) * 1e-6, algos=algos,
        granularity=c.collective_granularity or "stream", ecmp=c.ecmp or "dst-mod-k",
        protocol=c.collective_protocol or "auto")


def _fabric(c: Networked) -> Fabric | None:
    """The fabric shape of a fat-tree, rail-optimized or dragonfly topology (bandwidth and
    latency filled in by the graph builder)."""
    if c.topology not in ("fat-tree", "rail-optimized", "dragonfly"):
        return None
    df = c.dragonfly
    base = Fabric()
    return Fabric(
        kind=c.topology,
        tiers=c.tiers or 2, gpus_per_leaf=c.gpus_per_leaf or base.gpus_per_leaf,
        oversubscription=c.oversubscription or 1.0, leaves_per_pod=c.leaves_per_pod,
        routers_per_group=df.routers_per_group if df else base.routers_per_group,
        gpus_per_router=df.gpus_per_router if df else base.gpus_per_router,
        global_links_per_router=df.global_links_per_router if df
        else base.global_links_per_router,
        global_bandwidth_Bps=df.global_bandwidth_GBps * 1e9 if df and df.global_bandwidth_GBps
        else None,
        global_latency_s=df.global_latency_us * 1e-6 if df and df.global_latency_us is not None
        else None)


def _server_fabric(c: ServerFabric) -> Fabric | None:
    """The fabric joining preset servers; None: the preset's non-blocking crossbar."""
    if c.topology is None:
        return None
    return replace(_fabric(c) or Fabric(), kind=FABRIC_OF_TOPOLOGY[c.topology],
                   bandwidth_Bps=None if c.link_bandwidth_GBps is None
                   else c.link_bandwidth_GBps * 1e9,
                   latency_s=None if c.link_latency_us is None else c.link_latency_us * 1e-6)


def _explicit_graph(c: ExplicitLinks, gpu: GPUSpec, num_gpus: int) -> nx.DiGraph:
    """One site of ``num_gpus`` GPUs of an explicit topology (NVLink: ``gpu``'s unless
    given)."""
    nvlink = (c.nvlink_bandwidth_GBps * 1e9 if c.nvlink_bandwidth_GBps
              else gpu.nvlink_bandwidth_Bps)
    return explicit_graph(
        c.topology, num_gpus, c.link_bandwidth_GBps * 1e9, (c.link_latency_us or 0.0) * 1e-6,
        gpus_per_node=c.gpus_per_node or 1, nvlink_bandwidth_Bps=nvlink,
        nvlink_latency_s=(1.7 if c.nvlink_latency_us is None else c.nvlink_latency_us) * 1e-6,
        nvls=bool(c.nvls), dims=tuple(c.dims or ()), fabric=_fabric(c))


def _join_sites(c: Networked, graphs: list[nx.DiGraph], name: str) -> tuple[nx.DiGraph, str]:
    """The sites' graphs joined by WAN links (one site: its graph), and the cluster name."""
    if len(graphs) == 1:
        return graphs[0], name
    return (multi_site(graphs, c.wan_bandwidth_Mbps * 1e6 / 8, c.wan_latency_ms * 1e-3),
            f"{name}x{len(graphs)}sites")


def _uniform_cluster(c: PresetCluster | TopologyCluster) -> Cluster:
    """Servers of one preset, or an explicit topology of one GPU type."""
    sites = c.sites or 1
    n = c.num_gpus // sites
    if isinstance(c, PresetCluster):
        server = SERVERS[c.preset]
        nic = None if c.nic_Gbps is None else c.nic_Gbps * 1e9 / 8
        graphs = [server_graph(c.preset, n, _server_fabric(c), c.nics_per_node, nic)
                  for _ in range(sites)]
        name = c.preset if c.topology is None else f"{c.preset}/{c.topology}"
        gpu = _speed(_power_capped(GPUS[server.gpu], c.gpu_power_limit_w,
                                   server.gpu_power_limit_w), c)
        per_node, launch = server.gpus_per_node, server.collective_launch_s
        protocol = server.protocol
    else:
        gpu = _speed(_power_capped(gpu_spec(c.gpu or DEFAULT_GPU), c.gpu_power_limit_w), c)
        graphs = [_explicit_graph(c, gpu, n) for _ in range(sites)]
        name, per_node, launch = f"{c.topology}{c.num_gpus}", c.gpus_per_node or 1, 0.0
        protocol = None
    graph, name = _join_sites(c, graphs, name)
    return Cluster(name, graph, gpu, min(per_node, n),
                   **_collective_settings(c).cluster_kwargs(launch, protocol))


def _runs(types: tuple[str, ...]) -> list[tuple[str, int]]:
    """``types`` as (type, consecutive count) runs."""
    out: list[tuple[str, int]] = []
    for t in types:
        if out and out[-1][0] == t:
            out[-1] = (t, out[-1][1] + 1)
        else:
            out.append((t, 1))
    return out


def _mixed_site(c: PresetNodesCluster | GpuNodesCluster, types: tuple[str, ...]
                ) -> nx.DiGraph:
    """The graph of one site of a mixed cluster: its servers' ``types`` in rank order."""
    per_node = c.server_size()
    if isinstance(c, PresetNodesCluster):
        return mixed_server_graph(_runs(types), _server_fabric(c))
    graph = _explicit_graph(c, gpu_spec(DEFAULT_GPU), len(types) * per_node)
    if per_node > 1 and c.nvlink_bandwidth_GBps is None:  # each server's NVLink is its GPU's
        set_server_links(graph, [ServerLinks(nvlink_Bps=gpu_spec(t).nvlink_bandwidth_Bps)
                                 for t in types], nic_fabric_links=False)
    return graph


def _mixed_cluster(c: PresetNodesCluster | GpuNodesCluster) -> Cluster:
    """A heterogeneous cluster from ``cluster.nodes`` (servers of several types)."""
    types, per_node = c.server_types(), c.server_size()
    sites = c.sites or 1
    per_site = len(types) // sites
    graphs = [_mixed_site(c, types[i * per_site:(i + 1) * per_site]) for i in range(sites)]
    if isinstance(c, PresetNodesCluster):
        name = "+".join(f"{n}x{t}" for t, n in _runs(types))
        if c.topology is not None:
            name = f"{name}/{c.topology}"
        launch = SERVERS[types[0]].collective_launch_s
        specs = {t: _speed(_power_capped(GPUS[SERVERS[t].gpu], c.gpu_power_limit_w,
                                         SERVERS[t].gpu_power_limit_w), c)
                 for t in dict.fromkeys(types)}
    else:
        name, launch = f"{c.topology}{c.num_gpus}", 0.0
        specs = {t: _speed(_power_capped(gpu_spec(t), c.gpu_power_limit_w), c)
                 for t in dict.fromkeys(types)}
    gpus = tuple(specs[t] for t in types for _ in range(per_node))
    graph, name = _join_sites(c, graphs, name)
    return Cluster(name, graph, gpus[0], per_node,
                   **_collective_settings(c).cluster_kwargs(launch), gpus=gpus)


def _speed(gpu: GPUSpec, c: Networked) -> GPUSpec:
    """``gpu`` paced by the expected slowest of the cluster's GPUs under
    ``cluster.gpu_speed_spread`` (:func:`topologies.variability.paced`); unset: ``gpu``."""
    return paced(gpu, c.num_gpus, c.gpu_speed_spread)


def _power_capped(gpu: GPUSpec, limit_w: float | None, preset_w: float | None = None
                  ) -> GPUSpec:
    """``gpu`` under ``cluster.gpu_power_limit_w``, else under its server preset's limit
    (:attr:`~topologies.presets.ServerPreset.gpu_power_limit_w`), else uncapped. The config
    checked the cluster's limit against every GPU's range (:mod:`topologies.power`)."""
    limit = limit_w if limit_w is not None else preset_w
    try:
        return capped(gpu, limit)
    except ValueError as exc:
        raise ConfigError(f"cluster.gpu_power_limit_w={limit!r}: {exc}") from None
