"""Rank placement: which GPU holds which (tp, cp, dp, pp) coordinate of a layout. Pure.

The order string lists parallel dimensions from innermost (fastest varying,
adjacent GPU indices, so inside one server) to outermost. The default
``tp-cp-dp-pp`` keeps each TP group inside a server, as Megatron-LM does
(Narayanan et al. 2021, sec. 3.3).

Expert parallelism is carved out of DP (Megatron-LM): an EP group is ep
consecutive DP ranks. The order may name it, ``tp-cp-ep-dp-pp``, only right
inside ``dp`` (where it always is); it adds no dimension of its own.

With an expert tensor parallel size e (Megatron-core ``expert_tensor_parallel_size``) the
MoE layers see each (pp, cp) slice's tp·dp GPUs as their own grid, as Megatron-core's
expert ``RankGenerator`` does (megatron/core/parallel_state.py ``initialize_model_parallel``:
``tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=expert_data_parallel_size``
in the same order, innermost first): the GPU at (tp, dp) has the local index
L = tp + TP·dp and the expert coordinates (L mod e, L // e mod ep, L // (e·ep)), i.e.
expert TP rank, EP rank and expert-DP rank (:meth:`Placement.expert_coords`). With e = TP
the EP groups are the ep consecutive DP ranks above. Megatron-core folds CP into the
expert grid too; here EP stays inside one CP rank, as it is carved out of DP.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, repeat
from types import MappingProxyType

from base.errors import ConfigError

DIMS = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"


@dataclass(frozen=True)
class Placement:
    """Bijection between layout coordinates and GPU ranks."""

    sizes: tuple[tuple[str, int], ...]
    """(dimension, degree) from innermost to outermost."""

    @classmethod
    def from_order(cls, order: str, tp: int, cp: int, dp: int, pp: int) -> Placement:
        dims = order.split("-")
        if "ep" in dims:
            at = dims.index("ep")
            if at + 1 >= len(dims) or dims[at + 1] != "dp" or dims.count("ep") > 1:
                raise ConfigError(f"parallel.placement={order!r}: 'ep' may only come right "
                                  "before 'dp' (EP groups are consecutive DP ranks), e.g. "
                                  "'tp-cp-ep-dp-pp'")
            dims = dims[:at] + dims[at + 1:]
        if sorted(dims) != sorted(DIMS):
            raise ConfigError(
                f"parallel.placement={order!r} must order each of {', '.join(DIMS)} once, "
                f"e.g. {DEFAULT_ORDER!r}"
            )
        degree = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        return cls(tuple((d, degree[d]) for d in dims))

    @property
    def num_gpus(self) -> int:
        n = 1
        for _, size in self.sizes:
            n *= size
        return n

    def __post_init__(self) -> None:
        strides, stride = {}, 1
        for dim, size in self.sizes:
            strides[dim] = stride
            stride *= size
        object.__setattr__(self, "_strides", tuple(strides[d] for d in DIMS))

    def gpu(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """GPU rank of a coordinate."""
        s_tp, s_cp, s_dp, s_pp = self._strides
        return tp * s_tp + cp * s_cp + dp * s_dp + pp * s_pp

    def coords(self, gpu: int) -> dict[str, int]:
        """Coordinate of a GPU rank, inverse of :meth:`gpu`."""
        out = {}
        for dim, size in self.sizes:
            out[dim] = gpu % size
            gpu //= size
        return out

    def degree(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    def expert_coords(self, gpu: int, ep: int, etp: int | None = None) -> tuple[int, int, int]:
        """(expert TP rank, EP rank, expert-DP rank) of ``gpu`` in its (pp, cp) slice's expert
        grid of ``etp`` (default: the TP degree) x ``ep`` x the rest (module docstring)."""
        c = self.coords(gpu)
        e = self.degree("tp") if etp is None else etp
        local = c["tp"] + self.degree("tp") * c["dp"]
        return local % e, local // e % ep, local // (e * ep)

    def expert_gpu(self, etp_rank: int, ep_rank: int, edp_rank: int, ep: int,
                   etp: int | None = None, cp: int = 0, pp: int = 0) -> int:
        """The GPU at an expert-grid coordinate of slice (pp, cp), inverse of
        :meth:`expert_coords`."""
        t = self.degree("tp")
        e = t if etp is None else etp
        local = etp_rank + e * (ep_rank + ep * edp_rank)
        return self.gpu(tp=local % t, cp=cp, dp=local // t, pp=pp)

    def ep_group(self, gpu: int, ep: int, etp: int | None = None) -> tuple[int, ...]:
        """The EP group of ``gpu``: the ep GPUs of its expert grid that differ only in EP rank
        (with ``etp`` left out or the TP degree: the ep consecutive DP ranks around it, same
        tp, cp, pp), by EP rank."""
        c = self.coords(gpu)
        e_rank, _, d_rank = self.expert_coords(gpu, ep, etp)
        return tuple(self.expert_gpu(e_rank, i, d_rank, ep, etp, c["cp"], c["pp"])
                     for i in range(ep))

    def group(self, dim: str, gpu: int) -> tuple[int, ...]:
        """The GPUs that differ from ``gpu`` only along ``dim``, in ring order."""
        base = self.coords(gpu)
        return tuple(self.gpu(**{**base, dim: i}) for i in range(self.degree(dim)))


PLACEMENT_CACHE = 64
"""Placements :func:`coordinate_columns` keeps tables of (the least recently used go
first)."""


@lru_cache(maxsize=PLACEMENT_CACHE)
def coordinate_columns(placement: Placement) -> Mapping[str, tuple[int, ...]]:
    """Per dimension, every GPU's coordinate along it (``coords(g)[dim]`` for each GPU in
    order), worked out once per placement (read-only): a run reads every GPU's pipeline
    rank and names, and a search's or repeated run's experiments share the placement."""
    n = placement.num_gpus
    columns: dict[str, tuple[int, ...]] = {}
    stride = 1  # GPUs per step of this dimension's coordinate (the inner degrees' product)
    for dim, size in placement.sizes:
        # the coordinate counts up every `stride` GPUs and wraps at `size`: one period of
        # it, repeated (tuples made in C, not a coords() dict per GPU: 1T's 3,072 GPUs)
        period = tuple(chain.from_iterable(repeat(value, stride) for value in range(size)))
        columns[dim] = period * (n // (stride * size)) if n else ()
        stride *= size
    return MappingProxyType(columns)


def mixed_pipeline_ranks(placement: Placement, type_of: Callable[[int], Hashable]
                         ) -> tuple[int, ...]:
    """Pipeline ranks whose GPUs are not all of one type (``type_of(gpu)``, e.g. a
    heterogeneous cluster's :meth:`~topologies.cluster.Cluster.gpu_of`): a collapsed
    simulation, one GPU standing for its pipeline rank, is exact only without them."""
    mixed = set()
    for g in range(placement.num_gpus):
        r = placement.coords(g)["pp"]
        if r not in mixed and type_of(g) != type_of(placement.gpu(pp=r)):
            mixed.add(r)
    return tuple(sorted(mixed))
