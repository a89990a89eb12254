"""The array forms of the second profiling pass of issue 7 give exactly the floats (and
errors) of the plain loops they stand in for.

- statistics: :class:`sim.stats._Merged` against :func:`~sim.stats._union`,
  :func:`~sim.stats._length` and :func:`~sim.stats._minus`; the intervals the engine
  records (:attr:`sim.engine.InstructionTimes.intervals`) against those read back from
  the timeline; every list by the array form against every list by the loops;
- the queue-free pass's latest predecessors (:attr:`~sim.engine.InstructionTimes.cause`)
  and its precomputed makespan and memory peaks against the plain computations;
- the idle breakdown's fast path against its reference;
- schedules: :func:`~workloads.schedules.producer_positions` against :func:`op_deps`,
  the unfused list schedule and the array validity check against the general ones;
  lowering's topological order against its sort-key definition.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import idle as idle_mod
from sim import stats as stats_mod
from sim.api import simulate
from sim.engine import InstructionTimes, simulate_program
from sim.experiment import Experiment
from sim.idle import idle_breakdown
from sim.stats import _length, _Merged, _minus, _union, compute_stats, span_intervals
from sim.timeline import Timeline
from workloads import schedules as sched_mod
from workloads.lowering import topological_ops
from workloads.registry import SCHEDULES as REGISTRY
from workloads.schedules import Op, Schedule, list_schedule, op_deps, unit_times, validate

# ----------------------------------------------------------------------------- stats

pairs = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)).map(
    lambda t: (t[0] / 8, t[1] / 8 + t[0] / 3)), max_size=200)


def _arrays(ivs: list[tuple[float, float]]) -> _Merged:
    import numpy as np

    return _Merged(np.array([a for a, _ in ivs], dtype=float),
                   np.array([b for _, b in ivs], dtype=float))


@settings(max_examples=200, deadline=None)
@given(pairs, pairs)
def test_merged_arrays_equal_the_loops(a: list, b: list) -> None:
    """Union, length and uncovered length: the same floats as the plain loops (thirds and
    eighths: sums that round), empty and touching intervals included."""
    ua, ub = _union(a), _union(b)
    ma, mb = _arrays(a), _arrays(b)
    assert list(zip(ma.lo.tolist(), ma.hi.tolist(), strict=True)) == ua
    assert repr(ma.length) == repr(_length(ua))
    if ua:
        assert repr(ma.uncovered(mb)) == repr(_minus(ua, ub))
        assert repr(ma.uncovered(mb)) == repr(_minus(ma.as_pairs(), mb.as_pairs()))
    assert bool(ma) == bool(ua)


grid = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)).map(
    lambda t: (t[0] / 4, t[0] / 4 + t[1] / 4)), max_size=120)
"""Intervals on a coarse grid: many ends of one union at the other's starts and ends."""


@settings(max_examples=300, deadline=None)
@given(st.one_of(pairs, grid), st.one_of(pairs, grid))
def test_uncovered_by_merging_is_the_binary_search(a: list, b: list) -> None:
    """:meth:`sim.stats._Merged.uncovered` (positions by merging the sorted unions) gives the
    floats of :meth:`~sim.stats._Merged.uncovered_searched` (a binary search per interval),
    either union empty, touching or sharing ends included; and both those of the loop."""
    ma, mb = _arrays(a), _arrays(b)
    assert repr(ma.uncovered(mb)) == repr(ma.uncovered_searched(mb))
    assert repr(mb.uncovered(ma)) == repr(mb.uncovered_searched(ma))
    if ma:
        assert repr(ma.uncovered(mb)) == repr(_minus(_union(a), _union(b)))


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_a_union_as_arrays_is_the_merge_of_its_intervals(a: list) -> None:
    """:meth:`sim.stats._Merged.of_union` of :func:`~sim.stats._union`'s intervals: the
    arrays and length :class:`~sim.stats._Merged` makes of the raw intervals, bit for bit."""
    union = _union(a)
    if not union:
        return
    kept, merged = _Merged.of_union(union), _arrays(a)
    assert kept.lo.tobytes() == merged.lo.tobytes() and kept.hi.tobytes() == merged.hi.tobytes()
    assert repr(kept.length) == repr(merged.length)


def _experiment(**changes: object) -> Experiment:
    data = {"name": "arrays", "model": {"preset": "llama-7b", "num_layers": 8,
                                        "seq_length": 1024},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
            "parallel": {"tp": 2, "pp": 4, "dp": 2, "vpp": 2}, "schedule": "interleaved",
            "training": {"micro_batch_size": 1, "global_batch_size": 32}}
    for key, value in changes.items():
        data[key] = value
    return Experiment.from_dict(data)


