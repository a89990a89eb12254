"""The cluster graph (:mod:`topologies.digraph`) against networkx's DiGraph, whose interface
it offers: random sequences of the same changes give the same nodes, edges, attributes and
orders, and the same copies and relabelled copies."""

from __future__ import annotations

from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies.digraph import DiGraph

NODES = st.sampled_from(["a", "b", "c", "d", "e", 0, 1])
ATTRS = st.dictionaries(st.sampled_from(["kind", "bandwidth_Bps", "host"]),
                        st.integers(0, 3), max_size=2)
CHANGES = st.lists(st.one_of(
    st.tuples(st.just("node"), NODES, ATTRS),
    st.tuples(st.just("edge"), st.tuples(NODES, NODES), ATTRS),
    st.tuples(st.just("remove"), st.lists(st.tuples(NODES, NODES), max_size=3), st.just({}))),
    max_size=30)


def _apply(g: Any, changes: list) -> None:
    for what, arg, attrs in changes:
        if what == "node":
            g.add_node(arg, **attrs)
        elif what == "edge":
            g.add_edge(*arg, **attrs)
        else:
            g.remove_edges_from(arg)


def _seen(g: Any) -> tuple:
    """Everything the simulator reads of a graph, in the orders it reads it."""
    return (dict(g.graph), list(g.nodes(data=True)), list(g.nodes), list(g.edges()),
            list(g.edges(data=True)), {v: list(g.successors(v)) for v in g},
            {v: list(g.predecessors(v)) for v in g}, {v: g.out_degree(v) for v in g},
            g.number_of_nodes(), g.number_of_edges(), len(g),
            [g.has_edge(u, v) for u in g for v in g], [g.edges[e] for e in g.edges])


@settings(max_examples=200, deadline=None)
@given(CHANGES, st.dictionaries(NODES, st.sampled_from(["x", "y", 5]), max_size=3))
def test_the_same_changes_give_what_networkx_gives(changes: list, mapping: dict) -> None:
    ours, theirs = DiGraph(name="g"), nx.DiGraph(name="g")
    _apply(ours, changes)
    _apply(theirs, changes)
    assert _seen(ours) == _seen(theirs)
    assert _seen(ours.copy()) == _seen(theirs.copy())
    if len(set(mapping.values())) == len(mapping) and not set(mapping.values()) & set(ours):
        assert _seen(ours.relabeled(mapping)) == _seen(nx.relabel_nodes(theirs, mapping))
    # both directions of lookup share an edge's attributes
    for u, v in ours.edges:
        ours.edges[u, v]["seen"] = 1
        assert ours._pred[v][u]["seen"] == 1


def test_a_copy_is_its_own() -> None:
    g = DiGraph()
    g.add_edge("a", "b", bandwidth_Bps=1.0)
    h = g.copy()
    h.edges["a", "b"]["bandwidth_Bps"] = 2.0
    h.nodes["a"]["kind"] = "gpu"
    h.add_edge("b", "c")
    assert g.edges["a", "b"] == {"bandwidth_Bps": 1.0} and g.nodes["a"] == {}
    assert list(g.edges) == [("a", "b")]


def test_a_frozen_graph_keeps_its_structure() -> None:
    g = DiGraph()
    g.add_edge("a", "b")
    g.freeze()
    for change in (lambda: g.add_node("c"), lambda: g.add_edge("b", "a"),
                   lambda: g.remove_edge("a", "b"), lambda: g.remove_edges_from([("a", "b")])):
        with pytest.raises(TypeError, match="frozen"):
            change()
    g.nodes["a"]["kind"] = "gpu"  # attributes stay writable, as networkx's freeze leaves them
    assert list(g.edges) == [("a", "b")] and not g.copy().frozen
