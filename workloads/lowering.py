"""Lowering: schedule + cost model + placement -> per-rank :class:`~workloads.program.Program`.

A chain of pure passes over the schedule's ops, taken in a topological order
(the order of a unit-duration symbolic run, so every producer is lowered before
its consumers):

1. each pipeline op becomes its cost model's segments (compute kernels and TP
   collectives) on every GPU of its TP group;
2. a pipeline send follows each op whose consumer stage lives on another rank
   (activations forward, gradients backward); the consumer depends on it;
3. after the last backward of each stage, the DP gradient collective
   (all-reduce, or reduce-scatter under ZeRO >= 1);
4. the optimizer step, then (ZeRO >= 1) the all-gather of updated parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, Segment
from workloads.program import Program, ProgramBuilder
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op, Schedule, list_schedule, op_deps


class CostModel(Protocol):
    """What lowering needs to know about a workload (see :mod:`workloads.costs`)."""

    w_retained_fraction: float

    def op_segments(self, op: Op, split_backward: bool) -> tuple[Segment, ...]: ...
    def activation_bytes_per_mb(self, stage: int) -> float: ...
    def p2p_bytes(self) -> float: ...
    def grad_bytes(self, stage: int) -> float: ...
    def static_bytes(self, stages: tuple[int, ...]) -> float: ...
    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None: ...


def topological_ops(schedule: Schedule) -> list[Op]:
    """All ops in an order where every op comes after its producers and its rank predecessors."""
    times = list_schedule(schedule, lambda op: 1.0)
    rank_of = schedule.stage_rank
    return sorted(times, key=lambda op: (times[op][1], rank_of[op.stage], times[op][0]))


def _consumer_stage(op: Op, num_stages: int) -> int | None:
    if op.kind == FORWARD and op.stage + 1 < num_stages:
        return op.stage + 1
    if op.kind == BACKWARD and op.stage > 0:
        return op.stage - 1
    return None


def lower(
    schedule: Schedule, costs: CostModel, placement: Placement, zero_stage: int = 0
) -> Program:
    """Lower one training step to per-GPU instructions. Pure and deterministic."""
    pp, tp, dp = placement.degree("pp"), placement.degree("tp"), placement.degree("dp")
    if schedule.num_ranks != pp:
        raise ValueError(f"schedule has {schedule.num_ranks} ranks but the layout has pp={pp}")
    b = ProgramBuilder()
    S, split = schedule.num_stages, schedule.split_backward
    owner = schedule.stage_rank
    last: dict[tuple[Op, int], int] = {}
    sent: dict[tuple[Op, int], int] = {}
    final_op: dict[int, Op] = {}
    for ops in schedule.rank_ops:
        for op in ops:
            if op.kind == (WEIGHT_GRAD if split else BACKWARD):
                final_op[op.stage] = op
    order = topological_ops(schedule)

    def tp_gpus(r: int, d: int) -> list[int]:
        return [placement.gpu(tp=t, dp=d, pp=r) for t in range(tp)]

    for op in order:
        r = owner[op.stage]
        segs = costs.op_segments(op, split)
        act = costs.activation_bytes_per_mb(op.stage)
        alloc = act if op.kind == FORWARD else 0.0
        if op.kind == BACKWARD:
            free = act * (1 - costs.w_retained_fraction) if split else act
        elif op.kind == WEIGHT_GRAD:
            free = act * costs.w_retained_fraction
        else:
            free = 0.0
        n_compute = sum(isinstance(s, ComputeSeg) for s in segs)
        for d in range(dp):
            gpus = tp_gpus(r, d)
            prev: dict[int, tuple[int, ...]] = {}
            for g in gpus:
                deps = []
                for dep in op_deps(op, S, split):
                    deps.append(last[(dep, g)] if owner[dep.stage] == r else sent[(dep, g)])
                prev[g] = tuple(deps)
            seen_compute = 0
            for seg in segs:
                if isinstance(seg, CommSeg):
                    ids = b.collective(tuple(gpus), prev, kind=seg.kind, name=f"{op} {seg.label}",
                                       op=seg.op, nbytes=seg.nbytes, stage=op.stage, mb=op.mb)
                else:
                    seen_compute += 1
                    extra = {
                        "alloc_bytes": alloc if seen_compute == 1 else 0.0,
                        "free_bytes": free if seen_compute == n_compute else 0.0,
                    }
                    ids = {g: b.compute(g, op.kind, seg.label, prev[g], flops=seg.flops,
                                        hbm_bytes=seg.hbm_bytes, duration_s=seg.duration_s,
                                        stage=op.stage, mb=op.mb, **extra) for g in gpus}
                prev = {g: (ids[g],) for g in gpus}
            for g in gpus:
                last[(op, g)] = prev[g][0]
            consumer = _consumer_stage(op, S)
            if consumer is not None and owner[consumer] != r:
                what = "act" if op.kind == FORWARD else "grad"
                for t, g in enumerate(gpus):
                    dst = placement.gpu(tp=t, dp=d, pp=owner[consumer])
                    sent[(op, dst)] = b.send(g, dst, costs.p2p_bytes(), "pp", f"{op} {what}",
                                             (last[(op, g)],), stage=op.stage, mb=op.mb)

    _lower_step_end(b, schedule, costs, placement, zero_stage, last, final_op, order)
    gpu_names = tuple(
        "gpu{} pp{} dp{} tp{}".format(g, *(placement.coords(g)[k] for k in ("pp", "dp", "tp")))
        for g in range(placement.num_gpus)
    )
    static = tuple(
        costs.static_bytes(_stages_of(schedule, placement.coords(g)["pp"]))
        for g in range(placement.num_gpus)
    )
    return Program(placement.num_gpus, b.build(), static, schedule, gpu_names)


def _stages_of(schedule: Schedule, rank: int) -> tuple[int, ...]:
    return tuple(s for s, r in enumerate(schedule.stage_rank) if r == rank)


def _lower_step_end(
    b: ProgramBuilder,
    schedule: Schedule,
    costs: CostModel,
    placement: Placement,
    zero_stage: int,
    last: Mapping[tuple[Op, int], int],
    final_op: Mapping[int, Op],
    order: list[Op],
) -> None:
    """DP gradient collectives per stage (in the order stages finish), optimizer, ZeRO gather."""
    pp, tp, dp = placement.degree("pp"), placement.degree("tp"), placement.degree("dp")
    position = {op: i for i, op in enumerate(order)}
    stages = sorted(final_op, key=lambda s: position[final_op[s]])
    waits: dict[int, list[int]] = {g: [] for g in range(placement.num_gpus)}
    grad_op = "reduce_scatter" if zero_stage >= 1 else "all_reduce"
    for s in stages:
        r = schedule.stage_rank[s]
        for t in range(tp):
            group = tuple(placement.gpu(tp=t, dp=d, pp=r) for d in range(dp))
            deps = {g: (last[(final_op[s], g)],) for g in group}
            nbytes = costs.grad_bytes(s)
            if dp > 1 and nbytes > 0:
                ids = b.collective(group, deps, kind="dp", name=f"stage{s} grad {grad_op}",
                                   op=grad_op, nbytes=nbytes, stage=s)
                for g in group:
                    waits[g].append(ids[g])
            else:
                for g in group:
                    waits[g].extend(deps[g])
    for r in range(pp):
        mine = _stages_of(schedule, r)
        seg = costs.optimizer_segment(mine)
        if seg is None:
            continue
        for t in range(tp):
            group = tuple(placement.gpu(tp=t, dp=d, pp=r) for d in range(dp))
            opt = {g: b.compute(g, "opt", "optimizer", tuple(waits[g]), flops=seg.flops,
                                hbm_bytes=seg.hbm_bytes) for g in group}
            if zero_stage >= 1 and dp > 1:
                nbytes = sum(costs.grad_bytes(s) for s in mine)
                b.collective(group, {g: (opt[g],) for g in group}, kind="dp",
                             name="param all_gather", op="all_gather", nbytes=nbytes)
