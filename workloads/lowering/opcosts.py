"""What one pipeline op costs as lowering reads it: its segments, the memory it
allocates and frees, its pipeline message; the cost model's interface."""

from __future__ import annotations

from typing import Protocol

from workloads.costs import ComputeSeg, Segment
from workloads.memory import op_alloc_free
from workloads.schedules import Op, Schedule


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


def op_facts(costs: CostModel, generic: Op, split: bool
             ) -> tuple[tuple[Segment, ...], int, float, float]:
    """An op's segments, how many of them compute, and the bytes it allocates at its start
    and frees at its end (:func:`workloads.memory.op_alloc_free`); the same for every
    micro-batch (``generic`` has ``mb`` 0). Worked out once per ``(generic, split)`` and
    kept on the cost model, as its op segments are (a cost model is frozen; an interned
    one, :func:`workloads.transformer.interned`, serves the next run with equal costs)."""
    memo = costs.__dict__.setdefault("_memo_op_facts", {})
    found = memo.get((generic, split))
    if found is None:
        segs = costs.op_segments(generic, split)
        alloc, free = op_alloc_free(costs, generic, split)
        found = memo[(generic, split)] = (segs, sum(isinstance(x, ComputeSeg) for x in segs),
                                          alloc, free)
    return found


def op_work_facts(costs: CostModel, generic: Op, split: bool
                  ) -> tuple[tuple[Segment, ...], int, float, float]:
    """:func:`op_facts` with the op's layers unnamed where the cost model has ``op_work``
    (:meth:`workloads.stage_ops.StageOps.op_work`: the same segments, field for field, but
    their labels, built from one layer's segments per cost model instead of one per layer;
    ``tests/test_search_op_work.py``), else :func:`op_facts` itself. What the collapsed
    fast path folds (:func:`workloads.lowering.columnar.lower_collapsed`): a fold reads no
    label but its runs' (:class:`workloads.lowering.collapse.CommRun`), which the program's
    instruction objects name, so those are folded from :func:`op_facts`' named segments
    when they are built. Kept on the cost model like :func:`op_facts`."""
    work = getattr(costs, "op_work", None)
    if work is None:
        return op_facts(costs, generic, split)
    memo = costs.__dict__.setdefault("_memo_op_facts", {})
    key = ("work", generic, split)
    found = memo.get(key)
    if found is None:
        segs = work(generic, split)
        alloc, free = op_alloc_free(costs, generic, split)
        found = memo[key] = (segs, sum(isinstance(x, ComputeSeg) for x in segs), alloc, free)
    return found


def op_p2p_bytes(costs: CostModel, op: Op, whole: float) -> float:
    """Pipeline message of ``op``: ``whole`` (the cost model's ``p2p_bytes``), or for a
    Seq1F1B sequence chunk (``op.seq >= 0``) the cost model's ``seq_p2p_bytes`` (the
    chunk's tokens) where it has one."""
    per_chunk = getattr(costs, "seq_p2p_bytes", None) if op.seq >= 0 else None
    return whole if per_chunk is None else float(per_chunk(op))


def stages_of(schedule: Schedule, rank: int) -> tuple[int, ...]:
    """The stages pipeline rank ``rank`` holds, in stage order."""
    return tuple(s for s, r in enumerate(schedule.stage_rank) if r == rank)
