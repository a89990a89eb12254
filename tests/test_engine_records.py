"""A run on the engine's own heap leaves its timeline's records unmade (issue 22): the
statistics read the summaries :func:`sim.timeline.summaries_of` works out from the times,
which must equal what the records give, exactly."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from strategies import experiments, link_changes

from sim.api import simulate
from sim.engine import InstructionTimes, simulate_program
from sim.experiment import build_experiment
from sim.stats import span_intervals
from sim.timeline import Timeline


def _pairs(intervals: dict) -> dict:
    return {k: sorted(zip(v[0::2], v[1::2], strict=True)) for k, v in intervals.items()
            if len(v)}


def _timer(ins: object) -> float:
    """A compute timer of its own (both runs use it): a fixed duration, else one from the
    op's work."""
    fixed = ins.duration_s  # type: ignore[attr-defined]
    return fixed if fixed is not None else 1e-6 + ins.flops * 1e-15  # type: ignore[attr-defined]


@settings(max_examples=40, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(experiments())
def test_summaries_equal_the_records(data: dict) -> None:
    """Intervals, makespan, memory peaks and floors from the times equal those read from the
    records the reference makes; the records, made when first read, equal the reference's."""
    exp = build_experiment(data)
    changes = link_changes(exp)
    program = simulate(exp, fidelity="full", link_changes=changes).program
    times = InstructionTimes()
    timeline = simulate_program(program, exp.cluster, _timer, times=times, link_changes=changes)
    assert not timeline.records_made
    reference = simulate_program(program, exp.cluster, _timer, event_queue=True,
                                 link_changes=changes)
    assert times.intervals is not None
    assert _pairs(times.intervals) == _pairs(span_intervals(reference.spans))
    assert repr(timeline.end_s) == repr(reference.end_s)
    fresh = Timeline(reference.num_gpus, reference.spans, reference.flows, reference.memory)
    assert repr(timeline.peak_memory_by_gpu) == repr(fresh.peak_memory_by_gpu)
    assert repr(timeline.memory_floor_by_gpu) == repr(fresh.memory_floor_by_gpu)
    assert not timeline.records_made
    assert timeline == reference
