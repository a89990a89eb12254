"""The process groups lowering emits collectives over, by pipeline rank (GPU ids).

A pipeline rank's GPUs are its TP groups, one per (cp, dp) replica; gradients are
reduced over the DP x CP group of each TP lane; MoE all-to-alls run over EP groups of
ep consecutive DP ranks, and expert gradients over the replicas holding the same
experts. With an expert TP size ``etp`` other than the TP degree the EP and expert-DP
groups come from each (pp, cp) slice's expert grid (:meth:`Placement.expert_coords`,
Megatron-core's expert ``RankGenerator``); ``etp`` None is the TP degree.
"""

from __future__ import annotations

from functools import lru_cache

from topologies.placement import Placement

Groups = tuple[tuple[int, ...], ...]
"""GPU groups: one tuple of GPU ids per group."""

GROUP_CACHE = 4096
"""Groups kept per function (each is a pure function of a placement and small integers;
lowering asks for the same groups once per op, a ZeRO-3 layout of 1,024 GPUs hundreds of
thousands of times)."""


@lru_cache(maxsize=GROUP_CACHE)
def replica_coords(placement: Placement) -> tuple[tuple[int, int], ...]:
    """The (cp, dp) coordinates of the replicas of a pipeline rank's TP group."""
    return tuple((c, d) for c in range(placement.degree("cp"))
                 for d in range(placement.degree("dp")))


@lru_cache(maxsize=GROUP_CACHE)
def replica_pairs(placement: Placement, src: int, dst: int) -> tuple[tuple[int, int], ...]:
    """The GPU pairs of a pipeline message from pipeline rank ``src`` to ``dst`` as a collapsed
    lowering times it: every (tp, cp, dp) replica's, replicas in :func:`replica_coords`
    order, TP lanes innermost. A GPU's rank is linear in its coordinates
    (:meth:`~topologies.placement.Placement.gpu`), so each pair is the two pipeline ranks'
    first GPUs plus the replica's offset (:func:`replica_offsets`)."""
    offsets = replica_offsets(placement)
    a, b = placement.gpu(pp=src), placement.gpu(pp=dst)
    return tuple(zip(map(a.__add__, offsets), map(b.__add__, offsets), strict=True))


@lru_cache(maxsize=GROUP_CACHE)
def replica_offsets(placement: Placement) -> tuple[int, ...]:
    """Each (tp, cp, dp) replica's GPU at pipeline rank 0, in :func:`replica_pairs`' order."""
    return tuple(placement.gpu(tp=u, cp=c, dp=e) for c, e in replica_coords(placement)
                 for u in range(placement.degree("tp")))


@lru_cache(maxsize=GROUP_CACHE)
def grad_group(placement: Placement, t: int, r: int) -> tuple[int, ...]:
    """The GPUs that reduce gradients together with TP lane ``t`` of pipeline rank ``r``:
    the DP group times the CP group (Megatron's data-parallel-with-CP group), by GPU id."""
    return tuple(sorted(placement.gpu(tp=t, cp=c, dp=d, pp=r)
                        for c, d in replica_coords(placement)))


@lru_cache(maxsize=GROUP_CACHE)
def dp_groups(placement: Placement, r: int) -> Groups:
    """The gradient groups of every TP lane of pipeline rank ``r`` (:func:`grad_group`)."""
    return tuple(grad_group(placement, t, r) for t in range(placement.degree("tp")))


@lru_cache(maxsize=GROUP_CACHE)
def rank_expert_groups(placement: Placement, r: int, ep: int, etp: int | None = None
                       ) -> Groups:
    """The expert gradient groups of every TP lane of pipeline rank ``r``
    (:func:`expert_groups`)."""
    return tuple(grp for t in range(placement.degree("tp"))
                 for grp in expert_groups(placement, t, r, ep, etp))


def expert_replicas(placement: Placement, ep: int, etp: int | None = None) -> int:
    """Size of an expert-data-parallel group, the GPUs of a pipeline rank holding the same
    expert shards: DP x CP x TP / (expert TP x EP) (Megatron-core's
    ``expert_data_parallel_size``, world / (ETP x EP x PP))."""
    replicas = len(replica_coords(placement))
    if etp is None:
        return replicas // ep
    return replicas * placement.degree("tp") // (etp * ep)


@lru_cache(maxsize=GROUP_CACHE)
def ep_groups(placement: Placement, r: int, ep: int, etp: int | None = None) -> Groups:
    """Every EP group of pipeline rank ``r``, by expert TP rank, CP rank and expert-DP rank
    (with ``etp`` the TP degree: ep consecutive DP ranks, same tp and cp)."""
    e = placement.degree("tp") if etp is None else etp
    edp = placement.degree("tp") * placement.degree("dp") // (e * ep)
    return tuple(placement.ep_group(placement.expert_gpu(k, 0, d, ep, etp, c, r), ep, etp)
                 for k in range(e) for c in range(placement.degree("cp")) for d in range(edp))


@lru_cache(maxsize=GROUP_CACHE)
def etp_groups(placement: Placement, r: int, ep: int, etp: int) -> Groups:
    """Every expert-TP group of pipeline rank ``r``: the ``etp`` GPUs of an expert grid that
    differ only in expert TP rank (Megatron-core's ``expt_tp`` group), by CP, EP and
    expert-DP rank; with ``etp`` the TP degree, the TP groups."""
    edp = placement.degree("tp") * placement.degree("dp") // (etp * ep)
    return tuple(tuple(placement.expert_gpu(k, i, d, ep, etp, c, r) for k in range(etp))
                 for c in range(placement.degree("cp")) for d in range(edp)
                 for i in range(ep))


@lru_cache(maxsize=GROUP_CACHE)
def expert_groups(placement: Placement, t: int, r: int, ep: int, etp: int | None = None
                  ) -> Groups:
    """The groups that reduce expert gradients for TP lane ``t`` of rank ``r``: the DP x CP
    replicas with the same expert TP and EP ranks (they hold the same expert shards), by
    GPU id, one per EP rank (and expert TP rank on the lane). A group stays on one TP lane
    while e·ep is a multiple of the TP degree (:func:`sim.experiment` checks it)."""
    grid: dict[tuple[int, int], list[int]] = {}
    for c, d in replica_coords(placement):
        g = placement.gpu(tp=t, cp=c, dp=d, pp=r)
        k, i, _ = placement.expert_coords(g, ep, etp)
        grid.setdefault((i, k), []).append(g)
    return tuple(tuple(sorted(grid[key])) for key in sorted(grid))


@lru_cache(maxsize=GROUP_CACHE)
def tp_groups(placement: Placement, r: int) -> tuple[tuple[int, ...], ...]:
    """Every TP group of pipeline rank ``r`` (one per (cp, dp) replica)."""
    return tuple(placement.group("tp", placement.gpu(pp=r, cp=c, dp=d))
                 for c, d in replica_coords(placement))


@lru_cache(maxsize=GROUP_CACHE)
def cp_groups(placement: Placement, r: int) -> tuple[tuple[int, ...], ...]:
    """Every CP group of pipeline rank ``r`` (one per (tp, dp) lane), in the order the GPUs
    of :func:`tp_groups` first meet them."""
    return tuple(dict.fromkeys(placement.group("cp", x)
                               for group in tp_groups(placement, r) for x in group))


ALL_TO_ALL_ALGO = "pairwise"
"""MoE all-to-alls: the one all-to-all algorithm (NCCL's pairwise exchange)."""
