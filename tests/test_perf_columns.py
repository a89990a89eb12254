"""The columnar path of issue 7's third profiling pass gives exactly what the general paths give.

A collapsed lowering lays its op loop out on arrays (:class:`workloads.program.Columns`,
:class:`~workloads.program.ColumnarInstructions`), the engine runs such a program by the
array pass of :mod:`sim.columnar` and makes the span records from its times when first
read (:meth:`sim.timeline.Timeline.deferred`), and the idle breakdown splits
the gaps of all GPUs at once (:func:`sim.idle._columnar`). Each is compared here with the
path it stands in for, on several layouts and schedules (1F1B, GPipe, interleaved,
ZB-H1, ZB-H2, Seq1F1B, sequence parallelism, ZeRO 0, split and unsplit folded ops):

- the instructions, built on demand, against the reference op loop
  (``lower(..., reference=True)``), and the columns against the instructions;
- the engine's times, intervals, memory peaks, events and timeline against the event
  queue on the instruction objects, on layouts larger than ``tests/test_differential.py``
  draws; the declined cases (negative durations, dependencies on later ids) and
  instructions with many dependencies;
- the stats JSON, trace and idle breakdown of :func:`sim.api.simulate` against the same
  run with every columnar path switched off.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import api, columnar, idle
from sim import stats as stats_mod
from sim.commtime import CollectiveTimer
from sim.engine import EngineCounters, InstructionTimes, simulate_program
from sim.experiment import Experiment
from sim.export import chrome_trace, dumps_trace
from sim.idle import idle_breakdown
from sim.timeline import Timeline
from tests.strategies import collapsible_experiments
from tests.test_perf_paths import _cluster
from workloads import lowering
from workloads.lowering import Collapse, lower
from workloads.lowering import columnar as columnar_lowering
from workloads.lowering.collapse import Folded, stream_use
from workloads.program import (
    COMPUTE,
    ColumnarInstructions,
    Compute,
    Program,
    ProgramBuilder,
    columns_of,
)
from workloads.schedules import gpipe

LAYOUTS = [
    ({"tp": 2, "pp": 4, "dp": 2}, "1f1b", 1024),
    ({"tp": 2, "pp": 4, "dp": 2}, "gpipe", 1024),
    ({"tp": 4, "pp": 4, "dp": 2, "vpp": 2}, "interleaved", 128),  # split folded ops
    ({"tp": 8, "pp": 4, "dp": 1}, "1f1b", 128),  # split folded ops
    ({"tp": 8, "pp": 4, "dp": 1}, "zb-h1", 64),  # W ops without collectives
    ({"tp": 2, "pp": 4, "dp": 2}, "zb-h2", 1024),
    ({"tp": 4, "pp": 2, "dp": 2, "sequence_parallel": True}, "1f1b", 1024),
    ({"tp": 2, "pp": 2, "dp": 4, "zero_stage": 0}, "1f1b", 1024),
    ({"tp": 2, "pp": 2, "dp": 2}, "seq1f1b", 2048),
    ({"tp": 1, "pp": 4, "dp": 4}, "interleaved", 512),
]
IDS = [f"{s}-{'-'.join(f'{k}{v}' for k, v in p.items())}-s{q}" for p, s, q in LAYOUTS]


def _experiment(parallel: dict, schedule: str, seq: int) -> Experiment:
    par = dict(parallel)
    zero = par.pop("zero_stage", 1)
    gpus = par["tp"] * par["pp"] * par["dp"]
    data = {"name": "columns", "model": {"preset": "llama-7b", "num_layers": 8,
                                         "seq_length": seq},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": gpus},
            "parallel": {**par, "zero_stage": zero}, "schedule": schedule,
            "training": {"micro_batch_size": 1, "global_batch_size": 16}}
    if schedule == "seq1f1b":
        data["training"]["seq_chunks"] = 2
    return Experiment.from_dict(data)


def _collapse(exp: Experiment) -> Collapse:
    return Collapse(compute_s=lambda seg: seg.flops * 1e-15 + seg.hbm_bytes * 1e-12,
                    collective_s=CollectiveTimer(exp.cluster))


def _lowered(exp: Experiment, fast: bool = True) -> Program:
    return lower(exp.schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage,
                 _collapse(exp), reference=not fast)


def _plain(program: Program) -> Program:
    """``program`` with its instructions as a plain tuple (no columns)."""
    return Program(program.num_gpus, tuple(program.instructions), program.static_bytes,
                   program.schedule, program.gpu_names, program.simulated_gpus)


def _timer(ins: Compute) -> float:
    return ins.duration_s if ins.duration_s is not None else 0.0


def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every columnar path off: the general lowering loop, the event queue, the plain idle
    breakdown."""
    real = lowering._lower
    monkeypatch.setattr(lowering, "_lower", lambda *a: real(*a[:-1], True))  # reference
    monkeypatch.setattr("sim.engine.run_columns", lambda *a: None)
    monkeypatch.setattr(idle, "_columnar", lambda *a: None)


