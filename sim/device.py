"""Device model: how long a run of compute kernels takes on a GPU. Pure.

Each class of kernel is timed against the roofline (Williams, Waterman &
Patterson 2009, CACM 52(4)) with its own achievable fraction of peak:

    t = max(GEMM FLOPs / (peak · η_gemm), GEMM bytes / (HBM · η_hbm))
        + attention FLOPs / (peak · η_attention[kernel])
        + memory-bound bytes / (HBM · η_elementwise)

Peaks come from :mod:`topologies.hardware`; the efficiencies live in a
:class:`DeviceProfile`, kept apart from the peaks on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from topologies.hardware import GPUSpec


@dataclass(frozen=True)
class DeviceProfile:
    """Achievable fractions of a GPU's peaks, by kernel class."""

    gemm_efficiency: float = 0.80
    """Fraction of dense BF16 peak that large training GEMMs reach (cuBLAS on A100/H100)."""
    gemm_half_dim: float = 0.0
    """Smallest GEMM dimension at which a GEMM reaches half of ``gemm_efficiency``:
    η(d) = gemm_efficiency · d / (d + gemm_half_dim). Thin TP shards and short
    micro-batches fill fewer tiles and waves (0 = no shape dependence)."""
    flash2_efficiency: float = 0.60
    """FlashAttention-2, forward and backward averaged (Dao 2023 reports 50-73% on A100)."""
    flash1_efficiency: float = 0.40
    """FlashAttention-1 (Dao et al. 2022; about 25-40% of peak, Dao 2023 fig. 1)."""
    bmm_attention_efficiency: float = 0.50
    """Batched matmuls of non-flash (``fused``/``unfused``) attention."""
    hbm_efficiency: float = 0.85
    """Fraction of HBM bandwidth that streaming kernels reach (STREAM-like)."""
    elementwise_efficiency: float = 0.70
    """Fraction of HBM bandwidth that eager element-wise kernels reach."""
    reserved_bytes: float = 2.0 * 2**30
    """Memory the framework holds outside tensors: CUDA context, NCCL and cuBLAS
    workspaces (about 0.5-1 GiB of context on A100/H100, plus buffers)."""
    fragmentation: float = 0.05
    """Allocator overhead as a fraction of tracked tensor memory (caching allocator slack)."""
    source: str = "defaults from vendor and library documentation, not fitted"

    def gemm_time_s(self, flops: float, dims: tuple[tuple[float, float], ...],
                    peak_flops: float) -> float:
        """Time of GEMMs doing ``flops`` in all, split by smallest dimension in ``dims``."""
        shaped = sum(f for _, f in dims)
        t = max(flops - shaped, 0.0) / (peak_flops * self.gemm_efficiency)
        for dim, f in dims:
            eff = self.gemm_efficiency * dim / (dim + self.gemm_half_dim)
            t += f / (peak_flops * eff)
        return t

    def attention_efficiency(self, kernel: str) -> float:
        if kernel == "flash2":
            return self.flash2_efficiency
        if kernel == "flash1":
            return self.flash1_efficiency
        return self.bmm_attention_efficiency


def compute_time_s(
    gpu: GPUSpec,
    profile: DeviceProfile,
    flops: float = 0.0,
    hbm_bytes: float = 0.0,
    attn_flops: float = 0.0,
    elementwise_bytes: float = 0.0,
    attention_kernel: str = "flash2",
    gemm_dims: tuple[tuple[float, float], ...] = (),
) -> float:
    """Time of a run of kernels doing the given work on ``gpu``."""
    peak, hbm = gpu.peak_bf16_flops, gpu.hbm_bandwidth_Bps
    t = 0.0
    if flops or hbm_bytes:
        t = max(profile.gemm_time_s(flops, gemm_dims, peak),
                hbm_bytes / (hbm * profile.hbm_efficiency))
    if attn_flops:
        t += attn_flops / (peak * profile.attention_efficiency(attention_kernel))
    if elementwise_bytes:
        t += elementwise_bytes / (hbm * profile.elementwise_efficiency)
    return t


class Work(Protocol):
    """A compute op or segment: fixed ``duration_s`` or the work of :func:`compute_time_s`."""

    duration_s: float | None
    flops: float
    hbm_bytes: float
    attn_flops: float
    elementwise_bytes: float
    gemm_dims: tuple[tuple[float, float], ...]


def work_timer(gpu: GPUSpec, profile: DeviceProfile, attention_kernel: str = "flash2"
               ) -> Callable[[Work], float]:
    """``timer(item)``: the item's fixed duration, or its work timed on ``gpu``."""

    def timer(item: Work) -> float:
        if item.duration_s is not None:
            return item.duration_s
        return compute_time_s(gpu, profile, item.flops, item.hbm_bytes, item.attn_flops,
                              item.elementwise_bytes, attention_kernel, item.gemm_dims)

    return timer


def rank_timers(gpus: Sequence[GPUSpec], profile_of: Callable[[GPUSpec], DeviceProfile],
                attention_kernel: str = "flash2") -> tuple[Callable[[Work], float], ...]:
    """One :func:`work_timer` per rank of a (possibly mixed) cluster, each on that rank's own
    GPU with ``profile_of(its GPU)``; ranks of one GPU type share a timer."""
    by_type = {spec: work_timer(spec, profile_of(spec), attention_kernel)
               for spec in dict.fromkeys(gpus)}
    return tuple(by_type[spec] for spec in gpus)
