"""Run statistics from a timeline: the ``sim run --json`` object. Pure (no SimPy, no matplotlib)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from base.collector import gc_paused
from sim.busycols import busy_exposed_columns
from sim.colshape import bits
from sim.intervalcols import IntervalColumns
from sim.timeline import COMM_KINDS, COMPUTE_STREAM, Span, Timeline
from topologies.hardware import GiB
from workloads.memory import device_bytes, oom


@dataclass(frozen=True)
class RunFacts:
    """What stats need to know besides the timeline."""

    pipeline_rank: tuple[int, ...]
    """Pipeline rank of each GPU."""
    peak_flops: float
    """Dense BF16 peak of one GPU, FLOP/s."""
    memory_capacity_bytes: float
    tokens_per_step: float | None
    model_flops_per_step: float | None
    reserved_bytes: float = 0.0
    """Per-GPU memory outside tracked tensors (CUDA context, workspaces), where
    ``reserved_bytes_per_stage`` is empty."""
    reserved_bytes_per_stage: tuple[float, ...] = ()
    """Per pipeline stage, each GPU's memory outside tracked tensors (:mod:`sim.reserved`:
    CUDA context, cuBLAS workspaces, NCCL buffers); empty: ``reserved_bytes`` for all."""
    fragmentation: float = 0.0
    """Allocator overhead as a fraction of the dynamic memory above the static state
    (activations, working buffers: what the caching allocator carves and frees each
    step); the static state (weights, gradients, optimizer), allocated once in a few
    large blocks, has none."""
    extra: tuple[tuple[str, object], ...] = ()
    """Descriptive keys copied into the stats (layout, schedule, ...)."""
    memory_capacity_per_gpu: tuple[float, ...] = ()
    """A mixed cluster's capacity of each GPU, bytes: each GPU's peak is checked against
    its own (``oom_gpus``); empty: ``memory_capacity_bytes`` for all."""


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as sorted, disjoint intervals (empty ones dropped)."""
    merged: list[tuple[float, float]] = []
    lo = hi = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if hi is not None and start <= hi:
            if end > hi:
                hi = end
        else:
            if hi is not None:
                merged.append((lo, hi))
            lo, hi = start, end
    if hi is not None:
        merged.append((lo, hi))
    return merged  # type: ignore[return-value]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    """The summed lengths, added one by one from 0 (as ``sum`` did before Python 3.12, which
    compensates: :class:`_Merged`'s cumulative sum gives these floats on every version)."""
    total = 0
    for a, b in intervals:
        total += b - a
    return total


