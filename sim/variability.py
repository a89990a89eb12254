"""GPU-to-GPU throughput variability as a device-profile what-if.

The model, its data and its sources are :mod:`topologies.variability` (a job paced by the
expected slowest of its N GPUs; ``cluster.gpu_speed_spread`` applies it to a cluster's GPUs).
:func:`paced_profile` is the same pacing as a device profile, for a caller that passes its own
profile to :func:`sim.api.simulate` (GEMMs and every attention kernel slowed, as
:func:`sim.corpus.scaled_profile` scales them; memory-bound kernels keep their speed).
"""

from __future__ import annotations

from sim.device import DeviceProfile
from topologies.variability import expected_max_normal, pacing, sigma

__all__ = ["expected_max_normal", "paced_profile", "pacing", "sigma"]


def paced_profile(profile: DeviceProfile, num_gpus: int,
                  spread: float | None = None) -> DeviceProfile:
    """``profile`` with its GEMMs and attention kernels :func:`pacing` times as long."""
    from sim.corpus import scaled_profile

    f = pacing(num_gpus, spread)
    return scaled_profile(profile, (f, f))
