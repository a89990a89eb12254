"""The engine's queue-free pass over a program held as columns (a collapsed lowering's).

A collapsed program has every duration known up front, so the engine runs it
without the event queue (its reference, :mod:`sim.engine`): each instruction starts
when its latest predecessor (dependency or stream predecessor) ends, in one pass over
the ids, which this module does on arrays (:class:`~workloads.program.Columns`, those of
a :class:`~workloads.program.ColumnarInstructions` or of
:func:`~workloads.program.columns_of`): the only per-instruction Python work
left is the recurrence of the end times (a loop over plain lists, :func:`_ends`; a
program whose structure ran before sums the times along that run's chains of latest
predecessors instead, where they hold again: :func:`_recurrence_along`);
durations are timed once per compute signature, stream predecessors, the
intervals the statistics read, memory peaks and event counts come out of array
operations. It computes exactly (the same floating-point operations on the
same values) the ready and end times, intervals, makespan, memory peaks and event
count of the event queue, and each instruction's latest predecessor (what
:mod:`sim.idle` follows); the spans are made from these times by
:func:`sim.timeline.timeline_of` when a timeline's records are first read
(:meth:`sim.timeline.Timeline.deferred`). ``tests/test_differential.py`` and
``tests/test_perf_columns.py`` compare it with the event queue. Pure: no SimPy.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from base.machine import machine
from sim.chains import Forest, Hint
from sim.colshape import LatestRuns, shape_of
from sim.intervalcols import IntervalColumns, grouped, key_slices
from sim.timeline import COMM_KINDS, COMPUTE_STREAM
from workloads.program import COLLECTIVE, COMPUTE, SEND, Columns, Compute

WIDE = 3
"""Dependencies per instruction that :func:`_recurrence` reads unrolled; instructions with
more (rare: an optimizer step waiting on many gradient collectives) take a general loop."""


@dataclass(eq=False, repr=False)  # arrays (see _Plan below)
class ColumnarPass:
    """A program's run without the event queue, worked out on arrays (:func:`run_columns`)."""

    ready_s: array
    """Per instruction, when its last predecessor completed (when it starts): doubles."""
    end_s: array
    """Per instruction, when it completes: doubles."""
    cause: array
    """Per instruction, its latest-finishing predecessor (-1: none), stream predecessor
    first among equals, then the first dependency that ended strictly later: int64 (what
    :mod:`sim.idle` reads as an array without converting a list)."""
    intervals: IntervalColumns
    """As :attr:`sim.engine.InstructionTimes.intervals` (in an order of their own), as
    columns."""
    peak_bytes: dict[int, float]
    """Per GPU with memory samples, its largest allocated bytes."""
    floor_bytes: dict[int, float]
    """Per GPU with memory samples, its smallest allocated bytes."""
    events: int
    """Events the queue would have processed (:class:`sim.engine.EngineCounters`)."""
    clock: float
    """The makespan: the latest end (0 for none)."""
    ready_a: np.ndarray
    """:attr:`ready_s` as an array."""
    end_a: np.ndarray
    """:attr:`end_s` as an array."""
    mid_a: np.ndarray
    """Per instruction, where a compute op's compute span ends (ready + duration) and its
    blocking communication begins (:func:`sim.timeline.timeline_of`)."""


