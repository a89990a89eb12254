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
rest is the driver's. Measured on the A100-80GB, whose capacity it is. A preset with its own
measurement (``cuda_total_gib`` in ``gpus.toml``, with its source) takes that instead; on the
presets without one the same fraction is assumed (unverified for them: H100-PCIe, H800,
H100-96GB, GB200). The measured ones show it is only roughly right: 79.11 of 80 on the H100
SXM, 39.39 of 40 on the A100-40GB, 14.75 of 16 on the T4, 191.98 of 192 on the MI300X."""


def cuda_visible(vendor_gb: float) -> float:
    """Bytes CUDA exposes on a GPU sold as ``vendor_gb`` "GB" of HBM: that many GiB (HBM
    stacks come in binary sizes) times :data:`CUDA_VISIBLE_FRACTION`. The estimate for a
    preset with no measured ``cuda_total_gib``."""
    return vendor_gb * GiB * CUDA_VISIBLE_FRACTION


def hbm_capacity(table: dict) -> float:
    """Bytes CUDA gives the framework on one ``gpus.toml`` preset: its measured
    ``cuda_total_gib`` (the "total capacity" PyTorch's out-of-memory message or
    ``cudaDeviceProp.totalGlobalMem`` reports on that GPU model, ``cuda_total_source``) where
    there is one, else :func:`cuda_visible` of its ``hbm_gb``."""
    measured = table.get("cuda_total_gib")
    return cuda_visible(table["hbm_gb"]) if measured is None else measured * GiB


@dataclass(frozen=True)
class GPUSpec:
    """Peak capabilities of one GPU model."""

    name: str
    """Preset name, e.g. ``A100-80GB``."""
    peak_bf16_flops: float
    """Dense BF16 tensor-core peak, FLOP/s."""
    hbm_capacity_bytes: float
    """Bytes of device memory CUDA gives the framework (``cudaDeviceProp.totalGlobalMem``,
    what PyTorch's out-of-memory message calls "total capacity"): the preset's measured
    ``cuda_total_gib`` where ``gpus.toml`` has one (A100-40GB, H100, H200, B200, MI300X,
    H100-NVL, T4, each with its ``cuda_total_source``), else :func:`cuda_visible` of its
    vendor figure (the A100-80GB's own measurement; an unverified estimate on the rest).
    Power caps and speed variants (:func:`topologies.power.capped`,
    :mod:`topologies.variability`) copy it unchanged."""
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
           "source", "cuda_total_gib", "cuda_total_source")
_REQUIRED = ("peak_bf16_tflops", "hbm_gb", "hbm_tbps", "nvlink_gbps", "source")


def load_gpus(text: str) -> dict[str, GPUSpec]:
    """The GPU presets of a ``gpus.toml`` text, in its order (ValueError naming the preset
    and the unknown or missing key): each table's datasheet units made SI, its memory what
    CUDA shows of it (:func:`hbm_capacity`: measured where the table says, with its source)."""
    gpus = {}
    for name, table in tomllib.loads(text).items():
        unknown = sorted(set(table) - set(_FIELDS))
        missing = [k for k in _REQUIRED if k not in table]
        if unknown or missing:
            raise ValueError(f"gpus.toml [{name}]: " + (f"unknown key {unknown[0]!r}" if unknown
                             else f"no {missing[0]}") + f" (keys: {', '.join(_FIELDS)})")
        if ("cuda_total_gib" in table) != ("cuda_total_source" in table):
            raise ValueError(f"gpus.toml [{name}]: cuda_total_gib and cuda_total_source go "
                             "together (a measured capacity names where it was measured)")
        fp8 = table.get("peak_fp8_tflops")
        gpus[name] = GPUSpec(name, table["peak_bf16_tflops"] * TFLOPS,
                             hbm_capacity(table), table["hbm_tbps"] * TB,
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
