"""Roofline device model: how long a compute op takes on a GPU. Pure.

time = max(FLOPs / (peak · flops_efficiency), bytes / (HBM bandwidth · hbm_efficiency))
(Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)).
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.hardware import GPUSpec


@dataclass(frozen=True)
class DeviceProfile:
    """Achievable fractions of a GPU's peaks. Kept apart from the peaks on purpose."""

    flops_efficiency: float = 0.75
    """Fraction of dense BF16 peak that large training GEMMs reach."""
    hbm_efficiency: float = 0.85
    """Fraction of HBM bandwidth that streaming kernels reach."""
    source: str = (
        "defaults: large BF16 GEMMs on A100/H100 reach roughly 70-80% of peak in cuBLAS "
        "benchmarks; STREAM-like kernels reach ~85-90% of HBM bandwidth (uncalibrated)"
    )


def compute_time_s(
    flops: float, hbm_bytes: float, gpu: GPUSpec, profile: DeviceProfile
) -> float:
    """Roofline time of a kernel with ``flops`` and ``hbm_bytes`` on ``gpu``."""
    t_math = flops / (gpu.peak_bf16_flops * profile.flops_efficiency) if flops else 0.0
    t_mem = hbm_bytes / (gpu.hbm_bandwidth_Bps * profile.hbm_efficiency) if hbm_bytes else 0.0
    return max(t_math, t_mem)
