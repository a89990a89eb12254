"""A cluster: graph + GPU spec + routing. The one object the engine needs from topologies.

Routing is shortest paths by hop count with deterministic ECMP. Where several
next hops lie on a shortest path, the candidates are sorted by node name and
one is picked by a key, consuming the key as mixed-radix digits hop by hop
(``index = key mod m``, then ``key //= m``):

- ``dst-mod-k`` (default): the key is the destination GPU's rank, so all flows
  to one destination share a path and consecutive destinations spread over
  the uplinks. This is D-mod-k routing, the deterministic routing of
  InfiniBand fat-trees (Zahavi et al., "Optimized InfiniBand fat-tree routing
  for shift all-to-all communication patterns", 2010; OpenSM's ftree engine):
  it is contention-free for shift permutations such as a ring whose every
  hop crosses pods.
- ``hash``: the key is CRC-32 of ``"src>dst"``, like Ethernet ECMP's flow hash;
  flows may collide on an uplink, as in real Ethernet fabrics.

Either way the same (src, dst) always takes the same path, independent of
Python's hash seed. A route may start or end at a non-GPU node (an NVSwitch
doing in-network reduction) by naming the node instead of a rank.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import networkx as nx

from sim.errors import TopologyError
from topologies.graphs import gpu_node
from topologies.hardware import GPUSpec

ECMP_POLICIES = ("dst-mod-k", "hash")
GRANULARITIES = ("stream", "step")

Endpoint = int | str
"""A GPU rank, or the name of a graph node (e.g. ``host0/nvswitch``)."""


@dataclass(frozen=True)
class Route:
    """A path between two endpoints as link indices into ``Cluster.links``."""

    links: tuple[int, ...]
    latency_s: float
    """Sum of the hop latencies."""


class Cluster:
    """A cluster graph with its GPUs, indexed links and cached ECMP shortest-path routes.

    Links are the directed edges of the graph, numbered in sorted order so the
    numbering is deterministic. Routes are shortest paths by hop count, spread
    over equal-cost paths by the ``ecmp`` policy (module docstring); caches live
    on the instance (no module-level state).
    """

    def __init__(
        self,
        name: str,
        graph: nx.DiGraph,
        gpu: GPUSpec,
        gpus_per_node: int,
        collective_launch_s: float = 0.0,
        *,
        collective_step_s: float = 0.0,
        collective_algos: Mapping[str, str] | None = None,
        collective_granularity: str = "stream",
        ecmp: str = "dst-mod-k",
    ) -> None:
        self.name = name
        self.graph = graph
        self.gpu = gpu
        self.gpus_per_node = gpus_per_node
        self.collective_launch_s = collective_launch_s
        """Fixed software cost of starting one collective (NCCL kernel launch + setup)."""
        self.collective_step_s = collective_step_s
        """Extra software latency per collective step, on top of the route's hop latencies."""
        self.collective_algos: Mapping[str, str] = MappingProxyType(dict(collective_algos or {}))
        """Per-op algorithm overrides (``{"all_reduce": "tree"}``); ``auto`` = NCCL-like choice."""
        if collective_granularity not in GRANULARITIES:
            raise TopologyError(f"collective granularity {collective_granularity!r} is not one "
                                f"of {', '.join(GRANULARITIES)}")
        self.collective_granularity = collective_granularity
        """``stream``: a ring phase is one flow per ring edge; ``step``: one flow per step."""
        if ecmp not in ECMP_POLICIES:
            raise TopologyError(f"ecmp policy {ecmp!r} is not one of {', '.join(ECMP_POLICIES)}")
        self.ecmp = ecmp
        ranks = sorted(d["rank"] for _, d in graph.nodes(data=True) if d.get("kind") == "gpu")
        if ranks != list(range(len(ranks))):
            raise TopologyError(f"cluster {name}: GPU ranks must be 0..n-1, got {ranks[:10]}")
        self.num_gpus = len(ranks)
        self.links: tuple[tuple[str, str], ...] = tuple(sorted(graph.edges()))
        self._link_index = {edge: i for i, edge in enumerate(self.links)}
        self.link_bandwidth_Bps = tuple(graph.edges[e]["bandwidth_Bps"] for e in self.links)
        self.link_latency_s = tuple(graph.edges[e]["latency_s"] for e in self.links)
        self._succ = {v: sorted(graph.successors(v)) for v in graph}
        self._pred = {v: sorted(graph.predecessors(v)) for v in graph}
        self._routes: dict[tuple[Endpoint, Endpoint], Route] = {}
        self._bfs: dict[str, tuple[dict[str, int], list[str], int]] = {}

    def host_of(self, rank: int) -> int:
        """Server index of GPU ``rank``."""
        return self.graph.nodes[gpu_node(rank)]["host"]

    def nvswitch_of(self, rank: int) -> str | None:
        """The NVSwitch node GPU ``rank`` is attached to, or None."""
        for v in self._succ[gpu_node(rank)]:
            if self.graph.nodes[v].get("kind") == "nvswitch":
                return v
        return None

    def nvls_capable(self, node: str) -> bool:
        """Whether ``node`` is an NVSwitch that reduces in-network (NVLink SHARP)."""
        return bool(self.graph.nodes[node].get("nvls", False))

    def node(self, endpoint: Endpoint) -> str:
        """Graph node of an endpoint: ``gpu{rank}`` for an int, the name itself for a str."""
        if isinstance(endpoint, str):
            if endpoint not in self.graph:
                raise TopologyError(f"cluster {self.name}: no node {endpoint!r}")
            return endpoint
        if not 0 <= endpoint < self.num_gpus:
            raise TopologyError(f"cluster {self.name}: no GPU {endpoint} "
                                f"(ranks are 0..{self.num_gpus - 1})")
        return gpu_node(endpoint)

    def bottleneck_Bps(self, route: Route) -> float:
        """Smallest link bandwidth along ``route`` (inf for an empty route)."""
        return min((self.link_bandwidth_Bps[i] for i in route.links), default=float("inf"))

    def _distances(self, dst: str, src: str) -> dict[str, int]:
        """Hop distances to ``dst``, explored by BFS (backwards) at least as far as ``src``."""
        dist, frontier, level = self._bfs.get(dst) or ({dst: 0}, [dst], 0)
        while src not in dist and frontier:
            level += 1
            nxt = []
            for v in frontier:
                for u in self._pred[v]:
                    if u not in dist:
                        dist[u] = level
                        nxt.append(u)
            frontier = nxt
        self._bfs[dst] = (dist, frontier, level)
        return dist

    def _ecmp_key(self, src: Endpoint, dst: Endpoint) -> int:
        if self.ecmp == "dst-mod-k" and isinstance(dst, int):
            return dst
        text = f"{dst}" if self.ecmp == "dst-mod-k" else f"{src}>{dst}"
        return zlib.crc32(text.encode())

    def path(self, src: Endpoint, dst: Endpoint) -> list[str]:
        """The node sequence of the ECMP shortest path from ``src`` to ``dst``."""
        s, d = self.node(src), self.node(dst)
        dist = self._distances(d, s)
        if s not in dist:
            raise TopologyError(f"cluster {self.name}: no path from {s} to {d}")
        key = self._ecmp_key(src, dst)
        path = [s]
        v = s
        while v != d:
            want = dist[v] - 1
            nxt = [w for w in self._succ[v] if dist.get(w) == want]
            if len(nxt) > 1:
                key, i = divmod(key, len(nxt))
                v = nxt[i]
            else:
                v = nxt[0]
            path.append(v)
        return path

    def route(self, src: Endpoint, dst: Endpoint) -> Route:
        """ECMP shortest path from ``src`` to ``dst`` (GPU ranks or node names)."""
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        if src == dst:
            route = Route((), 0.0)
        else:
            nodes = self.path(src, dst)
            idx = tuple(self._link_index[(u, v)] for u, v in zip(nodes, nodes[1:], strict=False))
            route = Route(idx, sum(self.link_latency_s[i] for i in idx))
        self._routes[key] = route
        return route

    def __repr__(self) -> str:
        return (
            f"Cluster({self.name!r}, {self.num_gpus} x {self.gpu.name}, "
            f"{self.graph.number_of_nodes()} nodes, {len(self.links)} links)"
        )