# ----------------------------------------------------------------------------- lowering

@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_columnar_lowering_builds_the_general_loops_program(layout: tuple) -> None:
    exp = _experiment(*layout)
    fast, general = _lowered(exp), _lowered(exp, fast=False)
    instrs = fast.instructions
    assert isinstance(instrs, ColumnarInstructions) and not instrs.built
    assert len(instrs) == len(general.instructions)
    assert not instrs.built  # len reads the columns
    assert fast == general
    assert repr(fast.instructions) == repr(general.instructions)
    # the columns hold what the instructions hold
    cols, plain = instrs.columns, columns_of(general.instructions)
    assert plain is not None
    names = np.array(cols.names + ("",))
    for field in ("cls", "gpu", "dst", "fixed_s", "blocking_s", "alloc_bytes",
                  "free_bytes"):
        assert np.array_equal(getattr(cols, field), getattr(plain, field), equal_nan=True)
    for field in ("kind", "comm"):
        assert list(names[getattr(cols, field)]) == list(
            np.array(plain.names + ("",))[getattr(plain, field)])
    width = max(cols.deps.shape[1], plain.deps.shape[1])
    assert np.array_equal(_padded(cols.deps, width), _padded(plain.deps, width))
    # a signature's representative equals each of its ops but in id, name, deps, mb
    for i in np.flatnonzero(cols.cls == COMPUTE).tolist():
        rep, ins = cols.signatures[cols.signature[i]], general.instructions[i]
        assert rep._replace(id=0, name="", deps=(), mb=0) == ins._replace(
            id=0, name="", deps=(), mb=0)


def _padded(deps: np.ndarray, width: int) -> np.ndarray:
    out = np.full((len(deps), width), -1, dtype=np.int64)
    out[:, :deps.shape[1]] = deps
    return out


def test_split_decisions_on_arrays_equal_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which folded ops are split (the per-rank, per-kind pending time of the general loop):
    on arrays where every op has collectives, all of one kind, op by op otherwise; the same
    decisions, and the program of the general loop."""
    exp = _experiment({"tp": 8, "pp": 4, "dp": 1}, "1f1b", 128)
    seen = []
    real = columnar_lowering._split_ops

    def both(plans, plan_of, rank_at, ranks, kinds):  # type: ignore[no-untyped-def]
        out = real(plans, plan_of, rank_at, ranks, kinds)
        # a plan without collectives (used by no op) sends it down the op-by-op loop
        pure = Folded((), plans[0].folded.whole, None, (), None, ())
        idle = columnar_lowering._Plan(0, 0, pure, 0.0, 0.0, None, None, stream_use([]))
        loop = real([*plans, idle], plan_of, rank_at, ranks, kinds)
        seen.append((out.tolist(), loop.tolist()))
        return out

    monkeypatch.setattr(columnar_lowering, "_split_ops", both)
    program = _lowered(exp)
    ((arrays, loop),) = seen
    assert arrays == loop and 0 < sum(arrays) < len(arrays)
    assert program == _lowered(exp, fast=False)


_KINDS = ("tp", "cp", "ep")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sets(st.sampled_from(_KINDS)), st.sets(st.sampled_from(_KINDS)),
                          st.sets(st.sampled_from(_KINDS))), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(-1, 30),
                          st.integers(-1, 30)), min_size=1, max_size=30),
       st.integers(1, 3))
def test_cut_decisions_kept_per_structure_equal_the_plain_ones(uses: list, ops: list,
                                                                 calls: int) -> None:
    """:func:`workloads.lowering.columnar._cut_ops` (the pairs of a rank's consecutive users
    of a kind kept per structure, :func:`~workloads.lowering.columnar._next_users`) gives
    the bits of :func:`~workloads.lowering.columnar._cut_ops_plain` (the reference) on
    drawn plans (which kinds each uses, leads with, folds last), ops (plan, rank, producer
    positions, -1 or later ones included), on its first call and on calls that find the
    pairs kept."""
    from types import SimpleNamespace

    plans = [SimpleNamespace(use=SimpleNamespace(kinds=frozenset(k), leading=frozenset(lead),
                                                 folded_last=frozenset(last)))
             for k, lead, last in uses]
    plan_of = np.array([p % len(plans) for p, _, _, _ in ops], dtype=np.int64)
    rank_at = np.array([r for _, r, _, _ in ops], dtype=np.int64)
    n = len(ops)
    cols = tuple(np.array([x if x < n else -1 for x in col], dtype=np.int64)
                 for col in zip(*[(a, b) for _, _, a, b in ops], strict=True))
    kinds = sorted({k for p in plans for k in p.use.kinds})
    plain = columnar_lowering._cut_ops_plain(plans, plan_of, rank_at, cols, kinds)
    for _ in range(calls):
        got = columnar_lowering._cut_ops(plans, plan_of, rank_at, cols, kinds)
        assert got.tolist() == plain.tolist()


# ----------------------------------------------------------------------------- engine

def _reference(program: Program, timer=_timer):  # type: ignore[no-untyped-def]
    """The event queue's timeline, counters and times of ``program`` as instruction objects."""
    counters, times = EngineCounters(), InstructionTimes()
    timeline = simulate_program(_plain(program), _cluster(program.num_gpus), timer, counters,
                                event_queue=True, times=times)
    return timeline, counters, times


