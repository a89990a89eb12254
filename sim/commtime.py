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
Groups that are exact replicas on disjoint links are timed by simulating one
of them (:func:`replicas_makespan_s`, bit-identical to simulating all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sim.collectives import GroupProfile
from sim.engine import collective_plan, gc_paused, simulate_program, step_latency_s
from sim.network import makespan_s
from topologies.cluster import Cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

Flow = tuple[float, tuple[int, ...], float]
"""``(start_s, links, nbytes)`` as :func:`sim.network.makespan_s` takes it."""


def replicas_makespan_s(groups: Sequence[Sequence[Flow]],
                        capacity_Bps: Sequence[float]) -> float:
    """:func:`sim.network.makespan_s` of every group's flows started together, in order.

    When the groups are replicas on disjoint links (a DP ring per TP rank, a
    pipeline send per GPU pair, each over its own NICs) every group evolves
    exactly as the first would alone: the same start times, byte counts and
    capacities, so the same max-min rates (progressive filling freezes each
    group's bottleneck at the same share) and the same end times, hence the
    same event instants and the same floating-point operations on every flow.
    The first group alone then gives the makespan of all, bit for bit. Groups
    are replicas when their flows match after renaming links in order of first
    use (same starts, bytes, link capacities, and which flows share a link)
    and no finite-capacity link is used by two groups; otherwise all flows run
    together.
    """
    if len(groups) > 1 and _are_disjoint_replicas(groups, capacity_Bps):
        return makespan_s(groups[0], capacity_Bps)
    return makespan_s([flow for group in groups for flow in group], capacity_Bps)


def _shape(group: Sequence[Flow], capacity_Bps: Sequence[float]) -> tuple:
    """A group's flows with links renamed 0, 1, ... in order of first use, with capacities:
    starts, bytes and link counts, the capacities of the links in order, and the renaming
    (None when no link is used twice, so the renaming is 0, 1, 2, ...)."""
    links = [x for _, path, _ in group for x in path]
    names: dict[int, int] = {}
    renamed = (None if len(set(links)) == len(links) else
               tuple([names.setdefault(x, len(names)) for x in links]))
    return (tuple([(start, nbytes, len(path)) for start, path, nbytes in group]),
            tuple([capacity_Bps[x] for x in links]), renamed)


def _are_disjoint_replicas(groups: Sequence[Sequence[Flow]],
                           capacity_Bps: Sequence[float]) -> bool:
    first = _shape(groups[0], capacity_Bps)
    used: set[int] = set()
    for group in groups:
        if _shape(group, capacity_Bps) != first:
            return False
        finite = {x for _, links, _ in group for x in links if capacity_Bps[x] < math.inf}
        if not used.isdisjoint(finite):
            return False
        used |= finite
    return True


class CollectiveTimer:
    """``timer(op, groups, nbytes)`` -> seconds for ``op`` run concurrently on all ``groups``.

    ``op == "send"``: ``groups`` are ``(src, dst)`` pairs each sending ``nbytes`` at
    once (the engine's point-to-point transfer: route latency, then a flow).
    Otherwise each group of two or more GPUs runs collective ``op`` with
    ``algo`` (unless the cluster overrides the algorithm for ``op``), and the
    time is the collective launch latency plus the makespan of all their plans.
    """

    def __init__(self, cluster: Cluster, algo: str = "auto") -> None:
        self.cluster = cluster
        self.algo = algo
        self._cache: dict[tuple, float] = {}
        self._profiles: dict[tuple[int, ...], GroupProfile] = {}
        """Group profiles of ``auto`` selection, by group (:func:`sim.engine.collective_plan`)."""
        self.simulations = 0
        """How many collectives needed the event engine (plans with dependent transfers)."""

    def __call__(self, op: str, groups: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        key = (op, groups, nbytes)
        cached = self._cache.get(key)
        if cached is None:
            # routes, plans and flows are many small long-lived objects: the cyclic
            # collector's scans of them would cost a fifth of the time (as in the engine)
            with gc_paused():
                cached = self._cache[key] = (self._send_time(groups, nbytes) if op == "send"
                                             else self._collective_time(op, groups, nbytes))
        return cached

    def _send_time(self, pairs: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        flows: list[list[Flow]] = []
        for src, dst in pairs:
            route = self.cluster.route(src, dst)
            flows.append([(route.latency_s, route.links, nbytes)])
        return replicas_makespan_s(flows, self.cluster.link_bandwidth_Bps)

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
        plans = [collective_plan(c, op, self.algo, g, nbytes, self._profiles) for g in live]
        if all(not step.deps for steps in plans for step in steps):
            flows = [[(step_latency_s(c, step), c.route(step.src, step.dst).links, step.nbytes)
                      for step in steps] for steps in plans]
            return c.collective_launch_s + replicas_makespan_s(flows, c.link_bandwidth_Bps)
        b = ProgramBuilder()
        for group in live:
            b.collective(group, {}, kind="dp", name=op, op=op, nbytes=nbytes, algo=self.algo)
        n = c.num_gpus
        program = Program(n, b.build(), (0.0,) * n, gpipe(1, 1))
        self.simulations += 1
        return simulate_program(program, c, lambda _op: 0.0).end_s
