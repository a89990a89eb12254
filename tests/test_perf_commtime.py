"""sim.commtime's timings: the flow simulation's, and reused across servers bit for bit.

:func:`test_timer_equals_the_flow_simulation` compares the timer with the engine on
random collectives, group shapes, sizes and clusters (120 derandomized cases).

:class:`sim.commtime.CollectiveTimer` reuses the timing of groups shifted by whole
servers when the servers are twins and every route consulted is the only shortest
path. Each test times every pipeline rank's TP, DP and send groups (the calls a
collapsed lowering makes) with one timer and, as the oracle, each call on a fresh
timer that never reuses (``_time``), and requires the same floats bit for bit;
then checks reuse did (or did not) happen where it must.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.commtime import CollectiveTimer
from sim.engine import simulate_program
from sim.experiment import Experiment
from tests.strategies import disjoint_groups
from topologies.cluster import Cluster
from topologies.graphs import Fabric, fat_tree
from topologies.hardware import GPUS
from topologies.presets import explicit_cluster, mixed_server_cluster, server_cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

MiB = 2.0 ** 20


def _calls(n: int, tp: int, pp: int) -> list[tuple[str, tuple[tuple[int, ...], ...], float]]:
    """The collapsed lowering's timer calls for layout rank = t + tp * (d + dp * p)."""
    dp = n // (tp * pp)

    def gpu(t: int, d: int, p: int) -> int:
        return t + tp * (d + dp * p)

    calls = []
    for p in range(pp):
        tp_groups = tuple(tuple(gpu(t, d, p) for t in range(tp)) for d in range(dp))
        dp_groups = tuple(tuple(gpu(t, d, p) for d in range(dp)) for t in range(tp))
        calls += [("all_reduce", tp_groups, 4 * MiB), ("all_gather", tp_groups, 1 * MiB),
                  ("reduce_scatter", dp_groups, 32 * MiB), ("all_reduce", dp_groups, 8 * MiB)]
        if p + 1 < pp:
            pairs = tuple((gpu(t, d, p), gpu(t, d, p + 1)) for d in range(dp) for t in range(tp))
            calls += [("send", pairs, 16 * MiB),
                      ("send", tuple((b, a) for a, b in pairs), 16 * MiB)]
    return calls


def _check(cluster, tp: int, pp: int) -> CollectiveTimer:
    timer = CollectiveTimer(cluster)
    for op, groups, nbytes in _calls(cluster.num_gpus, tp, pp):
        got = timer(op, groups, nbytes)
        want = CollectiveTimer(cluster)._time(op, groups, nbytes)
        assert got == want, (op, groups[0], got, want)
        assert got > 0
    return timer


def test_dgx_crossbar_reuses_every_pipeline_rank_bit_identically():
    c = server_cluster("dgx-a100-80g", 64)
    assert c.host_classes() == (0,) * 8
    timer = _check(c, tp=4, pp=4)
    # ranks 1..3 reuse rank 0's TP and DP timings, the later sends the first ones
    assert timer.reused == 3 * 4 + 2 * 2


def test_dgx_h100_nvls_reuses():
    c = server_cluster("dgx-h100", 64)
    timer = _check(c, tp=8, pp=4)
    assert timer.reused > 0


def test_oversubscribed_fat_tree_matches_per_group_timing():
    # 2:1 leaves of 16 NIC ports: groups share uplinks; servers under one leaf are twins,
    # servers under different leaves are not (their NICs reach different leaves)
    fabric = Fabric(kind="fat-tree", gpus_per_leaf=16, oversubscription=2.0)
    c = server_cluster("dgx-a100-80g", 128, fabric)
    classes = c.host_classes()
    assert classes is not None and len(set(classes)) == 8
    _check(c, tp=4, pp=4)


def test_ecmp_choices_are_never_reused():
    # one GPU per host on a leaf-spine fat-tree: cross-leaf routes choose a spine
    c = explicit_cluster("fat-tree", 64, GPUS["A100-80GB"], 25e9, 1e-6,
                         fabric=Fabric(kind="fat-tree", gpus_per_leaf=8))
    timer = _check(c, tp=2, pp=4)
    assert not c.route_is_unique(0, 63)
    # pipeline ranks span 16 GPUs = 2 leaves: every DP or send timing crosses leaves
    assert timer.reused == 0


def test_mixed_gpus_fall_back():
    c = mixed_server_cluster([("dgx-a100-80g", 2), ("dgx-h100", 2)])
    assert c.host_classes() is None
    timer = _check(c, tp=4, pp=4)
    assert timer.reused == 0


