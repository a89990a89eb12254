"""Device profiles for GPUs other than the A100, carried over from the A100 fit by published ratios.

The only end-to-end fit the project has is on A100-80GB (:data:`sim.calibration.A100_HAGEMANN`,
Hagemann et al. 2023's sweep). Its efficiencies are *effective* fractions of the roofline
(they absorb the framework's launch gaps, the eager kernels' overheads and the fit's shape
curve), not raw kernel benchmarks: the fit of 2026-12-06, η_gemm = 0.897 with d½ = 1313,
gives 0.77 on an 8k GEMM, below the 0.87 cuBLAS reaches on its best shape. Replacing a fitted
A100 number by an absolute H100 kernel benchmark would mix the two kinds, so each other GPU's
profile is the A100 fit with each kernel class's fraction multiplied by a *ratio*:

    η_X(class) = η_A100-fit(class) · (benchmark fraction of peak on X) / (same benchmark on A100),

both fractions from one benchmark (matmul) or one kernel's authors (FlashAttention), so that
their methodology's biases largely cancel.
Where no benchmark of a kernel class on X is public, :func:`profile_for` applies one
conservative rule, stated in :data:`INFERRED_RULE`, and :class:`KernelRatios` says which
ratios were measured and which inferred.

Sources: each number sits beside its source in the data files of :mod:`sim.profiles`, one
per GPU generation. FP8 GEMMs: their fraction of the FP8 peak as a ratio to the BF16 GEMMs'
fraction of the BF16 peak, from Transformer Engine's GEMM benchmark on the GH100 die
(:attr:`KernelRatios.fp8_gemm`). GEMM: Bekman's table of the maximum achievable BF16 matmul
throughput (a fraction of the peak the table states, which for the MI300X is 1300 TFLOP/s
against the datasheet's 1,307 in :mod:`topologies.hardware`; ``cdna3.toml``). FlashAttention-2:
the best utilisation its authors report on each GPU (Dao 2023 on A100, Shah et al. 2024 on H100);
FlashAttention-3 and cuDNN's fused attention (what Transformer Engine runs on Hopper) on H100
as multiples of FA2 (Shah et al. 2024).

Checked against published whole runs on H100 (BF16 MFU, ``tests/test_gpu_profiles.py``):
Llama 3 405B (Dubey et al. 2024, table 4; TP8 PP16, sequence 8192, interleaved with two
stages per rank) 46.1% predicted vs 43% on 8,192 GPUs, 38.8% vs 41% on 16,384, 38.6% vs 38%
with CP16 at sequence 131,072 (128 sequences); llm-foundry's MPT 1B-70B FSDP rows 42-52% vs
38-46% (0% to 19% high). These are with the A100 fit on two-NIC servers (sim.calibration);
the fit on eight-NIC servers, 3.5% slower GEMMs, gave 44.6%, 37.5% and 38.1%, MPT 3% low to
14% high. With the steeper A100 shape curve tried on 2026-12-03 (1/η = (1 + (d₂/d)³)/η,
sim.calibration) and that fit, Llama 3 would be 43.5% and 36.6%, MPT 3% low to 11% high.
Kept from the A100 fit: the GEMM shape curve (d½, d₂, p). The one public H100
matmul-versus-size table found, XLA's measured sm_90 GEMMs (``[H100.gemm_benchmark]``,
``hopper.toml``), as fractions of the H100's MAMF lies within 0.94-1.10 of NVIDIA's A100 cuBLAS
figure as fractions of the A100's at cube sides 1,024-6,502, without a trend
(``benchmarks/hopper_gemm_curve.py``): no basis for a Hopper d½ of its own (doubling d½ would fit
llm-foundry's H100 rows but put Llama 3 at 34% and 41%).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from sim.device import DeviceProfile
from sim.profiles import GENERATIONS, fraction, gpu_names, gpu_tables, tables

_A100 = tables("ampere")["A100"]
A100_MATMUL_FRACTION = fraction(_A100["matmul"])
"""The A100's BF16 matmul fraction of peak, the reference of every GEMM ratio (``ampere.toml``)."""
A100_FLASH2_FRACTION = _A100["flash2"]["fraction"]
"""FlashAttention-2's best fraction of peak on A100, the reference of every flash ratio."""

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
    cudnn: float | None = None
    """η_cudnn(X) / η_flash2(A100): cuDNN's fused attention, which Transformer Engine runs on
    Hopper; None where not measured (the kind is then timed as FlashAttention-2, which TE
    selects on other GPUs: :attr:`sim.device.DeviceProfile.cudnn_efficiency`)."""
    corpus_gemm_time: float = 1.0
    """A multiplier on every GEMM's time fitted jointly on the validation corpus's runs on this
    GPU generation (``[<GPU>.corpus_fit]`` of its data file, :func:`sim.loso.fit_generation`);
    1 where none was fitted."""
    fp8_gemm: float = 1.0
    """FP8 GEMMs' fraction of the FP8 peak over BF16 GEMMs' fraction of the BF16 peak
    (``[<GPU>.fp8_matmul]``, :func:`sim.experiment.fp8_speedup`); without a measurement the
    H100's (:data:`INFERRED_RULE`)."""


