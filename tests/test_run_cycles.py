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


def test_a_cluster_the_cache_lets_go_is_freed_and_stays_usable() -> None:
    """Past :data:`~topologies.build.CLUSTER_CACHE` clusters, the least recently used is
    released (:meth:`topologies.cluster.Cluster.release`): no cycle keeps it (its memo's
    shared collective timer, networkx's cached views of its graph), and an experiment that
    still holds it simulates as before."""
    from topologies.build import _CLUSTERS, CLUSTER_CACHE

    def experiment(num_gpus: int):
        return build_experiment({**SMALL_EXPERIMENT, "name": f"c{num_gpus}",
                                 "cluster": {**SMALL_EXPERIMENT["cluster"],
                                             "num_gpus": num_gpus},
                                 "parallel": {"tp": 2, "pp": 4, "dp": num_gpus // 8},
                                 "training": {"micro_batch_size": 1,
                                              "global_batch_size": num_gpus}})

    first = experiment(16)
    before = simulate(first, fidelity="collapsed").stats
    first.cluster.graph.edges  # noqa: B018  # networkx's cached view, pointing back at the graph
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for k in range(CLUSTER_CACHE + 1):
            simulate(experiment(32 << k), fidelity="collapsed")
        assert first.cluster not in _CLUSTERS.values()
        again = simulate(first, fidelity="collapsed").stats
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []
    assert again == before
