"""A layer's named segments from its cost model's template (``StageOps._layer_segments``:
built once with a placeholder name, the name put in each label's place) against the layer
built by name (``StageOps._named_layer``, the reference)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from test_search_op_work import _costs

from workloads import stage_ops


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(costs=_costs())
def test_layer_templates_are_the_named_layers(costs: object) -> None:
    """Every layer of every stage, forward and backward, deferred or not, with and without
    markers: the same segments, field for field and type for type, as built by name."""
    if costs is None:
        return
    layers = sum(costs.stage_layers)
    for layer in range(layers):
        for backward in (False, True):
            for deferred in (False, True):
                for marked in (False, True):
                    got = costs._layer_segments(layer, backward, deferred, True, marked)
                    want = costs._layer(layer)._named_layer(f"L{layer}", backward, deferred,
                                                            marked)
                    assert list(got) == list(want)
                    assert [type(s) for s in got] == [type(s) for s in want]


def test_the_template_is_used_and_kept() -> None:
    """A dense layer's template holds the placeholder only in labels (so it is used, not
    the by-name fallback), and is kept on the cost model."""
    from sim.experiment import Experiment

    exp = Experiment.from_dict({
        "name": "t", "model": {"preset": "gpt3-1.3b", "seq_length": 2048},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
        "parallel": {"tp": 2, "pp": 4, "dp": 2, "sequence_parallel": True},
        "training": {"micro_batch_size": 2, "global_batch_size": 64}})
    costs = exp.costs
    first = costs._layer_segments(3, True, False, True)
    template = costs.__dict__["_memo_layer_named"][(True, False, False)]
    assert template is not False
    assert any(parts is not None for _, parts in template)
    assert all(stage_ops.PLACEHOLDER not in s.label for s in first)
    assert list(first) == list(costs._named_layer("L3", True, False, False))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(costs=_costs())
def test_transient_bytes_keep_the_unrecomputed_layer(costs: object) -> None:
    """The layer's activation bytes without recomputation ``transient_bytes`` reads, kept on
    each cost model, are those of the cost model replaced without recomputation."""
    from dataclasses import replace

    if costs is None:
        return
    for stage in range(len(costs.stage_layers)):
        for c, _ in costs._runs(stage):
            want = replace(c, recompute="none").layer_activation_bytes()
            assert c._unrecomputed_layer_bytes() == want
            assert c._unrecomputed_layer_bytes() == want  # kept
