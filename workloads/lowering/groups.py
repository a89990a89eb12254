"""The process groups lowering emits collectives over, by pipeline rank (GPU ids).

A pipeline rank's GPUs are its TP groups, one per (cp, dp) replica; gradients are
reduced over the DP x CP group of each TP lane; MoE all-to-alls run over EP groups of
ep consecutive DP ranks, and expert gradients over the replicas holding the same
experts.
"""

from __future__ import annotations

from topologies.placement import Placement

Groups = tuple[tuple[int, ...], ...]
"""GPU groups: one tuple of GPU ids per group."""


def replica_coords(placement: Placement) -> list[tuple[int, int]]:
    """The (cp, dp) coordinates of the replicas of a pipeline rank's TP group."""
    return [(c, d) for c in range(placement.degree("cp")) for d in range(placement.degree("dp"))]


def grad_group(placement: Placement, t: int, r: int) -> tuple[int, ...]:
    """The GPUs that reduce gradients together with TP lane ``t`` of pipeline rank ``r``:
    the DP group times the CP group (Megatron's data-parallel-with-CP group), by GPU id."""
    return tuple(sorted(placement.gpu(tp=t, cp=c, dp=d, pp=r)
                        for c, d in replica_coords(placement)))


def ep_groups(placement: Placement, r: int, ep: int) -> Groups:
    """Every EP group of pipeline rank ``r``: ep consecutive DP ranks, same tp and cp."""
    return tuple(placement.ep_group(placement.gpu(tp=t, cp=c, dp=d, pp=r), ep)
                 for t in range(placement.degree("tp")) for c, d in replica_coords(placement)
                 if d % ep == 0)


def expert_groups(placement: Placement, t: int, r: int, ep: int) -> Groups:
    """The groups that reduce expert gradients for TP lane ``t`` of rank ``r``: the DP x CP
    replicas with the same EP rank (they hold the same experts), by GPU id."""
    return tuple(tuple(sorted(placement.gpu(tp=t, cp=c, dp=d, pp=r)
                              for c, d in replica_coords(placement) if d % ep == i))
                 for i in range(ep))


def tp_groups(placement: Placement, r: int) -> tuple[tuple[int, ...], ...]:
    """Every TP group of pipeline rank ``r`` (one per (cp, dp) replica)."""
    return tuple(placement.group("tp", placement.gpu(pp=r, cp=c, dp=d))
                 for c, d in replica_coords(placement))


ALL_TO_ALL_ALGO = "pairwise"
"""MoE all-to-alls: the one all-to-all algorithm (NCCL's pairwise exchange)."""
