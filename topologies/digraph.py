"""The cluster graph: a directed graph whose nodes and edges carry attribute dicts.

It offers the part of :class:`networkx.DiGraph`'s interface that the simulator uses,
with the same meaning and iteration orders (nodes in insertion order, each node's
out-edges in insertion order; an edge's attribute dict shared by both directions of
lookup), so that a networkx graph can stand in for it (tests build some by hand, and
check routes against networkx's algorithms on a copy). It is our own so that a run
does not import networkx: its import was ~0.1 s of every ``sim run`` (issue 22), where
building and reading a cluster's graph needs only dicts.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Set
from typing import Any

Node = Hashable
Attrs = dict[str, Any]


class NodeView(Mapping[Node, Attrs]):
    """``graph.nodes``: node -> attribute dict; ``graph.nodes(data=True)`` iterates
    ``(node, attrs)``."""

    __slots__ = ("_node",)

    def __init__(self, node: dict[Node, Attrs]) -> None:
        self._node = node

    def __getitem__(self, n: Node) -> Attrs:
        return self._node[n]

    def __iter__(self) -> Iterator[Node]:
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, n: object) -> bool:
        return n in self._node

    def __call__(self, data: bool = False) -> Iterable[Any]:
        return self._node.items() if data else self._node


class EdgeView(Set[tuple[Node, Node]]):
    """``graph.edges``: the set of edges ``(u, v)`` (equal to another graph's when they have
    the same edges), each mapped to its attribute dict (``graph.edges[u, v]``);
    ``graph.edges()`` iterates ``(u, v)`` and ``graph.edges(data=True)`` ``(u, v, attrs)``,
    node by node in insertion order."""

    __slots__ = ("_succ",)

    def __init__(self, succ: dict[Node, dict[Node, Attrs]]) -> None:
        self._succ = succ

    def __getitem__(self, edge: tuple[Node, Node]) -> Attrs:
        u, v = edge
        return self._succ[u][v]

    def __iter__(self) -> Iterator[tuple[Node, Node]]:
        return ((u, v) for u, out in self._succ.items() for v in out)

    def __contains__(self, edge: object) -> bool:
        try:
            u, v = edge  # type: ignore[misc]
            return v in self._succ[u]
        except (KeyError, TypeError, ValueError):
            return False

    def __len__(self) -> int:
        return sum(len(out) for out in self._succ.values())

    def __call__(self, data: bool = False) -> Iterator[tuple[Any, ...]]:
        if data:
            return ((u, v, d) for u, out in self._succ.items() for v, d in out.items())
        return iter(self)


class DiGraph:
    """A directed graph with attribute dicts on its nodes and edges and on itself
    (:attr:`graph`, e.g. its ``name``). :meth:`freeze` makes its structure read-only
    (its attribute dicts stay writable, as networkx's ``freeze`` leaves them)."""

    def __init__(self, name: str | None = None) -> None:
        self.graph: Attrs = {} if name is None else {"name": name}
        self._node: dict[Node, Attrs] = {}
        self._succ: dict[Node, dict[Node, Attrs]] = {}
        self._pred: dict[Node, dict[Node, Attrs]] = {}
        self.nodes = NodeView(self._node)
        self.edges = EdgeView(self._succ)
        self.frozen = False

    def _check_mutable(self) -> None:
        if self.frozen:
            raise TypeError("the graph is frozen (shared by every user of its cluster); "
                            "change a copy()")

    def add_node(self, n: Node, **attrs: Any) -> None:
        """Add node ``n`` (if new) and update its attributes with ``attrs``."""
        self._check_mutable()
        if n in self._node:
            self._node[n].update(attrs)
        else:
            self._succ[n] = {}
            self._pred[n] = {}
            self._node[n] = attrs

    def add_edge(self, u: Node, v: Node, **attrs: Any) -> None:
        """Add the edge ``u -> v`` (and its nodes, if new) and update its attributes."""
        self._check_mutable()
        for n in (u, v):
            if n not in self._node:
                self._succ[n] = {}
                self._pred[n] = {}
                self._node[n] = {}
        data = self._succ[u].get(v)
        if data is None:
            data = self._succ[u][v] = self._pred[v][u] = {}
        data.update(attrs)

    def remove_edge(self, u: Node, v: Node) -> None:
        """Remove the edge ``u -> v`` (a KeyError if there is none)."""
        self._check_mutable()
        del self._succ[u][v]
        del self._pred[v][u]

    def remove_edges_from(self, edges: Iterable[tuple[Node, Node]]) -> None:
        """Remove each edge ``(u, v)`` of ``edges`` that the graph has."""
        self._check_mutable()
        for u, v in edges:
            if self.has_edge(u, v):
                self.remove_edge(u, v)

    def has_edge(self, u: Node, v: Node) -> bool:
        """Whether the edge ``u -> v`` exists."""
        out = self._succ.get(u)
        return out is not None and v in out

    def successors(self, n: Node) -> Iterator[Node]:
        """The heads of ``n``'s out-edges, in insertion order."""
        return iter(self._succ[n])

    def predecessors(self, n: Node) -> Iterator[Node]:
        """The tails of ``n``'s in-edges, in insertion order."""
        return iter(self._pred[n])

    def out_degree(self, n: Node) -> int:
        """The number of ``n``'s out-edges."""
        return len(self._succ[n])

    def number_of_nodes(self) -> int:
        """The number of nodes."""
        return len(self._node)

    def number_of_edges(self) -> int:
        """The number of edges."""
        return len(self.edges)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._node)

    def __contains__(self, n: object) -> bool:
        return n in self._node

    def __len__(self) -> int:
        return len(self._node)

    def freeze(self) -> None:
        """Make the structure read-only: adding or removing nodes or edges is a TypeError."""
        self.frozen = True

    def copy(self) -> DiGraph:
        """A mutable copy: the same nodes and edges in the same order, each attribute dict
        copied (one level deep)."""
        return self.relabeled({})

    def relabeled(self, mapping: Mapping[Node, Node]) -> DiGraph:
        """A mutable copy with node ``n`` named ``mapping.get(n, n)`` (in the same order, as
        ``networkx.relabel_nodes(graph, mapping, copy=True)`` orders them)."""
        get = mapping.get
        g = DiGraph()
        g.graph.update(self.graph)
        for n, attrs in self._node.items():
            g.add_node(get(n, n), **attrs)
        for u, out in self._succ.items():
            for v, attrs in out.items():
                g.add_edge(get(u, u), get(v, v), **attrs)
        return g
