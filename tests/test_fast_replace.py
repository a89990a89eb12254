""":func:`base.replaced.fast_replace` equals :func:`dataclasses.replace` (the reference):
on drawn cost models and changes (hypothesis) the same type, fields in the same order, the
very field values, nothing else carried over (memos, cached properties); classes where
``replace`` does more than assign (``__post_init__``, slots, ``InitVar``, ``init=False``,
an ``__init__`` of their own) and changes that are not fields take ``replace`` itself."""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field, fields, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.replaced import _plain_fields, fast_replace
from tests.test_search_op_work import _costs


def _same(fast: object, ref: object) -> None:
    assert type(fast) is type(ref) and fast == ref
    assert list(vars(fast)) == list(vars(ref))  # the fields, in order, and nothing else
    assert all(vars(fast)[k] is vars(ref)[k] for k in vars(ref))


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_costs(), _costs(), st.lists(st.integers(0, 200), max_size=6))
def test_fast_replace_is_replace_on_cost_models(costs: object, other: object,
                                                 picks: list[int]) -> None:
    if costs is None or other is None:
        return
    names = [f.name for f in fields(costs)]
    changes = {names[k % len(names)]: getattr(other, names[k % len(names)]) for k in picks}
    assert _plain_fields(type(costs)) is not None  # the fast path, not replace's
    costs.__dict__["_memo_example"] = {}  # what an instance keeps besides its fields
    _same(fast_replace(costs, **changes), replace(costs, **changes))
    assert "_memo_example" not in vars(fast_replace(costs, **changes))


@dataclass(frozen=True)
class _Plain:
    a: int
    b: tuple = ()
    c: float = 0.0


@dataclass(frozen=True)
class _Post:
    a: int
    b: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "b", self.a * 2)


@dataclass(frozen=True, slots=True)
class _Slots:
    a: int


@dataclass
class _Hidden:
    a: int
    b: int = field(default=0, init=False)


@dataclass
class _Init:
    a: int
    b: InitVar[int] = 0


@dataclass
class _Own:
    a: int

    def __init__(self, a: int) -> None:
        self.a = a + 1


def test_fast_replace_defers_where_replace_does_more() -> None:
    _same(fast_replace(_Plain(1, (2,)), c=3.0), replace(_Plain(1, (2,)), c=3.0))
    assert fast_replace(_Post(1), a=5) == replace(_Post(1), a=5) == _Post(5, 10)
    assert fast_replace(_Slots(1), a=2) == _Slots(2)
    assert fast_replace(_Hidden(1), a=2) == replace(_Hidden(1), a=2)
    assert fast_replace(_Init(1), a=2, b=3) == replace(_Init(1), a=2, b=3)
    assert fast_replace(_Own(1), a=2) == replace(_Own(1), a=2) == _Own(2)
    with pytest.raises(TypeError):
        fast_replace(_Plain(1), d=1)
    with pytest.raises(TypeError):
        dataclasses.replace(_Plain(1), d=1)
