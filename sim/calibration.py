"""Calibrated device profiles, with what was fitted, on which rows, by which command.

The constants are few and physical (achievable fractions of peak per kernel
class; memory the framework holds outside tensors) and shared by every row.
They were fitted by ``benchmarks/calibrate.py`` against Hagemann et al. 2023's
measured sweep (``../shared/data/hagemann2023_sweep.csv``, A100-80GB, NCCL's
link efficiencies fixed from nccl-tests reports in ``topologies/presets.py``);
no per-row factor exists anywhere. Efficiencies are bounded to physical ranges
in the fit; FlashAttention-2 (0.80) and batched-matmul attention (0.85) sit at
their upper bounds in the all-runs fit.
"""

from __future__ import annotations

from sim.device import DeviceProfile

GiB = 2**30
MEMORY_RESERVED_GIB = 2.5
"""Fitted: CUDA context, NCCL and cuBLAS workspaces outside tracked tensors."""
MEMORY_FRAGMENTATION = 0.11
"""Fitted: allocator overhead as a fraction of tracked tensor memory."""

_TIME_FIT = (
    "benchmarks/calibrate.py --cache ({date}): bounded least squares on the relative "
    "step-time error of {rows}, linearised around the defaults by finite differences"
)
_MEMORY_FIT = "reserved bytes and fragmentation: grid search on the OOM labels of all 964 runs"

def _fitted(x: tuple[float, ...], rows: str, date: str = "2026-12-02") -> DeviceProfile:
    """A profile from the fit's x = (1/η_gemm, d½/η_gemm, 1/η_flash2, 1/η_flash1, 1/η_bmm,
    1/η_elementwise), as benchmarks/calibrate.py prints it."""
    return DeviceProfile(
        gemm_efficiency=1 / x[0],
        gemm_half_dim=x[1] / x[0],
        flash2_efficiency=1 / x[2],
        flash1_efficiency=1 / x[3],
        bmm_attention_efficiency=1 / x[4],
        hbm_efficiency=0.85,
        elementwise_efficiency=1 / x[5],
        reserved_bytes=MEMORY_RESERVED_GIB * GiB,
        fragmentation=MEMORY_FRAGMENTATION,
        source=_TIME_FIT.format(rows=rows, date=date) + "; " + _MEMORY_FIT,
    )


A100_HAGEMANN = _fitted((1.2028, 714.6956, 1.25, 3.1509, 1.1765, 2.1087),
                        "all 401 successful runs")
"""A100-80GB profile fitted on the whole sweep: the default for every GPU (see default_profile)."""

A100_HAGEMANN_13B = _fitted((1.2904, 436.6276, 1.815, 3.6011, 1.6657, 1.9128),
                            "the 165 successful LLaMA-13B runs only", "2026-12-03")
"""The same fit restricted to the LLaMA-13B rows, for cross-validation on 30B and 65B.
Refitted on 2026-12-03 after ring collectives gained NCCL-like channels; the
all-runs refit of that day (MAPE 6.01%) did not beat A100_HAGEMANN (5.94%), so
that one is kept."""


def default_profile(gpu_name: str) -> DeviceProfile:
    """The profile ``sim run`` uses: the A100 fit, for every GPU.

    Only A100 measurements were available to fit; for other GPUs the same
    fractions of their own peaks are assumed (unverified).
    """
    return A100_HAGEMANN
