"""``sim validate``'s sweep predictions read each GPU's memory floor from the engine's
summary (:attr:`sim.timeline.Timeline.memory_floor_by_gpu`, no timeline records made);
the reference reads it sample by sample (:func:`sim.validate.memory_floors`). The two give
the same predictions, float for float."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.calibration import A100_HAGEMANN, A100_HAGEMANN_13B
from sim.validate import HAGEMANN_SWEEP, _predict_one, load_rows, memory_floors


@cache
def _rows() -> tuple:
    return tuple(r for r in load_rows(HAGEMANN_SWEEP) if r.status in ("ok", "oom"))


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_sweep_predictions_equal_the_sample_by_sample_floors(data: st.DataObject) -> None:
    row = data.draw(st.sampled_from(_rows()))
    profile = data.draw(st.sampled_from((A100_HAGEMANN, A100_HAGEMANN_13B)))
    fast, ref = _predict_one((row, profile)), _predict_one((row, profile), reference=True)
    assert repr(fast) == repr(ref)
    assert fast.memory_parts  # every simulated GPU has its static sample


def test_memory_floors_keep_the_first_of_equal_samples() -> None:
    from sim.timeline import MemorySample, Timeline

    samples = (MemorySample(0, 0.0, 0.0), MemorySample(0, 1.0, -0.0),
               MemorySample(0, 3.0, 2.0), MemorySample(1, 0.0, 5.0),
               MemorySample(1, 2.0, 3.0))
    timeline = Timeline(2, (), (), samples)
    assert repr(memory_floors(timeline)) == repr({0: 0.0, 1: 3.0})
    assert repr(timeline.memory_floor_by_gpu) == repr({0: 0.0, 1: 3.0})
