"""The 1T run's memory (docs/speed.md, "A lean single run: the 1T run's memory and loops"):
the pass's functions rewritten to hold less (narrower indices, temporaries freed early,
no copies of whole columns) against the straightforward versions they replaced.

- :func:`sim.columnar._dense_gpus` (bincount and ``take``, int32) against the sorted union
  of the GPUs and the sends' destinations, each looked up in it;
- :func:`sim.columnar._intervals` (grouped a column at a time) against the five groups
  concatenated and handed to :class:`sim.intervalcols.IntervalColumns`, which sorts them
  (the code before);
- :func:`sim.columnar._recurrence`'s arrays (views of :class:`array.array` buffers) and
  :func:`sim.chains.level_plan` (int32 rows) against plain loops;
- a 1T-sized run is not needed: every one of these is a function of the columns alone.
"""

from __future__ import annotations

from array import array

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import collapsible_experiments

from sim import chains, columnar
from sim.api import simulate
from sim.experiment import build_experiment
from sim.intervalcols import IntervalColumns
from tests.test_perf_columns import recurrence_case
from workloads.program import SEND, ColumnarInstructions, Columns

SETTINGS = settings(max_examples=30, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _columns(data: dict) -> Columns | None:
    instrs = simulate(build_experiment(data), fidelity="collapsed").program.instructions
    return instrs.columns if isinstance(instrs, ColumnarInstructions) else None


def _dense_reference(columns: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sends = columns.cls == SEND
    gpus = np.array(sorted(set(columns.gpu.tolist()) | set(columns.dst[sends].tolist())),
                    dtype=np.int64)
    index = {g: k for k, g in enumerate(gpus.tolist())}
    gpu = np.array([index[g] for g in columns.gpu.tolist()], dtype=np.int64)
    dst = np.array([index[d] if s else -1
                    for d, s in zip(columns.dst.tolist(), sends.tolist(), strict=True)],
                   dtype=np.int64)
    return gpus, gpu, dst


def _intervals_reference(columns: Columns, dense: tuple, start: np.ndarray, mid: np.ndarray,
                         end: np.ndarray) -> IntervalColumns:
    """The code before: the five groups (:func:`sim.columnar.interval_parts`, the part the
    fast path did not change) concatenated, sorted by :class:`IntervalColumns`."""
    kind_names, parts = columnar.interval_parts(columns, dense, start, mid, end)
    codes = len(kind_names)
    keys, starts, ends = [], [], []
    for mask, g, code, a, b in parts:
        at = np.flatnonzero(mask)
        keys.append(g[at].astype(np.int64) * codes
                    + (code if isinstance(code, int) else code[at]))
        starts.append(a[at])
        ends.append(b[at])
    return IntervalColumns(dense[0], kind_names, np.concatenate(keys), np.concatenate(starts),
                           np.concatenate(ends))


@SETTINGS
@given(collapsible_experiments(), st.integers(0, 2**32 - 1))
def test_dense_gpus_and_intervals_equal_the_plain_versions(data: dict, seed: int) -> None:
    columns = _columns(data)
    if columns is None:
        return
    dense = columnar._dense_gpus(columns)
    for got, want in zip(dense, _dense_reference(columns), strict=True):
        assert got.tolist() == want.tolist()
    n = len(columns)
    rng = np.random.default_rng(seed)
    start = np.cumsum(rng.random(n))
    mid = start + rng.random(n) * (rng.random(n) < 0.7)  # some zero-length spans
    end = mid + rng.random(n)
    got = columnar._intervals(columns, dense, start, mid, end)
    want = _intervals_reference(columns, dense, start, mid, end)
    assert got.start.tobytes() == want.start.tobytes()
    assert got.end.tobytes() == want.end.tobytes()
    assert dict(got.slices) == dict(want.slices)
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}


TIMES = st.one_of(st.floats(0, 10, allow_nan=False), st.sampled_from([0.0, -0.0, 1.0, np.inf]))


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(1, 6), max_size=3), TIMES),
                min_size=1, max_size=40))
def test_the_recurrence_hands_over_its_own_buffers(rows: list) -> None:
    """Ready times and causes come as views of :class:`array.array` buffers that
    :func:`sim.columnar._behind` hands on as they are; the values are the plain loop's."""
    n = len(rows)
    prev, deps, total, (ready, end, cause) = recurrence_case(rows, np.int32, min_width=1)
    got_ready, got_end, got_cause = columnar._recurrence(prev, deps, total)
    assert got_ready.tobytes() == array("d", ready).tobytes()
    assert got_end.tobytes() == array("d", end).tobytes()
    assert got_cause.tolist() == cause
    ready_s, cause_q = columnar._behind(got_ready, "d"), columnar._behind(got_cause, "q")
    assert np.frombuffer(ready_s, dtype=np.float64).ctypes.data == got_ready.ctypes.data
    end_s = columnar._behind(got_end, "d")  # (the end times too: columnar._doubles)
    assert np.frombuffer(end_s, dtype=np.float64).ctypes.data == got_end.ctypes.data
    assert np.frombuffer(cause_q, dtype=np.int64).ctypes.data == got_cause.ctypes.data
    copied = columnar._behind(got_ready[: n // 2], "d")  # (a part: copied)
    assert copied.tolist() == ready[: n // 2]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.integers(-1, 60), min_size=1, max_size=60))
def test_the_chains_level_plan_is_the_plain_levels(parents: list) -> None:
    """:func:`sim.chains.level_plan` (int32 rows and order, intp parents) against the
    depths walked one by one: rows by depth (stable), each row's parent's row."""
    n = len(parents)
    cause = np.array([p if p < i else -1 for i, p in enumerate(parents)], dtype=np.int64)
    depth = []
    for i in range(n):
        depth.append(0 if cause[i] < 0 else depth[cause[i]] + 1)
    order = sorted(range(n), key=lambda i: depth[i])
    row = {i: r for r, i in enumerate(order)}
    at, got_order, parent, bounds = chains.level_plan(cause)
    assert got_order.tolist() == order
    assert at.tolist() == [row[i] for i in range(n)] + [n]
    assert parent.tolist() == [row[int(cause[i])] if cause[i] >= 0 else n for i in order]
    assert parent.dtype == np.intp
    assert bounds == np.cumsum(np.bincount(depth)).tolist()


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
                | st.sampled_from([0.0, -0.0, float("nan"), -float("inf")]), max_size=80))
def test_doubles_are_fromiter_bit_for_bit(values: list[float]) -> None:
    """:func:`sim.columnar._doubles` (floats written by :mod:`struct` into an
    :class:`array.array`) against ``np.fromiter`` (the reference): the same bytes (NaNs,
    -0.0 and infinities among them), as a writable view of an array of doubles."""
    got = columnar._doubles(values)
    want = np.fromiter(values, dtype=float, count=len(values))
    assert got.dtype == np.float64 and got.flags.writeable and got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()
    assert isinstance(got.base, memoryview) and isinstance(got.base.obj, array)
