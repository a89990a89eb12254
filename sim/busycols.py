"""Every GPU's busy time and exposed communication at once, on a collapsed run's interval
columns (:class:`sim.intervalcols.IntervalColumns`).

:func:`sim.stats._busy_exposed_made` (the reference) takes, GPU by GPU and kind by kind,
the union of a key's intervals (:class:`sim.stats._Merged`, or for a few the plain loop
:func:`sim.stats._union`) and what of a communication union the GPU's busy union leaves
uncovered: a dozen array calls per union, ~100 per GPU, and a new structure's 16 GPUs of
GPT-3 175B paid ~1,600 of them (~9 % of a new layout's instructions). Here the keys'
intervals are gathered as rows one after the other (a row per key: the busy rows first,
then each GPU's communication rows), sorted where a row's starts step down, merged and
summed for all rows at once, and the uncovered parts found by one binary search a side
per GPU: the same comparisons, the same maxima, and each sum added one by one in the
reference's order (a cumulative sum along a table's row, zeros after its last term, which
add nothing). :func:`busy_exposed_columns` declines (None) where the reference's forms
could differ: a window to cut to, a start or end that is not finite or is negative (a
run's times are not; -0.0 included, which the plain loops may order otherwise).
``tests/test_busycols.py`` holds it to the reference. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.intervalcols import IntervalColumns
from sim.timeline import COMM_KINDS, COMPUTE_STREAM


def busy_exposed_columns(intervals: IntervalColumns, gpus: Sequence[int]
                         ) -> tuple[list[float], dict[str, float]] | None:
    """:func:`sim.stats._busy_exposed_made` of ``intervals`` for ``gpus`` without a window:
    per GPU its compute stream's busy time, per communication kind the mean over GPUs of
    its exposed time; None where it declines (see the module)."""
    if not len(gpus):
        return None
    slices = intervals.slices
    busy_keys = [(g, COMPUTE_STREAM) for g in gpus]
    comm_keys = [(g, kind) for g in gpus for kind in COMM_KINDS if (g, kind) in slices]
    keys = busy_keys + comm_keys
    bounds = np.array([slices.get(key, (0, 0)) for key in keys], dtype=np.intp).reshape(-1, 2)
    merged = _unions(intervals.start, intervals.end, bounds[:, 0], bounds[:, 1] - bounds[:, 0])
    if merged is None:
        return None
    row, lo, hi, count, length = merged
    nb = len(busy_keys)
    has = count > 0
    lengths = length.tolist()
    busy = [lengths[r] if has[r] else 0 for r in range(nb)]  # (the reference's int 0)
    # per communication row with intervals: its exposed time against its GPU's busy row
    # (a GPU's busy row is its place in gpus: comm row r's GPU is keys[r][0])
    comm_rows = np.flatnonzero(has[nb:]) + nb
    exposed_of: dict[tuple[int, str], float] = {}
    if len(comm_rows):
        place = {g: k for k, g in enumerate(gpus)}
        busy_of = np.array([place[keys[r][0]] for r in comm_rows.tolist()], dtype=np.intp)
        uncovered = _uncovered(lo, hi, count, length, comm_rows, busy_of)
        exposed_of = dict(zip([keys[r] for r in comm_rows.tolist()], uncovered, strict=True))
    exposed = {}
    for kind in COMM_KINDS:  # summed over the GPUs in order, as the reference sums them
        total = 0.0
        for g in gpus:
            total += exposed_of.get((g, kind), 0.0)
        exposed[kind] = total / len(gpus)
    return busy, exposed


_INFINITY = int(np.array(np.inf).view(np.int64))


def _unions(start: np.ndarray, end: np.ndarray, first: np.ndarray, count: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The unions of the intervals ``start[first[r]:first[r] + count[r]]`` (ends alike), a
    row ``r`` each, as :class:`sim.stats._Merged` makes them: the merged intervals of all rows
    in row order (each's row, start and end), per row their count and their summed
    length (0.0 for none). None where there are no intervals, or a start or end is not
    finite or is negative (or -0.0)."""
    rows = len(first)
    total = int(count.sum())
    if not total:
        return None
    row = np.repeat(np.arange(rows), count)
    at = np.repeat(first - (np.cumsum(count) - count), count)
    at += np.arange(total)
    s, e = start.take(at), end.take(at)
    # (as 64-bit integers, a negative double or -0.0 is negative, a NaN or infinity at
    # least the infinity's)
    if (min(s.view(np.int64).min(), e.view(np.int64).min()) < 0
            or max(s.view(np.int64).max(), e.view(np.int64).max()) >= _INFINITY):
        return None
    keep = e > s  # empty intervals dropped
    s, e, row = s[keep], e[keep], row[keep]
    kept = np.bincount(row, minlength=rows)
    if not len(s):
        return row, s, e, kept, np.zeros(rows)
    # each row's by start (a stable sort, as _Merged's), where a start comes before the one
    # before it (a row of two kinds' intervals, or of sends and receives, in two runs): those
    # rows as a table, +inf after each, sorted along its rows
    same = row[1:] == row[:-1]
    down = np.flatnonzero((s[1:] < s[:-1]) & same)
    if len(down):
        bad = np.array(list(dict.fromkeys(row.take(down).tolist())), dtype=np.intp)
        at = _spread((np.cumsum(kept) - kept).take(bad), kept.take(bad))
        order = np.append(s, np.inf).take(at).argsort(axis=1, kind="stable")
        order += np.arange(0, at.size, at.shape[1])[:, None]
        slots = at >= 0
        to, source = at[slots], at.reshape(-1).take(order.reshape(-1))[slots.reshape(-1)]
        s[to], e[to] = s.take(source), e.take(source)
    # the running maximum of the ends along each row: the ends where they do not decrease
    # along a row (one after the other on a stream), else a row per table row, -inf after it
    if ((e[1:] >= e[:-1]) | ~same).all():
        reach = e
    else:
        cell = _cells(row, kept)
        width = int(kept.max(initial=0))
        table = np.full(rows * width, -np.inf)
        table[cell] = e
        reach = np.maximum.accumulate(table.reshape(rows, width), axis=1).reshape(-1).take(cell)
    # a merged interval begins at a row's first start and where a start lies beyond every
    # earlier end of its row, and ends at the running maximum just before the next one
    # begins (or at the row's last)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    new[1:] |= ~same
    last = np.empty(len(s), dtype=bool)
    last[:-1] = new[1:]
    last[-1] = True
    lo, hi, row = s[new], reach[last], row[new]
    merged = np.bincount(row, minlength=rows)
    return row, lo, hi, merged, _row_sums(row, hi - lo, merged)


