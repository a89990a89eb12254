"""Korthikanti et al. 2022's rows op by op, and under two A100 GEMM curves (issue 19).

    python benchmarks/korthikanti_ops.py [--rows]

Prints, for one layer of the 22B model (table 4's setting, ``tests/test_korthikanti_layer.py``'s
experiment) without and with sequence parallelism, what the device model charges each kernel
class, forward and backward: GEMMs under the shipped A100 curve (``[A100.fit]``) and under the
cuBLAS benchmark's (η 0.930, d½ 1,055 at random-input level, ``benchmarks/a100_gemm_curve.py``),
the attention batched matmuls and the element-wise bytes. With ``--rows`` it also simulates
every row of ``korthikanti2022_megatron.csv`` under the ``megatron`` and ``megatron-lm-2022``
profiles with either curve (a diagnostic: only the shipped curve and the CSV's profile are the
model). docs/accuracy.md, "Korthikanti et al.'s 22B layer, op by op", records the output.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sim.api import simulate  # noqa: E402
from sim.calibration import default_profile  # noqa: E402
from sim.corpus import CORPUS_DIR, load_source  # noqa: E402
from sim.experiment import build_experiment  # noqa: E402
from workloads.costs import ComputeSeg  # noqa: E402

BENCHMARK_CURVE = {"gemm_efficiency": 0.930, "gemm_half_dim": 1055.0}
"""The cuBLAS benchmark's shape curve at H. He's random-input level, as
``benchmarks/a100_gemm_curve.py`` prints it."""


def layer_terms() -> None:
    from test_korthikanti_layer import _experiment

    for mode in ("base", "sp"):
        exp = build_experiment(_experiment(mode, 2))
        gpu, costs = exp.cluster.gpu, exp.costs
        prof = default_profile(gpu.name)
        bench = replace(prof, **BENCHMARK_CURVE)
        peak, hbm = gpu.peak_bf16_flops, gpu.hbm_bandwidth_Bps
        for name, segs in (("forward", costs._layer_forward("L0")),
                           ("backward", costs._layer_backward("L0", weight_grad_deferred=False))):
            segs = [s for s in segs if isinstance(s, ComputeSeg)]
            flops = sum(s.flops for s in segs)
            fit = sum(prof.gemm_time_s(s.flops, s.gemm_dims, peak) for s in segs)
            cub = sum(bench.gemm_time_s(s.flops, s.gemm_dims, peak) for s in segs)
            bmm = sum(s.attn_flops for s in segs) / (
                peak * prof.attention_efficiency(costs.attention))
            ew = sum(s.elementwise_bytes for s in segs)
            print(f"22B {mode:4s} {name:8s}: GEMMs {flops / 1e9:5.0f} GF fitted "
                  f"{fit * 1e3:.3f} ms ({flops / fit / peak:.0%}), benchmark {cub * 1e3:.3f} ms "
                  f"({flops / cub / peak:.0%}); attention bmm {bmm * 1e3:.3f} ms; element-wise "
                  f"{ew / 1e6:.0f} MB {ew / (hbm * prof.elementwise_efficiency) * 1e3:.3f} ms")


def rows() -> None:
    source = load_source(CORPUS_DIR / "korthikanti2022_megatron.csv")
    cases = [(fw, curve) for fw in ("megatron", "megatron-lm-2022") for curve in ("fit", "bench")]
    errors: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    for row in source.rows:
        published = row.step_time_s
        cells = []
        for fw, curve in cases:
            data = row.experiment()
            data["training"]["framework"] = fw
            exp = build_experiment(data)
            prof = default_profile(exp.cluster.gpu.name)
            if curve == "bench":
                prof = replace(prof, **BENCHMARK_CURVE)
            step = simulate(exp, prof, fidelity="collapsed", idle=False).stats["step_time_s"]
            errors[(fw, curve)].append(step / published - 1)
            cells.append(f"{fw}/{curve} {step / published - 1:+.1%}")
        print(f"{row.get('run'):28s} {published:6.2f} s  " + "  ".join(cells), flush=True)
    for (fw, curve), errs in errors.items():
        print(f"{fw}/{curve}: MAPE {sum(map(abs, errs)) / len(errs):.2%}, "
              f"signed {sum(errs) / len(errs):+.2%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", action="store_true",
                    help="also simulate the eight rows under both profiles and curves (minutes)")
    args = ap.parse_args()
    layer_terms()
    if args.rows:
        rows()


if __name__ == "__main__":
    main()
