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

from dataclasses import dataclass

from topologies.hardware import GPUSpec


@dataclass(frozen=True)
class DeviceProfile:
    """Achievable fractions of a GPU's peaks, by kernel class."""

    gemm_efficiency: float = 0.80
    """Fraction of dense BF16 peak that large training GEMMs reach (cuBLAS on A100/H100)."""
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
    source: str = "uncalibrated defaults (see sim/calibration.py for fitted values)"

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
) -> float:
    """Time of a run of kernels doing the given work on ``gpu``."""
    peak, hbm = gpu.peak_bf16_flops, gpu.hbm_bandwidth_Bps
    t = 0.0
    if flops or hbm_bytes:
        t = max(flops / (peak * profile.gemm_efficiency),
                hbm_bytes / (hbm * profile.hbm_efficiency))
    if attn_flops:
        t += attn_flops / (peak * profile.attention_efficiency(attention_kernel))
    if elementwise_bytes:
        t += elementwise_bytes / (hbm * profile.elementwise_efficiency)
    return t
