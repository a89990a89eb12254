"""``sim validate``: predictions against Hagemann et al. 2023's measured sweep and the
multi-source corpus of published runs (:mod:`sim.corpus`), with leave-one-source-out
cross-validation (:mod:`sim.loso`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from base.outputs import check_output_dir, output_dir, outputs
from sim.cli.args import int_at_least, worker_count
from sim.cli.progress import progress_bar, shows_progress


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def report_table(report: dict) -> str:
    lines = [f"{'group':<24} {'runs':>5} {'ok':>4} {'MAPE':>7} {'OOM acc':>8} {'Spearman':>9} "
             f"{'best hit':>8}"]
    misses = []
    for g in report["groups"]:
        name = f"{g['model']} s{g['seq_length']} {g['num_gpus']}gpu"
        lines.append(f"{name:<24} {g['runs']:>5} {g['ok_runs']:>4} "
                     f"{_fmt(g['step_time_mape'] and g['step_time_mape'] * 100, '6.1f')}% "
                     f"{g['oom_accuracy'] * 100:7.1f}% {_fmt(g['spearman'], '9.2f')} "
                     f"{'yes' if g['best_layout_hit'] else 'no':>8}")
        if not g["best_layout_hit"] and g["predicted_best_layout"] and g["measured_best_layout"]:
            ran = (f"{g['predicted_best_measured_s']:.1f} s ({g['predicted_best_gap'] * 100:+.1f}%)"
                   if g["predicted_best_gap"] is not None else g["predicted_best_status"])
            misses += [f"{name:<24} picked {g['predicted_best_layout']}: {ran}",
                       f"{'':<24} best   {g['measured_best_layout']}: "
                       f"{g['best_measured_s']:.1f} s"]
    if misses:
        lines += ["", "best-layout misses (measured step times):", *misses]
    cv = report.get("cross_validation_mape")
    lines += [
        "",
        f"step-time MAPE (all {report['ok_runs']} successful runs): "
        f"{report['step_time_mape'] * 100:.1f}%",
        f"out-of-memory accuracy ({report['runs_compared']} runs): "
        f"{report['oom_accuracy'] * 100:.1f}%",
        f"predicted best layout within 2% of measured best: "
        f"{report['best_layout_hits']} of {report['num_groups']} groups",
        "cross-validation MAPE (calibrated on 13B, predicting 30B and 65B): "
        + ("n/a" if cv is None else f"{cv * 100:.1f}%"),
    ]
    if report.get("sources"):
        lines += ["", sources_table(report["sources"])]
        lines += band_lines(report.get("oom_band"), report["sources"])
    lines.append(f"simulated in {report['elapsed_s']:.0f} s")
    return "\n".join(lines)


def _pct(x: float | None, spec: str = "6.1f") -> str:
    return f"{'n/a':>6} " if x is None else f"{x * 100:{spec}}%"


def sources_table(sources: list[dict]) -> str:
    """One line per source: runs simulated (of the file's), MAPE, mean signed and largest
    error, false OOM verdicts, leave-one-source-out MAPE; then the skipped rows' reasons, the
    rows whose step times the publisher's own measurements dispute (``disputed``, not in the
    step-time figures) and the rows a source contradicts itself on (``contradicted``, not in
    the false OOM count)."""
    lines = [f"{'source':<30} {'runs':>9} {'MAPE':>7} {'signed':>7} {'max':>7} "
             f"{'false OOM':>9} {'LOSO':>7}"]
    skipped = []
    for s in sources:
        runs = f"{s['runs']}/{s.get('rows_in_file', s['runs'])}"
        lines.append(f"{s['name']:<30} {runs:>9} {_pct(s['step_time_mape'])} "
                     f"{_pct(s['mean_signed_error'], '+6.1f')} {_pct(s['max_error'], '+6.1f')} "
                     f"{s['false_oom']:>9} {_pct(s['loso_mape'])}")
        reasons = sorted({k["reason"] for k in s.get("skipped", [])})
        skipped += [f"{s['name']}: {len([k for k in s['skipped'] if k['reason'] == r])} "
                    f"skipped: {r}" for r in reasons]
    if skipped:
        lines += ["", "rows not simulated (settings the schema does not accept):", *skipped]
    for s in sources:
        if s.get("disputed"):
            runs = ", ".join(f"{d['run']} ({d['error'] * 100:+.1f}%)" for d in s["disputed"])
            lines += ["", f"{s['name']}: step times disputed by the publisher's own "
                      f"measurements, simulated but not counted: {runs}"]
    for s in sources:
        if s.get("contradicted"):
            ran = ", ".join(str(p["ran"]) for p in s["contradicted"])
            oom = ", ".join(str(p["oom"]) for p in s["contradicted"])
            flagged = [str(p["ran"]) for p in s["contradicted"] if p.get("ran_predicted_oom")]
            lines += ["", f"{s['name']}: rows {ran} ran, but the source records the same per-GPU "
                      f"layouts out of memory on more DP replicas (rows {oom}; "
                      "docs/memory-gaps.md); not counted in its false OOM"
                      + (f" (predicted out of memory: {', '.join(flagged)})" if flagged else "")]
    return "\n".join(lines)


def band_lines(band: dict | None, sources: list[dict]) -> list[str]:
    """The OOM verdict's resolution (``oom_band``, :mod:`sim.oomband`): its half-width and,
    per source with false OOM verdicts, how many lie within it; nothing without a band."""
    if not band or band.get("half_width") is None:
        return []
    measured = (f" (the memory model's error on {band['published_peaks']} published peaks)"
                if band.get("measure") else "")
    lines = ["", f"OOM verdict resolution: peaks within {band['half_width'] * 100:.1f}% of the "
             f"capacity{measured},", "sim/data/oom_band.toml; the verdicts and counts above "
             "are the hard ones"]
    for s in sources:
        if s.get("false_oom") and s.get("false_oom_within_band") is not None:
            lines.append(f"{s['name']}: of {s['false_oom']} false OOM, "
                         f"{s['false_oom_within_band']} within it, "
                         f"{s['false_oom_beyond_band']} beyond")
    return lines


def _cmd_validate(args: argparse.Namespace) -> int:
    from sim.calibration import A100_HAGEMANN, A100_HAGEMANN_13B
    from sim.validate import (
        CLUSTER_PRESET,
        HAGEMANN_SWEEP,
        NICS_PER_NODE,
        evaluate,
        load_rows,
        write_csv,
    )

    out = check_output_dir(args.out) if args.out else None  # fails before simulating
    start = time.perf_counter()
    data = Path(args.data) if args.data else HAGEMANN_SWEEP
    rows = load_rows(data)
    sources = _corpus(args)  # read (and checked) before anything is simulated
    if args.limit:
        rows = rows[: args.limit]
    show = shows_progress(args)
    done = _simulate(args, rows, sources, data.stem, show)
    preds = done.preds
    report = evaluate(preds)
    report["cross_validation_mape"] = None
    if done.cross:  # the 30B and 65B rows, with the profile calibrated on 13B
        report["cross_validation_mape"] = evaluate(done.cross)["step_time_mape"]
    report["sources"], report["corpus_fit"], report["oom_band"] = _sources(
        data.stem, preds, sources, done.cpreds, done.fit)
    report["elapsed_s"] = time.perf_counter() - start
    report["profile"] = A100_HAGEMANN.source
    report["cross_validation_profile"] = A100_HAGEMANN_13B.source
    report["cluster"] = {"preset": CLUSTER_PRESET, "nics_per_node": NICS_PER_NODE}
    if out is not None:
        from plots.validation import plot_validation

        output_dir(out)
        with outputs() as files:
            write_csv(preds, files.temp(out / "validation.csv"))
            plot_validation(preds, files.temp(out / "validation.png"), report)
            files.temp(out / "validation.json").write_text(json.dumps(report, indent=2) + "\n",
                                                         encoding="utf-8")
            files.commit(last=("validation.json",))
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        print(report_table(report))
        if out is not None:
            print(f"wrote {args.out}/validation.csv, validation.json, validation.png")
    return 0


def _corpus(args: argparse.Namespace) -> list:
    """The corpus sources to validate: those of ``--corpus DIR``, else the shipped corpus
    unless ``--data`` names one sweep CSV (then none)."""
    from sim.corpus import COLUMNS, CORPUS_DIR, corpus_files, load_corpus

    if args.corpus:
        directory = Path(args.corpus)
        if not directory.is_dir():
            raise ConfigError(f"--corpus: {args.corpus!r} is not a directory")
        if not corpus_files(directory):  # a wrong directory would validate the sweep alone
            others = sorted(p.name for p in directory.glob("*.csv"))
            found = (f"its CSVs ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}) "
                     "have another header" if others else "it holds no CSV")
            raise ConfigError(f"--corpus: {args.corpus!r} holds no corpus CSV (a header "
                              f"starting {','.join(COLUMNS[:4])},...; {found}); e.g. copy one "
                              "of sim/data/validation/*.csv there")
        return load_corpus(directory)
    return [] if args.data else load_corpus(CORPUS_DIR)


def _simulate(args: argparse.Namespace, rows: list, sources: list, sweep_name: str,
              show: bool) -> Any:
    """Every simulation of the command, one job per row (:mod:`sim.valjobs`), in one pool:
    the sweep's predictions, the cross-validation's (the 30B and 65B rows with the profile
    calibrated on 13B; not with ``--no-cross-validation``), the corpus's and
    leave-one-source-out's sensitivities (not without a corpus), as a
    :class:`sim.valjobs.Validation`."""
    from sim import valjobs
    from sim.calibration import A100_HAGEMANN, A100_HAGEMANN_13B

    cross = not args.no_cross_validation
    fits = bool(sources) and cross
    sweep_jobs, corpus_jobs = valjobs.plan(
        rows, [r for s in sources for r in s.rows], A100_HAGEMANN,
        A100_HAGEMANN_13B if cross else None, "llama-13b", fits)
    progress, bar = progress_bar(show, "run", "validate")
    try:
        return valjobs.run(sweep_jobs, corpus_jobs, args.workers, progress, sweep_name,
                           cross=cross, fit=fits)
    finally:
        if bar is not None:
            bar.close()


def _sources(sweep_name: str, preds: list, sources: list, cpreds: list, fit: object
             ) -> tuple[list[dict], dict | None, dict]:
    """``sources`` of the report: the sweep's entry, then each corpus source's, with the
    leave-one-source-out MAPEs where ``fit`` (:class:`sim.loso.FitData`) is given;
    ``corpus_fit``, the Hopper GEMM time scale fitted on the corpus
    (:func:`sim.loso.fit_generation`; what ``sim/profiles/hopper.toml`` ships), None without
    the fits; and ``oom_band``, the OOM verdict's resolution (both from
    :func:`sim.validate.source_entries`)."""
    from sim.loso import fit_generation, leave_one_source_out
    from sim.validate import source_entries

    loso: dict = {}
    corpus_fit = None
    if fit is not None:
        loso = leave_one_source_out(fit)
        corpus_fit = fit_generation(fit)
    entries, band = source_entries(sweep_name, preds, sources, cpreds, loso)
    return entries, corpus_fit, band


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="compare predictions with Hagemann et al. 2023's sweep "
                       "and the corpus of published runs")
    p.add_argument("--data", default=None, help="sweep CSV (default: the bundled "
                   "Hagemann et al. 2023 sweep, sim/data/validation/hagemann2023_sweep.csv)")
    p.add_argument("--out", metavar="DIR", help="write validation.csv, .json and .png")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--workers", type=worker_count, default=2,
                   help="worker processes (default 2)")
    p.add_argument("--limit", type=int_at_least(0), default=0,
                   help="only the first N rows (quick look; 0: all)")
    p.add_argument("--corpus", metavar="DIR", default=None,
                   help="validate the corpus CSVs of DIR (default: the bundled corpus, "
                   "sim/data/validation/, unless --data is given)")
    p.add_argument("--no-cross-validation", action="store_true",
                   help="skip the 13B-calibrated prediction of 30B and 65B and the "
                   "leave-one-source-out fits")
    p.set_defaults(func=_cmd_validate)
