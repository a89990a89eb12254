"""A collective plan's transfers as the engine runs them (:mod:`sim.engine`): resolved once per
run (:class:`CompiledPlan`), and each execution starting its transfers as their dependencies
arrive (:class:`PlanRun`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from sim.collectives import Transfer
from sim.selection import step_latency_s
from topologies.cluster import Cluster, Endpoint, Route

if TYPE_CHECKING:
    from sim.engine import _Run


class CompiledPlan:
    """A plan's transfers resolved once per run: routes, start delays and dependency lists.

    ``route``: the run's routes (link indices into the run's cluster); ``epoch``: the
    run's routing epoch they were taken in. A link failure in the middle of the run starts
    a new epoch, and a transfer started after it takes its route again (:meth:`links_of`;
    its start delay, the plan's latency, is kept). ``now`` and ``later``: the roots (the
    transfers without dependencies) as :meth:`PlanRun._start` starts them, worked out
    once: those without delay in order, then per delay (in order of first occurrence) its
    roots in order."""

    __slots__ = ("deps", "dependents", "ends", "epochs", "flat", "latency", "later", "links",
                 "nbytes", "now", "roots", "routes")

    def __init__(self, cluster: Cluster, steps: tuple[Transfer, ...],
                 route: Callable[[Endpoint, Endpoint], Route] | None = None,
                 epoch: int = 0) -> None:
        route = route or cluster.route
        self.ends = [(s.src, s.dst) for s in steps]
        self.epochs = [epoch] * len(steps)
        self.deps = [len(s.deps) for s in steps]
        self.dependents: list[list[int]] = [[] for _ in steps]
        for i, s in enumerate(steps):
            for d in s.deps:
                self.dependents[d].append(i)
        self.latency = [step_latency_s(cluster, s) for s in steps]
        self.links = [route(s.src, s.dst).links for s in steps]
        self.nbytes = [s.nbytes for s in steps]
        self.roots = [i for i, s in enumerate(steps) if not s.deps]
        self.now = [k for k in self.roots if not self.latency[k] > 0]
        later: dict[float, list[int]] = {}
        for k in self.roots:
            if self.latency[k] > 0:
                later.setdefault(self.latency[k], []).append(k)
        self.later = list(later.items())
        self.flat = (len(self.later) == 1 and not self.now and len(set(self.nbytes)) == 1
                     and self.nbytes[0] > 0 and all(self.links))
        """Whether every transfer starts together, after one delay, with no dependency and
        none depending on it, each of the same bytes over a route: the plan ends when the
        last of them arrives (:meth:`sim.engine._Run._bundle_start`)."""
        self.routes: tuple[tuple[int, ...], ...] | None = None
        """A flat plan's routes in the order its transfers start, once a bundle needed them."""

    def links_of(self, k: int, run: _Run) -> tuple[int, ...]:
        """Transfer ``k``'s links, taken again if links failed since they were taken."""
        if self.epochs[k] != run.epoch:
            self.links[k] = run.route(*self.ends[k]).links
            self.epochs[k] = run.epoch
        return self.links[k]


class PlanRun:
    """One execution of a compiled plan: transfers start as their dependencies arrive.

    A transfer waits its start delay (:func:`step_latency_s`), then moves its
    bytes as a flow. Transfers that become ready together with the same delay
    share one SimPy event (they would start at the same instant anyway).
    Arrivals are drained from a queue, so long zero-time chains do not recurse.
    ``done(arg)`` after the last arrival.
    """

    __slots__ = ("arg", "done", "draining", "left", "plan", "queue", "run", "waiting")

    def __init__(self, run: _Run, plan: CompiledPlan, done: Callable[[int], None],
                 arg: int) -> None:
        self.run = run
        self.plan = plan
        self.done = done
        self.arg = arg
        self.waiting: list[int] | None = None
        """Unarrived dependencies per transfer, copied from the plan at the first arrival
        that releases a dependent."""
        self.left = len(plan.deps)
        self.queue: deque[int] | None = None
        self.draining = False

    def begin(self) -> None:
        """Start the roots: those without delay now, the others one event per delay."""
        plan, run = self.plan, self.run
        for k in plan.now:
            self._flow(k)
        for lat, group in plan.later:
            run._after(lat, self._delayed, group)

    def _start(self, ready: list[int]) -> None:
        """Start transfers that just became ready: now if without delay, else grouped by delay."""
        latency = self.plan.latency
        later: dict[float, list[int]] = {}
        for k in ready:
            lat = latency[k]
            if lat > 0:
                group = later.get(lat)
                if group is None:
                    later[lat] = [k]
                else:
                    group.append(k)
            else:
                self._flow(k)
        for lat, group in later.items():
            self.run._after(lat, self._delayed, group)

    def _delayed(self, group: list[int]) -> None:
        """The start delay of transfers ``group`` has passed: each one's flow (:meth:`_flow`,
        inline: once per transfer)."""
        plan, run, arrive = self.plan, self.run, self.arrive
        links_of, nbytes_of, ends = plan.links, plan.nbytes, plan.ends
        start, flow_done, now = run.net.start, run.flow_done, run.now
        for k in group:
            links = links_of[k] if plan.epochs[k] == run.epoch else plan.links_of(k, run)
            nbytes = nbytes_of[k]
            if nbytes > 0 and links:  # _Run._flow, inline
                fid = run.flows
                run.flows = fid + 1
                flow_done[fid] = (arrive, k)
                if run.flow_ends is not None:
                    run.flow_ends[fid] = ends[k]
                start(now, fid, links, nbytes)
                if not run.refresh_pending:
                    run.refresh_pending = True
                    run._after(0, run._refresh)
            else:
                arrive(k)

    def _flow(self, k: int) -> None:
        plan, run = self.plan, self.run
        links = plan.links[k] if plan.epochs[k] == run.epoch else plan.links_of(k, run)
        nbytes = plan.nbytes[k]
        if nbytes > 0 and links:
            run._flow(links, nbytes, self.arrive, k, plan.ends[k])
        else:
            self.arrive(k)

    def arrive(self, i: int) -> None:
        """Transfer ``i`` has arrived: release its dependents; ``done(arg)`` after the last."""
        if not self.draining and not self.plan.dependents[i]:  # a leaf: nothing to release
            self.left -= 1
            if self.left == 0:
                self.done(self.arg)
            return
        queue = self.queue
        if queue is None:
            queue = self.queue = deque()
            self.waiting = list(self.plan.deps)
        queue.append(i)
        if self.draining:
            return
        self.draining = True
        waiting, dependents = self.waiting, self.plan.dependents
        assert waiting is not None
        while queue:
            j = queue.popleft()
            self.left -= 1
            ready = []
            for k in dependents[j]:
                waiting[k] -= 1
                if waiting[k] == 0:
                    ready.append(k)
            if ready:
                self._start(ready)
        self.draining = False
        if self.left == 0:
            self.done(self.arg)

