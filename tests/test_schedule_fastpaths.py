"""The symbolic run's fast path (:func:`workloads.schedules._list_unfused`: the unrolled
loop of ops with at most two producers, :func:`workloads.schedules._list_two`, and the
general loop fed from the producer columns where there are more) gives the general loop's
result (``list_schedule(..., reference=True)``): the same
intervals in the same order, and the same error where a schedule deadlocks."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import ScheduleError
from workloads.registry import SCHEDULES
from workloads.schedules import (
    Schedule,
    _list_two,
    _list_unfused,
    list_schedule,
    producer_positions,
)

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
