"""An unnamed op's layers on a uniform model put in at once (:meth:`StageOps._op_segments`,
``labels`` false: :meth:`StageOps.op_work`) are the layer-by-layer reference's segments:
equal, and the very objects (what the folds key on by identity,
:func:`workloads.lowering.collapse.work_key`, and the fusions, :func:`workloads.costs.
fuse_alike`) where the reference's are the same objects call after call, with and without
markers, split backwards or not, on every stage."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings

from tests.test_search_op_work import _costs
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op


def _fresh(costs: object) -> object:
    """A copy of ``costs`` without the segments kept on it."""
    out = copy.copy(costs)
    for key in [k for k in out.__dict__ if k.startswith("_memo")]:
        del out.__dict__[key]
    return out


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(costs=_costs())
def test_uniform_layers_at_once_are_the_reference(costs: object) -> None:
    if costs is None:
        return
    costs = _fresh(costs)
    for stage in range(len(costs.stage_layers)):
        for kind in (FORWARD, BACKWARD, WEIGHT_GRAD):
            for split in (False, True):
                for markers in (False, True):
                    op = Op(stage, kind, 0)
                    fast = costs._op_segments(op, split, markers, labels=False)
                    ref = costs._op_segments(op, split, markers, labels=False, reference=True)
                    assert fast == ref
                    again = costs._op_segments(op, split, markers, labels=False, reference=True)
                    if all(a is b for a, b in zip(ref, again, strict=True)):
                        # the reference's own objects (none made anew per call, as the
                        # embedding's are on stage 0): the fast path's are they
                        assert all(a is b for a, b in zip(fast, ref, strict=True))


def test_the_fast_path_is_taken() -> None:
    """GPT-3 175B's example (TP8 PP16): uniform, so its middle stages' ops go the fast way
    (else the test above would compare the reference with itself)."""
    from pathlib import Path

    import yaml

    from sim.experiment import Experiment

    data = yaml.safe_load(Path("workloads/examples/search-gpt3-175b-1024.yaml").read_text(
        encoding="utf-8"))
    data["parallel"].update({"tp": 8, "pp": 16, "dp": 8})
    costs = _fresh(Experiment.from_dict(data).costs)
    assert costs._uniform_layers()
    calls = []
    layer_segments = costs._layer_segments

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return layer_segments(*args, **kwargs)

    costs.__dict__["_layer_segments"] = counted  # (a frozen instance)
    for kind in (FORWARD, BACKWARD):
        for markers in (False, True):
            calls.clear()
            costs._op_segments(Op(5, kind, 0), False, markers, labels=False)
            assert len(calls) == 1  # one layer's, not six
