"""Screening and judging: the verdicts the bounds give a layout before any simulation."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from base.errors import ConfigError, ScheduleError
from sim.search.bounds import Bounds
from sim.search.layouts import Layout


@dataclass(frozen=True)
class Candidate:
    """A layout and what screening (and later judging) found out about it."""

    layout: Layout
    status: str
    """``ok`` (to simulate), ``memory`` (cannot fit), ``invalid`` (see ``reason``) or
    ``pruned`` (cannot reach the top K)."""
    reason: str = ""
    memory_bound_gib: float | None = None
    """Lower bound of the peak memory of the fullest GPU, GiB."""
    tokens_bound: float | None = None
    """Upper bound of the throughput, tokens/s."""



class Screener(Bounds):
    """Verdicts on layouts from their bounds (:class:`~sim.search.bounds.Bounds`).

    :meth:`screen` is cheap and schedule-free; :meth:`judge`, run when a layout's turn
    comes, builds its schedule for the exact memory walk and the list-schedule step
    bound.
    """

    # --------------------------------------------------------------- verdicts
    def screen(self, layout: Layout, reference: bool = False) -> Candidate:
        """Cheap check: the schedule-free memory bound and a loose throughput bound.

        On a uniform cluster without a ``balanced`` layer split the bounds are composed
        from terms cached per family of layouts (:meth:`~sim.search.bounds.Bounds.
        screen_terms`), float for float those of the reference path (``reference``:
        the cost model of each layout, :meth:`quick_memory_bound_gib` and
        :meth:`loose_step_bound_s`; a differential test checks they agree)."""
        if self.collapsed_only and self.mixed(layout):
            mixed = [r for r, t in enumerate(self.rank_types(layout)) if len(t) > 1]
            return Candidate(layout, "invalid", reason=(
                f"fidelity 'collapsed': pipeline ranks {mixed} mix GPU types (one GPU "
                "cannot stand for its rank); search with --fidelity auto or full"))
        if not reference and self.families:
            try:  # e.g. a framework's pipeline split that leaves a stage without a layer
                quick, step = self.screen_terms(layout)
            except ConfigError as exc:
                return Candidate(layout, "invalid", reason=str(exc))
            if step is None:
                return Candidate(layout, "memory", memory_bound_gib=quick)
            return Candidate(layout, "ok", memory_bound_gib=quick,
                             tokens_bound=self._tokens / step if step > 0 else math.inf)
        try:  # e.g. a framework's pipeline split that leaves a stage without a layer
            costs = self.ctx.costs_for(layout, layout.pp * layout.vpp)
        except ConfigError as exc:
            return Candidate(layout, "invalid", reason=str(exc))
        quick = self.quick_memory_bound_gib(costs, layout.pp, min(self.reserved_bytes(layout)))
        if not self._fits(quick):
            return Candidate(layout, "memory", memory_bound_gib=quick)
        step = self.loose_step_bound_s(layout, costs)
        return Candidate(layout, "ok", memory_bound_gib=quick,
                         tokens_bound=self._tokens / step if step > 0 else math.inf)

    def judge(self, candidate: Candidate, threshold: float = 0.0) -> Candidate:
        """Full check before simulating: the schedule is built and walked for the exact memory
        bound, then the list-schedule step bound gives ``tokens_bound``; a layout that cannot
        reach ``threshold`` (tokens/s, if > 0) comes back ``pruned``. Apart from that last
        comparison the verdict does not depend on ``threshold``, so a sweep may judge
        layouts before it knows their threshold. A schedule that deadlocks (a builder's
        bug) is found ``invalid`` only where the layout fits: its symbolic run is worked
        out for the step bound alone (:attr:`~sim.search.plan.Plan.timing`)."""
        layout = candidate.layout
        plan = self.plan(layout)
        if isinstance(plan, str):
            return replace(candidate, status="invalid", reason=plan)
        costs = self.ctx.costs_for(layout, layout.pp * layout.vpp)
        per_rank = self.memory_bound_gib(costs, plan, self.reserved_bytes(layout))
        gib = max(per_rank)
        if self._uniform:
            fits = self._fits(gib)
        else:  # every GPU within its own memory: each rank's smallest
            fits = all(self._fits(g, min(self._type_capacity_gib[t] for t in types))
                       for g, types in zip(per_rank, self.rank_types(layout), strict=True))
        if not fits:
            return replace(candidate, status="memory", memory_bound_gib=gib)
        try:  # the ops in dependency order, read by the step bound alone
            plan.timing  # noqa: B018 - worked out on first use
        except ScheduleError as exc:  # the schedule deadlocks
            return replace(candidate, status="invalid",
                           reason=f"schedule={layout.schedule!r}: {exc}")
        step = self.step_bound_s(layout, costs, plan)
        tokens = self._tokens / step if step > 0 else math.inf
        # the list-schedule bound and the loose one bound the same step: keep the tighter
        tokens = min(tokens, candidate.tokens_bound or math.inf)
        candidate = replace(candidate, memory_bound_gib=gib, tokens_bound=tokens)
        if threshold > 0 and tokens < threshold:
            return replace(candidate, status="pruned")
        return candidate
