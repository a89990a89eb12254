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
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import SMALL_EXPERIMENT

from sim.api import simulate
from sim.experiment import build_experiment


@contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """Collect first, then yield a list that on exit holds the type names of every object
    the cyclic collector found unreachable inside the block (``gc.DEBUG_SAVEALL``)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    left: list[str] = []
    try:
        yield left
        gc.collect()
        left.extend(sorted({type(o).__qualname__ for o in gc.garbage}))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("fidelity", ["collapsed", "full"])
def test_a_run_leaves_no_cyclic_garbage(fidelity: str) -> None:
    simulate(build_experiment(SMALL_EXPERIMENT), fidelity=fidelity)  # the caches filled
    with cyclic_garbage() as left:
        result = simulate(build_experiment(SMALL_EXPERIMENT), fidelity=fidelity)
        assert result.timeline.spans  # the deferred records made too
        del result
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
    with cyclic_garbage() as left:
        for k in range(CLUSTER_CACHE + 1):
            simulate(experiment(32 << k), fidelity="collapsed")
        assert first.cluster not in _CLUSTERS.values()
        again = simulate(first, fidelity="collapsed").stats
    assert left == []
    assert again == before
