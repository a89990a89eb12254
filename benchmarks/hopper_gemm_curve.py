"""Does the A100 fit's GEMM shape curve belong on Hopper? (issue 19, item 6)

    python benchmarks/hopper_gemm_curve.py

Every H100 GEMM rate in the model is the A100 fit's curve, η(d) = η_gemm · d / (d + d½), with
η_gemm times Bekman's matmul ratio and d½ kept (:mod:`sim.gpu_profiles`). That holds if the two
GPUs' raw GEMM rates, each as a fraction of its own best (Bekman's MAMF, ``[<GPU>.matmul]``),
follow one curve in the cube side d. Prints, at the sizes of ``[H100.gemm_benchmark]``
(XLA's measured sm_90 table, random inputs), the H100's fraction of its MAMF beside the
A100's at the same cube side (``[A100.gemm_benchmark]``: NVIDIA's cuBLAS figure, m = n = k,
linearly interpolated, inputs not stated), the shipped curve's η(d)/η_gemm (the same for
both GPUs), and Transformer Engine's per-GEMM H200 rates (``[H100.fp8_matmul_benchmark]``,
BF16, cube sides 6.4k-10.2k). A diagnostic, not read by the model: docs/accuracy.md
("Does the A100 curve belong on Hopper?") records what it shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.calibration import A100_HAGEMANN  # noqa: E402
from sim.profiles import fraction, load  # noqa: E402


def h100_rows() -> list[tuple[float, float]]:
    """(cube side, fraction of the H100's MAMF) of ``[H100.gemm_benchmark]``."""
    hopper = load("hopper")["H100"]
    bench, mamf = hopper["gemm_benchmark"], hopper["matmul"]["achieved_tflops"]
    return [(round(float(b * m * n * k) ** (1 / 3), 6), t / mamf)
            for b, m, n, k, t in zip(bench["batch"], bench["m"], bench["n"], bench["k"],
                                     bench["bf16_tflops"], strict=True)]


def a100_at(d: float) -> float | None:
    """The A100's cuBLAS figure at cube side ``d`` as a fraction of its MAMF (linear between
    the recorded sizes; None outside them)."""
    ampere = load("ampere")["A100"]
    bench = ampere["gemm_benchmark"]
    size = np.array(bench["size"], float)
    if not size[0] <= d <= size[-1]:
        return None
    return float(np.interp(d, size, np.array(bench["bf16_tflops"], float))) / \
        ampere["matmul"]["achieved_tflops"]


def te_h200_rows() -> list[tuple[str, float, float]]:
    """(GEMM, cube side, BF16 TFLOP/s over its forward, data- and weight-gradient GEMMs) of
    Transformer Engine's H200 NVL breakdown, read off its figure's pixels."""
    t = load("hopper")["H100"]["fp8_matmul_benchmark"]
    out = []
    for i, name in enumerate(t["gemm"]):
        m, k, n = t["m"][i], t["k"][i], t["n"][i]
        ms = (t["bf16_fprop_dgrad_px"][i] + t["bf16_wgrad_px"][i]) / t["px_per_ms"]
        out.append((name, float(m * k * n) ** (1 / 3), 3 * 2.0 * m * k * n / (ms * 1e-3) / 1e12))
    return out


def main() -> None:
    p = A100_HAGEMANN
    ratio = fraction(load("hopper")["H100"]["matmul"]) / fraction(load("ampere")["A100"]["matmul"])
    print(f"shipped curve: eta_gemm {p.gemm_efficiency:.3f}, d_half {p.gemm_half_dim:.0f}; "
          f"H100 level x{ratio:.3f} (MAMF ratio), shape kept")
    print(f"{'cube side':>9s}  {'H100/MAMF':>9s}  {'A100/MAMF':>9s}  {'H100/A100':>9s}  "
          f"{'curve eta(d)/eta':>16s}")
    for d, h in h100_rows():
        a = a100_at(d)
        curve = p.gemm_efficiency_at(d) / p.gemm_efficiency
        pair = f"{a:9.3f}  {h / a:9.3f}" if a is not None else f"{'-':>9s}  {'-':>9s}"
        print(f"{d:9.0f}  {h:9.3f}  {pair}  {curve:16.3f}")
    print("Transformer Engine, H200 NVL, BF16 (fprop + dgrad + wgrad):")
    for name, d, tf in te_h200_rows():
        curve = p.gemm_efficiency_at(d) / p.gemm_efficiency
        print(f"  {name:9s} cube side {d:6.0f}  {tf:5.0f} TFLOP/s  curve eta(d)/eta {curve:.3f}")


if __name__ == "__main__":
    main()
