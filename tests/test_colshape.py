"""A program's shape (:mod:`sim.colshape`): what the passes keep of its structure changes
no result.

The queue-free engine pass and the idle breakdown keep what they derive from a columnar
program's structure on its shape (:func:`sim.colshape.shape_of`), shared by programs of
equal structure. Here: a run that finds its shape kept (warm: after a run of the same
structure, with the same or other costs) gives the bytes of a run that makes it (cold:
nothing kept); what the shape keeps equals what the pass's functions compute on the
columns (:func:`sim.columnar._intervals`, :func:`sim.columnar._memory`,
:func:`sim.columnar._ends`); structures that differ in any field get shapes of their own.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import collapsible_experiments

from sim import colshape, columnar
from sim.api import simulate
from sim.experiment import build_experiment
from sim.export import chrome_trace, dumps_trace
from workloads.program import ColumnarInstructions, Columns


def _columns(data: dict) -> tuple[Columns, object] | None:
    exp = build_experiment(data)
    result = simulate(exp, fidelity="collapsed")
    instrs = result.program.instructions
    if not isinstance(instrs, ColumnarInstructions):
        return None
    return instrs.columns, result.program


def _everything(data: dict) -> tuple[str, str]:
    result = simulate(build_experiment(data), fidelity="collapsed")
    return result.stats_json(), dumps_trace(chrome_trace(result.timeline, title="t"))


SETTINGS = settings(max_examples=40, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(collapsible_experiments())
def test_a_kept_shape_gives_the_bytes_of_a_new_one(data: dict) -> None:
    """Stats JSON and trace of a collapsed run: cold, then warm (its shape kept), and with
    a shape not kept (as a program above :data:`sim.colshape.KEPT_MAX_INSTRUCTIONS` gets),
    equal."""
    colshape.clear()
    cold = _everything(data)
    assert _everything(data) == cold
    limit = colshape.KEPT_MAX_INSTRUCTIONS
    colshape.KEPT_MAX_INSTRUCTIONS = 0
    try:
        colshape.clear()
        assert _everything(data) == cold
    finally:
        colshape.KEPT_MAX_INSTRUCTIONS = limit


@SETTINGS
@given(collapsible_experiments(), st.sampled_from([0.5, 1.0, 1.7]))
def test_the_pass_on_a_kept_shape_with_other_costs(data: dict, factor: float) -> None:
    """The engine's pass with every compute time scaled (another device, the same
    structure): on the shape kept by a run at the original costs, the times, causes,
    intervals, memory and events of a pass that finds nothing kept."""
    found = _columns(data)
    if found is None:
        return
    columns, program = found

    def timer(op: object) -> float:
        return factor * (op.duration_s if op.duration_s is not None else 1e-3)  # type: ignore[attr-defined]

    def run() -> columnar.ColumnarPass | None:
        return columnar.run_columns(columns, timer, program.static_bytes,  # type: ignore[attr-defined]
                                    program.simulated_gpus)  # type: ignore[attr-defined]

    colshape.clear()
    cold = run()
    copy = dataclasses.replace(columns)  # another program of the same structure
    assert colshape.shape_of(copy) is colshape.shape_of(columns)
    warm = columnar.run_columns(copy, timer, program.static_bytes,  # type: ignore[attr-defined]
                                program.simulated_gpus)  # type: ignore[attr-defined]
    if cold is None:
        assert warm is None
        return
    assert warm is not None
    assert np.array_equal(cold.ready_a, warm.ready_a) and cold.end_s == warm.end_s
    assert list(cold.cause) == list(warm.cause)
    assert (cold.peak_bytes, cold.floor_bytes) == (warm.peak_bytes, warm.floor_bytes)
    assert (cold.events, cold.clock) == (warm.events, warm.clock)
    assert dict(cold.intervals) == dict(warm.intervals)


@SETTINGS
@given(collapsible_experiments())
def test_the_plans_equal_the_functions_of_the_pass(data: dict) -> None:
    """What a shape keeps for the pass, applied to a run's times, equals the pass's
    functions on the columns: the intervals (grouped alike, the same slices), the memory
    peaks and floors, the end times."""
    found = _columns(data)
    if found is None:
        return
    columns, program = found
    gpus = program.simulated_gpus  # type: ignore[attr-defined]
    n = len(columns)
    rng = np.random.default_rng(n)
    start = np.cumsum(rng.random(n))
    mid = start + rng.random(n)
    end = mid + rng.random(n)
    dense = columnar._dense_gpus(columns)
    ref = columnar._intervals(columns, dense, start, mid, end)
    got = columnar._interval_plan(columns, dense).of(start, mid, end)
    assert np.array_equal(ref.start, got.start) and np.array_equal(ref.end, got.end)
    assert dict(ref.slices) == dict(got.slices) and dict(ref) == dict(got)
    static = program.static_bytes  # type: ignore[attr-defined]
    assert columnar._memory(columns, static, gpus, dense[:2]) == columnar._memory_of(
        columnar._memory_plan(columns, gpus, dense[:2]), columns, static)
    prev = columnar._stream_predecessors(columns, dense[1], dense[2])
    total = rng.random(n)
    assert columnar._ends(prev, columns.deps, total) == columnar._ends_with(
        columnar._ends_plan(prev, columns.deps), columns.deps, total)
    assert all(np.array_equal(a, b) for a, b in zip(
        columnar._recurrence(prev, columns.deps, total),
        columnar._recurrence(prev, columns.deps, total, columnar._plan(columns, gpus)),
        strict=True))


@SETTINGS
@given(collapsible_experiments(), st.data())
def test_another_structure_gets_a_shape_of_its_own(data: dict, draw: st.DataObject) -> None:
    """A program that differs from a kept one in one structural field, or in where a compute
    op blocks, allocates or frees, does not find that shape."""
    found = _columns(data)
    if found is None:
        return
    columns, _ = found
    kept = colshape.shape_of(columns)
    field = draw.draw(st.sampled_from(["cls", "gpu", "kind", "dst", "deps", "comm",
                                       "blocking_s", "alloc_bytes", "free_bytes"]))
    values = getattr(columns, field).copy()
    at = draw.draw(st.integers(0, len(columns) - 1))
    flat = values.reshape(len(columns), -1)
    flat[at, 0] = (flat[at, 0] + 1) if field != "blocking_s" else (0.0 if flat[at, 0] > 0
                                                                    else 1.0)
    if field in ("alloc_bytes", "free_bytes"):
        flat[at, 0] = 0.0 if getattr(columns, field)[at] else 1.0
    other = dataclasses.replace(columns, **{field: values})
    assert colshape.shape_of(other) is not kept


@SETTINGS
@given(collapsible_experiments(), st.sampled_from([0.5, 1.0, 1.7]))
def test_memory_peaks_on_a_table_equal_each_gpus_own(data: dict, scale: float) -> None:
    """The queue-free pass's memory peaks and floors with every GPU's samples summed along a
    row of one table (:func:`sim.columnar._memory_of`) equal those summed GPU by GPU
    (:func:`sim.columnar._peaks`, the plan without its table) and those of the plain pass
    (:func:`sim.columnar._memory`, the reference), bit for bit, with the changes scaled."""
    import dataclasses

    import numpy as np

    from sim import columnar
    from sim.api import simulate
    from sim.experiment import build_experiment
    from workloads.program import ColumnarInstructions

    result = simulate(build_experiment(data), fidelity="collapsed")
    instrs = result.program.instructions
    if not isinstance(instrs, ColumnarInstructions):
        return
    cols = instrs.columns
    cols = dataclasses.replace(cols, alloc_bytes=cols.alloc_bytes * scale,
                               free_bytes=cols.free_bytes * scale)
    gpus = result.program.simulated_gpus
    static = result.program.static_bytes
    plan = columnar._plan(cols, gpus)
    assert plan.memory.table is not None or not plan.memory.runs
    got = columnar._memory_of(plan.memory, cols, static)
    apart = columnar._memory_of(dataclasses.replace(plan.memory, table=None), cols, static)
    plain = columnar._memory(cols, static, gpus, plan.dense[:2])
    assert repr(got) == repr(apart) == repr(plain)
    assert all(isinstance(v, float | np.floating | int) for v in got[0].values())


@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collapsible_experiments(), collapsible_experiments(), st.sampled_from([0.5, 2.0]))
def test_a_structure_met_again_after_others_gives_the_bytes_of_a_new_one(
        first: dict, between: dict, factor: float) -> None:
    """A structure run, then another, then the first with other costs (its FFN widened: a
    search's later layout of an earlier structure, whose shape is kept but resumed, its
    chains not tried), then that again (back to back: tried): each the stats JSON and
    trace of a run that finds nothing kept."""
    model = first["model"]
    if "synthetic" in model:
        syn = model["synthetic"]
        other = {**first, "model": {**model, "synthetic": {
            **syn, "forward_ms": syn["forward_ms"] * factor}}}
    else:
        other = {**first, "model": {**model, "ffn_hidden_size": int(
            model["ffn_hidden_size"] * factor) or 1}}
    colshape.clear()
    cold = _everything(other)
    colshape.clear()
    cold_between = _everything(between)
    colshape.clear()
    _everything(first)
    assert _everything(between) == cold_between
    assert _everything(other) == cold
    assert _everything(other) == cold


def test_shapes_kept_by_count_and_instructions() -> None:
    """At most :data:`sim.colshape.KEPT` shapes and :data:`sim.colshape.KEPT_INSTRUCTIONS`
    instructions over them (the latest kept whatever it holds); a shape found again after
    another's lookup is ``resumed``, one looked up back to back is not."""

    def columns(n: int, gpu: int) -> Columns:
        return Columns(names=("F",), cls=np.zeros(n, dtype=np.int8),
                       gpu=np.full(n, gpu, dtype=np.int32), kind=np.zeros(n, dtype=np.int32),
                       dst=np.full(n, -1, dtype=np.int32), deps=np.full((n, 1), -1),
                       fixed_s=np.full(n, np.nan), blocking_s=np.zeros(n),
                       comm=np.full(n, -1, dtype=np.int32), alloc_bytes=np.zeros(n),
                       free_bytes=np.zeros(n), signature=np.zeros(n, dtype=np.int64),
                       signatures=())

    colshape.clear()
    a, b = columns(10, 0), columns(10, 1)
    sa = colshape.shape_of(a)
    assert colshape.shape_of(dataclasses.replace(a)) is sa and not sa.resumed
    sb = colshape.shape_of(b)
    assert colshape.shape_of(dataclasses.replace(a)) is sa and sa.resumed
    assert colshape.shape_of(dataclasses.replace(a)) is sa and not sa.resumed
    kept = [colshape.shape_of(columns(10, g)) for g in range(2, 2 + colshape.KEPT)]
    assert colshape.shape_of(dataclasses.replace(a)) is not sa  # pushed out by count
    assert colshape.shape_of(dataclasses.replace(b)) is not sb
    assert colshape.shape_of(columns(10, 2 + colshape.KEPT - 1)) is kept[-1]
    colshape.clear()
    limit = colshape.KEPT_INSTRUCTIONS
    colshape.KEPT_INSTRUCTIONS = 25
    try:
        small = colshape.shape_of(columns(10, 0))
        colshape.shape_of(columns(10, 1))
        assert colshape.shape_of(columns(10, 0)) is small  # 20 instructions: both kept
        big = colshape.shape_of(columns(30, 2))  # the latest, above the bound alone
        assert colshape._kept == [big]
    finally:
        colshape.KEPT_INSTRUCTIONS = limit
        colshape.clear()
