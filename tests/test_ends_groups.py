"""The engine pass's end-time loop a group a step (:func:`sim.columnar._step_groups`, the
layout of :func:`sim.columnar._groups`) gives the loop an instruction a step
(``_ends_plan(..., grouped=False)``, the reference) bit for bit: on random programs whose
dependencies are all on earlier ids (runs of instructions each waiting on the one before
it, of any length; ties; zero, negative zero, infinite and NaN times), and on the
columns of random collapsed programs."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import collapsible_experiments

from sim import columnar
from sim.api import simulate
from sim.experiment import build_experiment
from workloads.program import ColumnarInstructions

TIMES = st.one_of(st.integers(0, 3).map(float), st.floats(0, 10),
                  st.sampled_from([0.0, -0.0, float("inf"), float("nan")]))


@st.composite
def programs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stream predecessors, dependencies (each instruction's first, -1 after) and totals."""
    n = draw(st.integers(1, 60))
    width = draw(st.integers(1, 4))
    prev = np.full(n, -1, dtype=np.int64)
    deps = np.full((n, width), -1, dtype=np.int64)
    for i in range(n):
        if i and draw(st.booleans()):
            prev[i] = draw(st.integers(0, i - 1))
        if not i:
            continue
        count = draw(st.integers(0, min(width, 2)))
        chained = draw(st.integers(0, 3)) > 0  # often the instruction just before
        found = [i - 1] if chained and count else []
        while len(found) < count:
            found.append(draw(st.integers(0, i - 1)))
        deps[i, :count] = found
    total = np.array(draw(st.lists(TIMES, min_size=n, max_size=n)), dtype=float)
    return prev, deps, total


def _bits(ends: list[float]) -> np.ndarray:
    return np.array(ends, dtype=float).view(np.int64)


def _both(prev: np.ndarray, deps: np.ndarray, total: np.ndarray) -> None:
    grouped = columnar._ends_plan(prev, deps)
    plain = columnar._ends_plan(prev, deps, grouped=False)
    assert plain[3] is None
    got = columnar._ends_with(grouped, deps, total)
    want = columnar._ends_with(plain, deps, total)
    assert np.array_equal(_bits(got), _bits(want))
    if grouped[3] is not None:  # every instruction in one group, in order, 3 at most
        heads = grouped[3][0]
        assert heads[0] == 0 and (np.diff(heads, append=len(prev)) <= 3).all()


@settings(max_examples=400, deadline=None, derandomize=True)
@given(programs())
def test_the_grouped_loop_is_the_loop(program: tuple[np.ndarray, np.ndarray, np.ndarray]
                                      ) -> None:
    _both(*program)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collapsible_experiments(), st.integers(0, 2**16))
def test_the_grouped_loop_on_programs(data: dict, seed: int) -> None:
    result = simulate(build_experiment(data), fidelity="collapsed")
    instrs = result.program.instructions
    if not isinstance(instrs, ColumnarInstructions):
        return
    columns = instrs.columns
    dense = columnar._dense_gpus(columns)
    prev = columnar._stream_predecessors(columns, dense[1], dense[2])
    rng = np.random.default_rng(seed)
    n = len(columns)
    for total in (rng.random(n), rng.integers(0, 3, n).astype(float)):
        _both(prev, columns.deps, total)


def test_megatron_like_triples_take_groups() -> None:
    """A compute, its collective and its send (each waiting on the one before) on each of
    two GPUs, the computes chained across them: groups of three."""
    n = 12
    prev = np.array([-1, -1, -1, 0, 1, 2, -1, -1, -1, 6, 7, 8], dtype=np.int64)
    deps = np.full((n, 2), -1, dtype=np.int64)
    deps[1::3, 0] = np.arange(0, n, 3)
    deps[2::3, 0] = np.arange(1, n, 3)
    deps[6, 0], deps[9, 0] = 2, 5  # a receive: the other GPU's send
    deps[9, 1] = 3
    plan = columnar._ends_plan(prev, deps)
    assert plan[3] is not None and plan[3][0].tolist() == [0, 3, 6, 9]
    _both(prev, deps, np.array([1.0, 0.5, 0.25] * 4))


def _heads_one_by_one(deps: np.ndarray) -> list[int]:
    """The groups' heads of :func:`sim.columnar._groups` walked instruction by instruction:
    a head where an instruction does not wait on exactly the one before it, or where the
    group so far has three members."""
    heads: list[int] = []
    size = 0
    for i in range(len(deps)):
        follows = i > 0 and deps[i, 0] == i - 1 and (deps.shape[1] < 2 or deps[i, 1] < 0)
        if not follows or size == 3:
            heads.append(i)
            size = 0
        size += 1
    return heads


@settings(max_examples=300, deadline=None, derandomize=True)
@given(programs())
def test_the_groups_heads_are_the_walks(program: tuple[np.ndarray, np.ndarray, np.ndarray]
                                        ) -> None:
    """The heads (long runs cut every third instruction, the cuts merged into the heads by a
    stable sort) are those of the walk one instruction at a time."""
    prev, deps, _ = program
    plan = columnar._ends_plan(prev, deps)
    if plan[3] is not None:
        assert plan[3][0].tolist() == _heads_one_by_one(deps)
