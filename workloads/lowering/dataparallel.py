"""Collectives over the data-parallel groups of a pipeline rank, as the gradient and
optimizer passes emit them: one per TP lane over its DP x CP group
(:func:`~workloads.lowering.groups.grad_group`), and for MoE with ep > 1 the experts'
over each expert-data-parallel group; collapsed, one instruction on the representative
GPU timed with every lane's group at once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from topologies.placement import Placement
from workloads.lowering.collapse import Collapse
from workloads.lowering.groups import (
    dp_groups,
    expert_groups,
    expert_replicas,
    grad_group,
    rank_expert_groups,
    replica_coords,
)
from workloads.program import ProgramBuilder


@dataclass(frozen=True)
class DataParallel:
    """Emits a pipeline rank's DP collectives into ``b`` (see the module doc)."""

    b: ProgramBuilder
    placement: Placement
    collapse: Collapse | None
    ep: int
    """Expert-parallel degree."""
    etp: int | None = None
    """Expert tensor-parallel degree; None: the TP degree."""

    @property
    def tp(self) -> int:
        """TP lanes of the layout."""
        return self.placement.degree("tp")

    @property
    def dp(self) -> int:
        """Size of the gradient group: DP x CP."""
        return len(replica_coords(self.placement))

    @property
    def expert_replicas(self) -> int:
        """Size of an expert-data-parallel group: the GPUs holding the same expert shards,
        DP x CP x TP / (expert TP x EP)."""
        return expert_replicas(self.placement, self.ep, self.etp)

    @property
    def lanes(self) -> int:
        """TP lanes simulated: all, or the representative's one when collapsed."""
        return 1 if self.collapse is not None else self.tp

    def lane_gpus(self, r: int, t: int) -> tuple[int, ...]:
        """The simulated GPUs of TP lane ``t`` of rank ``r``'s gradient group."""
        if self.collapse is not None:
            return (self.placement.gpu(pp=r),)
        return grad_group(self.placement, t, r)

    def collective(self, r: int, t: int, deps: dict[int, tuple[int, ...]], name: str,
                   op: str, nbytes: float, stage: int = -1) -> dict[int, int]:
        """``op`` over TP lane ``t``'s gradient group of rank ``r``; ids by GPU."""
        placement, collapse = self.placement, self.collapse
        group = grad_group(placement, t, r)
        if collapse is None:
            return self.b.collective(group, deps, kind="dp", name=name, op=op, nbytes=nbytes,
                                     stage=stage)
        groups = dp_groups(placement, r)
        return self.b.collective((group[0],), deps, kind="dp", name=name, op=op,
                                 nbytes=nbytes, stage=stage,
                                 duration_s=collapse.collective_s(op, groups, nbytes))

    def expert_collective(self, r: int, t: int, deps: Mapping[int, tuple[int, ...]],
                          name: str, op: str, nbytes: float, stage: int = -1
                          ) -> dict[int, int]:
        """MoE with its experts apart (ep > 1 or an expert TP of its own): the experts'
        collective over each expert-data-parallel group of lane ``t``."""
        placement, collapse, ep, etp = self.placement, self.collapse, self.ep, self.etp
        if collapse is not None:
            rep = placement.gpu(pp=r)
            groups = rank_expert_groups(placement, r, ep, etp)
            return self.b.collective((rep,), {rep: deps[rep]}, kind="dp", name=name, op=op,
                                     nbytes=nbytes, stage=stage,
                                     duration_s=collapse.collective_s(op, groups, nbytes))
        ids: dict[int, int] = {}
        for group in expert_groups(placement, t, r, ep, etp):
            ids.update(self.b.collective(group, {g: deps[g] for g in group}, kind="dp",
                                         name=name, op=op, nbytes=nbytes, stage=stage))
        return ids