@pytest.mark.parametrize("fidelity", ["collapsed", "full"])
def test_recorded_intervals_give_the_stats_of_the_timeline(fidelity: str, monkeypatch) -> None:
    """The stats from the engine's intervals equal those read back from the spans, with every
    list merged by the loops (SMALL huge) or by the arrays (SMALL 0)."""
    result = simulate(_experiment(), fidelity=fidelity)
    times = InstructionTimes()
    exp = result.experiment
    timeline = simulate_program(result.program, exp.cluster, _timer(exp), times=times)
    assert timeline == result.timeline
    # the queue-free pass and the run on the own heap have them without spans
    assert times.intervals is not None
    read = span_intervals(timeline.spans)
    recorded = {k: list(v) for k, v in (times.intervals or read).items() if len(v)}
    assert {k: sorted(zip(v[0::2], v[1::2], strict=True)) for k, v in recorded.items()} == {
        k: sorted(zip(v[0::2], v[1::2], strict=True)) for k, v in read.items()}
    facts = _facts(result)
    outs = []
    for small in (10**9, 0):
        monkeypatch.setattr(stats_mod, "SMALL", small)
        outs.append(repr(compute_stats(timeline, facts, None, times.intervals)))
        outs.append(repr(compute_stats(timeline, facts)))
        outs.append(repr(compute_stats(timeline, facts, (timeline.end_s / 3,
                                                         timeline.end_s / 2))))
    assert outs[0] == outs[1] == outs[3] == outs[4]
    assert outs[2] == outs[5]
    assert repr(result.stats["bubble_fraction"]) in outs[0]


_COLLAPSED: list = []


def _collapsed_run() -> tuple:
    """A collapsed run's timeline and facts, once for the tests that swap its intervals."""
    if not _COLLAPSED:
        result = simulate(_experiment(), fidelity="collapsed")
        _COLLAPSED.append((result.timeline, _facts(result)))
    return _COLLAPSED[0]


_NAMES = ("F", "tp", "pp", "dp", "compute")


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 60),
                               st.integers(-4, 60)), max_size=150),
       window=st.sampled_from([None, (1 / 3, 5.0), (2.0, 2.5)]),
       small=st.sampled_from([10**9, 4, 0]))
def test_interval_columns_give_the_stats_of_the_flat_lists(rows: list, window, small: int
                                                           ) -> None:
    """:class:`sim.intervalcols.IntervalColumns` (what the queue-free pass hands the
    statistics) read by key as slices against the same intervals as flat lists (the
    reference, :func:`sim.stats._union_flat`): the same stats, by the loops or the arrays;
    as a mapping, the same flat lists."""
    from sim.intervalcols import IntervalColumns

    timeline, facts = _collapsed_run()
    gpus = np.array(sorted({*timeline.simulated_gpus, 999}))
    key = np.array([g * len(_NAMES) + c for g, c, _, _ in rows], dtype=np.intp)
    start = np.array([a / 8 for _, _, a, _ in rows])
    end = np.array([a / 8 + d / 3 for _, _, a, d in rows])
    cols = IntervalColumns(gpus, _NAMES, key, start, end)
    flat: dict = {}
    for (g, c, _, _), a, b in zip(rows, start.tolist(), end.tolist(), strict=True):
        flat.setdefault((int(gpus[g]), _NAMES[c]), []).extend((a, b))
    assert {k: list(v) for k, v in cols.items()} == flat
    before, stats_mod.SMALL = stats_mod.SMALL, small
    try:
        assert repr(compute_stats(timeline, facts, window, cols)) == repr(
            compute_stats(timeline, facts, window, flat))
    finally:
        stats_mod.SMALL = before


@settings(max_examples=200, deadline=None)
@given(bound=st.sampled_from([1, 3, 256, 257, 300, 816, 5000, 65536, 65537, 1 << 20]),
       distinct=st.integers(1, 400), size=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1))
def test_radix_sorts_of_small_keys_equal_the_stable_sort(bound: int, distinct: int, size: int,
                                                         seed: int) -> None:
    """:func:`sim.intervalcols.grouped` (one byte pass, two byte passes, or the sort itself)
    and the lowering's sort of pipeline ranks
    (:func:`workloads.lowering.columnar._by_rank`) give the permutation of numpy's stable
    sort of the keys as int64 (the reference)."""
    from sim.intervalcols import grouped
    from workloads.lowering.columnar import _by_rank

    rng = np.random.default_rng(seed)
    values = rng.choice(bound, size=min(distinct, bound), replace=False)
    key = rng.choice(values, size=size).astype(np.int64)
    reference = np.argsort(key, kind="stable")
    assert np.array_equal(grouped(key, bound), reference)
    assert np.array_equal(_by_rank(key), reference)


