"""GPU specifications: peaks only. Efficiencies live in the device model, not here.

All values are vendor datasheet numbers (dense BF16, no sparsity), collected in
REFERENCES.md ("Hardware"). Bandwidths are bytes per second; NVLink figures are
per direction (the datasheets quote both directions summed).
"""

from __future__ import annotations

from dataclasses import dataclass

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


GPUS: dict[str, GPUSpec] = {
    spec.name: spec
    for spec in (
        GPUSpec("A100-40GB", 312e12, cuda_visible(40), 1.555 * TB, 300 * GB,
                "NVIDIA A100 datasheet (2021): 312 TFLOPS BF16, 40GB HBM2 1,555 GB/s, "
                "NVLink3 600 GB/s total; SXM4 400 W TDP", tdp_w=400.0),
        GPUSpec("A100-80GB", 312e12, cuda_visible(80), 2.039 * TB, 300 * GB,
                "NVIDIA A100 datasheet (2021): 312 TFLOPS BF16, 80GB HBM2e 2,039 GB/s, "
                "NVLink3 600 GB/s total; SXM4 400 W TDP", tdp_w=400.0),
        GPUSpec("H100", 989e12, cuda_visible(80), 3.35 * TB, 450 * GB,
                "NVIDIA H100 SXM datasheet (2023): 989 TFLOPS dense BF16, 80GB HBM3 "
                "3.35 TB/s, NVLink4 900 GB/s total, 1,979 TFLOPS dense FP8, max TDP up to 700 W",
                peak_fp8_flops=1979e12, tdp_w=700.0),
        GPUSpec("H200", 989e12, cuda_visible(141), 4.8 * TB, 450 * GB,
                "NVIDIA H200 SXM datasheet (2024): 989 TFLOPS dense BF16, 141GB HBM3e "
                "4.8 TB/s, NVLink4 900 GB/s total, 1,979 TFLOPS dense FP8, max TDP up to 700 W",
                peak_fp8_flops=1979e12, tdp_w=700.0),
        GPUSpec("B200", 2250e12, cuda_visible(180), 8.0 * TB, 900 * GB,
                "NVIDIA DGX B200 / HGX B200 spec (2024): 2.25 PFLOPS dense BF16, 180GB HBM3e "
                "8 TB/s, NVLink5 1.8 TB/s total, 4.5 PFLOPS dense FP8; HGX B200 1,000 W per GPU",
                peak_fp8_flops=4500e12, tdp_w=1000.0),
        GPUSpec("GB200", 2500e12, cuda_visible(186), 8.0 * TB, 900 * GB,
                "NVIDIA GB200 NVL72 (2024): Blackwell GPU at 1.2 kW, 2.5 PFLOPS dense BF16, "
                "13.4 TB HBM3e per 72 GPUs (~186 GB each, unverified split), 8 TB/s, "
                "NVLink5 1.8 TB/s total, 5 PFLOPS dense FP8", peak_fp8_flops=5000e12, tdp_w=1200.0),
        GPUSpec("MI300X", 1307e12, cuda_visible(192), 5.3 * TB, 448 * GB,
                "AMD Instinct MI300X datasheet (2023): 1,307 TFLOPS dense BF16, 192GB HBM3 "
                "5.3 TB/s; Infinity Fabric 896 GB/s aggregate (unverified per-direction split); "
                "2,615 TFLOPS dense FP8; 750 W peak board power", peak_fp8_flops=2615e12,
                tdp_w=750.0),
        GPUSpec("H100-PCIe", 756e12, cuda_visible(80), 2.0 * TB, 300 * GB,
                "NVIDIA H100 datasheet (2023), PCIe column: 1,513 TFLOPS BF16 and 3,026 FP8 "
                "with sparsity (half dense), 80GB HBM2e 2 TB/s, 350 W, NVLink bridge 600 GB/s "
                "total between pairs of cards", peak_fp8_flops=1513e12, tdp_w=350.0),
        GPUSpec("H100-NVL", 835e12, cuda_visible(94), 3.9 * TB, 300 * GB,
                "NVIDIA H100 datasheet (2024), H100 NVL column: 1,671 TFLOPS BF16 and 3,341 FP8 "
                "with sparsity (half dense), 94GB HBM3 3.9 TB/s, 350-400 W, NVLink bridge "
                "600 GB/s total between pairs of cards", peak_fp8_flops=1670e12, tdp_w=400.0),
        GPUSpec("H800", 989e12, cuda_visible(80), 3.35 * TB, 200 * GB,
                "NVIDIA H800 SXM5 (2023, the export variant): the H100 SXM's tensor cores "
                "(989 TFLOPS dense BF16, 1,979 FP8) and 80GB HBM3 3.35 TB/s, NVLink cut to "
                "400 GB/s total (DeepSeek-AI 2024, DeepSeek-V3 report sec. 3.2.1: H800 NVLink "
                "160 GB/s achieved, IB 50 GB/s); the H100 SXM's 700 W", peak_fp8_flops=1979e12,
                tdp_w=700.0),
        GPUSpec("H100-96GB", 989e12, cuda_visible(96), 2.4 * TB, 450 * GB,
                "H100 SXM with 96 GB of HBM2e at 2.4 TB/s, as Meta's Grand Teton hosts carry it "
                "(pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md: \"96GB HBM2e "
                "with 2.4 TB/sec peak memory bandwidth\", run at a 500 W power limit); the H100 "
                "SXM's tensor cores and NVLink 4; 700 W TDP (the same benchmark: \"tuning it up to "
                "700W TDP\")", peak_fp8_flops=1979e12, tdp_w=700.0),
        GPUSpec("T4", 65e12, cuda_visible(16), 320 * GB, 16 * GB,
                "NVIDIA T4 datasheet (2018): 65 TFLOPS mixed-precision FP16 tensor (Turing has "
                "no BF16; its FP16 peak stands in), 16GB GDDR6 320 GB/s, no NVLink: PCIe Gen3 "
                "x16, 16 GB/s per direction; the preemptible GPUs of SWARM (Ryabinin et al. "
                "2023); 70 W", tdp_w=70.0),
    )
}
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