def run_columns(columns: Columns, timer: Callable[[Compute], float],
                static_bytes: Sequence[float], gpus: Sequence[int]) -> ColumnarPass | None:
    """The queue-free pass over ``columns`` (``gpus``: those with a static memory sample).

    ``timer`` times one compute op of each signature (:attr:`Columns.signatures`): a
    compute timer reads an op's work, never its id, name, dependencies or micro-batch.
    None, having done nothing the caller sees, where the pass cannot run in id order (a
    negative compute, send or collective duration, a dependency on a later id): the
    caller then runs the general passes on the instruction objects. What depends on the
    program's structure alone (:class:`_Plan`) is kept on its shape
    (:func:`sim.colshape.shape_of`), made by :func:`_plan` on first use; so are the latest
    run's latest predecessors (:class:`sim.chains.Hint`), along which the end times are
    summed where they hold again (:func:`_recurrence_along`), else by the loop.
    """
    n = len(columns)
    cls = columns.cls
    compute = cls == COMPUTE
    durations = np.array([timer(op) for op in columns.signatures] + [0.0], dtype=float)
    duration = np.where(compute, durations[columns.signature], 0.0)  # signature -1: the 0.0
    blocking = columns.blocking_s
    if (duration < 0).any() or (blocking < 0).any() or (columns.fixed_s[cls == SEND] < 0).any():
        return None
    shape = shape_of(columns)
    plan = shape.derived(("pass", tuple(gpus)), lambda: _plan(columns, gpus, shape.kept))
    if not plan.in_order:
        return None
    total = np.where(compute, duration + blocking, columns.fixed_s)
    if (total < 0).any():  # (a collective's)
        return None
    # the chains of the latest run of this structure, where they held then: the end times
    # summed along them, if every latest predecessor agrees (else the loop)
    hint = shape.derived(("chains",), Hint) if shape.kept else None
    # a run of this structure with these very totals (bit for bit) has these results
    # (a sweep cycling through a few costs over one layout)
    memo = shape.derived(("passes", tuple(gpus)), LatestRuns) if shape.kept else None
    found = memo.find((total.view(np.int64),)) if memo is not None else None
    fresh = False  # a pass made here and shared with nobody
    if found is None:
        # (not tried where other structures ran since this one's latest run: a search's
        # next layout of this structure, with other costs; a repeat or a sweep runs it back
        # to back)
        guess = hint.guess() if hint is not None and not shape.resumed else None
        found = (_recurrence_along(guess, total, plan.prev, plan.deps) if guess is not None
                 else None)
        if found is None:
            ready_a, end_a, cause = _recurrence(plan.prev, columns.deps, total, plan)
            fresh = True
        else:
            ready_a, end_a, cause = found
        if memo is not None:
            _keep_pass(memo, total, ready_a, end_a, cause)
            fresh = False  # (kept: the pass hands out copies)
    else:
        ready_a, end_a, cause = found
    if hint is not None:
        hint.saw(cause)
    # what the memory peaks and the intervals read of the plan; the rest of it (stream
    # predecessors, the loop's and the dependency columns: 1T ~12 MB) freed before their
    # arrays, where the shape does not keep it
    dense, interval_plan, memory_plan = plan.dense, plan.intervals, plan.memory
    del plan
    mid = ready_a + duration  # a compute op's compute span ends here, its blocking part after
    events = int(np.count_nonzero(~compute) + np.count_nonzero(compute & (total > 0)))
    del duration, total, compute  # (not kept through the memory and the intervals: 1T 7 MB)
    clock = float(end_a.max()) if n else 0.0
    peaks, floors = _memory_of(memory_plan, columns, static_bytes)
    intervals = (interval_plan.of(ready_a, mid, end_a) if interval_plan is not None
                 else _intervals(columns, dense, ready_a, mid, end_a))
    # the times as arrays of doubles for the loops, and the numpy arrays views of those
    # (not copies kept beside them: 1T 2 x 3 MB less held to the end of the run); those of
    # a fresh pass's times and causes are such arrays already (:func:`_latest`,
    # :func:`_doubles`), the others copied
    if fresh:
        ready_s, end_s, cause_q = _behind(ready_a, "d"), _behind(end_a, "d"), _behind(cause, "q")
    else:
        ready_s, end_s, cause_q = machine(ready_a, "d"), machine(end_a, "d"), machine(cause, "q")
    return ColumnarPass(ready_s, end_s, cause_q, intervals, peaks, floors, events,
                        clock if clock > 0 else 0.0, np.frombuffer(ready_s, dtype=np.float64),
                        np.frombuffer(end_s, dtype=np.float64), mid)


def _behind(values: np.ndarray, code: str) -> array:
    """The :class:`array.array` of type ``code`` that ``values`` is a whole view of (as
    :func:`_latest` makes its results), else ``values`` copied into one (:func:`machine`)."""
    base = values.base
    held = base.obj if isinstance(base, memoryview) else None
    if (isinstance(held, array) and held.typecode == code and len(held) == len(values)
            and values.flags.c_contiguous):
        return held
    return machine(values, code)


PASSES_KEPT = 6
"""Per kept shape, the latest runs whose results :func:`run_columns` keeps (at most, in a
:class:`~sim.colshape.LatestRuns` by their totals: :func:`_recurrence`'s ready times, end
times and causes are a function of the structure's stream predecessors and dependencies,
the shape's, and of the totals alone; ``tests/test_chains.py`` holds them to a cold
pass's)."""

PASSES_KEPT_ROWS = 1 << 20
"""... and at most this many instructions over those runs (four arrays of 8 bytes each:
32 MB; GPT-3 175B TP8 PP16 with blocking sends, 29,232 a run, keeps six)."""


def _keep_pass(memo: LatestRuns, total: np.ndarray, ready: np.ndarray, end: np.ndarray,
               cause: np.ndarray) -> None:
    """Keep a run's results by a copy of its totals' bits (all read-only)."""
    key = total.view(np.int64).copy()
    for values in (key, ready, end, cause):
        if values.flags.writeable:
            values.flags.writeable = False
    memo.keep((key,), (ready, end, cause), PASSES_KEPT, PASSES_KEPT_ROWS)


