"""Link degradation and failure (:meth:`Cluster.with_link_changes`): reroutes, partitions, names;
links degraded in the middle of a step (:meth:`FlowNetwork.set_capacity`) or failing
there (:meth:`FlowNetwork.reroute` onto the routes of :meth:`Cluster.rerouted`).

Closed forms: with zero latency, S bytes over a path whose slowest link runs at
B take S / B; k flows forced onto one link of bandwidth B take k S / B
(max-min fair sharing, Bertsekas & Gallager sec. 6.5.2).
"""

from __future__ import annotations

import math

import networkx as nx
import pytest

from base.errors import ConfigError, SimError, TopologyError
from sim.commtime import CollectiveTimer
from sim.engine import EngineCounters, simulate_program
from sim.experiment import build_experiment
from sim.faults_run import simulate_run
from sim.network import FlowNetwork
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


# ------------------------------------------------------------------ mid-step degradation
# Closed forms: a flow of S bytes alone on a link of B, degraded to f·B at t < S / B, has
# moved B·t bytes and ends at t + (S - B·t) / (f·B).


def test_network_re_rates_a_flow_in_flight() -> None:
    net = FlowNetwork([10.0, 10.0, 10.0])
    net.start(0.0, 1, (0, 1), 100.0)  # shares link 1 with flow 2
    net.start(0.0, 2, (1,), 100.0)
    net.start(0.0, 3, (2,), 100.0)  # alone on link 2
    net.refresh(0.0)
    assert net.next_end_s() == pytest.approx(10.0)  # flow 3; flows 1, 2 at 5 B/s
    before = net.recomputations
    net.set_capacity(4.0, {1: 4.0})  # flows 1, 2: 80 B left each, now 2 B/s
    assert net.recomputations == before + 1
    assert net.finish_due(10.0) == [3]
    assert net.next_end_s() == pytest.approx(4.0 + 80.0 / 2.0)
    assert net.finish_due(44.0) == [1, 2]
    with pytest.raises(ValueError, match="finite, positive bandwidth"):
        net.set_capacity(50.0, {0: 0.0})


def test_network_refuses_to_change_an_unconstrained_link() -> None:
    net = FlowNetwork([math.inf])
    with pytest.raises(ValueError, match="link 0: bandwidth inf"):
        net.set_capacity(0.0, {0: 5.0})


def test_engine_slows_a_send_in_flight() -> None:
    """One send over gpu0 -> switch -> gpu1 (zero latency); the first link halves at t."""
    cluster = Cluster("sw", graphs.switch(2, B, 0.0), H100, 1)
    b = ProgramBuilder()
    b.send(0, 1, S, "pp", "m", ())
    prog = Program(2, b.build(), (0.0, 0.0), gpipe(1, 1))
    t = 0.1
    change = cluster.degraded_bandwidths({("gpu0", "switch"): 0.5})
    assert change == {cluster.link_index(("gpu0", "switch")): B / 2,
                      cluster.link_index(("switch", "gpu0")): B / 2}
    end = simulate_program(prog, cluster, lambda _op: 0.0, link_changes=[(t, change)]).end_s
    assert end == pytest.approx(t + (S - B * t) / (B / 2), rel=1e-12)
    # a change after the send has ended changes nothing
    late = simulate_program(prog, cluster, lambda _op: 0.0, link_changes=[(1.0, change)]).end_s
    assert late == pytest.approx(S / B, rel=1e-12)


def _two_stage_sends(at_s: float | None, steps: int, fidelity: str = "auto",
                     **faults: object) -> dict:
    """pp = 2 with zero-time compute: a step is the activation send and the gradient send,
    S bytes each over gpu0 -> switch -> gpu1 at B: 2 S / B."""
    data = {
        "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0, "p2p_MB": S / 1e6}},
        "cluster": {"num_gpus": 2, "topology": "switch", "link_bandwidth_GBps": B / 1e9,
                    "link_latency_us": 0.0},
        "parallel": {"pp": 2}, "training": {"global_batch_size": 1},
    }
    if at_s is not None:
        data["faults"] = {"link_faults": [{"link": ["gpu0", "switch"], "at_s": at_s,
                                           **faults}]}
    return simulate_run(build_experiment(data), steps, fidelity=fidelity).stats


