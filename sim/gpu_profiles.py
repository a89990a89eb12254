"""Device profiles for GPUs other than the A100, carried over from the A100 fit by published ratios.

The only end-to-end fit the project has is on A100-80GB (:data:`sim.calibration.A100_HAGEMANN`,
Hagemann et al. 2023's sweep). Its efficiencies are *effective* fractions of the roofline
(they absorb the framework's launch gaps, the eager kernels' overheads and the fit's shape
curve), not raw kernel benchmarks: as fitted on 2026-12-03, η_gemm = 0.90 with d½ ≈ 2300
gives 0.71 on an 8k GEMM, below the 0.87 cuBLAS reaches on its best shape. Replacing a fitted
A100 number by an absolute H100 kernel benchmark would mix the two kinds, so each other GPU's
profile is the A100 fit with each kernel class's fraction multiplied by a *ratio*:

    η_X(class) = η_A100-fit(class) · (benchmark fraction of peak on X) / (same benchmark on A100),

both fractions from one benchmark (matmul) or one kernel's authors (FlashAttention), so that
their methodology's biases largely cancel.
Where no benchmark of a kernel class on X is public, :func:`profile_for` applies one
conservative rule, stated in :data:`INFERRED_RULE`, and :class:`KernelRatios` says which
ratios were measured and which inferred.

Sources (fractions of the dense BF16 peak of :mod:`topologies.hardware`):

- GEMM: Bekman, *Machine Learning Engineering*, "Maximum Achievable Matmul FLOPS
  comparison table" (github.com/stas00/ml-engineering, compute/accelerator/README.md,
  table as of 2025): the best mean BF16 ``torch.matmul`` throughput found by a brute-force
  search over shapes (``mamf-finder.py``, 100 iterations after 50 warm-up). A100 SXM 271.2
  of 312 TFLOP/s (86.9%), H100 SXM 794.5 of 989 (80.3%, "H200 is the same"), B200 SXM
  1745.0 of 2250 (77.6%), GB200 1822.0 of 2500 (72.9%), MI300X 668.4 of 1300 (51.4%,
  ROCm 6.3 with TunableOp).
- FlashAttention-2: the best utilisation its authors report on each GPU. Dao 2023
  ("FlashAttention-2", arXiv 2307.08691, abstract): 50-73% of the theoretical maximum on
  A100; Shah et al. 2024 ("FlashAttention-3", arXiv 2407.08608, abstract): "FlashAttention-2
  achieving only 35% utilization on the H100 GPU" (FA2 uses no Hopper-specific instruction:
  no TMA, no wgmma; Dao 2023, sec. 4.1, measures it at up to 335 TFLOP/s, 34%, on H100
  SXM5), against 75% (740 TFLOP/s forward) for FA3.

Checked against published whole runs on H100 (BF16 MFU, ``tests/test_gpu_profiles.py``):
Llama 3 405B (Dubey et al. 2024, table 4; TP8 PP16, sequence 8192, interleaved with two
stages per rank) 46.1% predicted vs 43% on 8,192 GPUs, 38.8% vs 41% on 16,384, 38.6% vs 38%
with CP16 at sequence 131,072 (128 sequences); llm-foundry's MPT 1B-70B FSDP rows 42-52% vs
38-46% (0% to 19% high). These are with the A100 fit on two-NIC servers (sim.calibration);
the fit on eight-NIC servers, 3.5% slower GEMMs, gave 44.6%, 37.5% and 38.1%, MPT 3% low to
14% high. With the steeper A100 shape curve tried on 2026-12-03 (1/η = (1 + (d₂/d)³)/η,
sim.calibration) and that fit, Llama 3 would be 43.5% and 36.6%, MPT 3% low to 11% high.
Kept from the A100 fit and not measured on other GPUs: the GEMM shape curve (d½, d₂, p),
no public H100 matmul-versus-size table giving it (doubling d½ would fit llm-foundry's H100
rows but put Llama 3 at 34% and 41%).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.device import DeviceProfile

A100_MATMUL_FRACTION = 271.2 / 312
"""Bekman's MAMF table: A100 SXM, BF16 matmul, 271.2 of 312 TFLOP/s (torch 2.6, CUDA 12.6)."""
A100_FLASH2_FRACTION = 0.73
"""Dao 2023 (FlashAttention-2), abstract: up to 73% of the theoretical maximum FLOP/s on A100."""
H100_FLASH2_FRACTION = 0.35
"""Shah et al. 2024 (FlashAttention-3), abstract: FA2 reaches only 35% utilisation on H100
(Dao 2023, sec. 4.1: up to 335 of 989 TFLOP/s, 34%)."""
FLASH3_OVER_FLASH2_H100 = 1.5
"""Shah et al. 2024 (FlashAttention-3), abstract: FA3 is 1.5-2.0x faster than FA2 on H100 in
BF16 (up to 740 TFLOP/s, 75% of peak, forward). The low end is taken: the backward pass
gains less than the forward, and the rule for unmeasured classes is the conservative one."""

