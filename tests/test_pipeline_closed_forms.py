"""Closed-form oracles for GPipe and 1F1B on the ideal cluster (REFERENCES.md table)."""

from __future__ import annotations

import pytest
from conftest import synthetic_experiment

from sim import simulate
from sim.experiment import build_experiment
from workloads.schedules import one_f_one_b

GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 7, 8, 16)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), GRID)
def test_step_time_and_bubble_match_closed_form(schedule: str, p: int, m: int) -> None:
    F, B = 1.25, 2.5  # ms
    exp = build_experiment(synthetic_experiment(p, m, schedule, forward_ms=F, backward_ms=B))
    stats = simulate(exp).stats
    expected = (m + p - 1) * (F + B) * 1e-3
    assert stats["step_time_s"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert stats["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)
    assert stats["num_gpus"] == p


@pytest.mark.parametrize(("p", "m"), [(4, 8), (3, 5), (8, 16)])
def test_1f1b_holds_at_most_p_minus_r_microbatches(p: int, m: int) -> None:
    """Activation memory on rank r peaks at min(p - r, m) micro-batches (Narayanan et al. 2021)."""
    act_MB = 100.0
    exp = build_experiment(synthetic_experiment(p, m, "1f1b", activation_MB=act_MB))
    result = simulate(exp)
    for r in range(p):
        peak = result.timeline.peak_memory_bytes(r)
        assert peak == pytest.approx(min(p - r, m) * act_MB * 1e6)


def test_gpipe_holds_all_microbatches() -> None:
    exp = build_experiment(synthetic_experiment(4, 6, "gpipe", activation_MB=10.0))
    result = simulate(exp)
    assert all(result.timeline.peak_memory_bytes(r) == pytest.approx(6 * 10e6) for r in range(4))


def test_engine_matches_list_schedule_oracle_op_by_op() -> None:
    """Engine spans and the symbolic list-schedule oracle agree for every op."""
    from workloads.schedules import list_schedule

    p, m = 4, 6
    exp = build_experiment(synthetic_experiment(p, m, "1f1b", forward_ms=1.0, backward_ms=2.0))
    result = simulate(exp)
    oracle = list_schedule(one_f_one_b(p, m), lambda op: 1e-3 if op.kind == "F" else 2e-3)
    spans = {(s.stage, s.name[len(str(s.stage))], s.mb): s for s in result.timeline.spans
             if s.stream == "compute"}
    for op, (start, end) in oracle.items():
        span = spans[(op.stage, op.kind, op.mb)]
        assert span.start_s == pytest.approx(start, abs=1e-12)
        assert span.end_s == pytest.approx(end, abs=1e-12)
