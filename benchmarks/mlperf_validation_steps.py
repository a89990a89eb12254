"""MLPerf GPT-3 175B forward-only steps: the validation steps the submissions' logs time.

    python benchmarks/mlperf_validation_steps.py            # the shipped table and its slopes
    python benchmarks/mlperf_validation_steps.py --from-logs V30_CHECKOUT V31_CHECKOUT
    python benchmarks/mlperf_validation_steps.py --eval-gathers  # the no-grad TP all-gathers

NVIDIA's MLPerf Training v3.0 and v3.1 GPT-3 175B logs (mlcommons/training_results_v3.0 at
63e326c, training_results_v3.1 at d06288b; ``result_*.txt``) record, beside the per-step
``train_step_timing`` the corpus rows take, a ``validation_step_timing`` for every validation
step (MLLOG ``tracked_stats``): NeMo's forward-only pass of one global batch of the validation
set through the same pipeline, the same layout and FP8 (no backward, no optimizer). The
validation global batch is the training one (ceil(5662 / GBS) steps an evaluation in every log:
3 at GBS 2048-2688, 2 at 3072-4096), so a validation step runs GBS / DP micro-batches, each
the GPU's 12 one-layer model chunks forward.

``--from-logs`` reads the logs from checkouts of the two repositories (``git -C`` at HEAD) and
prints the CSV (``sim/data/validation/mlperf_gpt3_validation_steps.csv``); without it, the
shipped CSV is read and the slope per micro-batch of each round's forward-only and training
steps is printed (least squares over the rows of one system: Eos for v3.1, CoreWeave for v3.0).
Nothing here is read by the simulator (docs/accuracy.md, "MLPerf GPT-3: where the missing time
is").

``--eval-gathers`` times what a validation forward does differently on the GPU: Transformer
Engine turns the userbuffers all-gather overlap of ``LayerNormLinear`` (QKV) and
``LayerNormMLP`` (FC1) off when grad is disabled (``ub_split_ag = False`` if ``not
is_grad_enabled``: module.py at release_v0.8, module/layernorm_linear.py and
module/layernorm_mlp.py at 09ba842), so each gathers its fp8 input with a plain NCCL
all-gather before the GEMM. Printed per round (the first corpus row): the all-gather timed
alone on pipeline rank 0's TP groups, what the training forward exposes of it under the
overlap (``sim.tpoverlap``), and the difference a layer and a micro-batch (docs/accuracy.md,
"Transformer Engine's host time").
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "sim" / "data" / "validation" / "mlperf_gpt3_validation_steps.csv"

RESULTS = {
    "v3.0": (("NVIDIA/results/dgxh100_n64_nemo/gpt3", "gpt3-175b-512gpu-dgx", 512, 2048, 16),
             ("NVIDIA/results/dgxh100_n96_nemo/gpt3", "gpt3-175b-768gpu-dgx", 768, 3072, 24),
             ("NVIDIA_CoreWeave/results/coreweave_hgxh100_n96_ngc23.04_pytorch/gpt3",
              "gpt3-175b-768gpu-coreweave", 768, 3072, 24),
             ("NVIDIA_CoreWeave/results/coreweave_hgxh100_n192_ngc23.04_pytorch/gpt3",
              "gpt3-175b-1536gpu-coreweave", 1536, 3072, 48),
             ("NVIDIA_CoreWeave/results/coreweave_hgxh100_n448_ngc23.04_pytorch/gpt3",
              "gpt3-175b-3584gpu-coreweave", 3584, 2688, 112)),
    "v3.1": (("NVIDIA/results/eos_n64_ngc23.09_nemo/gpt3", "gpt3-175b-512gpu-eos", 512, 2048, 16),
             ("NVIDIA/results/eos_n96_ngc23.09_nemo/gpt3", "gpt3-175b-768gpu-eos", 768, 3072, 24),
             ("NVIDIA/results/eos-dfw_n512_ngc23.09_nemo/gpt3", "gpt3-175b-4096gpu-eos", 4096,
              2048, 128),
             ("NVIDIA/results/eos-dfw_n768_ngc23.09_nemo/gpt3", "gpt3-175b-6144gpu-eos", 6144,
              3072, 192),
             ("NVIDIA/results/eos-dfw_n1024_ngc23.09_nemo/gpt3", "gpt3-175b-8192gpu-eos", 8192,
              4096, 256),
             ("NVIDIA/results/eos-dfw_n1280_ngc23.09_nemo/gpt3", "gpt3-175b-10240gpu-eos", 10240,
              2560, 320),
             ("NVIDIA/results/eos-dfw_n1344_ngc23.09_nemo/gpt3", "gpt3-175b-10752gpu-eos", 10752,
              2688, 336),
             ("Azure+NVIDIA/results/ND_H100_v5_n1344_pytorch/gpt3", "gpt3-175b-10752gpu-azure",
              10752, 2688, 336)),
}
COMMITS = {"v3.0": ("mlcommons/training_results_v3.0", "63e326c"),
           "v3.1": ("mlcommons/training_results_v3.1", "d06288b")}
COLUMNS = ("round", "results_dir", "corpus_run", "num_gpus", "global_batch_size", "dp",
           "micro_batches", "validation_steps", "validation_step_median_s",
           "validation_step_min_s", "train_steps", "train_step_median_s", "source")


def _timings(repo: str, directory: str) -> tuple[list[float], list[float]]:
    """Every validation_step_timing and train_step_timing of a results directory's logs."""
    files = subprocess.run(["git", "-C", repo, "ls-tree", "--name-only", "HEAD", directory + "/"],
                           capture_output=True, text=True, check=True).stdout.split()
    val: list[float] = []
    train: list[float] = []
    for f in sorted(files):
        text = subprocess.run(["git", "-C", repo, "show", f"HEAD:{f}"], capture_output=True,
                              text=True, check=True).stdout
        for line in text.splitlines():
            if ":::MLLOG" not in line:
                continue
            rec = json.loads(line.split(":::MLLOG", 1)[1])
            if rec["key"] != "tracked_stats":
                continue
            value = rec["value"]
            if "validation_step_timing" in value:
                val.append(float(value["validation_step_timing"]))
            if "train_step_timing" in value:
                train.append(float(value["train_step_timing"]))
    return val, train


