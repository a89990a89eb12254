"""numpy arrays as :class:`array.array`: what the Python loops of the fast paths read.

A loop over plain Python values reads an :class:`array.array` faster than a numpy array
(no scalar objects made per element) and about as fast as a list, which costs a
conversion of every element to make; an :class:`array.array` costs one copy of the bytes.
"""

from __future__ import annotations

from array import array

import numpy as np

_DTYPES = {"q": np.int64, "d": np.float64, "i": np.intc}


def machine(values: np.ndarray, code: str) -> array:
    """``values`` as an :class:`array.array` of type ``code`` (``"q"``: int64, ``"i"``: C
    int, ``"d"``: doubles; the values cast to that type): one copy of the bytes, none in between."""
    out = array(code)
    out.frombytes(memoryview(np.ascontiguousarray(values, dtype=_DTYPES[code])).cast("B"))
    return out