def test_a_degradation_mid_step_slows_that_step_from_then_on() -> None:
    """Halved x into the second step (x < S / B, during its activation send): that step
    takes x + 2 (S/B - x) for the rest of the send at half speed, then 2 S/B for the
    gradient send, 4 S/B - x in all; the steps before take 2 S/B, those after 4 S/B."""
    one = S / B
    x = 0.1 * one
    stats = _two_stage_sends(2 * one + x, 5, bandwidth_factor=0.5)
    segs = stats["run_segments"]
    assert [r["steps"] for r in segs] == [1, 1, 3]
    assert segs[1]["mid_step_faults"] == 1 and segs[1]["faults_applied"] == 1
    assert segs[0]["step_time_s"] == pytest.approx(2 * one, rel=1e-12)
    assert segs[1]["step_time_s"] == pytest.approx(4 * one - x, rel=1e-12)
    assert segs[2]["step_time_s"] == pytest.approx(4 * one, rel=1e-12)
    assert stats["time_to_train_s"] == pytest.approx(2 * one + (4 * one - x) + 3 * 4 * one,
                                                     rel=1e-12)
    # the run's idle breakdown counts the mid-step simulation for its step
    assert stats["idle_breakdown_run_s"]["idle_s"] == pytest.approx(
        (2 * one) + (4 * one - x) + 3 * 4 * one, rel=1e-9)  # compute takes no time
    # on a step boundary it is not a mid-step change: 2 fast steps, 2 slow ones
    edge = _two_stage_sends(4 * one, 4, bandwidth_factor=0.5)
    assert edge["time_to_train_s"] == pytest.approx(2 * 2 * one + 2 * 4 * one, rel=1e-12)
    assert all("mid_step_faults" not in r for r in edge["run_segments"])
    # collapsed steps have their transfer times fixed in advance: at the next boundary
    collapsed = _two_stage_sends(2 * one + x, 5, "collapsed", bandwidth_factor=0.5)
    assert collapsed["time_to_train_s"] == pytest.approx(2 * 2 * one + 3 * 4 * one, rel=1e-12)


# ------------------------------------------------------------------ mid-step failure
# Closed forms: a flow of S bytes at B whose link fails at x (after its start at t0) has
# moved B·(x - t0) bytes; rerouted alone onto a path of bottleneck B' it ends at
# x + (S - B·(x - t0)) / B' (no extra latency for bytes already streaming); sharing a link
# of B with one other flow, max-min gives each B / 2.


def test_network_moves_a_flow_in_flight_to_other_links() -> None:
    net = FlowNetwork([10.0, 10.0, 10.0])
    net.start(0.0, 1, (0,), 100.0)
    net.start(0.0, 2, (1, 2), 100.0)
    net.refresh(0.0)
    assert net.next_end_s() == pytest.approx(10.0)
    assert net.crossing([0]) == [1] and net.crossing([2, 0]) == [1, 2]
    net.reroute(4.0, {1: (1,)})  # 60 B left each, now sharing link 1 at 5 B/s
    assert net.crossing([0]) == []
    assert net.next_end_s() == pytest.approx(4.0 + 60.0 / 5.0)
    assert net.finish_due(16.0) == [1, 2]
    # link 0 carried flow 1's first 40 B, link 1 its last 60 B and all of flow 2's
    assert net.bytes_on_link == pytest.approx({0: 40.0, 1: 160.0, 2: 100.0})


def _two_paths(latency_s: float = 0.0, granularity: str = "stream") -> Cluster:
    """gpu0 -> a -> gpu1 at B (2 hops, the shortest) and gpu0 -> b -> c -> gpu1 at B / 4."""
    g = nx.DiGraph(name="two-paths")
    for r in range(2):
        g.add_node(f"gpu{r}", kind="gpu", rank=r, host=r)
    for node in "abc":
        g.add_node(node, kind="switch")
    for u, v, bw in [("gpu0", "a", B), ("a", "gpu1", B), ("gpu0", "b", B / 4),
                     ("b", "c", B / 4), ("c", "gpu1", B / 4)]:
        g.add_edge(u, v, bandwidth_Bps=bw, latency_s=latency_s)
        g.add_edge(v, u, bandwidth_Bps=bw, latency_s=latency_s)
    return Cluster("two-paths", g, H100, 1, collective_granularity=granularity)