# The plans below hold arrays: a generated __eq__ would compare them as truth values (an
# error), a generated __hash__ would hash them (an error), and nothing compares, hashes or
# prints a plan (they are kept per program shape, :mod:`sim.colshape`). Each generated
# method is compiled when the class is made (Python 3.11 `exec`s its text): identity
# equality and object's repr, ~1.5-2.5 M instructions a class less at every start.
@dataclass(frozen=True, eq=False, repr=False)
class _Plan:
    """What :func:`run_columns` derives from a program's structure alone (its shape,
    :mod:`sim.colshape`): made by :func:`_plan`, read by every run of that shape."""

    in_order: bool
    """Every dependency on an earlier id (else the pass declines)."""
    prev: np.ndarray
    """Per instruction, its stream predecessor (:func:`_stream_predecessors`)."""
    ends: EndsPlan
    """The loop's columns (:func:`_ends_plan`)."""
    deps: list[np.ndarray]
    """The dependency columns :func:`_recurrence` reads (contiguous), up to the last one
    in use."""
    dense: tuple[np.ndarray, np.ndarray, np.ndarray]
    """The GPUs as dense indices (:func:`_dense_gpus`)."""
    intervals: _IntervalPlan | None
    """None for a shape not kept (:attr:`sim.colshape.Shape.kept`): laid out as they are
    made (:func:`_intervals`), not for later calls."""
    memory: _MemoryPlan


def _plan(columns: Columns, gpus: Sequence[int], kept: bool = True) -> _Plan:
    """The :class:`_Plan` of ``columns`` (``gpus``: those with a static memory sample): the
    functions the pass ran on every call before its shape kept their results (``kept``:
    whether it is kept across calls)."""
    n = len(columns)
    deps = columns.deps
    ids = np.arange(n, dtype=np.int64)
    in_order = not deps.size or bool((deps < ids[:, None]).all())
    gpus_of, gpu, dst = _dense_gpus(columns)
    prev = _stream_predecessors(columns, gpu, dst) if in_order else ids
    dep_cols = []
    for c in range(deps.shape[1]):  # each instruction's come first: none after a column unused
        col = np.ascontiguousarray(deps[:, c])
        if not (col >= 0).any():
            break
        dep_cols.append(col)
    return _Plan(in_order, prev, _ends_plan(prev, deps) if in_order else ([], 0, [], None),
                 dep_cols, (gpus_of, gpu, dst),
                 _interval_plan(columns, (gpus_of, gpu, dst)) if kept else None,
                 _memory_plan(columns, gpus, (gpus_of, gpu)))


