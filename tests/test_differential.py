"""The fast paths equal the reference paths on random experiments (issue 18).

``simulate(exp)`` against ``simulate(exp, reference=True)`` (:func:`sim.api.simulate`):
lowering's op loop against its columnar form (:mod:`workloads.lowering.columnar`), the
engine's event queue against its queue-free pass on arrays (:mod:`sim.columnar`), the
idle breakdown's plain loops against its array forms (:mod:`sim.idle`). Experiments
come from :mod:`strategies`: synthetic, dense and MoE transformers, every schedule,
uneven layer splits, SP/CP/EP, ZeRO 0-3, recomputation, stragglers, mixed GPU types and
link faults; each at fidelity full, and those that collapse also at fidelity collapsed
(where the fast path differs most: a collapsed program runs without the event queue).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import SCHEDULES, breaks_symmetry, experiments, link_changes

from sim.api import simulate
from sim.experiment import build_experiment

REL = 1e-9
"""Relative tolerance of every compared number."""

CASES = 16
"""Generated experiments per schedule (each simulated at one or both fidelities, both
ways): 16 x 8 schedules = 128 experiments, 173 simulations each way (45 collapsed)."""


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL, abs_tol=REL * 1e-6)


def _assert_same(fast: object, ref: object, what: str) -> None:
    """Equal structure, strings and integers; floats equal to :data:`REL` relative."""
    if isinstance(ref, dict):
        assert isinstance(fast, dict) and fast.keys() == ref.keys(), what
        for k in ref:
            _assert_same(fast[k], ref[k], f"{what}.{k}")
    elif isinstance(ref, (list, tuple)):
        assert isinstance(fast, (list, tuple)) and len(fast) == len(ref), what
        for k, (a, b) in enumerate(zip(fast, ref, strict=True)):
            _assert_same(a, b, f"{what}[{k}]")
    elif isinstance(ref, float) and not isinstance(ref, bool):
        assert _close(fast, ref), f"{what}: fast {fast!r} != reference {ref!r}"
    else:
        assert fast == ref, f"{what}: fast {fast!r} != reference {ref!r}"


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_fast_paths_equal_reference_paths(schedule: str) -> None:
    """Per schedule, 16 generated experiments (derandomized: the same ones every run; 128 in
    all, 173 simulations each way, about 12 s): spans (stream, kind, name, times), flows, memory
    samples, step time, peak memory per GPU, exposed communication by kind and the idle
    breakdown agree to 1e-9 relative."""
    _check(schedule)


def _check(schedule: str) -> None:
    @settings(max_examples=CASES, derandomize=True, deadline=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(experiments(schedule=schedule))
    def agree(data: dict) -> None:
        _compare(data)

    agree()


def _compare(data: dict) -> None:
    """Simulate ``data`` both ways at each fidelity it runs at; assert they agree."""
    exp = build_experiment(data)
    changes = link_changes(exp)
    for fidelity in ("full",) if breaks_symmetry(data) else ("full", "collapsed"):
        fast = simulate(exp, fidelity=fidelity, link_changes=changes)
        ref = simulate(exp, fidelity=fidelity, link_changes=changes, reference=True)
        what = f"{data['schedule']} {fidelity}"
        _assert_same(fast.stats, ref.stats, f"{what} stats")
        _assert_same(fast.timeline.peak_memory_by_gpu, ref.timeline.peak_memory_by_gpu,
                     f"{what} peak memory")
        _assert_same(fast.timeline.spans, ref.timeline.spans, f"{what} spans")
        _assert_same(fast.timeline.flows, ref.timeline.flows, f"{what} flows")
        _assert_same(fast.timeline.collectives, ref.timeline.collectives,
                     f"{what} collectives")
        _assert_same(fast.timeline.memory, ref.timeline.memory, f"{what} memory")
