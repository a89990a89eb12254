"""How much of llm-foundry's weak-scaling growth the expected slowest GPU could explain.

    python benchmarks/gpu_variability.py [--data sim/data/validation/llmfoundry_mpt.csv]

Prints the pacing of :mod:`sim.variability` (1 + sigma * E[max of N standard normals], sigma
from Sinha et al. 2022's whisker range read as normal, ``topologies/gpu_variability.toml``) for a
range of GPU counts, then, for each model of llm-foundry's "Large Scale" H100 table (128, 256
and 512 GPUs, the same work per GPU at every size), the published step times against the
simulated ones with the pacing off (as shipped) and on (``sim.variability.paced_profile`` as the
profile), their growth from the smallest to the largest size and the
errors. Collapsed fidelity and the shipped profiles, as ``sim validate``. Nothing is fitted;
nothing here is read by the simulator (docs/gpu-variability.md).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim import variability  # noqa: E402
from sim.api import simulate  # noqa: E402
from sim.calibration import default_profile  # noqa: E402
from sim.corpus import CorpusRow, load_source  # noqa: E402
from sim.experiment import build_experiment  # noqa: E402

DEFAULT_DATA = ROOT / "sim" / "data" / "validation" / "llmfoundry_mpt.csv"
LARGE_SCALE_MIN_GPUS = 128
"""The Large Scale table's smallest size (its title: '>= 128 GPUs')."""
COUNTS = (8, 32, 64, 128, 256, 512, 1024, 3072, 16384)


def step(row: CorpusRow, paced: bool) -> float:
    """The row's simulated step time, seconds, with the pacing on or off."""
    exp = build_experiment(row.experiment())
    profile = default_profile(exp.cluster.gpu.name)
    if paced:
        profile = variability.paced_profile(profile, exp.cluster.num_gpus)
    result = simulate(exp, profile, fidelity="collapsed", idle=False)
    return result.stats["step_time_s"]


def main() -> None:
    """Print both tables (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    print(f"sigma = {variability.sigma():.4f} of the median GPU's speed")
    print(f"{'GPUs':>6} {'E[max]':>7} {'pacing':>8}")
    for n in COUNTS:
        print(f"{n:>6} {variability.expected_max_normal(n):>7.3f} "
              f"{100 * (variability.pacing(n) - 1):>7.2f}%")
    by_model: dict[str, list[CorpusRow]] = defaultdict(list)
    for row in load_source(args.data).rows:
        if int(row.get("num_gpus")) >= LARGE_SCALE_MIN_GPUS and row.get("precision") == "bf16":
            by_model[row.run.split("-s")[0]].append(row)
    print()
    print(f"{'model':<9} {'GPUs':>5} {'published':>10} {'off':>8} {'on':>8} "
          f"{'err off':>8} {'err on':>8}")
    growth = []
    for model, rows in by_model.items():
        rows.sort(key=lambda r: int(r.get("num_gpus")))
        pub, off, on = [], [], []
        for row in rows:
            pub.append(row.step_time_s)
            off.append(step(row, False))
            on.append(step(row, True))
            print(f"{model:<9} {int(row.get('num_gpus')):>5} {pub[-1]:>10.3f} {off[-1]:>8.3f} "
                  f"{on[-1]:>8.3f} {100 * (off[-1] / pub[-1] - 1):>7.1f}% "
                  f"{100 * (on[-1] / pub[-1] - 1):>7.1f}%")
        growth.append((model, pub[-1] / pub[0] - 1, off[-1] / off[0] - 1, on[-1] / on[0] - 1))
    print()
    print(f"{'model':<9} {'published growth':>17} {'off':>7} {'on':>7} {'share explained':>16}")
    for model, g_pub, g_off, g_on in growth:
        print(f"{model:<9} {100 * g_pub:>16.1f}% {100 * g_off:>6.1f}% {100 * g_on:>6.1f}% "
              f"{100 * (g_on - g_off) / g_pub:>15.0f}%")


if __name__ == "__main__":
    main()
