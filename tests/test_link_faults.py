"""Link degradation and failure (:meth:`Cluster.with_link_changes`): reroutes, partitions, names.

Closed forms: with zero latency, S bytes over a path whose slowest link runs at
B take S / B; k flows forced onto one link of bandwidth B take k S / B
(max-min fair sharing, Bertsekas & Gallager sec. 6.5.2).
"""

from __future__ import annotations

import pytest

from sim.commtime import CollectiveTimer
from sim.engine import simulate_program
from sim.errors import SimError, TopologyError
from topologies import graphs
from topologies.cluster import Cluster
from topologies.hardware import GPUS
from topologies.presets import server_cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

H100 = GPUS["H100"]
B, S = 10e9, 4e9


def _fat_tree() -> Cluster:
    """4 GPUs, 2 leaves of 2, 2 spines (non-blocking): two paths between the leaves."""
    return Cluster("ft", graphs.fat_tree(4, B, 0.0, gpus_per_leaf=2), H100, 1)


def _transfer_s(cluster: Cluster, pairs: list[tuple[int, int]], nbytes: float = S) -> float:
    """Engine time of concurrent sends ``pairs`` of ``nbytes`` each."""
    b = ProgramBuilder()
    for k, (src, dst) in enumerate(pairs):
        b.send(src, dst, nbytes, "pp", f"m{k}", ())
    n = cluster.num_gpus
    prog = Program(n, b.build(), (0.0,) * n, gpipe(1, 1))
    return simulate_program(prog, cluster, lambda _op: 0.0).end_s


def _names(cluster: Cluster, src: int, dst: int) -> set[tuple[str, str]]:
    return {cluster.links[i] for i in cluster.route(src, dst).links}


def test_fat_tree_failure_reroutes_and_costs_bandwidth() -> None:
    healthy = _fat_tree()
    pairs = [(0, 2), (1, 3)]
    # D-mod-k: destination 2 goes over spine0, destination 3 over spine1: no sharing
    assert ("spine1", "leaf1") in _names(healthy, 1, 3)
    assert _transfer_s(healthy, pairs) == pytest.approx(S / B, rel=1e-12)
    failed = healthy.with_link_changes(failed=[("leaf0", "spine1")])
    for src in range(4):
        for dst in range(4):
            used = _names(failed, src, dst)
            assert not used & {("leaf0", "spine1"), ("spine1", "leaf0")}
            assert len(failed.route(src, dst).links) == len(healthy.route(src, dst).links)
    # both flows now cross leaf0 -> spine0: half the bandwidth each, twice the time
    assert _transfer_s(failed, pairs) == pytest.approx(2 * S / B, rel=1e-12)
    assert CollectiveTimer(failed)("send", tuple(pairs), S) == pytest.approx(2 * S / B)


def test_fat_tree_collective_completes_slower_after_a_failure() -> None:
    healthy = _fat_tree()
    failed = healthy.with_link_changes(failed=[("leaf1", "spine0")])
    group = ((0, 1, 2, 3),)
    t_ok = CollectiveTimer(healthy, "pairwise")("all_to_all", group, S)
    t_failed = CollectiveTimer(failed, "pairwise")("all_to_all", group, S)
    assert t_failed > t_ok > 0


def test_the_original_cluster_is_unchanged() -> None:
    healthy = _fat_tree()
    before = (healthy.links, healthy.link_bandwidth_Bps, healthy.route(1, 3))
    healthy.with_link_changes({("leaf0", "spine0"): 0.5}, failed=[("leaf0", "spine1")])
    assert (healthy.links, healthy.link_bandwidth_Bps, healthy.route(1, 3)) == before
    assert healthy.failed_links == ()


def test_ring_reroutes_the_long_way_then_partitions() -> None:
    ring = Cluster("ring", graphs.ring(6, B, 1e-6), H100, 1)
    assert ring.path(1, 2) == ["gpu1", "gpu2"]
    one = ring.with_link_changes(failed=[("gpu1", "gpu2")])
    assert one.path(1, 2) == ["gpu1", "gpu0", "gpu5", "gpu4", "gpu3", "gpu2"]
    assert one.route(1, 2).latency_s == pytest.approx(5e-6)
    two = one.with_link_changes(failed=[("gpu4", "gpu5")])
    assert two.failed_links == (("gpu1", "gpu2"), ("gpu2", "gpu1"), ("gpu4", "gpu5"),
                                ("gpu5", "gpu4"))
    assert two.path(2, 4) == ["gpu2", "gpu3", "gpu4"]
    with pytest.raises(TopologyError) as err:
        two.route(1, 3)
    text = str(err.value)
    assert "no path from gpu1 to gpu3" in text and "partition" in text
    assert "gpu1->gpu2" in text and "gpu4->gpu5" in text


