"""Builders that hand validation their ops as arrays (:func:`workloads.schedules.with_coded`,
issue 22 "a lean single run") give exactly the arrays read off the ops
(:func:`workloads.schedules._coded`, the reference), so validation, the symbolic run and
lowering see the same schedule either way."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import ScheduleError
from workloads.schedules import _coded, _rank_coded, one_f_one_b, unit_spans, validate
from workloads.schedules_advanced import interleaved


def _assert_builder_arrays(schedule) -> None:
    order = [op for ops in schedule.rank_ops for op in ops]
    given_arrays = schedule.__dict__["_rank_coded"]  # set by the builder
    reference = _coded(schedule, order)
    assert (given_arrays is None) == (reference is None)
    for a, b in zip(given_arrays or (), reference or (), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
        assert not a.flags.writeable
    # and the symbolic run on them is the one on arrays read off the ops
    fresh = type(schedule)(schedule.name, schedule.num_microbatches, schedule.stage_rank,
                           schedule.rank_ops, schedule.split_backward, schedule.notes)
    assert "_rank_coded" not in fresh.__dict__
    ops, start, end = unit_spans(schedule)
    ops2, start2, end2 = unit_spans(fresh)
    assert ops == ops2 and np.array_equal(start, start2) and np.array_equal(end, end2)
    assert schedule.op_counts == fresh.op_counts


@settings(max_examples=80, deadline=None, derandomize=True)
@given(p=st.integers(1, 9), m=st.integers(1, 24), window=st.integers(1, 3))
def test_1f1b_arrays_are_its_ops(p: int, m: int, window: int) -> None:
    _assert_builder_arrays(one_f_one_b(p, m, window))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(p=st.integers(1, 8), m=st.integers(1, 24), v=st.integers(2, 4),
       group=st.none() | st.integers(1, 24))
def test_interleaved_arrays_are_its_ops(p: int, m: int, v: int, group: int | None) -> None:
    try:
        schedule = interleaved(p, m, v, group)
    except ScheduleError:  # Megatron's checks of the group size
        return
    _assert_builder_arrays(schedule)
    try:
        validate(schedule)
    except ScheduleError as exc:  # some (p, m, v) deadlock: the same error either way
        order = [op for ops in schedule.rank_ops for op in ops]
        fresh = type(schedule)(schedule.name, schedule.num_microbatches, schedule.stage_rank,
                               schedule.rank_ops, schedule.split_backward, schedule.notes)
        with pytest.raises(ScheduleError) as again:
            validate(fresh)
        assert str(again.value) == str(exc)
        assert _coded(fresh, order) is not None


def test_the_megatron_1t_schedule_comes_with_its_arrays() -> None:
    schedule = interleaved(64, 512, 2)
    assert "_rank_coded" in schedule.__dict__
    assert _rank_coded(schedule) is schedule.__dict__["_rank_coded"]
    _assert_builder_arrays(schedule)