INFERRED_RULE = (
    "no GPU is assumed to reach a higher fraction of its own peak in a kernel class than the "
    "last earlier generation measured in that class (the H100 for NVIDIA and AMD data-centre "
    "parts): measured fractions of peak fall with each generation (A100 86.9%, H100 80.3%, "
    "B200 77.6%, GB200 72.9% for BF16 matmul), so the earlier generation's ratio is an upper "
    "bound; memory-bound classes (HBM streaming, eager element-wise kernels), the GEMM shape "
    "curve's dimensions and power and the framework's memory overheads keep the A100 fit's values"
)
"""The one rule for a kernel class without a public benchmark on a GPU."""


@dataclass(frozen=True)
class KernelRatios:
    """Multipliers on the A100 fit's efficiencies for one GPU type, with their provenance."""

    gemm: float
    """η_gemm(X) / η_gemm(A100): ratio of the two GPUs' measured matmul fractions of peak."""
    flash2: float
    """η_flash2(X) / η_flash2(A100)."""
    flash1: float
    """η_flash1(X) / η_flash1(A100)."""
    bmm_attention: float
    """η_bmm(X) / η_bmm(A100): batched cuBLAS matmuls of non-flash attention."""
    measured: tuple[str, ...]
    """The kernel classes whose ratio comes from a benchmark on this GPU."""
    inferred: tuple[str, ...]
    """The kernel classes whose ratio follows :data:`INFERRED_RULE`."""
    source: str
    """What was measured, by whom."""
    flash3: float | None = None
    """η_flash3(X) / η_flash2(A100) (there is no FA3 on A100, so it is scaled from the A100
    fit's FA2); None where FlashAttention-3 does not run (it needs Hopper: H100, H200)."""


_H100_GEMM = (794.5 / 989) / A100_MATMUL_FRACTION
_H100_FLASH2 = H100_FLASH2_FRACTION / A100_FLASH2_FRACTION
_MEMORY_BOUND = ("hbm", "elementwise", "memory")


def _later_generation(matmul_fraction: float, source: str) -> KernelRatios:
    """A GPU with a measured matmul fraction and no public attention-kernel benchmark: GEMM
    and batched-matmul ratios measured, flash ratios capped by the H100's (INFERRED_RULE)."""
    gemm = matmul_fraction / A100_MATMUL_FRACTION
    flash = min(gemm, _H100_FLASH2)
    return KernelRatios(gemm=gemm, flash2=flash, flash1=flash, bmm_attention=gemm,
                        measured=("gemm", "bmm_attention"),
                        inferred=("flash2", "flash1", *_MEMORY_BOUND), source=source)


H100_RATIOS = KernelRatios(
    gemm=_H100_GEMM, flash2=_H100_FLASH2, flash1=_H100_FLASH2, bmm_attention=_H100_GEMM,
    flash3=_H100_FLASH2 * FLASH3_OVER_FLASH2_H100,
    measured=("gemm", "flash2", "flash3", "bmm_attention"),
    inferred=("flash1", *_MEMORY_BOUND),
    source=("BF16 matmul 80.3% of peak vs A100's 86.9% (Bekman MAMF table); FlashAttention-2 "
            "35% of peak on H100 (Shah et al. 2024) vs up to 73% on A100 (Dao 2023). FA1 "
            "inferred: same ratio as FA2 (both use Ampere mma.sync, no wgmma/TMA). "
            "FlashAttention-3 1.5-2.0x FA2 on H100 (Shah et al. 2024), the low end taken."),
)
"""H100 SXM: matmul, FlashAttention-2 and -3 measured on H100; FA1 takes FA2's ratio
(inferred)."""

