"""The bounds' fast path: :func:`sim.search.plan.list_run` against the reference list schedule
(:func:`workloads.schedules.list_schedule`), and the memory walk against the lowering's
allocations (:func:`workloads.memory.op_alloc_free`), on random schedules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import ScheduleError
from sim.search.plan import SLOT, build_plan, build_schedule, list_run
from workloads import memory
from workloads.costs import SyntheticCosts
from workloads.registry import SCHEDULES
from workloads.schedules import list_schedule

NAMES = sorted(SCHEDULES)


@st.composite
def _schedules(draw: st.DrawFn) -> tuple:
    """(name, p, m, v, k, w) of a schedule some builder may accept."""
    name = draw(st.sampled_from(NAMES))
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 14))
    v = draw(st.integers(1, 3))
    k = draw(st.integers(1, 4))
    w = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
    return name, p, m, v, k, w


@settings(max_examples=300, deadline=None, derandomize=True)
@given(case=_schedules(), durations=st.lists(
    st.one_of(st.just(0.0), st.floats(1e-6, 10.0, allow_nan=False)), min_size=3, max_size=3 * 18))
def test_list_run_is_the_reference_list_schedule(case: tuple, durations: list[float]) -> None:
    """Every op's end time, float for float, on schedules without fused groups; with fused
    groups (DualPipe-V) no later than the reference (a bound stays a bound). The plan's
    order is the order the reference places the ops in."""
    name, p, m, v, k, w = case
    try:
        plan = build_plan(name, p, m, v, w, k)
    except (ScheduleError, ValueError):
        return
    sched = build_schedule(name, p, m, v, k)
    table = [durations[i % len(durations)] for i in range(3 * len(plan.stage_rank))]
    flat = [op for ops in sched.rank_ops for op in ops]
    reference = list_schedule(sched, lambda op: table[3 * op.stage + SLOT[op.kind]])
    index = {op: i for i, op in enumerate(flat)}
    assert list(plan.timing.order) == [index[op] for op in reference]
    ends = list_run(plan, table)
    if sched.fused:
        assert all(ends[index[op]] <= end for op, (_, end) in reference.items())
    else:
        assert ends == [reference[op][1] for op in flat]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(case=_schedules(), act=st.floats(1.0, 1e9))
def test_memory_walk_is_the_lowerings_allocations(case: tuple, act: float) -> None:
    """The plan's per-rank walk (:func:`workloads.memory.in_flight`) times the activation bytes
    peaks where the lowering's allocations and frees (:func:`workloads.memory.op_alloc_free`),
    replayed in program order, peak: the rule has one home."""
    name, p, m, v, k, w = case
    try:
        plan = build_plan(name, p, m, v, w, 1)
    except (ScheduleError, ValueError):
        return
    sched = build_schedule(name, p, m, v, 1)
    costs = SyntheticCosts(1.0, 2.0, 1.0, activation_bytes=act * sched.chunks_per_rank,
                           chunks_per_rank=sched.chunks_per_rank, w_retained_fraction=w)
    for r, ops in enumerate(sched.rank_ops):
        held = peak = 0.0
        for op in ops:
            alloc, free = memory.op_alloc_free(costs, op, sched.split_backward)
            held += alloc
            peak = max(peak, held)
            held -= free
        rows = plan.in_flight[r]
        walked = float((rows[:, :-1].sum(axis=1) * costs.activation_bytes_per_mb(0)).max())
        assert abs(walked - peak) <= 1e-9 * max(peak, 1.0)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(rows=st.integers(1, 12).flatmap(lambda n: st.lists(
           st.lists(st.floats(0.0, 64.0, allow_subnormal=False), min_size=n + 1, max_size=n + 1),
           min_size=1, max_size=20)),
       data=st.data())
def test_stash_at_rows_is_a_left_to_right_sum(rows: list, data: st.DataObject) -> None:
    """:func:`workloads.memory.stash_at_rows` (the memory bound's stash at each op start) is
    each row's products summed from the left, bit for bit as plain Python floats add them
    (so the same on every CPU, which a BLAS matrix-vector product is not), and within
    rounding of that product."""
    n = len(rows[0]) - 1
    act = data.draw(st.lists(st.floats(0.0, 1e10, allow_subnormal=False), min_size=n, max_size=n))
    arr = np.array(rows)
    got = memory.stash_at_rows(arr, act)
    for row, value in zip(rows, got, strict=True):
        want = 0.0
        for count, size in zip(row[:-1], act, strict=True):
            want += count * size
        assert value == want
    assert np.allclose(got, arr[:, :-1] @ np.array(act), rtol=1e-12, atol=0.0)


def test_stash_at_rows_checks_its_columns() -> None:
    with pytest.raises(ValueError, match="3 stage columns but 2 stash sizes"):
        memory.stash_at_rows(np.zeros((2, 4)), [1.0, 2.0])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(case=_schedules())
def test_a_relayed_plan_is_the_plan_built(case: tuple) -> None:
    """:func:`light_plan` -> pickle -> :func:`restore_plan` (how judging's plans travel
    between workers, :class:`sim.search.execution.TimingRelay`) gives the plan
    :func:`build_plan` builds: every field equal, every memory-walk row array byte for
    byte (``float64``, same shape), and the timing, worked out from a schedule built
    again, equal to the built plan's."""
    import pickle

    from sim.search.plan import light_plan, restore_plan

    name, p, m, v, k, w = case
    try:
        plan = build_plan(name, p, m, v, w, k)
    except (ScheduleError, ValueError):
        return
    got = restore_plan(pickle.loads(pickle.dumps(light_plan(plan))))
    assert got.schedule is None
    for f in ("name", "num_microbatches", "stage_rank", "split_backward", "exact",
              "rank_stages", "num_ops", "seq_chunks"):
        assert getattr(got, f) == getattr(plan, f), f
    assert len(got.in_flight) == len(plan.in_flight)
    for a, b in zip(got.in_flight, plan.in_flight, strict=True):
        assert a.dtype == b.dtype == np.float64 and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    try:
        want = plan.timing
    except ScheduleError:
        try:
            got.timing  # noqa: B018
        except ScheduleError:
            return
        raise AssertionError("the built plan deadlocks, the relayed one does not") from None
    assert got.timing == want


@settings(max_examples=100, deadline=None, derandomize=True)
@given(rows=st.lists(st.lists(st.one_of(
    st.integers(0, 5000).map(float), st.integers(0, 20000).map(lambda i: i / 2),
    st.floats(0, 1e6, allow_nan=False), st.just(-0.0)), min_size=2, max_size=2),
    min_size=1, max_size=6))
def test_light_plan_rows_come_back_byte_for_byte(rows: list[list[float]]) -> None:
    """The row packing alone, on values a float16 or float32 holds exactly or does not."""
    import numpy as np

    from sim.search.plan import Plan, light_plan, restore_plan

    a = np.array(rows, dtype=np.float64)
    plan = Plan("x", 1, (0,), False, True, ((0,),), (a, a[:1]), 1, None)
    got = restore_plan(light_plan(plan))
    for x, y in zip(got.in_flight, plan.in_flight, strict=True):
        assert x.dtype == np.float64 and x.shape == y.shape and x.tobytes() == y.tobytes()
