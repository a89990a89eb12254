"""A cluster: graph + GPU spec + routing. The one object the engine needs from topologies."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from sim.errors import TopologyError
from topologies.graphs import gpu_node
from topologies.hardware import GPUSpec


@dataclass(frozen=True)
class Route:
    """A path between two GPUs as link indices into ``Cluster.links``."""

    links: tuple[int, ...]
    latency_s: float
    """Sum of the hop latencies."""


class Cluster:
    """A cluster graph with its GPUs, indexed links and cached shortest-path routes.

    Links are the directed edges of the graph, numbered in sorted order so the
    numbering is deterministic. Routes are shortest paths by hop count; the
    cache lives on the instance (no module-level state).
    """

    def __init__(
        self,
        name: str,
        graph: nx.DiGraph,
        gpu: GPUSpec,
        gpus_per_node: int,
        collective_launch_s: float = 0.0,
    ) -> None:
        self.name = name
        self.graph = graph
        self.gpu = gpu
        self.gpus_per_node = gpus_per_node
        self.collective_launch_s = collective_launch_s
        """Fixed software cost of starting one collective (NCCL kernel launch + setup)."""
        ranks = sorted(d["rank"] for _, d in graph.nodes(data=True) if d.get("kind") == "gpu")
        if ranks != list(range(len(ranks))):
            raise TopologyError(f"cluster {name}: GPU ranks must be 0..n-1, got {ranks[:10]}")
        self.num_gpus = len(ranks)
        self.links: tuple[tuple[str, str], ...] = tuple(sorted(graph.edges()))
        self._link_index = {edge: i for i, edge in enumerate(self.links)}
        self.link_bandwidth_Bps = tuple(graph.edges[e]["bandwidth_Bps"] for e in self.links)
        self.link_latency_s = tuple(graph.edges[e]["latency_s"] for e in self.links)
        self._routes: dict[tuple[int, int], Route] = {}

    def host_of(self, rank: int) -> int:
        """Server index of GPU ``rank``."""
        return self.graph.nodes[gpu_node(rank)]["host"]

    def route(self, src: int, dst: int) -> Route:
        """Shortest path from GPU ``src`` to GPU ``dst``."""
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        if src == dst:
            route = Route((), 0.0)
        else:
            try:
                path = nx.shortest_path(self.graph, gpu_node(src), gpu_node(dst))
            except (nx.NetworkXNoPath, nx.NodeNotFound) as exc:
                raise TopologyError(
                    f"cluster {self.name}: no path from GPU {src} to {dst}"
                ) from exc
            idx = tuple(self._link_index[(u, v)] for u, v in zip(path, path[1:], strict=False))
            route = Route(idx, sum(self.link_latency_s[i] for i in idx))
        self._routes[key] = route
        return route

    def __repr__(self) -> str:
        return (
            f"Cluster({self.name!r}, {self.num_gpus} x {self.gpu.name}, "
            f"{self.graph.number_of_nodes()} nodes, {len(self.links)} links)"
        )
