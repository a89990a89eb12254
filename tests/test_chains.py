"""End times summed along a guessed forest of latest predecessors (:mod:`sim.chains`,
:func:`sim.columnar._recurrence_along`) are the loop's, or are not used.

The engine's queue-free pass tries the latest run's causes of a program structure on the
next run of it: the end times summed along them, kept only where every instruction's
latest predecessor by those times is the guessed one. Here: on drawn dependency graphs and
times (ties, zeros, negative zeros, NaN), a guess from other times either gives None or
the reference loop's ready times, end times and causes bit for bit, and a guess from the
same times always holds; on collapsible experiments, a sequence of passes on one kept
shape at changing costs (the hint held, failed, tried again) gives a cold pass's results
every time; the hint's trust follows the runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import collapsible_experiments

from sim import colshape, columnar
from sim.api import simulate
from sim.chains import Forest, Hint
from sim.experiment import build_experiment
from workloads.program import ColumnarInstructions

TIMES = st.sampled_from([0.0, -0.0, 0.25, 1 / 3, 1.5, 2.0, float("nan")])


def _graph(rows: list) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Stream predecessors, a dependency matrix (each row's first) and its columns in use,
    from drawn rows (as ``test_recurrence_equals_the_plain_loop``)."""
    n = len(rows)
    prev = np.array([i - back if back and i - back >= 0 else -1
                     for i, (back, _) in enumerate(rows)], dtype=np.int64)
    found = [sorted({i - b for b in backs if i - b >= 0}) for i, (_, backs) in enumerate(rows)]
    width = max((len(d) for d in found), default=0)
    deps = np.full((n, width), -1, dtype=np.int64)
    for i, d in enumerate(found):
        deps[i, :len(d)] = d
    cols = [np.ascontiguousarray(deps[:, c]) for c in range(width)]
    return prev, deps, cols


def _bits(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype=float).tobytes()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(1, 6), max_size=5)),
                min_size=1, max_size=40), st.data())
def test_a_guessed_forest_gives_the_loop_or_nothing(rows: list, data: st.DataObject) -> None:
    n = len(rows)
    prev, deps, cols = _graph(rows)
    guessed_from = np.array(data.draw(st.lists(TIMES, min_size=n, max_size=n)))
    total = np.array(data.draw(st.one_of(st.just(guessed_from.tolist()),
                                         st.lists(TIMES, min_size=n, max_size=n))))
    guess = Forest.of(columnar._recurrence(prev, deps, guessed_from)[2])
    ready, end, cause = columnar._recurrence(prev, deps, total)
    found = columnar._recurrence_along(guess, total, prev, cols)
    if _bits(total) == _bits(guessed_from):
        assert found is not None  # the run's own causes always hold
    if found is not None:
        got_ready, got_end, got_cause = found
        assert _bits(got_ready) == _bits(ready) and _bits(got_end) == _bits(end)
        assert got_cause.tolist() == cause.tolist()


def test_the_hint_is_tried_after_a_first_run_and_after_two_that_agree() -> None:
    hint = Hint()
    assert hint.guess() is None
    first = np.array([-1, 0, 1, 0])
    hint.saw(first)
    forest = hint.guess()  # tried after the first run
    assert forest is not None and forest.cause.tolist() == first.tolist()
    assert hint.forest_of(first.copy())[1] is forest.order  # the idle breakdown's, kept
    other = np.array([-1, 0, 0, 0])
    hint.saw(other)  # the causes changed: not tried on the next run
    assert hint.guess() is None
    assert hint.forest_of(first)[1].tolist() == Forest.of(first).order.tolist()  # not kept
    hint.saw(other.copy())  # the same twice: tried again
    assert hint.guess().cause.tolist() == other.tolist()


