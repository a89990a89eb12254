"""The stats' JSON text without the encoder's generators (:func:`base.jsonindent.
dumps_indent2`) is ``json.dumps(value, indent=2, allow_nan=False)``'s, or declines."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from base.jsonindent import dumps_indent2


class _Float(float):
    pass


_leaves = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.floats(0, 1).map(_Float))
_keys = st.one_of(st.text(max_size=6), st.integers(-5, 10**20), st.booleans(), st.none(),
                  st.floats(allow_nan=False, width=32))
_values = st.recursive(
    _leaves, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                     st.lists(inner, max_size=4).map(tuple),
                                     st.dictionaries(_keys, inner, max_size=5)),
    max_leaves=40)


def _plain(value: object) -> bool:
    """Only the values :func:`dumps_indent2` writes itself."""
    if isinstance(value, dict) and type(value) is dict:
        return all(type(k) in (str, int) and _plain(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)  # type: ignore[union-attr]
    if type(value) is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    return value is None or type(value) in (bool, int, str)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(_values)
def test_the_text_is_json_dumps_or_it_declines(value: object) -> None:
    got = dumps_indent2(value)
    try:
        expected = json.dumps(value, indent=2, allow_nan=False)
    except ValueError:
        assert got is None  # a NaN or infinity: json raises, the caller's path
        return
    if got is None:
        assert not _plain(value)
    else:
        assert got == expected
    if _plain(value):
        assert got == expected


def test_a_run_s_stats() -> None:
    """A collapsed run's stats (nested dicts of floats, integers, strings, lists), through
    :func:`sim.api.stats_json`."""
    import yaml

    from sim import api
    from sim.experiment import Experiment

    with open("workloads/examples/search-gpt3-175b-1024.yaml", encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    stats = api.simulate(Experiment.from_dict(data), fidelity="collapsed").stats
    assert dumps_indent2(stats) is not None
    assert api.stats_json(stats) == json.dumps(stats, indent=2, allow_nan=False) + "\n"
