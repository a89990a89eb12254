"""Collective algorithms on the flow-level engine: closed forms, busbw, contention, selection."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import ConfigError
from sim.collectives import (
    ALGORITHMS_BY_OP,
    alpha_beta_time,
    btree,
    bus_bandwidth,
    dtree,
    plan,
    ring_channels,
    tree_shape,
)
from sim.config import parse_config
from sim.engine import simulate_program
from sim.protocols import bandwidth_fraction
from sim.selection import (
    AUTO_EXCLUDED,
    candidates,
    estimate,
    group_profile,
    plan_cost,
    protocol_choices,
    select_algorithm,
)
from topologies.build import build_cluster
from topologies.cluster import Cluster
from topologies.hardware import GPUS
from topologies.presets import SERVERS, CollectiveSettings, explicit_cluster, server_cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

A100 = GPUS["A100-80GB"]
REL = 1e-9
GiB = 2**30

SWITCH_CASES = [("all_reduce", "ring"), ("reduce_scatter", "ring"), ("all_gather", "ring"),
                ("all_reduce", "halving_doubling"), ("all_to_all", "pairwise"),
                ("broadcast", "ring"), ("reduce", "ring"), ("send", "p2p")]
"""(op, algo) pairs that are contention-free on a single switch (one flow per port per step)."""


def _cluster(topology: str, n: int, B: float, lat: float, granularity: str = "stream",
             protocol: str = "simple", **shape: object) -> Cluster:
    return explicit_cluster(topology, n, A100, B, lat,
                            collectives=CollectiveSettings(granularity=granularity,
                                                           protocol=protocol), **shape)


def _ends(cluster: Cluster, collectives: list[tuple]) -> dict[str, float]:
    """Run collectives ``(name, kind, op, algo, group, nbytes)`` at once; end time per name."""
    b = ProgramBuilder()
    for name, kind, op, algo, group, nbytes in collectives:
        if op == "send_p2p":
            b.send(group[0], group[1], nbytes, kind, name, ())
        else:
            b.collective(tuple(group), {}, kind=kind, name=name, op=op, nbytes=nbytes, algo=algo)
    n = cluster.num_gpus
    tl = simulate_program(Program(n, b.build(), (0.0,) * n, gpipe(1, 1)), cluster, lambda _: 0.0)
    ends: dict[str, float] = {}
    for span in tl.spans:
        ends[span.name] = max(ends.get(span.name, 0.0), span.end_s)
    return ends


def _time(cluster: Cluster, op: str, algo: str, group, nbytes: float) -> float:
    group = (group[0], group[-1]) if op == "send" else tuple(group)
    return _ends(cluster, [("c", "dp", op, algo, group, nbytes)])["c"]


# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize("protocol", ["simple", "ll128", "ll"])
@pytest.mark.parametrize("granularity", ["stream", "step"])
@pytest.mark.parametrize(("op", "algo"), SWITCH_CASES)
@pytest.mark.parametrize("n", [2, 3, 4, 6, 8, 16])
def test_closed_forms_on_a_switch(protocol: str, granularity: str, op: str, algo: str,
                                  n: int) -> None:
    """On one switch every GPU-GPU route is 2 hops: α = 2·hop latency, B = the link rate;
    under LL and LL128 (ring, and the broadcast/reduce chains) α scales by NCCL's ratio of
    network latencies and B by the protocol's fraction (every GPU is its own server)."""
    if algo == "halving_doubling" and op != "all_reduce" and n & (n - 1):
        pytest.skip("power-of-two only")
    B, lat, S = 25e9, 1.5e-6, 3.3e8
    cluster = _cluster("switch", n, B, lat, granularity, protocol)
    t = _time(cluster, op, algo, range(n), S)
    assert t == pytest.approx(alpha_beta_time(op, algo, n, S, 2 * lat, B, protocol=protocol,
                                              inter_node=True), rel=REL)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [4, 8, 16])
def test_halving_doubling_reduce_scatter_all_gather(op: str, n: int) -> None:
    B, lat, S = 50e9, 2e-6, 1e9
    t = _time(_cluster("switch", n, B, lat), op, "halving_doubling", range(n), S)
    k = int(math.log2(n))
    assert t == pytest.approx(k * 2 * lat + (n - 1) / n * S / B, rel=REL)


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12])
def test_halving_doubling_folds_non_powers_of_two(n: int) -> None:
    """Fold the n − 2^k excess ranks in and out: + 2(α + S/B) (Thakur et al. 2005)."""
    B, alpha, S = 25e9, 2e-6, 1e8
    pw = 1 << (n.bit_length() - 1)
    t = _time(_cluster("switch", n, B, alpha / 2), "all_reduce", "halving_doubling", range(n), S)
    expected = (2 * math.log2(pw) * alpha + 2 * (pw - 1) / pw * S / B + 2 * (alpha + S / B))
    assert t == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("granularity", ["stream", "step"])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize(("n1", "n2"), [(4, 2), (8, 4), (2, 3), (1, 4), (4, 1)])
def test_hierarchical_matches_references_formula(granularity: str, op: str, n1: int,
                                                 n2: int) -> None:
    """REFERENCES.md: 2(n1−1)α1 + 2(n2−1)α2 + 2(n1−1)/n1·S/B1 + 2(n2−1)/n2·S/(n1·B2)."""
    B1, B2, nv_lat, lat, S = 300e9, 25e9, 1.7e-6, 2.4e-6, 2e9
    n = n1 * n2
    shape = {"gpus_per_node": n1, "nvlink_bandwidth_Bps": B1, "nvlink_latency_s": nv_lat}
    cluster = _cluster("switch", n, B2, lat, granularity, **shape)
    t = _time(cluster, op, "hierarchical", range(n), S)
    # intra: gpu-nvswitch-gpu; inter: gpu-nic-fabric-nic-gpu (gpu-switch-gpu without servers)
    inter = 4 * lat if n1 > 1 else 2 * lat
    expected = alpha_beta_time(op, "hierarchical", n, S, 2 * nv_lat, B1, gpus_per_node=n1,
                               alpha_inter=inter, bandwidth_inter=B2)
    assert t == pytest.approx(expected, rel=REL)
    if op == "all_reduce":
        refs = (2 * (n1 - 1) * 2 * nv_lat + 2 * (n2 - 1) * inter
                + 2 * (n1 - 1) / n1 * S / B1 + 2 * (n2 - 1) / n2 * S / (n1 * B2))
        assert t == pytest.approx(refs, rel=REL)


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                "reduce"])
@pytest.mark.parametrize("n", [2, 4, 8, 72])
def test_nvls_closed_form(op: str, n: int) -> None:
    """Up to the NVSwitch and back: all-reduce 2α_h + F + S/B, where 2α_h is one GPU-GPU
    step and F NCCL's chunk pipeline filling: two loops of 16 channels × n heads × 64 KiB
    (1e9 B is below 64 loops of 128 KiB chunks, src/enqueue.cc) at B."""
    B, hop, S = 450e9, 1.7e-6, 1e9
    cluster = _cluster("switch", n, 50e9, 1e-6, gpus_per_node=n, nvlink_bandwidth_Bps=B,
                       nvlink_latency_s=hop, nvls=True)
    t = _time(cluster, op, "nvls", range(n), S)
    assert t == pytest.approx(alpha_beta_time(op, "nvls", n, S, hop, B), rel=REL)
    if op == "all_reduce":
        chunk = 65536 if S < 64 * 16 * min(n, 32) * 131072 else 131072
        assert t == pytest.approx(2 * hop + 2 * min(S, 16 * min(n, 32) * chunk) / B + S / B,
                                  rel=REL)


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("m", [2, 3, 5])
@pytest.mark.parametrize("B2", [25e9, 400e9])
@pytest.mark.parametrize("share", [1, 2])
def test_nvls_tree_closed_form(k: int, m: int, B2: float, share: int) -> None:
    """NVLSTree on m servers of k GPUs (k/share NICs each, a crossbar between), one head per
    NIC as NCCL's search makes them (src/graph/search.cc, ncclTopoSearchRecNet: an NVLS
    graph takes one head per NIC, its localGpu, while nChannels < netCount): h = k/share
    heads, max(4α_h + 2Hα2 + S'/B1, 2α_h + 2Hα2 + L·S'/(2h·B2)), S' = S + NCCL's chunk
    pipeline fill (three loops of 16 channels × h heads × 128 KiB on 2-3 servers, 64 KiB
    from 4 on, cut below 32, 16 and 4 loops' worth: src/enqueue.cc), whether the NICs
    (25 GB/s) or the NVSwitch ports (400 GB/s NICs) are the bottleneck."""
    B1, hop, lat, S = 450e9, 1.7e-6, 2.4e-6, 1e9
    n, h = k * m, k // share
    cluster = _cluster("switch", n, B2, lat, gpus_per_node=k, nvlink_bandwidth_Bps=B1,
                       nvlink_latency_s=hop, nvls=True, nics_per_node=h)
    t = _time(cluster, "all_reduce", "nvls_tree", range(n), S)
    alpha2 = 4 * lat  # gpu-nic-fabric-nic-gpu (with shared NICs: gpu-pcie-nic, 0 s PCIe-NIC)
    assert t == pytest.approx(alpha_beta_time("all_reduce", "nvls_tree", n, S, hop, B1,
                                              gpus_per_node=k, alpha_inter=alpha2,
                                              bandwidth_inter=B2, nics_per_node=h), rel=REL)
    height, load = tree_shape(m)
    chunk = 131072 if m < 4 else 65536
    concurrent = 16 * h
    for factor, smaller in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
        if S < factor * concurrent * chunk and chunk > smaller:
            chunk = smaller
    S2 = S + 3 * min(S, concurrent * chunk)
    expected = max(4 * hop + 2 * height * alpha2 + S2 / B1,
                   2 * hop + 2 * height * alpha2 + load * S2 / (2 * h * B2))
    assert t == pytest.approx(expected, rel=REL)


