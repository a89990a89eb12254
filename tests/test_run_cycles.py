"""A simulation leaves no reference cycles behind (sim.engine._Run.close).

The engine builds a run under :func:`base.collector.gc_paused`, which moves what it made to
the oldest generation; a cycle through the run (its fast network's split hook, its packed
release bound on the instance) then kept the run's whole state alive until a full
collection, and ``sim validate``'s worker processes grew to 1.1 GiB by the sweep's rows
(docs/status.md). Refcounting alone must free a run: no object of it is left for the cyclic
collector.
"""

from __future__ import annotations

import gc

import pytest

from sim.api import simulate
from sim.experiment import build_experiment
from tests.conftest import SMALL_EXPERIMENT


@pytest.mark.parametrize("fidelity", ["collapsed", "full"])
def test_a_run_leaves_no_cyclic_garbage(fidelity: str) -> None:
    simulate(build_experiment(SMALL_EXPERIMENT), fidelity=fidelity)  # the caches filled
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = simulate(build_experiment(SMALL_EXPERIMENT), fidelity=fidelity)
        assert result.timeline.spans  # the deferred records made too
        del result
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []
