"""The router against a reference (networkx's all shortest paths with the same ECMP rule),
and the collapsed timer's shortcut for replicated groups against the full flow simulation.

:class:`topologies.cluster.Cluster` computes distances lazily (bidirectional
searches over cached balls) and never enumerates the ports of a big switch;
these tests check that it still picks exactly the path the definition gives,
on small instances of every generator of :mod:`topologies.graphs`, with both
ECMP policies, between GPUs and between arbitrary nodes.
"""

from __future__ import annotations

import math
import zlib

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import TopologyError
from sim.commtime import _are_disjoint_replicas, replicas_makespan_s
from sim.network import makespan_s
from topologies import graphs
from topologies.cluster import Cluster, _Router
from topologies.graphs import Fabric, gpu_node
from topologies.hardware import GPUS
from topologies.presets import server_graph

H100 = GPUS["H100"]


def reference_path(g: nx.DiGraph, src: int | str, dst: int | str, ecmp: str) -> list[str]:
    """The definition: among all shortest paths, at each node take the sorted next hops and
    pick one by the ECMP key (mixed-radix digits, hop by hop)."""
    s = gpu_node(src) if isinstance(src, int) else src
    d = gpu_node(dst) if isinstance(dst, int) else dst
    paths = list(nx.all_shortest_paths(g, s, d))
    if ecmp == "dst-mod-k":
        key = dst if isinstance(dst, int) else zlib.crc32(f"{dst}".encode())
    else:
        key = zlib.crc32(f"{src}>{dst}".encode())
    prefix = [s]
    while prefix[-1] != d:
        i = len(prefix)
        nxt = sorted({p[i] for p in paths if p[:i] == prefix})
        key, k = divmod(key, len(nxt))
        prefix.append(nxt[k])
    return prefix


def _sites() -> nx.DiGraph:
    return graphs.multi_site([graphs.fat_tree(16, 1e9, 0.0, gpus_per_leaf=4),
                              graphs.switch(6, 1e9, 0.0)], 1e8, 1e-3)


TOPOLOGIES = {
    "switch": lambda: graphs.switch(9, 1e9, 1e-6),
    "ring-odd": lambda: graphs.ring(11, 1e9, 1e-6),
    "ring-even": lambda: graphs.ring(12, 1e9, 1e-6),
    "full-mesh": lambda: graphs.full_mesh(6, 1e9, 1e-6),
    "torus": lambda: graphs.torus((4, 3, 2), 1e9, 1e-6),
    "fat-tree-2": lambda: graphs.fat_tree(48, 1e9, 1e-6, gpus_per_leaf=8,
                                          oversubscription=2.0),
    "fat-tree-3": lambda: graphs.fat_tree(64, 1e9, 1e-6, gpus_per_leaf=4, tiers=3,
                                          leaves_per_pod=2),
    "dragonfly": lambda: graphs.dragonfly(48, 1e9, 1e-6, routers_per_group=4,
                                          gpus_per_router=2, global_links_per_router=2),
    "dgx-crossbar": lambda: server_graph("dgx-h100", 32),
    "dgx-rail": lambda: server_graph("dgx-h100", 64, Fabric("rail-optimized", gpus_per_leaf=4)),
    "dgx-fat-tree-3": lambda: server_graph("dgx-a100-80g", 64,
                                           Fabric("fat-tree", gpus_per_leaf=8, tiers=3,
                                                  leaves_per_pod=2)),
    "dgx-dragonfly": lambda: server_graph("dgx-h100", 64, Fabric(
        "dragonfly", routers_per_group=4, gpus_per_router=4, global_links_per_router=2)),
    "multi-site": _sites,
}