def _timer(exp: Experiment):  # the api's compute timer of a homogeneous cluster
    from sim.calibration import default_profile
    from sim.device import compute_time_s

    gpu, profile = exp.cluster.gpu, default_profile(exp.cluster.gpu.name)

    def timer(item):
        if item.duration_s is not None:
            return item.duration_s
        return compute_time_s(gpu, profile, item.flops, item.hbm_bytes, item.attn_flops,
                              item.elementwise_bytes, exp.config.training.attention,
                              item.gemm_dims)
    return timer


def _facts(result):
    from sim.api import _facts
    from sim.calibration import default_profile

    exp = result.experiment
    return _facts(exp, result.stats["fidelity"], default_profile(exp.cluster.gpu.name))


def test_precomputed_makespan_and_peaks_equal_the_records() -> None:
    """The engine's makespan and memory peaks, set on the timeline it returns, are what the
    timeline works out from its records."""
    timeline = simulate(_experiment(), fidelity="collapsed").timeline
    assert "end_s" in timeline.__dict__ and "peak_memory_by_gpu" in timeline.__dict__
    fresh = Timeline(timeline.num_gpus, timeline.spans, timeline.flows, timeline.memory,
                     timeline.gpu_names, timeline.gpus)
    assert repr(timeline.end_s) == repr(fresh.end_s)
    assert list(timeline.peak_memory_by_gpu.items()) == list(fresh.peak_memory_by_gpu.items())


# ----------------------------------------------------------------------------- idle

@pytest.mark.parametrize("fidelity,faults", [
    ("collapsed", None),
    ("full", None),
    ("full", {"stragglers": [{"gpu": 3, "slowdown": 1.5}]}),
])
def test_idle_fast_path_equals_the_reference(fidelity: str, faults: dict | None) -> None:
    """The idle breakdown's fast path (on arrays, from the queue-free pass's causes) gives
    the floats of its reference (:func:`sim.idle._chains`, :func:`sim.idle._cumulative`
    and the gap loop), with a window too; where the fast path does not apply (the event
    queue records no causes; stragglers), both are the reference."""
    exp = _experiment(**({"faults": faults} if faults else {}))
    result = simulate(exp, fidelity=fidelity)
    slowdown = {3: 1.5} if faults else None
    times = InstructionTimes()
    simulate_program(result.program, exp.cluster,
                     _slowed(_timer(exp), slowdown or {}), times=times)
    assert (len(times.cause) == len(result.program.instructions)) == (fidelity == "collapsed")
    gpus = result.timeline.simulated_gpus
    window = (result.timeline.end_s / 4, result.timeline.end_s / 2)
    outs = []
    for reference in (False, True):
        for win in (None, window):
            outs.append(repr(idle_breakdown(result.program, times.ready_s, times.end_s,
                                            gpus, slowdown, win, times.cause or None,
                                            reference=reference)))
    assert outs[0] == outs[2] and outs[1] == outs[3]
    assert repr(result.stats["idle_breakdown"]["per_gpu_s"][str(gpus[-1])]["bubble"]) in repr(
        result.stats) and outs[0] != outs[1]


def _slowed(timer, slowdown: dict):
    return lambda item: timer(item) * slowdown.get(item.gpu, 1.0) if slowdown else timer(item)


def test_engine_cause_is_the_latest_predecessor() -> None:
    """The recorded cause of each instruction of a collapsed program is the predecessor
    (stream predecessor first among equals) that ended last, as :mod:`sim.idle` reads it."""
    result = simulate(_experiment(), fidelity="collapsed")
    times = InstructionTimes()
    exp = result.experiment
    simulate_program(result.program, exp.cluster, _timer(exp), times=times)
    cause = idle_mod._chains(result.program, times.ready_s, times.end_s)[1]
    assert list(times.cause) == list(cause)
    assert sum(c >= 0 for c in cause) > len(cause) // 2


# ----------------------------------------------------------------------------- schedules

def _schedules() -> list[Schedule]:
    out = []
    for kind in REGISTRY.values():
        for args in ((4, 8, 1), (4, 8, 2), (4, 8, 1, 4), (2, 6, 2, 2), (3, 7, 1), (5, 3, 2),
                     (1, 4, 1), (4, 13, 3)):
            if len(args) == 4 and not kind.seq_chunks:
                continue  # the same schedule as without k
            try:
                out.append(kind(*args))
            except Exception:  # noqa: BLE001 (arguments a builder does not take)
                continue
    return out


SCHEDULES = _schedules()