def _columnar_run(program: Program, timer=_timer):  # type: ignore[no-untyped-def]
    counters, times = EngineCounters(), InstructionTimes()
    timeline = simulate_program(program, _cluster(program.num_gpus), timer, counters,
                                times=times)
    return timeline, counters, times


def _sorted_intervals(intervals: dict) -> dict:
    return {k: sorted(zip(v[0::2], v[1::2], strict=True)) for k, v in intervals.items()}


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_columnar_pass_equals_the_event_queue(layout: tuple) -> None:
    """On lowered layouts larger than the differential test's: the array pass's times,
    events, intervals, makespan, memory peaks and (deferred) records equal the reference's."""
    exp = _experiment(*layout)
    program = _lowered(exp)
    timeline, counters, times = _columnar_run(program)
    assert not program.instructions.built and not timeline.records_made
    reference, ref_counters, ref_times = _reference(program)
    assert list(times.ready_s) == ref_times.ready_s and list(times.end_s) == ref_times.end_s
    assert counters.events == ref_counters.events
    assert counters.instructions == len(ref_times.end_s)
    assert _sorted_intervals(times.intervals) == _sorted_intervals(
        stats_mod.span_intervals(reference.spans))
    assert np.array_equal(times.arrays[0], ref_times.ready_s)
    assert np.array_equal(times.arrays[1], ref_times.end_s)
    assert repr(timeline.end_s) == repr(reference.end_s)
    assert timeline.peak_memory_by_gpu == reference.peak_memory_by_gpu
    fresh = Timeline(reference.num_gpus, reference.spans, reference.flows, reference.memory)
    assert timeline.memory_floor_by_gpu == fresh.memory_floor_by_gpu
    assert not timeline.records_made
    assert timeline == reference  # the records, made now from the pass's times
    assert timeline.records_made