def test_nvls_tree_is_auto_across_dgx_h100_and_needs_nvls_servers() -> None:
    """Two DGX H100 (eight 400 Gb/s NICs each): auto takes NVLSTree for a 1 GiB all-reduce
    (NVLS inside the servers, one tree per NIC between them), as NCCL does, and its busbw
    exceeds the ring's; it is no candidate inside one server, on A100 (no NVLS) or with
    one GPU per server, and asking for it there is a ConfigError."""
    h100 = server_cluster("dgx-h100", 16)
    group = tuple(range(16))
    profile = group_profile(h100, group)
    assert "nvls_tree" in candidates("all_reduce", profile)
    assert select_algorithm("all_reduce", GiB, profile) == "nvls_tree"
    busbw = {a: bus_bandwidth("all_reduce", 16, GiB, _time(h100, "all_reduce", a, group,
                                                           GiB))[1]
             for a in ("nvls_tree", "ring")}
    assert busbw["nvls_tree"] > 1.2 * busbw["ring"]
    a100 = server_cluster("dgx-a100-80g", 16)
    for cluster, ranks in ((h100, tuple(range(8))), (a100, group), (h100, (0, 8))):
        assert "nvls_tree" not in candidates("all_reduce", group_profile(cluster, ranks))
        with pytest.raises(ConfigError, match="nvls_tree"):
            _time(cluster, "all_reduce", "nvls_tree", ranks, GiB)


def test_a3_mega_runs_nccl_as_googles_tcpxo_environment_does() -> None:
    """Two A3 Mega VMs (GPUDirect-TCPXO): Simple only (NCCL_PROTO=Simple), no NVLS or
    NVLSTree (NCCL_NVLS_ENABLE=0), and Google's tuner takes the tree for all-reduce at every
    size, also at 64 MiB where the cost model would take the ring; on four VMs the tuner's
    rule stops at 2 MiB and the cost model chooses again."""
    from sim.selection import choose
    two = server_cluster("a3-mega", 16)
    assert two.collective_protocol == "simple"
    assert CollectiveSettings(protocol="ll").cluster_kwargs(0.0, "simple")[
        "collective_protocol"] == "ll"  # the file's own choice wins
    profile = group_profile(two, tuple(range(16)))
    assert candidates("all_reduce", profile) == ("ring", "tree")
    assert protocol_choices("tree", two.collective_protocol) == ("simple",)
    size = 64 * 2**20
    assert plan_cost("all_reduce", "ring", "simple", profile).time_s(size) < plan_cost(
        "all_reduce", "tree", "simple", profile).time_s(size)
    assert choose("all_reduce", "auto", size, profile)[:2] == ("tree", "simple")
    assert select_algorithm("all_gather", size, profile) == "ring"
    four = group_profile(server_cluster("a3-mega", 32), tuple(range(32)))
    assert select_algorithm("all_reduce", 2**20, four) == "tree"
    assert select_algorithm("all_reduce", GiB, four) == "ring"


def test_transport_tuner_rules() -> None:
    """Google's A3 Mega tuner rules as data: two VMs of 8 GPUs, all-reduce, any size; 3-6
    VMs below 2 MiB; nothing for fewer GPUs a VM, other ops or 7 VMs and more."""
    from sim.transports import buffsize, tuner_algorithm
    assert buffsize("tcpxo") == 8 * 2**20
    assert tuner_algorithm("tcpxo", "all_reduce", 2, 8, 8 * GiB) == "tree"
    assert tuner_algorithm("tcpxo", "all_reduce", 6, 8, 2**21 - 1) == "tree"
    assert tuner_algorithm("tcpxo", "all_reduce", 6, 8, 2**21) is None
    assert tuner_algorithm("tcpxo", "all_reduce", 7, 8, 1.0) is None
    assert tuner_algorithm("tcpxo", "all_reduce", 2, 4, 1.0) is None
    assert tuner_algorithm("tcpxo", "all_gather", 2, 8, 1.0) is None


def test_tree_chunk_pipeline_on_a_transport_that_fixes_the_buffer() -> None:
    """On A3 Mega (NCCL_BUFFSIZE 8 MiB: 1 MiB chunks) every tree of a Simple tree
    all-reduce carries NCCL's depth (7 + log2 2 = 8) chunks on top of its share, 16 trees
    over two VMs; the estimate auto uses is the simulated time; on InfiniBand servers (the
    buffer not fixed) the chunk is a step of NCCL's default 4 MiB buffer, 512 KiB."""
    from sim import treepipe
    from sim.commtime import CollectiveTimer
    from sim.selection import collective_plan, tree_pipeline
    assert (treepipe.depth(8, 2), treepipe.depth(8, 5), treepipe.depth(8, 1)) == (8, 9, 7)
    assert treepipe.chunk_bytes(8 * 2**20) == 2**20
    assert treepipe.fill_bytes(2**30, 8, 16 * 2**20) == 8 * 16 * 2**20
    assert treepipe.fill_bytes(2**20, 8, 16 * 2**20) == 8 * 2**20
    cluster = server_cluster("a3-mega", 16)
    group = tuple(range(16))
    S = 64 * 2**20
    fill = 8 * 16 * 2**20
    got = collective_plan(cluster, "all_reduce", "tree", group, S)
    wire = bandwidth_fraction("tree", "simple", True)
    assert max(t.nbytes for t in got.transfers) == pytest.approx((S + fill) / 16 / wire)
    profile = group_profile(cluster, group)
    for size in (S, GiB):
        assert plan_cost("all_reduce", "tree", "simple", profile).time_s(size) == pytest.approx(
            CollectiveTimer(cluster, "tree")("all_reduce", (group,), size), rel=1e-9)
    h100 = server_cluster("dgx-h100", 16)
    assert tree_pipeline(h100, group, {r: h100.host_of(r) for r in group}) == (8, 16 * 2**19)


