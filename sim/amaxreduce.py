"""FP8 delayed scaling's amax all-reduce (``training.fp8_amax_reduction``).

Under Transformer Engine's delayed scaling every FP8 module records the amax of each tensor
it casts; at the exit of an ``fp8_autocast`` region (``FP8GlobalStateManager.
fp8_autocast_exit``) the region's forward amaxes are concatenated from the global buffer and
all-reduced (MAX) over the region's ``fp8_group``, and the backward's after the backward of
the region's first module (``reduce_and_update_bwd_fp8_tensors``), each followed by the scale
update (``reduce_and_update_fp8_tensors``, transformer_engine/pytorch/fp8.py from v1.6 to
v2.8). From v1.6 (NVIDIA/TransformerEngine 73f8d90, "cuda graph support", #575) the
all-reduce is ``torch.distributed.all_reduce(..., async_op=False)`` on the group, every
time: the compute stream waits for it, and ``NVTE_ASYNC_AMAX_REDUCTION`` /
``NVTE_DP_AMAX_REDUCE_INTERVAL`` no longer exist. Before 1.6 those variables made it
asynchronous (waited on one region later) and over the TP group only: not charged
(``none``); with their defaults it was synchronous over the whole group (TE 0.8, MLPerf
Training v3.0).

Megatron-core wraps each model chunk's ``TransformerBlock.forward`` in one region with
``fp8_group = parallel_state.get_amax_reduction_group(with_context_parallel=True)``: a
pipeline stage's TP x DP x CP ranks (``tp-dp-cp``; core_r0.5.0-r0.7.0, and core_r0.9.0 on
unless ``tp_only_amax_red``) or its TP x CP ranks (``tp-cp``: core_r0.8.0, or
``tp_only_amax_red``). So one blocking all-reduce a chunk's forward and one its backward,
each micro-batch; the amaxes are a few float32 a GEMM (latency-bound), timed here by the
simulator's own collective timer on every group of pipeline rank 0 at once and emitted with
that fixed time at the op's end (:meth:`workloads.stage_ops.StageOps._amax_reduce`). Not
modelled: the scale-update kernels after it (launch-bound, no sourced floor), a recomputed
forward's region (full recomputation), and the amax all-reduces of per-tensor current
scaling (``fp8-current``: per cast over the TP group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from base.replaced import replaced
from workloads.transformer import TransformerCosts

if TYPE_CHECKING:
    from sim.experiment import Experiment

Timer = Callable[[str, tuple[tuple[int, ...], ...], float], float]


def reduction(exp: Experiment) -> str:
    """The run's amax reduction: ``training.fp8_amax_reduction``, else its framework's
    (:attr:`workloads.frameworks.FrameworkProfile.fp8_amax_reduction`); ``none`` outside
    delayed-scaling FP8."""
    t = exp.config.training
    if t.precision != "fp8":
        return "none"
    return t.fp8_amax_reduction or exp.framework.fp8_amax_reduction


def amax_groups(exp: Experiment, kind: str) -> tuple[tuple[int, ...], ...]:
    """Every amax reduction group of pipeline rank 0: its TP x DP x CP ranks as one group
    (``tp-dp-cp``), or one TP x CP group a DP replica (``tp-cp``)."""
    p = exp.placement
    tp, cp, dp = p.degree("tp"), p.degree("cp"), p.degree("dp")
    replicas = [(d,) for d in range(dp)] if kind == "tp-cp" else [tuple(range(dp))]
    return tuple(tuple(p.gpu(tp=t, cp=c, dp=d) for d in ds for c in range(cp)
                       for t in range(tp)) for ds in replicas)


def lowering_costs(exp: Experiment, costs: Any, timer: Timer) -> Any:
    """``costs`` with :attr:`~TransformerCosts.fp8_amax_reduce_s` set (unchanged unless the
    run's :func:`reduction` blocks over a group of two or more GPUs), each all-reduce timed by
    ``timer`` (a :class:`~sim.commtime.CollectiveTimer`) on :func:`amax_groups`."""
    kind = reduction(exp)
    if not isinstance(costs, TransformerCosts) or kind == "none" or costs.fp8_current_scaling:
        return costs
    groups = amax_groups(exp, kind)
    if len(groups[0]) < 2:
        return costs
    times = []
    for stage in range(len(costs.stage_layers)):
        layers = costs.stage_layers[stage]
        times.append(tuple(timer("all_reduce", groups, 4.0 * n * 4 * layers) for n in (3, 2)))
    return replaced(costs, fp8_amax_reduce_s=tuple(times))