def _fixed(deps_of_last: tuple[int, ...] = (), late: bool = False, negative: bool = False,
           negative_collective: bool = False) -> Program:
    """Three GPUs: compute with memory and blocking communication, sends, one-member
    collectives, and a last compute op on GPU 0 waiting on ``deps_of_last``."""
    b = ProgramBuilder()
    c0 = b.compute(0, "F", "a", (), duration_s=1.0, alloc_bytes=5.0, blocking_comm_s=0.5)
    s0 = b.send(0, 1, 8.0, "pp", "a act", (c0,), duration_s=0.25)
    c1 = b.compute(1, "F", "b", (s0,), duration_s=-2.0 if negative else 2.0,
                   alloc_bytes=3.0, free_bytes=1.0)
    s1 = b.send(1, 2, 8.0, "pp", "b act", (c1,), duration_s=0.25)
    c2 = b.compute(2, "B", "c", (s1,), duration_s=0.5, free_bytes=4.0)
    t2 = b.collective((2,), {2: (c2,)}, kind="tp", name="c tp", op="all_reduce",
                      nbytes=1.0, duration_s=0.3)[2]
    d1 = b.collective((1,), {1: (c1,)}, kind="dp", name="b dp", op="all_reduce",
                      nbytes=1.0, duration_s=-0.75 if negative_collective else 0.75)[1]
    b.compute(0, "opt", "opt", deps_of_last or (c0, s0, c1, s1, c2, t2, d1),
              duration_s=0.5, free_bytes=5.0)
    if late:
        b.compute(2, "W", "late", (len(b.instructions) + 1,), duration_s=1.0)
        b.compute(1, "W", "later", (), duration_s=1.0)
    return Program(3, tuple(b.instructions), (10.0, 20.0, 30.0), gpipe(3, 1))


def _as_columns(program: Program) -> Program:
    instrs = tuple(program.instructions)
    cols = columns_of(instrs)
    assert cols is not None
    return Program(program.num_gpus, ColumnarInstructions(cols, lambda: instrs),
                   program.static_bytes, program.schedule)


def test_many_dependencies_take_the_general_loop_of_the_pass() -> None:
    """An instruction with more than three dependencies (the last one's seven): the array
    pass reads them in full, with the event queue's tie rules."""
    program = _as_columns(_fixed())
    assert program.instructions.columns.deps.shape[1] > columnar.WIDE
    timeline, counters, times = _columnar_run(program)
    reference, ref_counters, ref_times = _reference(program)
    assert (list(times.ready_s), list(times.end_s)) == (ref_times.ready_s, ref_times.end_s)
    assert counters.events == ref_counters.events
    assert timeline == reference


@pytest.mark.parametrize("case", ["negative", "negative collective", "late"])
def test_the_pass_declines_negative_durations_and_later_dependencies(case: str) -> None:
    """A negative duration (a compute op's, a collective's), a dependency on a later id: the
    array pass does nothing and the event queue runs the program (the result equals that of
    a plain program; a negative collective, the queue's error)."""
    program = _as_columns(_fixed(negative=case == "negative", late=case == "late",
                                 negative_collective=case == "negative collective"))
    cols = program.instructions.columns
    assert columnar.run_columns(cols, _timer, program.static_bytes, (0, 1, 2)) is None
    if case == "negative collective":
        for each in (program, _plain(program)):
            with pytest.raises(ValueError, match="Negative delay -0.75"):
                simulate_program(each, _cluster(3), _timer)
        return
    out = simulate_program(program, _cluster(3), _timer)
    assert program.instructions.built
    assert out == simulate_program(_plain(program), _cluster(3), _timer)


def test_compute_ops_are_timed_once_per_signature() -> None:
    exp = _experiment({"tp": 2, "pp": 4, "dp": 2}, "1f1b", 1024)
    program = _lowered(exp)
    seen = []
    _columnar_run(program, lambda ins: seen.append(ins) or 1e-3)
    cols = program.instructions.columns
    assert len(seen) == len(cols.signatures) < int((cols.cls == COMPUTE).sum()) // 4


# ----------------------------------------------------------------------------- containers

def test_columnar_instructions_behave_as_their_tuple() -> None:
    program = _as_columns(_fixed())
    instrs, plain = program.instructions, tuple(_fixed().instructions)
    assert len(instrs) == len(plain) and not instrs.built
    assert instrs == plain and plain == instrs and hash(instrs) == hash(plain)
    assert repr(instrs) == repr(plain) and list(instrs) == list(plain)
    assert instrs[2] == plain[2] and instrs[1:3] == plain[1:3] and instrs[-1] in instrs
    assert instrs.index(plain[3]) == 3 and instrs.count(plain[0]) == 1
    assert instrs + () == plain and () + instrs == plain
    assert pickle.loads(pickle.dumps(instrs)) == plain
    assert instrs != list(plain)