def test_infiniband_tree_pays_the_fill_of_nccls_default_buffer() -> None:
    """NCCL's tree pipeline is the algorithm's, not the transport's: on InfiniBand servers
    (no NCCL_BUFFSIZE fixed) a Simple tree all-reduce carries depth (7 + log2 2 = 8) chunks
    of a 512 KiB step (NCCL's default 4 MiB buffer, src/init.cc DEFAULT_BUFFSIZE) on each of
    its 16 trees over two DGX H100s; under LL128 (lines forwarded as their flags arrive) it
    carries none. The estimate auto uses is the simulated time."""
    from sim import treepipe
    from sim.commtime import CollectiveTimer
    from sim.selection import collective_plan
    assert treepipe.buffsize() == 4 * 2**20 and treepipe.chunk_bytes(treepipe.buffsize()) == 2**19
    S, fill = 64 * 2**20, 8 * 16 * 2**19
    group = tuple(range(16))
    for proto, extra in (("simple", fill), ("ll128", 0.0)):
        cluster = server_cluster("dgx-h100", 16, collectives=CollectiveSettings(protocol=proto))
        got = collective_plan(cluster, "all_reduce", "tree", group, S)
        wire = bandwidth_fraction("tree", proto, True)
        assert max(t.nbytes for t in got.transfers) == pytest.approx((S + extra) / 16 / wire)
        profile = group_profile(cluster, group)
        for size in (S, GiB):
            assert plan_cost("all_reduce", "tree", proto, profile).time_s(size) == pytest.approx(
                CollectiveTimer(cluster, "tree")("all_reduce", (group,), size), rel=1e-9)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13, 16, 32])
def test_double_binary_tree_closed_form_terms(n: int) -> None:
    """2·H·α + L·(S/2)/(f·B): exact with no latency (bandwidth term, single-port switch) and
    with infinite bandwidth (latency term); in between it bounds the flow-level time. f is
    the tree's Simple fraction of the links' rate (NCCL's 0.92, sim.protocols). S is the
    buffer plus the chunk pipeline's fill (sim.treepipe: depth log2 n loops of a 512 KiB
    chunk on each of the two trees, NCCL's default buffer)."""
    from sim import treepipe
    height, load = tree_shape(n)
    B, lat, S = 25e9, 1e-6, 1e8
    S += treepipe.fill_bytes(S, (n).bit_length() - 1, 2 * 2**19)
    f = bandwidth_fraction("tree", "simple", True)
    bw_only = _time(_cluster("switch", n, B, 0.0), "all_reduce", "tree", range(n), 1e8)
    assert bw_only == pytest.approx(load * (S / 2) / (f * B), rel=REL)
    lat_only = _time(_cluster("switch", n, math.inf, lat), "all_reduce", "tree", range(n), 1e8)
    assert lat_only == pytest.approx(2 * height * 2 * lat, rel=REL)
    both = _time(_cluster("switch", n, B, lat), "all_reduce", "tree", range(n), 1e8)
    assert max(bw_only, lat_only) <= both * (1 + REL)
    assert both <= alpha_beta_time("all_reduce", "tree", n, S, 2 * lat, B) * (1 + REL)


def test_nccl_btree_and_dtree_shapes() -> None:
    """NCCL's trees.cc illustration for 14 ranks: 0 - 8, 8 -> 4, 12; 12 -> 10, 13."""
    assert btree(14, 0) == (-1, (8,))
    assert btree(14, 8) == (0, (4, 12))
    assert btree(14, 12) == (8, (10, 13))
    assert btree(14, 13) == (12, ())
    for n in range(1, 70):
        for tree in dtree(n):
            assert sum(parent < 0 for parent, _ in tree.values()) == 1
            for r, (_, children) in tree.items():
                assert all(tree[c][0] == r for c in children)
        first, second = dtree(n)
        if n > 2 and n % 2 == 0:  # each rank is an inner node of at most one tree
            assert all(not (first[r][1] and second[r][1]) for r in range(n))
    assert tree_shape(8) == (3, 4) and tree_shape(1024) == (10, 4)


def test_nccl_dtree_mirrors_even_and_shifts_odd() -> None:
    """ncclGetDtree's second tree (trees.cc illustrations): for 12 ranks the mirror image
    (root 11 -> 3), for 13 ranks the btree shifted by one (root 1 -> 9; 9 -> 5, 0). With the
    two swapped, odd n had a rank
    that sends 6 flows over both trees instead of 4 (tree_shape's load)."""
    assert dtree(12)[1][11] == (-1, (3,)) and dtree(12)[1][3] == (11, (1, 7))
    assert dtree(13)[1][1] == (-1, (9,)) and dtree(13)[1][9] == (1, (0, 5))
    assert tree_shape(5)[1] == 4


def test_step_latency_and_launch_latency() -> None:
    n, B, lat, S, step, launch = 4, 10e9, 1e-6, 4e8, 3e-6, 8.4e-6
    cluster = explicit_cluster("switch", n, A100, B, lat, launch,
                               collectives=CollectiveSettings(step_s=step))
    t = _time(cluster, "all_reduce", "ring", range(n), S)
    assert t == pytest.approx(launch + 2 * (n - 1) * (2 * lat + step) + 2 * (n - 1) / n * S / B,
                              rel=REL)


# ---------------------------------------------------------------- differential (flow vs α-β)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SWITCH_CASES), st.integers(2, 12), st.floats(1.0, 1e10),
       st.floats(0.0, 1e-4), st.floats(1e8, 1e12), st.sampled_from(["stream", "step"]))
def test_flow_level_agrees_with_alpha_beta_where_nothing_contends(
        case: tuple[str, str], n: int, S: float, hop: float, B: float, gran: str) -> None:
    op, algo = case
    if algo == "halving_doubling" and op != "all_reduce" and n & (n - 1):
        return
    t = _time(_cluster("switch", n, B, hop, gran), op, algo, range(n), S)
    assert t == pytest.approx(alpha_beta_time(op, algo, n, S, 2 * hop, B), rel=REL, abs=1e-15)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.floats(1e3, 1e10), st.floats(0.0, 1e-5),
       st.floats(1e9, 1e11), st.sampled_from(["all_reduce", "reduce_scatter", "all_gather"]))
def test_hierarchical_flow_vs_alpha_beta(n1: int, n2: int, S: float, lat: float, B2: float,
                                         op: str) -> None:
    n = n1 * n2
    if n < 2:
        return
    shape = {"gpus_per_node": n1, "nvlink_bandwidth_Bps": 8 * B2, "nvlink_latency_s": lat / 2}
    t = _time(_cluster("switch", n, B2, lat, **shape), op, "hierarchical", range(n), S)
    expected = alpha_beta_time(op, "hierarchical", n, S, lat, 8 * B2, gpus_per_node=n1,
                               alpha_inter=4 * lat if n1 > 1 else 2 * lat, bandwidth_inter=B2)
    assert t == pytest.approx(expected, rel=REL, abs=1e-15)


# ---------------------------------------------------------------- bus bandwidth


def test_ring_busbw_tends_to_link_bandwidth() -> None:
    B, n = 25e9, 8
    cluster = _cluster("ring", n, B, 2e-6)
    busbw = [bus_bandwidth("all_reduce", n, S, _time(cluster, "all_reduce", "ring", range(n),
                                                     S))[1]
             for S in (2.0**k for k in range(10, 33, 2))]
    assert all(a < b < B for a, b in zip(busbw, busbw[1:], strict=False))
    assert busbw[-1] > 0.999 * B


def test_nvls_busbw_exceeds_link_bandwidth() -> None:
    cluster = server_cluster("dgx-h100", 8)
    p = SERVERS["dgx-h100"]
    link = GPUS["H100"].nvlink_bandwidth_Bps * p.nvlink_efficiency
    S = 8 * GiB  # NVLS's chunk pipeline fills in two 16 MiB loops (sim.nvls): 0.4% here
    t_nvls = _time(cluster, "all_reduce", "nvls", range(8), S)
    t_ring = _time(cluster, "all_reduce", "ring", range(8), S)
    nvls = bus_bandwidth("all_reduce", 8, S, t_nvls)[1]
    ring = bus_bandwidth("all_reduce", 8, S, t_ring)[1]
    assert ring < link < nvls
    # → 2(n−1)/n · B = 1.75 B for large buffers, B the NVLS rate
    assert nvls > 1.7 * link * p.nvls_efficiency


