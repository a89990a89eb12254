"""The DGX Cloud Benchmarking FP8 rows: their FP8-specific gap per layer and micro-batch.

    python benchmarks/dgxc_fp8_gap.py [SOURCE ...]

Each recipe of ``dgxc_benchmarking_2411.csv`` and ``dgxc_benchmarking_2502.csv`` runs the same
layout at BF16 and at FP8 (the launch scripts' ``DTYPE`` switches only ``model.fp8``,
``fp8_hybrid`` and ``fp8_params``). For every such pair this simulates both rows with the
shipped profile (as ``sim validate`` does, :func:`sim.corpus.simulate_corpus_row`) and prints
the published over simulated step-time gap of each precision, the published and simulated
FP8 speed-up (BF16 step / FP8 step), and the FP8-specific gap spread over the work it would
belong to: (FP8 gap - BF16 gap) / (transformer layers a GPU holds x micro-batches a step),
milliseconds per layer and micro-batch. Nothing here is read by the simulator
(docs/accuracy.md, "DGX Cloud FP8 at TP 4", wp-dgxc).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.corpus import CORPUS_DIR, load_source, simulate_corpus_row  # noqa: E402
from sim.experiment import build_experiment  # noqa: E402

SOURCES = ("dgxc_benchmarking_2411", "dgxc_benchmarking_2502")


def layer_microbatches(row) -> float:
    """Transformer layers on one GPU (the model's layers over PP) x micro-batches a step."""
    exp = build_experiment(row.experiment())
    p = exp.placement
    layers = exp.model.num_layers / p.degree("pp")
    micro = exp.config.training.global_batch_size / (
        p.degree("dp") * exp.config.training.micro_batch_size)
    return layers * micro


def main(names: list[str]) -> None:
    for name in names:
        src = load_source(CORPUS_DIR / f"{name}.csv")
        rows = {r.run: r for r in src.rows}
        print(name)
        print(f"  {'recipe':24s} {'TP':>2s} {'GPUs':>5s} {'gap bf16':>9s} {'gap fp8':>8s} "
              f"{'speed-up pub':>12s} {'sim':>6s} {'FP8-only ms/layer-mb':>21s}")
        for run, bf16 in rows.items():
            if not run.endswith("-bf16") or run[:-5] + "-fp8" not in rows:
                continue
            fp8 = rows[run[:-5] + "-fp8"]
            sb, sf = (simulate_corpus_row((r, (1.0, 1.0))).step_time_s for r in (bf16, fp8))
            gb, gf = bf16.step_time_s - sb, fp8.step_time_s - sf
            per = 1e3 * (gf - gb) / layer_microbatches(fp8)
            tp = fp8.experiment()["parallel"]["tp"]
            gpus = fp8.experiment()["cluster"]["num_gpus"]
            print(f"  {run[:-5].rsplit('-', 1)[0]:24s} {tp:2d} {gpus:5d} {gb:+8.3f}s {gf:+7.3f}s "
                  f"{bf16.step_time_s / fp8.step_time_s:12.3f} {sb / sf:6.3f} {per:+21.2f}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(SOURCES))
