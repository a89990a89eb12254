"""The spans' intervals as columns (a collapsed run's), grouped by key.

:func:`sim.columnar.run_columns` hands the statistics its intervals as three columns sorted
by key (per interval its key, start and end), not as a flat list per key:
:class:`IntervalColumns`. :func:`sim.stats.compute_stats` reads each key's starts and ends
as slices of those columns (:meth:`IntervalColumns.starts_ends`), the values of the flat
lists in their order, without making the lists. Read as a mapping, an
:class:`IntervalColumns` is the :data:`sim.stats.Intervals` of the same spans, made on
first use. Pure (no SimPy, no matplotlib).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from base.machine import machine
from sim.colshape import LatestRuns

BYTE = np.iinfo(np.uint8).max + 1
"""Keys a one-pass radix sort takes (:func:`grouped`)."""


def grouped(key: np.ndarray, bound: int) -> np.ndarray:
    """The stable sort of integer keys ``0 <= key < bound`` (a radix sort on small keys: one
    pass over bytes where they fit one, 30,000 keys 0.66 -> 0.20 ms, else two). Keys below
    a larger bound are not numbered densely first where at most :data:`BYTE` of them
    occur: that renumbering (a scatter, a count, a gather by the keys) cost more than the
    second pass it saved (Megatron 1T's four sorts, 1.4 M keys, 79.3 -> 45.9 M
    instructions; random keys, 30,000 and 5,000 of them, 1.37 -> 0.58 M a sort)."""
    if bound <= BYTE:
        return np.argsort(key.astype(np.uint8), kind="stable")
    small = bound <= np.iinfo(np.uint16).max + 1
    return np.argsort(key.astype(np.uint16) if small else key, kind="stable")


def key_slices(key: np.ndarray, gpus: np.ndarray, names: Sequence[str]
               ) -> dict[tuple[int, str], tuple[int, int]]:
    """Per ``(GPU, name)`` with intervals, its slice of columns grouped by ``key`` (a stable
    sort, :func:`grouped`; :class:`IntervalColumns`): from the keys' counts (the sorted keys
    are their runs), not from the keys gathered in that order and compared."""
    found: dict[tuple[int, str], tuple[int, int]] = {}
    if len(key):
        codes = len(names)
        counts = np.bincount(key)
        present = np.flatnonzero(counts)
        hi = np.cumsum(counts).take(present)
        gpu_list = gpus.tolist()
        for k, lo, end_at in zip(present.tolist(), (hi - counts.take(present)).tolist(),
                                 hi.tolist(), strict=True):
            found[(int(gpu_list[k // codes]), names[k % codes])] = (lo, end_at)
    return found


class IntervalColumns(Mapping):
    """Intervals as columns: per interval ``key`` (``g * len(names) + code``: the GPU
    ``gpus[g]`` and the stream or kind ``names[code]``), ``start`` and ``end``, grouped by
    key here (a stable sort: each key's intervals in their order given).

    As a mapping, per ``(GPU, name)`` a flat ``[start, end, ...]`` :class:`array.array` of
    its intervals (:data:`sim.stats.Intervals`), made on first use."""

    def __init__(self, gpus: np.ndarray, names: Sequence[str], key: np.ndarray,
                 start: np.ndarray, end: np.ndarray) -> None:
        self.gpus, self.names = gpus, tuple(names)
        sort = grouped(key, len(gpus) * len(names))
        self.start, self.end = start.take(sort), end.take(sort)
        self._at: dict[tuple[int, str], tuple[int, int]] = key_slices(key, gpus, names)
        self._lists: dict[tuple[int, str], array] = {}
        self.runs: LatestRuns | None = None
        """Where these are a kept structure's intervals (:class:`sim.columnar._IntervalPlan`):
        its latest runs' busy and exposed times (:func:`sim.stats._busy_exposed`, which keeps
        them by these intervals' bits); None elsewhere."""

    @classmethod
    def laid_out(cls, gpus: np.ndarray, names: Sequence[str], start: np.ndarray,
                 end: np.ndarray, slices: Mapping[tuple[int, str], tuple[int, int]],
                 runs: LatestRuns | None = None) -> IntervalColumns:
        """Intervals already grouped by key: ``start`` and ``end`` as :attr:`start` and
        :attr:`end` of an instance of the same intervals, and its :attr:`slices` (shared,
        read only); ``runs``: :attr:`runs` (the structure's, shared)."""
        self = cls.__new__(cls)
        self.gpus, self.names = gpus, tuple(names)
        self.start, self.end = start, end
        self._at = slices  # type: ignore[assignment]
        self._lists = {}
        self.runs = runs
        return self

    @property
    def slices(self) -> Mapping[tuple[int, str], tuple[int, int]]:
        """Per ``(GPU, name)`` with intervals, its slice of :attr:`start` and :attr:`end`."""
        return self._at

    def starts_ends(self, item: tuple[int, str]) -> tuple[np.ndarray, np.ndarray] | None:
        """The starts and ends of the intervals of ``item`` (views), None for none."""
        at = self._at.get(item)
        if at is None:
            return None
        lo, hi = at
        return self.start[lo:hi], self.end[lo:hi]

    def __getitem__(self, item: tuple[int, str]) -> array:
        flat = self._lists.get(item)
        if flat is None:
            starts, ends = self.starts_ends(item) or (None, None)
            if starts is None:
                raise KeyError(item)
            both = np.empty(2 * len(starts))
            both[0::2], both[1::2] = starts, ends
            flat = self._lists[item] = machine(both, "d")
        return flat

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)
