"""GPU power limits: the settable range per GPU and what a cap does to tensor throughput. Pure.

The data, each number beside its source, are in ``power_limits.toml``: per GPU die, the
products' rated dense tensor throughput at their power limits (``points``), and per GPU preset
the lowest limit it accepts (the highest is its datasheet TDP, ``GPUSpec.tdp_w``). A limit P
gives the GPU's compute-bound kernels (GEMMs, attention, FP8 GEMMs) the fraction

    r(P) = r_i · (P / P_i)^α_i,   α_i = ln(r_{i+1} / r_i) / ln(P_{i+1} / P_i),

on the segment [P_i, P_{i+1}] of the points that holds P (the lowest segment below the lowest
point), r = 1 at the TDP: a power law per segment, as the clock under a cap follows the
dynamic power's f·V² (with V rising with f, P ∝ f^(1/α), α = 0.302 on GH100). Memory-bound
kernels keep their rate (the sources rate tensor throughput only; a cap lowers the SM clock,
not the HBM clock). :func:`capped` gives the GPU spec with the cap and its fraction, which
:func:`sim.device.compute_time_s` multiplies into the peak.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib.resources import files

from topologies.hardware import GPUS, GPUSpec


@dataclass(frozen=True)
class PowerRange:
    """The power limits one GPU preset accepts, and the die's throughput relation."""

    gpu: str
    """GPU preset name (:data:`topologies.hardware.GPUS`)."""
    die: str
    """The table of ``power_limits.toml`` it belongs to (``GH100``)."""
    min_w: float
    """The lowest limit the board accepts (NVML's minimum power limit), W."""
    tdp_w: float
    """The board's TDP, its highest settable limit, W (:attr:`GPUSpec.tdp_w
    <topologies.hardware.GPUSpec.tdp_w>`, the datasheet's): where the peaks hold."""
    points: tuple[tuple[float, float], ...]
    """(power limit W, throughput fraction of that at the TDP), ascending in power."""
    source: str
    """Where the range and the points come from."""


@cache
def _table() -> dict:
    return tomllib.loads(files("topologies").joinpath("power_limits.toml")
                         .read_text(encoding="utf-8"))


@cache
def power_range(gpu_name: str) -> PowerRange | None:
    """The power range of the GPU preset ``gpu_name`` (exact preset name), or None where no
    published throughput-versus-power relation is recorded for its die."""
    for die, table in _table().items():
        if gpu_name in table["gpus"]:
            lim = table["limits"][gpu_name]
            points = tuple(sorted((float(p), float(r)) for p, r in table["points"]))
            return PowerRange(gpu_name, die, float(lim["min_w"]), float(GPUS[gpu_name].tdp_w),
                              points, f"{lim['source']}; throughput: {table['points_source']}")
    return None


def capable_gpus() -> tuple[str, ...]:
    """The GPU presets a power limit can be set on."""
    return tuple(g for table in _table().values() for g in table["gpus"])


def throughput_fraction(rng: PowerRange, limit_w: float) -> float:
    """r(P) of the module docstring: the compute throughput at ``limit_w`` over that at the
    TDP (1.0 at the TDP itself)."""
    if limit_w >= rng.tdp_w:
        return 1.0
    pts = rng.points
    k = next((i for i in range(len(pts) - 1) if limit_w <= pts[i + 1][0]), len(pts) - 2)
    (p0, r0), (p1, r1) = pts[k], pts[k + 1]
    alpha = math.log(r1 / r0) / math.log(p1 / p0)
    return r0 * (limit_w / p0) ** alpha


def capped(spec: GPUSpec, limit_w: float | None) -> GPUSpec:
    """``spec`` under a power limit of ``limit_w`` W (None: ``spec`` itself, uncapped).

    ValueError, naming both sides, for a GPU without a recorded relation or a limit outside
    its [min_w, tdp_w]."""
    if limit_w is None:
        return spec
    rng = power_range(spec.name)
    if rng is None:
        tdp = "" if spec.tdp_w is None else f" (TDP {spec.tdp_w:g} W)"
        raise ValueError(f"no published throughput-versus-power-limit relation for GPU "
                         f"{spec.name!r}{tdp}; a power limit can be set on "
                         f"{', '.join(capable_gpus())}")
    if limit_w < rng.min_w:
        raise ValueError(f"{limit_w:g} W is below the {spec.name}'s minimum power limit "
                         f"{rng.min_w:g} W (settable range {rng.min_w:g}-{rng.tdp_w:g} W)")
    if limit_w > rng.tdp_w:
        raise ValueError(f"{limit_w:g} W is above the {spec.name}'s TDP {rng.tdp_w:g} W "
                         f"(settable range {rng.min_w:g}-{rng.tdp_w:g} W)")
    return replace(spec, power_limit_w=float(limit_w),
                   compute_fraction=throughput_fraction(rng, limit_w))
