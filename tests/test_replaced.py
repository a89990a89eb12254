"""base.replaced: dataclasses.replace, one object per original and changes of the same repr."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from base.replaced import MEMO_SIZE, replaced


@dataclass(frozen=True)
class _Costs:
    a: float = 1.0
    pairs: tuple = ()


_values = st.one_of(st.floats(allow_nan=False), st.tuples(st.text(max_size=3), st.floats()))


@settings(max_examples=200, derandomize=True)
@given(st.lists(st.tuples(st.floats(), _values), min_size=1, max_size=40))
def test_replaced_equals_replace_and_a_repeat_is_the_same_object(calls: list) -> None:
    base = _Costs()
    for a, pairs in calls:
        out = replaced(base, a=a, pairs=(pairs,))
        assert repr(out) == repr(replace(base, a=a, pairs=(pairs,)))  # -0.0 and NaN too
        assert replaced(base, a=a, pairs=(pairs,)) is out
    assert len(base.__dict__["_memo_replaced"]) <= MEMO_SIZE


def test_same_changes_same_object_and_signed_zero_apart() -> None:
    base = _Costs()
    one = replaced(base, pairs=(("x", 0.5),))
    assert replaced(base, pairs=(("x", 0.5),)) is one
    assert replaced(base, pairs=(("x", 0.25),)) is not one
    zero, negative = replaced(base, a=0.0), replaced(base, a=-0.0)
    assert zero is not negative and str(negative.a) == "-0.0"
    assert replaced(_Costs(), pairs=(("x", 0.5),)) is not one  # kept per original