def from_logs(v30: str, v31: str) -> None:
    """Print the CSV from checkouts of the two results repositories."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(COLUMNS)
    for rnd, repo in (("v3.0", v30), ("v3.1", v31)):
        name, commit = COMMITS[rnd]
        for directory, run, gpus, gbs, dp in RESULTS[rnd]:
            val, train = _timings(repo, directory)
            out.writerow((rnd, directory, run, gpus, gbs, dp, gbs // dp, len(val),
                          f"{statistics.median(val):.4f}", f"{min(val):.4f}", len(train),
                          f"{statistics.median(train):.4f}",
                          f"{name} at {commit}, {directory}/result_*.txt (MLLOG tracked_stats "
                          "validation_step_timing and train_step_timing)"))


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (micro-batches, seconds)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    return (sum((x - mx) * (y - my) for x, y in points)
            / sum((x - mx) ** 2 for x, _ in points))


def rows() -> list[dict[str, str]]:
    """The shipped table."""
    with DATA.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def slopes() -> dict[str, tuple[float, float]]:
    """Per round, seconds a micro-batch of the forward-only (validation) and the training
    steps, over one system's rows (v3.1: Eos, v3.0: CoreWeave)."""
    out = {}
    for rnd, system in (("v3.1", "NVIDIA/results/eos"), ("v3.0", "NVIDIA_CoreWeave/")):
        sel = [r for r in rows() if r["round"] == rnd and r["results_dir"].startswith(system)]
        val = [(float(r["micro_batches"]), float(r["validation_step_median_s"])) for r in sel]
        train = [(float(r["micro_batches"]), float(r["train_step_median_s"])) for r in sel]
        out[rnd] = (_slope(val), _slope(train))
    return out


EVAL_GATHERS = ("attn all-gather", "mlp all-gather")
"""The forward all-gathers (by :data:`workloads.layer_work.TP_OVERLAP_GEMMS` name) whose
userbuffers overlap Transformer Engine turns off without grad."""

CORPUS_FILES = {"v3.0": "mlperf_training_v30_gpt3.csv", "v3.1": "mlperf_training_v31_gpt3.csv"}


def eval_gathers() -> dict[str, tuple[float, dict[str, float], int]]:
    """Per round: (the fp8 input all-gather timed alone, seconds; the training forward's
    exposed seconds of each of :data:`EVAL_GATHERS`; model chunks a GPU runs a micro-batch),
    on the round's first corpus row."""
    sys.path.insert(0, str(ROOT))
    from sim.calibration import default_profile
    from sim.commtime import CollectiveTimer
    from sim.corpus import CORPUS_DIR, load_source
    from sim.device import work_timer
    from sim.experiment import build_experiment
    from sim.tpoverlap import lowering_costs
    from workloads.lowering.groups import tp_groups

    out = {}
    for rnd, name in CORPUS_FILES.items():
        exp = build_experiment(load_source(CORPUS_DIR / name).rows[0].experiment())
        costs = exp.costs
        timer = CollectiveTimer.shared(exp.cluster)
        compute_s = work_timer(exp.cluster.gpu, default_profile(exp.cluster.gpu.name),
                               exp.config.training.attention)
        exposed = dict(lowering_costs(exp, compute_s, timer).tp_comm_exposed_s)
        nbytes = (costs._tp_gather_bytes * costs.micro_batch_size * costs.model.seq_length
                  * costs.model.hidden_size)
        alone = timer("all_gather", tp_groups(exp.placement, 0), nbytes)
        chunks = costs.model.num_layers // exp.config.parallel.pp
        out[rnd] = (alone, {g: exposed[g] for g in EVAL_GATHERS}, chunks)
    return out


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--from-logs":
        from_logs(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 2 and sys.argv[1] == "--eval-gathers":
        for rnd, (alone, exposed, chunks) in eval_gathers().items():
            extra = sum(alone - t for t in exposed.values())
            shown = ", ".join(f"{g} {1e3 * t:.4f} ms" for g, t in exposed.items())
            print(f"{rnd}: fp8 all-gather alone {1e3 * alone:.4f} ms; exposed under overlap: "
                  f"{shown}; no-grad forward +{1e3 * extra:.3f} ms a layer, "
                  f"+{1e3 * extra * chunks:.2f} ms a micro-batch ({chunks} layers a GPU)")
        return
    for r in rows():
        print(f"{r['round']} {r['corpus_run']:28s} {r['micro_batches']:>4s} micro-batches: "
              f"validation {float(r['validation_step_median_s']):7.4f} s, "
              f"training {float(r['train_step_median_s']):7.4f} s")
    for rnd, (val, train) in slopes().items():
        print(f"{rnd}: {1e3 * val:.1f} ms a micro-batch forward only, {1e3 * train:.1f} ms "
              "training")


if __name__ == "__main__":
    main()
