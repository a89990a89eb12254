"""Command line: ``sim compare FILE.yaml [--schedules a,b,...] [--out DIR] [--json]``.

Runs one experiment under several pipeline schedules (:mod:`sim.compare`),
prints one table (or, with ``--json``, exactly one JSON object) and with
``--out DIR`` writes ``compare.csv``, ``compare.json``, ``compare.png`` (the
timelines stacked on a shared time axis plus bars of step time and peak
activation memory) and ``memory.png`` (memory over time per schedule).
Errors follow ``sim run``: exit status 2 and one ``error:`` line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from base.outputs import Outputs, check_output_dir, output_dir, outputs
from workloads.registry import DEFAULT_SCHEDULES, MULTIMODAL_SCHEDULES

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``compare`` command to ``sim``'s sub-command parsers."""
    cmd = subparsers.add_parser(
        "compare", help="run one experiment under several pipeline schedules and compare them")
    cmd.add_argument("file", help="experiment YAML file")
    cmd.add_argument("--schedules", default=None, metavar="A,B,...",
                     help="comma-separated schedule names or schedule files "
                          f"(default: {','.join(DEFAULT_SCHEDULES)}; with model.encoder, "
                          f"{','.join(MULTIMODAL_SCHEDULES)})")
    cmd.add_argument("--out", metavar="DIR",
                     help="write compare.csv, compare.json, compare.png and memory.png")
    cmd.add_argument("--json", action="store_true", help="print exactly one JSON object")
    cmd.add_argument("--no-plot", action="store_true", help="with --out, skip the figures")
    cmd.set_defaults(func=_cmd_compare)


def _cmd_compare(args: argparse.Namespace) -> int:
    from sim.api import load_experiment
    from sim.compare import compare, parse_schedules, rows_csv, rows_json, rows_table

    out = check_output_dir(args.out) if args.out else None  # fails before simulating
    given = args.schedules
    names = parse_schedules(given) if given is not None else None  # a bad list fails first
    exp = load_experiment(args.file)
    if names is None:
        multimodal = exp.config.model.encoder is not None
        names = list(MULTIMODAL_SCHEDULES if multimodal else DEFAULT_SCHEDULES)
    rows, results = compare(exp, names, base_dir=Path(args.file).parent)
    text = rows_json(rows, exp.name)
    written: list[Path] = []
    if out is not None:
        output_dir(out)
        with outputs() as files:
            files.temp(out / "compare.csv").write_text(rows_csv(rows), encoding="utf-8")
            files.temp(out / "compare.json").write_text(text, encoding="utf-8")
            if not args.no_plot:
                _plot(out, files, exp.name, rows, results)
            written = files.commit(last=("compare.json",))
    if args.json:
        sys.stdout.write(text)
    else:
        print(f"{exp.name}: {len(rows)} schedules, pp={exp.placement.degree('pp')}, "
              f"micro-batches={exp.num_microbatches}")
        print(rows_table(rows))
        if written:
            print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _plot(out: Path, files: Outputs, name: str, rows: list, results: list) -> None:
    from plots.compare import plot_compare  # matplotlib only when plotting
    from plots.memory import plot_memory

    gpus = [[r.experiment.placement.gpu(pp=k) for k in range(r.experiment.placement.degree("pp"))]
            for r in results]
    timelines = [r.timeline for r in results]
    plot_compare([row.as_dict() for row in rows], timelines, files.temp(out / "compare.png"), gpus,
                 title=f"{name}: pipeline schedules compared")
    plot_memory([(row.schedule, t) for row, t in zip(rows, timelines, strict=True)],
                files.temp(out / "memory.png"), gpus, title=f"{name}: memory per pipeline rank")