# ---------------------------------------------------------------- contention


@pytest.mark.parametrize("granularity", ["stream", "step"])
def test_two_rings_on_the_same_links_halve_each_others_bandwidth(granularity: str) -> None:
    n, B, lat, S = 4, 10e9, 1e-6, 1e8
    cluster = _cluster("ring", n, B, lat, granularity)
    ends = _ends(cluster, [("a", "dp", "all_reduce", "ring", range(n), S),
                           ("b", "tp", "all_reduce", "ring", range(n), S)])
    expected = 2 * (n - 1) * lat + 2 * (n - 1) / n * S / (B / 2)
    assert ends["a"] == pytest.approx(expected, rel=REL)
    assert ends["b"] == pytest.approx(expected, rel=REL)


def test_ring_slowed_by_a_send_through_one_of_its_links() -> None:
    """Ring 0-1-2-3 on a switch plus a send 4->1 of half a ring edge's bytes R: the switch->1
    link is shared, both get B/2 until the send ends at R/B, then the ring edge has R/2 left at
    B: the collective ends at 1.5 R/B, the send at R/B (max-min, Bertsekas & Gallager)."""
    n, B, S = 4, 10e9, 4e8
    R = 2 * (n - 1) / n * S
    cluster = _cluster("switch", 5, B, 0.0)
    ends = _ends(cluster, [("ring", "dp", "all_reduce", "ring", range(n), S),
                           ("send", "pp", "send_p2p", "", (4, 1), R / 2)])
    assert ends["send"] == pytest.approx(R / B, rel=REL)
    assert ends["ring"] == pytest.approx(1.5 * R / B, rel=REL)


def _cross_pod_ring(oversubscription: float, order: list[int], S: float = GiB,
                    lat: float = 0.0) -> float:
    cluster = _cluster("fat-tree", 8, 25e9, lat,
                       fabric=_fabric(oversubscription))
    t = _time(cluster, "all_reduce", "ring", order, S)
    return bus_bandwidth("all_reduce", 8, S, t)[1]


def _fabric(oversubscription: float):
    from topologies.graphs import Fabric

    return Fabric("fat-tree", gpus_per_leaf=4, oversubscription=oversubscription)


def test_oversubscribed_fat_tree_halves_busbw_of_uplink_saturating_all_reduce() -> None:
    """Every hop of the ring 0,4,1,5,2,6,3,7 crosses pods: 4 flows leave each leaf. At 1:1 they
    spread over 4 spines (D-mod-k), at 2:1 two share each uplink: exactly half the busbw."""
    crossing = [0, 4, 1, 5, 2, 6, 3, 7]
    full, half = _cross_pod_ring(1.0, crossing), _cross_pod_ring(2.0, crossing)
    assert half / full == pytest.approx(0.5, rel=REL)
    with_latency = _cross_pod_ring(2.0, crossing, lat=1e-6) / _cross_pod_ring(1.0, crossing,
                                                                                lat=1e-6)
    assert with_latency == pytest.approx(0.5, rel=1e-3)


def test_oversubscription_does_not_slow_a_ring_crossing_pods_once() -> None:
    """REFERENCES.md's trap: a rank-order ring crosses pods through one uplink per leaf."""
    order = list(range(8))
    assert _cross_pod_ring(2.0, order) == pytest.approx(_cross_pod_ring(1.0, order), rel=REL)


def test_oversubscribed_dgx_fabric_from_config() -> None:
    """Two DGX H100 servers on a fat-tree with one server per leaf; a ring alternating between
    the servers sends 8 flows through each leaf's uplinks: 2:1 halves the busbw."""
    def busbw(ratio: float) -> float:
        cluster = build_cluster(parse_config({
            "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0}},
            "cluster": {"preset": "dgx-h100", "num_gpus": 16, "topology": "fat-tree",
                        "gpus_per_leaf": 8, "oversubscription": ratio}}).cluster)
        order = [g for pair in zip(range(8), range(8, 16), strict=True) for g in pair]
        return bus_bandwidth("all_reduce", 16, 4 * GiB,
                             _time(cluster, "all_reduce", "ring", order, 4 * GiB))[1]
    assert busbw(2.0) / busbw(1.0) == pytest.approx(0.5, rel=5e-3)


def test_concurrent_rail_all_reduces_share_oversubscribed_uplinks() -> None:
    """Four 2-GPU all-reduces across pods at once (one per rail): at 2:1 two flows share each
    uplink, so each takes exactly twice as long as at 1:1."""
    groups = [(i, i + 4) for i in range(4)]

    def ends(ratio: float) -> list[float]:
        cluster = _cluster("fat-tree", 8, 25e9, 0.0, fabric=_fabric(ratio))
        out = _ends(cluster, [(f"g{i}", kind, "all_reduce", "ring", g, 1e9)
                              for i, (g, kind) in enumerate(zip(groups, ("dp", "tp", "cp", "ep"),
                                                                strict=True))])
        return [out[f"g{i}"] for i in range(4)]
    for slow, fast in zip(ends(2.0), ends(1.0), strict=True):
        assert slow == pytest.approx(2 * fast, rel=REL)


# ---------------------------------------------------------------- plans


