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

import dataclasses
from dataclasses import replace
from typing import Any, TypeVar

T = TypeVar("T")

_PLAIN: dict[type, tuple[tuple[str, ...], frozenset[str]] | None] = {}
""":func:`fast_replace`'s classes: the names of their fields (in order, and as a set), or
None where it defers to :func:`dataclasses.replace`."""


def _plain_fields(cls: type) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """The field names of ``cls`` (in order, and as a set) where :func:`dataclasses.replace`
    would only pass every field to the ``__init__`` the dataclass made, which assigns them:
    a dataclass without ``__post_init__``, without slots, whose every field is an init
    field (no ``InitVar``, no ``init=False``), its ``__init__`` its own; else None."""
    found = _PLAIN.get(cls, False)
    if found is not False:
        return found  # type: ignore[return-value]
    field, classvar = (getattr(dataclasses, "_FIELD", None),
                       getattr(dataclasses, "_FIELD_CLASSVAR", None))
    specs = getattr(cls, "__dataclass_fields__", None)
    names = None
    made = getattr(getattr(cls, "__init__", None), "__code__", None)
    if (specs is not None and field is not None and not hasattr(cls, "__post_init__")
            and getattr(made, "co_filename", None) == "<string>"  # (the dataclass's)
            and not any("__slots__" in vars(k) for k in cls.__mro__)):
        kinds = [(name, getattr(f, "_field_type", None), f.init) for name, f in specs.items()]
        if all(kind is classvar or (kind is field and init) for _, kind, init in kinds):
            order = tuple(name for name, kind, _ in kinds if kind is field)
            names = (order, frozenset(order))
    _PLAIN[cls] = names
    return names


def fast_replace(obj: T, **changes: Any) -> T:
    """:func:`dataclasses.replace` (the reference) without its per-field calls where that is
    all it does (:func:`_plain_fields`): a new instance whose ``__dict__`` holds the fields
    of ``obj``'s with ``changes`` in their place, and nothing else (not what ``obj`` keeps
    besides its fields: memos, cached properties). A frozen cost model of ~90 fields:
    ~240 -> ~10 us. Anything else, a change that is not a field or a field ``obj`` does not
    hold as an instance attribute included, takes :func:`dataclasses.replace`."""
    plain = _plain_fields(type(obj))
    state = getattr(obj, "__dict__", None)
    if (plain is None or state is None or not plain[1] <= state.keys()
            or not changes.keys() <= plain[1]):
        return replace(obj, **changes)
    new = object.__new__(type(obj))
    fresh = new.__dict__
    for name in plain[0]:  # in field order, as __init__ assigns them
        fresh[name] = changes[name] if name in changes else state[name]
    return new


MEMO_SIZE = 16
"""Derived objects kept per original (the memo starts over past this many)."""


def replaced(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` (by :func:`fast_replace`), the same object as
    the last call with this ``obj`` and changes of the same ``repr``, kept on ``obj`` (which
    needs a ``__dict__``)."""
    key = repr(sorted(changes.items()))
    memo = obj.__dict__.setdefault("_memo_replaced", {})
    out = memo.get(key)
    if out is None:
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        out = memo[key] = fast_replace(obj, **changes)
    return out
