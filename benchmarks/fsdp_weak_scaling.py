"""How llm-foundry's FSDP steps grow with the data-parallel size, published against simulated.

    python benchmarks/fsdp_weak_scaling.py [--data sim/data/validation/llmfoundry_mpt.csv]

llm-foundry's "Large Scale" H100 table (scripts/train/benchmarking/README.md at c90b9b3) runs
each MPT model at 128, 256 and 512 GPUs with the same micro-batch per GPU and one micro-batch a
step (weak scaling), so its per-GPU work is the same at every size and whatever grows with the
GPU count shows in the step time alone. For each model this prints the published step times,
the simulated ones (collapsed fidelity, the shipped profile, as ``sim validate``), their growth
from the smallest to the largest size, and two figures of the simulated step read off rank 0's
timeline: ``comp`` (its compute stream busy) and ``dp`` (its DP stream busy). ``comp + dp`` is
the step with no overlap at all between the FSDP collectives and the compute: an upper bound
the simulator does not predict, printed to show how much of the published growth the
collectives as timed here could explain even fully exposed (docs/fsdp-weak-scaling.md).
Nothing is fitted; nothing here is read by the simulator.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.api import simulate  # noqa: E402
from sim.calibration import default_profile  # noqa: E402
from sim.corpus import CorpusRow, load_source  # noqa: E402
from sim.experiment import build_experiment  # noqa: E402

DEFAULT_DATA = ROOT / "sim" / "data" / "validation" / "llmfoundry_mpt.csv"
LARGE_SCALE_MIN_GPUS = 128
"""The Large Scale table's smallest size (its title: '>= 128 GPUs')."""


def figures(row: CorpusRow) -> tuple[float, float, float]:
    """(simulated step, rank 0's compute busy, rank 0's DP stream busy), in seconds."""
    exp = build_experiment(row.experiment())
    result = simulate(exp, default_profile(exp.cluster.gpu.name), fidelity="collapsed")
    spans = result.timeline.spans_of(0)
    comp = sum(s.duration_s for s in spans if s.stream == "compute")
    dp = sum(s.duration_s for s in spans if s.stream == "dp")
    return result.stats["step_time_s"], comp, dp


def main() -> None:
    """Print the table (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    by_model: dict[str, list[CorpusRow]] = defaultdict(list)
    for row in load_source(args.data).rows:
        if int(row.get("num_gpus")) >= LARGE_SCALE_MIN_GPUS and row.get("precision") == "bf16":
            by_model[row.run.split("-s")[0]].append(row)
    print(f"{'model':9s} {'GPUs':>5s} {'published':>10s} {'simulated':>10s} {'error':>7s}"
          f" {'comp':>8s} {'dp':>7s} {'comp+dp':>8s} {'error':>7s}")
    growth = []
    for model, rows in sorted(by_model.items()):
        rows.sort(key=lambda r: int(r.get("num_gpus")))
        first = last = None
        for row in rows:
            step, comp, dp = figures(row)
            pub = row.step_time_s
            print(f"{model:9s} {row.get('num_gpus'):>5s} {pub:10.4f} {step:10.4f}"
                  f" {step / pub - 1:+7.3f} {comp:8.4f} {dp:7.4f} {comp + dp:8.4f}"
                  f" {(comp + dp) / pub - 1:+7.3f}")
            first = first or (pub, step, comp + dp)
            last = (pub, step, comp + dp)
        assert first is not None and last is not None
        growth.append((model, *(b / a - 1 for a, b in zip(first, last, strict=True))))
    print()
    print(f"{'model':9s} {'growth from the smallest to the largest size':>44s}")
    print(f"{'':9s} {'published':>14s} {'simulated':>14s} {'comp+dp':>14s}")
    for model, pub, sim, bound in growth:
        print(f"{model:9s} {pub:+14.3f} {sim:+14.3f} {bound:+14.3f}")


if __name__ == "__main__":
    main()