def test_plan_sizes_and_bytes() -> None:
    n, S = 8, 8e6
    ranks = tuple(range(n))
    ring_step = plan("all_reduce", "ring", ranks, S)
    ring_stream = plan("all_reduce", "ring", ranks, S, granularity="stream")
    assert len(ring_step) == 2 * (n - 1) * n and len(ring_stream) == n
    assert sum(t.nbytes for t in ring_step) == pytest.approx(sum(t.nbytes for t in ring_stream))
    assert {t.steps for t in ring_stream} == {2 * (n - 1)}
    assert len(plan("all_reduce", "halving_doubling", ranks, S)) == 2 * 3 * n
    assert len(plan("all_to_all", "pairwise", ranks, S)) == n * (n - 1)
    assert len(plan("all_reduce", "tree", ranks, S)) == 2 * 2 * (n - 1)
    nvls = plan("all_reduce", "nvls", ranks, S, nvswitch="sw")
    assert len(nvls) == 2 * n and sum(t.dst == "sw" for t in nvls) == n
    assert plan("send", "p2p", (3, 5), S)[0] == plan("send", "p2p", (3, 5), S)[0]
    assert plan("all_reduce", "ring", (5,), S) == ()
    hier = plan("all_reduce", "hierarchical", ranks, S, host_of={r: r // 4 for r in ranks})
    # 2 intra phases x 2 hosts x 4 ranks x 3 steps x S/4, 4 inter rings x 2 ranks x 2 steps x S/8
    assert sum(t.nbytes for t in hier) == pytest.approx(2 * 2 * 4 * 3 * S / 4 + 4 * 2 * 2 * S / 8)


def test_plan_latencies_follow_the_pipeline() -> None:
    """With a latency function a streamed ring edge waits for the edges before it."""
    lat = {(0, 1): 1.0, (1, 2): 2.0, (2, 0): 4.0}
    ring = plan("reduce_scatter", "ring", (0, 1, 2), 3.0, granularity="stream",
                latency=lambda a, b: lat[(a, b)])
    assert [t.latency_s for t in ring] == [1.0 + 4.0, 2.0 + 1.0, 4.0 + 2.0]
    chain = plan("broadcast", "ring", (0, 1, 2), 3.0, latency=lambda a, b: lat[(a, b)])
    assert [t.latency_s for t in chain] == [1.0, 3.0]


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    (("all_reduce", "nvls", (0, 1, 2), 1.0), {}, "one NVSwitch"),
    (("reduce_scatter", "halving_doubling", (0, 1, 2), 1.0), {}, "power-of-two"),
    (("all_reduce", "hierarchical", (0, 1, 2), 1.0), {"host_of": {0: 0, 1: 0, 2: 1}},
     "same number of ranks"),
    (("all_reduce", "hierarchical", (0, 1), 1.0), {}, "host_of"),
    (("all_to_all", "ring", (0, 1), 1.0), {}, "does not implement all_to_all"),
    (("all_reduce", "fastest", (0, 1), 1.0), {}, "'fastest'"),
    (("gather", "ring", (0, 1), 1.0), {}, "'gather'"),
    (("send", "p2p", (0, 1, 2), 1.0), {}, "exactly"),
    (("all_reduce", "ring", (0, 0), 1.0), {}, "repeats"),
])
def test_plan_errors(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan(*args, **kwargs)


# ---------------------------------------------------------------- selection and overrides


def test_default_selection_is_nccl_like() -> None:
    a100 = server_cluster("dgx-a100-80g", 64)
    h100 = server_cluster("dgx-h100", 64)
    node, pod = tuple(range(8)), tuple(range(64))
    for size in (1e3, 1e5, 4e6, 5e7, 1e9):  # NCCL's model: inside one server the ring wins
        assert select_algorithm("all_reduce", size, group_profile(a100, node)) == "ring"
    assert select_algorithm("all_reduce", 1e3, group_profile(a100, pod)) == "tree"
    assert select_algorithm("all_reduce", 1e7, group_profile(a100, pod)) == "tree"
    assert select_algorithm("all_reduce", 1e9, group_profile(a100, pod)) == "ring"  # 8 channels
    assert select_algorithm("all_reduce", 1e6, group_profile(h100, node)) == "nvls"
    assert select_algorithm("all_gather", 1e7, group_profile(a100, pod)) == "ring"
    for algo in AUTO_EXCLUDED:  # not NCCL algorithms: explicit choices only
        for size in (1e3, 1e6, 1e9):
            assert select_algorithm("all_reduce", size, group_profile(a100, pod)) != algo
    assert select_algorithm("all_gather", 1e9, group_profile(a100, pod)) == "ring"
    assert select_algorithm("all_to_all", 1e9, group_profile(a100, pod)) == "pairwise"
    ideal = explicit_cluster("switch", 8, A100, math.inf, 0.0)
    assert select_algorithm("all_reduce", 1e9, group_profile(ideal, node)) == "ring"
    for op, algos in ALGORITHMS_BY_OP.items():
        assert select_algorithm(op, 1e6, group_profile(h100, (0, 9))) in algos


def test_auto_and_cluster_overrides_pick_the_algorithm() -> None:
    n, S = 16, 1e4
    auto = _time(server_cluster("dgx-a100-80g", n), "all_reduce", "auto", range(n), S)
    tree = _time(server_cluster("dgx-a100-80g", n), "all_reduce", "tree", range(n), S)
    assert auto == pytest.approx(tree, rel=REL)
    forced = server_cluster("dgx-a100-80g", n,
                            collectives=CollectiveSettings(algos={"all_reduce": "ring"}))
    ring = _time(server_cluster("dgx-a100-80g", n), "all_reduce", "ring", range(n), S)
    assert _time(forced, "all_reduce", "tree", range(n), S) == pytest.approx(ring, rel=REL)
    assert ring > tree


def test_one_server_tree_pays_its_pipeline_fill_as_nccl_models_it() -> None:
    """Inside one server NCCL's tree is k chains, each 2(k−1) steps of 4.0 µs (the ring's
    are 3.4) and 92% of the ring's bandwidth over the same bytes (ncclTopoTuneModel), so
    it never beats the ring under Simple: 48 MiB, a TP all-reduce of GPT-3 175B, took the
    chains, whose staggered starts hid their fill, and 17x the ring's CPU at full fidelity.
    Simulated, the chains end at fill + bytes, the closed form, the bytes with the chunk
    pipeline's fill (sim.treepipe: depth 7 loops of a 512 KiB chunk on each of the 8
    chains, 28 MiB)."""
    n, S = 8, 48 * 2**20
    cluster = server_cluster("dgx-a100-80g", n)
    ring = _time(cluster, "all_reduce", "ring", range(n), S)
    tree = _time(cluster, "all_reduce", "tree", range(n), S)
    auto = _time(cluster, "all_reduce", "auto", range(n), S)
    assert auto == ring < tree
    simple = server_cluster("dgx-a100-80g", n, collectives=CollectiveSettings(protocol="simple"))
    tree = _time(simple, "all_reduce", "tree", range(n), S)
    alpha, bw = cluster.route(0, 1).latency_s, cluster.bottleneck_Bps(cluster.route(0, 1))
    fill = 2 * (n - 1) * alpha * 4.0 / 3.4
    f = bandwidth_fraction("tree", "simple", False)
    assert tree == pytest.approx(cluster.collective_launch_s + fill
                                 + 2 * (n - 1) / n * (S + 7 * 8 * 2**19) / (bw * f), rel=REL)


def test_sim_run_uses_cluster_collective_overrides() -> None:
    from sim.api import simulate
    from sim.experiment import build_experiment

    data = {"model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 2.0, "grad_MB": 50.0}},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
            "parallel": {"dp": 16, "zero_stage": 0}, "training": {"global_batch_size": 16}}
    base = simulate(build_experiment(data)).stats["step_time_s"]  # the default: auto
    times = {}
    for algo in ("hierarchical", "tree", "ring", "auto"):
        data["cluster"]["collectives"] = {"all_reduce": algo}
        times[algo] = simulate(build_experiment(data)).stats["step_time_s"]
    assert times["auto"] == base
    assert len({times[a] for a in ("hierarchical", "tree", "ring")}) == 3
    # 50 MB over 2 DGX A100: tree (8 channels, one per NIC), which sends half the ring's bytes
    # through the NICs on two servers ("NCCL should use Tree on 2 nodes for large sizes",
    # NCCL maintainer in NVIDIA/nccl issue 946)
    assert times["auto"] == times["tree"] < times["ring"]


# ---------------------------------------------------------------- ring channels


@pytest.mark.parametrize("hosts", [2, 3, 4])
def test_ring_channels_rotate_each_servers_members_rail_aligned(hosts: int) -> None:
    host_of = {r: r // 4 for r in range(4 * hosts)}
    n = 4 * hosts
    rings = ring_channels(range(n), host_of)
    if hosts == 2:
        assert rings == [[0, 1, 2, 3, 7, 6, 5, 4], [1, 2, 3, 0, 4, 7, 6, 5],
                         [2, 3, 0, 1, 5, 4, 7, 6], [3, 0, 1, 2, 6, 5, 4, 7]]
    assert all(sorted(ring) == list(range(n)) for ring in rings)
    # every member leaves its server for exactly one ring and enters it for exactly one
    hops = [(ring[i], ring[(i + 1) % n]) for ring in rings for i in range(n)
            if host_of[ring[i]] != host_of[ring[(i + 1) % n]]]
    assert sorted(a for a, _ in hops) == sorted(b for _, b in hops) == list(range(n))
    # each hop between servers stays on one rail (same local index), but an odd number of
    # servers' wrap-around hop
    crossing = [(a, b) for a, b in hops if a % 4 != b % 4]
    assert len(crossing) == (0 if hosts % 2 == 0 else 4)
    assert ring_channels(range(8), None) == [list(range(8))]
    assert ring_channels((0, 4, 1, 5), host_of) == [[0, 4, 1, 5]]  # interleaved: one ring
    assert ring_channels((0, 1, 2, 4), host_of) == [[0, 1, 2, 4]]  # uneven: one ring
    assert ring_channels((0, 1, 2, 3), host_of) == [[0, 1, 2, 3]]  # one server: one ring


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize(("servers", "per_server"), [(2, 8), (4, 8), (8, 4), (2, 2)])
def test_multi_server_ring_uses_every_nic(op: str, servers: int, per_server: int) -> None:
    """DGX-A100-like servers without latency: k = per-server channels, each GPU sends k − 1 rings
    over NVLink and one over its NIC: t = steps/n·S·max((k−1)/(k·B_nvlink), 1/(k·B_nic))."""
    cluster = build_cluster(parse_config({
        "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0}},
        "cluster": {"topology": "switch", "num_gpus": 8 * servers, "gpus_per_node": 8,
                    "nvlink_bandwidth_GBps": 300.0, "link_bandwidth_GBps": 25.0,
                    "link_latency_us": 0.0, "nvlink_latency_us": 0.0,
                    "collective_launch_us": 0.0}}).cluster)
    group = tuple(s * 8 + i for s in range(servers) for i in range(per_server))
    n, S = len(group), GiB
    profile = group_profile(cluster, group)
    assert profile.ring_channels == per_server
    expected = alpha_beta_time(op, "ring", n, S, 0.0, profile.bandwidth_intra_Bps,
                               gpus_per_node=per_server,
                               bandwidth_inter=profile.bandwidth_inter_Bps)
    assert _time(cluster, op, "ring", group, S) == pytest.approx(expected, rel=REL)
    single = alpha_beta_time(op, "ring", n, S, 0.0, profile.bandwidth_inter_Bps)
    assert expected < single / min(per_server - 0.5, 4)


def test_rings_on_a_rail_optimized_fabric_stay_on_their_rails() -> None:
    """Eight DGX A100 on rail-optimized leaves: ring all-reduce busbw >= 95% of the same
    servers on a non-blocking fat-tree (rings crossing rails went through the spine: 51%)."""
    from topologies.graphs import Fabric
    busbw = {}
    for fabric in ("fat-tree", "rail-optimized"):
        cluster = server_cluster("dgx-a100-80g", 64, Fabric(fabric))
        t = _time(cluster, "all_reduce", "ring", range(64), GiB)
        busbw[fabric] = bus_bandwidth("all_reduce", 64, GiB, t)[1]
    assert busbw["rail-optimized"] >= 0.95 * busbw["fat-tree"]


@pytest.mark.parametrize(("preset", "algo", "published"), [
    ("dgx-h100", "ring", 370e9), ("dgx-h100", "nvls", 480e9), ("dgx-a100-80g", "ring", 208e9)])
@pytest.mark.parametrize("size", [GiB, 8 * GiB])
def test_one_server_all_reduce_busbw_matches_nccl_tests(preset: str, algo: str,
                                                        published: float, size: int) -> None:
    """8-GPU all-reduce busbw at 1-8 GiB within 10% of what NCCL reaches (presets'
    efficiency_source: nccl-tests issues 212 for H100, 178 for A100)."""
    from sim.cli.collective import run_sweep
    rows = run_sweep({"preset": preset, "num_gpus": 8}, "all_reduce", [algo], [size])
    assert rows[0]["busbw_GBps"] * 1e9 == pytest.approx(published, rel=0.10)


def test_nvls_efficiency_is_bytes_on_the_wire_and_in_the_estimate() -> None:
    """The timer's estimate and the flow simulation agree on NVLS with an efficiency."""
    cluster = server_cluster("dgx-h100", 8)
    profile = group_profile(cluster, tuple(range(8)))
    assert profile.nvls_efficiency == pytest.approx(275 / 370)
    t = _ends(cluster, [("ar", "tp", "all_reduce", "nvls", tuple(range(8)), GiB)])["ar"]
    assert t == pytest.approx(estimate("all_reduce", "nvls", GiB, profile), rel=1e-6)


def test_all_to_all_across_two_dgx_a100_is_nic_bound() -> None:
    """64 MiB per GPU over 16 A100 in two servers: half of each GPU's data leaves through its
    own NIC, so the NIC bound is S/2 / (NIC rate); concurrent flows reach it within 1.2x (the
    lock-step rounds took 2.7x)."""
    cluster = server_cluster("dgx-a100-80g", 16)
    S = 64 * 2**20
    nic = SERVERS["dgx-a100-80g"].nic_Bps * SERVERS["dgx-a100-80g"].nic_efficiency
    bound = S / 2 / nic
    t = _time(cluster, "all_to_all", "pairwise", range(16), S) - cluster.collective_launch_s
    assert bound <= t < 1.2 * bound


@pytest.mark.parametrize("dims", [(4, 4), (4, 4, 4), (3, 4), (2, 3, 2)])
def test_ring_order_on_a_torus_is_a_cycle_of_single_links(dims: tuple[int, ...]) -> None:
    """Every hop of the ring a torus group runs is one link, and the order starts at the
    group's first rank (the root of broadcast and reduce)."""
    from sim.collectives import ring_order
    n = math.prod(dims)
    cluster = _cluster("torus2d" if len(dims) == 2 else "torus3d", n, 50e9, 1e-6, dims=dims)
    for first in (0, n - 1):
        ranks = (first, *[r for r in range(n) if r != first])
        order = ring_order(cluster, ranks)
        assert order[0] == first and sorted(order) == list(range(n))
        hops = [len(cluster.path(order[i], order[(i + 1) % n])) - 1 for i in range(n)]
        assert hops == [1] * n


@pytest.mark.parametrize(("topology", "dims"), [("torus2d", (4, 4)), ("torus3d", (4, 4, 4))])
def test_ring_all_reduce_on_a_torus_reaches_its_links_and_auto_takes_it(
        topology: str, dims: tuple[int, ...]) -> None:
    """On a torus of 50 GB/s links the ring keeps to single links: busbw >= 95% of 50 GB/s
    (rank order reached 25 on 4x4, 16.6 on 4x4x4), and auto picks it over the tree."""
    n = math.prod(dims)
    cluster = _cluster(topology, n, 50e9, 1e-6, dims=dims)
    group = tuple(range(n))
    t = _time(cluster, "all_reduce", "ring", group, GiB)
    assert bus_bandwidth("all_reduce", n, GiB, t)[1] >= 0.95 * 50e9
    assert select_algorithm("all_reduce", GiB, group_profile(cluster, group)) == "ring"


def _nccl_tests_rows() -> list:
    """The rows of the validation table; a row with a ``known_deviation`` (its reason) is a
    strict xfail: it must stay outside 15%, so a model change that reaches it fails here
    until the row is moved back among the targets."""
    import csv
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "sim/data/validation/nccl_tests.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return [pytest.param(r, id="-".join(r[k] for k in ("cluster", "num_gpus", "op", "algo",
                                                         "size_bytes")),
                         marks=[pytest.mark.xfail(strict=True, reason=r["known_deviation"])]
                         if r["known_deviation"] else [])
            for r in rows]


