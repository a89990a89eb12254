"""Context parallelism's ring passes slow the attention blocks they overlap
(:mod:`sim.contention`'s rule).

In ring attention (Megatron-core / Transformer Engine's ``AttnFuncWithCPAndKVP2P``) block
``j`` of the attention core runs while the K/V block (in the backward with its dK/dV) for
block ``j + 1`` is sent and received beside it with NCCL's point-to-point kernels on a
communication stream: ``cp − 1`` passes, each beside one block. The engine overlaps them for
free; each costs the block beside it ``charge("cp_ring_pass", c, g)``, ``c`` a pass timed
alone on every ring pair of pipeline rank 0 at once (as the collapsed lowering times it),
``g`` a block from the device model the simulation runs with. The ``cp − 1`` charges are
emitted together after the ring as one fixed-time compute segment
(:attr:`~workloads.transformer.TransformerCosts.cp_overlap_s`). All-gather CP
(``cp_kv_all_gather``) exposes its gathers and has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from base.replaced import replaced
from sim.contention import charge
from workloads.costs import ComputeSeg, RingAttention
from workloads.lowering.groups import tp_groups
from workloads.transformer import TransformerCosts

if TYPE_CHECKING:
    from sim.experiment import Experiment


def ring_overlap_s(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
                   pass_s: Callable[[float], float]) -> tuple[float, float]:
    """What a layer's ring attention loses to its passes, forward and backward:
    ``(cp − 1)·charge(c, g)`` each (module doc); ``pass_s(nbytes)`` times a pass alone."""
    forward, backward, _, _ = costs.zero3_layer_work()
    out = []
    for segs in (forward, backward):
        rings = [seg for seg in segs if isinstance(seg, RingAttention) and not seg.gathered]
        ring = rings[-1] if rings else None  # the backward's own (after any recomputed one)
        out.append(0.0 if ring is None else (ring.steps - 1) * charge(
            "cp_ring_pass", pass_s(ring.nbytes), compute_s(ring.block)))
    return out[0], out[1]


def lowering_costs(exp: Experiment, costs: Any, compute_s: Callable[[ComputeSeg], float],
                   timer: Callable[[str, tuple[tuple[int, ...], ...], float], float]) -> Any:
    """``costs`` with :attr:`~TransformerCosts.cp_overlap_s` set (unchanged without ring
    context parallelism), each pass timed by ``timer`` (a
    :class:`~sim.commtime.CollectiveTimer`) on every ring pair of pipeline rank 0."""
    if (not isinstance(costs, TransformerCosts) or costs.cp == 1 or costs.cp_kv_all_gather):
        return costs
    p = exp.placement
    cp = p.degree("cp")

    def ring_next(x: int) -> int:
        coords = p.coords(x)
        return p.gpu(**{**coords, "cp": (coords["cp"] + 1) % cp})
    pairs = tuple((x, ring_next(x)) for group in tp_groups(p, 0) for x in group)
    return replaced(costs, cp_overlap_s=ring_overlap_s(
        costs, compute_s, lambda nbytes: timer("send", pairs, nbytes)))