def test_partition_surfaces_when_a_collective_needs_the_pair() -> None:
    two = Cluster("ring", graphs.ring(4, B, 0.0), H100, 1).with_link_changes(
        failed=[("gpu0", "gpu1"), ("gpu2", "gpu3")])
    with pytest.raises(TopologyError, match="no path from gpu"):
        CollectiveTimer(two)("all_reduce", ((0, 1, 2, 3),), S)


def test_half_bandwidth_doubles_a_single_link_transfer() -> None:
    mesh = Cluster("mesh", graphs.full_mesh(2, B, 0.0), H100, 1)
    slow = mesh.with_link_changes({("gpu0", "gpu1"): 0.5})
    assert len(slow.route(0, 1).links) == 1
    assert _transfer_s(slow, [(0, 1)]) == pytest.approx(2 * _transfer_s(mesh, [(0, 1)]),
                                                        rel=1e-12)
    assert _transfer_s(slow, [(1, 0)]) == pytest.approx(2 * S / B, rel=1e-12)
    one_way = mesh.with_link_changes({("gpu0", "gpu1"): 0.5}, both_directions=False)
    assert _transfer_s(one_way, [(1, 0)]) == pytest.approx(S / B, rel=1e-12)
    assert _transfer_s(one_way, [(0, 1)]) == pytest.approx(2 * S / B, rel=1e-12)


def test_degrading_a_nic_link_on_a_server_cluster() -> None:
    c = server_cluster("dgx-h100", 16)
    link = c.resolve_link(["host0/nic3", "fabric"])
    assert link == ("host0/nic3", "fabric")
    slow = c.with_link_changes({tuple(link): 0.25})
    i = slow.link_index(link)
    assert slow.link_bandwidth_Bps[i] == pytest.approx(0.25 * c.link_bandwidth_Bps[i])
    assert slow.link_name(i) == "host0/nic3->fabric"
    assert slow.bottleneck_Bps(slow.route(3, 11)) == pytest.approx(
        0.25 * c.bottleneck_Bps(c.route(3, 11)))


@pytest.mark.parametrize(("spec", "needle"), [
    (("nowhere", "fabric"), "no node 'nowhere'"),
    (("gpu0", "gpu1"), "no link ['gpu0', 'gpu1']"),
    ((0, 99), "no GPU 99"),
    (("host0/nic0",), "must be a pair"),
    ("gpu0", "must be a pair"),
])
def test_bad_link_names_are_errors_that_name_the_value(spec: object, needle: str) -> None:
    c = server_cluster("dgx-h100", 16)
    with pytest.raises(SimError) as err:
        c.with_link_changes(failed=[spec])
    assert needle in str(err.value)
    with pytest.raises(TopologyError):
        c.resolve_link(spec)


@pytest.mark.parametrize("factor", [0.0, -1.0, float("nan"), float("inf"), "half"])
def test_bad_degradation_factor(factor: object) -> None:
    with pytest.raises(TopologyError, match="degradation factor"):
        _fat_tree().with_link_changes({("leaf0", "spine0"): factor})


def test_gpu_ranks_name_links_and_a_failed_link_is_reported() -> None:
    ring = Cluster("ring", graphs.ring(4, B, 0.0), H100, 1)
    assert ring.resolve_link([0, 1]) == ("gpu0", "gpu1")
    failed = ring.with_link_changes(failed=[(0, 1)])
    with pytest.raises(TopologyError, match="gpu0->gpu1 has failed"):
        failed.resolve_link(["gpu0", "gpu1"])


@pytest.mark.parametrize(("graph", "link"), [
    (lambda: graphs.switch(4, B, 0.0), ("gpu0", "switch")),
    (lambda: graphs.fat_tree(16, B, 0.0, gpus_per_leaf=4), ("leaf0", "spine1")),
    (lambda: graphs.fat_tree(16, B, 0.0, gpus_per_leaf=2, tiers=3, leaves_per_pod=2),
     ("pod0/agg1", "core1.0")),
    (lambda: graphs.dragonfly(16, B, 0.0, routers_per_group=2, gpus_per_router=2,
                              global_links_per_router=2), ("group0/router0", "group0/router1")),
    (lambda: graphs.nvswitch_cluster(16, 8, B, 0.0, B, 0.0, 0.0),
     (graphs.nic_node(1, 2), "fabric")),
    (lambda: graphs.nvswitch_cluster(16, 8, B, 0.0, B, 0.0, 0.0),
     ("gpu9", graphs.nvswitch_node(1))),
    (lambda: graphs.multi_site([graphs.switch(2, B, 0.0), graphs.switch(2, B, 0.0)], B, 0.0),
     ("site0/gateway", "site1/gateway")),
])
def test_documented_node_names_name_links(graph, link: tuple[str, str]) -> None:  # noqa: ANN001
    c = Cluster("c", graph(), H100, 1)
    assert c.resolve_link(list(link)) == link
    assert c.link_name(c.link_index(link)) == f"{link[0]}->{link[1]}"
