"""Device model: how long a run of compute kernels takes on a GPU. Pure.

Each class of kernel is timed against the roofline (Williams, Waterman &
Patterson 2009, CACM 52(4)) with its own achievable fraction of peak:

    t = max(GEMM FLOPs / (peak · η_gemm), GEMM bytes / (HBM · η_hbm))
        + attention FLOPs / (peak · η_attention[kernel])
        + memory-bound bytes / (HBM · η_elementwise)

η_gemm depends on each GEMM's size (:meth:`DeviceProfile.gemm_efficiency_at`): with d the
side of the cube of equal work, (M·K·N)^(1/3),

    1/η(d) = (1 + d½/d + (d₂/d)^p) / η_gemm,

a GEMM's time is its work at η_gemm plus shape costs: one that grows with its area (p = 1
term), and a steeper one, p = 2 for a partial last wave of output tiles (wave
quantization, NVIDIA's *Matrix Multiplication Background* guide, sec. 3.2), p = 3 for a
fixed time per GEMM (launch, main-loop fill and drain, the tail).

Peaks come from :mod:`topologies.hardware`; the efficiencies live in a
:class:`DeviceProfile`, kept apart from the peaks on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from base.errors import ConfigError
from topologies.hardware import GPUSpec


@dataclass(frozen=True)
class DeviceProfile:
    """Achievable fractions of a GPU's peaks, by kernel class."""

    gemm_efficiency: float = 0.80
    """Fraction of dense BF16 peak that large training GEMMs reach (cuBLAS on A100/H100)."""
    gemm_half_dim: float = 0.0
    """d½ of the GEMM shape curve: with ``gemm_half_dim2`` = 0, the GEMM dimension d at which
    a GEMM reaches half of ``gemm_efficiency``, η(d) = gemm_efficiency · d / (d + d½).
    Thin TP shards and short micro-batches fill fewer tiles and waves (0 = no such term)."""
    gemm_half_dim2: float = 0.0
    """d₂ of the curve's steeper term (:meth:`gemm_efficiency_at`):
    1/η(d) = (1 + d½/d + (d₂/d)^p) / gemm_efficiency, p = ``gemm_shape_power``. 0 (the
    default): the one-term curve above."""
    gemm_shape_power: float = 2.0
    """p of the steeper term: 2, a partial last wave of tiles per GEMM (its time grows with
    K, so with d); 3, a fixed time per GEMM (module docstring)."""
    flash2_efficiency: float = 0.60
    """FlashAttention-2, forward and backward averaged (Dao 2023 reports 50-73% on A100)."""
    flash1_efficiency: float = 0.40
    """FlashAttention-1 (Dao et al. 2022; about 25-40% of peak, Dao 2023 fig. 1)."""
    flash3_efficiency: float | None = None
    """FlashAttention-3 (Shah et al. 2024), which needs Hopper's asynchronous tensor cores
    and TMA: None on every GPU it does not run on (:mod:`sim.gpu_profiles`)."""
    cudnn_efficiency: float | None = None
    """cuDNN's fused flash attention, the kernel Transformer Engine's DotProductAttention
    selects on Hopper (Megatron-Core, NeMo): None where it has no measurement of its own,
    and the kind is then timed as FlashAttention-2 (what TE runs on Ampere,
    :mod:`sim.gpu_profiles`)."""
    bmm_attention_efficiency: float = 0.50
    """Batched matmuls of non-flash (``fused``/``unfused``) attention."""
    hbm_efficiency: float = 0.85
    """Fraction of HBM bandwidth that streaming kernels reach (STREAM-like)."""
    elementwise_efficiency: float = 0.70
    """Fraction of HBM bandwidth that eager element-wise kernels reach."""
    reserved_bytes: float = 2.0 * 2**30
    """Memory the framework holds outside tensors: CUDA context, NCCL and cuBLAS
    workspaces (about 0.5-1 GiB of context on A100/H100, plus buffers)."""
    reserved_from_run: bool = False
    """Whether a run's reserved memory comes from its layout, cluster and framework
    (:mod:`sim.reserved`: CUDA context, cuBLAS workspaces, NCCL buffers, each sourced)
    instead of ``reserved_bytes``; the shipped profiles (:mod:`sim.calibration`) set it,
    ``reserved_bytes`` then serving only where no run is at hand (search bounds)."""
    fragmentation: float = 0.05
    """Allocator overhead as a fraction of tracked tensor memory (caching allocator slack)."""
    source: str = "defaults from vendor and library documentation, not fitted"

    def gemm_efficiency_at(self, dim: float) -> float:
        """η(d) = gemm_efficiency · d / (d + d½ + d · (d₂/d)^p), i.e. 1/η(d) =
        (1 + d½/d + (d₂/d)^p) / gemm_efficiency, for a GEMM of dimension d (the cube side
        (M·K·N)^(1/3), :func:`workloads.kernels.gemm`)."""
        steep = dim * (self.gemm_half_dim2 / dim) ** self.gemm_shape_power \
            if self.gemm_half_dim2 else 0.0
        return self.gemm_efficiency * dim / (dim + self.gemm_half_dim + steep)

    def gemm_time_s(self, flops: float, dims: tuple[tuple[float, float], ...],
                    peak_flops: float) -> float:
        """Time of GEMMs doing ``flops`` in all, split by dimension in ``dims``."""
        shaped = sum(f for _, f in dims)
        t = max(flops - shaped, 0.0) / (peak_flops * self.gemm_efficiency)
        for dim, f in dims:
            t += f / (peak_flops * self.gemm_efficiency_at(dim))
        return t

    def attention_efficiency(self, kernel: str) -> float:
        if kernel == "flash2":
            return self.flash2_efficiency
        if kernel in ("flash1", "flash-triton"):
            # FlashAttention in Triton: Dao 2023 (FlashAttention-2, sec. 4.1) measures
            # FlashAttention-2 about 2x faster than both FlashAttention and its Triton version in
            # the backward pass (1.3-1.5x vs about 2x in the forward): FlashAttention-1's class
            return self.flash1_efficiency
        if kernel == "cudnn":
            return (self.flash2_efficiency if self.cudnn_efficiency is None
                    else self.cudnn_efficiency)
        if kernel == "flash3":
            if self.flash3_efficiency is None:
                raise ConfigError("training.attention='flash3': FlashAttention-3 runs on Hopper "
                                  "GPUs (H100, H200) only; this GPU's profile has no FA3 "
                                  "efficiency")
            return self.flash3_efficiency
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
    """Time of a run of kernels doing the given work on ``gpu``.

    Under a power limit (:attr:`GPUSpec.compute_fraction <topologies.hardware.GPUSpec.
    compute_fraction>` below 1, :mod:`topologies.power`) the compute-bound classes, GEMMs and
    attention, run at that fraction of the peak; the memory-bound ones keep the HBM rate."""
    peak, hbm = gpu.peak_bf16_flops * gpu.compute_fraction, gpu.hbm_bandwidth_Bps
    t = 0.0
    if flops or hbm_bytes:
        t = max(profile.gemm_time_s(flops, gemm_dims, peak),
                hbm_bytes / (hbm * profile.hbm_efficiency))
    if attn_flops and peak < float("inf"):  # the ideal GPU runs any kernel in no time
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