def _minus(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Length of union ``a`` not covered by union ``b`` (both sorted, disjoint)."""
    covered, j, nb = 0.0, 0, len(b)
    for start, end in a:
        while j < nb and b[j][1] <= start:
            j += 1
        k = j
        while k < nb:
            lo, hi = b[k]
            if not lo < end:
                break
            # min(end, hi) - max(start, lo), without the calls
            covered += (hi if hi < end else end) - (lo if lo > start else start)
            k += 1
    return _length(a) - covered


def _clipped(intervals: Iterable[tuple[float, float]], window: tuple[float, float] | None
             ) -> Iterable[tuple[float, float]]:
    """``intervals`` cut to ``window`` (unchanged without one)."""
    if window is None:
        return intervals
    lo, hi = window
    return ((max(a, lo), min(b, hi)) for a, b in intervals)


SMALL = 64
"""Interval lists up to this long are merged by the plain loops (:func:`_union`,
:func:`_minus`); longer ones by the array forms (:class:`_Merged`), whose fixed cost
per call is that of a few dozen loop iterations. Both give the same floats."""


class _Merged:
    """A union of intervals (sorted, disjoint) as start and end arrays, with its length.

    The same floats as :func:`_union` and :func:`_length` of the same intervals:
    empty intervals dropped, the rest sorted by start and merged where one starts
    at or before the running end (the running maximum of ends, exact), the
    length summed in order (:func:`_length`: a cumulative sum).
    """

    __slots__ = ("hi", "length", "lo", "pairs")

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.pairs: list[tuple[float, float]] | None = None
        if not len(starts):
            self.lo = self.hi = starts
            self.length = 0  # as _length of no intervals
            return
        keep = ends > starts
        if not keep.all():
            starts, ends = starts[keep], ends[keep]
            if not len(starts):
                self.lo = self.hi = starts
                self.length = 0
                return
        # (array methods, not numpy's functions: those add a Python call each, and a union
        # of a few hundred intervals is a dozen calls of a microsecond or two)
        order = starts.argsort(kind="stable")
        starts, ends = starts.take(order), ends.take(order)
        reach = np.maximum.accumulate(ends)
        # a merged interval begins where a start lies beyond every earlier end (the running
        # maximum: the end of the merged interval so far), and ends at the running maximum
        # just before the next one begins (or at the last)
        new = starts[1:] > reach[:-1]
        self.lo = np.concatenate((starts[:1], starts[1:][new]))
        self.hi = np.concatenate((reach[:-1][new], reach[-1:]))
        # _length's sum, one by one from 0: a cumulative sum (its first addition, 0 + the first
        # length, is exact: every merged interval is longer than zero), not a list of floats
        # (~385 merged intervals: ~12 -> ~3 us)
        self.length = float((self.hi - self.lo).cumsum()[-1])

    @classmethod
    def of_union(cls, union: Sequence[tuple[float, float]]) -> _Merged:
        """A union :func:`_union` made (sorted, disjoint, each interval longer than zero and
        apart from the next) as arrays: what ``_Merged`` of its starts and ends makes (the
        same intervals, none merged again, and :func:`_length`'s sum), without merging."""
        self = cls.__new__(cls)
        self.pairs = None
        self.lo = np.array([a for a, _ in union], dtype=float)
        self.hi = np.array([b for _, b in union], dtype=float)
        self.length = _length(union)
        return self

    def __bool__(self) -> bool:
        return bool(len(self.lo))

    def as_pairs(self) -> list[tuple[float, float]]:
        """The intervals as ``(start, end)`` tuples (for :func:`_minus`)."""
        if self.pairs is None:
            self.pairs = list(zip(self.lo.tolist(), self.hi.tolist(), strict=True))
        return self.pairs

    def uncovered(self, busy: _Merged) -> float:
        """:func:`_minus` of this union and ``busy``: the same overlaps, summed in its order.

        Where each of our intervals meets the busy ones is found by merging the two sorted
        unions (a stable sort of the two runs side by side: numpy's timsort merges them in
        one pass), not by a binary search per interval (:meth:`uncovered_searched`, the
        reference: the same positions, ``tests/test_perf_arrays.py``); the pairs are
        gathered by index rather than repeated value by value (Megatron 1T's 128 unions of
        ~2,000-3,000 intervals: 174 -> 129 M instructions)."""
        alo, ahi, blo, bhi = self.lo, self.hi, busy.lo, busy.hi
        ours = np.arange(len(alo))
        # per interval of ours: the first busy interval ending after its start (the busy ends
        # at or before it: a stable sort puts them first, theirs being first), and the first
        # one starting at or after its end (the busy starts before it)
        j = np.flatnonzero(np.concatenate((bhi, alo)).argsort(kind="stable") >= len(bhi))
        j -= ours
        count = np.flatnonzero(np.concatenate((ahi, blo)).argsort(kind="stable") < len(ahi))
        count -= ours
        np.maximum(count, j, out=count)
        count -= j
        total = int(np.add.reduce(count))
        if not total:
            return self.length - 0.0
        # each of ours once per busy interval it meets; those busy intervals' indices run
        # from its j on (an offset within its repeats: the pair's number less its first)
        mine = ours.repeat(count)
        b = (j - (count.cumsum() - count)).take(mine)
        b += np.arange(total)
        overlap = np.minimum(ahi.take(mine), bhi.take(b))
        overlap -= np.maximum(alo.take(mine), blo.take(b))
        # _minus adds them one by one from 0.0: a cumulative sum, not a (pairwise) np.sum
        return self.length - float(overlap.cumsum()[-1])

    def uncovered_searched(self, busy: _Merged) -> float:
        """:meth:`uncovered` by a binary search per interval (its reference)."""
        alo, ahi, blo, bhi = self.lo, self.hi, busy.lo, busy.hi
        # per interval of ours: the first busy interval ending after its start, and the first
        # one from there starting at or after its end (busy is sorted and disjoint)
        j = bhi.searchsorted(alo, "right")
        count = blo.searchsorted(ahi, "left")
        np.maximum(count, j, out=count)
        count -= j
        total = int(np.add.reduce(count))
        if not total:
            return self.length - 0.0
        # each of ours repeated once per busy interval it meets; those busy intervals' indices
        # run from its j on (an offset within its repeats: the pair's number less its first)
        b = (j - (count.cumsum() - count)).repeat(count)
        b += np.arange(total)
        overlap = np.minimum(ahi.repeat(count), bhi.take(b))
        overlap -= np.maximum(alo.repeat(count), blo.take(b))
        # _minus adds them one by one from 0.0: a cumulative sum, not a (pairwise) np.sum
        return self.length - float(overlap.cumsum()[-1])


Intervals = Mapping[tuple[int, str], Sequence[float]]
"""Per ``(GPU, "compute")`` the intervals of the GPU's compute-stream spans, and per ``(GPU,
kind)`` for each kind of :data:`~sim.timeline.COMM_KINDS` those of its spans of that kind
(on any stream), each as a flat ``[start, end, start, end, ...]`` list in any order."""


def span_intervals(spans: Iterable[Span]) -> dict[tuple[int, str], list[float]]:
    """The :data:`Intervals` of ``spans``, in one pass (the engine records them as it runs,
    :class:`sim.engine.InstructionTimes`)."""
    out: dict[tuple[int, str], list[float]] = {}
    comm_kinds = frozenset(COMM_KINDS)
    for g, stream, kind, _, start, end, _, _ in spans:
        if stream == COMPUTE_STREAM:
            out.setdefault((g, COMPUTE_STREAM), []).extend((start, end))
        if kind in comm_kinds:
            out.setdefault((g, kind), []).extend((start, end))
    return out


def _union_flat(flat: Sequence[float], window: tuple[float, float] | None
                ) -> _Merged | list[tuple[float, float]]:
    """The union of flat ``[start, end, ...]`` intervals cut to ``window``
    (:func:`_union_pairs`)."""
    if len(flat) <= 2 * SMALL:
        return _union_pairs(flat[0::2], flat[1::2], window)
    both = np.asarray(flat, dtype=float)  # an array("d") without a copy
    return _union_pairs(both[0::2], both[1::2], window)


def _union_columns(intervals: Intervals, item: tuple[int, str],
                   window: tuple[float, float] | None) -> _Merged | list[tuple[float, float]]:
    """:func:`_union_flat` of ``intervals[item]`` (none where absent); read as the starts and
    ends of :class:`~sim.intervalcols.IntervalColumns` where they are such (the same values,
    in the same order, without the flat list)."""
    if not isinstance(intervals, IntervalColumns):
        return _union_flat(intervals.get(item, ()), window)
    both = intervals.starts_ends(item)
    if both is None:
        return []
    starts, ends = both
    if len(starts) <= SMALL:
        return _union_pairs(starts.tolist(), ends.tolist(), window)
    return _union_pairs(starts, ends, window)


def _union_pairs(starts: Sequence[float], ends: Sequence[float],
                 window: tuple[float, float] | None) -> _Merged | list[tuple[float, float]]:
    """The union of the intervals ``starts[k]``-``ends[k]`` cut to ``window``: by
    :func:`_union` for a few (given as sequences of floats), else (given as arrays) as
    :class:`_Merged` (the same floats)."""
    if len(starts) <= SMALL:
        return _union(_clipped(zip(starts, ends, strict=True), window))
    if window is not None:
        starts, ends = np.maximum(starts, window[0]), np.minimum(ends, window[1])
    return _Merged(starts, ends)


def _union_length(u: _Merged | list[tuple[float, float]]) -> float:
    return u.length if isinstance(u, _Merged) else _length(u)


def _exposed(comm: _Merged | list[tuple[float, float]],
             busy: _Merged | list[tuple[float, float]]) -> float:
    """:func:`_minus` of two unions in either form."""
    if isinstance(busy, _Merged) and not isinstance(comm, _Merged):
        # a short union against a long one: on arrays too (the same floats, and no pairs
        # made of the long one)
        comm = _Merged.of_union(comm)
    if isinstance(comm, _Merged):
        if isinstance(busy, _Merged):
            return comm.uncovered(busy)
        comm = comm.as_pairs()
    return _minus(comm, busy)


def _peak_memory(timeline: Timeline, gpus: Sequence[int], facts: RunFacts) -> dict[int, float]:
    """Per GPU: static state + (peak − static) x (1 + fragmentation) + reserved bytes
    (:func:`workloads.memory.device_bytes`).

    The static state is the GPU's lowest allocated bytes (its sample at time 0,
    before any op allocates); fragmentation applies to the dynamic part only."""
    floor = timeline.memory_floor_by_gpu if facts.fragmentation else {}
    out = {}
    for g in gpus:
        peak = timeline.peak_memory_bytes(g)
        static = floor.get(g, 0.0)
        reserved = (facts.reserved_bytes_per_stage[facts.pipeline_rank[g]]
                    if facts.reserved_bytes_per_stage else facts.reserved_bytes)
        out[g] = device_bytes(static, peak - static, facts.fragmentation, reserved)
    return out


def compute_stats(timeline: Timeline, facts: RunFacts,
                  window: tuple[float, float] | None = None,
                  intervals: Intervals | None = None) -> dict:
    """The stats object of DESIGN.md (keys in a fixed order; values plain JSON types).

    ``window``: for a multi-step run, the steady-state step ``(end of step k, end of
    step k + 1)``: ``step_time_s`` is its length (the period of back-to-back steps)
    and busy, idle and exposed communication are counted inside it; peak memory is
    over the whole run. Without it, the whole timeline is one step.

    ``intervals``: the spans' intervals as the engine recorded them
    (:attr:`sim.engine.InstructionTimes.intervals`); without them, read from the
    timeline's spans (:func:`span_intervals`). Unions of many intervals are merged on
    arrays (:class:`_Merged`), with the same floats as the loops.

    - ``bubble_fraction``: Σ over pipeline ranks of compute-stream idle time ÷
      (pp × step_time), averaged over DP/TP replicas = mean over GPUs of idle/step.
    - ``bubble_ratio``: idle ÷ busy, the papers' (p − 1)/m form.
    - ``exposed_comm_s[kind]``: per GPU, time when a ``kind`` transfer involving it
      runs and its compute stream is idle; the mean over GPUs.
    """
    with gc_paused():  # a large timeline: many intervals, no cycles
        return _compute_stats(timeline, facts, window, intervals)


STATS_KEPT = 6
"""Per kept structure, the latest runs whose busy and exposed times :func:`_busy_exposed`
keeps (at most), as the engine's pass keeps its runs (:data:`sim.columnar.PASSES_KEPT`)."""

STATS_KEPT_ROWS = 1 << 21
"""... and at most this many intervals over them (two arrays of 8 bytes each)."""

BUSY_COLUMNS_MIN = 1024
"""Intervals from which :func:`_busy_exposed` works out all GPUs' unions at once
(:func:`sim.busycols.busy_exposed_columns`, ~0.2 ms before any interval), not GPU by GPU:
timed on drawn unions (three keys a GPU), GPU by GPU against at once, 1 GPU of 5
intervals a key 14 / 229 us, 4 GPUs of 30 227 / 317 us, 8 GPUs of 64 899 / 474 us (load
~4): even near 1,000 intervals. GPT-3 175B TP4 PP16 mb2's 16 GPUs, 10,432 intervals: 2.7 /
1.1 ms."""


def _busy_exposed(intervals: Intervals, gpus: Sequence[int],
                  window: tuple[float, float] | None) -> tuple[list[float], dict[str, float]]:
    """Per GPU its compute stream's busy time (the length of its intervals' union) and per
    communication kind the mean over GPUs of its exposed time, cut to ``window``. Where the
    intervals are a kept structure's (:attr:`IntervalColumns.runs`), kept there by their
    starts and ends bit for bit, the window and the GPUs: a repeat, or a sweep cycling
    through a few costs over one layout, has the same intervals again
    (:func:`_busy_exposed_made`, the reference; ``tests/test_stats.py``); else worked out for
    all GPUs at once where :func:`sim.busycols.busy_exposed_columns` takes them (the same
    floats, ``tests/test_busycols.py``)."""
    runs = intervals.runs if isinstance(intervals, IntervalColumns) else None
    if runs is None:
        return _busy_exposed_made(intervals, gpus, window)
    assert isinstance(intervals, IntervalColumns)
    key = (bits(intervals.end), bits(intervals.start),
           bits(np.array([] if window is None else [1.0, *window])),
           np.asarray(gpus, dtype=np.int64))
    found = runs.find(key)
    if found is not None:
        return list(found[0]), dict(found[1])
    # all GPUs' unions at once (sim.busycols: the same floats), else GPU by GPU
    made = (busy_exposed_columns(intervals, gpus)
            if window is None and len(intervals.start) >= BUSY_COLUMNS_MIN else None)
    lengths, exposed = made or _busy_exposed_made(intervals, gpus, window)
    runs.keep(tuple(a.copy() for a in key), (tuple(lengths), dict(exposed)), STATS_KEPT,
              STATS_KEPT_ROWS)
    return lengths, exposed


def _busy_exposed_made(intervals: Intervals, gpus: Sequence[int],
                       window: tuple[float, float] | None
                       ) -> tuple[list[float], dict[str, float]]:
    """:func:`_busy_exposed` worked out: each GPU's busy union, then per kind each GPU's
    exposed time against it, summed over the GPUs in order."""
    busy = {g: _union_columns(intervals, (g, COMPUTE_STREAM), window) for g in gpus}
    exposed = {}
    for kind in COMM_KINDS:
        total = 0.0
        for g in gpus:
            comm = _union_columns(intervals, (g, kind), window)
            total += _exposed(comm, busy[g]) if comm else 0.0
        exposed[kind] = total / len(gpus)
    return [_union_length(b) for b in busy.values()], exposed


def _compute_stats(timeline: Timeline, facts: RunFacts,
                   window: tuple[float, float] | None, intervals: Intervals | None) -> dict:
    """:func:`compute_stats`, with the garbage collector paused by the caller."""
    n = timeline.num_gpus
    gpus = timeline.simulated_gpus
    step = timeline.end_s if window is None else window[1] - window[0]
    if intervals is None:
        intervals = span_intervals(timeline.spans)
    lengths, exposed = _busy_exposed(intervals, gpus, window)
    idle = [step - length for length in lengths]
    bubble = sum(idle) / (len(gpus) * step) if step > 0 else 0.0
    peaks = _peak_memory(timeline, gpus, facts)
    pp = max(facts.pipeline_rank) + 1 if facts.pipeline_rank else 1
    per_stage = [max(p for g, p in peaks.items() if facts.pipeline_rank[g] == r) / GiB
                 for r in range(pp)]
    tokens_per_s = facts.tokens_per_step / step if facts.tokens_per_step and step > 0 else None
    tflops = (facts.model_flops_per_step / step / n / 1e12
              if facts.model_flops_per_step and step > 0 else None)
    mfu = (tflops * 1e12 / facts.peak_flops
           if tflops is not None and facts.peak_flops not in (0, float("inf")) else None)
    peak = max(peaks.values()) / GiB if peaks else 0.0
    capacity = facts.memory_capacity_bytes / GiB
    per_gpu = facts.memory_capacity_per_gpu
    over = [g for g in gpus if oom(peaks[g], per_gpu[g])] if per_gpu else []
    if per_gpu and peaks:  # the capacity of the GPU with the largest peak
        capacity = per_gpu[max(peaks, key=peaks.__getitem__)] / GiB
    stats = {
        "step_time_s": step,
        "num_gpus": n,
        "tokens_per_s": tokens_per_s,
        "tflops_per_gpu": tflops,
        "mfu": mfu,
        "bubble_fraction": bubble,
        "bubble_ratio": bubble / (1 - bubble) if bubble < 1 else None,
        "peak_memory_gib": peak,
        "memory_capacity_gib": capacity if capacity != float("inf") else None,
        "oom": bool(over) if per_gpu else oom(peak, capacity),
        "exposed_comm_s": exposed,
        "peak_memory_per_stage_gib": per_stage,
        "compute_busy_s_mean": sum(lengths) / len(gpus),
    }
    if per_gpu:
        stats["oom_gpus"] = over
    stats.update(dict(facts.extra))
    return stats
