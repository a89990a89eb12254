"""What one pipeline op costs as lowering reads it: its segments, the memory it
allocates and frees, its pipeline message; the cost model's interface."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from workloads.costs import ComputeSeg, Segment
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op, Schedule


class CostModel(Protocol):
    """What lowering needs to know about a workload (see :mod:`workloads.costs`)."""

    w_retained_fraction: float

    def op_segments(self, op: Op, split_backward: bool,
                    markers: bool = False) -> tuple[Segment, ...]: ...
    def activation_bytes_per_mb(self, stage: int) -> float: ...
    def p2p_bytes(self) -> float: ...
    def grad_bytes(self, stage: int) -> float: ...
    def static_bytes(self, stages: tuple[int, ...]) -> float: ...
    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None: ...


def op_facts(costs: CostModel, generic: Op, split: bool, transient: Callable | None
             ) -> tuple[tuple[Segment, ...], int, float, float]:
    """An op's segments, how many of them compute, and the bytes it allocates at its start
    and frees at its end; the same for every micro-batch (``generic`` has ``mb`` 0)."""
    segs = costs.op_segments(generic, split)
    act = stash_bytes(costs, generic)
    alloc = act if generic.kind == FORWARD else 0.0
    if generic.kind == BACKWARD:
        free = act * (1 - costs.w_retained_fraction) if split else act
    elif generic.kind == WEIGHT_GRAD:
        free = act * costs.w_retained_fraction
    else:
        free = 0.0
    # working memory held only while the op runs (recomputation, gradient buffers)
    if transient is not None:
        extra = transient(generic)
        alloc, free = alloc + extra, free + extra
    return segs, sum(isinstance(x, ComputeSeg) for x in segs), alloc, free


def op_p2p_bytes(costs: CostModel, op: Op, whole: float) -> float:
    """Pipeline message of ``op``: ``whole`` (the cost model's ``p2p_bytes``), or for a
    Seq1F1B sequence chunk (``op.seq >= 0``) the cost model's ``seq_p2p_bytes`` (the
    chunk's tokens) where it has one."""
    per_chunk = getattr(costs, "seq_p2p_bytes", None) if op.seq >= 0 else None
    return whole if per_chunk is None else float(per_chunk(op))


def stash_bytes(costs: CostModel, op: Op) -> float:
    """Activation bytes ``op``'s forward stashes and its backward (and W) frees.

    A Seq1F1B sequence chunk (``op.seq >= 0``) stashes its share of the
    micro-batch's activations, given by the cost model's ``seq_chunk_share``.
    """
    whole = costs.activation_bytes_per_mb(op.stage)
    if op.seq < 0:
        return whole
    share = getattr(costs, "seq_chunk_share", None)
    if share is None:
        raise ValueError(f"op {op} is a sequence chunk but {type(costs).__name__} has none")
    return whole * share(op)


def stages_of(schedule: Schedule, rank: int) -> tuple[int, ...]:
    """The stages pipeline rank ``rank`` holds, in stage order."""
    return tuple(s for s, r in enumerate(schedule.stage_rank) if r == rank)