def _fail(cluster: Cluster, *links: tuple[str, str]) -> dict[int, float]:
    return {i: 0.0 for link in links for i in cluster.link_indices(link)}


def _run(cluster: Cluster, prog: Program, changes: list) -> float:
    return simulate_program(prog, cluster, lambda _op: 0.0, link_changes=changes).end_s


def test_a_send_in_flight_moves_to_the_other_path_when_its_link_fails() -> None:
    lat = 1e-3
    c = _two_paths(lat)
    assert _names(c, 0, 1) == {("gpu0", "a"), ("a", "gpu1")}
    b = ProgramBuilder()
    first = b.send(0, 1, S, "pp", "there", ())
    b.send(1, 0, S, "pp", "back", (first,))
    prog = Program(2, b.build(), (0.0, 0.0), gpipe(1, 1))
    assert _run(c, prog, []) == pytest.approx(2 * (2 * lat + S / B), rel=1e-12)
    x = 0.1
    fail = _fail(c, ("gpu0", "a"))
    t_there = x + (S - B * (x - 2 * lat)) / (B / 4)  # 0.1 + 3.02e9 / 2.5e9 = 1.308 s
    t_back = 3 * lat + S / (B / 4)  # the later send takes the slow path: 3 hops, 1.603 s
    assert t_there + t_back == pytest.approx(2.911, rel=1e-12)
    assert _run(c, prog, [(x, fail)]) == pytest.approx(t_there + t_back, rel=1e-12)
    # failing the other path changes nothing; deterministic
    assert _run(c, prog, [(x, _fail(c, ("b", "c")))]) == pytest.approx(
        2 * (2 * lat + S / B), rel=1e-12)
    assert _run(c, prog, [(x, fail)]) == _run(c, prog, [(x, fail)])
    # during the second send's latency: it starts on the new route (one more hop of latency
    # was not waited for: the delay was set when the send started)
    y = S / B + 2 * lat + 0.5 * lat
    assert _run(c, prog, [(y, fail)]) == pytest.approx(
        S / B + 2 * lat + 2 * lat + S / (B / 4), rel=1e-12)


@pytest.mark.parametrize("granularity", ["stream", "step"])
def test_a_collective_in_progress_takes_the_new_routes_for_its_later_transfers(
        granularity: str) -> None:
    """A 2-GPU ring all-reduce of S: one flow of S each way (granularity ``stream``), or a
    reduce-scatter step (S/2 each way) then an all-gather step (S/2 each way, planned before
    the failure, started after it). The a-path fails x into it: the flows in flight finish on
    the slow path (different directions: B/4 each), and so do the all-gather's: x + (S - B x)
    / (B/4) either way; on the old route the all-gather would take (S/2) / B."""
    c = _two_paths(granularity=granularity)
    b = ProgramBuilder()
    b.collective((0, 1), {}, kind="dp", name="ar", op="all_reduce", nbytes=S, algo="ring")
    prog = Program(2, b.build(), (0.0, 0.0), gpipe(1, 1))
    counters = EngineCounters()
    simulate_program(prog, c, lambda _op: 0.0, counters=counters)
    assert counters.flows == (2 if granularity == "stream" else 4)
    assert _run(c, prog, []) == pytest.approx(S / B, rel=1e-12)
    x = 0.05
    expect = x + (S - B * x) / (B / 4)  # 0.05 + 3.5e9 / 2.5e9 = 1.45 s
    assert expect == pytest.approx(1.45, rel=1e-12)
    assert _run(c, prog, [(x, _fail(c, ("gpu0", "a")))]) == pytest.approx(expect, rel=1e-12)


def test_two_flows_share_the_surviving_spine_by_max_min() -> None:
    """Fat-tree, sends 0 -> 2 (over spine0) and 1 -> 3 (over spine1), S each at B. leaf0 -
    spine0 fails at x: 0 -> 2 joins 1 -> 3 on leaf0 -> spine1, B/2 each: both end at
    x + 2 (S - B x) / B."""
    c = _fat_tree()
    b = ProgramBuilder()
    b.send(0, 2, S, "pp", "a", ())
    b.send(1, 3, S, "pp", "b", ())
    prog = Program(4, b.build(), (0.0,) * 4, gpipe(1, 1))
    x = 0.1
    end = _run(c, prog, [(x, _fail(c, ("leaf0", "spine0")))])
    assert end == pytest.approx(x + 2 * (S - B * x) / B, rel=1e-12)  # 0.7 s, not 0.4
    assert end == pytest.approx(0.7, rel=1e-12)