SETTINGS = settings(max_examples=30, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(collapsible_experiments(),
       st.lists(st.sampled_from([0.5, 1.0, 1.7, 3.0]), min_size=2, max_size=5))
def test_passes_on_one_shape_at_changing_costs_equal_cold_ones(data: dict,
                                                                factors: list) -> None:
    """Passes on a kept shape with every compute time scaled by each factor in turn (the
    latest causes guessed, holding or not) give a cold pass's times, causes, intervals,
    memory and events, each."""
    result = simulate(build_experiment(data), fidelity="collapsed")
    instrs = result.program.instructions
    if not isinstance(instrs, ColumnarInstructions):
        return
    columns, program = instrs.columns, result.program

    def run(factor: float, cols: object) -> columnar.ColumnarPass | None:
        def timer(op: object) -> float:
            return factor * (op.duration_s if op.duration_s is not None else 1e-3)  # type: ignore[attr-defined]

        return columnar.run_columns(cols, timer, program.static_bytes,  # type: ignore[arg-type]
                                    program.simulated_gpus)

    warm = []
    colshape.clear()
    for factor in factors:
        warm.append(run(factor, dataclasses.replace(columns)))
    for factor, got in zip(factors, warm, strict=True):
        colshape.clear()
        cold = run(factor, dataclasses.replace(columns))
        if cold is None:
            assert got is None
            continue
        assert got is not None
        assert _bits(cold.ready_a) == _bits(got.ready_a) and cold.end_s == got.end_s
        assert list(cold.cause) == list(got.cause)
        assert (cold.peak_bytes, cold.floor_bytes) == (got.peak_bytes, got.floor_bytes)
        assert (cold.events, cold.clock) == (got.events, got.clock)
        assert dict(cold.intervals) == dict(got.intervals)


def test_a_sweep_over_one_blocking_1f1b_layout_reuses_its_runs() -> None:
    """GPT-3 175B TP8 PP16 DP8 with Megatron's blocking 1F1B sends (29,232 instructions),
    compute times scaled by a cycle of factors, as a sweep over one layout runs: a run whose
    totals equal a kept run's takes its results (:class:`sim.colshape.LatestRuns`), and every
    run's times, causes, intervals, memory and events are a cold pass's; the forests' sums
    along paths (:meth:`sim.chains.Forest.sum_levels`) give the levels' floats on the
    idle breakdown of each (a repeated run, in process, gives the cold run's stats JSON)."""
    import yaml

    from sim.experiment import Experiment

    data = yaml.safe_load(open("workloads/examples/search-gpt3-175b-1024.yaml",
                               encoding="utf-8"))
    data["parallel"].update({"tp": 8, "pp": 16, "dp": 8})
    colshape.clear()
    cold_json = simulate(Experiment.from_dict(data), fidelity="collapsed").stats_json()
    for _ in range(3):  # warm: the pass's hint, the memo, the forests' paths
        warm = simulate(Experiment.from_dict(data), fidelity="collapsed")
        assert warm.stats_json() == cold_json
    instrs = warm.program.instructions
    assert isinstance(instrs, ColumnarInstructions)
    columns, program = instrs.columns, warm.program

    def run(factor: float) -> columnar.ColumnarPass | None:
        def timer(op: object) -> float:
            return factor * (op.duration_s if op.duration_s is not None else 1e-3)  # type: ignore[attr-defined]

        return columnar.run_columns(dataclasses.replace(columns), timer,  # type: ignore[arg-type]
                                    program.static_bytes, program.simulated_gpus)

    factors = [1.0, 3.0, 0.5, 1.0, 3.0, 0.5, 3.0]
    colshape.clear()
    warm_runs = [run(factor) for factor in factors]
    memo = colshape.shape_of(columns).derived(("passes", tuple(program.simulated_gpus)),
                                              colshape.LatestRuns)
    assert len(memo.runs) == 3  # the repeats found their runs
    for factor, got in zip(factors, warm_runs, strict=True):
        colshape.clear()
        cold = run(factor)
        assert cold is not None and got is not None
        assert _bits(cold.ready_a) == _bits(got.ready_a) and cold.end_s == got.end_s
        assert list(cold.cause) == list(got.cause)
        assert (cold.peak_bytes, cold.floor_bytes) == (got.peak_bytes, got.floor_bytes)
        assert (cold.events, cold.clock) == (got.events, got.clock)
        assert dict(cold.intervals) == dict(got.intervals)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=60), st.data())
