"""benchmarks/interleaved_warmup.py: what the second hop of the interleaved warm-up buys
(docs/memory-gaps.md, "Ninth pass")."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark
from workloads.schedules import list_schedule
from workloads.schedules_advanced import interleaved, peak_activation, uniform_duration


@pytest.fixture(scope="module")
def iw():
    return load_benchmark("interleaved_warmup")


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 12, 3), (3, 9, 2), (16, 32, 8),
                                           (16, 16, 8)])
def test_two_hops_is_the_simulators_interleaved_schedule(iw, p, m, v):
    assert iw.interleaved_hops(p, m, v, p, 2).rank_ops == interleaved(p, m, v).rank_ops


@pytest.mark.parametrize("hops", [1, 2])
def test_without_latency_the_latency_run_is_the_list_schedule(iw, hops):
    s = iw.interleaved_hops(6, 12, 3, 6, hops)
    exact = list_schedule(s, uniform_duration(s, 3.0, 6.0))
    ours = iw.run_with_latency(s, 3.0, 6.0, 0.0)
    assert ours.keys() == exact.keys()
    assert all(ours[op] == pytest.approx(exact[op]) for op in exact)


def test_one_hop_holds_fewer_and_costs_only_latency(iw):
    """Llama 3 405B's 16 x 8 x 32: one hop keeps 127 stashes on rank 1 instead of 141 with
    the same step when messages take no time, and is slower once they take any."""
    one, two = (iw.interleaved_hops(16, 32, 8, 16, h) for h in (1, 2))
    assert [int(peak_activation(s)[1] * 8) for s in (one, two)] == [127, 141]
    assert iw.step(one, 0.0) == pytest.approx(iw.step(two, 0.0)) == pytest.approx(
        32 * 24 + 15 * 3)
    assert iw.step(one, 0.05) > 1.01 * iw.step(two, 0.05)
