"""Results kept by equal arguments (:class:`base.equalmemo.EqualMemo`) change no lowering.

The collapsed lowering keeps its ids and dependencies (:func:`workloads.lowering.columnar.
_laid_out`) and its columns' structure (:func:`~workloads.lowering.columnar._structure_with`)
for the last few structures. Here: the columns of a lowering that finds them kept (after a
lowering of the same experiment, with the same or other compute times) equal those of one
that finds nothing kept, field by field; the memo tells arrays apart by value, shape and
type, copies what it keeps and hands out read-only results.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import collapsible_experiments

from base.equalmemo import EqualMemo
from sim.commtime import CollectiveTimer
from sim.experiment import build_experiment
from workloads.lowering import Collapse, lower
from workloads.lowering import columnar as columnar_lowering
from workloads.program import ColumnarInstructions, Columns


def _columns(data: dict, factor: float) -> Columns | None:
    exp = build_experiment(data)
    collapse = Collapse(compute_s=lambda seg: factor * (seg.flops * 1e-15 + seg.hbm_bytes * 1e-12),
                        collective_s=CollectiveTimer(exp.cluster))
    program = lower(exp.schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage,
                    collapse)
    instrs = program.instructions
    return instrs.columns if isinstance(instrs, ColumnarInstructions) else None


def _clear() -> None:
    columnar_lowering._LAID.clear()
    columnar_lowering._STRUCTURES.clear()


def _assert_equal(a: Columns, b: Columns) -> None:
    for field in ("cls", "gpu", "kind", "dst", "deps", "fixed_s", "blocking_s", "comm",
                  "alloc_bytes", "free_bytes", "signature"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), field
    assert a.names == b.names and a.signatures == b.signatures


@settings(max_examples=40, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collapsible_experiments(), st.sampled_from([1.0, 0.3, 2.5]))
def test_a_kept_layout_lowers_as_a_new_one(data: dict, factor: float) -> None:
    _clear()
    cold = _columns(data, factor)
    if cold is None:
        return
    _clear()
    _columns(data, 1.0)  # kept: this experiment's structure at the first costs
    warm = _columns(data, factor)
    assert warm is not None
    _assert_equal(warm, cold)


def test_the_memo_tells_arguments_apart_and_freezes_its_results() -> None:
    memo = EqualMemo(size=2)
    calls: list[tuple] = []

    def make(*args: object) -> tuple:
        calls.append(args)
        return (np.arange(3), [np.ones(2)])

    a = np.array([1, 2, 3])
    first = memo.get((a, "x"), lambda: make(a))
    a[0] = 9  # a caller's later write: the kept key is a copy
    assert memo.get((np.array([1, 2, 3]), "x"), lambda: make()) is first
    for other in [(np.array([1, 2, 3], dtype=np.int32), "x"), (np.array([1, 2]), "x"),
                  (np.array([[1, 2, 3]]), "x"), (np.array([1, 2, 4]), "x"),
                  (np.array([1, 2, 3]), "y"), (np.array([1, 2, 3]),)]:
        assert memo.get(other, lambda: make()) is not first
    assert len(calls) == 7
    with pytest.raises(ValueError):
        first[0][0] = 5
    with pytest.raises(ValueError):
        first[1][0][0] = 5
    small = EqualMemo(max_elements=2)
    b = np.arange(3)
    assert small.get((b,), lambda: 1) == 1 and small.get((b,), lambda: 2) == 2  # not kept


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=12), st.integers(1, 4),
       st.one_of(st.none(), st.integers(1, 15)))
def test_the_memo_keeps_the_latest_within_its_bounds(lengths: list[int], size: int,
                                                     total: int | None) -> None:
    """With ``size`` and ``total_elements``, what a memo keeps (the latest first, as long as
    both bounds hold, the latest whatever it holds) is found again, and a result found is
    the one made for equal arguments."""
    memo = EqualMemo(size=size, total_elements=total)
    made: list[tuple[int, int]] = []
    for k, n in enumerate(lengths):
        args = (np.full(n, k),)
        assert memo.get(args, lambda k=k, n=n: (made.append((k, n)), (k, n))[1]) == (k, n)
    expected: list[int] = []
    held = 0
    for k in reversed(range(len(lengths))):
        held += lengths[k]
        if len(expected) >= size or (expected and total is not None and held > total):
            break
        expected.append(k)
    count = len(made)
    for k in expected:
        assert memo.get((np.full(lengths[k], k),), lambda: (-1, -1)) == (k, lengths[k])
    assert len(made) == count  # all found
    assert len(memo._entries) == len(expected)


def test_a_lowering_of_an_earlier_structure_after_others_is_found() -> None:
    """The collapsed lowering keeps several structures' layouts: one met again after
    another's lowering finds its own (not laid out again), equal to a cold one."""
    from hypothesis import find

    first = find(collapsible_experiments(), lambda d: _columns(d, 1.0) is not None
                 and d["parallel"]["pp"] > 1)
    second = find(collapsible_experiments(), lambda d: _columns(d, 1.0) is not None
                  and d["parallel"]["pp"] > 2)
    _clear()
    cold = _columns(first, 1.7)
    assert cold is not None
    _clear()
    _columns(first, 1.0)
    _columns(second, 1.0)
    before = len(columnar_lowering._LAID._entries)
    warm = _columns(first, 1.7)
    assert warm is not None and len(columnar_lowering._LAID._entries) == before
    _assert_equal(warm, cold)