def test_builders_cover_fused_and_chunked_schedules() -> None:
    assert any(s.fused for s in SCHEDULES) and any(s.seq_chunks > 1 for s in SCHEDULES)
    assert any(s.split_backward for s in SCHEDULES) and len(SCHEDULES) > 20


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-{len(s.rank_ops)}")
def test_producer_positions_equal_op_deps(schedule: Schedule) -> None:
    order = [op for ops in schedule.rank_ops for op in ops]
    rnd = random.Random(7)
    shuffled = order[:]
    rnd.shuffle(shuffled)
    for ops in (order, shuffled, order[: len(order) // 2]):  # some producers missing
        index = {op: k for k, op in enumerate(ops)}
        want = [[index.get(d, len(ops)) for d in op_deps(op, schedule.num_stages,
                                                         schedule.split_backward,
                                                         schedule.seq_chunks)]
                for op in ops]
        cols = sched_mod.producer_positions(schedule, ops)
        assert cols is not None
        got = [[x for x in row if x >= 0] for row in zip(*cols, strict=True)]
        assert got == want


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-{len(s.rank_ops)}")
def test_unfused_list_schedule_and_validity_equal_the_general_ones(schedule: Schedule,
                                                                   monkeypatch) -> None:
    rnd = random.Random(3)
    durations = {op: rnd.choice([0.5, 1.0, 1 / 3, 2.25])
                 for ops in schedule.rank_ops for op in ops}
    fast = list_schedule(schedule, durations.__getitem__)
    assert sched_mod._well_formed(schedule)  # the builders' schedules are all well formed
    monkeypatch.setattr(sched_mod, "producer_positions", lambda *a: None)
    monkeypatch.setattr(sched_mod, "_well_formed", lambda s: False)
    general = list_schedule(schedule, durations.__getitem__)
    assert list(fast.items()) == list(general.items())
    validate(schedule)


def _times_key_order(schedule: Schedule) -> list[Op]:
    times = unit_times(schedule)
    rank = schedule.stage_rank
    return sorted(times, key=lambda op: (times[op][1], rank[op.stage], times[op][0]))


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-{len(s.rank_ops)}")
def test_topological_order_is_the_sort_key_order(schedule: Schedule) -> None:
    assert topological_ops(schedule) == _times_key_order(schedule)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-{len(s.rank_ops)}")
def test_what_the_symbolic_run_keeps_equals_working_it_out_again(schedule: Schedule) -> None:
    """unit_order and producers_at (the symbolic run's rank-order codes and producers,
    renumbered) give what _coded and producer_positions give on the lowering's order."""
    schedule = dataclasses.replace(schedule)  # a fresh instance: what other tests kept is not
    kept = sched_mod.unit_order(schedule)
    if schedule.fused:
        assert kept is None and sched_mod.producers_at(schedule, None) is None
        return
    at, stage, kind, seq = kept
    rank_order = [op for ops in schedule.rank_ops for op in ops]
    ops = list(unit_times(schedule))
    assert [rank_order[k] for k in at.tolist()] == ops
    coded = sched_mod._coded(schedule, ops)
    assert all((a == b).all() for a, b in zip((stage, kind, seq), (coded[0], coded[1], coded[3]),
                                              strict=True))
    order = topological_ops(schedule)
    position = {op: k for k, op in enumerate(rank_order)}
    perm = [position[op] for op in order]
    kept_cols = sched_mod.producers_at(schedule, np.array(perm, dtype=np.int64))
    fresh = sched_mod.producer_positions(schedule, order)
    assert [col.tolist() for col in kept_cols] == [list(col) for col in fresh]


BAD = [
    ("0F0 0F0 0B0 0B1\n1F0 1B0 1F1 1B1", "appears twice"),
    ("1F0 1B0 1F1 1B1\n0F0 0B0 0F1 0B1", "lives on rank"),
    ("0F0 0B0 0F1\n1F0 1B0 1F1 1B1", "missing 0B1"),
    ("0F0 0B0 0F1 0B5\n1F0 1B0 1F1 1B1", "unexpected 0B5"),
    ("0F0 0B0 0F1 0W1\n1F0 1B0 1F1 1B1", "W but the schedule does not split|unexpected 0W1"),
    ("0F0 0B0 0B1 0F1\n1F0 1B0 1F1 1B1", "deadlocks"),
]


@pytest.mark.parametrize("text,error", BAD)
def test_malformed_schedules_still_fail_with_their_message(text: str, error: str) -> None:
    rows = tuple(tuple(Op.parse(t) for t in line.split()) for line in text.splitlines())
    split = any(op.kind == "W" for row in rows for op in row)
    schedule = Schedule("bad", 2, (0, 1), rows, split_backward=False and split)
    assert not sched_mod._well_formed(schedule) or error == "deadlocks"
    with pytest.raises(sched_mod.ScheduleError, match=error):
        validate(schedule)