def _dense_gpus(columns: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The GPUs the instructions involve (sorted), and each instruction's GPU and (sends)
    destination as an index into them (-1: no destination), as 32-bit integers. The GPUs
    counted (a send's destination where it sends, else its own GPU again) and the indices
    gathered by ``take``, not by indexing with the int32 columns, which numpy converts
    element by element (1T: 52.6 -> 34.2 M instructions).
    """
    sends = columns.cls == SEND
    gpu = columns.gpu
    to = np.where(sends, columns.dst, gpu)
    size = int(max(gpu.max(initial=0), to.max(initial=0))) + 1
    seen = np.bincount(gpu, minlength=size) > 0
    seen |= np.bincount(to, minlength=size) > 0
    dense = np.cumsum(seen, dtype=np.int32)
    dense -= 1
    return np.flatnonzero(seen), dense.take(gpu), np.where(sends, dense.take(to), -1)


def _stream_predecessors(columns: Columns, gpu: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per instruction, the previous instruction of its stream (-1: none): a GPU's compute
    stream, its send stream to each destination, its collective stream of each kind
    (``gpu``, ``dst``: dense indices, :func:`_dense_gpus`)."""
    n = len(columns)
    if not n:
        return np.zeros(0, dtype=np.int64)
    cls = columns.cls.astype(np.int64)
    sub = np.where(cls == SEND, dst, np.where(cls == COLLECTIVE, columns.kind, 0))
    width = int(max(sub.max(), 0)) + 1
    key = (gpu * 3 + cls) * width + sub
    order = grouped(key, (int(gpu.max()) + 1) * 3 * width)
    # in that order, each instruction's predecessor is the one before it where both keys
    # are equal (one gather of the keys, one scatter back: 1T 15.7 -> 12.9 ms)
    ordered = key.take(order)
    before = np.empty(n, dtype=np.int64)
    before[0] = -1
    before[1:] = np.where(ordered[1:] == ordered[:-1], order[:-1], -1)
    prev = np.empty(n, dtype=np.int64)
    prev[order] = before
    return prev


def _recurrence(prev: np.ndarray, deps: np.ndarray, total: np.ndarray,
                plan: _Plan | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ready and end times and latest predecessors, instruction by instruction in id order.

    ``ready = max(0, end of each predecessor)``, ``end = ready + total``; the cause is the
    stream predecessor, unless a dependency ended strictly later (the first such of the
    latest). These are the event queue's operations (``start + delay``) on these values.
    Only the ends take a Python loop (:func:`_ends`); the ready times (a maximum, exact
    whatever the order) and the causes are read off them on arrays. ``total`` must not be
    negative (:func:`run_columns` declines such programs). ``plan``: what :func:`_plan`
    derived from ``prev`` and ``deps`` (None: derived here). The ready times, the end
    times and the causes; the ready times and causes are views of an
    :class:`array.array` of their own (:func:`_latest`), which :func:`run_columns` hands
    on without a copy.
    """
    if plan is None:
        end_s = _ends(prev, deps, total)
        dep_cols = []
        for c in range(deps.shape[1]):  # (each instruction's come first)
            col = np.ascontiguousarray(deps[:, c])
            if not (col >= 0).any():
                break
            dep_cols.append(col)
    else:
        end_s = _ends_with(plan.ends, deps, total)
        dep_cols = plan.deps
    # the list freed before the latest predecessors' arrays (1T: 391,424 floats in a list,
    # 12 MB, no longer at the pass's memory peak)
    end = _doubles(end_s)
    del end_s
    ready, best = _latest(prev, dep_cols, end)
    return ready, end, best


def _doubles(values: list[float]) -> np.ndarray:
    """``values`` (floats) as float64, the same bits as ``np.fromiter(values, float)`` (the
    reference, ``tests/test_lean_memory.py``): a numpy view of an :class:`array.array` of
    doubles of its own (as :func:`_latest` makes its results: :func:`run_columns` hands it
    on without a copy, :func:`_behind`), the floats written into it by :mod:`struct` (each
    item read as a C double and its bytes copied: 1T's 392,692 end times 81 -> 44 M
    instructions; ``array.fromlist`` parses each item as an argument: 87 M)."""
    out = array("d", [0.0]) * len(values)
    struct.pack_into(f"{len(values)}d", out, 0, *values)
    return np.frombuffer(out, dtype=np.float64)


def _recurrence_along(forest: Forest, total: np.ndarray, prev: np.ndarray,
                      dep_cols: list[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`_recurrence` (its ready times, end times as an array and causes) where the
    latest predecessors are ``forest``'s, else None (nothing changed).

    With each instruction's latest predecessor known, its end is that one's end plus its
    ``total`` (``0.0 + total`` for none): the loop's addition, so the end times are the
    sums of ``total`` along the chains, summed a level of the forest at a time
    (:meth:`sim.chains.Forest.sums`). They are the loop's exactly where the latest
    predecessors by those times, picked as :func:`_recurrence` picks them (the
    comparisons the loop makes, in its order), are the forest's for every instruction: in
    id order, each instruction's predecessors then have the loop's ends (dependencies on
    earlier ids only, :attr:`_Plan.in_order`), and its end is the largest of theirs plus
    its total. Any other outcome returns None; the caller runs the loop. ``prev``,
    ``dep_cols``: the stream predecessors and the dependency columns in use
    (:attr:`_Plan.prev`, :attr:`_Plan.deps`)."""
    if len(forest.cause) != len(total):
        return None
    end = forest.sums(total)
    ready, best = _latest(prev, dep_cols, end)
    if not np.array_equal(best, forest.cause):
        return None
    return ready, end, forest.cause


def _latest(prev: np.ndarray, dep_cols: list[np.ndarray], end: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Per instruction, its ready time (the latest end of its predecessors, 0 for none) and
    latest predecessor (-1: none): the stream predecessor, unless a dependency ended
    strictly later (the first such of the latest), in the order of the loop's comparisons.
    Both are numpy views of an :class:`array.array` of their own (doubles, int64): what
    :class:`ColumnarPass` holds, so :func:`run_columns` need not copy them (:func:`_behind`)."""
    n = len(end)
    ends = np.append(end, -1.0)  # an absent predecessor (-1) reads -1.0, which never wins
    ready_d, best_q = array("d", [0.0]) * n, array("q", [0]) * n
    t = np.frombuffer(ready_d, dtype=np.float64)
    ends.take(prev, out=t, mode="wrap")  # (-1: the last)
    best = np.frombuffer(best_q, dtype=np.int64)
    np.copyto(best, prev)
    e = np.empty_like(t)
    later = np.empty(len(t), dtype=bool)
    for col in dep_cols:  # dependencies in order: a strictly later one wins
        ends.take(col, out=e, mode="wrap")  # (-1: the last; "raise" would buffer out=)
        np.greater(e, t, out=later)
        np.copyto(t, e, where=later)
        np.copyto(best, col, where=later)
    np.less(t, 0.0, out=later)
    np.copyto(t, 0.0, where=later)
    return t, best


def _ends(prev: np.ndarray, deps: np.ndarray, total: np.ndarray) -> list[float]:
    """The end times of :func:`_recurrence`: each instruction's ``max(0, predecessors' ends)
    + total``, in id order, appended to a list shifted by one (slot 0: the 0.0 an absent
    predecessor reads; with no negative total every end is at least 0, so it never changes
    the maximum). The loop reads its columns as :class:`array.array` (a copy of the bytes:
    a list of them would cost as much as the loop), laid out by :func:`_ends_plan`."""
    return _ends_with(_ends_plan(prev, deps), deps, total)


EndsPlan = tuple[list[int], int, list[array], "tuple[np.ndarray, list[array]] | None"]
"""What the loop of :func:`_ends` reads besides the durations (:func:`_ends_plan`)."""


def _ends_plan(prev: np.ndarray, deps: np.ndarray, grouped: bool = True) -> EndsPlan:
    """What the loop of :func:`_ends` reads besides the durations: the instructions with
    more than :data:`WIDE` dependencies, the dependency columns in use of the first
    :data:`WIDE`, and the stream predecessors and those columns shifted by one as
    :class:`array.array`; or, where no instruction has more than two dependencies and
    some have one (and ``grouped``), none of those columns but the groups of
    :func:`_groups` (the loop then takes a group a step, :func:`_step_groups`;
    ``grouped=False``: an instruction a step, the reference, ``tests/test_colshape.py``)."""
    width = deps.shape[1]
    wide = (np.flatnonzero((deps[:, WIDE:] >= 0).any(axis=1)).tolist()
            if width > WIDE else [])
    # the dependency columns in use, of the first WIDE (each instruction's come first)
    k = max((c + 1 for c in range(min(width, WIDE)) if (deps[:, c] >= 0).any()), default=0)
    code = "i" if len(prev) < np.iinfo(np.intc).max else "q"  # (ids as C ints: half the bytes)
    if grouped and not wide and 0 < k <= 2:
        return wide, k, [], _groups(prev, deps, k, code)
    return (wide, k, [machine(prev + 1, code), *(machine(deps[:, c] + 1, code) for c in range(k))],
            None)


def _groups(prev: np.ndarray, deps: np.ndarray, k: int, code: str
            ) -> tuple[np.ndarray, list[array]]:
    """The instructions (of at most two dependencies each, ``k`` columns of them in use) cut
    into groups of up to three consecutive ids, each but the first (its head) with one
    dependency, the instruction before it (a collective after its compute, a send after
    its collective): the heads' ids, and as :class:`array.array` shifted by one, the
    heads' stream predecessors and two dependency columns (0: none), then the second and
    third members' stream predecessors (-1: no such member)."""
    n = len(prev)
    follows = deps[:, 0] == np.arange(-1, n - 1, dtype=np.int64)
    follows[0] = False  # (no dependency: -1)
    if k > 1:
        follows &= deps[:, 1] < 0
    heads = np.flatnonzero(~follows)
    size = np.diff(heads, append=n)
    if (size > 3).any():  # a longer run cut every third instruction (1T: 1,023 of 130,751)
        long = np.flatnonzero(size > 3)
        extra = (size[long] - 1) // 3
        within = np.arange(int(extra.sum())) - np.repeat(np.cumsum(extra) - extra, extra)
        # (two sorted runs of distinct ids: a stable sort merges them, ~1/10 of a
        # quicksort's instructions on 1T's 131,774 heads; the same ids in the same order)
        heads = np.sort(np.concatenate([heads, np.repeat(heads[long], extra) + 3 * within + 3]),
                        kind="stable")
        size = np.diff(heads, append=n)
    columns = [prev[heads] + 1, *(deps[heads, c] + 1 for c in range(k))]
    if k < 2:
        columns.append(np.zeros(len(heads), dtype=np.int64))
    for j in (1, 2):
        member = np.full(len(heads), -1, dtype=np.int64)
        has = size > j
        member[has] = prev[heads[has] + j] + 1
        columns.append(member)
    return heads, [machine(c, code) for c in columns]


def _ends_with(plan: EndsPlan, deps: np.ndarray, total: np.ndarray) -> list[float]:
    """:func:`_ends` with its columns laid out (:func:`_ends_plan`)."""
    wide, k, columns, groups = plan
    n = len(total)
    if not n:
        return []
    end = [0.0]
    if groups is not None:
        heads, cols = groups
        # each member's duration (0.0 for a member a group lacks: never read)
        padded = np.append(total, (0.0, 0.0))
        _step_groups(cols, *(machine(padded[heads + j], "d") for j in range(3)), end)
        del end[0]
        return end
    durations = machine(total, "d")
    step = _STEPS[k]
    lo = 0
    for stop in [*wide, n]:
        if stop > lo:
            whole = lo == 0 and stop == n  # (no copies of the columns)
            step(columns if whole else [col[lo:stop] for col in columns],
                 durations if whole else durations[lo:stop], end)
        if stop < n:  # an instruction with many dependencies
            end.append(max(end[columns[0][stop]], *(end[d + 1] for d in deps[stop].tolist()))
                       + durations[stop])
        lo = stop + 1
    del end[0]
    return end


def _step_groups(cols: list[array], first: array, second: array, third: array,
                 end: list[float]) -> None:
    """:func:`_ends` of the groups of :func:`_groups`, a group a step (``first``, ``second``,
    ``third``: the members' durations): the same comparisons and additions as
    :func:`_step2`, less the second and third members' comparisons with an absent
    dependency's 0.0, which never win (every end is at least 0; a NaN compares false
    either way); Megatron 1T's 392,692 instructions in 130,751 groups, ~45 against ~75 ms.
    ``end.append`` called as a method, not through a local bound to it: Python 3.11 then
    appends in place without a call (``PRECALL_NO_KW_LIST_APPEND``; 1T's loop 469 -> 448 M
    instructions under callgrind)."""
    for p, a, b, du, q, dq, r, dr in zip(cols[0], cols[1], cols[2], first, cols[3], second,
                                         cols[4], third, strict=True):
        t = end[p]
        e = end[a]
        if e > t:
            t = e
        e = end[b]
        if e > t:
            t = e
        t = t + du
        end.append(t)
        if q < 0:
            continue
        e = end[q]  # the second member: its stream predecessor, then the head
        if t > e:
            e = t
        e = e + dq
        end.append(e)
        if r < 0:
            continue
        t = end[r]  # the third: its stream predecessor, then the second
        if e > t:
            t = e
        end.append(t + dr)


def _step0(cols: list[array], durations: array, end: list[float]) -> None:
    """:func:`_ends` of instructions without dependencies, appended to ``end``."""
    for p, du in zip(cols[0], durations, strict=True):
        end.append(end[p] + du)


def _step1(cols: list[array], durations: array, end: list[float]) -> None:
    """:func:`_ends` of instructions with up to one dependency each."""
    for p, a, du in zip(cols[0], cols[1], durations, strict=True):
        t = end[p]
        e = end[a]
        if e > t:
            t = e
        end.append(t + du)


def _step2(cols: list[array], durations: array, end: list[float]) -> None:
    """:func:`_ends` of instructions with up to two dependencies each."""
    for p, a, b, du in zip(cols[0], cols[1], cols[2], durations, strict=True):
        t = end[p]
        e = end[a]
        if e > t:
            t = e
        e = end[b]
        if e > t:
            t = e
        end.append(t + du)


def _step3(cols: list[array], durations: array, end: list[float]) -> None:
    """:func:`_ends` of instructions with up to three dependencies each."""
    for p, a, b, c, du in zip(cols[0], cols[1], cols[2], cols[3], durations, strict=True):
        t = end[p]
        e = end[a]
        if e > t:
            t = e
        e = end[b]
        if e > t:
            t = e
        e = end[c]
        if e > t:
            t = e
        end.append(t + du)


_STEPS = (_step0, _step1, _step2, _step3)
"""The loop of :func:`_ends` by the number of dependency columns in use."""


def interval_parts(columns: Columns, dense: tuple[np.ndarray, np.ndarray, np.ndarray],
                   start: np.ndarray, mid: np.ndarray, end: np.ndarray
                   ) -> tuple[tuple[str, ...], tuple[tuple, ...]]:
    """(The key names: the kinds and :data:`COMPUTE_STREAM` last, the five groups of
    intervals of :func:`_intervals`): per group, which instructions (a mask), their dense
    GPU (:func:`_dense_gpus`) and name code (an int or a column; key: GPU x name code),
    start and end."""
    names = columns.names
    comm = np.array([name in COMM_KINDS for name in names] + [False], dtype=bool)
    kind_names = (*names, COMPUTE_STREAM)
    codes = len(kind_names)
    cls, kind = columns.cls, columns.kind
    is_compute = cls == COMPUTE
    _, gpu, dst = dense
    other = ~is_compute & comm[kind]
    return kind_names, ((is_compute, gpu, codes - 1, start, mid),
                        (is_compute & comm[kind], gpu, kind, start, mid),
                        (is_compute & (columns.blocking_s > 0) & comm[columns.comm], gpu,
                         columns.comm, mid, end),
                        (other, gpu, kind, start, end),
                        (other & (cls == SEND), dst, kind, start, end))


def _intervals(columns: Columns, dense: tuple[np.ndarray, np.ndarray, np.ndarray],
               start: np.ndarray, mid: np.ndarray, end: np.ndarray
               ) -> IntervalColumns:
    """The intervals of the spans, per (GPU, stream or kind) (as columns, grouped when read).

    Compute ops give ``[start, mid]`` on ``(GPU, "compute")`` (and on their kind, were it a
    communication kind), their blocking communication ``[mid, end]`` on its kind; sends
    ``[start, end]`` on their kind at both ends; collectives on theirs. The same intervals
    per key as the spans give them, in another (deterministic) order: what reads
    them takes their union (:data:`sim.stats.Intervals`; :func:`sim.stats.compute_stats`
    reads the columns, :mod:`sim.intervalcols`).
    """
    kind_names, parts = interval_parts(columns, dense, start, mid, end)
    codes = len(kind_names)
    gpus = dense[0]
    # the groups written one after the other into columns of their final size, not made
    # apart and concatenated (Megatron 1T: ~650,000 intervals, 16 MB less at the pass's
    # memory peak, ~4,000 page faults fewer); each group's positions made as it is written
    # (not all five held at once), the keys as 32-bit integers where they fit; then grouped
    # by key (a stable sort) one column at a time, each freed once gathered (1T: ~10 MB
    # less at the intervals' peak than all three gathered at once)
    size = sum(np.count_nonzero(mask) for mask, *_ in parts)
    bound = len(gpus) * codes
    key = np.empty(size, dtype=np.int32 if bound <= np.iinfo(np.int32).max else np.intp)
    dtype = np.result_type(start, mid, end)
    a_all, b_all = np.empty(size, dtype=dtype), np.empty(size, dtype=dtype)
    lo = 0
    for mask, g, code, a, b in parts:
        at = np.flatnonzero(mask)
        hi = lo + len(at)
        on = g[at] if key.dtype == g.dtype else g[at].astype(key.dtype)  # (no overflow)
        key[lo:hi] = on * codes + (code if isinstance(code, int) else code[at])
        a_all[lo:hi] = a[at]
        b_all[lo:hi] = b[at]
        lo = hi
    sort = grouped(key, bound)
    slices = key_slices(key, gpus, kind_names)
    del key
    starts = a_all.take(sort)
    del a_all
    ends = b_all.take(sort)
    del b_all, sort
    return IntervalColumns.laid_out(gpus, kind_names, starts, ends, slices)


def _memory(columns: Columns, static_bytes: Sequence[float], gpus: Sequence[int],
            dense: tuple[np.ndarray, np.ndarray]) -> tuple[dict[int, float], dict[int, float]]:
    """Per GPU, the largest and smallest of its memory samples: the static one at time 0
    (GPUs in ``gpus``), then, in id order of its compute ops, the bytes after each
    allocation (at the op's start) and after each free (at its end); the bytes as the
    event queue's records sum them, one change after the other. ``dense``: the GPUs the
    instructions involve and each instruction's GPU as an index into them
    (:func:`_dense_gpus`), whose order is the GPUs'."""
    gpus_of, gpu_at = dense
    alloc, free = columns.alloc_bytes, columns.free_bytes
    is_compute = columns.cls == COMPUTE
    # the changes in id order, an op's allocation before its free (event 2i, 2i + 1),
    # then grouped by GPU (a stable sort: each GPU's in that order)
    changes = np.zeros(2 * len(alloc), dtype=bool)
    changes[0::2] = is_compute & (alloc != 0)
    changes[1::2] = is_compute & (free != 0)
    event = np.flatnonzero(changes)
    at = event >> 1
    g = gpu_at.take(at)  # (dense: a one-pass radix sort where they fit a byte)
    delta = np.where(event & 1, -free.take(at), alloc.take(at))  # x - f is x + (-f), exactly
    sort = grouped(g, len(gpus_of))
    g, delta = g.take(sort), delta.take(sort)
    cuts = np.flatnonzero(g[1:] != g[:-1]) + 1
    runs = {int(gpus_of[g[lo]]): delta[lo:hi]
            for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(g)], strict=True)
            if hi > lo}
    return _peaks(runs, set(gpus), static_bytes)


def _peaks(runs: dict[int, np.ndarray], shown: set[int] | frozenset[int],
           static_bytes: Sequence[float]) -> tuple[dict[int, float], dict[int, float]]:
    """Per GPU, the largest and smallest of its samples: its static bytes (GPUs in
    ``shown``) and, one after the other, its changes ``runs``."""
    peaks: dict[int, float] = {}
    floors: dict[int, float] = {}
    for gpu in sorted(shown | runs.keys()):
        changes = runs.get(gpu)
        static = float(static_bytes[gpu])
        samples = (np.add.accumulate(np.concatenate(([static], changes)))[1:]
                   if changes is not None else np.zeros(0))
        peaks[gpu] = float(samples.max()) if len(samples) else static
        floors[gpu] = float(samples.min()) if len(samples) else static
        if gpu in shown:  # its static sample comes first: it wins ties (max and min do)
            if not len(samples) or static >= peaks[gpu]:
                peaks[gpu] = static_bytes[gpu]
            if not len(samples) or static <= floors[gpu]:
                floors[gpu] = static_bytes[gpu]
    return peaks, floors


@dataclass(frozen=True, eq=False, repr=False)  # (see _Plan)
class _IntervalPlan:
    """:func:`_intervals` of a program's structure: per interval, grouped by key, where its
    start and end are read from (an index into the ready, mid and end times laid end to
    end), and the grouped columns' slices per key."""

    gpus: np.ndarray
    names: tuple[str, ...]
    start_at: np.ndarray
    end_at: np.ndarray
    slices: dict[tuple[int, str], tuple[int, int]]
    runs: LatestRuns = field(default_factory=LatestRuns)
    """The latest runs' statistics of these intervals (:attr:`sim.intervalcols.
    IntervalColumns.runs`)."""

    def of(self, start: np.ndarray, mid: np.ndarray, end: np.ndarray) -> IntervalColumns:
        """The intervals of a run with these times: those of :func:`_intervals`."""
        times = np.concatenate((start, mid, end))
        return IntervalColumns.laid_out(self.gpus, self.names, times.take(self.start_at),
                                        times.take(self.end_at), self.slices, self.runs)


def _interval_plan(columns: Columns, dense: tuple[np.ndarray, np.ndarray, np.ndarray]
                   ) -> _IntervalPlan:
    """The :class:`_IntervalPlan` of ``columns``: :func:`_intervals` on the times' positions
    (the ready, mid and end times laid end to end), whose keys do not read the times."""
    n = len(columns)
    at = np.arange(3 * n, dtype=np.int64)
    found = _intervals(columns, dense, at[:n], at[n:2 * n], at[2 * n:])
    return _IntervalPlan(found.gpus, found.names, found.start.astype(np.int64),
                         found.end.astype(np.int64), dict(found.slices))


@dataclass(frozen=True, eq=False, repr=False)  # (see _Plan)
class _MemoryPlan:
    """:func:`_memory` of a program's structure: its memory changes grouped by GPU (each
    GPU's in order), per change its instruction and whether it is a free, and per GPU its
    slice; the GPUs with a static sample."""

    at: np.ndarray
    frees: np.ndarray
    runs: tuple[tuple[int, int, int], ...]
    """(GPU, first change, end) per GPU with changes."""
    shown: frozenset[int]
    table: tuple[np.ndarray, int] | None = None
    """Per change its cell in a table of a row per run (its GPU's static bytes first, its
    changes after, zeros to the row's end), and the rows' width (:func:`_memory_of`); None
    where such a table would be large against the changes."""


def _memory_plan(columns: Columns, gpus: Sequence[int], dense: tuple[np.ndarray, np.ndarray]
                 ) -> _MemoryPlan:
    """The :class:`_MemoryPlan` of ``columns``: the order of :func:`_memory`'s changes,
    which reads only where the bytes are non-zero."""
    gpus_of, gpu_at = dense
    is_compute = columns.cls == COMPUTE
    changes = np.zeros(2 * len(columns), dtype=bool)
    changes[0::2] = is_compute & (columns.alloc_bytes != 0)
    changes[1::2] = is_compute & (columns.free_bytes != 0)
    event = np.flatnonzero(changes)
    at = event >> 1
    g = gpu_at.take(at)
    sort = grouped(g, len(gpus_of))
    g = g.take(sort)
    cuts = np.flatnonzero(g[1:] != g[:-1]) + 1
    runs = tuple((int(gpus_of[g[lo]]), lo, hi)
                 for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(g)], strict=True)
                 if hi > lo)
    width = 1 + max((hi - lo for _, lo, hi in runs), default=0)
    table = None
    if runs and len(runs) * width <= 2 * len(g) + 4096:
        cell = np.empty(len(g), dtype=np.intp)
        for row, (_, lo, hi) in enumerate(runs):
            cell[lo:hi] = np.arange(row * width + 1, row * width + 1 + hi - lo)
        table = (cell, width)
    return _MemoryPlan(at.take(sort), (event & 1).take(sort).astype(bool), runs,
                       frozenset(gpus), table)