H200_RATIOS = replace(
    H100_RATIOS,
    measured=("gemm", "bmm_attention"),
    inferred=("flash2", "flash1", "flash3", *_MEMORY_BOUND),
    source=("the H100's ratios: same GH100 die, SMs and clocks; Bekman's MAMF table notes "
            "\"H200 is the same\" as H100 SXM for BF16 matmul. Attention kernels inferred "
            "(compute-bound, so the larger HBM does not change their fraction of peak)."),
)
"""H200: the H100's compute with HBM3e; only its peaks (topologies.hardware) differ."""

B200_RATIOS = _later_generation(
    1745.0 / 2250,
    "BF16 matmul 77.6% of peak (Bekman MAMF table, torch 2.7.1, CUDA 12.8); no public FA2 "
    "benchmark on B200: flash ratios capped by the H100's (INFERRED_RULE)")
"""B200: matmul measured; attention inferred (conservative cap at the H100 ratio)."""

GB200_RATIOS = _later_generation(
    1822.0 / 2500,
    "BF16 matmul 72.9% of peak (Bekman MAMF table, torch 2.10 nightly, CUDA 13.0); no public "
    "FA2 benchmark on GB200: flash ratios capped by the H100's (INFERRED_RULE)")
"""GB200 (Blackwell in an NVL72 rack): matmul measured; attention inferred."""

MI300X_RATIOS = _later_generation(
    668.4 / 1300,
    "BF16 matmul 51.4% of 1300 TFLOP/s (Bekman MAMF table, ROCm 6.3, TunableOp on); no "
    "comparable public FA2 benchmark: flash ratios capped by the H100's (INFERRED_RULE)")
"""MI300X: matmul measured (with ROCm 6.3); attention inferred."""

RATIOS: dict[str, KernelRatios] = {
    "H100": H100_RATIOS,
    "H200": H200_RATIOS,
    "B200": B200_RATIOS,
    "GB200": GB200_RATIOS,
    "MI300X": MI300X_RATIOS,
}
"""Ratios by GPU preset name (topologies.hardware.GPUS); A100s and unknown GPUs have none."""


def canonical_name(gpu_name: str) -> str | None:
    """The preset name in :data:`RATIOS` that ``gpu_name`` spells (case-insensitive), or None."""
    for name in RATIOS:
        if name.lower() == gpu_name.lower():
            return name
    return None


def ratios_for(gpu_name: str) -> KernelRatios | None:
    """The ratios of a GPU preset (case-insensitive), or None for A100s and other GPUs."""
    name = canonical_name(gpu_name)
    return None if name is None else RATIOS[name]


def scaled_profile(base: DeviceProfile, ratios: KernelRatios, gpu_name: str) -> DeviceProfile:
    """``base`` (the A100 fit) with its compute efficiencies multiplied by ``ratios``.

    The shape curve (d½, d₂, p), the memory-bound efficiencies and the memory overheads
    are kept (:data:`INFERRED_RULE`); ``source`` records the derivation.
    """
    return replace(
        base,
        gemm_efficiency=base.gemm_efficiency * ratios.gemm,
        flash2_efficiency=base.flash2_efficiency * ratios.flash2,
        flash1_efficiency=base.flash1_efficiency * ratios.flash1,
        bmm_attention_efficiency=base.bmm_attention_efficiency * ratios.bmm_attention,
        flash3_efficiency=(None if ratios.flash3 is None
                           else base.flash2_efficiency * ratios.flash3),
        source=(f"{gpu_name}: A100 fit x published ratios (sim.gpu_profiles); measured on "
                f"{gpu_name}: {', '.join(ratios.measured)}; inferred: "
                f"{', '.join(ratios.inferred)}. {ratios.source}. A100 fit: {base.source}"),
    )


def profile_for(gpu_name: str, base: DeviceProfile) -> DeviceProfile:
    """The profile of ``gpu_name``: ``base`` itself for A100s and GPUs without ratios, else
    :func:`scaled_profile`."""
    name = canonical_name(gpu_name)
    return base if name is None else scaled_profile(base, RATIOS[name], name)
