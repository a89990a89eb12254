"""GPU-to-GPU throughput variability: a synchronous job paced by its slowest GPU.

GPUs of one SKU run the same compute-bound kernel at different speeds (manufacturing spread
under the power and thermal limits: Sinha et al. 2022, ``sim/data/gpu_variability.toml``). In
synchronous training every GPU waits for the slowest one of its group at each collective (a
data-parallel gradient reduction, each FSDP gather, each tensor-parallel all-reduce, each
pipeline send), and data parallelism ties the groups together once a step, so the step runs at
the pace of the slowest of the job's N GPUs. With static speeds drawn independently from a
normal distribution of relative spread sigma around the median GPU, the expected pace is

    1 + sigma * E[max of N standard normals]

(the expected largest order statistic; deterministic, no draws). :func:`pacing` gives it and
:func:`paced_profile` applies it to the compute-bound kernels' efficiencies (GEMMs and every
attention kernel, as :func:`sim.corpus.scaled_profile` scales them): power-managed clocks slow
the math pipes; memory-bound kernels (elementwise, HBM copies) are left at their speed. The
device profiles stand for the median GPU (a single-GPU kernel benchmark, or the A100 fit,
which was fitted on training runs of 32 to 256 GPUs and so holds that pacing in its constants
already: see docs/gpu-variability.md).

Not applied by default (docs/gpu-variability.md: the one published distribution was measured
on V100 and MI60 clusters, and refitted on the sweep the pacing leaves the corpus's optimism
where it was): a what-if passes :func:`paced_profile` as :func:`sim.api.simulate`'s profile.
Stragglers given under ``faults:`` are a different thing: named GPUs slowed on top, simulated
at full fidelity.
"""

from __future__ import annotations

import math
import tomllib
from functools import cache
from pathlib import Path

from sim.device import DeviceProfile

DATA_FILE = Path(__file__).parent / "data" / "gpu_variability.toml"
"""The spread, how it is read, whether it is on, with their sources."""

_GRID = (-12.0, 12.0, 24_000)
"""Integration grid of :func:`expected_max_normal`: (low, high, intervals); the tails beyond
carry under 1e-30 of the mass for any N below 1e12."""


@cache
def _data() -> dict:
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)


def sigma() -> float:
    """Relative standard deviation of a GPU's speed: the whisker range read as normal."""
    d = _data()
    return float(d["whisker_range"]) / (4.0 * float(d["normal_iqr"]))


@cache
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals], by the trapezoid rule on
    ``x · d/dx Φ(x)^n`` (0 for n = 1; 0.5642 for 2, 1.4236 for 8, 3.0439 for 512)."""
    if n < 1:
        raise ValueError(f"n={n}: at least one GPU")
    if n == 1:
        return 0.0
    lo, hi, steps = _GRID
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        cdf = 0.5 * math.erfc(-x / math.sqrt(2.0))
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        w = 0.5 if i in (0, steps) else 1.0
        total += w * x * n * pdf * cdf ** (n - 1)
    return total * h


def pacing(num_gpus: int, spread: float | None = None) -> float:
    """The expected pace of ``num_gpus`` synchronised GPUs against the median one:
    1 + sigma · E[max of N]; ``spread`` overrides sigma (the data file's otherwise)."""
    s = sigma() if spread is None else spread
    return 1.0 + s * expected_max_normal(num_gpus)


def paced_profile(profile: DeviceProfile, num_gpus: int,
                  spread: float | None = None) -> DeviceProfile:
    """``profile`` with its GEMMs and attention kernels :func:`pacing` times as long."""
    from sim.corpus import scaled_profile

    f = pacing(num_gpus, spread)
    return scaled_profile(profile, (f, f))
