"""A dataclass with some fields changed, one object per original and changes.

The lowering derives its costs from an experiment's by :func:`dataclasses.replace` (the TP,
EP, CP and DP collectives' exposed times, MoE host waits), and keeps what it made from a
costs object on that object (the collapsed lowering's folds and segments,
:mod:`workloads.lowering.columnar`). A fresh replace each run would leave all of that behind
and make it again: :func:`replaced` hands back the object it made before for the same
original and equal changes. Changes are equal when their ``repr`` is (exact for floats,
``-0.0`` apart from ``0.0``; values without a faithful ``repr``, as objects shown by their
address, simply never match). The value is the same either way: the changes determine it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

T = TypeVar("T")

MEMO_SIZE = 16
"""Derived objects kept per original (the memo starts over past this many)."""


def replaced(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)``, the same object as the last call with this
    ``obj`` and changes of the same ``repr``, kept on ``obj`` (which needs a ``__dict__``)."""
    key = repr(sorted(changes.items()))
    memo = obj.__dict__.setdefault("_memo_replaced", {})
    out = memo.get(key)
    if out is None:
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        out = memo[key] = replace(obj, **changes)
    return out
