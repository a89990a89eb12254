"""The symbolic run's fast path (:func:`workloads.schedules._list_unfused`: the unrolled
loop of ops with at most two producers, :func:`workloads.schedules._list_two`, and the
general loop fed from the producer columns where there are more) gives the general loop's
result (``list_schedule(..., reference=True)``): the same
intervals in the same order, and the same error where a schedule deadlocks."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.errors import ScheduleError
from workloads import schedules
from workloads.lowering.order import topological, unit_sort
from workloads.registry import SCHEDULES
from workloads.schedules import (
    Schedule,
    _list_two,
    _list_unfused,
    list_schedule,
    producer_positions,
    schedule_deps,
)
from workloads.schedules_advanced import interleaved

NAMES = sorted(SCHEDULES)


def _schedule(name: str, p: int, m: int, v: int, k: int) -> Schedule | None:
    try:
        return SCHEDULES[name](p, m, v, k)
    except (ScheduleError, ValueError):  # arguments the schedule refuses
        return None


def _outcome(run):
    try:
        return list(run().items())
    except ScheduleError as exc:
        return str(exc)


def _durations(seed: int, ties: bool):
    rng = random.Random(seed)
    memo: dict = {}

    def duration(op) -> float:
        if op not in memo:
            memo[op] = float(rng.randint(1, 3)) if ties else rng.uniform(0.1, 3.0)
        return memo[op]

    return duration


@settings(max_examples=150, deadline=None, derandomize=True)
@given(name=st.sampled_from(NAMES), p=st.integers(1, 6), m=st.integers(1, 12),
       v=st.integers(1, 3), k=st.integers(1, 4), seed=st.integers(0, 2**16),
       ties=st.booleans(), shuffle=st.booleans())
def test_the_fast_symbolic_run_is_the_general_loop(name: str, p: int, m: int, v: int, k: int,
                                                   seed: int, ties: bool,
                                                   shuffle: bool) -> None:
    schedule = _schedule(name, p, m, v, k)
    if schedule is None:
        return
    if shuffle:  # a rank's ops out of order: often a deadlock, whose message must match
        rng = random.Random(seed)
        ranks = [list(ops) for ops in schedule.rank_ops]
        r = rng.randrange(len(ranks))
        rng.shuffle(ranks[r])
        schedule = replace(schedule, rank_ops=tuple(tuple(ops) for ops in ranks))
    duration = _durations(seed, ties)
    fast = _outcome(lambda: list_schedule(schedule, duration))
    reference = _outcome(lambda: list_schedule(schedule, duration, reference=True))
    assert fast == reference
    # and each of the two loops on its own, where it applies
    order = [op for ops in schedule.rank_ops for op in ops]
    columns = None if schedule.fused else producer_positions(schedule, order)
    if columns is None:
        return
    times = [duration(op) for op in order]
    by_columns = _outcome(lambda: _as_times(order, _list_unfused(schedule, times, order,
                                                                 columns)))
    assert by_columns == reference
    if not (columns[2] >= 0).any():
        two = _outcome(lambda: _as_times(order, _list_two(schedule, times, order, columns[0],
                                                          columns[1])))
        assert two == reference


def _as_times(order, found):
    starts, ends, scheduled = found
    assert len(ends) == len(order) + 1 and ends[len(order)] is None
    return {order[j]: (starts[j], ends[j]) for j in scheduled}


@pytest.mark.parametrize("name", NAMES)
def test_every_schedule_takes_a_fast_path_equal_to_the_general_loop(name: str) -> None:
    for p, m, v, k in ((4, 8, 2, 2), (3, 7, 1, 3), (8, 16, 2, 1)):
        schedule = _schedule(name, p, m, v, k)
        if schedule is None:
            continue
        unit = list_schedule(schedule, lambda op: 1.0)
        assert list(unit.items()) == list(list_schedule(schedule, lambda op: 1.0,
                                                        reference=True).items())


def _times(ops, start, end) -> dict:
    return dict(zip(ops, zip(start.tolist(), end.tolist(), strict=True), strict=True))


def _unit_run_of(schedule: Schedule, sweep_ranks: int, monkeypatch: pytest.MonkeyPatch):
    """``_unit_run`` of a fresh copy of ``schedule`` with the sweep from ``sweep_ranks``
    ranks on (its result, or the error's text)."""
    monkeypatch.setattr(schedules, "SWEEP_RANKS", sweep_ranks)
    fresh = replace(schedule)  # nothing kept from another run
    try:
        return schedules._unit_run(fresh)
    except ScheduleError as exc:
        return str(exc)


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(NAMES), p=st.integers(1, 9), m=st.integers(1, 20),
       v=st.integers(1, 3), k=st.integers(1, 4), seed=st.integers(0, 2**16),
       shuffle=st.booleans())
