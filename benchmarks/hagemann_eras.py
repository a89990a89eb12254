"""Hagemann et al.'s sweep by measurement campaign: the sheets' trial IDs beside the errors.

    python benchmarks/hagemann_eras.py                  # the table (docs/validation.csv)
    python benchmarks/hagemann_eras.py --pairs          # flash2/flash1 and pp>1/pp1 pairs
    python benchmarks/hagemann_eras.py --from-xlsx DIR  # the trials CSV, from the sheets

The sweep's sheets (Aleph-Alpha/NeurIPS-WANT-submission-efficient-parallelization-layouts at
e13c2cb, ``data/*.xlsx`` and ``data/seqpara/*.xlsx``) give every run a ``Trial ID``. The
FlashAttention-2 runs (kernel ``flash_attention2`` and ``flash_attention2 + RMS kernel``) all
have IDs 131,645-133,010; the FlashAttention-1, fused-softmax and torch runs 96,769-105,930.
``--from-xlsx`` (needs openpyxl) matches each row of ``hagemann2023_sweep.csv`` to its trial
(same sheet, kernel label, micro-batch, TP, PP, checkpointing, sequence parallelism and, for a
run that ran, step time; two rows with the same settings take the sheet's trials in order)
and prints ``sim/data/validation/hagemann2023_trials.csv``. Without it, the shipped trials
CSV and the per-run predictions in ``docs/validation.csv`` (``sim validate --out``) give the
median signed error (predicted / measured - 1) per group, campaign (trial below 120,000:
"early", else "late") and pipeline depth. Nothing here is read by the simulator
(docs/accuracy.md, "FlashAttention-2 at PP 1 against PP > 1 in the 13B 2k sheets").
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "sim" / "data" / "validation" / "hagemann2023_sweep.csv"
TRIALS = ROOT / "sim" / "data" / "validation" / "hagemann2023_trials.csv"
PREDICTIONS = ROOT / "docs" / "validation.csv"
EARLY_BELOW = 120_000
"""Trial IDs below this are the first campaign (96,769-105,930), above it the second
(131,645-133,010); nothing in the sheets falls between."""

_CHECKPOINTING = {"none": "disabled", "full": "every_layer"}


def _number(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def trials_from_xlsx(data_dir: Path) -> list[tuple[int, str, int]]:
    """(sweep row, sheet, trial ID) for every row of the sweep CSV, read from the sheets."""
    import openpyxl

    sheets: dict[str, list[dict]] = {}
    for f in sorted(data_dir.glob("*.xlsx")) + sorted(data_dir.glob("seqpara/*.xlsx")):
        ws = openpyxl.load_workbook(f, read_only=True).worksheets[0]
        rows = list(ws.iter_rows(values_only=True))
        header = rows[1]
        sheets[f.name] = [dict(zip(header, r, strict=True)) for r in rows[2:] if r[0] is not None]
    used: set[tuple[str, int]] = set()
    out = []
    with SWEEP.open(newline="") as fh:
        for i, s in enumerate(csv.DictReader(fh)):
            step = _number(s["step_time_s"])
            cands = [
                r for r in sheets[s["source_file"]]
                if r["kernel"] == s["source_kernel_label"]
                and r["micro_batch_size"] == int(s["micro_batch_size"])
                and r["model_parallel_size"] == int(s["tp"])
                and r["pipe_parallel_size"] == int(s["pp"])
                and r["activation_checkpointing_type"] == _CHECKPOINTING[s["recompute"]]
                and ("sequence_parallel" not in r
                     or bool(r["sequence_parallel"]) == (s["sequence_parallel"] == "true"))
                and (step is None or (_number(r["Average Step Time"]) is not None
                                      and abs(_number(r["Average Step Time"]) - step) < 1e-3))
                and (s["source_file"], r["Trial ID"]) not in used
            ]
            if not cands:
                raise SystemExit(f"row {i}: no trial in {s['source_file']} matches")
            used.add((s["source_file"], cands[0]["Trial ID"]))
            out.append((i, s["source_file"], int(cands[0]["Trial ID"])))
    return out


def load_trials() -> dict[int, int]:
    with TRIALS.open(newline="") as fh:
        return {int(r["row"]): int(r["trial_id"]) for r in csv.DictReader(fh)}


def load_predictions() -> list[dict]:
    with PREDICTIONS.open(newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["status"] == "ok"]


def era(trial: int) -> str:
    return "early" if trial < EARLY_BELOW else "late"


def table(preds: list[dict], trials: dict[int, int]) -> list[tuple]:
    """(model, seq, GPUs, campaign, pp1 or pp>1, runs, median signed error, mean |error|)."""
    groups = defaultdict(list)
    for r in preds:
        e = float(r["predicted_step_time_s"]) / float(r["measured_step_time_s"]) - 1
        groups[(r["model"], int(r["seq_length"]), int(r["num_gpus"]), era(trials[int(r["row"])]),
                "pp1" if r["pp"] == "1" else "pp>1")].append(e)
    return [(*k, len(v), statistics.median(v), statistics.fmean(map(abs, v)))
            for k, v in sorted(groups.items())]


def pairs(preds: list[dict], vary: str, a: str, b: str) -> list[tuple]:
    """Runs that differ only in ``vary`` (``attention`` or ``pp``), ``b`` over ``a``: measured
    and predicted step-time ratios."""
    fields = ("model", "seq_length", "num_gpus", "tp", "pp", "micro_batch_size", "recompute",
              "attention", "fused_norm", "sequence_parallel")
    by = {tuple(r[f] for f in fields): r for r in preds}
    i = fields.index(vary)
    out = []
    for k, ra in sorted(by.items()):
        if k[i] != a:
            continue
        rb = by.get(k[:i] + (b,) + k[i + 1:])
        if rb is None:
            continue
        m = float(rb["measured_step_time_s"]) / float(ra["measured_step_time_s"])
        p = float(rb["predicted_step_time_s"]) / float(ra["predicted_step_time_s"])
        out.append((k, int(ra["row"]), int(rb["row"]), m, p))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from-xlsx", type=Path, metavar="DIR",
                    help="the sheets' data/ directory: print the trials CSV")
    ap.add_argument("--pairs", action="store_true",
                    help="flash2/flash1 and pp2/pp1 pairs with their campaigns")
    args = ap.parse_args(argv)
    if args.from_xlsx:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(["row", "source_file", "trial_id"])
        w.writerows(trials_from_xlsx(args.from_xlsx))
        return 0
    trials, preds = load_trials(), load_predictions()
    if args.pairs:
        for vary, a, b in (("attention", "flash1", "flash2"), ("pp", "1", "2"), ("pp", "1", "4")):
            print(f"{vary} {b} over {a}: layout | rows | campaigns | measured | predicted")
            for k, ra, rb, m, p in pairs(preds, vary, a, b):
                print(f"  {' '.join(k)} | {ra},{rb} | {era(trials[ra])},{era(trials[rb])} | "
                      f"{m:.3f} | {p:.3f}")
        return 0
    print("model | seq | GPUs | campaign | pp | runs | median signed | mean abs")
    for model, seq, gpus, camp, pp, n, med, mae in table(preds, trials):
        print(f"{model} | {seq} | {gpus} | {camp} | {pp} | {n} | {med * 100:+.1f}% | "
              f"{mae * 100:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
