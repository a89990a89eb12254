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

A second table splits the published growth over the FSDP1 collectives a step issues (one unit
per MPTBlock: under SHARD_GRAD_OP an all-gather before each forward and a reduce-scatter after
each backward, under FULL_SHARD one more all-gather before each backward), against how much
the same collectives grow as the simulator times them alone (``CollectiveTimer`` on rank 0's
DP groups, a layer's 12h^2 + 13h parameters gathered in bf16 and reduced in the profile's
``grad_reduce_bytes``): the growth the simulator could give if every collective were exposed.
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
from sim.commtime import CollectiveTimer  # noqa: E402
from sim.corpus import CorpusRow, load_source  # noqa: E402
from sim.experiment import build_experiment  # noqa: E402
from workloads.frameworks import framework  # noqa: E402
from workloads.lowering.groups import dp_groups  # noqa: E402

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


def collectives(row: CorpusRow) -> tuple[int, float]:
    """(FSDP collectives a step issues, their summed time alone in seconds) for a row of
    one micro-batch a step (module doc)."""
    exp = build_experiment(row.experiment())
    layers, h = int(row.get("num_layers")), int(row.get("hidden_size"))
    params = 12 * h * h + 13 * h  # MPT's block with its biases (the table's NumParams)
    reduce_bytes = framework(row.get("framework")).grad_reduce_bytes
    timer = CollectiveTimer.shared(exp.cluster)
    groups = dp_groups(exp.placement, 0)
    gathers = 2 if int(row.get("zero_stage")) == 3 else 1
    one = (gathers * timer("all_gather", groups, 2 * params)
           + timer("reduce_scatter", groups, reduce_bytes * params))
    return layers * (gathers + 1), layers * one


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
    print()
    print("growth from the smallest to the largest size, per FSDP collective of a step")
    print(f"{'model':9s} {'colls':>6s} {'published ms':>13s} {'ms/coll':>8s}"
          f" {'exposed ms':>11s} {'ms/coll':>8s}")
    for model, rows in sorted(by_model.items()):
        first, last = rows[0], rows[-1]
        count, alone_first = collectives(first)
        _, alone_last = collectives(last)
        pub = last.step_time_s - first.step_time_s
        exposed = alone_last - alone_first
        print(f"{model:9s} {count:6d} {pub * 1e3:13.1f} {pub / count * 1e3:8.2f}"
              f" {exposed * 1e3:11.1f} {exposed / count * 1e3:8.2f}")


if __name__ == "__main__":
    main()
