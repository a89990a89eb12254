"""A built schedule indexed for the bounds, and its list schedule (the bounds' fast path).

:func:`build_plan` builds a schedule once per ``(schedule, p, m, v)`` and keeps what the
bounds of many layouts read: the memory walk of every rank
(:func:`workloads.memory.in_flight`) and, worked out when a step bound first needs them
(:attr:`Plan.timing`), the ops as indices in a dependency order, each op's rank, its
duration slot ``3·stage + kind`` and its producers. :func:`list_run` is the list schedule of
:func:`workloads.schedules.list_schedule` on these indices, for a table of slot
durations: the same end times (a property test checks it), without rebuilding the
schedule's dependencies for every layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from base.errors import ScheduleError
from workloads import memory
from workloads.registry import SCHEDULES
from workloads.schedules import (
    BACKWARD,
    FORWARD,
    WEIGHT_GRAD,
    Op,
    Schedule,
    producers_at,
    schedule_deps,
    unit_order,
    unit_times,
)

KINDS = (FORWARD, BACKWARD, WEIGHT_GRAD)
"""Op kinds in the order of their duration slots: slot ``3·stage + SLOT[kind]``."""
SLOT = {k: i for i, k in enumerate(KINDS)}
PLAN_CACHE_OPS = 1_000_000
"""Ops of the built schedules a :class:`Screener` keeps (about 120-250 bytes each; least
recently used are dropped beyond it). GPT-3 175B on 1,024 GPUs judges 251 distinct
schedules of 320,000 ops in all: kept whole, none is built twice (a cap of 64 schedules
built 787)."""


@dataclass(frozen=True)
class Plan:
    """A built schedule in the form the bounds use.

    What the memory walk reads (the ranks' stages and in-flight rows) is worked out when
    the plan is built; the ops as indices in dependency order, which only the step bound
    of a layout that fits reads, on first use (:attr:`timing`): most judged layouts do
    not fit, and their plans never need it."""

    name: str
    num_microbatches: int
    stage_rank: tuple[int, ...]
    split_backward: bool
    exact: bool
    """False with sequence chunks (activation shares per chunk are not modelled here)."""
    rank_stages: tuple[tuple[int, ...], ...]
    in_flight: tuple[np.ndarray, ...]
    """Per rank: the distinct (in-flight counts per local stage, op slot) rows of
    :func:`workloads.memory.in_flight`."""
    num_ops: int
    schedule: Schedule | None = field(repr=False, compare=False)
    """The built schedule (for :attr:`timing`); None in a plan without it
    (:func:`light_plan`), which builds it again when :attr:`timing` is first read."""
    seq_chunks: int = field(default=1, repr=False, compare=False)
    """What the schedule was built with (to build it again: :func:`light_plan`)."""

    @cached_property
    def timing(self) -> PlanTiming:
        """The ops as indices in dependency order (:func:`plan_timing`); ScheduleError if the
        schedule deadlocks."""
        sched = self.schedule
        if sched is None:  # a light plan: the same build as build_plan's
            p = len(self.rank_stages)
            sched = build_schedule(self.name, p, self.num_microbatches,
                                   len(self.stage_rank) // p, self.seq_chunks)
        return plan_timing(sched)


def light_plan(plan: Plan | str) -> tuple[Any, ...] | str:
    """``plan`` in a form cheap to pickle, for another worker's judging
    (:meth:`sim.search.bounds.Bounds.adopt_plans`): without its built schedule, and each
    rank's memory-walk rows in the narrowest float type that holds every value exactly
    (in-flight counts: small integers and halves). :func:`restore_plan` gives back the
    plan, field for field and array for array (same values, shape and ``float64``
    type); its schedule is built again from the plan's arguments if :attr:`Plan.timing`
    is read (a pure function of them: the same ops, so the same timing)."""
    if isinstance(plan, str):
        return plan
    rows = []
    with np.errstate(over="ignore"):  # a value too large becomes inf: not taken
        for a in plan.in_flight:
            for kind in (np.float16, np.float32):
                narrow = a.astype(kind)
                if np.array_equal(narrow.astype(a.dtype), a):
                    a = narrow
                    break
            rows.append(a)
    return (plan.name, plan.num_microbatches, plan.stage_rank, plan.split_backward,
            plan.exact, plan.rank_stages, tuple(rows), plan.num_ops, plan.seq_chunks)


def restore_plan(light: tuple[Any, ...] | str) -> Plan | str:
    """The plan :func:`light_plan` packed, without its schedule (None)."""
    if isinstance(light, str):
        return light
    name, m, stage_rank, split, exact, rank_stages, rows, num_ops, seq_chunks = light
    in_flight = tuple(np.ascontiguousarray(a, dtype=np.float64) for a in rows)
    return Plan(name, m, stage_rank, split, exact, rank_stages, in_flight, num_ops, None,
                seq_chunks)


@dataclass(frozen=True)
class PlanTiming:
    """A plan's ops as indices, in dependency order: what :func:`list_run` reads."""

    order: tuple[int, ...]
    """Op indices in the order of the unit-duration run the schedule keeps
    (:func:`workloads.schedules.unit_times`: the reference list schedule's placements, or
    for 16 ranks or more its time-step sweep's, by start and rank): every op follows its
    producers and its rank predecessors, which is all :func:`list_run` needs."""
    op_rank: tuple[int, ...]
    op_slot: tuple[int, ...]
    """``3·stage + kind`` (F, B, W): index of the op's duration in a table."""
    op_deps: tuple[tuple[int, ...], ...]
    last_op: tuple[int, ...]
    """Per rank: its last op in program order."""
    final_op: tuple[int, ...]
    """Per rank: its last weight-gradient op (last backward without split), whose stage's
    DP gradient collective ends the rank's step."""


def plan_size(plan: Plan | str) -> int:
    """Ops of a plan (1 for a refusal): what the plan cache counts."""
    return 1 if isinstance(plan, str) else max(1, plan.num_ops)


def build_schedule(name: str, p: int, m: int, v: int, seq_chunks: int) -> Schedule:
    """Schedule ``name`` for ``p`` ranks, ``m`` micro-batches and ``v`` chunks per rank; a
    schedule that cuts micro-batches into sequence chunks
    (:attr:`workloads.registry.ScheduleKind.seq_chunks`) gets ``seq_chunks`` of them. The
    builder's errors propagate."""
    return SCHEDULES[name](p, m, v, seq_chunks)


def build_plan(name: str, p: int, m: int, v: int, w: float, seq_chunks: int) -> Plan:
    """Build the schedule and walk each rank's memory; ScheduleError if the builder refuses
    (a schedule that deadlocks raises when its :attr:`Plan.timing` is first read)."""
    sched = build_schedule(name, p, m, v, seq_chunks)
    if sched.chunks_per_rank != v:
        raise ScheduleError(f"schedule {name!r} has {sched.chunks_per_rank} chunks per rank, "
                            f"not vpp={v}")
    rank_stages = tuple(tuple(s for s, owner in enumerate(sched.stage_rank) if owner == r)
                        for r in range(sched.num_ranks))
    in_flight = tuple(memory.in_flight(ops, rank_stages[r], sched.split_backward, w)
                      for r, ops in enumerate(sched.rank_ops))
    return Plan(name, m, sched.stage_rank, sched.split_backward, sched.seq_chunks == 1,
                rank_stages, in_flight, sum(len(ops) for ops in sched.rank_ops), sched,
                seq_chunks)


def plan_timing(sched: Schedule) -> PlanTiming:
    """Index the ops of ``sched`` for :func:`list_run`; ScheduleError if it deadlocks."""
    index: dict[Op, int] = {}
    flat: list[Op] = []
    op_rank: list[int] = []
    for r, ops in enumerate(sched.rank_ops):
        for op in ops:
            index[op] = len(flat)
            flat.append(op)
            op_rank.append(r)
    # the order of the unit-duration run (a topological order; ScheduleError if the
    # schedule deadlocks) and each op's producers,
    # from the symbolic run the schedule keeps (:func:`workloads.schedules.unit_times`)
    times = unit_times(sched)
    run = unit_order(sched)
    columns = None if run is None else producers_at(sched, np.arange(len(flat)))
    if run is None or columns is None:  # fused groups: op by op
        order = tuple(index[op] for op in times)
        deps = tuple(tuple(index[d] for d in schedule_deps(sched, op)) for op in flat)
    else:
        order = tuple(run[0].tolist())
        first, second, third = (c.tolist() for c in columns)  # present producers first
        deps = tuple(() if a < 0 else (a,) if b < 0 else (a, b) if c < 0 else (a, b, c)
                     for a, b, c in zip(first, second, third, strict=True))
    final_kind = WEIGHT_GRAD if sched.split_backward else BACKWARD
    last, final = [], []
    for ops in sched.rank_ops:
        last.append(index[ops[-1]] if ops else -1)
        finals = [index[op] for op in ops if op.kind == final_kind]
        final.append(finals[-1] if finals else -1)
    return PlanTiming(order, tuple(op_rank), tuple(3 * op.stage + SLOT[op.kind] for op in flat),
                      deps, tuple(last), tuple(final))


def list_run(plan: Plan, table: Sequence[float]) -> list[float]:
    """End time of every op when each op starts as soon as its rank is free and its producers
    are done, taking ``table[slot]`` seconds, and messages take no time (a list schedule).

    For a schedule without fused groups these are the end times of
    :func:`workloads.schedules.list_schedule` with ``duration(op) = table[slot]``, float for
    float (a property test checks it on random schedules and tables); it is the fast path
    for the bounds, which run it on one built plan for many layouts' tables. A fused
    group (DualPipe-V) starts here, as there, once every member's outside producers are
    done (:func:`workloads.schedules.schedule_deps`), but each member's output counts as
    done at the member's end, not the group's, so every op ends no later than there: a
    bound stays a bound."""
    timing = plan.timing
    end = [0.0] * len(timing.op_rank)
    free = [0.0] * len(plan.rank_stages)
    rank, slot, deps = timing.op_rank, timing.op_slot, timing.op_deps
    for i in timing.order:
        r = rank[i]
        t = free[r]
        for j in deps[i]:
            if end[j] > t:
                t = end[j]
        t += table[slot[i]]
        end[i] = free[r] = t
    return end
