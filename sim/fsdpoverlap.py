"""DP collectives slow the compute they overlap: ZeRO-3 (FSDP), the per-micro-batch
reduce-scatters of a ZeRO-2 that reduces every micro-batch (FSDP's, DeepSpeed's), and
Megatron's bucketed gradient reductions (``overlap_grad_reduce``) and distributed-optimizer
parameter gathers (``overlap_param_gather``), by the one rule of :mod:`sim.contention`.

FSDP all-gathers each layer's parameters before its forward and backward (prefetched, on a
communication stream, while the previous layer computes) and reduce-scatters its gradients
after its backward (while the next layer's backward computes): under ZeRO-3 a collective
runs beside almost every kernel of the step. NCCL's kernels hold SMs (one CTA per channel)
and HBM bandwidth while they run, so the compute beside them runs slower than alone; the
engine overlaps the two streams for free, so the loss is added here, per layer:

    forward:  s · min(c_ag, g_fwd)          backward:  s · min(c_ag + c_rs, g_bwd)

with ``c`` each collective timed alone on pipeline rank 0's DP groups (every replica's at
once, as the collapsed lowering times it), ``g`` the layer's compute from the device model
the simulation runs with, and ``s`` the measured average slowdown of compute while a
collective overlaps it (:func:`sim.contention.share`, ``sim/data/contention.toml``, with its
source): the overlapped compute lasts about as long as the shorter of the two. It grows with
what the collectives cost against the compute: on H100 (3.2x the A100's BF16 peak, 1.5x its
NVLink) and across servers more than within one. A ZeRO-2 that reduces every micro-batch
gathers nothing during the step; its backward loses ``s · min(c_rs, g_bwd)`` a layer.

Megatron-core's DDP (``overlap_grad_reduce``) reduces the gradients bucket by bucket during
the step's last backward of each stage cut into buckets (stage 0 alone under
``grad_buckets_stage0_only``): each layer of that backward loses ``s · min(c_red, g_bwd)``,
``c_red`` the layer's gradients reduced alone (all-reduce, or reduce-scatter under the
distributed optimizer); with ``overlap_param_gather`` the step's first forward of stage 0
gathers layer by layer, each layer losing ``s · min(c_ag, g_fwd)``
(:attr:`~workloads.transformer.TransformerCosts.dp_overlap_s`). A stage reduced or gathered
as one bucket waits for it and overlaps nothing of its own.

Not modelled: the first layer's embedding in its gather, the head's gather, MoE experts' own
collectives, ZeRO-1/2 step-end collectives (they overlap little compute), the per-layer
timing of a collective that runs as part of a larger bucket. The search's screening and
``layers_per_stage: auto`` do not add it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from base.replaced import replaced
from sim.contention import charge, share
from workloads.costs import ComputeSeg
from workloads.lowering.grads import grad_op
from workloads.lowering.groups import dp_groups
from workloads.transformer import TransformerCosts

if TYPE_CHECKING:
    from sim.experiment import Experiment

def with_contention(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
                    collective_s: Callable[[str, float], float]) -> TransformerCosts:
    """``costs`` with :attr:`~TransformerCosts.zero3_overlap_s` set (ZeRO-3 sharding over
    more than one GPU, or a ZeRO-2 that reduces every micro-batch), or with
    :attr:`~TransformerCosts.dp_overlap_s` (Megatron's ``overlap_grad_reduce`` /
    ``overlap_param_gather``); unchanged otherwise (module doc). ``collective_s(op,
    nbytes)`` times a DP collective alone."""
    per_microbatch = costs.reduces_every_microbatch
    zero3 = costs.zero_stage == 3 and costs.dp * costs.cp > 1
    bucketed = (costs.overlap_grad_reduce and costs.zero_stage != 3 and not per_microbatch
                and costs.dp * costs.cp > 1)
    if not (per_microbatch or zero3 or bucketed):
        return costs
    forward, backward, gather_bytes, reduce_bytes = costs.zero3_layer_work()

    def work_s(segs: list) -> float:
        return sum(compute_s(seg) for seg in segs if isinstance(seg, ComputeSeg))

    if bucketed:  # Megatron: the last backward's buckets, the first forward's gathers
        red = collective_s(grad_op(costs.zero_stage), reduce_bytes)
        fwd = (charge("param_gather", collective_s("all_gather", gather_bytes),
                      work_s(forward)) if costs.overlap_param_gather else 0.0)
        return replaced(costs, dp_overlap_s=(fwd, charge("grad_bucket", red, work_s(backward))))
    rs = collective_s("reduce_scatter", reduce_bytes)
    if per_microbatch:  # ZeRO-2: no gathers, the backward's reduce-scatter
        return replaced(costs, zero3_overlap_s=(
            0.0, charge("microbatch_reduce_scatter", rs, work_s(backward))))
    ag = collective_s("all_gather", gather_bytes)
    return replaced(costs, zero3_overlap_s=(
        charge("zero3_all_gather", ag, work_s(forward)),
        share("zero3_reduce_scatter") * min(ag + rs, work_s(backward))))


def lowering_costs(exp: Experiment, costs: Any, compute_s: Callable[[ComputeSeg], float],
                   timer: Callable[[str, tuple[tuple[int, ...], ...], float], float]) -> Any:
    """``costs`` with the ZeRO-3 contention of :func:`with_contention` (unchanged for other
    cost models), the collectives timed by ``timer`` (a
    :class:`~sim.commtime.CollectiveTimer`) on pipeline rank 0's DP groups."""
    if not isinstance(costs, TransformerCosts):
        return costs
    groups = dp_groups(exp.placement, 0)
    return with_contention(costs, compute_s, lambda op, nbytes: timer(op, groups, nbytes))
