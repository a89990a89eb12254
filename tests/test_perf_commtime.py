"""Reuse of collective timings across servers (sim.commtime): exactly the per-group floats.

:class:`sim.commtime.CollectiveTimer` reuses the timing of groups shifted by whole
servers when the servers are twins and every route consulted is the only shortest
path. Each test times every pipeline rank's TP, DP and send groups (the calls a
collapsed lowering makes) with one timer and, as the oracle, each call on a fresh
timer that never reuses (``_time``), and requires the same floats bit for bit;
then checks reuse did (or did not) happen where it must.
"""

from __future__ import annotations

from sim.commtime import CollectiveTimer
from topologies.cluster import Cluster
from topologies.graphs import Fabric, fat_tree
from topologies.hardware import GPUS
from topologies.presets import explicit_cluster, mixed_server_cluster, server_cluster

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
