"""Simulating one layout: the evaluator every worker builds once, and its outcome."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from base.errors import ConfigError, SimError
from sim.api import simulate
from sim.commtime import CollectiveTimer
from sim.config import parse_config, set_dotted
from sim.device import DeviceProfile
from sim.experiment import balanced_layers, build_experiment
from sim.search.layouts import Layout
from topologies.build import build_cluster
from workloads.transformer import TransformerCosts


@dataclass(frozen=True)
class Evaluation:
    """The outcome of simulating one layout (what workers return and the store keeps)."""

    key: str
    status: str
    """``ok`` (fits), ``oom`` (simulated, does not fit), ``invalid`` (the experiment refused
    the layout) or ``error`` (the simulation raised)."""
    stats: dict[str, Any] | None = None
    """The ``sim run --json`` object, for ``ok`` and ``oom``."""
    error: str = ""
    elapsed_s: float = 0.0
    """Wall time of the evaluation (not part of the result's identity)."""

    def same_result(self, other: Evaluation) -> bool:
        """Whether ``other`` is the same result (its wall time aside)."""
        return (self.key, self.status, self.stats, self.error) == (
            other.key, other.status, other.stats, other.error)


class Evaluator:
    """Simulates layouts of one experiment: the callable a worker builds once.

    Builds the cluster once and shares it between the layouts' experiments, so
    its route cache is reused (it depends only on the cluster description).
    """

    def __init__(self, data: Mapping[str, Any], global_batch_size: int,
                 fidelity: str = "collapsed", profile: DeviceProfile | None = None,
                 base_dir: str | None = None) -> None:
        """``profile``: the device profile (None: ``simulate``'s default for the GPU)."""
        self.data = dict(data)
        self.global_batch_size = global_batch_size
        self.fidelity = fidelity
        self.profile = profile
        self.base_dir = Path(base_dir) if base_dir else None
        self.cluster = build_cluster(parse_config(self.data).cluster)
        self._stand_in = {"preset": "ideal", "num_gpus": self.cluster.num_gpus}
        self._timer = CollectiveTimer.shared(self.cluster)
        """Collective timings on the shared cluster, reused by every layout's simulation
        and by a search's bounds in this process (:class:`~sim.search.bounds.Bounds`): the
        cluster's own timer (its timings depend on the cluster alone)."""

    def experiment(self, layout: Layout) -> Any:
        """The experiment of ``layout`` on the shared cluster.

        :func:`sim.experiment.build_experiment` would build the cluster graph again
        for every layout (0.07 s for 1,024 GPUs); what it derives from the cluster is
        only its size, so the layout is built on an ideal stand-in of the same size
        and the real cluster (built once, with its route cache) is put in its place,
        with the real configuration. A ``balanced`` layer split depends on the cluster's
        GPUs and links: it is computed on the real cluster
        (:func:`sim.experiment.balanced_layers`).
        """
        data = self.data
        for key, value in layout.changes(self.global_batch_size).items():
            data = set_dotted(data, key, value)
        config = parse_config(data)
        balanced = config.parallel.layers_per_stage == "balanced"
        stand_in = {**data, "cluster": self._stand_in}
        if balanced:  # the split is the real cluster's (its GPU types and TP links)
            stand_in = set_dotted(stand_in, "parallel.layers_per_stage", None)
        exp = build_experiment(stand_in, self.base_dir)
        exp = replace(exp, config=config, data=dict(data), cluster=self.cluster)
        if balanced and isinstance(exp.costs, TransformerCosts):
            exp = replace(exp, costs=replace(exp.costs, stage_layers=balanced_layers(
                exp.costs, exp.schedule, exp.placement, self.cluster)))
        return exp

    def __call__(self, layout: Layout) -> Evaluation:
        """Simulate ``layout``; never raises: refusals and failures come back as results."""
        start = time.perf_counter()
        try:
            stats = simulate(self.experiment(layout), self.profile, fidelity=self.fidelity,
                             collective_timer=self._timer).stats
        except ConfigError as exc:
            return Evaluation(layout.key, "invalid", error=str(exc),
                              elapsed_s=time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - a failing layout must not stop the sweep
            kind = "" if isinstance(exc, SimError) else f"{type(exc).__name__}: "
            return Evaluation(layout.key, "error", error=f"{kind}{exc}",
                              elapsed_s=time.perf_counter() - start)
        return Evaluation(layout.key, "oom" if stats["oom"] else "ok", stats,
                          elapsed_s=time.perf_counter() - start)
