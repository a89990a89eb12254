"""All GPUs' busy and exposed times at once (:mod:`sim.busycols`) against the reference, GPU by
GPU (:func:`sim.stats._busy_exposed_made`): the same floats, bit for bit (their ``repr``), or a
decline exactly where a start or end is negative, -0.0, infinite or NaN."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import busycols
from sim import stats as stats_mod
from sim.intervalcols import IntervalColumns
from sim.timeline import COMM_KINDS, COMPUTE_STREAM

NAMES = (COMPUTE_STREAM, *COMM_KINDS)

# few values, so that intervals tie, touch, nest, repeat and are empty; and some of any size
_TIMES = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 1e-9, 2.0 + 1e-12, 7.25]),
                   st.floats(min_value=0.0, max_value=10.0, allow_nan=False))
_ODD = st.sampled_from([-0.0, -1.0, math.inf, math.nan, -math.inf])


def _intervals(draw: st.DrawFn, odd: bool) -> tuple[IntervalColumns, list[int]]:
    """Interval columns of a few GPUs (some of them not among ``gpus``, some of ``gpus``
    without any) and names, each key a few intervals in any order (as a run's: an interval
    plan's parts one after the other); with ``odd``, one value replaced by an odd one."""
    pool = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True))
    gpus = sorted(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool),
                                unique=True)))
    keys, starts, ends = [], [], []
    for g_at in range(len(pool)):
        for code, _ in enumerate(NAMES):
            if not draw(st.booleans()):
                continue
            size = draw(st.integers(0, 90))  # (past stats.SMALL: both forms of the reference)
            if draw(st.booleans()):  # a stream's intervals: in order, one after the other
                times = sorted(draw(st.lists(_TIMES, min_size=2 * size, max_size=2 * size)))
                pairs = list(zip(times[0::2], times[1::2], strict=True))
                if draw(st.booleans()):  # two such runs (sends and receives)
                    cut = draw(st.integers(0, size))
                    pairs = pairs[cut:] + pairs[:cut]
            else:
                pairs = [(draw(_TIMES), draw(_TIMES)) for _ in range(size)]
            for a, b in pairs:
                keys.append(g_at * len(NAMES) + code)
                starts.append(a)
                ends.append(b)
    start, end = np.array(starts, dtype=float), np.array(ends, dtype=float)
    if odd and len(start):
        at = draw(st.integers(0, len(start) - 1))
        (start if draw(st.booleans()) else end)[at] = draw(_ODD)
    columns = IntervalColumns(np.array(sorted(pool)), NAMES, np.array(keys, dtype=np.int64),
                              start, end)
    return columns, gpus


@st.composite
def interval_sets(draw: st.DrawFn, odd: bool = False) -> tuple[IntervalColumns, list[int]]:
    return _intervals(draw, odd)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(interval_sets())
def test_equal_to_the_reference(drawn: tuple[IntervalColumns, list[int]]) -> None:
    """On non-negative finite times it answers wherever a GPU of ``gpus`` has an interval,
    with the reference's floats (an empty busy union's length the reference's int 0
    included)."""
    intervals, gpus = drawn
    got = busycols.busy_exposed_columns(intervals, gpus)
    if not any(g in gpus for g, _ in intervals.slices):
        assert got is None
        return
    assert got is not None
    assert repr(got) == repr(stats_mod._busy_exposed_made(intervals, gpus, None))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(interval_sets(odd=True))
def test_declines_odd_times(drawn: tuple[IntervalColumns, list[int]]) -> None:
    """A negative, -0.0, infinite or NaN start or end of a GPU read: None (the reference's
    forms may order or sum those otherwise); elsewhere (another GPU's) it is not read."""
    intervals, gpus = drawn
    read = [intervals.starts_ends(key) for key in intervals.slices if key[0] in gpus]
    values = np.concatenate([np.zeros(0), *(np.concatenate(pair) for pair in read)])
    odd = bool((np.signbit(values) | ~np.isfinite(values)).any())  # (among the GPUs read)
    got = busycols.busy_exposed_columns(intervals, gpus)
    if odd or not len(values):
        assert got is None
    else:
        assert repr(got) == repr(stats_mod._busy_exposed_made(intervals, gpus, None))


def test_a_long_union_against_a_short_one() -> None:
    """Both forms of the reference (stats.SMALL): a busy union of many intervals against a
    communication union of a few, and the other way round, with overlaps, touching ends and
    an interval inside another."""
    n = 100
    busy = [(2.0 * k, 2.0 * k + 1.0) for k in range(n)]
    comm = [(0.5, 4.5), (4.5, 9.0), (9.0, 9.5), (150.0, 150.5), (197.0, 260.0)]
    tp = [(float(k), k + 0.75) for k in range(0, 2 * n, 3)]
    keys = [0] * len(busy) + [1] * len(comm) + [2] * len(tp) + [3] * 2
    starts = [a for a, _ in busy + comm + tp] + [1.0, 0.0]
    ends = [b for _, b in busy + comm + tp] + [1.0, 3.0]
    intervals = IntervalColumns(np.array([5]), NAMES, np.array(keys, dtype=np.int64),
                                np.array(starts), np.array(ends))
    got = busycols.busy_exposed_columns(intervals, [5])
    assert got is not None
    assert repr(got) == repr(stats_mod._busy_exposed_made(intervals, [5], None))
    assert got[1]["tp"] > 0 and got[1]["pp"] > 0


def test_a_run_of_gpt3_175b_gives_the_reference_stats(monkeypatch) -> None:
    """GPT-3 175B on 1,024 GPUs, TP4 PP16 with micro-batch 2 (16 GPUs simulated, ~10,000
    intervals: the fast path taken), run cold with and without it: the same stats JSON."""
    from pathlib import Path

    import yaml

    from sim import api, colshape
    from sim.experiment import Experiment

    root = Path(__file__).resolve().parent.parent
    data = yaml.safe_load((root / "workloads" / "examples" / "search-gpt3-175b-1024.yaml")
                          .read_text(encoding="utf-8"))
    data["parallel"].update({"tp": 4, "pp": 16, "dp": 16})
    data["training"]["micro_batch_size"] = 2
    calls = []
    fast = busycols.busy_exposed_columns
    monkeypatch.setattr(stats_mod, "busy_exposed_columns",
                        lambda *a: calls.append(1) or fast(*a))
    colshape.clear()
    got = api.simulate(Experiment.from_dict(data), fidelity="collapsed").stats_json()
    assert calls  # (taken)
    monkeypatch.setattr(stats_mod, "BUSY_COLUMNS_MIN", 1 << 62)
    colshape.clear()
    reference = api.simulate(Experiment.from_dict(data), fidelity="collapsed").stats_json()
    assert len(calls) == 1
    assert got == reference
