"""Pass 4, DP/ZeRO gradients: after the final op of each stage (in the order stages
finish), its gradients' collective over the DP x CP group: an all-reduce, or a
reduce-scatter under ZeRO >= 1; MoE expert gradients over the replicas holding the
same experts. Stages whose gradients were reduced during their ops (buckets of
``overlap_grad_reduce``, ZeRO-3's per-layer reduce-scatters, :mod:`.pieces`) get none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping

from workloads.lowering.dataparallel import DataParallel
from workloads.lowering.opcosts import CostModel
from workloads.schedules import Op, Schedule


def grad_op(zero_stage: int) -> str:
    """The gradients' collective: reduce-scatter under ZeRO >= 1, else all-reduce."""
    return "reduce_scatter" if zero_stage >= 1 else "all_reduce"


def reduce_gradients(dpar: DataParallel, schedule: Schedule, costs: CostModel,
                     zero_stage: int, last: Mapping[tuple[int, int], int],
                     final_op: Mapping[int, Op], index: Mapping[Op, int],
                     reduced: Collection[int]) -> dict[int, list[int]]:
    """Emit each stage's gradient collectives; per GPU, what its optimizer step waits for
    (those collectives, or the final ops where there is none).

    ``last[(index[op], g)]`` is the instruction that completes ``op`` on GPU ``g``;
    ``reduced``: the stages whose gradients are reduced already.
    """
    dp = dpar.dp
    stages = sorted(final_op, key=lambda s: index[final_op[s]])
    # per GPU on first use (a collapsed step has a GPU per pipeline rank, of thousands)
    waits: dict[int, list[int]] = defaultdict(list)
    op = grad_op(zero_stage)
    expert_bytes = getattr(costs, "expert_grad_bytes", None)
    for s in stages:
        r = schedule.stage_rank[s]
        for t in range(dpar.lanes):
            deps = {g: (last[(index[final_op[s]], g)],) for g in dpar.lane_gpus(r, t)}
            nbytes = costs.grad_bytes(s)
            if dp > 1 and nbytes > 0 and s not in reduced:
                ids = dpar.collective(r, t, deps, f"stage{s} grad {op}", op, nbytes, s)
                for g, i in ids.items():
                    waits[g].append(i)
            else:
                for g, d in deps.items():
                    waits[g].extend(d)
            nbytes = expert_bytes(s) if expert_bytes is not None else 0.0
            if nbytes > 0 and dpar.expert_replicas > 1 and s not in reduced:
                ids = dpar.expert_collective(r, t, deps, f"stage{s} expert grad {op}", op,
                                             nbytes, s)
                for g, i in ids.items():
                    waits[g].append(i)
    return waits