def test_degraded_link_breaks_twins_and_matches_per_group_timing():
    base = server_cluster("dgx-a100-80g", 64)
    c = base.with_link_changes({("host2/nic1", "fabric"): 0.25})
    classes = c.host_classes()
    assert classes is not None and classes[2] != classes[0]
    assert len(set(classes)) == 2
    timer = _check(c, tp=4, pp=4)
    plain = _check(base, tp=4, pp=4)
    # host 2 holds pipeline rank 1 (GPUs 16..31 are hosts 2, 3): fewer reuses than without
    assert timer.reused < plain.reused
    # the degraded NIC slows rank 1's DP collective: reuse did not copy rank 0's time
    dp = [call for call in _calls(64, 4, 4) if call[0] == "reduce_scatter"]
    assert timer(*dp[1]) > timer(*dp[0])


def test_servers_linked_directly_are_not_twins():
    # a ring of single-GPU hosts: every host links to two other hosts' GPUs
    c = explicit_cluster("ring", 8, GPUS["A100-80GB"], 25e9, 1e-6)
    classes = c.host_classes()
    assert classes is not None and len(set(classes)) == 8
    timer = _check(c, tp=2, pp=2)
    assert timer.reused == 0


def test_hash_ecmp_routes_are_timed_not_shifted():
    # one GPU per host, two leaves of 8 behind 2 spines (4:1): servers under one leaf are
    # twins, but hash ECMP spreads the cross-leaf pairs of each shifted copy differently
    graph = fat_tree(16, 25e9, 1e-6, gpus_per_leaf=8, oversubscription=4.0)
    c = Cluster("hash-ecmp", graph, GPUS["A100-80GB"], 1, ecmp="hash")
    assert c.host_classes() == (0,) * 8 + (1,) * 8
    timer = CollectiveTimer(c)
    times = []
    for s in range(7):
        pairs = ((s, 8 + s), (s + 1, 9 + s))
        got = timer("send", pairs, 16 * MiB)
        assert got == CollectiveTimer(c)._time("send", pairs, 16 * MiB)
        times.append(got)
    assert len(set(times)) > 1  # the copies differ: reusing the first would be wrong
    assert timer.reused == 0


def test_timeline_known_summaries():
    from sim.timeline import MemorySample, Span, Timeline

    spans = (Span(0, "compute", "F", "1F0", 0.0, 2.0), Span(1, "compute", "F", "1F0", 1.0, 3.5))
    memory = (MemorySample(0, 0.0, 5.0), MemorySample(0, 1.0, 7.0), MemorySample(1, 0.0, 2.0))
    plain = Timeline(2, spans, (), memory)
    lazy = Timeline.known(2, spans, (), memory)
    assert "end_s" not in lazy.__dict__ and lazy == plain
    known = Timeline.known(2, spans, (), memory, end_s=3.5,
                           peak_memory_by_gpu={0: 7.0, 1: 2.0})
    assert known == plain and known.end_s == plain.end_s == 3.5
    assert known.peak_memory_by_gpu == plain.peak_memory_by_gpu == {0: 7.0, 1: 2.0}
    assert known.peak_memory_bytes(1) == 2.0


# ----------------------------------------------------------------------------- against the engine

TIMER_CLUSTERS = (
    {"preset": "dgx-a100-80g"},
    {"preset": "dgx-h100"},
    {"preset": "dgx-a100-80g", "nics_per_node": 2},
    {"preset": "dgx-a100-80g", "topology": "fat-tree", "gpus_per_leaf": 8,
     "oversubscription": 2.0},
    {"preset": "dgx-a100-80g", "collective_granularity": "step", "collective_step_us": 2.0},
    {"preset": "dgx-h100", "collectives": {"all_reduce": "tree", "all_gather": "ring",
                                           "reduce_scatter": "hierarchical"}},
    {"preset": "dgx-a100-80g", "collective_protocol": "ll", "collectives": {"all_reduce": "tree"}},
    {"preset": "dgx-h100", "collective_protocol": "ll128", "nics_per_node": 4},
    {"preset": "dgx-a100-80g", "collectives": {"all_reduce": "halving_doubling",
                                               "reduce_scatter": "halving_doubling"}},
    {"topology": "switch", "gpus_per_node": 4, "link_bandwidth_GBps": 25.0,
     "link_latency_us": 1.0, "collective_step_us": 0.5},
    {"topology": "ring", "link_bandwidth_GBps": 50.0, "link_latency_us": 2.0},
    {"topology": "torus2d", "link_bandwidth_GBps": 50.0, "link_latency_us": 1.0},
    {"topology": "full-mesh", "link_bandwidth_GBps": 100.0, "link_latency_us": 2.0,
     "collective_launch_us": 8.4},
    {"topology": "fat-tree", "link_bandwidth_GBps": 10.0, "gpus_per_leaf": 2},
    {"topology": "fat-tree", "link_bandwidth_GBps": 10.0, "gpus_per_leaf": 4,
     "oversubscription": 4.0, "ecmp": "hash"},
)
"""Server presets (NVSwitch + NICs; NVLS; shared NICs; an oversubscribed fabric; step
granularity; every algorithm override; the LL and LL128 protocols, multi-channel trees)
and explicit graphs (ring and torus links shared by neighbours' flows, ECMP over spines)."""


