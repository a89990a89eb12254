"""GPU specifications: peaks only. Efficiencies live in the device model, not here.

All values are vendor datasheet numbers (dense BF16, no sparsity), each preset's beside its
source in ``gpus.toml`` and collected in REFERENCES.md ("Hardware"). Bandwidths are bytes per
second; NVLink figures are per direction (the datasheets quote both directions summed).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib.resources import files

GB = 1e9
TB = 1e12
GiB = 2**30


CUDA_VISIBLE_FRACTION = 79.3 / 80
"""Of a GPU's HBM, what CUDA reports as total memory. HBM stacks are binary-sized: the
vendors' "80GB" A100 is 80 GiB of HBM2e, and PyTorch reports 79.25-79.35 GiB total on it
(out-of-memory messages in public issues: levihsu/OOTDiffusion#235 79.25 GiB,
OSU-NLP-Group/TableLlama#10 79.35 GiB, hahnyuan/PB-LLM#3 79.33 GiB on the A800-80GB); the
rest is the driver's. Measured on the A100-80GB only; the same fraction is assumed on the
other GPUs (unverified)."""


def cuda_visible(vendor_gb: float) -> float:
    """Bytes CUDA exposes on a GPU sold as ``vendor_gb`` "GB" of HBM: that many GiB (HBM
    stacks come in binary sizes) times :data:`CUDA_VISIBLE_FRACTION`."""
    return vendor_gb * GiB * CUDA_VISIBLE_FRACTION


@dataclass(frozen=True)
class GPUSpec:
    """Peak capabilities of one GPU model."""

    name: str
    """Preset name, e.g. ``A100-80GB``."""
    peak_bf16_flops: float
    """Dense BF16 tensor-core peak, FLOP/s."""
    hbm_capacity_bytes: float
    """Bytes of device memory CUDA gives the framework (``cudaDeviceProp.totalGlobalMem``,
    what PyTorch's out-of-memory message calls "total capacity"): :func:`cuda_visible`."""
    hbm_bandwidth_Bps: float
    """HBM bandwidth, bytes/s."""
    nvlink_bandwidth_Bps: float
    """Scale-up (NVLink / Infinity Fabric) bandwidth per direction, bytes/s."""
    source: str
    """Where the numbers come from."""
    peak_fp8_flops: float | None = None
    """Dense FP8 tensor-core peak, FLOP/s (same datasheet); None on GPUs without FP8 tensor
    cores (A100)."""
    tdp_w: float | None = None
    """Board power at which the datasheet rates the peaks above (TDP, or the top of a
    configurable range), W: the highest power limit the board accepts."""
    power_limit_w: float | None = None
    """The board power limit the GPU runs under, W; None: its TDP, the datasheet's peaks
    (:func:`topologies.power.capped` sets it, with :attr:`compute_fraction`)."""
    compute_fraction: float = 1.0
    """Tensor-core throughput under :attr:`power_limit_w` over that at the TDP (1.0 uncapped;
    :func:`topologies.power.throughput_fraction`): what the device model multiplies into the
    peaks of compute-bound kernels. The peaks above stay the datasheet's, so MFU is against
    them."""

    @property
    def hbm_capacity_gib(self) -> float:
        return self.hbm_capacity_bytes / GiB


TFLOPS = 1e12

_FIELDS = ("peak_bf16_tflops", "peak_fp8_tflops", "hbm_gb", "hbm_tbps", "nvlink_gbps", "tdp_w",
           "source")
_REQUIRED = ("peak_bf16_tflops", "hbm_gb", "hbm_tbps", "nvlink_gbps", "source")


def load_gpus(text: str) -> dict[str, GPUSpec]:
    """The GPU presets of a ``gpus.toml`` text, in its order (ValueError naming the preset
    and the unknown or missing key): each table's datasheet units made SI, its memory what
    CUDA shows of it (:func:`cuda_visible`)."""
    gpus = {}
    for name, table in tomllib.loads(text).items():
        unknown = sorted(set(table) - set(_FIELDS))
        missing = [k for k in _REQUIRED if k not in table]
        if unknown or missing:
            raise ValueError(f"gpus.toml [{name}]: " + (f"unknown key {unknown[0]!r}" if unknown
                             else f"no {missing[0]}") + f" (keys: {', '.join(_FIELDS)})")
        fp8 = table.get("peak_fp8_tflops")
        gpus[name] = GPUSpec(name, table["peak_bf16_tflops"] * TFLOPS,
                             cuda_visible(table["hbm_gb"]), table["hbm_tbps"] * TB,
                             table["nvlink_gbps"] * GB, table["source"],
                             peak_fp8_flops=None if fp8 is None else fp8 * TFLOPS,
                             tdp_w=table.get("tdp_w"))
    return gpus


GPUS: dict[str, GPUSpec] = load_gpus(
    files("topologies").joinpath("gpus.toml").read_text(encoding="utf-8"))
"""GPU presets by name."""

DEFAULT_GPU = "A100-80GB"
"""The GPU of an explicit topology that names none."""

IDEAL_GPU = GPUSpec("ideal", float("inf"), float("inf"), float("inf"), float("inf"),
                    "infinitely fast, for schedule studies with the synthetic model")


def gpu_spec(name: str) -> GPUSpec:
    """Look up a GPU preset by name (case-insensitive); KeyError lists the choices."""
    for key, spec in GPUS.items():
        if key.lower() == name.lower():
            return spec
    raise KeyError(f"unknown GPU {name!r}; choose one of {', '.join(GPUS)}")