def test_the_forests_level_sums_are_sum_levels(back: list, data: st.DataObject) -> None:
    """:meth:`sim.chains.Forest.sum_levels` (each level's parents sliced once per forest,
    added in place) gives :func:`sim.chains.sum_levels`'s floats bit for bit, on rows of one
    value and of several (the idle breakdown's parts), ties, zeros, negative zeros and NaN
    included."""
    from sim.chains import level_plan, sum_levels

    cause = np.array([i - b if b and i - b >= 0 else -1 for i, b in enumerate(back)],
                     dtype=np.int64)
    n = len(cause)
    forest = Forest.of(cause)
    at, order, parent, bounds = level_plan(cause)
    assert forest.order.tolist() == order.tolist() and forest.bounds == bounds
    for width in (None, 3):
        shape = (n + 1,) if width is None else (n + 1, width)
        values = np.array(data.draw(st.lists(TIMES, min_size=int(np.prod(shape)),
                                             max_size=int(np.prod(shape))))).reshape(shape)
        values[n] = 0.0
        mine, theirs = values.copy(), values.copy()
        forest.sum_levels(mine)
        sum_levels(theirs, parent, bounds)
        assert _bits(mine) == _bits(theirs)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=80), st.data())
def test_sums_along_paths_are_sum_levels(back: list, data: st.DataObject) -> None:
    """:func:`sim.chains.sum_paths` (a running sum along each path of
    :func:`sim.chains.path_plan`, the rows a path at a time, padded groups) gives
    :func:`sim.chains.sum_levels`'s floats bit for bit on drawn forests (branching: a node's
    parent any earlier node), on rows of one value and of several, ties, zeros, negative
    zeros and NaN included; and :meth:`sim.chains.Forest.sum_levels`, which takes the paths
    from its second sum where they take fewer array passes, gives them on every call."""
    from sim.chains import level_plan, path_plan, sum_levels, sum_paths, widened

    cause = np.array([i - b if b and i - b >= 0 else -1 for i, b in enumerate(back)],
                     dtype=np.int64)
    n = len(cause)
    at, order, parent, bounds = level_plan(cause)
    plan = path_plan(parent, bounds)
    # every row on one path, each path's head's parent summed before it
    covered = np.concatenate([rows[cells] if cells is not None else rows.reshape(-1)
                              for _, rows, cells, _ in plan])
    assert sorted(covered.tolist()) == list(range(n))
    forest = Forest.of(cause)
    for width in (None, 1, 3):
        shape = (n + 1,) if width is None else (n + 1, width)
        values = np.array(data.draw(st.lists(TIMES, min_size=int(np.prod(shape)),
                                             max_size=int(np.prod(shape))))).reshape(shape)
        values[n] = 0.0
        theirs = values.copy()
        sum_levels(theirs, parent, bounds)
        mine = values.copy()
        sum_paths(mine.reshape(-1), plan if width is None else widened(plan, width))
        assert _bits(mine) == _bits(theirs)
        for _ in range(3):  # levels, then (where fewer passes) paths
            kept = values.copy()
            forest.sum_levels(kept)
            assert _bits(kept) == _bits(theirs)


def test_a_deep_forest_is_summed_along_paths() -> None:
    """A forest of long chains (as blocking 1F1B sends make: GPT-3 175B TP8 PP16, 1,462
    levels) is summed along a few paths from its second sum on, the same floats."""
    from sim.chains import level_plan, sum_levels

    rng = np.random.default_rng(7)
    n = 3000
    cause = np.array([-1] + [i - 1 if i % 50 else int(rng.integers(0, i)) for i in range(1, n)],
                     dtype=np.int64)
    forest = Forest.of(cause)
    _, _, parent, bounds = level_plan(cause)
    own = rng.random(n + 1)
    own[n] = 0.0
    theirs = own.copy()
    sum_levels(theirs, parent, bounds)
    for _ in range(3):
        mine = own.copy()
        forest.sum_levels(mine)
        assert _bits(mine) == _bits(theirs)
    assert forest._paths[1] is not None and len(forest._paths[1]) < len(forest.pieces)
    wide = rng.random((n + 1, 4))
    wide[n] = 0.0
    theirs = wide.copy()
    sum_levels(theirs, parent, bounds)
    mine = wide.copy()
    forest.sum_levels(mine)
    assert _bits(mine) == _bits(theirs) and 4 in forest._paths
    strided = np.asfortranarray(wide)  # (not contiguous: the levels)
    forest.sum_levels(strided)
    assert _bits(strided) == _bits(theirs)
