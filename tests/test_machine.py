"""base.machine: numpy arrays as array.array, the values of the loops' columns unchanged."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from base.machine import machine


@given(st.lists(st.integers(-(2**62), 2**62), max_size=50))
def test_int64_values_and_slices(values: list[int]) -> None:
    """Integers (also a strided view, cast from int32 where they fit) come back as they are."""
    a = np.array(values, dtype=np.int64)
    assert machine(a, "q").tolist() == values
    assert machine(a[::2], "q").tolist() == values[::2]
    small = [v for v in values if -(2**31) <= v < 2**31]
    assert machine(np.array(small, dtype=np.int32), "q").tolist() == small


@given(st.lists(st.floats(allow_nan=False), max_size=50))
def test_doubles_bit_for_bit(values: list[float]) -> None:
    """Doubles come back bit for bit (signed zeros and infinities included)."""
    got = machine(np.array(values, dtype=float)[::-1], "d").tolist()
    assert [v.hex() for v in got] == [v.hex() for v in values[::-1]]


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50))
def test_c_int_values(values: list[int]) -> None:
    """Ids as C ints (``"i"``, what the columnar pass's end-time loop reads where a
    program's ids fit): the same integers, from int64 or a strided view."""
    a = np.array(values, dtype=np.int64)
    assert machine(a, "i").tolist() == values
    assert machine(a[::2], "i").tolist() == values[::2]
    assert machine(a, "i").itemsize == np.dtype(np.intc).itemsize
