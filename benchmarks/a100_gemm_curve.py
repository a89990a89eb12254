"""The A100's fitted GEMM shape curve against public cuBLAS measurements (issue 19 item 6).

    python benchmarks/a100_gemm_curve.py [--from 2048]

Prints, for the sizes of ``[A100.gemm_benchmark]`` (sim/profiles/ampere.toml: NVIDIA's cuBLAS
figure, m = n = k) and for the GEMMs of Korthikanti et al.'s 22B and 530B layers, the
throughput of the profile's curve (``[A100.fit]``, fitted on Hagemann et al.'s sweep) beside
the benchmark's, and the benchmark's own curve: 1/η(d) = (1 + d½/d)/η fitted by least squares
on the relative time error over the sizes from ``--from`` up, then its level set to random
inputs by H. He's 8192³ figure (``randn_8192_tflops``). That curve is a diagnostic, not the
model's: docs/accuracy.md ("Calibration across sources") records what holding it in
benchmarks/calibrate.py did to the validation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.calibration import A100_HAGEMANN  # noqa: E402
from sim.profiles import load  # noqa: E402

LAYERS = (  # (label, M tokens, K, N): Korthikanti et al. 2022 table 3, TP 8
    ("22B attention projection", 8192, 6144 // 8, 6144),
    ("22B QKV", 8192, 6144, 3 * 6144 // 8),
    ("22B MLP", 8192, 6144, 4 * 6144 // 8),
    ("530B MLP", 2048, 20480, 4 * 20480 // 8),
)


def fit_curve(size: np.ndarray, tflops: np.ndarray, peak: float) -> tuple[float, float]:
    """(η, d½) of 1/η(d) = (1 + d½/d)/η minimising Σ (t_curve(d)/t_measured(d) − 1)²."""
    eff = tflops / peak
    a, b = np.linalg.lstsq(np.stack([eff, eff / size], 1), np.ones_like(eff), rcond=None)[0]
    return 1 / a, b / a


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="lo", type=int, default=2048,
                    help="smallest size the benchmark curve is fitted on (default 2048)")
    args = ap.parse_args()
    bench = load("ampere")["A100"]["gemm_benchmark"]
    size = np.array(bench["size"], float)
    tflops = np.array(bench["bf16_tflops"], float)
    peak = float(bench["peak_tflops"])
    if len(size) != len(tflops):
        sys.exit("error: [A100.gemm_benchmark] size and bf16_tflops differ in length")
    use = size >= args.lo
    if use.sum() < 2:
        sys.exit(f"error: fewer than two benchmark sizes from {args.lo} up")
    eta, dh = fit_curve(size[use], tflops[use], peak)
    level = bench["randn_8192_tflops"] / (eta * 8192 / (8192 + dh) * peak)
    print(f"benchmark curve on {int(use.sum())} sizes >= {args.lo}: eta {eta:.4f}, "
          f"d_half {dh:.0f}; at random inputs (x{level:.3f}): eta {eta * level:.4f}")
    fitted = A100_HAGEMANN

    def row(label: str, d: float, measured: str) -> None:
        f = fitted.gemm_efficiency_at(d) * peak
        b = eta * level * d / (d + dh) * peak
        print(f"{label:28s} d {d:6.0f}  {measured:>10s}  fit {f:5.0f} ({f / peak:4.0%})  "
              f"benchmark curve {b:5.0f} ({b / peak:4.0%})")

    for d, t in zip(size, tflops, strict=True):
        row(f"m=n=k {d:.0f}", d, f"{t:.0f} ({t / peak:.0%})")
    m, n, k = bench["mamf_shape_mnk"]
    row("MAMF best shape", (m * n * k) ** (1 / 3), f"{bench['mamf_tflops']:.0f}")
    for label, m, k, n in LAYERS:
        row(label, (m * k * n) ** (1 / 3), "-")


if __name__ == "__main__":
    main()