@pytest.mark.parametrize("ecmp", ["dst-mod-k", "hash"])
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_gpu_routes_match_the_reference(topology: str, ecmp: str) -> None:
    g = TOPOLOGIES[topology]()
    c = Cluster(topology, g, H100, 1, ecmp=ecmp)
    n = c.num_gpus
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    step = max(1, len(pairs) // 400)
    for s, d in pairs[::step]:
        path = c.path(s, d)
        assert path == reference_path(g, s, d, ecmp), (s, d)
        route = c.route(s, d)
        assert [c.links[i] for i in route.links] == list(zip(path, path[1:], strict=False))
        assert route.latency_s == pytest.approx(
            sum(g.edges[u, v]["latency_s"] for u, v in zip(path, path[1:], strict=False)))


@pytest.mark.parametrize("topology", ["dgx-crossbar", "fat-tree-3", "dgx-rail", "multi-site"])
def test_node_routes_match_the_reference(topology: str) -> None:
    """Routes between switches, NICs and NVSwitches (in-network reduction endpoints)."""
    g = TOPOLOGIES[topology]()
    c = Cluster(topology, g, H100, 1)
    nodes = sorted(g.nodes)
    for s in nodes[::5]:
        for d in nodes[::3]:
            if s != d:
                assert c.path(s, d) == reference_path(g, s, d, "dst-mod-k"), (s, d)


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_router_distances_are_exact(topology: str) -> None:
    """Every pairwise hop distance, including early stops at a limit."""
    g = TOPOLOGIES[topology]()
    succ = {v: sorted(g.successors(v)) for v in g}
    pred = {v: sorted(g.predecessors(v)) for v in g}
    router = _Router(succ, pred)
    nodes = sorted(g.nodes)[::2]
    for s in nodes:
        truth = nx.single_source_shortest_path_length(g, s)
        for d in nodes:
            assert router.distance(s, d) == truth[d]
            assert router.distance(s, d, truth[d] - 1) == float("inf")


def test_unreachable_pair_is_a_topology_error() -> None:
    g = graphs.switch(4, 1e9, 0.0)
    g.add_node(gpu_node(4), kind="gpu", rank=4, host=4)
    c = Cluster("island", g, H100, 1)
    with pytest.raises(TopologyError, match="no path from gpu0 to gpu4"):
        c.route(0, 4)


def test_large_crossbar_routes_without_enumerating_the_switch() -> None:
    """16,384 GPUs: a ring of routes through a 16,384-port crossbar stays cheap."""
    c = Cluster("big", server_graph("dgx-h100", 16384), H100, 8)
    for s in range(0, 16384, 8):
        assert len(c.route(s, (s + 8) % 16384).links) == 4
    balls = [*c._router._fwd.values(), *c._router._bwd.values()]
    assert max(len(b.dist) for b in balls) < 100


# ---------------------------------------------------------------- replicas on disjoint links


_FLOW = st.tuples(st.sampled_from([0.0, 1e-6, 2.5e-6]),
                  st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
                  st.sampled_from([0.0, 1e3, 3e6, 7.5e6]))


@settings(max_examples=60, deadline=None)
@given(template=st.lists(_FLOW, min_size=1, max_size=6),
       caps=st.lists(st.sampled_from([1e9, 2.5e9, 1e10, math.inf]), min_size=6, max_size=6),
       copies=st.integers(2, 5))
def test_disjoint_replicas_time_as_one_group_bit_for_bit(template: list, caps: list[float],
                                                         copies: int) -> None:
    """Collapsed timing runs one of several identical groups on disjoint links: the makespan
    is exactly that of all of them (same events, same arithmetic)."""
    groups = [[(start, tuple(6 * k + x for x in links), nbytes)
               for start, links, nbytes in template] for k in range(copies)]
    capacity = caps * copies
    assert _are_disjoint_replicas(groups, capacity)
    together = makespan_s([f for g in groups for f in g], capacity)
    assert replicas_makespan_s(groups, capacity) == together == makespan_s(groups[0], capacity)


def test_groups_sharing_a_link_or_differing_run_together() -> None:
    capacity = [1e9] * 4
    shared = [[(0.0, (0, 1), 1e6)], [(0.0, (1, 2), 1e6)]]
    assert not _are_disjoint_replicas(shared, capacity)
    assert replicas_makespan_s(shared, capacity) == pytest.approx(2e-3)
    different = [[(0.0, (0,), 1e6)], [(0.0, (1,), 2e6)]]
    assert not _are_disjoint_replicas(different, capacity)
    assert replicas_makespan_s(different, capacity) == pytest.approx(2e-3)
    assert replicas_makespan_s([[(0.0, (0,), 1e6)], [(0.0, (1,), 1e6)]], capacity) == \
        pytest.approx(1e-3)
