"""Rows of lane blocks stepped as one (:meth:`sim.engine._Run._start_ready`): the DP replicas'
copies of one block of TP lanes (:mod:`sim.lanes`), completing in one heap entry, as one
two-dimensional block.

The DP replicas of a pipeline stage run the same program at the same times in the ideal
case: a heap entry of compute ends (or the members of the collectives that end at one
wake-up) then lists ``R`` blocks of ``L`` lanes, block ``r`` at ``b + r * D``, and each is
stepped by :meth:`sim.engine._Run._stepper` in turn. :func:`rows_stepper` does the ``R`` steps
at once, on arrays, where that provably does what they do one after another:

- every row is the block at ``b`` shifted by ``r * D``: a block of ``L`` lanes
  (``lanes[b + r * D] == L``), as many successors, each lane 0's shifted by ``r * D``; and the
  successor blocks of one row lie in a window of at most ``D`` ids (lane 0's first to its
  last successor's last lane), so that rows' successor blocks are apart from one another;
- every successor block's counters are one value over all rows and lanes, greater than 0
  (no row's lanes are among another's successors: those are running, their counters 0);
- at most one successor block is freed, on every row alike, and it is a compute op of one
  template on all rows, of positive time and timed by its work alone (so each row's start
  extends the same heap entry, the next ``L`` events: ``R * L`` of them in all), or a
  collective on every row, of distinct keys, each of whose start (where the row's lanes are
  its last members) only schedules an event (a collective of a precomputed duration, or a
  plan with a launch time: :meth:`sim.engine._Run._arrived_packed`): nothing it does reads
  or writes the counters, times or ready queue that the other rows' completions do.

Then completing row ``r`` and starting what it freed touches nothing the other rows read,
and the starts are made in the rows' order: the same counters, times, members, heap entries
and event numbers as the rows stepped one after another. Anything else returns 0 and the
caller steps the rows one by one (:attr:`sim.engine._Run.rows` False: always; the reference
``tests/test_rows.py`` runs beside it).
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import as_strided

from workloads.packed import (
    COLLECTIVE_DURATION_S,
    COLLECTIVE_GROUP,
    COLLECTIVE_KEY,
)
from workloads.program import COLLECTIVE, COMPUTE

if TYPE_CHECKING:
    from sim.engine import _Run


def rows_stepper(run: _Run, code: bytes, timed: list
                 ) -> Callable[[list[int], int, int, int, float], int]:
    """``step(ids, p, b, size, now)``: where ``ids[p:]`` is ``R >= 2`` rows of ``size`` lanes,
    row ``r`` at ``b + r * D`` (``D`` from the second row's first id), complete them and start
    what they free in one step (the module's rules); the ids consumed (``R * size``), or 0
    with nothing done. The run's arrays are bound once, as NumPy views (they keep their
    length for the run)."""
    from sim.engine import _Run  # the heap entry's mark

    templates, tpl, by_work, _ = run.packed
    succ, first, lanes, members, heap = run.succ, run.first, run.lanes, run.members, run.heap
    waiting_a = np.frombuffer(run.waiting, dtype=np.int32)
    finished_a = np.frombuffer(run.finished, dtype=np.uint8)
    ended_a = np.frombuffer(run.ended, dtype=np.float64)
    started_a = np.frombuffer(run.started, dtype=np.float64)
    mid_a = np.frombuffer(run.mid, dtype=np.float64)
    lanes_a = np.frombuffer(lanes, dtype=np.uint8)
    first_a = np.frombuffer(first, dtype=np.int64)
    succ_a = np.frombuffer(succ, dtype=np.int32)
    tpl_a = np.frombuffer(tpl, dtype=np.int32)
    shapes: dict[tuple[int, int, int], tuple[np.ndarray, ...]] = {}
    lane_of: dict[int, np.ndarray] = {}  # per degree: 0 .. degree - 1 (a row's edge places)
    every = np.logical_and.reduce  # ``.all()`` over axis None, without its Python wrapper
    limit = len(tpl)  # every array's length: the program's instructions
    arrived_packed, plan_for, compute_times = run._arrived_packed, run._plan_for, \
        run._compute_times
    launched_own, after_all = run._launched_own, run._after_own_all
    end_collective = run._end_collective

    def _views(rows: int, apart: int, size: int) -> tuple[np.ndarray, ...]:
        """Per array, a view whose ``[b]`` is what the step reads or writes from ``b`` on
        (one index, not a slice, a reshape and a slice each time): the lanes', first
        successors' and templates' ``[b:b + rows * apart:apart]``, the counters' and times'
        ``[b:b + rows * apart].reshape(rows, apart)[:, :size]``, over the starts whose last
        element is inside the array (every ``b`` with ``b + rows * apart <= limit``, the
        step's test: ``apart >= size``)."""
        def rows_of(values: np.ndarray) -> np.ndarray:
            step = values.strides[0]
            starts = max(len(values) - (rows - 1) * apart, 0)
            return as_strided(values, (starts, rows), (step, apart * step), writeable=False)

        def blocks_of(values: np.ndarray) -> np.ndarray:
            step = values.strides[0]
            starts = max(len(values) - (rows - 1) * apart - (size - 1), 0)
            return as_strided(values, (starts, rows, size), (step, apart * step, step))

        return (rows_of(lanes_a), rows_of(first_a), rows_of(tpl_a), blocks_of(waiting_a),
                blocks_of(finished_a), blocks_of(ended_a), blocks_of(started_a),
                blocks_of(mid_a))

    def step(ids: list[int], p: int, b: int, size: int, now: float) -> int:
        rows = (len(ids) - p) // size
        if rows < 2:
            return 0
        apart = ids[p + size] - b
        if apart < size:
            return 0
        span = rows * apart  # the rows as views: [b:b + span] as rows x apart, size of each
        if b + span > limit:
            return 0  # (a view would run past the end: the last ids, rows one by one)
        shape = shapes.get((size, apart, rows))
        if shape is None:
            shift = np.arange(rows, dtype=np.int64) * apart
            shape = shapes[(size, apart, rows)] = (
                shift, (shift[:, None] + np.arange(size, dtype=np.int64)).ravel(),
                *_views(rows, apart, size))
        shift, offsets, lanes_at, first_at, tpl_at, waiting_of, finished_of, ended_of, \
            started_of, mid_of = shape
        count = rows * size
        if ids[p:p + count] != (offsets + b).tolist():
            return 0
        if not every(lanes_at[b] == size):
            return 0
        heads = succ[first[b]:first[b + 1]]
        if heads:
            degree = len(heads)
            if heads[-1] + size - heads[0] > apart or heads[-1] + span > limit:
                return 0  # the rows' successor blocks could meet, or a view run past the end
            at = first_at[b]
            if not every(first_at[b + 1] - at == degree):
                return 0
            # every row's successors, row r's lane 0's shifted by r * apart: one gather
            places_of = lane_of.get(degree)
            if places_of is None:
                places_of = lane_of[degree] = np.arange(degree, dtype=np.int64)
            if not every(succ_a[at[:, None] + places_of] - shift[:, None]
                         == np.frombuffer(heads, dtype=np.int32), None):
                return 0
            freed = -1
            places = []
            for h in heads:
                counts = waiting_of[h]
                w = int(counts[0, 0])
                if w <= 0 or not every(counts == w, None):
                    return 0
                places.append(counts)
                if w == 1:
                    if freed >= 0:
                        return 0  # two freed per lane: their starts interleave
                    freed = h
        else:
            freed, places = -1, []
        if freed >= 0:
            t = tpl[freed]
            c = code[t]
            if c == COMPUTE:
                if not by_work or not every(tpl_at[freed] == t):
                    return 0  # the timer reads the GPU, or the rows' ops differ
                pair = timed[t]
                if pair is None:
                    pair = timed[t] = compute_times(freed, t)
                duration, total = pair
                if not total > 0:
                    return 0
            elif c == COLLECTIVE:
                starting = []
                keys = []
                for tr in tpl_at[freed].tolist():  # each row's template
                    if code[tr] != COLLECTIVE:
                        return 0
                    rest = templates[tr][2]
                    key = rest[COLLECTIVE_KEY]
                    keys.append(key)
                    arrived = members.get(key)
                    have = (len(arrived) if arrived is not None else 0) + size
                    need = len(rest[COLLECTIVE_GROUP])
                    if have - 1 >= need:
                        return 0  # it would start before the row's last lane
                    plan = None
                    if have >= need and rest[COLLECTIVE_DURATION_S] is None:
                        plan = plan_for(rest)
                        if not plan.launch_s > 0:
                            return 0  # its start may do more than schedule an event
                    starting.append((rest, key, arrived, have >= need, plan))
                if len(set(keys)) < rows:
                    return 0  # two rows' members of one collective
            else:
                return 0
        run.stepped += rows
        run.rowed += 1
        finished_of[b] = 1
        ended_of[b] = now
        for counts in places:
            counts -= 1
        if freed < 0:
            return count
        started_of[freed] = now
        if c == COMPUTE:
            mid_of[freed] = now + duration
            at = now + total  # the rows' starts, in turn, extend one heap entry
            batch, events = run.batch, run.events
            ends = (offsets + freed).tolist()
            if batch is not None and run.batch_seq == events and run.batch_at == at:
                batch.extend(ends)
            else:
                run.batch = batch = ends
                run.batch_at = at
                heappush(heap, (at, events + 1, _Run._complete, batch))
            run.events = run.batch_seq = events + count
            return count
        # consecutive events of one callback after one delay, scheduled in one call
        # (_after_own_all: the same as one _after_own each, in turn)
        pending: list = []
        call = None
        delay = 0.0
        lanes_of = (offsets + freed).tolist()  # row r's lanes: [r * size:(r + 1) * size]
        lo = 0
        for rest, key, arrived, start, plan in starting:
            hi = lo + size
            if arrived is None:
                members[key] = lanes_of[lo:hi]  # a list of its own (a slice is a copy)
            else:
                arrived.extend(lanes_of[lo:hi])
            lo = hi
            if plan is not None:  # _arrived_packed, inline: its launch
                if pending and (call is not launched_own or plan.launch_s != delay):
                    after_all(delay, call, pending)
                    pending = []
                call, delay = launched_own, plan.launch_s
                pending.append((key, plan))
            elif start:
                duration = rest[COLLECTIVE_DURATION_S]
                if duration is not None and duration >= 0:  # _arrived_packed, inline: its end
                    if pending and (call is not end_collective or duration != delay):
                        after_all(delay, call, pending)
                        pending = []
                    call, delay = end_collective, duration
                    pending.append(key)
                    continue
                if pending:
                    after_all(delay, call, pending)
                    pending = []
                arrived_packed(rest, key)
        if pending:
            after_all(delay, call, pending)
        return count

    return step
