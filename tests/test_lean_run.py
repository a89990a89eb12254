"""A lean single run (issue 22): what ``sim run --json`` leaves unimported, and the cluster
graph it builds without networkx (:mod:`topologies.digraph`) against the networkx graph the
same generators build."""

from __future__ import annotations

import subprocess
import sys

import networkx as nx
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import parse_config, read_yaml
from topologies.build import _built_graphs, build_cluster
from topologies.cluster import Cluster
from topologies.digraph import Graph, as_networkx, building

NOT_IMPORTED = ("networkx", "matplotlib", "scipy", "plots", "sim.search", "sim.export",
                "sim.jobs", "sim.faults_run", "sim.swarm", "sim.cli.figures", "difflib")
"""Modules a step's ``sim run FILE --json`` does not need, and does not import."""


def test_a_json_run_imports_none_of_what_it_does_not_need() -> None:
    code = ("import contextlib, io, sys\n"
            "from sim.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main(['run', {str(ROOT / 'workloads/examples/gpt-1.3b-pp4.yaml')!r},"
            " '--json', '--fidelity', 'collapsed'])\n"
            f"print(rc, ','.join(m for m in {NOT_IMPORTED!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.split()
    assert out == ["0"], f"sim run --json imported {out[1:]}"


def _same_graph(lite: nx.DiGraph, ref: nx.DiGraph) -> None:
    """Equal nodes, edges and attributes, in the same orders (nodes, successors,
    predecessors), and the same graph attributes."""
    assert lite.graph == ref.graph
    assert list(lite.nodes(data=True)) == list(ref.nodes(data=True))
    assert list(lite.edges(data=True)) == list(ref.edges(data=True))
    for v in ref:
        assert list(lite.succ[v]) == list(ref.succ[v])
        assert list(lite.pred[v]) == list(ref.pred[v])


def _same_cluster(a: Cluster, b: Cluster) -> None:
    assert a.links == b.links
    assert a.link_bandwidth_Bps == b.link_bandwidth_Bps
    assert a.link_latency_s == b.link_latency_s
    assert a.host_classes() == b.host_classes()
    last = a.num_gpus - 1
    assert a.route(0, last) == b.route(0, last)


CLUSTERS = [
    {"preset": "dgx-a100-80g", "num_gpus": 64},
    {"preset": "dgx-h100", "num_gpus": 32, "topology": "fat-tree", "gpus_per_leaf": 8},
    {"preset": "dgx-a100-80g", "num_gpus": 32, "topology": "rail-optimized",
     "gpus_per_leaf": 2},
    {"preset": "dgx-a100-80g", "num_gpus": 32, "nics_per_node": 4},
    {"preset": "dgx-a100-80g", "num_gpus": 32, "sites": 2, "wan_bandwidth_Mbps": 10000,
     "wan_latency_ms": 20},
    {"preset": "ideal", "num_gpus": 8},
    {"topology": "torus2d", "dims": [2, 4], "num_gpus": 8, "link_bandwidth_GBps": 100.0},
    {"topology": "ring", "num_gpus": 6, "link_bandwidth_GBps": 50.0},
    {"topology": "full-mesh", "num_gpus": 5, "link_bandwidth_GBps": 50.0},
    {"topology": "dragonfly", "num_gpus": 32, "link_bandwidth_GBps": 25.0,
     "dragonfly": {"routers_per_group": 2, "gpus_per_router": 4,
                   "global_links_per_router": 2}},
    {"topology": "switch", "num_gpus": 16, "gpus_per_node": 8, "link_bandwidth_GBps": 25.0},
]


def _experiment(cluster: dict) -> dict:
    return {"model": {"preset": "gpt3-1.3b"}, "cluster": cluster}


@pytest.mark.parametrize("path", sorted((ROOT / "workloads" / "examples").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_example_cluster_graph_equals_the_networkx_one(path) -> None:
    data = read_yaml(path)
    if "cluster" not in data or "model" not in data:  # a jobs file
        pytest.skip("no single cluster")
    cfg = parse_config(data).cluster
    with building():
        lite = _built_graphs(cfg)
    ref = _built_graphs(cfg)  # outside building(): the generators' networkx graphs
    assert isinstance(lite._graph, Graph) and not isinstance(ref._graph, Graph)
    _same_graph(lite.graph, ref.graph)
    _same_cluster(lite, ref)


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: c.get("topology", c.get("preset")))
def test_each_topology_graph_equals_the_networkx_one(cluster: dict) -> None:
    cfg = parse_config(_experiment(cluster)).cluster
    with building():
        lite = _built_graphs(cfg)
    ref = _built_graphs(cfg)
    assert isinstance(ref.graph, nx.DiGraph)
    _same_graph(lite.graph, ref.graph)
    _same_cluster(lite, ref)
    # changed clusters: a copy, degraded and failed links, a subset
    link = (0, lite.nvswitch_of(0)) if lite.nvswitch_of(0) else list(lite.links[0])
    _same_cluster(lite.with_link_changes({tuple(link): 0.5}),
                  ref.with_link_changes({tuple(link): 0.5}))
    _same_graph(lite.with_link_changes({tuple(link): 0.5}).graph,
                ref.with_link_changes({tuple(link): 0.5}).graph)
    half = list(range(lite.num_gpus // 2))
    _same_graph(lite.subset(half).graph, ref.subset(half).graph)


def test_the_built_graph_is_networkx_frozen_and_the_same_dicts() -> None:
    cfg = parse_config(_experiment({"preset": "dgx-a100-80g", "num_gpus": 16})).cluster
    cluster = build_cluster(cfg)
    g = cluster.graph
    assert isinstance(g, nx.DiGraph) and nx.is_frozen(g)
    assert cluster.graph is g  # made once
    with pytest.raises(nx.NetworkXError):
        g.add_edge("x", "y")
    assert g.nodes["gpu0"] is cluster.node_attrs["gpu0"]  # shared, not copied
    assert nx.shortest_path_length(g, "gpu0", "gpu15") == len(cluster.path(0, 15)) - 1
    lite = cluster._graph
    assert isinstance(lite, Graph)
    with pytest.raises(Exception, match="frozen"):
        lite.add_node("x")


def test_graph_follows_networkx_on_changes() -> None:
    """Adding a node or edge again updates its attributes; an edge adds its missing ends;
    removal and copies keep networkx's orders."""
    steps = [("add_node", ("a",), {"kind": "gpu"}), ("add_edge", ("b", "a"), {"w": 1}),
             ("add_edge", ("a", "c"), {"w": 2}), ("add_node", ("a",), {"rank": 0}),
             ("add_edge", ("b", "a"), {"w": 3, "x": 1}), ("add_edge", ("c", "b"), {}),
             ("add_edge", ("c", "a"), {"w": 4})]
    with building():
        lite = Graph(name="t")
    ref = nx.DiGraph(name="t")
    for method, args, attrs in steps:
        getattr(lite, method)(*args, **attrs)
        getattr(ref, method)(*args, **attrs)
    _same_graph(as_networkx(lite), ref)
    _same_graph(as_networkx(lite.copy()), ref.copy())
    lite.remove_edges_from([("b", "a"), ("x", "y")])
    ref.remove_edges_from([("b", "a"), ("x", "y")])
    _same_graph(as_networkx(lite), ref)
    assert lite.has_edge("a", "c") and not lite.has_edge("b", "a") and "x" not in lite


def test_graph_adds_many_nodes_and_links_as_one_call_each() -> None:
    """``add_nodes`` and ``add_links`` (a generator's many nodes and links in one call) give
    the graph of ``add_node``, ``add_edge`` and ``add_link`` called in turn: attributes
    updated on a re-added node or link, missing ends made, each edge its own dict."""
    nodes = [("a", {"kind": "gpu"}), ("b", {}), ("a", {"rank": 0}), ("c", {"kind": "nic"})]
    template = {"w": 1}
    links = [("a", "b", template), ("b", "c", {"w": 2}), ("a", "b", {"w": 3, "x": 1}),
             ("d", "a", template), ("c", "c", {"w": 4}), ("e", "f", template)]
    with building():
        lite = Graph(name="t")
        one = Graph(name="t")
    lite.add_nodes([(v, dict(attr)) for v, attr in nodes])
    lite.add_links(links)
    ref = nx.DiGraph(name="t")
    for v, attr in nodes:
        one.add_node(v, **attr)
        ref.add_node(v, **attr)
    for u, v, attr in links:
        one.add_link(u, v, attr)
        ref.add_edge(u, v, **attr)
        ref.add_edge(v, u, **attr)
    _same_graph(as_networkx(lite), ref)
    _same_graph(as_networkx(lite), as_networkx(one))
    assert template == {"w": 1}
    assert lite.succ["a"]["d"] is not lite.succ["d"]["a"] and lite.succ["a"]["d"] is not template
    lite.freeze()
    with pytest.raises(Exception, match="frozen"):
        lite.add_links([("a", "b", template)])
    with pytest.raises(Exception, match="frozen"):
        lite.add_nodes([("z", {})])


@pytest.mark.parametrize("cluster", CLUSTERS[:5], ids=lambda c: c.get("topology", c.get("preset")))
def test_links_by_their_ends_number_the_sorted_links(cluster: dict) -> None:
    """The index of the links by their ends (made on first use) and by source, then head,
    both number :attr:`Cluster.links` in order, also on a changed cluster."""
    built = build_cluster(parse_config(_experiment(cluster)).cluster)
    for c in (built, built.with_link_changes({tuple(built.links[0]): 0.5})):
        assert list(c._link_index.items()) == [(link, i) for i, link in enumerate(c.links)]
        assert [(u, v, i) for u, heads in c._link_from.items() for v, i in heads.items()] == [
            (u, v, i) for i, (u, v) in enumerate(c.links)]


def _classes_both_ways(make) -> None:  # noqa: ANN001 - a function making a fresh cluster
    """:meth:`Cluster._compute_host_classes` (numbered signatures) and the reference (the
    signatures' items themselves) on two fresh copies: the same classes, server nodes and
    places."""
    a, b = make(), make()
    assert a._compute_host_classes() == b._host_classes_reference()
    assert a._server_nodes == b._server_nodes and a._place == b._place


@pytest.mark.parametrize("path", sorted((ROOT / "workloads" / "examples").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_host_classes_by_numbers_are_the_reference_for_every_example(path) -> None:
    data = read_yaml(path)
    if "cluster" not in data or "model" not in data:  # a jobs file
        pytest.skip("no single cluster")
    cfg = parse_config(data).cluster
    _classes_both_ways(lambda: _built_graphs(cfg))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(which=st.integers(0, len(CLUSTERS) - 1), seed=st.integers(0, 2**16),
       changes=st.integers(0, 12), attrs=st.integers(0, 6))
def test_host_classes_by_numbers_are_the_reference(which: int, seed: int, changes: int,
                                                   attrs: int) -> None:
    """On every topology above, with a few links degraded by one of two factors (twins
    broken, or made again where two servers get the same change) and a few server nodes
    given an attribute (of two values) or one changed: the classes, server nodes and places
    of the reference."""
    import random

    rng = random.Random(seed)
    cfg = parse_config(_experiment(CLUSTERS[which])).cluster
    base = _built_graphs(cfg)
    links = rng.sample(list(base.links), min(changes, len(base.links)))
    degraded = {link: rng.choice((0.5, 0.25)) for link in links}
    changed = base.with_link_changes(degraded, both_directions=False) if degraded else base
    graph = nx.DiGraph(changed.graph)  # a thawed copy whose node attributes may change
    servers = [v for v, d in graph.nodes(data=True) if d.get("host") is not None]
    for v in rng.sample(servers, min(attrs, len(servers))):
        graph.nodes[v][rng.choice(("tag", "kind"))] = rng.choice(("x", "y"))
    gpus = {d["rank"] for _, d in graph.nodes(data=True) if d.get("kind") == "gpu"}
    if gpus != set(range(base.num_gpus)):  # a GPU renamed to another kind: no cluster
        return
    _classes_both_ways(lambda: Cluster(base.name, graph, base.gpu, base.gpus_per_node))
