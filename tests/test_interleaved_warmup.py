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


def test_llama3_8192_gpus_over_an_h100_before_any_allocator_overhead():
    """docs/memory-gaps.md, "Ninth pass", lead 1: Llama 3 405B on 8,192 GPUs, rank 1, with
    each run's sourced reserved memory: 80.14 GiB before the allocator, and still 79.14 once
    a backward has freed its own stash and its working memory but the FP32 gradients, over
    the 79.11 GiB PyTorch reports on an H100 80GB: no allocator setting explains the run."""
    from sim.corpus import CORPUS_DIR, load_source
    from sim.experiment import build_experiment

    mb = load_benchmark("memory_breakdown")
    gib = 2**30
    row = next(r for r in load_source(CORPUS_DIR / "dubey2024_llama3_405b.csv").rows
               if r.run == "llama3-405b-8192gpu-cp1")
    top = max(mb.breakdown(build_experiment(row.experiment())), key=lambda m: m.peak)
    count = sum(n for _, n, _ in top.in_flight)
    layer = max(b for _, n, b in top.in_flight if n)
    before = top.static + top.dynamic + top.reserved
    least = top.static + (count - 1) * layer + top.unreduced_grads + top.reserved
    assert (top.rank, count) == (1, 141)
    assert before / gib == pytest.approx(80.14, abs=0.01)
    assert least / gib == pytest.approx(79.14, abs=0.01)
    assert least / gib > 79.11
