"""ZeRO-3 (FSDP) collectives, and the per-micro-batch reduce-scatters of a ZeRO-2 that
reduces every micro-batch (FSDP's, DeepSpeed's), slow the compute they overlap.

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
collective overlaps it (``sim/data/fsdp_overlap.toml``, with its source): the overlapped
compute lasts about as long as the shorter of the two. It grows with what the collectives
cost against the compute: on H100 (3.2x the A100's BF16 peak, 1.5x its NVLink) and across
servers more than within one. Not modelled: the first layer's embedding in its gather, the
head's gather, MoE experts' own collectives, ZeRO-1/2 step-end collectives (they overlap
little compute). A ZeRO-2 that reduces every micro-batch gathers nothing during the step; its
backward loses ``s · min(c_rs, g_bwd)`` a layer. The search's screening and
``layers_per_stage: auto`` do not add it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.costs import ComputeSeg
from workloads.lowering.groups import dp_groups
from workloads.transformer import TransformerCosts

if TYPE_CHECKING:
    from sim.experiment import Experiment

DATA_FILE = Path(__file__).parent / "data" / "fsdp_overlap.toml"
"""The measured slowdown of compute beside a collective, with its source."""


@cache
def compute_slowdown() -> float:
    """Fractional slowdown of compute while a collective overlaps it (``DATA_FILE``)."""
    with DATA_FILE.open("rb") as fh:
        return float(tomllib.load(fh)["compute_slowdown"])


def with_contention(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
                    collective_s: Callable[[str, float], float]) -> TransformerCosts:
    """``costs`` with :attr:`~TransformerCosts.zero3_overlap_s` set (module doc); unchanged
    unless ZeRO-3 shards over more than one GPU. ``collective_s(op, nbytes)`` times a DP
    collective alone."""
    per_microbatch = costs.reduces_every_microbatch
    if not per_microbatch and (costs.zero_stage != 3 or costs.dp * costs.cp == 1):
        return costs
    forward, backward, gather_bytes, reduce_bytes = costs.zero3_layer_work()

    def work_s(segs: list) -> float:
        return sum(compute_s(seg) for seg in segs if isinstance(seg, ComputeSeg))

    s = compute_slowdown()
    rs = collective_s("reduce_scatter", reduce_bytes)
    if per_microbatch:  # ZeRO-2: no gathers, the backward's reduce-scatter
        return replace(costs, zero3_overlap_s=(0.0, s * min(rs, work_s(backward))))
    ag = collective_s("all_gather", gather_bytes)
    return replace(costs, zero3_overlap_s=(s * min(ag, work_s(forward)),
                                           s * min(ag + rs, work_s(backward))))


def lowering_costs(exp: Experiment, costs: Any, compute_s: Callable[[ComputeSeg], float],
                   timer: Callable[[str, tuple[tuple[int, ...], ...], float], float]) -> Any:
    """``costs`` with the ZeRO-3 contention of :func:`with_contention` (unchanged for other
    cost models), the collectives timed by ``timer`` (a
    :class:`~sim.commtime.CollectiveTimer`) on pipeline rank 0's DP groups."""
    if not isinstance(costs, TransformerCosts):
        return costs
    groups = dp_groups(exp.placement, 0)
    return with_contention(costs, compute_s, lambda op, nbytes: timer(op, groups, nbytes))
