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

Distances come from :class:`_Router`: bidirectional breadth-first searches
whose balls are cached per node and grown on the cheaper side, so a path
through a switch with thousands of ports never enumerates those ports (a
16,384-GPU crossbar routes in microseconds per pair; a BFS per destination
would visit the whole cluster each time).

Links are named by their two end nodes, as the generators of
:mod:`topologies.graphs` name nodes (``gpu3``, ``host0/nic3``, ``leaf1``,
``spine0``, ...): :meth:`Cluster.resolve_link` turns a user's ``[a, b]`` into
a link, and :meth:`Cluster.with_link_changes` returns a cluster with links
degraded or failed (routes then avoid the failed ones).

A cluster may mix GPU types (a heterogeneous cluster): ``gpus`` gives each
rank's :class:`~topologies.hardware.GPUSpec` and :meth:`Cluster.gpu_of` looks
one up; a uniform cluster stores none and answers ``gpu`` for every rank.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from base.errors import TopologyError
from topologies.digraph import Graph, as_networkx
from topologies.graphs import gpu_node
from topologies.hardware import GPUSpec

if TYPE_CHECKING:
    import networkx as nx

ECMP_POLICIES = ("dst-mod-k", "hash")
GRANULARITIES = ("stream", "step")

Endpoint = int | str
"""A GPU rank, or the name of a graph node (e.g. ``host0/nvswitch``)."""

Link = tuple[str, str]
"""A directed link by its end nodes' names, ``(from, to)``."""


def node_hint(name: str, graph: Any) -> str:
    """What a misnamed node could have been, for a fault's ``link``: the graph's names by
    pattern (``gpu0..gpu15``, ``host{n}/nic{n}`` x 16, ...) and, for a name of no pattern
    the graph has, the closest node name."""
    names: dict[str, list[str]] = {}
    for node in graph:
        names.setdefault(re.sub(r"\d+", "{n}", str(node)), []).append(str(node))
    shown = []
    for key, group in sorted(names.items()):
        if len(group) == 1:
            shown.append(group[0])
        elif key.count("{n}") == 1:
            numbers = [int(re.findall(r"\d+", g)[0]) for g in group]
            shown.append(f"{key.format(n=min(numbers))}..{key.format(n=max(numbers))}")
        else:
            shown.append(f"{key} x {len(group)}")
    known = ", ".join(shown)
    if re.sub(r"\d+", "{n}", name) in names:
        return f" (nodes: {known})"
    import difflib  # (an error's hint only: not imported by a run)

    close = difflib.get_close_matches(name, [str(n) for n in graph], n=1)
    return f" (did you mean {close[0]!r}? nodes: {known})" if close else f" (nodes: {known})"


@dataclass(frozen=True)
class Route:
    """A path between two endpoints as link indices into ``Cluster.links``."""

    links: tuple[int, ...]
    latency_s: float
    """Sum of the hop latencies."""


@dataclass(slots=True)
class _Ball:
    """Every node within ``radius`` hops of a root, with its exact hop distance.

    Forward balls hold distances from the root, backward balls distances to it.
    ``levels[i]`` lists the nodes exactly ``i`` hops away. ``cost`` is what
    growing the ball by one level would scan (the degree sum of its outermost
    level); an empty outermost level means the ball is complete.
    """

    dist: dict[str, int]
    levels: list[list[str]]
    cost: int
    adjacency: Mapping[str, Sequence[str]] = field(repr=False)
    radius: int = 0

    @property
    def complete(self) -> bool:
        return not self.levels[-1]

    def grow(self) -> list[str]:
        """Add the next level (every unseen neighbour of the outermost level); return it."""
        dist, adj = self.dist, self.adjacency
        r = self.radius = self.radius + 1
        nxt: list[str] = []
        for v in self.levels[-1]:
            for u in adj[v]:
                if u not in dist:
                    dist[u] = r
                    nxt.append(u)
        self.levels.append(nxt)
        self.cost = sum(map(len, map(adj.__getitem__, nxt)))
        return nxt


class _SortedNeighbours(dict[str, list[str]]):
    """``neighbours[v]``: ``neighbours(v)`` (e.g. ``graph.successors``) sorted by name, computed
    on first access (a 16,384-GPU cluster routes through a small part of its nodes)."""

    def __init__(self, neighbours: Callable[[str], Iterable[str]]) -> None:
        super().__init__()
        self._neighbours = neighbours

    def __missing__(self, v: str) -> list[str]:
        out = self[v] = sorted(self._neighbours(v))
        return out


class _NeighbourSets(dict[str, frozenset[str]]):
    """``sets[v]``: the neighbours of ``v`` as a frozenset, built on first access."""

    def __init__(self, neighbours: Mapping[str, Sequence[str]]) -> None:
        super().__init__()
        self._neighbours = neighbours

    def __missing__(self, v: str) -> frozenset[str]:
        out = self[v] = frozenset(self._neighbours[v])
        return out


def _closest(candidates: Iterable[tuple[str, int]], other: Mapping[str, int]) -> float:
    """Smallest ``d + other[x]`` over ``(x, d)`` with ``x`` in ``other`` (inf if none)."""
    best = math.inf
    for x, d in candidates:
        e = other.get(x)
        if e is not None and d + e < best:
            best = d + e
    return best