def _memory_of(plan: _MemoryPlan, columns: Columns, static_bytes: Sequence[float]
               ) -> tuple[dict[int, float], dict[int, float]]:
    """:func:`_memory` with the changes' order laid out (:func:`_memory_plan`): the same
    floats."""
    at = plan.at
    delta = np.where(plan.frees, -columns.free_bytes.take(at), columns.alloc_bytes.take(at))
    if plan.table is None:
        return _peaks({gpu: delta[lo:hi] for gpu, lo, hi in plan.runs}, plan.shown,
                      static_bytes)
    # every GPU's samples at once, as _peaks makes them one GPU at a time: a row per GPU
    # with changes, its static bytes then its changes, summed along the row (an
    # accumulation: the same additions in the same order), zeros after its last change
    # (its last sample repeated: the row's largest and smallest stay its samples')
    cell, width = plan.table
    gpus = [gpu for gpu, _, _ in plan.runs]
    table = np.zeros(len(gpus) * width)
    table[::width] = [float(static_bytes[gpu]) for gpu in gpus]
    table[cell] = delta
    samples = np.add.accumulate(table.reshape(len(gpus), width), axis=1)[:, 1:]
    high = dict(zip(gpus, samples.max(axis=1).tolist(), strict=True))
    low = dict(zip(gpus, samples.min(axis=1).tolist(), strict=True))
    peaks: dict[int, float] = {}
    floors: dict[int, float] = {}
    shown = plan.shown
    for gpu in sorted(shown | high.keys()):
        static = float(static_bytes[gpu])
        got = gpu in high
        peaks[gpu] = high[gpu] if got else static
        floors[gpu] = low[gpu] if got else static
        if gpu in shown:  # its static sample comes first: it wins ties (max and min do)
            if not got or static >= peaks[gpu]:
                peaks[gpu] = static_bytes[gpu]
            if not got or static <= floors[gpu]:
                floors[gpu] = static_bytes[gpu]
    return peaks, floors