def _ratios(table: dict[str, Any], ratios: dict[str, KernelRatios]) -> KernelRatios:
    """A GPU's ratios from its table in :mod:`sim.profiles` (``ratios``: the GPUs' before it).

    ``same_as``: another GPU's ratios (the same die). A measured ``flash2`` (and ``flash3``):
    both flash ratios from it, FA1 taking FA2's. Without one, the flash ratios are the
    matmul ratio capped by the H100's (:data:`INFERRED_RULE`). Batched matmuls of non-flash
    attention take the matmul ratio. FP8 GEMMs: ``fp8_matmul``'s ratio, else the H100's."""
    tags = {"measured": tuple(table["measured"]), "inferred": tuple(table["inferred"]),
            "source": table["summary"]}
    if "same_as" in table:
        return replace(ratios[table["same_as"]], **tags)
    gemm = fraction(table["matmul"]) / A100_MATMUL_FRACTION
    fitted = table.get("corpus_fit", {}).get("gemm_time", 1.0)
    fp8 = (table["fp8_matmul"]["over_bf16"] if "fp8_matmul" in table
           else ratios["H100"].fp8_gemm)
    if "flash2" not in table:
        flash = min(gemm, ratios["H100"].flash2)
        return KernelRatios(gemm=gemm, flash2=flash, flash1=flash, bmm_attention=gemm,
                            corpus_gemm_time=fitted, fp8_gemm=fp8, **tags)
    flash2 = table["flash2"]["fraction"] / A100_FLASH2_FRACTION
    flash3 = flash2 * table["flash3"]["over_flash2"] if "flash3" in table else None
    cudnn = flash2 * table["cudnn"]["over_flash2"] if "cudnn" in table else None
    return KernelRatios(gemm=gemm, flash2=flash2, flash1=flash2, bmm_attention=gemm,
                        flash3=flash3, cudnn=cudnn, corpus_gemm_time=fitted, fp8_gemm=fp8,
                        **tags)


def _all_ratios() -> dict[str, KernelRatios]:
    out: dict[str, KernelRatios] = {}
    for name, table in gpu_tables().items():
        if name != "A100":  # the fit's own GPU
            out[name] = _ratios(table, out)
    return out


class _Ratios(Mapping[str, KernelRatios]):
    """:func:`_all_ratios`, made when a GPU's ratios are first read: the names (every GPU of
    the data files but the A100, in their order) are known from the files' table headers
    (:func:`sim.profiles.gpu_names`), so an A100 run, which asks only whether its GPU has
    ratios, parses no other generation's file."""

    def __init__(self) -> None:
        self._names = tuple(name for generation in GENERATIONS
                            for name in gpu_names(generation) if name != "A100")
        self._made: dict[str, KernelRatios] | None = None

    def _all(self) -> dict[str, KernelRatios]:
        if self._made is None:
            self._made = _all_ratios()
        return self._made

    def __getitem__(self, name: str) -> KernelRatios:
        if name not in self._names:
            raise KeyError(name)
        return self._all()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


RATIOS: Mapping[str, KernelRatios] = _Ratios()
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
    """``base`` (the A100 fit) with its compute efficiencies multiplied by ``ratios`` (the
    GEMM efficiency also divided by the corpus-fitted ``corpus_gemm_time``).

    The shape curve (d½, d₂, p), the memory-bound efficiencies and the memory overheads
    are kept (:data:`INFERRED_RULE`); ``source`` records the derivation.
    """
    return replace(
        base,
        gemm_efficiency=base.gemm_efficiency * ratios.gemm / ratios.corpus_gemm_time,
        flash2_efficiency=base.flash2_efficiency * ratios.flash2,
        flash1_efficiency=base.flash1_efficiency * ratios.flash1,
        bmm_attention_efficiency=base.bmm_attention_efficiency * ratios.bmm_attention,
        flash3_efficiency=(None if ratios.flash3 is None
                           else base.flash2_efficiency * ratios.flash3),
        cudnn_efficiency=(None if ratios.cudnn is None
                          else base.flash2_efficiency * ratios.cudnn),
        source=(f"{gpu_name}: A100 fit x published ratios (sim.gpu_profiles); measured on "
                f"{gpu_name}: {', '.join(ratios.measured)}; inferred: "
                f"{', '.join(ratios.inferred)}. {ratios.source}. "
                + (f"GEMM times x {ratios.corpus_gemm_time:g} fitted on the validation "
                   "corpus. " if ratios.corpus_gemm_time != 1.0 else "")
                + f"A100 fit: {base.source}"),
    )


@lru_cache(maxsize=256)
def generation_of(gpu_name: str) -> str | None:
    """The generation (data file of :mod:`sim.profiles`) whose tables hold ``gpu_name``
    (case-insensitive), or None (cached: sim.reserved asks it for every run)."""
    for generation in GENERATIONS:
        if any(name.lower() == gpu_name.lower() for name in gpu_names(generation)):
            return generation
    return None


def profile_for(gpu_name: str, base: DeviceProfile) -> DeviceProfile:
    """The profile of ``gpu_name``: ``base`` itself for A100s and GPUs without ratios, else
    :func:`scaled_profile`."""
    name = canonical_name(gpu_name)
    return base if name is None else scaled_profile(base, RATIOS[name], name)