def _spread(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """A table of a row per ``first``, ``count``: the positions ``first .. first + count - 1``
    then -1, as wide as the longest row (at least 1)."""
    place = np.arange(max(int(count.max(initial=0)), 1))
    return np.where(place < count[:, None], first[:, None] + place, -1)


def _cells(row: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per value (``row``: each one's row, in row order; ``count`` per row), its cell in a
    flat table of a row per row, as wide as the longest."""
    width = int(count.max(initial=0))
    return row * width + np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count)


def _row_sums(row: np.ndarray, values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per row, its ``values`` (``row``: each one's row, in row order; ``count`` per row)
    added one by one from its first (a cumulative sum along a table's row, zeros after its
    last, which add nothing to a sum of positive values); 0.0 for a row without values."""
    width = int(count.max(initial=0))
    if not width:
        return np.zeros(len(count))
    table = np.zeros(len(count) * width)
    table[_cells(row, count)] = values
    return table.reshape(len(count), width).cumsum(axis=1)[:, -1]


def _uncovered(lo: np.ndarray, hi: np.ndarray, count: np.ndarray, length: np.ndarray,
               comm_rows: np.ndarray, busy_of: np.ndarray) -> list[float]:
    """Per row of ``comm_rows`` (unions of :func:`_unions`: their merged intervals ``lo``,
    ``hi`` in row order, ``count`` per row; a GPU's rows one after the other), its length not
    covered by the union of row ``busy_of`` (its GPU's busy row):
    :meth:`sim.stats._Merged.uncovered`'s overlaps (each interval of ours against the busy
    ones it meets, found by binary searches as
    :meth:`sim.stats._Merged.uncovered_searched` finds them, the same positions), each
    row's summed in its order."""
    ends = np.cumsum(count)
    first = ends - count
    a_first = first.take(comm_rows).tolist()
    # the rows of a GPU one after the other (busy_of does not decrease): their intervals
    # searched in its busy row at once
    cut = [0, *(np.flatnonzero(busy_of[1:] != busy_of[:-1]) + 1).tolist(), len(comm_rows)]
    js, reaches = [], []
    for c0, c1 in zip(cut[:-1], cut[1:], strict=True):
        a0, a1 = a_first[c0], int(ends[comm_rows[c1 - 1]])
        b = int(busy_of[c0])
        b0, b1 = int(first[b]), int(ends[b])
        # per interval of ours: the first busy interval ending after its start, and the
        # first one starting at or after its end (as positions in lo and hi)
        js.append(hi[b0:b1].searchsorted(lo[a0:a1], "right") + b0)
        reaches.append(lo[b0:b1].searchsorted(hi[a0:a1], "left") + b0)
    j = np.concatenate(js)
    cnt = np.maximum(np.concatenate(reaches), j) - j
    total = int(cnt.sum())
    length_a = length.take(comm_rows)
    if not total:
        return (length_a - 0.0).tolist()
    # each of ours once per busy interval it meets; those run from its j on
    a_count = count.take(comm_rows)
    mine = np.repeat(np.asarray(a_first) - (np.cumsum(a_count) - a_count), a_count)
    mine += np.arange(len(j))  # each of ours' position in lo and hi
    pair = np.repeat(np.arange(len(j)), cnt)
    b_at = j.take(pair) + np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    a_at = mine.take(pair)
    overlap = np.minimum(hi.take(a_at), hi.take(b_at))
    overlap -= np.maximum(lo.take(a_at), lo.take(b_at))
    slot = np.repeat(np.arange(len(comm_rows)), a_count).take(pair)
    pairs_of = np.bincount(slot, minlength=len(comm_rows))
    covered = _row_sums(slot, overlap, pairs_of)
    return np.where(pairs_of > 0, length_a - covered, length_a - 0.0).tolist()