def test_deferred_timeline_makes_its_records_once_when_read() -> None:
    made = []
    span_of = Timeline(1, (), (), ())

    def records():  # type: ignore[no-untyped-def]
        made.append(1)
        return span_of.spans, span_of.flows, span_of.memory, span_of.collectives

    timeline = Timeline.deferred(1, records, (), None, end_s=2.5, peak_memory_by_gpu={0: 1.0})
    assert timeline.end_s == 2.5 and timeline.peak_memory_bytes(0) == 1.0 and not made
    assert pickle.loads(pickle.dumps(timeline)) == Timeline(1, (), (), ())
    assert made == [1] and timeline.records_made
    assert copy.copy(timeline).spans == () and timeline.flows == () and made == [1]
    assert timeline.collectives == ()
    with pytest.raises(AttributeError):
        timeline.no_such_field  # noqa: B018


# ----------------------------------------------------------------------------- end to end

@pytest.mark.parametrize("layout", LAYOUTS[::2] + LAYOUTS[1::4], ids=IDS[::2] + IDS[1::4])
def test_simulate_gives_the_bytes_of_the_general_paths(layout: tuple,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Stats JSON, trace and idle breakdown with a window: byte for byte those of the run
    without any columnar path."""
    exp = _experiment(*layout)
    outs = []
    for off in (False, True):
        if off:
            _no_columns(monkeypatch)
        result = api.simulate(exp, fidelity="collapsed")
        # several steps (ZB-H2: overlapping steps) repeat the program as objects
        assert isinstance(result.program.instructions, ColumnarInstructions) == (
            not off and result.steps == 1)
        times = InstructionTimes()
        simulate_program(result.program, exp.cluster, _timer, times=times)
        window = (result.timeline.end_s / 4, result.timeline.end_s / 2)
        ready, end = times.arrays or (times.ready_s, times.end_s)
        shares = idle_breakdown(result.program, ready, end, result.timeline.simulated_gpus,
                                None, window, times.cause)
        outs.append((result.stats_json(), dumps_trace(chrome_trace(result.timeline, "x")),
                     repr(shares)))
    assert outs[0] == outs[1]


def test_idle_declines_blocking_communication_of_an_unknown_kind() -> None:
    """A folded op whose blocking communication is of a kind outside the breakdown's parts
    adds to ``bubble`` twice: the columnar split declines and the general one runs."""
    b = ProgramBuilder()
    c0 = b.compute(0, "F", "a", (), duration_s=1.0, blocking_comm_s=0.5,
                   blocking_comm_kind="xx")
    b.compute(0, "B", "b", (c0,), duration_s=1.0)
    program = _as_columns(Program(1, tuple(b.instructions), (0.0,), gpipe(1, 1)))
    _, _, times = _columnar_run(program)
    cols = program.instructions.columns
    assert idle._columnar(cols, times.ready_s, times.end_s, times.cause, (0,), None) is None
    fast = idle_breakdown(program, times.ready_s, times.end_s, (0,), None, None, times.cause)
    assert fast == idle_breakdown(_plain(program), times.ready_s, times.end_s, (0,))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3),
                          st.sampled_from([0.0, 0.25, 1 / 3, 1.5])), min_size=1, max_size=40),
       st.integers(0, 3))
def test_chain_sums_equal_a_plain_loop(rows: list, late: int) -> None:
    """Sums along chains (a level of the chains at a time, five arrays, one a late starter)
    against the plain recurrence, the same floats."""
    n = len(rows)
    cause = [-1 if i == 0 or back == 0 else i - 1 - (back - 1) % i
             for i, (back, _, _) in enumerate(rows)]
    owns = []
    for part in range(5):
        own = np.array([x if p == part % 4 else 0.0 for _, p, x in rows])
        if part == 4:  # a late starter
            own[: max(0, n - late)] = 0.0
        owns.append(own)
    got = idle._chain_sums(cause, owns)
    for k, own in enumerate(owns):
        sums = [0.0] * (n + 1)
        for i in range(n):
            sums[i] = sums[cause[i]] + own[i]
        assert got[k].tolist() == sums


pairs = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)).map(
    lambda t: (t[0] / 8, t[1] / 8 + t[0] / 3)), max_size=80)


@settings(max_examples=100, deadline=None)
@given(pairs, pairs)
def test_short_union_against_long_one_equals_the_loops(a: list, b: list) -> None:
    """:func:`sim.stats._exposed` of a short union (pairs) and a long one (arrays): the
    floats of :func:`sim.stats._minus` on pairs."""
    short = stats_mod._union(a)
    long = stats_mod._Merged(np.array([x for x, _ in b], dtype=float),
                             np.array([y for _, y in b], dtype=float))
    if short:
        assert repr(stats_mod._exposed(short, long)) == repr(
            stats_mod._minus(short, long.as_pairs()))


def recurrence_case(rows: list, deps_dtype: type = np.int64, min_width: int = 0
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[list, list, list]]:
    """A program for :func:`sim.columnar._recurrence` from ``rows`` of (stream back-step,
    dependency back-steps, duration), and the plain recurrence's answer with its tie rules:
    ``(prev, deps, total, (ready, end, cause))``. ``deps`` has ``deps_dtype`` and at least
    ``min_width`` columns."""
    n = len(rows)
    prev = np.array([i - back if 0 < back <= i else -1 for i, (back, _, _) in enumerate(rows)],
                    dtype=np.int64)
    found = [[i - b for b in backs if i - b >= 0] for i, (_, backs, _) in enumerate(rows)]
    width = max(max((len(d) for d in found), default=0), min_width)
    deps = np.full((n, width), -1, dtype=deps_dtype)
    for i, d in enumerate(found):
        deps[i, :len(d)] = d
    total = np.array([x for *_, x in rows], dtype=float)
    end = [0.0] * n + [-1.0]  # (an absent predecessor, -1, reads -1.0)
    ready, cause = [0.0] * n, [-1] * n
    for i in range(n):
        t, best = end[prev[i]], int(prev[i])
        for d in found[i]:
            if end[d] > t:
                t, best = end[d], d
        ready[i], cause[i], end[i] = max(t, 0.0), best, max(t, 0.0) + total[i]
    return prev, deps, total, (ready, end[:n], cause)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(1, 6), max_size=5),
                          st.sampled_from([0.0, 0.25, 1 / 3, 1.5, 2.0])), max_size=40))
def test_recurrence_equals_the_plain_loop(rows: list) -> None:
    """:func:`sim.columnar._recurrence` (ends in a loop on arrays, ready times and causes read
    off them; instructions with more than WIDE dependencies among them) against the plain
    recurrence with its tie rules: the same floats and causes."""
    prev, deps, total, (ready, end, cause) = recurrence_case(rows)
    got_ready, got_end, got_cause = columnar._recurrence(prev, deps, total)
    assert got_ready.tolist() == ready and got_end.tolist() == end
    assert got_cause.tolist() == cause


@settings(max_examples=30, deadline=None, derandomize=True)
@given(collapsible_experiments(),
       st.lists(st.sampled_from([0.5, 1.0, 1.7, 3.0]), min_size=2, max_size=6),
       st.booleans())
def test_kept_busy_and_exposed_times_equal_the_reference(data: dict, factors: list,
                                                         windowed: bool) -> None:
    """Runs on a kept shape, every compute time scaled by each factor in turn (a repeated
    factor gives the same intervals: :func:`sim.stats._busy_exposed` finds its kept
    result): each run's busy and exposed times are :func:`sim.stats._busy_exposed_made`'s
    on its intervals, bit for bit (their ``repr``), and a caller's writes to one do not
    reach the next."""
    import dataclasses

    from sim import colshape
    from sim.experiment import build_experiment
    from workloads.program import ColumnarInstructions

    result = api.simulate(build_experiment(data), fidelity="collapsed")
    program = result.program
    if not isinstance(program.instructions, ColumnarInstructions):
        return
    columns, gpus = program.instructions.columns, program.simulated_gpus
    colshape.clear()
    for factor in factors:
        def timer(op: object, factor: float = factor) -> float:
            return factor * (op.duration_s if op.duration_s is not None else 1e-3)  # type: ignore[attr-defined]

        got = columnar.run_columns(dataclasses.replace(columns), timer, program.static_bytes,
                                   gpus)
        if got is None:
            return
        assert got.intervals.runs is not None  # a kept shape's
        window = (0.25 * got.clock, 0.75 * got.clock) if windowed else None
        kept = stats_mod._busy_exposed(got.intervals, gpus, window)
        assert repr(kept) == repr(stats_mod._busy_exposed_made(got.intervals, gpus, window))
        kept[0].append(-1.0)  # a caller's writes stay its own
        kept[1]["pp"] = -1.0
    assert len(got.intervals.runs) <= len(set(factors))
