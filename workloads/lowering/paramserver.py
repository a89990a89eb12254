"""Pass 4 under ``parallel.dp_mode: parameter_server``: gradients pushed to and
parameters pulled from K server ranks, as point-to-point flows (Li et al. 2014, OSDI,
"Scaling distributed machine learning with the parameter server"; Zou et al. 2017).

Every stage's parameters are sharded evenly over the K servers. After the final op of
a stage on a worker (each TP lane of each DP replica is a worker of its shard of the
model), the worker pushes 1/K of the stage's gradient bytes to each server; once a
server holds the pushes of a shard from every worker of the lane's DP group, it applies
the update (its CPU time is not modelled) and sends the shard's new parameters back to
each of them. A worker's step ends with a zero-time ``opt`` op, "parameters in place",
after all its pulls. The servers are ranks of the cluster after the layout's GPUs, so
their NICs sit on the topology like any rank's: a server's link carries K-th of every
worker's pushes in and pulls out, which is where a parameter server saturates (all W
workers share it, while a ring all-reduce moves 2(W-1)/W of the gradients per GPU link
whatever W).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workloads.lowering.dataparallel import DataParallel
from workloads.lowering.opcosts import CostModel
from workloads.schedules import Op, Schedule


def push_pull(dpar: DataParallel, schedule: Schedule, costs: CostModel,
              last: Mapping[tuple[int, int], int], final_op: Mapping[int, Op],
              index: Mapping[Op, int], servers: Sequence[int]) -> None:
    """Emit each stage's pushes and pulls (in the order stages finish) and every worker's
    zero-time ``opt`` after its pulls (module doc). ``last[(index[op], g)]`` is the
    instruction that completes ``op`` on GPU ``g``."""
    b = dpar.b
    k = len(servers)
    pulls: dict[int, list[int]] = {g: [] for g in range(dpar.placement.num_gpus)}
    for s in sorted(final_op, key=lambda s: index[final_op[s]]):
        r = schedule.stage_rank[s]
        shard = costs.grad_bytes(s) / k
        for t in range(dpar.lanes):
            workers = dpar.lane_gpus(r, t)
            if shard <= 0:
                for g in workers:
                    pulls[g].append(last[(index[final_op[s]], g)])
                continue
            pushed = {srv: [b.send(g, srv, shard, "dp", f"stage{s} push shard{j}",
                                   (last[(index[final_op[s]], g)],), stage=s)
                            for g in workers]
                      for j, srv in enumerate(servers)}
            for j, srv in enumerate(servers):
                for g in workers:
                    pulls[g].append(b.send(srv, g, shard, "dp", f"stage{s} pull shard{j}",
                                           tuple(pushed[srv]), stage=s))
    for g, deps in pulls.items():
        b.compute(g, "opt", "parameters pulled", tuple(deps), duration_s=0.0)
