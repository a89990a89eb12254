"""GPT-3 175B FP8 at TP 4 across the corpus: MLPerf beside DGX Cloud and NeMo 24.12, row by row.

    python benchmarks/gpt3_fp8_rows.py            # every GPT-3 175B row of the five sources
    python benchmarks/gpt3_fp8_rows.py --swaps    # each differing setting swapped, per row
    python benchmarks/gpt3_fp8_rows.py --recipe-ub  # the recipes' userbuffers SM counts

The MLPerf Training v3.0 and v3.1 GPT-3 175B rows are one model at one layout (TP 4, PP 8,
one layer a model chunk, micro-batch 1, FP8, userbuffers TP overlap); DGX Cloud Benchmarking
v24.11.1 and v25.02 publish the same model at the same TP, PP and micro-batch at FP8 and BF16,
NeMo 24.12's performance summary the same at FP8 without TP overlap. The first mode prints,
for each GPT-3 175B row of the five sources, the published and simulated step (as ``sim
validate`` simulates it, :func:`sim.corpus.simulate_corpus_row`), the error, and the gap
spread over the layers a GPU holds times the micro-batches of a step (ms a layer and
micro-batch; positive = the simulator is fast). ``--swaps`` simulates chosen rows again with
one corpus setting replaced by the value another source's rows carry (:data:`SWAPS`), a
diagnostic: what each difference between the sources is worth in the model. ``--recipe-ub``
simulates the ``--swaps`` rows with the userbuffers settings the recipes' yamls give instead of
Transformer Engine's defaults (:func:`recipe_methods`), twice: the bulk overlaps unmargined as
the yamls set them (the simulator's TE 1.x rule, not charged) and margined. Nothing here is
read by the simulator (docs/accuracy.md, "MLPerf GPT-3 beside DGX Cloud's GPT-3 rows").
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.corpus import CORPUS_DIR, CorpusRow, load_source, simulate_corpus_row  # noqa: E402
from sim.experiment import build_experiment  # noqa: E402

SOURCES = ("mlperf_training_v30_gpt3", "mlperf_training_v31_gpt3", "dgxc_benchmarking_2411",
           "dgxc_benchmarking_2502", "nemo2412_fp8")

SWAP_ROWS = {
    "mlperf_training_v30_gpt3": ("gpt3-175b-512gpu-dgx", "gpt3-175b-3584gpu-coreweave"),
    "mlperf_training_v31_gpt3": ("gpt3-175b-512gpu-eos", "gpt3-175b-4096gpu-eos",
                                 "gpt3-175b-10240gpu-eos"),
    "dgxc_benchmarking_2411": ("gpt3-175b-128gpu-fp8", "gpt3-175b-128gpu-bf16"),
    "dgxc_benchmarking_2502": ("gpt3-175b-128gpu-fp8", "gpt3-175b-128gpu-bf16"),
    "nemo2412_fp8": ("gpt3-175b-128gpu-fp8",),
}

SWAPS: dict[str, dict[str, str]] = {
    "framework nemo-launcher": {"framework": "nemo-launcher"},
    "framework nemo1-te-layer": {"framework": "nemo1-te-layer"},
    "vpp 6": {"vpp": "6"},
    "vpp 12": {"vpp": "12"},
    "attention cudnn": {"attention": "cudnn"},
    "attention flash2": {"attention": "flash2"},
    "grad_bucket_MB 230.7": {"grad_bucket_MB": "230.68672"},
    "grad_bucket_MB 104.9": {"grad_bucket_MB": "104.8576"},
    "amax tp-dp-cp": {"fp8_amax_reduction": "tp-dp-cp"},
    "amax none": {"fp8_amax_reduction": "none"},
    "tp_comm_overlap off": {"tp_comm_overlap": ""},
    "tp_comm_overlap on": {"tp_comm_overlap": "true"},
}
"""Corpus settings on which the GPT-3 175B rows of the sources differ, each as the value some
other source's rows carry (a swap that leaves a row as it is is skipped)."""


