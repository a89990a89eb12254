"""A model's per-layer parameters kept on the spec (:meth:`workloads.models.ModelSpec.
layer_params`) equal them worked out (:meth:`~workloads.models.ModelSpec._layer_params`,
the reference) on every preset and on replaced specs; the memo is outside equality and
hashing, and a non-uniform model still refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.models import PRESETS


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.sampled_from(sorted(PRESETS)), st.sampled_from([None, 1024, 3072]))
def test_kept_layer_params_equal_worked_out(name: str, ffn: int | None) -> None:
    spec = PRESETS[name]
    if ffn is not None:
        spec = replace(spec, ffn_hidden_size=ffn)
    if spec.first_dense_layers:
        with pytest.raises(ValueError):
            spec.layer_params()
        return
    first = spec.layer_params()
    assert first == spec._layer_params() and type(first) is type(spec._layer_params())
    assert spec.layer_params() == first
    fresh = replace(spec)
    assert fresh == spec and hash(fresh) == hash(spec)  # the memo is not a field
    assert fresh.layer_params() == first
