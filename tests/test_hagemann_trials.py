"""The sweep's trial IDs (``sim/data/validation/hagemann2023_trials.csv``,
benchmarks/hagemann_eras.py): one per row of the sweep CSV, from the same sheet; not a
corpus source, not read by the simulator."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from sim.corpus import CORPUS_DIR, corpus_files
from sim.validate import HAGEMANN_SWEEP

ROOT = Path(__file__).resolve().parent.parent
DATA = CORPUS_DIR / "hagemann2023_trials.csv"


def _bench():
    spec = importlib.util.spec_from_file_location(
        "hagemann_eras", ROOT / "benchmarks" / "hagemann_eras.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_it_is_not_a_corpus_source() -> None:
    assert DATA.exists() and DATA not in corpus_files()


def test_one_trial_per_sweep_row_from_the_rows_sheet() -> None:
    sweep, trials = _rows(HAGEMANN_SWEEP), _rows(DATA)
    assert [int(t["row"]) for t in trials] == list(range(len(sweep)))
    assert [t["source_file"] for t in trials] == [s["source_file"] for s in sweep]
    # a trial is one run of one sheet
    pairs = [(t["source_file"], t["trial_id"]) for t in trials]
    assert len(set(pairs)) == len(pairs)


def test_the_two_campaigns_are_the_attention_kernels() -> None:
    """What docs/accuracy.md reads from the IDs: every FlashAttention-2 run is of the second
    campaign (131,645-133,010), every other run of the first (96,769-105,930)."""
    bench = _bench()
    sweep, trials = _rows(HAGEMANN_SWEEP), bench.load_trials()
    for i, s in enumerate(sweep):
        expect = "late" if s["attention"] == "flash2" else "early"
        assert bench.era(trials[i]) == expect, (i, s["attention"], trials[i])
    late = [trials[i] for i, s in enumerate(sweep) if s["attention"] == "flash2"]
    early = [trials[i] for i, s in enumerate(sweep) if s["attention"] != "flash2"]
    assert (min(late), max(late)) == (131_645, 133_010)
    assert (min(early), max(early)) == (96_769, 105_930)


def test_table_and_pairs_on_made_up_predictions() -> None:
    bench = _bench()
    base = {"model": "llama-13b", "seq_length": "2048", "num_gpus": "64", "tp": "1",
            "micro_batch_size": "1", "recompute": "full", "fused_norm": "false",
            "sequence_parallel": "false", "status": "ok"}
    preds = [
        {**base, "row": "0", "pp": "1", "attention": "flash1",
         "measured_step_time_s": "40", "predicted_step_time_s": "44"},
        {**base, "row": "1", "pp": "1", "attention": "flash2",
         "measured_step_time_s": "30", "predicted_step_time_s": "42"},
        {**base, "row": "2", "pp": "2", "attention": "flash2",
         "measured_step_time_s": "50", "predicted_step_time_s": "40"},
    ]
    trials = {0: 100_000, 1: 132_000, 2: 132_001}
    t = {(r[3], r[4]): r[5:] for r in bench.table(preds, trials)}
    assert t[("early", "pp1")][0] == 1 and abs(t[("early", "pp1")][1] - 0.10) < 1e-12
    assert abs(t[("late", "pp1")][1] - 0.40) < 1e-12
    assert abs(t[("late", "pp>1")][1] + 0.20) < 1e-12
    (k, a, b, m, p), = bench.pairs(preds, "attention", "flash1", "flash2")
    assert (a, b) == (0, 1) and abs(m - 0.75) < 1e-12 and abs(p - 42 / 44) < 1e-12
    (k, a, b, m, p), = bench.pairs(preds, "pp", "1", "2")
    assert (a, b) == (1, 2) and abs(m - 50 / 30) < 1e-12 and abs(p - 40 / 42) < 1e-12
