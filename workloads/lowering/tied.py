"""Pass 4a, tied embedding gradients: when the input embedding and the output layer share
one matrix and the pipeline puts them on different ranks (the first stage's embedding, the
last stage's copy for the head), after both stages' last backward the two copies' gradients
are all-reduced over the first and last pipeline rank of every (tp, cp, dp) lane, before
those stages' DP gradient collectives (DeepSpeed's ``ReduceTiedGrads`` instruction,
deepspeed/runtime/pipe/engine.py ``_exec_reduce_tied_grads``). Only where the cost model
gives the gradient bytes (``tied_grad_bytes``, :mod:`workloads.frameworks`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from topologies.placement import Placement
from workloads.lowering.collapse import Collapse
from workloads.lowering.groups import replica_coords
from workloads.lowering.opcosts import CostModel
from workloads.program import ProgramBuilder
from workloads.schedules import Op, Schedule


def reduce_tied_gradients(b: ProgramBuilder, schedule: Schedule, costs: CostModel,
                          placement: Placement, collapse: Collapse | None,
                          last: MutableMapping[tuple[int, int], int],
                          final_op: dict[int, Op], index: dict[Op, int],
                          dp_last: Mapping[int, int]) -> None:
    """Emit the all-reduce of the tied embedding's gradients after the final ops of the
    first and last stage, and make it what completes them in ``last`` (so the DP
    collectives and the optimizer of those stages wait for it). Nothing when the cost model
    has no such bytes or one rank holds both stages. Collapsed, each rank's representative
    runs its half, timed with every lane's pair at once, after both halves' inputs and the
    last DP collective issued on either representative during the ops (``dp_last``,
    overlapped gradient buckets): a whole collective starts only once every member's DP
    stream is free, which a half on one GPU sees of its own stream alone."""
    nbytes = float(getattr(costs, "tied_grad_bytes", lambda: 0.0)())
    first, end = 0, schedule.num_stages - 1
    r0, r1 = schedule.stage_rank[first], schedule.stage_rank[end]
    if nbytes <= 0 or r0 == r1:
        return
    k0, k1 = index[final_op[first]], index[final_op[end]]
    pairs = tuple((placement.gpu(tp=t, cp=c, dp=d, pp=r0), placement.gpu(tp=t, cp=c, dp=d, pp=r1))
                  for t in range(placement.degree("tp")) for c, d in replica_coords(placement))
    name = "tied embedding grads all_reduce"
    if collapse is None:
        for g0, g1 in pairs:
            ids = b.collective((g0, g1), {g0: (last[(k0, g0)],), g1: (last[(k1, g1)],)},
                               kind="dp", name=name, op="all_reduce", nbytes=nbytes)
            last[(k0, g0)], last[(k1, g1)] = ids[g0], ids[g1]
        return
    rep0, rep1 = placement.gpu(pp=r0), placement.gpu(pp=r1)
    both = (last[(k0, rep0)], last[(k1, rep1)],
            *(dp_last[g] for g in (rep0, rep1) if g in dp_last))
    duration = collapse.collective_s("all_reduce", pairs, nbytes)
    for gpu, k in ((rep0, k0), (rep1, k1)):
        ids = b.collective((gpu,), {gpu: both}, kind="dp", name=name, op="all_reduce",
                           nbytes=nbytes, duration_s=duration)
        last[(k, gpu)] = ids[gpu]
