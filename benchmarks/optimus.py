"""Optimus against the encoder-first baseline on ViT-22B + GPT-175B (docs/multimodal.md).

    python benchmarks/optimus.py [--gpus 128 3072] [--images 224 448 672]

Simulates workloads/examples/optimus-vit-llm.yaml with both multimodal schedules, at
each cluster size (global batch 0.5 sequences a GPU, as the example's 64 on 128) and
image size (patches of 14 px), and prints one row per setting: the step times, the
speed-up (baseline step over Optimus step) and both bubble fractions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.api import simulate  # noqa: E402
from sim.experiment import Experiment  # noqa: E402

EXAMPLE = ROOT / "workloads" / "examples" / "optimus-vit-llm.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[128, 3072])
    parser.add_argument("--images", type=int, nargs="+", default=[224, 448, 672])
    args = parser.parse_args()
    base = Experiment.from_yaml(EXAMPLE)
    print(f"{'GPUs':>5} {'image':>5} {'patches':>7} {'encoder-first s':>15} {'optimus s':>9} "
          f"{'speed-up':>8} {'bubble EF':>9} {'bubble O':>8}")
    for gpus in args.gpus:
        for image in args.images:
            exp = base.with_changes({"cluster.num_gpus": gpus,
                                     "training.global_batch_size": gpus // 2,
                                     "model.encoder.image_size": image})
            fast = simulate(exp).stats
            slow = simulate(exp.with_changes({"schedule": "encoder-first"})).stats
            print(f"{gpus:>5} {image:>5} {(image // 14) ** 2:>7} {slow['step_time_s']:>15.3f} "
                  f"{fast['step_time_s']:>9.3f} "
                  f"{slow['step_time_s'] / fast['step_time_s']:>7.3f}x "
                  f"{slow['bubble_fraction']:>9.1%} {fast['bubble_fraction']:>8.1%}")


if __name__ == "__main__":
    main()
