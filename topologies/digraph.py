"""The directed graph a cluster description is built into, and its networkx twin.

:func:`topologies.build.build_cluster` (every experiment file's cluster) builds its graph
as a :class:`Graph`: networkx's adjacency layout (a node dict of attribute dicts, successor
and predecessor dicts of dicts sharing each edge's attribute dict, in insertion order),
with only the part of :class:`networkx.DiGraph`'s interface that the generators of
:mod:`topologies.graphs` and :class:`topologies.cluster.Cluster` use. So a run reads its
cluster without importing networkx (~0.1 s of CPU, a tenth of a Megatron 1T ``sim run``);
:attr:`topologies.cluster.Cluster.graph` is still a :class:`networkx.DiGraph`, made on
first use by :func:`as_networkx` over the very same dicts (no copy: the same nodes,
edges, attributes and orders, so networkx's algorithms see the graph the cluster routes
on). Generators called outside :func:`building` return networkx graphs, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from base.errors import TopologyError

if TYPE_CHECKING:
    import networkx as nx

_LITE: ContextVar[bool] = ContextVar("topologies.digraph.lite", default=False)
"""Whether :func:`new_graph` makes a :class:`Graph` (inside :func:`building`)."""


@contextmanager
def building() -> Iterator[None]:
    """Within it, :func:`new_graph` (every generator of :mod:`topologies.graphs`) makes a
    :class:`Graph` instead of a :class:`networkx.DiGraph`."""
    token = _LITE.set(True)
    try:
        yield
    finally:
        _LITE.reset(token)


def new_graph(name: str) -> Any:
    """An empty directed graph named ``name``: a :class:`Graph` inside :func:`building`,
    else a :class:`networkx.DiGraph`."""
    if _LITE.get():
        return Graph(name=name)
    import networkx as nx

    return nx.DiGraph(name=name)


class _Nodes:
    """``graph.nodes``: ``nodes[v]`` is ``v``'s attribute dict, ``nodes(data=True)`` its
    (node, attributes) pairs, iteration the node names (networkx's ``NodeView``)."""

    __slots__ = ("_node",)

    def __init__(self, node: dict[Any, dict]) -> None:
        self._node = node

    def __getitem__(self, v: Any) -> dict:
        return self._node[v]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, v: object) -> bool:
        return v in self._node

    def __call__(self, data: bool = False) -> Iterable[Any]:
        return self._node.items() if data else self._node.keys()


class _Edges:
    """``graph.edges``: ``edges[u, v]`` is the edge's attribute dict, ``edges(data=True)``
    its (u, v, attributes) triples in networkx's order (by source, then insertion)."""

    __slots__ = ("_succ",)

    def __init__(self, succ: dict[Any, dict[Any, dict]]) -> None:
        self._succ = succ

    def __getitem__(self, edge: tuple[Any, Any]) -> dict:
        u, v = edge
        return self._succ[u][v]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return ((u, v) for u, nbrs in self._succ.items() for v in nbrs)

    def __len__(self) -> int:
        return sum(map(len, self._succ.values()))

    def __call__(self, data: bool = False) -> Iterable[tuple]:
        if data:
            return [(u, v, d) for u, nbrs in self._succ.items() for v, d in nbrs.items()]
        return list(self)


