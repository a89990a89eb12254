"""Timing collectives in isolation on the real topology, for collapsed simulations.

A collapsed simulation (DESIGN.md, "Large clusters") runs one representative
GPU per pipeline rank. The collectives it takes part in are timed here: every
group it stands for runs the collective at once on the flow-level network, so
contention between the replicas' collectives on shared links (NICs, uplinks)
is included. Results are cached per (op, groups, bytes) on the instance.
"""

from __future__ import annotations

from sim.engine import simulate_program
from sim.network import makespan_s
from topologies.cluster import Cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1,
              "all_gather": lambda n: n - 1}


class CollectiveTimer:
    """``timer(op, groups, nbytes)`` -> seconds for ``op`` run concurrently on all ``groups``."""

    def __init__(self, cluster: Cluster, algo: str = "ring") -> None:
        self.cluster = cluster
        self.algo = algo
        self._cache: dict[tuple, float] = {}
        self.simulations = 0
        """How many distinct collective simulations ran (the rest were cache hits)."""

    def __call__(self, op: str, groups: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        key = (op, groups, nbytes)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if op == "send":  # groups are (src, dst) pairs sending at once
            flows = []
            for src, dst in groups:
                route = self.cluster.route(src, dst)
                flows.append((route.latency_s, route.links, nbytes))
            t = self._cache[key] = makespan_s(flows, self.cluster.link_bandwidth_Bps)
            return t
        if self.algo == "ring" and op in RING_STEPS:
            t = self._ring_time(op, groups, nbytes)
            self._cache[key] = t
            return t
        b = ProgramBuilder()
        for group in groups:
            if len(group) > 1:
                b.collective(group, {}, kind="dp", name=op, op=op, nbytes=nbytes, algo=self.algo)
        instructions = b.build()
        n = self.cluster.num_gpus
        if instructions:
            program = Program(n, instructions, (0.0,) * n, gpipe(1, 1))
            t = simulate_program(program, self.cluster, lambda _op: 0.0).end_s
            self.simulations += 1
        else:
            t = 0.0
        self._cache[key] = t
        return t

    def _ring_time(self, op: str, groups: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        """Ring collectives: every step moves one chunk along every ring edge of every group.

        All steps have the same flows, so one step is timed on the flow
        network (max-min sharing, per-hop latency) and multiplied by the number
        of steps, plus the launch latency. Exact when the steps run in lockstep,
        as they do when all ring edges of a group see the same bandwidth.
        """
        live = [g for g in groups if len(g) > 1]
        if not live or nbytes <= 0:
            return 0.0
        flows = []
        for group in live:
            n = len(group)
            for i, src in enumerate(group):
                route = self.cluster.route(src, group[(i + 1) % n])
                flows.append((route.latency_s, route.links, nbytes / n))
        step = makespan_s(flows, self.cluster.link_bandwidth_Bps)
        steps = max(RING_STEPS[op](len(g)) for g in live)
        return self.cluster.collective_launch_s + steps * step
