"""The shape of a columnar program: what its passes derive from its structure alone.

The queue-free engine pass (:mod:`sim.columnar`) and the idle breakdown (:func:`sim.idle.
_columnar`) derive from a program's columns much that depends only on its structure
(which instruction is what, on which GPU, of which kind, waiting for which others, where
a compute op blocks or allocates): the GPUs as dense indices, the stream predecessors, the
loop's dependency columns, the intervals' keys and their grouping, the memory changes'
order, each GPU's compute ops. None of it reads a time, so a program of the same
structure with other costs (a repeat, a sweep of GPU, bandwidth or sequence length over
one layout, the same layout in another search) derives the same arrays.

:func:`shape_of` gives a program's :class:`Shape`: the same object for equal structures
(compared field by field, exactly, against the few kept), on which the passes keep what
they derived (:meth:`Shape.derived`, each computed by the pass's own function on first
use: that function is the reference, and ``tests/test_colshape.py`` holds a warm shape's
results to a cold one's). Pure.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from workloads.program import Columns

KEPT = 8
"""Shapes kept across calls (the latest first), at most: a search's layouts of one pipeline
schedule (the same ``p`` and ``m``) with other TP, DP or micro-batch sizes often lower to
one structure (GPT-3 175B on 1,024 GPUs: TP4 PP16 with micro-batch 1 and TP8 PP16 with
micro-batch 2, the same 14,896 instructions on the same GPUs), met again after other
layouts ran between them."""

KEPT_INSTRUCTIONS = 1 << 19
"""... and at most this many instructions over the kept shapes together (the latest is kept
whatever the others hold): two of the largest kept, as when two shapes were kept."""

KEPT_MAX_INSTRUCTIONS = 1 << 18
"""Programs larger than this get a shape of their own, not kept across calls (a single
large run gains nothing from it, and its arrays would stay in memory)."""

_STRUCTURE = ("cls", "gpu", "kind", "dst", "deps", "comm")
"""The :class:`Columns` fields a shape is made of as they are (besides ``names``)."""


class LatestRuns:
    """The latest results one kept structure's pass worked out, each kept by its inputs bit
    for bit (arrays; floats as their 64-bit integers, so ``-0.0`` is not ``0.0`` and a NaN
    is its own payload): a repeat, or a sweep cycling through a few costs over one layout,
    gives a kept run's inputs again and finds its result. The engine's pass
    (:func:`sim.columnar.run_columns`), the idle breakdown (:func:`sim.idle._columnar`) and
    the busy and exposed times (:func:`sim.stats._busy_exposed`) keep theirs here, each
    worked out by its own function, the reference."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: tuple[tuple[tuple[np.ndarray, ...], Any], ...] = ()

    def __len__(self) -> int:
        return len(self.runs)

    def find(self, key: tuple[np.ndarray, ...]) -> Any:
        """The result kept under inputs equal to ``key`` (array by array), else None."""
        for kept, out in self.runs:  # (a snapshot: another thread may replace them)
            if all(a.shape == b.shape and bool((a == b).all())
                   for a, b in zip(kept, key, strict=True)):
                return out
        return None

    def keep(self, key: tuple[np.ndarray, ...], out: Any, most: int, most_rows: int) -> None:
        """Keep ``out`` under ``key`` (both the caller's to hand over: not copied), the latest
        first: at most ``most`` runs, whose first key arrays hold at most ``most_rows``
        elements together (the older go first)."""
        runs, rows = [(key, out)], len(key[0])
        for run in self.runs[:most - 1]:
            rows += len(run[0][0])
            if rows > most_rows:
                break
            runs.append(run)
        self.runs = tuple(runs)


def bits(values: np.ndarray) -> np.ndarray:
    """``values`` as float64 seen as int64 (a view where it can be): :class:`LatestRuns`'
    keys compare floats bit for bit."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.int64)


class Shape:
    """A program's structure (:data:`_STRUCTURE`, ``names``, and where ``blocking_s``,
    ``alloc_bytes`` and ``free_bytes`` are positive or non-zero) and what passes derived from
    it (:meth:`derived`). Read-only arrays: a shape is shared by the programs of equal
    structure."""

    def __init__(self, columns: Columns, masks: tuple[np.ndarray, ...] | None) -> None:
        self.names = columns.names
        self.arrays = tuple(_frozen(getattr(columns, f)) for f in _STRUCTURE)
        self.masks = masks or ()
        self.kept = masks is not None
        """Whether it is kept across calls (else it serves one program's passes only, and
        a pass need not lay out what only later calls would reuse)."""
        self._derived: dict[Hashable, Any] = {}
        self.resumed = False
        """Whether another structure's shape was looked up since this one's latest lookup
        (:func:`shape_of`): the latest run's chains (:class:`sim.chains.Hint`) are then
        those of other costs, not tried (:func:`sim.columnar.run_columns`)."""

    def same(self, columns: Columns, masks: tuple[np.ndarray, ...]) -> bool:
        """Whether ``columns`` (with ``masks``, :func:`_masks`) has this structure, exactly."""
        return (columns.names == self.names
                and all(_equal(getattr(columns, f), a)
                        for f, a in zip(_STRUCTURE, self.arrays, strict=True))
                and all(_equal(m, a) for m, a in zip(masks, self.masks, strict=True)))

    def derived(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """What ``make`` derives (kept under ``key``: what it derives from the structure
        alone, and from ``key``), made on first use; made every time on a shape not kept
        (what a pass derives is freed after it, as its own temporaries)."""
        if not self.kept:
            return make()
        found = self._derived.get(key)
        if found is None:
            found = self._derived[key] = make()
        return found


def _frozen(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False  # a column is never written after it is laid out
    return values


def _masks(columns: Columns) -> tuple[np.ndarray, ...]:
    """Where a compute op blocks on communication, allocates and frees."""
    return (columns.blocking_s > 0, columns.alloc_bytes != 0, columns.free_bytes != 0)


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all()))


_kept: list[Shape] = []
_of: weakref.WeakKeyDictionary[Columns, Shape] = weakref.WeakKeyDictionary()


def shape_of(columns: Columns) -> Shape:
    """The :class:`Shape` of ``columns``: the one made for them before (the engine's pass
    and the idle breakdown read the same columns), else a kept one of the same structure,
    else a new one (kept where the program is small enough, :data:`KEPT_MAX_INSTRUCTIONS`)."""
    shape = _of.get(columns)
    if shape is not None:
        return shape
    if len(columns) > KEPT_MAX_INSTRUCTIONS:
        return Shape(columns, None)
    masks = _masks(columns)
    for k, kept in enumerate(_kept):
        if kept.same(columns, masks):
            if k:
                _kept.insert(0, _kept.pop(k))
            kept.resumed = k > 0
            break
    else:
        kept = Shape(columns, masks)
        _kept.insert(0, kept)
        total = 0
        for k, shape in enumerate(_kept):
            total += len(shape.arrays[0])
            if k >= KEPT or (k and total > KEPT_INSTRUCTIONS):
                del _kept[k:]
                break
    _of[columns] = kept
    return kept


def clear() -> None:
    """Forget the kept shapes (tests: a cold start)."""
    _kept.clear()
    _of.clear()
