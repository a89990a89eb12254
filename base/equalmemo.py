"""A few results of a pure function of arrays, found again by exact equality of its arguments.

A collapsed lowering lays out its ids, dependencies and per-instruction structure from
arrays (each op's template, its producers, its rank) that a repeat, or a layout of the
same structure with other costs, gives again equal: :class:`EqualMemo` keeps the last few
results and hands one back where every argument equals (numpy arrays element for element,
with the same shape and type; other values by ``==``) those it was made from. The
arguments are copied when kept and the results' arrays made read-only, so neither a
caller's later writes nor a reader's can change what a later call gets. The function
itself is the reference: a result found equals the one it would make (what its callers'
tests compare). Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


class EqualMemo:
    """The last ``size`` results of a pure function, keyed by equal arguments (the latest
    used first)."""

    def __init__(self, size: int = 4, max_elements: int = 1 << 20,
                 total_elements: int | None = None) -> None:
        self.size = size
        self.max_elements = max_elements
        """Arguments with more array elements than this are not kept (their result made
        every time): a single large run gains nothing from them."""
        self.total_elements = total_elements
        """Where set, the kept arguments' array elements together at most this many (the
        older dropped first; the latest kept whatever it holds): many small structures
        kept, few large ones."""
        self._entries: list[tuple[tuple, Any]] = []

    def get(self, args: tuple, make: Callable[[], T]) -> T:
        """``make()``, or the result kept for arguments equal to ``args``."""
        for k, (key, value) in enumerate(self._entries):
            if _same(key, args):
                if k:
                    self._entries.insert(0, self._entries.pop(k))
                return value
        value = make()
        if _elements(args) <= self.max_elements:
            _freeze(value)
            self._entries.insert(0, (tuple(a.copy() if isinstance(a, np.ndarray) else a
                                           for a in args), value))
            del self._entries[self.size:]
            if self.total_elements is not None:
                total = 0
                for k, (key, _) in enumerate(self._entries):
                    total += _elements(key)
                    if k and total > self.total_elements:
                        del self._entries[k:]
                        break
        return value

    def clear(self) -> None:
        self._entries.clear()


def _elements(args: tuple) -> int:
    return sum(a.size for a in args if isinstance(a, np.ndarray))


def _same(key: tuple, args: tuple) -> bool:
    if len(key) != len(args):
        return False
    for a, b in zip(key, args, strict=True):
        if a is b:
            continue
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                    and a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())):
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True


def _freeze(value: Any) -> None:
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, tuple | list):
        for item in value:
            _freeze(item)