def _cluster(spec: dict, num_gpus: int) -> Cluster:
    if spec.get("topology") == "torus2d":
        spec = {**spec, "dims": [4, num_gpus // 4]}
    return Experiment.from_dict({
        "name": "timer", "model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 2.0}},
        "cluster": {**spec, "num_gpus": num_gpus}, "parallel": {"dp": num_gpus},
        "training": {"micro_batch_size": 1, "num_microbatches": 1}}).cluster


def engine_time(cluster: Cluster, op: str, groups: tuple[tuple[int, ...], ...],
                nbytes: float, algo: str = "auto") -> float:
    """The engine's time for every group running ``op`` (or sending, pairwise) at once: a
    program of just these collectives, simulated with flows (the full fidelity's path)."""
    b = ProgramBuilder()
    for group in groups:
        if op == "send":
            b.send(group[0], group[1], nbytes, "pp", "send", ())
        else:
            b.collective(group, {}, kind="dp", name=op, op=op, nbytes=nbytes, algo=algo)
    n = cluster.num_gpus
    return simulate_program(Program(n, b.build(), (0.0,) * n, gpipe(1, 1)), cluster,
                            lambda _: 0.0).end_s


@st.composite
def _timer_case(draw: st.DrawFn) -> tuple[dict, int, str, tuple[tuple[int, ...], ...], float]:
    """A cluster, an op, disjoint groups (a layout's strided replicas, consecutive blocks or
    a random partition) and a size."""
    spec = draw(st.sampled_from(TIMER_CLUSTERS))
    n = draw(st.sampled_from([8, 16, 32]))
    op = draw(st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                               "send"]))
    size = 2 if op == "send" else draw(st.sampled_from([2, 4, 8]))
    count = draw(st.integers(1, n // size))
    shape = draw(st.sampled_from(["strided", "blocks", "random"]))
    groups = disjoint_groups(draw, n, size, count, shape)
    nbytes = draw(st.sampled_from([1e3, 64e3, 1.5e6, 256e6]))
    return spec, n, op, tuple(groups), nbytes


@settings(max_examples=120, deadline=None, derandomize=True)
@given(_timer_case())
def test_timer_equals_the_flow_simulation(case) -> None:
    """``CollectiveTimer(op, groups, nbytes)`` is the engine's flow simulation of the same
    concurrent collectives to 1e-12 relative (the timer's claim: same plans, latencies and
    max-min network; one of several disjoint replicas simulated; timings reused across
    servers only where provably the same float). 120 cases over 15 clusters, five ops,
    1-16 groups of 2-8 GPUs laid out strided, in blocks or at random, 1 kB - 256 MB; each
    timed once fresh and once after its copy shifted by half the cluster (reuse)."""
    spec, n, op, groups, nbytes = case
    cluster = _cluster(spec, n)
    algo = "pairwise" if op == "all_to_all" else "auto"
    want = engine_time(cluster, op, groups, nbytes, algo)
    timer = CollectiveTimer(cluster, algo)
    assert math.isclose(timer(op, groups, nbytes), want, rel_tol=1e-12), (op, groups)
    shifted = tuple(tuple((r + n // 2) % n for r in g) for g in groups)
    timer(op, shifted, nbytes)  # the shifted copy first: the original may now be reused
    again = CollectiveTimer(cluster, algo)
    again(op, shifted, nbytes)
    assert math.isclose(again(op, groups, nbytes), want, rel_tol=1e-12), (op, groups)
