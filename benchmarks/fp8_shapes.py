"""Does the FP8/BF16 GEMM speed-up fall with GEMM shape? Transformer Engine's per-GEMM readings.

    python benchmarks/fp8_shapes.py

The simulator runs an FP8 GEMM at one multiple of the BF16 rate at every shape
(:func:`sim.experiment.fp8_speedup`: 1979/989 x 0.952 = 1.90 on Hopper, ``[H100.fp8_matmul]`` in
sim/profiles/hopper.toml): :func:`workloads.kernels.on_fp8` divides a GEMM's FLOPs and keeps its
shape, so the BF16 shape curve's costs shrink with it. This prints, per linear of Transformer
Engine's 5B worked example on an H200 NVL (``[H100.fp8_matmul_benchmark]``, read off the
figure), the BF16 and FP8 kernel times of its three GEMMs, their ratio with the figure's
one-row reading error, and the GEMM's cube side d = (M*K*N)^(1/3); beside it, what the ratio
would be if FP8 sped up only the shape-free part of the BF16 time (the H100 curve's
1/eta(d) = (1 + d_half/d + (d2/d)^p) / eta_gemm with its shape terms left at BF16 speed). Then
the cube sides of the per-GPU GEMMs of the corpus's FP8 runs (after TP), against the
benchmark's range. Nothing here is read by the simulator (docs/accuracy.md, known gaps).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.calibration import default_profile  # noqa: E402
from sim.experiment import gpu_fp8_speedup  # noqa: E402
from sim.profiles import load  # noqa: E402
from topologies.hardware import GPUS  # noqa: E402

READ_ERROR_ROWS = 1
"""A bar segment's height is good to about a pixel row at each end (the table's source)."""

CORPUS_GEMMS = {
    # per-GPU forward GEMMs, M (tokens of a micro-batch, the full sequence under sequence
    # parallelism) x K x N, from the models' configs and the rows' layouts
    "GPT-3 175B, TP4, seq 2048 (MLPerf v3.0/v3.1, NeMo 24.12)": {
        "qkv": (2048, 12288, 9216), "proj": (2048, 3072, 12288),
        "fc1": (2048, 12288, 12288), "fc2": (2048, 12288, 12288)},
    "Llama 3 70B, TP4, seq 8192 (NeMo 24.12)": {
        "qkv": (8192, 8192, 2560), "proj": (8192, 2048, 8192),
        "fc1": (8192, 8192, 14336), "fc2": (8192, 7168, 8192)},
    "Llama 3 8B, TP1, 2 x 8192 tokens (torchtitan Float8)": {
        "qkv": (16384, 4096, 6144), "proj": (16384, 4096, 4096),
        "fc1": (16384, 4096, 28672), "fc2": (16384, 14336, 4096)},
    "Llama 3 70B, TP8, 16 x 8192 tokens (torchtitan Float8)": {
        "qkv": (131072, 8192, 1280), "proj": (131072, 1024, 8192),
        "fc1": (131072, 8192, 7168), "fc2": (131072, 3584, 8192)},
    "Llama 3 405B, TP8, 4 x 8192 tokens (torchtitan Float8)": {
        "qkv": (32768, 16384, 2304), "proj": (32768, 2048, 16384),
        "fc1": (32768, 16384, 13312), "fc2": (32768, 6656, 16384)},
}


def cube_side(m: float, k: float, n: float) -> float:
    """The side of the cube of a GEMM's work, the shape curve's d (:mod:`sim.device`)."""
    return (m * k * n) ** (1 / 3)


def shipped_speedup() -> float:
    """The FP8 over BF16 GEMM rate the H100 runs at (:func:`sim.experiment.fp8_speedup`)."""
    return gpu_fp8_speedup(GPUS["H100"])


def shape_cost(d: float) -> float:
    """The H100 curve's shape terms at d: eta_gemm / eta(d) - 1."""
    p = default_profile("H100")
    return p.gemm_efficiency / p.gemm_efficiency_at(d) - 1


def unshrunk_ratio(d: float, speedup: float) -> float:
    """BF16 over FP8 time if FP8 ran the shape-free work ``speedup`` times faster and the
    shape terms at BF16 speed."""
    s = shape_cost(d)
    return (1 + s) / (1 / speedup + s)


def readings() -> list[dict[str, float | str]]:
    """One row per linear: the figure's BF16 and FP8 times of its three GEMMs and their ratio."""
    t = load("hopper")["H100"]["fp8_matmul_benchmark"]
    rows = []
    for i, name in enumerate(t["gemm"]):
        bf16 = t["bf16_fprop_dgrad_px"][i] + t["bf16_wgrad_px"][i]
        fp8 = t["fp8_fprop_dgrad_px"][i] + t["fp8_wgrad_px"][i]
        err = 2 * READ_ERROR_ROWS  # two segments, each a row either way
        d = cube_side(t["m"][i], t["k"][i], t["n"][i])
        rows.append({"gemm": name, "d": d, "bf16_ms": bf16 / t["px_per_ms"],
                     "fp8_ms": fp8 / t["px_per_ms"], "ratio": bf16 / fp8,
                     "ratio_low": (bf16 - err) / (fp8 + err),
                     "ratio_high": (bf16 + err) / (fp8 - err),
                     "unshrunk": unshrunk_ratio(d, shipped_speedup())})
    return rows


def corpus_sides() -> dict[str, dict[str, float]]:
    """The cube sides of the corpus's FP8 per-GPU GEMMs."""
    return {run: {g: cube_side(*shape) for g, shape in gemms.items()}
            for run, gemms in CORPUS_GEMMS.items()}


def main() -> None:
    t = load("hopper")["H100"]["fp8_matmul_benchmark"]
    print("Transformer Engine, 5B model on H200 NVL, pre-quantized (kernels only), per linear:")
    print("gemm       d      BF16 ms  FP8 ms  BF16/FP8  (reading range)  if shape costs kept")
    for r in readings():
        print(f"{r['gemm']:9s} {r['d']:6.0f}  {r['bf16_ms']:7.3f}  {r['fp8_ms']:6.3f}  "
              f"{r['ratio']:8.3f}  ({r['ratio_low']:.2f}-{r['ratio_high']:.2f})      "
              f"{r['unshrunk']:.3f}")
    print(f"layer (printed)  {t['bf16_layer_ms']:7.3f}  {t['fp8_layer_ms']:6.3f}  "
          f"{t['bf16_layer_ms'] / t['fp8_layer_ms']:8.3f}")
    print(f"shipped: {shipped_speedup():.3f} at every shape")
    print("\ncorpus FP8 runs, per-GPU GEMMs' cube side d (benchmark: "
          f"{min(r['d'] for r in readings()):.0f}-{max(r['d'] for r in readings()):.0f}):")
    for run, sides in corpus_sides().items():
        kept = [unshrunk_ratio(d, shipped_speedup()) for d in sides.values()]
        print(f"  {run}: " + ", ".join(f"{g} {d:.0f}" for g, d in sides.items())
              + f"; if shape costs kept: {min(kept):.2f}-{max(kept):.2f}")


if __name__ == "__main__":
    main()