def _nccl_tests_cluster(row: dict) -> dict:
    cluster = {"preset": row["cluster"], "num_gpus": int(row["num_gpus"])}
    if row["nics_per_node"]:
        cluster["nics_per_node"] = int(row["nics_per_node"])
    if row["nic_Gbps"]:
        cluster["nic_Gbps"] = float(row["nic_Gbps"])
    return cluster


@pytest.mark.parametrize("row", _nccl_tests_rows())
def test_sim_collective_within_15_percent_of_published_nccl_tests(row: dict) -> None:
    """Every row of the validation table (docs/collectives.md): busbw at the size the
    published value was read at (64 MiB and above) within 15% of it."""
    from sim.cli.collective import run_sweep
    assert int(row["size_bytes"]) >= 64 * 2**20
    got = run_sweep(_nccl_tests_cluster(row), row["op"], [row["algo"]],
                    [int(row["size_bytes"])])[0]
    assert got["busbw_GBps"] == pytest.approx(float(row["busbw_GBps"]), rel=0.15)


# ---------------------------------------------------------------- auto against the simulation


def _experiment_cluster(spec: dict, num_gpus: int) -> Cluster:
    from sim.experiment import Experiment
    return Experiment.from_dict({
        "name": "auto", "model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 2.0}},
        "cluster": {**spec, "num_gpus": num_gpus}, "parallel": {"dp": num_gpus},
        "training": {"micro_batch_size": 1, "num_microbatches": 1}}).cluster


