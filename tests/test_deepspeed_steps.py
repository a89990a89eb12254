"""DeepSpeed's steps of a schedule's ops worked out on the ops' arrays
(:func:`workloads.lowering.pipeline._deepspeed_steps`) against the op-by-op loop (its
``reference``): the same dict, in the same order, or None for both."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.lowering.pipeline import _deepspeed_steps
from workloads.registry import SCHEDULES
from workloads.schedules import Op, Schedule, one_f_one_b, rank_coded


def _same(schedule: Schedule) -> None:
    fast = _deepspeed_steps(schedule)
    reference = _deepspeed_steps(schedule, reference=True)
    assert (fast is None) == (reference is None)
    if fast is not None:
        assert list(fast.items()) == list(reference.items())
        assert all(type(t) is int for t in fast.values())


@settings(max_examples=120, deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.integers(1, 6), m=st.integers(1, 12))
def test_built_schedules(name: str, p: int, m: int) -> None:
    """Every built-in schedule that builds at (p, m): 1F1B and GPipe take the arrays (1F1B
    in DeepSpeed's order, GPipe not), the others decline before (split backward, chunks)."""
    try:
        schedule = SCHEDULES[name](p, m)
    except Exception:  # (a schedule with other constraints on p and m)
        return
    _same(schedule)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(p=st.integers(1, 5), m=st.integers(1, 8), window=st.integers(1, 3), data=st.data())
def test_reordered_ranks(p: int, m: int, window: int, data: st.DataObject) -> None:
    """1F1B with a rank's ops swapped (out of DeepSpeed's order: None), or with a W op in
    place of an op (None), or as built: the same answer either way."""
    schedule = one_f_one_b(p, m, window)
    assert rank_coded(schedule) is not None  # (the arrays' path is the one taken)
    ranks = [list(ops) for ops in schedule.rank_ops]
    r = data.draw(st.integers(0, p - 1))
    change = data.draw(st.sampled_from(["none", "swap", "w"]))
    if change == "swap" and len(ranks[r]) > 1:
        i = data.draw(st.integers(0, len(ranks[r]) - 2))
        ranks[r][i], ranks[r][i + 1] = ranks[r][i + 1], ranks[r][i]
    elif change == "w":
        i = data.draw(st.integers(0, len(ranks[r]) - 1))
        ranks[r][i] = Op(ranks[r][i].stage, "W", ranks[r][i].mb, ranks[r][i].seq)
    _same(Schedule(schedule.name, m, schedule.stage_rank, tuple(map(tuple, ranks))))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(p=st.integers(1, 8), m=st.integers(1, 24), window=st.integers(1, 3))
def test_permutation_from_the_op_arrays(p: int, m: int, window: int) -> None:
    """DeepSpeed's order of the topological order, its steps read through the ops' rank-order
    positions (``at``) and looked up op by op (the reference, on a fresh copy of the
    schedule: each keeps its own): the same permutation and steps."""
    import numpy as np

    from workloads.lowering.order import topological
    from workloads.lowering.pipeline import deepspeed_permutation

    schedule, other = one_f_one_b(p, m, window), one_f_one_b(p, m, window)
    steps = _deepspeed_steps(schedule)
    if steps is None:
        return
    order, fields = topological(schedule, fields=True)
    assert fields is not None and fields[3] is not None  # (the arrays' path is taken)
    perm, step = deepspeed_permutation(schedule, order, steps, fields[3])
    order2, _ = topological(other, fields=True)
    perm2, step2 = deepspeed_permutation(other, order2, _deepspeed_steps(other, reference=True))
    assert order == order2
    assert np.array_equal(perm, perm2) and np.array_equal(step, step2)
    assert step.dtype == step2.dtype
