"""Flow-level network and ring collectives against their closed forms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.collectives import plan
from sim.engine import simulate_program
from sim.fastnet import FastFlowNetwork
from sim.network import FlowNetwork, max_min_rates
from topologies.hardware import GPUS
from topologies.presets import CollectiveSettings, explicit_cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

A100 = GPUS["A100-80GB"]


def _run(cluster, build) -> float:
    b = ProgramBuilder()
    build(b)
    prog = Program(cluster.num_gpus, b.build(), (0.0,) * cluster.num_gpus, gpipe(1, 1))
    return simulate_program(prog, cluster, lambda op: 0.0).end_s


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize(("S", "B", "alpha"), [(1e6, 25e9, 2e-6), (3.3e8, 1e9, 1e-5),
                                                (1024.0, 300e9, 0.0)])
def test_ring_collective_matches_alpha_beta(op: str, n: int, S: float, B: float,
                                            alpha: float) -> None:
    cluster = explicit_cluster("ring", n, A100, B, alpha,
                               collectives=CollectiveSettings(protocol="simple"))
    group = tuple(range(n))
    t = _run(cluster, lambda b: b.collective(group, {}, kind="dp", name="c", op=op, nbytes=S,
                                              algo="ring"))
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    expected = steps * alpha + steps / n * S / B
    assert t == pytest.approx(expected, rel=1e-9)


def test_collective_launch_latency_is_added_once() -> None:
    cluster = explicit_cluster("ring", 4, A100, 1e9, 1e-6, collective_launch_s=8.4e-6)
    t = _run(cluster, lambda b: b.collective((0, 1, 2, 3), {}, kind="dp", name="c",
                                             op="all_reduce", nbytes=4e6))
    assert t == pytest.approx(8.4e-6 + 6 * 1e-6 + 6 / 4 * 4e6 / 1e9, rel=1e-9)


def test_two_flows_through_one_link_share_it_equally() -> None:
    """GPU0->GPU2 and GPU1->GPU2 on a switch share the switch->GPU2 link: B/2 each."""
    B, alpha, S = 10e9, 1e-6, 5e8
    cluster = explicit_cluster("switch", 3, A100, B, alpha)

    def build(b: ProgramBuilder) -> None:
        b.send(0, 2, S, "pp", "a", ())
        b.send(1, 2, S, "pp", "b", ())

    assert _run(cluster, build) == pytest.approx(2 * alpha + S / (B / 2), rel=1e-9)


def test_rate_rises_when_a_competing_flow_ends() -> None:
    """A short and a long flow share a link; the long one speeds up when the short one ends."""
    B, S_short, S_long = 1e9, 1e8, 4e8
    cluster = explicit_cluster("switch", 3, A100, B, 0.0)

    def build(b: ProgramBuilder) -> None:
        b.send(0, 2, S_short, "pp", "short", ())
        b.send(1, 2, S_long, "pp", "long", ())

    # both at B/2 until the short one finishes at 2*S_short/B, then the rest at B
    expected = 2 * S_short / B + (S_long - S_short) / B
    assert _run(cluster, build) == pytest.approx(expected, rel=1e-9)


def test_max_min_classic_example() -> None:
    """Bertsekas & Gallager's example: a long flow over two links shared with one flow each."""
    # links 0 and 1 of capacity 1; flow 0 crosses both, flows 1, 2 one each; link 2 cap 10
    rates = max_min_rates({0: (0, 1), 1: (0,), 2: (1, 2), 3: (2,)}, [1.0, 1.0, 10.0])
    assert rates == pytest.approx({0: 0.5, 1: 0.5, 2: 0.5, 3: 9.5})


def test_max_min_one_round_and_unconstrained_flows() -> None:
    """Flows all bottlenecked in the first filling round get its share exactly; flows over
    infinite links only (or none) get an infinite rate, alone or beside finite ones."""
    inf = math.inf
    caps = [3.0, 10.0, inf]
    assert max_min_rates({0: (0, 2), 1: (0,), 2: (0, 1), 3: (2,), 4: ()}, caps) == {
        0: 1.0, 1: 1.0, 2: 1.0, 3: inf, 4: inf}
    assert max_min_rates({0: (2,), 1: ()}, caps) == {0: inf, 1: inf}
    # a second round: flow 2 is not bottlenecked at link 0's share
    assert max_min_rates({0: (0,), 1: (0,), 2: (1,), 3: (2,)}, caps) == {
        0: 1.5, 1: 1.5, 2: 10.0, 3: inf}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True),
                min_size=1, max_size=8),
       st.lists(st.floats(0.1, 100.0), min_size=5, max_size=5))
def test_max_min_is_feasible_and_every_flow_has_a_bottleneck(paths, caps) -> None:
    flows = {i: tuple(p) for i, p in enumerate(paths)}
    rates = max_min_rates(flows, caps)
    load = [0.0] * len(caps)
    for fid, links in flows.items():
        for link in links:
            load[link] += rates[fid]
    assert all(load[i] <= caps[i] * (1 + 1e-9) for i in range(len(caps)))
    for fid, links in flows.items():
        # max-min: some link of the flow is saturated and the flow's rate is maximal on it
        assert any(
            math.isclose(load[link], caps[link], rel_tol=1e-9)
            and all(rates[f] <= rates[fid] * (1 + 1e-9) for f, ls in flows.items() if link in ls)
            for link in links
        )


def test_plan_shapes() -> None:
    steps = plan("all_reduce", "ring", (0, 1, 2, 3), 8.0)
    assert len(steps) == 2 * 3 * 4
    assert all(s.nbytes == 2.0 for s in steps)
    assert plan("all_reduce", "ring", (5,), 8.0) == ()


def test_route_crossing_a_link_twice_shares_it_with_itself() -> None:
    """A flow crossing link 0 twice takes half of it (max-min with itself), ends, and leaves
    both crossings' bytes on the link; the network used to fail removing it (KeyError)."""
    for net in (FlowNetwork([10.0, 10.0]), FastFlowNetwork([10.0, 10.0])):
        net.start(0.0, 1, (0, 1, 0), 100.0)
        net.refresh(0.0)
        assert net.next_end_s() == 20.0
        assert net.finish_due(20.0) == [1]
        assert dict(net.bytes_on_link) == {0: 200.0, 1: 100.0}
        assert net.active == 0