def _simulated(cluster: Cluster, op: str, group: tuple[int, ...], nbytes: float
               ) -> tuple[float, dict[str, float]]:
    """(auto's simulated time, each candidate's) for ``op`` over ``group``."""
    from sim.commtime import CollectiveTimer
    from sim.selection import candidates
    profile = group_profile(cluster, group)
    each = {a: CollectiveTimer(cluster, a)(op, (group,), nbytes) for a in candidates(op, profile)}
    return CollectiveTimer(cluster, "auto")(op, (group,), nbytes), each


def test_auto_on_a_torus_takes_the_tree_where_it_is_faster() -> None:
    """4x4 torus of 50 GB/s links: the tree (2·log n latency) wins small all-reduces, the
    Hamiltonian ring large ones, and auto takes whichever the simulation finds faster."""
    cluster = _experiment_cluster({"topology": "torus2d", "dims": [4, 4],
                                   "link_bandwidth_GBps": 50.0, "link_latency_us": 1.0}, 16)
    group = tuple(range(16))
    picks = {}
    for size in (1e3, 1e5, 1e7, 1e9):
        auto, each = _simulated(cluster, "all_reduce", group, size)
        assert auto == pytest.approx(min(each.values()), rel=1e-9)
        picks[size] = select_algorithm("all_reduce", size, group_profile(cluster, group))
    assert picks == {1e3: "tree", 1e5: "ring", 1e7: "ring", 1e9: "ring"}


@pytest.mark.parametrize("preset", ["dgx-a100-80g", "dgx-h100"])
def test_auto_across_sites_takes_hierarchical_for_large_messages(preset: str) -> None:
    """Two sites of two servers joined by 100 Gb/s WAN links (1 ms): large all-reduces and
    all-gathers cross the WAN once per GPU column with hierarchical, which auto now takes
    (it was 1.3-2x slower with the ring); small ones stay on the latency-cheaper ring."""
    cluster = _experiment_cluster({"preset": preset, "topology": "switch", "sites": 2,
                                   "wan_bandwidth_Mbps": 100_000, "wan_latency_ms": 1}, 32)
    group = tuple(range(32))
    for op in ("all_reduce", "all_gather"):
        auto, each = _simulated(cluster, op, group, 1e9)
        assert select_algorithm(op, 1e9, group_profile(cluster, group)) == "hierarchical"
        assert auto == each["hierarchical"] == pytest.approx(min(each.values()), rel=1e-9)
        assert each["ring"] > 1.1 * auto
        small, each = _simulated(cluster, op, group, 1e3)
        assert small == pytest.approx(min(each.values()), rel=1e-9)


@st.composite
def _small_topology(draw: st.DrawFn) -> tuple[dict, int]:
    """A small cluster of random link rates and latencies: NVSwitch servers on a switch,
    a fat-tree (maybe oversubscribed), a ring or torus of GPUs, or two sites over a WAN."""
    bw = draw(st.sampled_from([1.0, 12.5, 50.0, 200.0]))
    lat = draw(st.sampled_from([0.5, 2.0, 10.0]))
    kind = draw(st.sampled_from(["servers", "fat-tree", "ring", "torus2d", "sites"]))
    n = draw(st.sampled_from([4, 8, 16]))
    if kind == "servers":
        spec = {"topology": "switch", "gpus_per_node": draw(st.sampled_from([2, 4])),
                "nvlink_bandwidth_GBps": bw * draw(st.sampled_from([1, 4, 16]))}
    elif kind == "fat-tree":
        spec = {"topology": "fat-tree", "gpus_per_leaf": 2,
                "oversubscription": draw(st.sampled_from([1.0, 2.0]))}
    elif kind == "torus2d":
        n = 16
        spec = {"topology": "torus2d", "dims": [4, 4]}
    elif kind == "sites":
        n = 16
        spec = {"preset": draw(st.sampled_from(["dgx-a100-80g", "dgx-h100"])),
                "topology": "switch", "sites": 2, "num_gpus": 32,
                "wan_bandwidth_Mbps": bw * 8000, "wan_latency_ms": lat / 10}
        return spec, 32
    else:
        spec = {"topology": kind}
    spec.update({"link_bandwidth_GBps": bw, "link_latency_us": lat,
                 "collective_launch_us": draw(st.sampled_from([0.0, 8.4]))})
    return spec, n


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_small_topology(), st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]),
       st.sampled_from([1e3, 1e5, 4e6, 256e6]))
def test_auto_is_within_2_percent_of_the_fastest_simulated_algorithm(
        topo: tuple[dict, int], op: str, nbytes: float) -> None:
    """On random small topologies auto's pick (from each algorithm's estimate on the
    actual links, sim.selection.plan_cost) simulates within 2% of the fastest candidate
    (in 150 random cases it was the fastest)."""
    spec, n = topo
    cluster = _experiment_cluster(spec, n)
    auto, each = _simulated(cluster, op, tuple(range(n)), nbytes)
    assert auto <= 1.02 * min(each.values())


@pytest.mark.parametrize(("n1", "n2"), [(1, 4), (4, 1), (2, 2), (4, 3), (8, 2)])
def test_hierarchical_all_to_all_closed_form(n1: int, n2: int) -> None:
    """Servers of n1 GPUs on NVLink (B1) with one NIC per GPU (B2) on a crossbar: the
    intra-server all-to-all, then one between the GPUs of each index, each phase exactly
    α + (k−1)/k·S/B (the routes: GPU-NVSwitch-GPU; GPU-NIC-switch-NIC-GPU)."""
    B1, B2, hop, S = 100e9, 25e9, 1e-6, 3e8
    n = n1 * n2
    cluster = explicit_cluster("switch", n, A100, B2, hop, gpus_per_node=n1,
                               nvlink_bandwidth_Bps=B1, nvlink_latency_s=hop) if n1 > 1 else \
        _cluster("switch", n, B2, hop)
    t = _time(cluster, "all_to_all", "hierarchical", range(n), S)
    want = alpha_beta_time("all_to_all", "hierarchical", n, S, 2 * hop, B1, gpus_per_node=n1,
                           alpha_inter=(4 if n1 > 1 else 2) * hop, bandwidth_inter=B2)
    assert t == pytest.approx(want, rel=REL)
    flat = _time(cluster, "all_to_all", "pairwise", range(n), S)
    assert flat <= t * (1 + REL)  # one phase: never slower on a non-blocking fabric


def test_hierarchical_all_to_all_moves_the_same_bytes_between_servers() -> None:
    """Every byte bound for another server crosses between servers once, on its rail."""
    hosts = {r: r // 4 for r in range(12)}
    steps = plan("all_to_all", "hierarchical", tuple(range(12)), 1.2e6, host_of=hosts)
    inter = [t for t in steps if hosts[t.src] != hosts[t.dst]]
    assert all(t.src % 4 == t.dst % 4 for t in inter)
    flat = plan("all_to_all", "pairwise", tuple(range(12)), 1.2e6)
    assert sum(t.nbytes for t in inter) == pytest.approx(
        sum(t.nbytes for t in flat if hosts[t.src] != hosts[t.dst]))
    assert len(inter) == 12 * 2 and sum(hosts[t.src] != hosts[t.dst] for t in flat) == 12 * 8


TWIN_CLUSTERS = {
    "dgx": lambda: build_cluster(parse_config({
        "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0}},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 64}}).cluster),
    "fat-tree 2:1": lambda: build_cluster(parse_config({
        "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0}},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64, "topology": "fat-tree",
                    "gpus_per_leaf": 16, "oversubscription": 2.0}}).cluster),
    "rail-optimized": lambda: build_cluster(parse_config({
        "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0}},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 64,
                    "topology": "rail-optimized"}}).cluster),
}


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(TWIN_CLUSTERS)), st.integers(0, 7), st.integers(1, 3),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from(["all_reduce", "all_gather",
                                                       "reduce_scatter"]))