def test_the_unit_sweep_is_the_loop(name: str, p: int, m: int, v: int, k: int, seed: int,
                                    shuffle: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The time-step sweep of the unit run (:func:`workloads.schedules._unit_sweep`, taken
    from ``SWEEP_RANKS`` ranks, here from 1) gives the loop's times (as a mapping), its
    producer columns and codes, the same topological order after the sort the lowering
    makes (by end, rank, start), an order in which every op follows its producers and its
    rank predecessors, and the loop's error where the schedule deadlocks."""
    schedule = _schedule(name, p, m, v, k)
    if schedule is None:
        return
    if shuffle:
        rng = random.Random(seed)
        ranks = [list(ops) for ops in schedule.rank_ops]
        rng.shuffle(ranks[rng.randrange(len(ranks))])
        schedule = replace(schedule, rank_ops=tuple(tuple(ops) for ops in ranks))
    swept = _unit_run_of(schedule, 1, monkeypatch)
    loop = _unit_run_of(schedule, 1 << 30, monkeypatch)
    if isinstance(loop, str) or isinstance(swept, str):
        assert swept == loop
        return
    # the lowering's order and fields (the sweep's order taken as it is where it is sorted)
    ordered = []
    for sweep_ranks in (1, 1 << 30):
        monkeypatch.setattr(schedules, "SWEEP_RANKS", sweep_ranks)
        ordered.append(topological(replace(schedule), fields=True))
    (order, fields), (order2, fields2) = ordered
    assert order == order2 and fields is not None and fields2 is not None
    for a, b in zip(fields, fields2, strict=True):
        assert (a is None) == (b is None)
        assert a is None or (np.array_equal(a, b) and not a.flags.writeable)
    (ops, start, end), run = swept
    (ops2, start2, end2), run2 = loop
    assert _times(ops, start, end) == _times(ops2, start2, end2)
    assert start.dtype == start2.dtype and end.dtype == end2.dtype
    assert (run is None) == (run2 is None)
    rank = np.asarray(schedule.stage_rank)[[op.stage for op in ops]]
    rank2 = np.asarray(schedule.stage_rank)[[op.stage for op in ops2]]
    sort = [ops[j] for j in unit_sort(start, rank, end, schedule.num_ranks).tolist()]
    assert sort == [ops2[j] for j in unit_sort(start2, rank2, end2,
                                                schedule.num_ranks).tolist()]
    seen: set = set()
    placed = [0] * schedule.num_ranks
    for op, r in zip(ops, rank.tolist(), strict=True):
        assert all(d in seen for d in schedule_deps(schedule, op))
        assert schedule.rank_ops[r][placed[r]] == op
        placed[r] += 1
        seen.add(op)
    if run is None:
        return
    at, at2 = run[0], run2[0]
    assert sorted(at.tolist()) == sorted(at2.tolist())
    for a, b in zip(run[1:], run2[1:], strict=True):
        assert np.array_equal(a, b) and not a.flags.writeable
    assert not at.flags.writeable


def test_megatron_1t_takes_the_sweep() -> None:
    """Megatron 1T's interleaved schedule (64 ranks, 512 micro-batches, 2 chunks) runs the
    sweep, not the loop, and gets the loop's times."""
    schedule = interleaved(64, 512, 2)
    assert schedule.num_ranks >= schedules.SWEEP_RANKS
    order = [op for ops in schedule.rank_ops for op in ops]
    columns = producer_positions(schedule, order)
    swept = schedules._unit_sweep([len(ops) for ops in schedule.rank_ops], columns)
    assert swept is not None
    at, start = swept
    starts, _, scheduled = _list_unfused(schedule, [1.0] * len(order), order, columns)
    assert np.array_equal(np.asarray(starts)[at], start)
    assert sorted(scheduled) == sorted(at.tolist())


def _fields(schedule: Schedule) -> list:
    """Every op of ``schedule`` as its type and its fields' types and values, rank by rank."""
    return [[(type(op), *((type(x), x) for x in op)) for op in ops]
            for ops in schedule.rank_ops]


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(builds=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 40), st.integers(1, 3)),
                       min_size=1, max_size=4),
       pool_max=st.sampled_from([0, 64, 1 << 18]))
def test_one_f_one_b_is_its_reference(builds: list[tuple[int, int, int]], pool_max: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """1F1B's ops taken from the op pool (:func:`workloads.schedules._whole_ops`, grown in
    any order of builds, or bypassed beyond its bound) equal the reference loop's
    (:func:`workloads.schedules._one_f_one_b_reference`): the same schedule, the same ops
    in the same order, field for field and type for type, and the coded arrays those of
    the ops."""
    monkeypatch.setattr(schedules, "_POOL_MAX", pool_max)
    monkeypatch.setattr(schedules, "_pool", [np.empty((0, 2, 0), dtype=object)])
    for p, m, window in builds:
        fast = schedules.one_f_one_b(p, m, window)
        reference = schedules._one_f_one_b_reference(p, m, window)
        assert fast == reference and fast.notes == reference.notes
        assert _fields(fast) == _fields(reference)
        coded = schedules._coded(reference, [op for ops in reference.rank_ops for op in ops])
        assert all(np.array_equal(a, b)
                   for a, b in zip(schedules.rank_coded(fast), coded, strict=True))