def test_a_partition_mid_flight_names_the_pair() -> None:
    c = Cluster("sw", graphs.switch(2, B, 0.0), H100, 1)
    b = ProgramBuilder()
    b.send(0, 1, S, "pp", "m", ())
    prog = Program(2, b.build(), (0.0, 0.0), gpipe(1, 1))
    with pytest.raises(TopologyError, match="no path from gpu0 to gpu1.*partition") as err:
        _run(c, prog, [(0.1, _fail(c, ("gpu0", "switch")))])
    assert "gpu0->switch" in str(err.value)


def _fat_tree_pipeline(steps: int, **fault: object) -> dict:
    """pp = 2 x dp = 2 on the 4-GPU fat-tree, zero-time compute: a step is the activation
    sends 0 -> 2, 1 -> 3, then the gradient sends 2 -> 0, 3 -> 1, S each, disjoint spines:
    2 S / B."""
    data: dict = {
        "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0, "p2p_MB": S / 1e6}},
        "cluster": {"num_gpus": 4, "topology": "fat-tree", "gpus_per_leaf": 2,
                    "link_bandwidth_GBps": B / 1e9, "link_latency_us": 0.0},
        "parallel": {"pp": 2, "dp": 2}, "training": {"global_batch_size": 2},
    }
    if fault:
        data["faults"] = {"link_faults": [{"link": ["leaf0", "spine0"], "failed": True,
                                           **fault}]}
    return simulate_run(build_experiment(data), steps, fidelity="full").stats


@pytest.mark.parametrize("frac", [0.25, 1.5])
def test_a_failure_mid_step_in_a_run_reroutes_that_step(frac: float) -> None:
    """leaf0 - spine0 fails x into the second step. During the activation sends (x < S/B) the
    0 -> 2 send shares leaf0 -> spine1 with 1 -> 3 for its rest (B/2 each), ending at
    2 S/B - x, then the gradient sends share spine1 -> leaf0: 2 S/B more; during the
    gradient sends (S/B < x < 2 S/B) both end at x + 2 (S - B (x - S/B)) / B. Either way
    4 S/B - x; after it every step shares the spine: 4 S/B, as on the failed cluster."""
    one = S / B
    x = frac * one
    healthy = _fat_tree_pipeline(1)
    assert healthy["step_time_s"] == pytest.approx(2 * one, rel=1e-12)
    stats = _fat_tree_pipeline(5, at_s=2 * one + x)
    segs = stats["run_segments"]
    assert [r["steps"] for r in segs] == [1, 1, 3]
    assert segs[1]["mid_step_faults"] == 1 and segs[1]["faults_applied"] == 1
    assert segs[1]["step_time_s"] == pytest.approx(4 * one - x, rel=1e-12)
    failed = _fat_tree_pipeline(1, at_s=0.0)  # failed from the start
    assert failed["step_time_s"] == pytest.approx(4 * one, rel=1e-12)
    assert segs[2]["step_time_s"] == failed["step_time_s"]
    assert stats["time_to_train_s"] == pytest.approx(2 * one + (4 * one - x) + 3 * 4 * one,
                                                     rel=1e-12)
    assert _fat_tree_pipeline(5, at_s=2 * one + x) == stats  # deterministic


def test_a_failure_that_partitions_mid_step_is_a_config_error() -> None:
    """On a one-switch topology a failed GPU link partitions the GPUs: reported when it
    strikes, mid-step, naming the pair."""
    one = S / B
    with pytest.raises(ConfigError, match="faults.link_faults: .*no path from gpu.*partition"):
        _two_stage_sends(2 * one + 0.1 * one, 4, failed=True)
    stats = _two_stage_sends(7 * one, 3, failed=True)  # after the run's last step
    assert stats["time_to_train_s"] == pytest.approx(3 * 2 * one, rel=1e-12)