class _Router:
    """Exact hop distances and ECMP shortest paths on a directed graph, computed lazily.

    ``distance(a, b)`` grows a forward ball around ``a`` and a backward ball
    around ``b``, always the one that is cheaper to grow, until they meet: if
    two balls of radii ``ra`` and ``rb`` intersect, the smallest ``da(x) +
    db(x)`` over the intersection is the distance (a shortest path of length
    at most ``ra + rb`` has a node in both), and if they do not, the distance
    exceeds ``ra + rb``. Balls are cached per node, so the searches of later
    queries start where earlier ones stopped.
    """

    def __init__(self, succ: Mapping[str, list[str]], pred: Mapping[str, list[str]]) -> None:
        self.succ = succ
        self.pred = pred
        self._out = _NeighbourSets(succ)
        self._fwd: dict[str, _Ball] = {}
        self._bwd: dict[str, _Ball] = {}
        self.chose = False
        """Whether the last :meth:`path` chose among several next hops (False: the
        shortest path it returned is the only one)."""

    def _ball(self, root: str, forward: bool) -> _Ball:
        cache = self._fwd if forward else self._bwd
        ball = cache.get(root)
        if ball is None:
            adj = self.succ if forward else self.pred
            ball = cache[root] = _Ball({root: 0}, [[root]], len(adj[root]), adj)
        return ball

    def _meet(self, fa: _Ball, bb: _Ball, limit: float) -> float:
        """Grow ``fa`` (forward from a) and ``bb`` (backward from b) until they meet; the
        distance a -> b, or inf if there is none or it exceeds ``limit``.

        The balls are checked against each other once in full, then only each
        new level against the other ball (the intersection was empty before).
        """
        da, db = fa.dist, bb.dist
        both = da.keys() & db.keys()
        best = min([da[x] + db[x] for x in both]) if both else math.inf
        while best == math.inf:
            if fa.radius + bb.radius >= limit or fa.complete or bb.complete:
                return math.inf
            grown, other = (fa, bb) if fa.cost <= bb.cost else (bb, fa)
            r = grown.radius + 1
            best = _closest(((x, r) for x in grown.grow()), other.dist)
        return best if best <= limit else math.inf

    def distance(self, a: str, b: str, limit: float = math.inf) -> float:
        """Hops of a shortest path from ``a`` to ``b``; inf if none, or if longer than
        ``limit`` (then the search stops early)."""
        if a == b:
            return 0 if limit >= 0 else math.inf
        return self._meet(self._ball(a, True), self._ball(b, False), limit)

    def _meet_ways(self, fa: _Ball, bb: _Ball, hops: int) -> list[set[str]]:
        """``ways[i]`` (for ``i <= k = hops - radius(bb)``): the nodes ``i`` hops from a on
        a shortest a -> b path, found by sweeping the forward ball back from level k."""
        k = hops - bb.radius
        if k <= 0:
            return []
        fwd_k, bwd_r = fa.levels[k], bb.levels[bb.radius]
        if len(fwd_k) <= len(bwd_r):
            on = {x for x in fwd_k if bb.dist.get(x) == bb.radius}
        else:
            on = {x for x in bwd_r if fa.dist.get(x) == k}
        ways = [on]
        out = self._out
        for level in reversed(fa.levels[:k]):
            # set.isdisjoint(frozenset) scans the smaller of the two
            on = {u for u in level if not on.isdisjoint(out[u])}
            ways.append(on)
        ways.reverse()
        return ways

    def path(self, a: str, b: str, key: int) -> list[str] | None:
        """The ECMP shortest path from ``a`` to ``b`` (module docstring), None if none.

        Next hops near ``a`` come from the forward sweep (:meth:`_meet_ways`), the
        rest from ``b``'s backward ball: either way the exact set of successors
        one hop closer to ``b``, sorted by name, without scanning a big switch's
        ports when the other set is small.
        """
        self.chose = False
        fa = self._fwd.get(a) or self._ball(a, True)
        bb = self._bwd.get(b) or self._ball(b, False)
        hops = self._meet(fa, bb, math.inf)
        if hops == math.inf:
            return None
        ways = self._meet_ways(fa, bb, hops)
        succ, dist, levels = self.succ, bb.dist, bb.levels
        path = [a]
        v = a
        fwd = len(ways)
        for i in range(1, hops + 1):
            # the candidates lie in ``on``; if it holds one node, that is the next hop
            on = ways[i] if i < fwd else levels[hops - i]
            if len(on) == 1:
                (v,) = on
            else:
                out = succ[v]
                if len(out) > len(on):
                    nxt = sorted(self._out[v].intersection(on))
                elif i < fwd:
                    nxt = [w for w in out if w in on]
                else:
                    want = hops - i
                    nxt = [w for w in out if dist.get(w) == want]
                if len(nxt) > 1:
                    self.chose = True
                    key, j = divmod(key, len(nxt))
                    v = nxt[j]
                else:
                    v = nxt[0]
            path.append(v)
        return path


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
        graph: nx.DiGraph | Graph,
        gpu: GPUSpec,
        gpus_per_node: int,
        collective_launch_s: float = 0.0,
        *,
        collective_step_s: float = 0.0,
        collective_algos: Mapping[str, str] | None = None,
        collective_granularity: str = "stream",
        collective_protocol: str = "auto",
        ecmp: str = "dst-mod-k",
        failed_links: Iterable[Link] = (),
        gpus: Sequence[GPUSpec] | None = None,
    ) -> None:
        self.name = name
        self._graph = graph
        """The graph the cluster reads: a networkx graph, or the :class:`topologies.digraph.
        Graph` of a built description (its networkx twin, :attr:`graph`, made on first use)."""
        self._networkx: nx.DiGraph | None = None
        self.gpu = gpu
        """The GPU of every rank of a uniform cluster; of rank 0 in a mixed one (use
        :meth:`gpu_of`)."""
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
        if collective_protocol not in ("auto", "simple", "ll128", "ll"):
            raise TopologyError(f"collective protocol {collective_protocol!r} is not one of "
                                "auto, simple, ll128, ll")
        self.collective_protocol = collective_protocol
        """NCCL protocol of ring and tree collectives: ``auto`` (per size, NCCL's tuning
        model), or ``simple``, ``ll128``, ``ll`` always (``NCCL_PROTO``); sim.protocols."""
        """``stream``: a ring phase is one flow per ring edge; ``step``: one flow per step."""
        if ecmp not in ECMP_POLICIES:
            raise TopologyError(f"ecmp policy {ecmp!r} is not one of {', '.join(ECMP_POLICIES)}")
        self.ecmp = ecmp
        self.failed_links: tuple[Link, ...] = tuple(sorted(set(failed_links)))
        """Directed links removed from the graph by :meth:`with_link_changes` (for errors)."""
        ranks = sorted(d["rank"] for _, d in graph.nodes(data=True) if d.get("kind") == "gpu")
        if ranks != list(range(len(ranks))):
            raise TopologyError(f"cluster {name}: GPU ranks must be 0..n-1, got {ranks[:10]}")
        self.num_gpus = len(ranks)
        self._gpus: tuple[GPUSpec, ...] | None = None
        if gpus is not None:
            specs = tuple(gpus)
            if len(specs) != self.num_gpus:
                raise TopologyError(f"cluster {name}: {len(specs)} GPU specs for "
                                    f"{self.num_gpus} GPUs")
            if specs and specs[0] != gpu:
                raise TopologyError(f"cluster {name}: rank 0 is a {specs[0].name}, but the "
                                    f"cluster's gpu is {gpu.name}")
            if any(spec != gpu for spec in specs):
                self._gpus = specs
        # (the adjacency's own dicts: ~1.5 of the ~13 ms of Megatron 1T's graph that reading
        # graph.edges(data=True) through its view took)
        attrs = {(u, v): d for u, nbrs in graph.adjacency() for v, d in nbrs.items()}
        self.links: tuple[Link, ...] = tuple(sorted(attrs))
        self._link_from: dict[str, dict[str, int]] = {}
        """``_link_from[u][v]``: index of link u -> v (small dicts: faster than pairs)."""
        for i, (u, v) in enumerate(self.links):
            out = self._link_from.get(u)
            if out is None:
                self._link_from[u] = {v: i}
            else:
                out[v] = i
        # (map and itemgetter: the loops in C, ~3 of Megatron 1T's ~13 ms here)
        data = list(map(attrs.__getitem__, self.links))
        self.link_bandwidth_Bps = tuple(map(itemgetter("bandwidth_Bps"), data))
        self.link_latency_s = tuple(map(itemgetter("latency_s"), data))
        self._succ = _SortedNeighbours(graph.successors)
        self._pred = _SortedNeighbours(graph.predecessors)
        self._router = _Router(self._succ, self._pred)
        self._routes: dict[tuple[Endpoint, Endpoint], Route] = {}
        self._hosts: dict[int, int] = {}
        """:meth:`host_of` by rank, as asked (the graph's node attribute, read once)."""
        self._ambiguous: set[tuple[Endpoint, Endpoint]] = set()
        """Pairs whose route was one of several shortest paths (an ECMP choice)."""
        self.route_log: list[tuple[Endpoint, Endpoint]] | None = None
        """When a list, every :meth:`route` call appends its ``(src, dst)`` (cached or not):
        :mod:`sim.commtime` uses it to learn which routes a timing consulted."""
        self._host_classes: tuple[int, ...] | None | bool = False
        self._server_nodes: list[tuple[str, ...]] = []
        """Each server's nodes in the pair order of :meth:`host_classes` (GPUs by rank, the
        others by name), filled with it."""
        self._locals_free: dict[int, bool] = {}
        """:meth:`locals_interchangeable` by twin class."""
        self._place: dict[str, tuple[int, int]] = {}
        """A server node's (server, position in :attr:`_server_nodes`), with the classes."""
        self._vectors: dict[int, tuple[list, dict]] = {}
        """Per twin class whose GPUs are interchangeable: its servers' other nodes' hop
        vectors by position, and the positions by vector (:meth:`_check_locals`)."""
        self._route_models: dict[tuple[int, int, bool], tuple[int, int]] = {}
        """A GPU pair whose route is unique per (twin classes of its servers, same server):
        what :meth:`_translated_route` maps."""
        self._position_maps: dict[tuple, tuple[list[int] | None, list[int] | None]] = {}
        """:meth:`_positions` by (classes, local indices)."""
        self.translate_routes = True
        """Whether :meth:`route` maps a model pair's route onto a new pair of the same
        pattern (:meth:`_translated_route`); False: every route by the search (the
        reference)."""
        self._nics: dict[int, tuple[Mapping[str, object], ...]] | None = None
        self.memo: dict[object, object] = {}
        """Derived values that layers above keep per cluster (:func:`sim.collectives.
        plan_cost` shares estimates between twin groups here); a changed cluster (failed
        links, a job's subset) is a new object with an empty one."""

    @cached_property
    def _link_index(self) -> dict[Link, int]:
        """Index into :attr:`links` of each directed link, by its ends (made on first use:
        a run routes by :attr:`_link_from` and asks none by name)."""
        return dict(zip(self.links, range(len(self.links)), strict=True))

    @property
    def graph(self) -> nx.DiGraph:
        """The cluster's graph as a :class:`networkx.DiGraph` (a built description's
        :class:`~topologies.digraph.Graph` wrapped on first use, over the same dicts:
        :func:`topologies.digraph.as_networkx`)."""
        if self._networkx is None:
            self._networkx = as_networkx(self._graph)
        return self._networkx

    def freeze(self) -> None:
        """No changes to the graph from now on (:func:`networkx.freeze`, or
        :meth:`topologies.digraph.Graph.freeze`; the networkx twin is made frozen)."""
        if isinstance(self._graph, Graph):
            self._graph.freeze()
        else:
            import networkx as nx

            nx.freeze(self._graph)
        if self._networkx is not None and self._networkx is not self._graph:
            import networkx as nx

            nx.freeze(self._networkx)

    @property
    def node_attrs(self) -> Any:
        """The graph's nodes: ``node_attrs[v]`` is node ``v``'s attributes (networkx's
        ``graph.nodes[v]``, without making the networkx graph)."""
        return self._graph.nodes

    # ------------------------------------------------------------------ GPU types

    @property
    def heterogeneous(self) -> bool:
        """Whether the cluster mixes GPU types."""
        return self._gpus is not None

    @property
    def gpus(self) -> tuple[GPUSpec, ...]:
        """The GPU spec of every rank, in rank order."""
        return self._gpus if self._gpus is not None else (self.gpu,) * self.num_gpus

    def gpu_of(self, rank: int) -> GPUSpec:
        """The GPU spec of ``rank``."""
        return self.gpu if self._gpus is None else self._gpus[rank]

    @property
    def gpu_types(self) -> tuple[GPUSpec, ...]:
        """The distinct GPU specs, in order of first rank."""
        return tuple(dict.fromkeys(self.gpus)) if self._gpus is not None else (self.gpu,)

    def gpu_summary(self) -> str:
        """``"A100-80GB"``, or ``"16x A100-80GB + 16x H100"`` for a mixed cluster."""
        if self._gpus is None:
            return self.gpu.name
        counts: dict[str, int] = {}
        for spec in self._gpus:
            counts[spec.name] = counts.get(spec.name, 0) + 1
        return " + ".join(f"{n}x {name}" for name, n in counts.items())

    # ------------------------------------------------------------------ hosts

    def host_of(self, rank: int) -> int:
        """Server index of GPU ``rank`` (its node's ``host`` attribute; kept per rank, as
        the routes are: collective selection asks it tens of thousands of times)."""
        host = self._hosts.get(rank)
        if host is None:
            host = self._hosts[rank] = self._graph.nodes[gpu_node(rank)]["host"]
        return host

    def nvswitch_of(self, rank: int) -> str | None:
        """The NVSwitch node GPU ``rank`` is attached to, or None."""
        for v in self._succ[gpu_node(rank)]:
            if self._graph.nodes[v].get("kind") == "nvswitch":
                return v
        return None

    def nics_of(self, host: int) -> tuple[Mapping[str, object], ...]:
        """The attributes of server ``host``'s scale-out NICs (nodes of kind ``nic``), in
        graph order; () for a server without any. One pass over the graph per cluster."""
        if self._nics is None:
            table: dict[int, list[Mapping[str, object]]] = {}
            for _, d in self._graph.nodes(data=True):
                if d.get("kind") == "nic":
                    table.setdefault(d.get("host"), []).append(d)
            self._nics = {h: tuple(nics) for h, nics in table.items()}
        return self._nics.get(host, ())

    def nvls_capable(self, node: str) -> bool:
        """Whether ``node`` is an NVSwitch that reduces in-network (NVLink SHARP)."""
        return bool(self._graph.nodes[node].get("nvls", False))

    def node(self, endpoint: Endpoint) -> str:
        """Graph node of an endpoint: ``gpu{rank}`` for an int, the name itself for a str."""
        if isinstance(endpoint, str):
            if endpoint not in self._graph:
                raise TopologyError(f"cluster {self.name}: no node {endpoint!r}"
                                    f"{node_hint(endpoint, self._graph)}")
            return endpoint
        if not 0 <= endpoint < self.num_gpus:
            raise TopologyError(f"cluster {self.name}: no GPU {endpoint} "
                                f"(ranks are 0..{self.num_gpus - 1})")
        return gpu_node(endpoint)

    def bottleneck_Bps(self, route: Route) -> float:
        """Smallest link bandwidth along ``route`` (inf for an empty route)."""
        return min((self.link_bandwidth_Bps[i] for i in route.links), default=float("inf"))

    # ------------------------------------------------------------------ routing

    def _ecmp_key(self, src: Endpoint, dst: Endpoint) -> int:
        if self.ecmp == "dst-mod-k" and isinstance(dst, int):
            return dst
        text = f"{dst}" if self.ecmp == "dst-mod-k" else f"{src}>{dst}"
        return zlib.crc32(text.encode())

    def _unreachable(self, s: str, d: str) -> TopologyError:
        if not self.failed_links:
            return TopologyError(f"cluster {self.name}: no path from {s} to {d}")
        shown = ", ".join(f"{u}->{v}" for u, v in self.failed_links[:12])
        more = f" (+{len(self.failed_links) - 12} more)" if len(self.failed_links) > 12 else ""
        return TopologyError(
            f"cluster {self.name}: no path from {s} to {d}: the failed links partition the "
            f"network (failed: {shown}{more})")

    def path(self, src: Endpoint, dst: Endpoint) -> list[str]:
        """The node sequence of the ECMP shortest path from ``src`` to ``dst``."""
        s, d = self.node(src), self.node(dst)
        if s == d:
            return [s]
        path = self._router.path(s, d, self._ecmp_key(src, dst))
        if path is None:
            raise self._unreachable(s, d)
        return path

    def route(self, src: Endpoint, dst: Endpoint) -> Route:
        """ECMP shortest path from ``src`` to ``dst`` (GPU ranks or node names)."""
        key = (src, dst)
        if self.route_log is not None:
            self.route_log.append(key)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        if src == dst:
            route = Route((), 0.0)
        else:
            got = (self._translated_route(src, dst) if self.translate_routes
                   and isinstance(src, int) and isinstance(dst, int) else None)
            if got is not None:
                route = got
            else:
                nodes = self.path(src, dst)
                if self._router.chose:
                    self._ambiguous.add(key)
                link_from, latency = self._link_from, self.link_latency_s
                idx = tuple([link_from[u][v] for u, v in zip(nodes, nodes[1:], strict=False)])
                route = Route(idx, sum([latency[i] for i in idx]))
                if (self.translate_routes and not self._router.chose and isinstance(src, int)
                        and isinstance(dst, int)):
                    pattern = self._pattern(src, dst)
                    if pattern is not None:
                        self._route_models.setdefault(pattern, (src, dst))
        self._routes[key] = route
        return route

    def _pattern(self, src: int, dst: int) -> tuple[int, int, bool] | None:
        """(twin class of ``src``'s server, of ``dst``'s, same server) where both servers'
        GPUs are interchangeable (:meth:`locals_interchangeable`); else None."""
        n = self.num_gpus
        if not (0 <= src < n and 0 <= dst < n):
            return None  # not GPUs: the search raises
        classes = self.host_classes()
        if classes is None:
            return None
        gpn = self.gpus_per_node
        hs, hd = src // gpn, dst // gpn
        if not (self.locals_interchangeable(hs) and self.locals_interchangeable(hd)):
            return None
        return classes[hs], classes[hd], hs == hd

    def _translated_route(self, src: int, dst: int) -> Route | None:
        """The route from ``src`` to ``dst`` as the image of a model pair's unique route
        of the same pattern (:meth:`_pattern`), or None (then :meth:`route` searches).

        The model pair (a, b) and (src, dst) have servers of the same twin classes, one
        server or two for both, each with interchangeable GPUs. Mapping a's server onto
        src's and b's onto dst's (a permutation of twin servers, completed within the
        classes, :meth:`host_classes`), then a permutation of the GPUs inside each of them
        that takes a to src and b to dst (:meth:`locals_interchangeable`), the fabric
        fixed, is an automorphism ``phi`` of the graph that keeps every link's bandwidth
        and latency. It maps the unique shortest path from a to b onto the unique shortest
        path from src to dst, which is then the route whatever the ECMP key, link by link,
        with the same latencies summed in the same order. ``phi`` of a server node is
        found by position: a GPU's local index permuted, another node (NIC, PCIe port,
        NVSwitch) the one whose hop vector to and from the server's GPUs is its own
        permuted (:meth:`_check_locals`). A model route through a third server's node is
        not mapped (None)."""
        pattern = self._pattern(src, dst)
        if pattern is None:
            return None
        model = self._route_models.get(pattern)
        if model is None:
            return None
        a, b = model
        gpn = self.gpus_per_node
        ha, la = divmod(a, gpn)
        hb, lb = divmod(b, gpn)
        hs, ls = divmod(src, gpn)
        hd, ld = divmod(dst, gpn)
        if ha == hb:
            key: tuple = (pattern[0], la, ls, lb, ld)
        else:
            key = (pattern[0], la, ls, pattern[1], lb, ld)
        maps = self._position_maps.get(key)
        if maps is None:
            maps = self._position_maps[key] = self._positions(pattern, la, ls, lb, ld, ha == hb)
        map_s, map_d = maps
        if map_s is None or map_d is None:
            return None
        nodes_s, nodes_d = self._server_nodes[hs], self._server_nodes[hd]
        place = self._place
        link_from, links = self._link_from, self.links

        def image(v: str) -> str | None:
            where = place.get(v)
            if where is None:
                return v  # the fabric, fixed
            h, p = where
            if h == ha:
                return nodes_s[map_s[p]]  # type: ignore[index]
            if h == hb:
                return nodes_d[map_d[p]]  # type: ignore[index]
            return None

        idx = []
        for i in self._routes[model].links:
            u, v = links[i]
            pu, pv = image(u), image(v)
            if pu is None or pv is None:
                return None
            j = link_from.get(pu, {}).get(pv)
            if j is None:
                return None
            idx.append(j)
        latency = self.link_latency_s
        return Route(tuple(idx), sum([latency[i] for i in idx]))

    def _positions(self, pattern: tuple[int, int, bool], la: int, ls: int, lb: int, ld: int,
                   same: bool) -> tuple[list[int] | None, list[int] | None]:
        """For :meth:`_translated_route`: where each position of the model's server(s) goes
        (GPUs by a permutation of local indices that takes la to ls, and lb to ld, the
        other nodes to the node whose hop vector is theirs permuted), or None for a node
        without one."""
        gpn = self.gpus_per_node

        def positions(cls: int, sigma: list[int]) -> list[int] | None:
            vecs, pos = self._vectors[cls]
            inv = [0] * gpn
            for i in range(gpn):
                inv[sigma[i]] = i
            out = list(sigma)
            for a, b in vecs:  # w[sigma(i)] = v[i]
                q = pos.get((tuple([a[k] for k in inv]), tuple([b[k] for k in inv])))
                if q is None:
                    return None
                out.append(q)
            return out

        # sigma[i]: the local index GPU i of a model server goes to in its image
        sig_s = list(range(gpn))
        sig_s[la], sig_s[ls] = ls, la
        if same:
            at = sig_s.index(ld)  # the local that goes to ld: swap it with b's image
            moved = sig_s[lb]
            sig_s[lb], sig_s[at] = ld, moved
            both = positions(pattern[0], sig_s)
            return both, both
        sig_d = list(range(gpn))
        sig_d[lb], sig_d[ld] = ld, lb
        return positions(pattern[0], sig_s), positions(pattern[1], sig_d)

    def route_is_unique(self, src: Endpoint, dst: Endpoint) -> bool:
        """Whether :meth:`route` from ``src`` to ``dst`` (computed first if need be) is the
        only shortest path: no ECMP choice was made along it. Any automorphism of the
        graph then maps it onto the route between the images, whatever the ECMP key."""
        self.route(src, dst)
        return (src, dst) not in self._ambiguous

    def host_classes(self) -> tuple[int, ...] | None:
        """Twin classes of the servers: ``classes[h] == classes[k]`` when swapping servers
        ``h`` and ``k`` is an automorphism of the graph; None when servers cannot be swapped
        this way (a mixed-GPU cluster, GPU ranks not ``host * gpus_per_node + local``,
        servers of different sizes). Computed once.

        Server ``h``'s nodes are those with ``host == h``; they pair with server
        ``k``'s in order (GPUs by rank, the others by name). The swap maps each node
        to its pair and fixes every node of no server (the fabric). It is an
        automorphism preserving all the simulation reads of the graph (each link's
        bandwidth and latency, :attr:`link_bandwidth_Bps` and
        :attr:`link_latency_s`; node attributes: kind, NVLS) when the two servers
        have the same signature: their nodes' attributes but rank and host (items
        in insertion order: equal dicts built in another order only make fewer
        twins) in pair order, and their links, each by direction, the position of
        its server end, the other end (a position in the server, or a fabric
        node's name), bandwidth and latency. A server linked directly to another
        server's nodes is a twin of none. Twins form equivalence classes (the swap
        of ``h, m`` is the composition of those of ``h, k``, ``k, m`` and ``h, k``),
        and any permutation of servers within classes is an automorphism too.
        """
        if self._host_classes is False:
            self._host_classes = self._compute_host_classes()
        return self._host_classes  # type: ignore[return-value]

    def _compute_host_classes(self) -> tuple[int, ...] | None:
        """:meth:`host_classes`, worked out: :meth:`_host_classes_reference`'s signatures
        with each node's attributes and each link's description numbered where first met
        (equal ones, equal numbers), so that a server's links sort as numbers and its
        signature hashes and compares as numbers, not as nested tuples (Megatron 1T: 384
        servers of 17 nodes and 48 links, ~20 % of the classes' instructions). The same
        classes, server nodes and places (``tests/test_lean_run.py``)."""
        if self._gpus is not None or self.num_gpus % max(self.gpus_per_node, 1):
            return None
        gpn = self.gpus_per_node
        hosts = self.num_gpus // gpn
        members: list[tuple[list[tuple[int, str, int]], list[tuple[str, int]]]] = [
            ([], []) for _ in range(hosts)]
        host_of: dict[str, int] = {}
        numbered: dict[tuple, int] = {}
        """Each node's attributes (but host and rank) and each link's description, by
        number."""
        number = numbered.get
        for v, data in self._graph.nodes(data=True):
            host = data.get("host")
            if host is None:
                if data.get("kind") == "gpu":
                    return None
                continue
            if not (isinstance(host, int) and 0 <= host < hosts):
                return None
            host_of[v] = host
            rest = data.copy()  # (a copy less two keys: faster than filtering the items)
            del rest["host"]
            rest.pop("rank", None)
            attrs = ("node", *rest.items())
            a = number(attrs)
            if a is None:
                a = numbered[attrs] = len(numbered)
            if data.get("kind") == "gpu":
                members[host][0].append((data["rank"], v, a))
            else:
                members[host][1].append((v, a))
        pos: dict[str, int] = {}
        nodes: list[tuple[int, ...]] = []
        place = self._place
        for h, (gpus, others) in enumerate(members):
            gpus.sort()
            others.sort()
            if [g[0] for g in gpus] != list(range(h * gpn, (h + 1) * gpn)):
                return None
            # (zips, not generators: a fifth of the classes' time on Megatron 1T)
            names = tuple([v for _, v, _ in gpus] + [v for v, _ in others])
            at = range(len(names))
            pos.update(zip(names, at, strict=True))
            self._server_nodes.append(names)
            place.update(zip(names, zip([h] * len(names), at, strict=True), strict=True))
            nodes.append(tuple([a for _, _, a in gpus] + [a for _, a in others]))
        links: list[list[int]] = [[] for _ in range(hosts)]
        linked = [False] * hosts
        """Servers with a link to another server's node: twins of none."""
        get = host_of.get
        for (u, v), bw, lat in zip(self.links, self.link_bandwidth_Bps, self.link_latency_s,
                                   strict=True):
            hu, hv = get(u), get(v)
            if hu is None:
                if hv is None:
                    continue
                h, link = hv, (1, pos[v], 1, u, bw, lat)
            elif hv is None:
                # out of a server to the fabric (by name) ...
                h, link = hu, (0, pos[u], 1, v, bw, lat)
            elif hv == hu:
                # ... or to its own node (by position)
                h, link = hu, (0, pos[u], 0, pos[v], bw, lat)
            else:
                linked[hu] = linked[hv] = True
                continue
            k = number(link)
            if k is None:
                k = numbered[link] = len(numbered)
            links[h].append(k)
        signatures: dict[tuple, int] = {}
        classes: list[int] = []
        for h in range(hosts):
            if linked[h]:
                classes.append(len(signatures) + hosts + h)  # a class of its own
                continue
            links[h].sort()  # a multiset of link descriptions
            sig = (nodes[h], tuple(links[h]))
            classes.append(signatures.setdefault(sig, len(signatures)))
        return tuple(classes)

    def _host_classes_reference(self) -> tuple[int, ...] | None:
        """:meth:`host_classes` with each server's signature as its nodes' attribute items
        and its sorted link descriptions themselves (the reference of
        :meth:`_compute_host_classes`); fills the server nodes and places as it does."""
        if self._gpus is not None or self.num_gpus % max(self.gpus_per_node, 1):
            return None
        gpn = self.gpus_per_node
        hosts = self.num_gpus // gpn
        members: list[tuple[list[tuple[int, str, tuple]], list[tuple[str, tuple]]]] = [
            ([], []) for _ in range(hosts)]
        host_of: dict[str, int] = {}
        for v, data in self._graph.nodes(data=True):
            host = data.get("host")
            if host is None:
                if data.get("kind") == "gpu":
                    return None
                continue
            if not (isinstance(host, int) and 0 <= host < hosts):
                return None
            host_of[v] = host
            rest = data.copy()  # (a copy less two keys: faster than filtering the items)
            del rest["host"]
            rest.pop("rank", None)
            attrs = tuple(rest.items())
            if data.get("kind") == "gpu":
                members[host][0].append((data["rank"], v, attrs))
            else:
                members[host][1].append((v, attrs))
        pos: dict[str, int] = {}
        nodes: list[tuple[tuple, ...]] = []
        place = self._place
        for h, (gpus, others) in enumerate(members):
            gpus.sort()
            others.sort()
            if [g[0] for g in gpus] != list(range(h * gpn, (h + 1) * gpn)):
                return None
            # (zips, not generators: a fifth of the classes' time on Megatron 1T)
            names = tuple([v for _, v, _ in gpus] + [v for v, _ in others])
            at = range(len(names))
            pos.update(zip(names, at, strict=True))
            self._server_nodes.append(names)
            place.update(zip(names, zip([h] * len(names), at, strict=True), strict=True))
            nodes.append(tuple([attrs for _, _, attrs in gpus] + [attrs for _, attrs in others]))
        links: list[list[tuple]] = [[] for _ in range(hosts)]
        linked = [False] * hosts
        """Servers with a link to another server's node: twins of none."""
        get = host_of.get
        for (u, v), bw, lat in zip(self.links, self.link_bandwidth_Bps, self.link_latency_s,
                                   strict=True):
            hu, hv = get(u), get(v)
            if hu is None:
                if hv is not None:
                    links[hv].append((1, pos[v], 1, u, bw, lat))
            elif hv is None:
                # out of a server to the fabric (by name) ...
                links[hu].append((0, pos[u], 1, v, bw, lat))
            elif hv == hu:
                # ... or to its own node (by position)
                links[hu].append((0, pos[u], 0, pos[v], bw, lat))
            else:
                linked[hu] = linked[hv] = True
        signatures: dict[tuple, int] = {}
        classes: list[int] = []
        for h in range(hosts):
            if linked[h]:
                classes.append(len(signatures) + hosts + h)  # a class of its own
                continue
            links[h].sort()  # equal (direction, position, kind): same type of end
            sig = (nodes[h], tuple(links[h]))
            classes.append(signatures.setdefault(sig, len(signatures)))
        return tuple(classes)

    def locals_interchangeable(self, host: int) -> bool:
        """Whether every permutation of server ``host``'s GPUs (by local index) extends to an
        automorphism of the graph that maps the server's nodes onto themselves and fixes
        every other node, preserving every attribute the simulation reads (False where
        :meth:`host_classes` is None). Checked once per twin class, on its first server.

        The check: for each swap of local GPUs j, j + 1, the server's other nodes (NICs,
        PCIe ports, NVSwitch) are paired by their hop distances from and to each of its GPUs
        inside the server (the swap must permute those vectors; a node whose vector another
        node shares makes the answer False); the map is then an automorphism if every link
        with an end in the server maps onto a link with the same attributes and every node
        onto one with the same attributes (a GPU's but its rank). The swaps generate every
        permutation, and a composition of automorphisms is one. A twin of the checked
        server (its swap with it an automorphism, :meth:`host_classes`) has the conjugate
        swaps, which swap the same local indices (twins pair their GPUs by rank). So on a
        cluster where this holds, a group maps onto any other group whose members sit on
        twin servers in the same pattern (same members per server, in the same positions of
        the group), with fixed fabric: the symmetry :mod:`sim.commtime` shares plans over.
        """
        classes = self.host_classes()
        if classes is None:
            return False
        key = classes[host]
        free = self._locals_free.get(key)
        if free is None:
            free = self._locals_free[key] = self._check_locals(host)
        return free

    def _check_locals(self, host: int) -> bool:
        gpn = self.gpus_per_node
        nodes = self._server_nodes[host]
        gpus, others = nodes[:gpn], nodes[gpn:]
        inside = set(nodes)
        succ, pred = self._graph.succ, self._graph.pred

        def hops(start: str, adj: Mapping[str, Mapping[str, object]]) -> dict[str, int]:
            dist = {start: 0}
            level = [start]
            while level:
                nxt = []
                for u in level:
                    for v in adj[u]:
                        if v in inside and v not in dist:
                            dist[v] = dist[u] + 1
                            nxt.append(v)
                level = nxt
            return dist

        out = [hops(g, succ) for g in gpus]
        back = [hops(g, pred) for g in gpus]
        vectors = {v: (tuple([d.get(v, -1) for d in out]), tuple([d.get(v, -1) for d in back]))
                   for v in others}
        by_vector = {vec: v for v, vec in vectors.items()}
        if len(by_vector) != len(others):
            return False
        attrs = self._graph.nodes
        for j in range(gpn - 1):
            swap = list(range(gpn))
            swap[j], swap[j + 1] = j + 1, j
            phi = {gpus[i]: gpus[swap[i]] for i in range(gpn)}
            for v, (a, b) in vectors.items():
                w = by_vector.get((tuple([a[swap[i]] for i in range(gpn)]),
                                   tuple([b[swap[i]] for i in range(gpn)])))
                if w is None:
                    return False
                phi[v] = w
            for v in nodes:
                da, db = dict(attrs[v]), dict(attrs[phi[v]])
                da.pop("rank", None)
                db.pop("rank", None)
                if da != db:
                    return False
                for u, d in succ[v].items():
                    pu = phi.get(u, u)
                    if succ[phi[v]].get(pu) != d:
                        return False
                for u, d in pred[v].items():
                    if u not in inside and succ[u].get(phi[v]) != d:
                        return False
                if len(succ[v]) != len(succ[phi[v]]) or len(pred[v]) != len(pred[phi[v]]):
                    return False
        classes = self.host_classes()
        assert classes is not None
        self._vectors[classes[host]] = ([vectors[v] for v in others],
                                        {vec: gpn + i for i, vec in enumerate(
                                            vectors[v] for v in others)})
        return True

    # ------------------------------------------------------------------ links by name

    def link_index(self, link: Link) -> int:
        """Index into ``links`` of the directed link ``(from, to)``; TopologyError if absent."""
        index = self._link_index.get(link)
        if index is None:
            raise TopologyError(self._no_link_message(link))
        return index

    def link_name(self, index: int) -> str:
        """``"from->to"`` of link ``index``, as errors and reports show links."""
        u, v = self.links[index]
        return f"{u}->{v}"

    def _no_link_message(self, link: Link) -> str:
        u, v = link
        if (u, v) in self.failed_links:
            return f"cluster {self.name}: link {u}->{v} has failed"
        near = ", ".join(self._succ[u][:8]) + (" ..." if len(self._succ[u]) > 8 else "")
        return (f"cluster {self.name}: no link [{u!r}, {v!r}]; {u} links to: {near or 'nothing'}")

    def resolve_link(self, spec: Sequence[Endpoint]) -> Link:
        """The link named by ``[a, b]`` (node names as in :mod:`topologies.graphs`, or GPU
        ranks), directed from ``a`` to ``b``.

        Raises TopologyError naming the value if ``spec`` is not two endpoints, an
        endpoint is not a node, or the two nodes are not linked.
        """
        if isinstance(spec, str | bytes) or len(spec) != 2:
            raise TopologyError(f"cluster {self.name}: link {spec!r} must be a pair of node "
                                "names, e.g. ['host0/nic0', 'fabric']")
        u, v = self.node(spec[0]), self.node(spec[1])
        if (u, v) not in self._link_index:
            raise TopologyError(self._no_link_message((u, v)))
        return (u, v)

    def release(self) -> None:
        """Drop what ties this cluster into reference cycles, as its cache lets it go
        (:func:`topologies.build.build_cluster`): the derived values in :attr:`memo` (a
        shared collective timer points back at the cluster, :meth:`sim.commtime.
        CollectiveTimer.shared`) and the graph's cached views that point back at the graph
        (networkx's ``edges`` and ``degree`` views, ``functools.cached_property``).
        Reference counting then frees the cluster once nothing else holds it; only a full
        collection would otherwise, and the engine's pauses (:func:`base.collector.gc_paused`)
        leave those rare, so a process that went through many clusters (``sim validate``'s
        workers) kept every one. Both are rebuilt on use: the cluster stays usable, with the
        same answers (the memo holds pure functions of the cluster)."""
        self.memo.clear()
        for graph in (self._graph, self._networkx):
            if graph is None or isinstance(graph, Graph):
                continue
            for name, value in list(vars(graph).items()):
                if getattr(value, "_graph", None) is graph:
                    del vars(graph)[name]

    def with_link_changes(self, degraded: Mapping[tuple[Endpoint, Endpoint], float] | None = None,
                          failed: Iterable[Sequence[Endpoint]] = (), *,
                          both_directions: bool = True) -> Cluster:
        """A new cluster with some links slower and some links gone; this one is unchanged.

        ``degraded`` maps a link ``(a, b)`` to a factor in (0, 1] (or above 1 for a
        faster link) that multiplies its bandwidth; factors given for the same
        directed link multiply. ``failed`` lists links removed from the graph:
        routes use the remaining shortest paths (ECMP over them, same rule), and
        a route between endpoints that the failures disconnect raises
        TopologyError naming both endpoints and the failed links. A link both
        degraded and failed is failed. Links are ``[a, b]`` pairs of node names
        or GPU ranks (:meth:`resolve_link`); with ``both_directions`` (the
        default: a physical link or cable is both directions) a change applies to
        ``a -> b`` and ``b -> a``, else only to ``a -> b``. Latencies are unchanged.
        """
        factors = self._factors(degraded or {}, both_directions)
        gone: set[Link] = set()
        for spec in failed:
            gone.update(self._directions(spec, both_directions))
        graph = self._graph.copy()
        for link, factor in factors.items():
            if link not in gone:
                graph.edges[link]["bandwidth_Bps"] *= factor
        return self._with_graph(graph, gone)

    def _with_graph(self, graph: nx.DiGraph | Graph, gone: set[Link]) -> Cluster:
        """A cluster like this one on ``graph`` (a changed copy of this one's) with the links
        ``gone`` removed from it and added to :attr:`failed_links`."""
        graph.remove_edges_from(gone)
        return Cluster(self.name, graph, self.gpu, self.gpus_per_node, self.collective_launch_s,
                       collective_step_s=self.collective_step_s,
                       collective_algos=self.collective_algos,
                       collective_granularity=self.collective_granularity,
                       collective_protocol=self.collective_protocol, ecmp=self.ecmp,
                       failed_links=(*self.failed_links, *gone), gpus=self._gpus)

    def subset(self, gpus: Sequence[int]) -> Cluster:
        """The cluster as one job on it sees it: GPUs ``gpus`` (global ranks, in the job's
        rank order) become ranks 0..len-1; every other GPU stays in the graph as a node of
        kind ``other-gpu`` (no rank: it holds none of the job's work, but a topology that
        routes through GPUs, a ring or torus, still does). Links and their bandwidths are
        the same, so routes between the job's GPUs are the shared cluster's."""
        import networkx as nx

        mapping = {gpu_node(g): gpu_node(i) for i, g in enumerate(gpus)}
        graph = self.graph.copy()
        for g in range(self.num_gpus):
            name = gpu_node(g)
            if name not in mapping:
                mapping[name] = f"other-{name}"
                attrs = graph.nodes[name]
                attrs["kind"] = "other-gpu"
                del attrs["rank"]
        graph = nx.relabel_nodes(graph, mapping, copy=True)
        for i in range(len(gpus)):
            graph.nodes[gpu_node(i)]["rank"] = i
        specs = [self.gpu_of(g) for g in gpus]
        return Cluster(self.name, graph, specs[0], self.gpus_per_node, self.collective_launch_s,
                       collective_step_s=self.collective_step_s,
                       collective_algos=self.collective_algos,
                       collective_granularity=self.collective_granularity,
                       collective_protocol=self.collective_protocol, ecmp=self.ecmp,
                       gpus=specs)

    def without_links(self, failed: Iterable[int]) -> Cluster:
        """A new cluster with the directed links ``failed`` (indices into :attr:`links`)
        removed from the graph, as :meth:`with_link_changes` removes failed links (its
        routes avoid them; its links are renumbered). This one is unchanged."""
        return self._with_graph(self._graph.copy(), {self.links[i] for i in failed})

    def rerouted(self, failed: Iterable[int]) -> Rerouted:
        """Routes of this cluster with the directed links ``failed`` (indices) gone, as
        link indices into this cluster's :attr:`links` (:class:`Rerouted`), for a link
        that fails in the middle of a run."""
        return Rerouted(self, failed)

    def degraded_bandwidths(self, degraded: Mapping[tuple[Endpoint, Endpoint], float], *,
                            both_directions: bool = True) -> dict[int, float]:
        """``{link index: new bandwidth_Bps}`` of the links ``degraded`` by factors, as
        :meth:`with_link_changes` would set them, for a change in the middle of a run
        (``link_changes`` of :func:`sim.engine.simulate_program`)."""
        out = {}
        for link, factor in self._factors(degraded, both_directions).items():
            i = self._link_index[link]
            out[i] = self.link_bandwidth_Bps[i] * factor
        return out

    def link_indices(self, spec: Sequence[Endpoint], *, both_directions: bool = True
                     ) -> list[int]:
        """Indices of the directed links named by ``[a, b]`` (:meth:`resolve_link`): ``a ->
        b``, and ``b -> a`` with ``both_directions``, as :meth:`with_link_changes` changes
        them."""
        return [self._link_index[link] for link in self._directions(spec, both_directions)]

    def _factors(self, degraded: Mapping[tuple[Endpoint, Endpoint], float],
                 both_directions: bool) -> dict[Link, float]:
        factors: dict[Link, float] = {}
        for spec, factor in degraded.items():
            if not (isinstance(factor, int | float) and 0 < factor < math.inf):
                raise TopologyError(f"cluster {self.name}: link {list(spec)} degradation factor "
                                    f"{factor!r} must be a number > 0")
            for link in self._directions(spec, both_directions):
                factors[link] = factors.get(link, 1.0) * factor
        return factors

    def _directions(self, spec: Sequence[Endpoint], both: bool) -> list[Link]:
        u, v = self.resolve_link(spec)
        if not both:
            return [(u, v)]
        if (v, u) not in self._link_index:
            raise TopologyError(self._no_link_message((v, u)))
        return [(u, v), (v, u)]

    def _gpu_count(self) -> str:
        if self._gpus is None:
            return f"{self.num_gpus} x {self.gpu.name}"
        return f"{self.num_gpus} GPUs ({self.gpu_summary()})"

    def __repr__(self) -> str:
        return (
            f"Cluster({self.name!r}, {self._gpu_count()}, "
            f"{self._graph.number_of_nodes()} nodes, {len(self.links)} links)"
        )


