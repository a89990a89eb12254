"""``sim.statsjson.indented`` beside its reference, ``json.dumps(value, indent=2,
allow_nan=False)``: the same text wherever it writes one, and a decline only where it
must (a value the reference refuses or a type it leaves to it)."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import stats_json
from sim.statsjson import indented

_SCALARS = (st.floats(allow_nan=True, allow_infinity=True) | st.integers()
            | st.text(max_size=6) | st.booleans() | st.none())
_KEYS = st.text(max_size=5) | st.integers(-3, 3)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=30)


def _plain(value) -> bool:
    """Whether ``value`` holds only what :func:`indented` writes (no NaN, infinity or key
    other than a ``str``)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(map(_plain, value))
    return True


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_VALUES)
def test_indented_is_the_reference(value) -> None:
    got = indented(value)
    try:
        want = json.dumps(value, indent=2, allow_nan=False)
    except ValueError:
        want = None
    if got is not None:
        assert got == want
    else:
        assert not _plain(value)
    if _plain(value):
        assert got is not None


def test_declines_what_it_does_not_write() -> None:
    assert indented({"a": np.float64(1.5)}) is None  # a subclass: the reference's
    assert indented({1: 2.0}) is None  # a key not a str: the reference converts it
    assert indented([float("nan")]) is None
    cycle: list = []
    cycle.append(cycle)
    assert indented(cycle) is None


def test_stats_json_text() -> None:
    stats = {"step_time_s": 1.25, "oom": False, "layout": {"tp": 8, "pp": 16},
             "per_stage": [0.5, 1e-300, -0.0], "empty": {}, "none": [], "name": "gpt\u00e9"}
    assert stats_json(stats) == json.dumps(stats, indent=2, allow_nan=False) + "\n"
    with_numpy = {"x": np.float64(2.5), "y": {3: 1.0}}
    assert stats_json(with_numpy) == json.dumps(with_numpy, indent=2, allow_nan=False) + "\n"