def recipe_methods(fc2_fprop_sms: int, bulk_margin: bool) -> dict:
    """The per-GEMM userbuffers settings of the GPT-3 175B recipes as
    :class:`sim.tpoverlap.Method` s: mlcommons/training_results_v3.0 (63e326c)
    h100tp4pp8mbs1_tp_comm_overlap_cfg.yaml and NVIDIA/dgxc-benchmarking v24.11.1 / v25.02
    gpt3_175b_hydra.yaml (proj_fprop pipeline on 24 SMs and fc2_fprop on 20, with margin; bulk
    qkv_dgrad 4, qkv_wgrad 8, fc1_dgrad 2, fc1_wgrad 4 SMs without; ring exchanges on the copy
    engines), training_results_v3.1 (d06288b) conf/tp_overlap/h100tp4pp8mbs1.yaml the same
    with fc2_fprop on 4 SMs. ``bulk_margin`` charges the bulk ones as margined (a bound). Not
    expressed: fc2_dgrad's ``aggregate: 1``."""
    from sim.tpoverlap import Method

    ring = Method("ring_exchange", 0, 1, False)
    methods = {name: ring for name in ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")}
    methods["proj_fprop"] = Method("pipeline", 4, 24, True)
    methods["fc2_fprop"] = Method("pipeline", 4, fc2_fprop_sms, True)
    for name, sms in (("qkv_dgrad", 4), ("qkv_wgrad", 8), ("fc1_dgrad", 2), ("fc1_wgrad", 4)):
        methods[name] = Method("bulk", 1, sms, bulk_margin)
    return methods


def recipe_ub_table() -> None:
    import sim.tpoverlap as tpo

    shipped = tpo.method_of
    try:
        for name, runs in SWAP_ROWS.items():
            if name == "nemo2412_fp8":  # no TP overlap
                continue
            fc2 = 4 if name == "mlperf_training_v31_gpt3" else 20
            rows = {r.run: r for r in load_source(CORPUS_DIR / f"{name}.csv").rows}
            for run in runs:
                r = rows[run]
                tpo.method_of = shipped
                base = simulated(r)
                line = f"{name} {run}: {100 * (base / r.step_time_s - 1):+6.2f}%"
                for margin in (False, True):
                    tpo.method_of = recipe_methods(fc2, margin).__getitem__
                    t = simulated(r)
                    kind = "margined" if margin else "unmargined"
                    line += (f" | bulk {kind} {100 * (t / r.step_time_s - 1):+6.2f}% "
                             f"(step {100 * (t / base - 1):+5.2f}%)")
                print(line, flush=True)
    finally:
        tpo.method_of = shipped


def replaced_row(row: CorpusRow, **values: str) -> CorpusRow:
    """``row`` with some of its CSV fields replaced."""
    v = dict(row.values)
    v.update(values)
    return dataclasses.replace(row, values=tuple(v.items()))


def layer_microbatches(row: CorpusRow) -> float:
    """Transformer layers on one GPU (the model's layers over PP) x micro-batches a step."""
    exp = build_experiment(row.experiment())
    p = exp.placement
    micro = exp.config.training.global_batch_size / (
        p.degree("dp") * exp.config.training.micro_batch_size)
    return exp.model.num_layers / p.degree("pp") * micro


def gpt3_rows(name: str) -> list[CorpusRow]:
    """The source's GPT-3 175B rows (every row of the MLPerf sources)."""
    rows = load_source(CORPUS_DIR / f"{name}.csv").rows
    return [r for r in rows if name.startswith("mlperf") or r.run.startswith("gpt3-175b")]


def simulated(row: CorpusRow) -> float:
    return simulate_corpus_row((row, (1.0, 1.0))).step_time_s


def rows_table() -> None:
    print(f"{'source':26s} {'run':28s} {'prec':4s} {'DP':>4s} {'VP':>3s} {'mb':>4s} "
          f"{'pub s':>7s} {'sim s':>7s} {'error':>7s} {'ms/layer-mb':>11s}")
    for name in SOURCES:
        for r in gpt3_rows(name):
            sim = simulated(r)
            lm = layer_microbatches(r)
            e = r.experiment()
            print(f"{name:26s} {r.run:28s} {r.get('precision'):4s} {e['parallel']['dp']:4d} "
                  f"{e['parallel']['vpp']:3d} {lm / 12:4.0f} {r.step_time_s:7.3f} {sim:7.3f} "
                  f"{100 * (sim / r.step_time_s - 1):+6.2f}% "
                  f"{1e3 * (r.step_time_s - sim) / lm:+11.2f}")


def swaps_table() -> None:
    for name, runs in SWAP_ROWS.items():
        rows = {r.run: r for r in load_source(CORPUS_DIR / f"{name}.csv").rows}
        for run in runs:
            r = rows[run]
            base = simulated(r)
            print(f"{name} {run}: published {r.step_time_s:.3f} s, simulated {base:.3f} s "
                  f"({100 * (base / r.step_time_s - 1):+.2f}%)")
            for label, values in SWAPS.items():
                if all(r.get(k) == v for k, v in values.items()):
                    continue
                t = simulated(replaced_row(r, **values))
                print(f"    {label:26s} {100 * (t / r.step_time_s - 1):+6.2f}%  "
                      f"(step {100 * (t / base - 1):+5.2f}%)")


if __name__ == "__main__":
    {"--swaps": swaps_table, "--recipe-ub": recipe_ub_table}.get(
        (sys.argv[1:] or [""])[0], rows_table)()
