"""The MLPerf GPT-3 175B submissions' forward-only (validation) steps
(``sim/data/validation/mlperf_gpt3_validation_steps.csv``, benchmarks/mlperf_validation_steps.py):
read from the same logs as the corpus rows, not a training source, not read by the simulator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sim.corpus import CORPUS_DIR, corpus_files, load_source

ROOT = Path(__file__).resolve().parent.parent
DATA = CORPUS_DIR / "mlperf_gpt3_validation_steps.csv"


def _bench():
    spec = importlib.util.spec_from_file_location(
        "mlperf_validation_steps", ROOT / "benchmarks" / "mlperf_validation_steps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_it_is_not_a_corpus_source() -> None:
    assert DATA.exists() and DATA not in corpus_files()


def test_each_row_is_a_corpus_rows_run_with_its_layout_and_training_median() -> None:
    """The training median read beside the validation steps is the corpus row's step time,
    and a validation step runs the training global batch (GBS / DP micro-batches)."""
    corpus = {}
    for name in ("mlperf_training_v30_gpt3.csv", "mlperf_training_v31_gpt3.csv"):
        for r in load_source(CORPUS_DIR / name).rows:
            corpus[r.run] = r
    rows = _bench().rows()
    assert len(rows) == len(corpus) == 13
    for row in rows:
        c = corpus[row["corpus_run"]]
        assert float(row["train_step_median_s"]) == pytest.approx(c.step_time_s, abs=1e-4)
        for key in ("num_gpus", "global_batch_size", "dp"):
            assert int(row[key]) == int(c.get(key))
        assert int(row["micro_batches"]) == int(c.get("global_batch_size")) // int(c.get("dp"))
        assert float(row["validation_step_min_s"]) <= float(row["validation_step_median_s"])
        assert row["source"].startswith("mlcommons/training_results_v3.")


def test_a_forward_only_micro_batch_costs_well_over_a_third_of_a_training_one() -> None:
    """Per micro-batch, forward only 32.9 ms (v3.1, Eos) and 40.3 ms (v3.0, CoreWeave) against
    84.4 and 93.3 ms training: 39% and 43%, where forward GEMM FLOPs are a third."""
    slopes = _bench().slopes()
    assert slopes["v3.1"] == pytest.approx((0.0329, 0.0844), abs=5e-4)
    assert slopes["v3.0"] == pytest.approx((0.0403, 0.0933), abs=5e-4)


def test_a_no_grad_forward_gathers_its_two_fp8_inputs_without_overlap() -> None:
    """Transformer Engine turns the userbuffers all-gather overlap of LayerNormLinear and
    LayerNormMLP off without grad, so a validation forward waits for both fp8 all-gathers
    (25.2 MB gathered over the TP 4 group) where training exposes a fraction of each: on the
    simulator's dgx-h100, 0.070 ms alone against 0.006 and 0.008 ms, +1.50 ms a micro-batch of
    12 one-layer chunks, the same on both rounds (the same layout). How much training exposes
    follows the GEMMs it overlaps, so the device constants: 0.010 and 0.013 ms, +1.40 ms, at
    the A100 fit of 2026-12-03."""
    out = _bench().eval_gathers()
    assert set(out) == {"v3.0", "v3.1"}
    for alone, exposed, chunks in out.values():
        assert chunks == 12
        assert set(exposed) == {"attn all-gather", "mlp all-gather"}
        assert all(0.0 < t < alone for t in exposed.values())
        extra = sum(alone - t for t in exposed.values()) * chunks
        assert extra == pytest.approx(1.50e-3, abs=0.05e-3)
