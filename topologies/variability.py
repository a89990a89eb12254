"""GPU-to-GPU throughput variability: a synchronous job paced by its slowest GPU. Pure.

GPUs of one SKU run the same compute-bound kernel at different speeds (manufacturing spread
under the power and thermal limits: Sinha et al. 2022, ``gpu_variability.toml`` beside this
module). In synchronous training every GPU waits for the slowest one of its group at each
collective (a data-parallel gradient reduction, each FSDP gather, each tensor-parallel
all-reduce, each pipeline send), and data parallelism ties the groups together once a step,
so the step runs at the pace of the slowest of the job's N GPUs. With static speeds drawn
independently from a normal distribution of relative spread sigma around the median GPU, the
expected pace is

    1 + sigma * E[max of N standard normals]

(the expected largest order statistic; deterministic, no draws). :func:`pacing` gives it;
:func:`paced` applies it to a GPU's compute-bound kernels (GEMMs and attention, through
:attr:`GPUSpec.compute_fraction <topologies.hardware.GPUSpec.compute_fraction>`, as a power
limit does): power-managed clocks slow the math pipes, memory-bound kernels (elementwise, HBM
copies) keep their speed. ``cluster.gpu_speed_spread`` turns it on for a cluster; off by
default, since the device profiles stand for the median GPU of a kernel benchmark, or (the
A100's) were fitted on training runs of 32 to 256 GPUs and so hold that pacing already
(docs/gpu-variability.md).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from functools import cache
from importlib.resources import files

from topologies.hardware import GPUSpec

PUBLISHED = "sinha2022"
"""``cluster.gpu_speed_spread``'s name for the data file's spread (:func:`sigma`)."""

_GRID = (-12.0, 12.0, 24_000)
"""Integration grid of :func:`expected_max_normal`: (low, high, intervals); the tails beyond
carry under 1e-30 of the mass for any N below 1e12."""


@cache
def data() -> dict:
    """``gpu_variability.toml``: the spread, how it is read, with their sources."""
    return tomllib.loads(files("topologies").joinpath("gpu_variability.toml")
                         .read_text(encoding="utf-8"))


def sigma() -> float:
    """Relative standard deviation of a GPU's speed: the whisker range read as normal."""
    d = data()
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


def spread_of(setting: float | str) -> float:
    """The relative spread a ``cluster.gpu_speed_spread`` setting names: a number as given,
    :data:`PUBLISHED` the data file's (:func:`sigma`)."""
    return sigma() if setting == PUBLISHED else float(setting)


def pacing(num_gpus: int, spread: float | None = None) -> float:
    """The expected pace of ``num_gpus`` synchronised GPUs against the median one:
    1 + sigma · E[max of N]; ``spread`` overrides sigma (the data file's otherwise)."""
    s = sigma() if spread is None else spread
    return 1.0 + s * expected_max_normal(num_gpus)


def paced(spec: GPUSpec, num_gpus: int, setting: float | str | None) -> GPUSpec:
    """``spec`` with its compute-bound kernels :func:`pacing` times as long, for a job of
    ``num_gpus`` GPUs whose speeds spread by ``setting`` (:func:`spread_of`); None or a
    spread of 0: ``spec`` itself."""
    if setting is None:
        return spec
    f = pacing(num_gpus, spread_of(setting))
    if f == 1.0:
        return spec
    return replace(spec, compute_fraction=spec.compute_fraction / f)