def test_twin_groups_share_plan_costs_exactly(name: str, server: int, span: int, per: int,
                                              op: str) -> None:
    """plan_cost shares estimates between groups shifted by whole twin servers
    (sim.selection._twin_costs): each shared estimate equals the one a fresh cluster
    (nothing shared) works out for that group, float for float."""
    shared = TWIN_CLUSTERS[name]()
    gpn = shared.gpus_per_node
    first = min(server, shared.num_gpus // gpn - span)
    template = tuple(h * gpn + k for h in range(span) for k in range(per))
    group = tuple(r + first * gpn for r in template)
    for ranks in (template, group):  # the template fills the shared estimates first
        profile = group_profile(shared, ranks)
        fresh = group_profile(TWIN_CLUSTERS[name](), ranks)
        for algo in candidates(op, profile):
            for proto in protocol_choices(algo, "auto"):
                assert plan_cost(op, algo, proto, profile) == plan_cost(op, algo, proto, fresh)


def test_twin_servers_tp_groups_time_their_plans_once() -> None:
    """The eight TP groups of a DGX cluster are twins: the first one's estimates serve the
    other seven, so each plan is built once (the sharing the property test above checks)."""
    from sim.selection import _twin_costs

    cluster = TWIN_CLUSTERS["dgx"]()
    first = group_profile(cluster, tuple(range(8)))
    estimate("all_reduce", "auto", 1e6, first)
    shared = _twin_costs(cluster, tuple(range(8)))
    assert shared and shared is _twin_costs(cluster, tuple(range(24, 32)))
    other = group_profile(cluster, tuple(range(24, 32)))
    assert estimate("all_reduce", "auto", 1e6, other) == estimate("all_reduce", "auto", 1e6,
                                                                   first)
    assert other.costs.keys() <= shared.keys()
    assert _twin_costs(cluster, (0, 8)) is not _twin_costs(cluster, (0, 1))


# ------------------------------------------------- dropless all-to-all, unequal volumes
@pytest.mark.parametrize(("n", "imbalance"), [(2, 1.5), (8, 1.3), (8, 2.0), (16, 1.1),
                                              (8, 5.0), (4, 4.0)])
def test_routing_loads_have_mean_one_and_the_busiest_at_the_imbalance(
        n: int, imbalance: float) -> None:
    from sim.collectives import routing_loads
    loads = routing_loads(n, imbalance)
    assert len(loads) == n and min(loads) >= 0.0
    assert sum(loads) / n == pytest.approx(1.0, rel=1e-12)
    assert max(loads) == pytest.approx(imbalance, rel=1e-12)
    assert len(set(loads)) > 2 or n <= 4  # drawn, not two-level, where it can be
    assert routing_loads(n, imbalance) == loads  # seeded: the same every time
    assert routing_loads(n, 1.0) == (1.0,) * n


def test_routing_imbalance_above_the_group_size_is_refused() -> None:
    from sim.collectives import routing_loads
    from sim.experiment import Experiment
    with pytest.raises(ConfigError, match="routing_imbalance"):
        routing_loads(4, 4.5)
    with pytest.raises(ConfigError, match="routing_imbalance=2.5 exceeds parallel.ep=2"):
        Experiment.from_dict({
            "name": "moe", "model": {"preset": "mixtral-8x7b", "num_layers": 2,
                                     "moe": {"num_experts": 8, "top_k": 2,
                                             "routing_imbalance": 2.5}},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
            "parallel": {"ep": 2, "dp": 8},
            "training": {"micro_batch_size": 1, "global_batch_size": 8}})


def test_equal_volumes_plan_exactly_the_uniform_all_to_all() -> None:
    group = tuple(range(8))
    for sends in (False, True):
        assert (plan("all_to_all", "pairwise", group, 1e6, skew=(1.0, sends))
                == plan("all_to_all", "pairwise", group, 1e6))


@pytest.mark.parametrize("sends", [False, True])
def test_unequal_volumes_follow_the_busiest_rank(sends: bool) -> None:
    """The busiest rank receives (dispatch) or sends (combine) its full S·(n−1)/n; every
    other rank its share of it; the bytes of a pair depend only on the loaded end."""
    from sim.collectives import routing_loads
    n, S, imbalance = 8, 8e6, 1.3
    loads = routing_loads(n, imbalance)
    steps = plan("all_to_all", "pairwise", tuple(range(n)), S, skew=(imbalance, sends))
    per_rank = [0.0] * n
    for t in steps:
        per_rank[t.src if sends else t.dst] += t.nbytes
    for j in range(n):
        assert per_rank[j] == pytest.approx(S * (n - 1) / n * loads[j] / imbalance, rel=1e-12)
    assert max(per_rank) == pytest.approx(S * (n - 1) / n, rel=1e-12)


@pytest.mark.parametrize("nics", [1, 2])
@pytest.mark.parametrize("skew", [(1.3, False), (1.3, True), (2.0, False)])
def test_unequal_volumes_are_bounded_by_the_busiest_ranks_time(
        nics: int, skew: tuple[float, bool]) -> None:
    """Four DGX A100 sharing `nics` NICs each: the max-min network shares the unequal
    flows, so the all-to-all takes less than the busiest rank's volume sent by every rank
    (what the lowering ran before), more than the mean volume; equal volumes give
    today's uniform time exactly. On per-GPU ports the busiest receiver's own NIC bounds
    it, the same float as the busiest volume from every rank."""
    from sim.commtime import CollectiveTimer
    S, group = 64 * 2 ** 20, tuple(range(32))
    shared = _experiment_cluster({"preset": "dgx-a100-80g", "nics_per_node": nics}, 32)

    def t(cluster: Cluster, skew: tuple[float, bool], nbytes: float) -> float:
        return CollectiveTimer(cluster, "pairwise", skew)("all_to_all", (group,), nbytes)

    busiest, mean = t(shared, (1.0, False), S), t(shared, (1.0, False), S / skew[0])
    got = t(shared, skew, S)
    assert mean < got < busiest
    assert t(shared, (1.0, skew[1]), S) == busiest
    own = _experiment_cluster({"preset": "dgx-a100-80g"}, 32)
    assert t(own, skew, S) == pytest.approx(t(own, (1.0, False), S), rel=1e-12)


def test_moe_lowering_skews_dispatch_towards_and_combine_from_the_busiest_rank() -> None:
    """Dropless with routing_imbalance 1.3: the dispatch (and the combine's gradient)
    carries (1.3, False), the combine (and the dispatch's gradient) (1.3, True); a capacity
    factor or balanced routing leaves equal volumes; full and collapsed runs agree."""
    from sim.api import simulate
    from sim.experiment import Experiment
    from workloads.program import Collective

    def exp(**moe: float) -> Experiment:
        return Experiment.from_dict({
            "name": "moe", "model": {"num_layers": 2, "hidden_size": 1024,
                                     "num_attention_heads": 8, "vocab_size": 1000,
                                     "ffn_hidden_size": 4096, "seq_length": 512,
                                     "moe": {"num_experts": 16, "top_k": 2,
                                             "expert_ffn_hidden_size": 1024, **moe}},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16, "nics_per_node": 1},
            "parallel": {"ep": 16, "dp": 16},
            "training": {"micro_batch_size": 1, "global_batch_size": 16}})

    skewed = exp(routing_imbalance=1.3)
    full = simulate(skewed, fidelity="full")
    skews = {(i.name.split(" mlp ")[-1], i.skew) for i in full.program.instructions
             if isinstance(i, Collective) and i.op == "all_to_all"}
    assert skews == {("dispatch", (1.3, False)), ("combine", (1.3, True)),
                     ("bwd combine grad", (1.3, False)), ("bwd dispatch grad", (1.3, True))}
    collapsed = simulate(skewed, fidelity="collapsed")
    assert collapsed.stats["step_time_s"] == pytest.approx(full.stats["step_time_s"], rel=1e-6)
    for moe in ({"capacity_factor": 1.25}, {}):
        plain = simulate(exp(**moe), fidelity="full")
        assert {i.skew for i in plain.program.instructions
                if isinstance(i, Collective) and i.op == "all_to_all"} == {(1.0, False)}
