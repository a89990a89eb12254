"""Plans shared across a cluster's symmetric groups (``CollectiveTimer._plans``) against
:func:`sim.selection.collective_plan` per group, and the check behind them
(:meth:`topologies.cluster.Cluster.locals_interchangeable`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.commtime import CollectiveTimer
from sim.experiment import Experiment
from sim.selection import collective_plan
from tests.strategies import disjoint_groups
from topologies.cluster import Cluster
from topologies.graphs import Fabric
from topologies.presets import server_cluster

CLASS_CLUSTERS = (
    {"preset": "dgx-a100-80g"},
    {"preset": "dgx-h100"},
    {"preset": "dgx-a100-80g", "nics_per_node": 2},
    {"preset": "dgx-a100-80g", "nics_per_node": 8, "topology": "fat-tree", "gpus_per_leaf": 16,
     "oversubscription": 2.0},
    {"preset": "dgx-a100-80g", "topology": "fat-tree", "gpus_per_leaf": 8,
     "oversubscription": 2.0},
    {"preset": "dgx-a100-80g", "topology": "fat-tree", "gpus_per_leaf": 4},
    {"preset": "dgx-a100-80g", "topology": "rail-optimized", "gpus_per_leaf": 2},
    {"preset": "dgx-a100-80g", "collective_granularity": "step", "collective_step_us": 2.0},
    {"preset": "dgx-h100", "collectives": {"all_reduce": "tree", "all_gather": "ring",
                                           "reduce_scatter": "hierarchical"}},
    {"preset": "dgx-a100-80g", "collective_protocol": "ll", "collectives": {"all_reduce": "tree"}},
    {"preset": "dgx-h100", "collective_protocol": "ll128", "nics_per_node": 4},
    {"preset": "dgx-a100-80g", "collectives": {"all_reduce": "halving_doubling",
                                               "reduce_scatter": "halving_doubling"}},
    {"preset": "dgx-a100-80g", "ecmp": "hash", "topology": "fat-tree", "gpus_per_leaf": 8},
    {"topology": "switch", "gpus_per_node": 4, "link_bandwidth_GBps": 25.0,
     "link_latency_us": 1.0, "collective_step_us": 0.5},
    {"topology": "fat-tree", "link_bandwidth_GBps": 10.0, "gpus_per_leaf": 2},
    {"topology": "ring", "link_bandwidth_GBps": 50.0, "link_latency_us": 2.0},
)
"""Servers whose GPUs are interchangeable (DGX on a crossbar or under one leaf, NVLS,
step granularity, protocol and algorithm overrides, hash ECMP) and servers whose are not
(shared NICs, NICs on several leaves or rails), and graphs of one GPU per host."""


def _cluster(spec: dict, num_gpus: int) -> Cluster:
    return Experiment.from_dict({
        "name": "classes", "model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 2.0}},
        "cluster": {**spec, "num_gpus": num_gpus}, "parallel": {"dp": num_gpus},
        "training": {"micro_batch_size": 1, "num_microbatches": 1}}).cluster


@st.composite
def _case(draw: st.DrawFn) -> tuple[dict, int, str, tuple[tuple[int, ...], ...], float]:
    spec = draw(st.sampled_from(CLASS_CLUSTERS))
    n = draw(st.sampled_from([16, 32]))
    op = draw(st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]))
    size = draw(st.sampled_from([2, 4, 8]))
    count = draw(st.integers(1, n // size))
    shape = draw(st.sampled_from(["strided", "blocks", "random", "images"]))
    if shape == "images":  # one group and its images under random local permutations
        first = draw(st.permutations(range(n)))[:size]
        groups = []
        used: set[int] = set()
        gpn = 8 if "preset" in spec else (4 if spec["topology"] == "switch" else 1)
        for _ in range(count):
            perm = draw(st.permutations(range(gpn)))
            shift = draw(st.integers(0, n // gpn - 1)) * gpn
            g = tuple((r // gpn * gpn + perm[r % gpn] + shift) % n for r in first)
            if used.isdisjoint(g):
                used |= set(g)
                groups.append(g)
    else:  # strided (DP groups: one class on symmetric servers), blocks (TP), random
        groups = disjoint_groups(draw, n, size, count, shape)
    nbytes = draw(st.sampled_from([1e3, 64e3, 1.5e6, 256e6]))
    return spec, n, op, tuple(groups), nbytes


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_case())
def test_shared_plans_are_collective_plans(case) -> None:
    """Every plan ``_plans`` hands out, shared or not, is ``collective_plan``'s for its group
    (transfer for transfer, launch, algorithm, protocol), and the timer's time is the float
    of a timer that plans every group (twice: the second call finds the classes kept)."""
    spec, n, op, groups, nbytes = case
    cluster = _cluster(spec, n)
    algo = "pairwise" if op == "all_to_all" else "auto"
    timer = CollectiveTimer(cluster, algo)
    live = [g for g in groups if len(g) > 1]
    for _ in range(2):
        got = timer.plans(op, live, nbytes)
        want = [collective_plan(cluster, op, algo, g, nbytes) for g in live]
        assert got == want, (op, groups)
    plain = CollectiveTimer(cluster, algo, share_plans=False)
    assert timer(op, groups, nbytes) == plain(op, groups, nbytes)
    assert plain.shared_plans == 0


def test_dgx_groups_of_one_layout_share_one_plan() -> None:
    """The DP groups of TP x DP on DGX A100 servers (a crossbar): one plan, the others
    relabelled; the same float as planning each."""
    c = server_cluster("dgx-a100-80g", 128)
    assert c.locals_interchangeable(0)
    groups = tuple(tuple(t + 4 * d for d in range(32)) for t in range(4))
    timer = CollectiveTimer(c)
    plain = CollectiveTimer(c, share_plans=False)
    assert timer("reduce_scatter", groups, 2.0 ** 30) == plain("reduce_scatter", groups,
                                                                2.0 ** 30)
    assert timer.shared_plans == 3


def test_locals_interchangeable() -> None:
    assert server_cluster("dgx-a100-80g", 64).locals_interchangeable(3)
    assert server_cluster("dgx-h100", 64).locals_interchangeable(0)
    # NICs of a server under one leaf: interchangeable; on two leaves or rails: not
    assert server_cluster("dgx-a100-80g", 64, Fabric(kind="fat-tree", gpus_per_leaf=16,
                                                     oversubscription=2.0)
                          ).locals_interchangeable(0)
    assert not server_cluster("dgx-a100-80g", 64, Fabric(kind="fat-tree", gpus_per_leaf=4)
                              ).locals_interchangeable(0)
    assert not server_cluster("dgx-a100-80g", 64, Fabric(kind="rail-optimized")
                              ).locals_interchangeable(0)
    # a NIC shared by two GPUs: GPUs 0 and 1 share one, 1 and 2 do not
    assert not server_cluster("dgx-a100-80g", 64, nics_per_node=4).locals_interchangeable(0)
    # a degraded NIC link makes its server's GPUs differ (and the server a class of its own)
    base = server_cluster("dgx-a100-80g", 64)
    c = base.with_link_changes({("host2/nic1", "fabric"): 0.25})
    assert not c.locals_interchangeable(2) and c.locals_interchangeable(0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(CLASS_CLUSTERS), st.sampled_from([16, 32]), st.data())
def test_translated_routes_are_the_searched_ones(spec, n, data) -> None:
    """Every route :meth:`Cluster.route` maps from a model pair of its pattern equals the
    searched one (links, latency) and is as unique, over pairs in a random order (so the
    model pairs differ) on clusters with and without interchangeable GPUs."""
    cluster = _cluster(spec, n)
    plain = _cluster(spec, n)
    plain.translate_routes = False
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                               min_size=1, max_size=60))
    for a, b in pairs:
        assert cluster.route(a, b) == plain.route(a, b), (a, b)
        assert cluster.route_is_unique(a, b) == plain.route_is_unique(a, b), (a, b)


def test_dgx_routes_are_mapped() -> None:
    """On DGX servers over a crossbar one model route per pattern is searched; every other
    pair's is mapped, and equals the search's."""
    c = server_cluster("dgx-a100-80g", 64)
    plain = server_cluster("dgx-a100-80g", 64)
    plain.translate_routes = False
    for a in range(64):
        for b in range(64):
            assert c.route(a, b) == plain.route(a, b)
    assert c.route_is_unique(0, 63) and c.route_is_unique(0, 1)
    assert len(c._route_models) == 2  # one server, two servers


def test_routes_to_no_gpu_still_raise() -> None:
    """A rank outside the cluster is refused as before, mapped routes or not (a negative
    one would otherwise index the last server)."""
    import pytest

    from base.errors import TopologyError

    c = server_cluster("dgx-a100-80g", 16)
    c.route(0, 9)  # a model route for the two-server pattern
    for bad in (16, 99, -1, -8):
        with pytest.raises(TopologyError, match="no GPU"):
            c.route(0, bad)
        with pytest.raises(TopologyError, match="no GPU"):
            c.route(bad, 1)