class Graph:
    """A directed graph in networkx's layout (module docstring). Nodes and edges are added
    as :class:`networkx.DiGraph` adds them (an edge's missing ends become nodes without
    attributes; a node or edge added again has its attributes updated). :meth:`freeze`
    makes every later change a :class:`~base.errors.TopologyError`."""

    __slots__ = ("graph", "_node", "_succ", "_pred", "frozen", "_nodes")

    def __init__(self, **attr: object) -> None:
        self.graph: dict[str, object] = dict(attr)
        self._node: dict[Any, dict] = {}
        self._succ: dict[Any, dict[Any, dict]] = {}
        self._pred: dict[Any, dict[Any, dict]] = {}
        self.frozen = False
        self._nodes = _Nodes(self._node)

    # ------------------------------------------------------------------ changes

    def _check(self) -> None:
        if self.frozen:
            raise TopologyError("a frozen cluster graph cannot be changed")

    def add_node(self, v: Any, **attr: object) -> None:
        self._check()
        node = self._node.get(v)
        if node is None:
            if v is None:
                raise ValueError("None cannot be a node")
            self._succ[v] = {}
            self._pred[v] = {}
            self._node[v] = attr
        else:
            node.update(attr)

    def add_nodes(self, nodes: Iterable[tuple[Any, dict[str, object]]]) -> None:
        """:meth:`add_node` of each ``(v, attr)`` in turn (``attr`` the node's own dict when
        it is new), in one call."""
        self._check()
        node, succ, pred = self._node, self._succ, self._pred
        for v, attr in nodes:
            known = node.get(v)
            if known is None:
                if v is None:
                    raise ValueError("None cannot be a node")
                succ[v] = {}
                pred[v] = {}
                node[v] = attr
            else:
                known.update(attr)

    def add_edge(self, u: Any, v: Any, **attr: object) -> None:
        self._check()
        succ = self._succ
        for w in (u, v):
            if w not in succ:
                if w is None:
                    raise ValueError("None cannot be a node")
                succ[w] = {}
                self._pred[w] = {}
                self._node[w] = {}
        out = succ[u]
        data = out.get(v)
        if data is None:
            out[v] = self._pred[v][u] = attr
        else:
            data.update(attr)

    def add_link(self, u: Any, v: Any, attr: dict[str, object]) -> None:
        """``add_edge(u, v, **attr)`` then ``add_edge(v, u, **attr)``, each edge with a copy
        of ``attr`` of its own (a physical link's two directions, :mod:`topologies.graphs`)."""
        self.add_links(((u, v, attr),))

    def add_links(self, links: Iterable[tuple[Any, Any, dict[str, object]]]) -> None:
        """:meth:`add_link` of each ``(u, v, attr)`` in turn, in one call (a generator's
        many links: Megatron 1T's 9,216 cost about half as much again one call each)."""
        self._check()
        succ, pred, node = self._succ, self._pred, self._node
        for u, v, attr in links:
            if u not in succ or v not in succ:
                for w in (u, v):
                    if w not in succ:
                        if w is None:
                            raise ValueError("None cannot be a node")
                        succ[w] = {}
                        pred[w] = {}
                        node[w] = {}
            for a, b in ((u, v), (v, u)):
                out = succ[a]
                data = out.get(b)
                if data is None:
                    out[b] = pred[b][a] = attr.copy()
                else:
                    data.update(attr)

    def remove_edges_from(self, edges: Iterable[tuple[Any, Any]]) -> None:
        self._check()
        for u, v, *_ in edges:
            if u in self._succ and v in self._succ[u]:
                del self._succ[u][v]
                del self._pred[v][u]

    def freeze(self) -> Graph:
        """No changes from now on (networkx's ``freeze``); returns the graph."""
        self.frozen = True
        return self

    def copy(self) -> Graph:
        """An unfrozen copy with its own attribute dicts (networkx's ``copy``)."""
        g = Graph(**self.graph)
        g._node.update((v, dict(d)) for v, d in self._node.items())
        g._succ = {v: {} for v in self._node}
        g._pred = {v: {} for v in self._node}
        for u, nbrs in self._succ.items():  # (networkx's order: each edge as its source's)
            out = g._succ[u]
            for v, d in nbrs.items():
                out[v] = g._pred[v][u] = dict(d)
        return g

    # ------------------------------------------------------------------ reading

    @property
    def nodes(self) -> _Nodes:
        return self._nodes

    @property
    def edges(self) -> _Edges:
        return _Edges(self._succ)

    @property
    def succ(self) -> dict[Any, dict[Any, dict]]:
        return self._succ

    @property
    def pred(self) -> dict[Any, dict[Any, dict]]:
        return self._pred

    def adjacency(self) -> Iterator[tuple[Any, dict[Any, dict]]]:
        return iter(self._succ.items())

    def successors(self, v: Any) -> Iterator[Any]:
        return iter(self._succ[v])

    def predecessors(self, v: Any) -> Iterator[Any]:
        return iter(self._pred[v])

    def has_edge(self, u: Any, v: Any) -> bool:
        return u in self._succ and v in self._succ[u]

    def number_of_nodes(self) -> int:
        return len(self._node)

    def __contains__(self, v: object) -> bool:
        try:
            return v in self._node
        except TypeError:
            return False

    def __iter__(self) -> Iterator[Any]:
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)


def as_networkx(graph: Any) -> nx.DiGraph:
    """``graph`` as a :class:`networkx.DiGraph`: a networkx graph as it is; a :class:`Graph`
    wrapped over its own dicts (nodes, edges and attributes shared, not copied: the same
    orders), frozen (:func:`networkx.freeze`) where it is."""
    if not isinstance(graph, Graph):
        return graph
    import networkx as nx

    g = nx.DiGraph()
    g.graph = graph.graph
    g._node = graph._node
    g._adj = graph._succ  # (networkx's descriptor sets _succ with it)
    g._pred = graph._pred
    if graph.frozen:
        nx.freeze(g)
    return g
