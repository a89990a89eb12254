"""Pass 5, the optimizer step: on every GPU, after its gradient collectives, the
optimizer over the stages of its pipeline rank; under ZeRO 1 and 2, then the
all-gather of the updated parameters over the DP x CP group. ZeRO-3 gathers none here:
the next step's forward gathers them layer by layer (:mod:`.pieces`); nor does ZeRO-1/2
with ``overlap_param_gather``, whose gathers the step's first forward of each stage issues
(a step's program stands for every step: its gathers are the previous step's update).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workloads.lowering.dataparallel import DataParallel
from workloads.lowering.opcosts import CostModel, stages_of
from workloads.schedules import Schedule


def optimizer_step(dpar: DataParallel, schedule: Schedule, costs: CostModel,
                   zero_stage: int, waits: Mapping[int, Sequence[int]],
                   gathered_ahead: bool = False) -> None:
    """Emit the optimizer of each pipeline rank, each GPU's after ``waits[g]``, and the
    ZeRO-1/2 parameter all-gathers after it (none where ``gathered_ahead``: the first
    forwards gather them)."""
    b, placement, collapse = dpar.b, dpar.placement, dpar.collapse
    dp = dpar.dp
    expert_bytes = getattr(costs, "expert_grad_bytes", None)
    for r in range(placement.degree("pp")):
        mine = stages_of(schedule, r)
        seg = costs.optimizer_segment(mine)
        if seg is None:
            continue
        for t in range(dpar.lanes):
            fixed = None if collapse is None else collapse.on(placement.gpu(pp=r)).compute_s(seg)
            opt = {g: b.compute(g, "opt", "optimizer", tuple(waits[g]), flops=seg.flops,
                                hbm_bytes=seg.hbm_bytes, elementwise_bytes=seg.elementwise_bytes,
                                duration_s=fixed)
                   for g in dpar.lane_gpus(r, t)}
            if zero_stage in (1, 2) and dp > 1 and not gathered_ahead:
                nbytes = sum(costs.grad_bytes(s) for s in mine)
                dpar.collective(r, t, {g: (i,) for g, i in opt.items()}, "param all_gather",
                                "all_gather", nbytes)
                nbytes = sum(expert_bytes(s) for s in mine) if expert_bytes is not None else 0.0
                if nbytes > 0 and dpar.expert_replicas > 1:
                    dpar.expert_collective(r, t, {g: (i,) for g, i in opt.items()},
                                           "expert param all_gather", "all_gather", nbytes)