class Rerouted:
    """Routes of ``base`` without some of its links, expressed in ``base``'s link indices.

    :attr:`cluster` is ``base.without_links(failed)`` (its own, renumbered links);
    :meth:`route` is that cluster's route (same shortest-path / ECMP rule as
    :meth:`Cluster.route`, TopologyError naming the pair and the failed links where
    they partition the network), each link mapped back to its index in ``base`` by
    its end nodes. A flow network indexed by ``base``'s links can thus move flows
    onto the new routes; the failed links are simply never used again.
    """

    def __init__(self, base: Cluster, failed: Iterable[int]) -> None:
        self.failed: frozenset[int] = frozenset(failed)
        self.cluster = base.without_links(self.failed)
        index = base._link_index
        self._to_base = tuple([index[link] for link in self.cluster.links])
        self._routes: dict[tuple[Endpoint, Endpoint], Route] = {}

    def route(self, src: Endpoint, dst: Endpoint) -> Route:
        """The route from ``src`` to ``dst`` avoiding the failed links, in ``base``'s
        link indices (same latency: latencies are per link)."""
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is None:
            route = self.cluster.route(src, dst)
            to_base = self._to_base
            cached = self._routes[key] = Route(tuple([to_base[i] for i in route.links]),
                                               route.latency_s)
        return cached
