"""Timing collectives in isolation on the real topology, for collapsed simulations.

A collapsed simulation (DESIGN.md, "Large clusters") runs one representative
GPU per pipeline rank. The collectives and pipeline sends it takes part in are
timed here: every group it stands for runs the collective at once on the
flow-level network, so contention between the replicas' collectives on shared
links (NICs, uplinks) is included. The plan is the engine's own
(:func:`sim.engine.collective_plan`: the cluster's per-op algorithm override or
``auto`` choice, its granularity, the routes' latencies, the per-step software
latency), so an isolated collective takes exactly as long here as in a full
simulation. Results are cached per (op, groups, bytes) on the instance.
"""

from __future__ import annotations

from sim.engine import collective_plan, simulate_program, step_latency_s
from sim.network import makespan_s
from topologies.cluster import Cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

Flow = tuple[float, tuple[int, ...], float]
"""``(start_s, links, nbytes)`` as :func:`sim.network.makespan_s` takes it."""


class CollectiveTimer:
    """``timer(op, groups, nbytes)`` -> seconds for ``op`` run concurrently on all ``groups``.

    ``op == "send"``: ``groups`` are ``(src, dst)`` pairs each sending ``nbytes`` at
    once (the engine's point-to-point transfer: route latency, then a flow).
    Otherwise each group of two or more GPUs runs collective ``op`` with
    ``algo`` (unless the cluster overrides the algorithm for ``op``), and the
    time is the collective launch latency plus the makespan of all their plans.
    """

    def __init__(self, cluster: Cluster, algo: str = "ring") -> None:
        self.cluster = cluster
        self.algo = algo
        self._cache: dict[tuple, float] = {}
        self.simulations = 0
        """How many collectives needed the event engine (plans with dependent transfers)."""

    def __call__(self, op: str, groups: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        key = (op, groups, nbytes)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = (self._send_time(groups, nbytes) if op == "send"
                                         else self._collective_time(op, groups, nbytes))
        return cached

    def _send_time(self, pairs: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        flows: list[Flow] = []
        for src, dst in pairs:
            route = self.cluster.route(src, dst)
            flows.append((route.latency_s, route.links, nbytes))
        return makespan_s(flows, self.cluster.link_bandwidth_Bps)

    def _collective_time(self, op: str, groups: tuple[tuple[int, ...], ...],
                         nbytes: float) -> float:
        """Launch latency + makespan of every group's plan, started together.

        Plans whose transfers do not depend on each other (streamed rings,
        NVLS, ...) are timed by the pure flow loop; others (trees, step
        granularity, hierarchical) by the event engine on a program holding
        just these collectives.
        """
        live = [g for g in groups if len(g) > 1]
        if not live:
            return 0.0
        c = self.cluster
        plans = [collective_plan(c, op, self.algo, g, nbytes) for g in live]
        if all(not step.deps for steps in plans for step in steps):
            flows: list[Flow] = []
            for steps in plans:
                for step in steps:
                    route = c.route(step.src, step.dst)
                    flows.append((step_latency_s(c, step), route.links, step.nbytes))
            return c.collective_launch_s + makespan_s(flows, c.link_bandwidth_Bps)
        b = ProgramBuilder()
        for group in live:
            b.collective(group, {}, kind="dp", name=op, op=op, nbytes=nbytes, algo=self.algo)
        n = c.num_gpus
        program = Program(n, b.build(), (0.0,) * n, gpipe(1, 1))
        self.simulations += 1
        return simulate_program(program, c, lambda _op: 0.0).end_s
