"""Topology generators against their counting formulas; ECMP routing; cluster config keys."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter, deque

import networkx as nx
import pytest
from conftest import ROOT

from base.errors import ConfigError, TopologyError
from sim.config import parse_config
from sim.network import makespan_s
from topologies import graphs
from topologies.build import build_cluster
from topologies.cluster import Cluster
from topologies.graphs import Fabric, gpu_node
from topologies.hardware import GPUS
from topologies.presets import SERVERS, cluster_from_graph, server_cluster, server_graph

H100 = GPUS["H100"]


def links(g: nx.DiGraph) -> int:
    """Undirected links: every physical link is two directed edges."""
    assert all(g.has_edge(v, u) for u, v in g.edges())
    return g.number_of_edges() // 2


def kinds(g: nx.DiGraph) -> Counter:
    return Counter(d["kind"] for _, d in g.nodes(data=True))


def degree(g: nx.DiGraph, v: str) -> int:
    return g.out_degree(v)


def gpu_diameter(g: nx.DiGraph) -> int:
    """Largest hop count between two GPUs (BFS from every GPU)."""
    gpus = [v for v, d in g.nodes(data=True) if d["kind"] == "gpu"]
    worst = 0
    for s in gpus:
        dist = {s: 0}
        queue = deque([s])
        while queue:
            v = queue.popleft()
            for w in g.successors(v):
                if w not in dist:
                    dist[w] = dist[v] + 1
                    queue.append(w)
        worst = max(worst, max(dist[t] for t in gpus))
    return worst


# ---------------------------------------------------------------- direct networks


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_switch_counts(n: int) -> None:
    g = graphs.switch(n, 1e9, 1e-6)
    assert kinds(g) == {"gpu": n, "switch": 1}
    assert links(g) == n
    assert degree(g, "switch") == n
    assert gpu_diameter(g) == (2 if n > 1 else 0)


@pytest.mark.parametrize("n", [2, 3, 8, 9])
def test_ring_counts(n: int) -> None:
    g = graphs.ring(n, 1e9, 1e-6)
    assert links(g) == (1 if n == 2 else n)
    assert all(degree(g, gpu_node(r)) == min(2, n - 1) for r in range(n))
    assert gpu_diameter(g) == n // 2


@pytest.mark.parametrize("n", [1, 2, 8])
def test_full_mesh_counts(n: int) -> None:
    g = graphs.full_mesh(n, 1e9, 1e-6)
    assert links(g) == n * (n - 1) // 2
    assert all(degree(g, gpu_node(r)) == n - 1 for r in range(n))
    assert gpu_diameter(g) == min(1, n - 1)


@pytest.mark.parametrize("dims", [(4, 4), (3, 5), (2, 4), (4, 4, 4), (2, 3, 4), (1, 6), (2, 2, 2)])
def test_torus_counts(dims: tuple[int, ...]) -> None:
    """Per axis of size k: 2 neighbours if k > 2, 1 if k = 2, 0 if k = 1; diameter sum k // 2."""
    g = graphs.torus(dims, 1e9, 1e-6)
    n = math.prod(dims)
    per_axis = [2 if k > 2 else (1 if k == 2 else 0) for k in dims]
    assert kinds(g) == {"gpu": n}
    assert all(degree(g, gpu_node(r)) == sum(per_axis) for r in range(n))
    assert links(g) == n * sum(per_axis) // 2
    assert gpu_diameter(g) == sum(k // 2 for k in dims)
    assert g.nodes[gpu_node(n - 1)]["coord"] == tuple(k - 1 for k in dims)


# ---------------------------------------------------------------- fat-trees


@pytest.mark.parametrize(("n", "d", "o"), [(64, 8, 1.0), (64, 8, 2.0), (32, 16, 4.0), (8, 8, 1.0),
                                           (24, 8, 2.0)])
def test_two_tier_fat_tree_counts(n: int, d: int, o: float) -> None:
    """L = n/d leaves with d down and u = d/o up ports, u spines, n + L·u links, diameter 4."""
    g = graphs.fat_tree(n, 1e9, 1e-6, gpus_per_leaf=d, oversubscription=o)
    leaves, u = n // d, round(d / o)
    spines = u if leaves > 1 else 0
    assert kinds(g) == {"gpu": n, "switch": leaves + spines}
    assert links(g) == n + (leaves * u if leaves > 1 else 0)
    for i in range(leaves):
        assert degree(g, f"leaf{i}") == d + (u if leaves > 1 else 0)
    for j in range(spines):
        assert degree(g, f"spine{j}") == leaves
    assert gpu_diameter(g) == (4 if leaves > 1 else 2)


@pytest.mark.parametrize("k", [4, 6, 8])
def test_three_tier_fat_tree_is_al_fares_k_ary(k: int) -> None:
    """k pods, k/2 edge + k/2 aggregation switches per pod, (k/2)^2 cores, k^3/4 hosts; every
    switch has k ports; 3·k^3/4 links; diameter 6 (Al-Fares et al., SIGCOMM 2008)."""
    hosts = k**3 // 4
    g = graphs.fat_tree(hosts, 1e9, 1e-6, gpus_per_leaf=k // 2, tiers=3)
    tiers = Counter(d["tier"] for _, d in g.nodes(data=True) if d["kind"] == "switch")
    assert tiers == {1: k * k // 2, 2: k * k // 2, 3: (k // 2) ** 2}
    assert links(g) == 3 * hosts
    assert all(degree(g, v) == k for v, d in g.nodes(data=True) if d["kind"] == "switch")
    assert gpu_diameter(g) == 6


def test_three_tier_fat_tree_with_oversubscription() -> None:
    g = graphs.fat_tree(64, 1e9, 0.0, gpus_per_leaf=8, oversubscription=2.0, tiers=3,
                        leaves_per_pod=4)
    leaves, u, pods = 8, 4, 2
    tiers = Counter(d["tier"] for _, d in g.nodes(data=True) if d["kind"] == "switch")
    assert tiers == {1: leaves, 2: pods * u, 3: u * 4}
    assert links(g) == 64 + leaves * u + pods * u * 4


def test_rail_optimized_counts() -> None:
    """DGX SuperPOD-style: per scalable unit of h servers one leaf per rail (NIC index), u = h/o
    spines joined to every leaf; same-rail and cross-rail paths both take 6 hops."""
    n, g_per_node, h, o = 64, 8, 4, 2.0
    g = server_graph("dgx-h100", n, Fabric("rail-optimized", gpus_per_leaf=h,
                                           oversubscription=o))
    hosts, units, u = n // g_per_node, n // g_per_node // h, round(h / o)
    leaves = units * g_per_node
    assert kinds(g) == {"gpu": n, "nvswitch": hosts, "nic": n, "switch": leaves + u}
    assert links(g) == 3 * n + leaves * u
    for s in range(units):
        for r in range(g_per_node):
            leaf = f"su{s}/rail{r}"
            assert degree(g, leaf) == h + u
            assert {g.nodes[v].get("host", -1) // h for v in g.successors(leaf)
                    if g.nodes[v]["kind"] == "nic"} == {s}
            assert all(v.endswith(f"nic{r}") for v in g.successors(leaf)
                       if g.nodes[v]["kind"] == "nic")
    assert gpu_diameter(g) == 6


@pytest.mark.parametrize(("a", "p", "h"), [(4, 2, 2), (2, 1, 1), (3, 2, 1)])
def test_balanced_dragonfly_counts(a: int, p: int, h: int) -> None:
    """G = a·h + 1 groups: a router has p endpoints, a−1 local and exactly h global links;
    one global link per group pair; GPU diameter 5 (local, global, local)."""
    groups = a * h + 1
    n = groups * a * p
    g = graphs.dragonfly(n, 1e9, 1e-6, routers_per_group=a, gpus_per_router=p,
                         global_links_per_router=h)
    assert kinds(g) == {"gpu": n, "switch": groups * a}
    assert links(g) == n + groups * a * (a - 1) // 2 + groups * (groups - 1) // 2
    for v, d in g.nodes(data=True):
        if d["kind"] == "switch":
            assert degree(g, v) == p + (a - 1) + h
    pairs = Counter(tuple(sorted((g.nodes[u]["group"], g.nodes[v]["group"])))
                    for u, v in g.edges() if g.nodes[u]["kind"] == g.nodes[v]["kind"] == "switch"
                    and g.nodes[u]["group"] != g.nodes[v]["group"])
    assert len(pairs) == groups * (groups - 1) // 2 and set(pairs.values()) == {2}
    assert gpu_diameter(g) == (5 if a > 1 else 3)


def test_dragonfly_rejects_too_many_groups() -> None:
    with pytest.raises(TopologyError, match="groups - 1"):
        graphs.dragonfly(4 * 2 * 12, 1e9, 0.0, routers_per_group=4, gpus_per_router=2,
                         global_links_per_router=2)


def test_non_integer_uplinks_are_rejected() -> None:
    with pytest.raises(TopologyError, match="oversubscription 3 .* 8 endpoint ports"):
        graphs.fat_tree(32, 1e9, 0.0, gpus_per_leaf=8, oversubscription=3.0)


# ---------------------------------------------------------------- servers and sites


@pytest.mark.parametrize(("preset", "n"), [("dgx-a100-80g", 8), ("dgx-a100-80g", 64),
                                           ("dgx-h100", 32), ("dgx-b200", 16),
                                           ("gb200-nvl72", 144)])
def test_server_presets(preset: str, n: int) -> None:
    """g GPUs per NVSwitch; between servers one NIC per GPU on a non-blocking crossbar."""
    per = SERVERS[preset].gpus_per_node
    hosts = n // per
    g = server_graph(preset, n)
    expected = {"gpu": n, "nvswitch": hosts}
    if hosts > 1:
        expected |= {"nic": n, "switch": 1}
    assert kinds(g) == expected
    assert links(g) == n + (2 * n if hosts > 1 else 0)
    assert gpu_diameter(g) == (4 if hosts > 1 else 2)
    c = server_cluster(preset, n)
    assert c.nvswitch_of(n - 1) == f"host{hosts - 1}/nvswitch"
    assert c.nvls_capable(c.nvswitch_of(0)) == SERVERS[preset].nvls
    assert c.route(0, per - 1).latency_s == pytest.approx(3.4e-6)
    if hosts > 1:
        assert c.route(0, per).latency_s == pytest.approx(9.6e-6)


@pytest.mark.parametrize("nics", [1, 2, 4])
def test_servers_with_fewer_nics_share_them(nics: int) -> None:
    """nics_per_node K: GPUs i*k .. i*k+k-1 (k = 8/K) reach NIC i through their own PCIe
    port; NVLink stays the only intra-server path, inter-server latency is unchanged, and
    the GPUs behind one NIC split its line rate while GPUs behind different NICs do not."""
    g = server_graph("dgx-a100-80g", 16, nics_per_node=nics)
    assert kinds(g) == {"gpu": 16, "nvswitch": 2, "nic": 2 * nics, "pcie": 16, "switch": 1}
    c = server_cluster("dgx-a100-80g", 16, nics_per_node=nics)
    assert [len(c.nics_of(h)) for h in (0, 1, 2)] == [nics, nics, 0]
    assert {d["host"] for h in (0, 1) for d in c.nics_of(h)} == {0, 1}
    for src, dst in ((0, 7), (3, 4)):
        assert [c.link_name(i) for i in c.route(src, dst).links] == [
            f"gpu{src}->host0/nvswitch", f"host0/nvswitch->gpu{dst}"]
    assert c.route(0, 8).latency_s == pytest.approx(9.6e-6)  # as with one NIC per GPU
    k = 8 // nics
    assert f"host0/nic{5 // k}->fabric" in [c.link_name(i) for i in c.route(5, 13).links]
    nic_Bps = SERVERS["dgx-a100-80g"].nic_Bps * SERVERS["dgx-a100-80g"].nic_efficiency
    nbytes = 1e9

    def together(pairs: list[tuple[int, int]]) -> float:
        return makespan_s([(0.0, c.route(a, b).links, nbytes) for a, b in pairs],
                          c.link_bandwidth_Bps)

    assert together([(0, 8)]) == pytest.approx(nbytes / nic_Bps)
    # every GPU of server 0 sends to its peer in server 1: K NICs carry 8 flows
    assert together([(r, r + 8) for r in range(8)]) == pytest.approx(k * nbytes / nic_Bps)
    if nics > 1:  # GPUs behind different NICs: no contention
        assert together([(0, 8), (k, 8 + k)]) == pytest.approx(nbytes / nic_Bps)


def test_nics_per_node_must_divide_the_servers_gpus() -> None:
    with pytest.raises(TopologyError, match="nics_per_node=3 must divide the 8 GPUs"):
        server_graph("dgx-a100-80g", 16, nics_per_node=3)
    assert server_graph("dgx-a100-80g", 16, nics_per_node=8).edges == server_graph(
        "dgx-a100-80g", 16).edges


def test_nvl72_rack_is_one_nvlink_domain() -> None:
    c = server_cluster("gb200-nvl72", 72)
    assert c.gpus_per_node == 72 and c.gpu.name == "GB200"
    assert {c.nvswitch_of(r) for r in range(72)} == {"host0/nvswitch"}
    assert c.bottleneck_Bps(c.route(0, 71)) == (GPUS["GB200"].nvlink_bandwidth_Bps
                                                * SERVERS["gb200-nvl72"].nvlink_efficiency)


def test_multi_site_joins_sites_by_wan_links() -> None:
    sites = [graphs.switch(4, 25e9, 1e-6), graphs.fat_tree(8, 25e9, 1e-6, gpus_per_leaf=4)]
    g = graphs.multi_site(sites, wan_Bps=10e9 / 8, wan_latency_s=0.03)
    assert kinds(g) == {"gpu": 12, "switch": 1 + (2 + 4) + 2}
    # site 0: gateway to its one switch; site 1: gateway to its 4 spines; one WAN link
    assert links(g) == 4 + (8 + 2 * 4) + 1 + 4 + 1
    c = cluster_from_graph("geo", g, H100)
    assert c.host_of(11) == 11 and g.nodes[gpu_node(11)]["site"] == 1
    route = c.route(0, 11)
    # gpu-switch-gateway (1 µs + 0) - WAN (30 ms) - gateway-spine-leaf-gpu (0 + 1 + 1 µs)
    assert route.latency_s == pytest.approx(0.03 + 3e-6)
    assert c.bottleneck_Bps(route) == pytest.approx(10e9 / 8)
    assert gpu_diameter(g) == 6


def test_cluster_from_graph_validates() -> None:
    g = graphs.switch(2, 1e9, 0.0)
    g.remove_edge("switch", gpu_node(1))
    with pytest.raises(TopologyError, match="no reverse link"):
        cluster_from_graph("bad", g, H100)


# ---------------------------------------------------------------- ECMP routing


def test_routes_are_shortest_and_deterministic() -> None:
    g = graphs.fat_tree(64, 1e9, 1e-6, gpus_per_leaf=8, oversubscription=2.0, tiers=3,
                        leaves_per_pod=2)
    a, b = Cluster("a", g, H100, 1), Cluster("b", g.copy(), H100, 1)
    for src in range(0, 64, 5):
        for dst in range(64):
            path = a.path(src, dst)
            assert len(path) - 1 == nx.shortest_path_length(g, gpu_node(src), gpu_node(dst))
            assert a.route(src, dst) == b.route(src, dst) == a.route(src, dst)


def test_dst_mod_k_spreads_destinations_over_spines() -> None:
    """D-mod-k: the spine of a flow is its destination rank mod the uplink count."""
    u = 4
    c = Cluster("ft", graphs.fat_tree(16, 1e9, 0.0, gpus_per_leaf=8, oversubscription=2.0),
                H100, 1)
    for src in range(8):
        for dst in range(8, 16):
            assert c.path(src, dst)[2] == f"spine{dst % u}"


def test_hash_ecmp_is_stable_across_interpreters() -> None:
    code = ("from topologies import graphs; from topologies.cluster import Cluster;"
            "from topologies.hardware import GPUS;"
            "c = Cluster('x', graphs.fat_tree(64, 1e9, 0.0, gpus_per_leaf=8), GPUS['H100'], 1,"
            " ecmp='hash'); print([c.path(s, (s * 7 + 9) % 64)[2] for s in range(64)])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                           check=True, env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout
            for seed in ("0", "1", "12345")}
    assert len(outs) == 1
    spines = eval(outs.pop())  # noqa: S307 - our own subprocess output
    assert len({s for s in spines if s.startswith("spine")}) > 1


def test_route_to_a_switch_node() -> None:
    c = server_cluster("dgx-h100", 16)
    route = c.route(9, "host1/nvswitch")
    assert route.latency_s == pytest.approx(1.7e-6) and len(route.links) == 1
    with pytest.raises(TopologyError, match="no node"):
        c.route(0, "nowhere")
    with pytest.raises(TopologyError, match="no GPU 99"):
        c.route(0, 99)


# ---------------------------------------------------------------- cluster config keys


def _cluster(**keys: object) -> Cluster:
    return build_cluster(parse_config({"model": {"synthetic": {"forward_ms": 1.0,
                                                               "backward_ms": 1.0}},
                                       "cluster": keys}).cluster)


def test_config_builds_every_topology() -> None:
    assert _cluster(topology="torus3d", num_gpus=27, dims=[3, 3, 3], link_bandwidth_GBps=50,
                    link_latency_us=1.0).num_gpus == 27
    ft = _cluster(preset="dgx-h100", num_gpus=64, topology="fat-tree", gpus_per_leaf=16,
                  oversubscription=2.0)
    assert ft.name == "dgx-h100/fat-tree" and ft.gpus_per_node == 8
    assert sum(1 for v in ft.graph if v.startswith("spine")) == 8
    df = _cluster(topology="dragonfly", num_gpus=72, link_bandwidth_GBps=25,
                  dragonfly={"routers_per_group": 4, "gpus_per_router": 2,
                             "global_links_per_router": 2, "global_bandwidth_GBps": 12.5})
    assert df.num_gpus == 72
    rail = _cluster(topology="rail-optimized", num_gpus=32, gpus_per_node=8,
                    link_bandwidth_GBps=50, gpus_per_leaf=2, nvls=True)
    assert rail.nvls_capable(rail.nvswitch_of(0))
    geo = _cluster(preset="dgx-h100", num_gpus=32, sites=2, wan_bandwidth_Mbps=100_000,
                   wan_latency_ms=20)
    assert geo.route(0, 31).latency_s > 0.02
    over = _cluster(topology="ring", num_gpus=4, link_bandwidth_GBps=1,
                    collectives={"all_reduce": "tree", "all_gather": "auto"},
                    collective_step_us=2.0, collective_granularity="step", ecmp="hash")
    assert dict(over.collective_algos) == {"all_reduce": "tree", "all_gather": "auto"}
    assert over.collective_step_s == pytest.approx(2e-6)
    assert over.collective_granularity == "step" and over.ecmp == "hash"


@pytest.mark.parametrize(("keys", "needles"), [
    ({"topology": "torus2d", "num_gpus": 16, "link_bandwidth_GBps": 1}, ["cluster.dims"]),
    ({"topology": "torus2d", "num_gpus": 16, "dims": [4, 5], "link_bandwidth_GBps": 1},
     ["cluster.dims", "[4, 5]", "20"]),
    ({"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 1, "oversubscription": 2.0},
     ["cluster.oversubscription", "ring"]),
    ({"preset": "dgx-h100", "num_gpus": 64, "topology": "torus2d"},
     ["cluster.topology", "torus2d", "dgx-h100"]),
    ({"preset": "dgx-h100", "num_gpus": 64, "topology": "fat-tree", "oversubscription": 3.0},
     ["oversubscription 3", "gpus_per_leaf"]),
    ({"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 1,
      "collectives": {"all_to_all": "ring"}}, ["cluster.collectives.all_to_all", "'ring'"]),
    ({"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 1,
      "collectives": {"all_reduce": "fastest"}}, ["cluster.collectives.all_reduce", "fastest"]),
    ({"topology": "dragonfly", "num_gpus": 8, "link_bandwidth_GBps": 1}, ["cluster.dragonfly"]),
    ({"topology": "switch", "num_gpus": 8, "link_bandwidth_GBps": 1, "sites": 2},
     ["cluster.wan_bandwidth_Mbps"]),
    ({"topology": "switch", "num_gpus": 8, "link_bandwidth_GBps": 1, "sites": 3},
     ["cluster.sites=3", "num_gpus=8"]),
    ({"preset": "dgx-h100", "num_gpus": 8, "gpus_per_node": 4}, ["cluster.gpus_per_node"]),
    ({"topology": "ring", "num_gpus": 8, "link_bandwidth_GBps": 1, "gpus_per_node": 4},
     ["cluster.gpus_per_node=4", "ring"]),
    ({"preset": "ideal", "num_gpus": 8, "ecmp": "hash"}, ["cluster.ecmp", "ideal"]),
    ({"num_gpus": 8}, ["cluster", "preset", "topology"]),
    ({"preset": "dgx-a100-80g", "num_gpus": 16, "nics_per_node": 3},
     ["nics_per_node=3", "8 GPUs"]),
    ({"topology": "fat-tree", "num_gpus": 16, "link_bandwidth_GBps": 1, "nics_per_node": 2},
     ["cluster.nics_per_node=2", "cluster.preset"]),
    ({"nodes": [{"preset": "dgx-a100-80g", "count": 2}], "num_gpus": 16, "nics_per_node": 2},
     ["cluster.nics_per_node=2", "cluster.nodes"]),
])
def test_config_errors_name_key_and_value(keys: dict, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        _cluster(**keys)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_per_rank_gpu_specs_are_checked_and_uniform_ones_collapse() -> None:
    g = graphs.switch(4, 1e9, 0.0)
    a100, h100 = GPUS["A100-80GB"], GPUS["H100"]
    with pytest.raises(TopologyError, match="3 GPU specs for 4 GPUs"):
        Cluster("c", g, a100, 1, gpus=(a100, a100, h100))
    with pytest.raises(TopologyError, match="rank 0 is a H100, but the cluster's gpu is A100"):
        Cluster("c", g, a100, 1, gpus=(h100, a100, a100, a100))
    same = Cluster("c", g, a100, 1, gpus=(a100,) * 4)
    assert not same.heterogeneous and same.gpu_summary() == "A100-80GB"
    mixed = Cluster("c", g, a100, 1, gpus=(a100, h100, a100, h100))
    assert mixed.heterogeneous and mixed.gpu_of(1) is h100 and mixed.gpu_of(2) is a100
    assert mixed.gpu_summary() == "2x A100-80GB + 2x H100"
    assert mixed.with_link_changes(failed=[("gpu0", "switch")]).gpus == mixed.gpus


def test_gpu_memory_is_what_cuda_reports_binary_hbm_less_the_drivers_share() -> None:
    """PyTorch reports 79.25-79.35 GiB total on an A100-80GB (hardware.CUDA_VISIBLE_FRACTION),
    not the 74.5 GiB of 80e9 bytes; GPUs without a measured total take their vendor figure in
    GiB with the same share, those with one (gpus.toml cuda_total_gib) take it."""
    assert GPUS["A100-80GB"].hbm_capacity_gib == pytest.approx(79.3, abs=1e-9)
    assert 79.25 <= GPUS["A100-80GB"].hbm_capacity_gib <= 79.35
    for name, vendor_gb in (("H100-PCIe", 80), ("H800", 80), ("H100-96GB", 96), ("GB200", 186)):
        assert GPUS[name].hbm_capacity_gib == pytest.approx(vendor_gb * 79.3 / 80, rel=1e-12)
    for name, measured in (("A100-40GB", 39.39), ("H100", 79.11), ("H200", 139.81),
                           ("B200", 178.35)):
        assert GPUS[name].hbm_capacity_gib == pytest.approx(measured, rel=1e-12)


def test_link_efficiencies_are_data_with_sources() -> None:
    """Every link generation's fraction lies in (0, 1] with a source (an issue thread or a
    published file); the presets take theirs from the table (NDR: 48.5 of 50 GB/s, NVIDIA in
    nccl-tests issue 267; TCPXO: 187.48 of 200, Google's A3 bootcamp)."""
    from topologies.links import LINKS
    for name, link in LINKS.items():
        assert 0 < link.fraction <= 1 and ("issue" in link.source or ".md" in link.source), name
    assert {"ib-hdr", "ib-ndr", "ib-xdr", "roce-400g", "pcie-gen5-host", "nvlink3", "nvlink4",
            "nvlink5", "nvls4", "tcpxo-200g"} <= set(LINKS)
    assert SERVERS["a3-mega"].nic_efficiency == LINKS["tcpxo-200g"].fraction
    h100 = SERVERS["dgx-h100"]
    assert h100.nic_efficiency == LINKS["ib-ndr"].fraction == 0.97
    assert h100.nvlink_efficiency == LINKS["nvlink4"].fraction
    assert SERVERS["dgx-a100-80g"].nic_efficiency == LINKS["ib-hdr"].fraction
    assert "nccl-tests issue 267" in h100.efficiency_source
    # Jean Zay's Omni-Path: the busbw bigscience measured through one HFI, 39.87 of 100 Gb/s
    jz = SERVERS["jean-zay-a100"]
    assert jz.nic_efficiency == LINKS["opa-100"].fraction == pytest.approx(0.3987)
    assert jz.nic_Bps == 100e9 / 8 and jz.gpu == "A100-80GB"
