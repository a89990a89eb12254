"""Command line: ``sim search FILE.yaml [--gpus N] [--top K] [--executor local|ray] ...``.

Enumerates and ranks the layouts of an experiment (:mod:`sim.search`), prints
the top K (or, with ``--json``, exactly one JSON object) and, with ``--out
DIR``, writes ``results.csv`` (every layout judged), ``pareto.png``
(throughput against peak memory), ``search.json`` and the results database
``results.sqlite``. Results are stored as they arrive (``--db``): run the same
command again after an interruption and finished layouts are not redone.
By default layouts whose throughput bound cannot reach the K-th best are not
simulated (the top K stay exact); the plot then shows the layouts near the
top, and ``--exhaustive`` simulates every layout that fits, for the whole front.

Pinning: ``--fix parallel.tp=8,schedule=1f1b`` (alternatives with ``|``:
``--fix "mbs=1|2"``) restricts dimensions; ``--pin-from-file`` pins every
searched key the file sets; ``--fix "placement=tp-cp-dp-pp|tp-cp-pp-dp"`` searches rank
orders too (otherwise the file's ``parallel.placement`` holds). Without pins every
dimension is searched and the file's own layout is ignored, except that CP degrees
whose ring attention cannot hide its K/V passes (fewer than ``(kv/h)·F/B`` tokens per rank, see
``sim.search.cp_min_tokens``) are left out unless ``--fix cp=...`` names them,
and a ``parallel.layers_per_stage`` list in the file fixes the stage count
(``balanced`` splits every layout's layers as ``sim run`` does). Mixed-GPU
clusters are searched too: with the default ``--fidelity collapsed`` layouts whose
pipeline ranks mix GPU types are reported invalid (``--fidelity auto`` simulates
them in full). A
progress bar on stderr shows layouts done, rate and time left; it is off with
``--json``, ``--no-progress`` or when stderr is not a terminal. Errors follow
``sim run``: exit status 2 and one ``error:`` line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from base.outputs import check_output_dir, output_dir, outputs
from sim.cli.progress import progress_bar, shows_progress

__all__ = ["register", "top_table"]


def register(subparsers: Any) -> None:
    """Add the ``search`` command to ``sim``'s sub-command parsers."""
    cmd = subparsers.add_parser(
        "search", help="find the fastest layouts (TP, PP, DP, CP, EP, vpp, micro-batch, SP, "
                       "ZeRO, recompute, schedule) that fit in memory")
    cmd.add_argument("file", help="experiment YAML file (model, cluster, global batch)")
    cmd.add_argument("--gpus", type=int, metavar="N", help="search for N GPUs instead of "
                     "cluster.num_gpus")
    cmd.add_argument("--top", type=int, default=10, metavar="K",
                     help="print (and keep exact under pruning) the K best layouts (default 10)")
    cmd.add_argument("--fix", action="append", default=[], metavar="KEY=V[|V...],...",
                     help="pin dimensions, e.g. parallel.tp=8,schedule=1f1b or 'mbs=1|2' "
                          "(repeatable)")
    cmd.add_argument("--pin-from-file", action="store_true",
                     help="pin every searched key that the experiment file sets (--fix "
                          "overrides it for the keys it names)")
    cmd.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local worker processes (default) or a Ray cluster")
    cmd.add_argument("--workers", type=int, metavar="W",
                     help="parallel workers (default: CPU count; 1 runs in this process)")
    cmd.add_argument("--ray-address", metavar="ADDR",
                     help="with --executor ray: the cluster to join (default: start a local "
                          "runtime)")
    cmd.add_argument("--db", metavar="FILE", help="SQLite results database (default: "
                     "DIR/results.sqlite with --out, else in memory); reused to resume")
    cmd.add_argument("--out", metavar="DIR",
                     help="write results.csv, pareto.png, search.json and results.sqlite")
    cmd.add_argument("--json", action="store_true", help="print exactly one JSON object")
    cmd.add_argument("--no-plot", action="store_true", help="with --out, skip pareto.png")
    cmd.add_argument("--exhaustive", action="store_true",
                     help="simulate every layout that fits (no pruning by throughput bound)")
    cmd.add_argument("--fidelity", choices=("auto", "full", "collapsed"), default="collapsed",
                     help="simulation fidelity (default: collapsed, the fast path)")
    cmd.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmd.set_defaults(func=_cmd_search)


def _cmd_search(args: argparse.Namespace) -> int:
    from base.errors import ConfigError
    from sim.config import read_yaml
    from sim.executors import make_executor
    from sim.search import ResultStore, parse_pins, pins_from_file, rows_csv, search

    data = read_yaml(args.file)
    if not isinstance(data, dict):
        raise ConfigError(f"file {args.file!r}: the experiment must be a mapping of keys, "
                          f"got {'an empty file' if data is None else type(data).__name__}")
    if "jobs" in data:  # not 'needs a transformer model': the jobs' models are not read
        raise ConfigError("jobs: a file of several jobs is simulated by 'sim run' (sim.jobs); "
                          "sim search takes one experiment (model, cluster, parallel, training)")
    pins = pins_from_file(data) if args.pin_from_file else {}
    pins.update(parse_pins(args.fix))
    out = check_output_dir(args.out) if args.out else None  # fails before searching
    db = args.db or (str(out / "results.sqlite") if out else None)
    progress, bar = progress_bar(shows_progress(args), "layout", "search")
    try:
        with make_executor(args.executor, args.workers, args.ray_address) as executor, \
                ResultStore(db) as store:
            result = search(data, base_dir=Path(args.file).parent, gpus=args.gpus, pins=pins,
                            top=args.top, fidelity=args.fidelity, executor=executor,
                            store=store, prune=not args.exhaustive, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    summary = result.summary(args.top)
    summary["db"] = db
    written: list[Path] = []
    if out:
        output_dir(out)
        with outputs() as files:  # search.json, which lists the others, renamed last
            files.temp(out / "results.csv").write_text(rows_csv(result.rows), encoding="utf-8")
            written.append(out / "results.csv")
            if not args.no_plot:
                _plot(files.temp(out / "pareto.png"), result)
                written.append(out / "pareto.png")
            summary["files"] = [str(p) for p in written] + [str(out / "search.json")]
            files.temp(out / "search.json").write_text(_json(summary), encoding="utf-8")
            written.append(out / "search.json")
            files.commit(last=("search.json",))
    if args.json:
        sys.stdout.write(_json(summary))
        return 0
    print(_header(summary))
    print(top_table(result.top(args.top)) if result.best else
          "no layout fits in memory (see the counts above)")
    if db:
        print(f"results database: {db}")
    if written:
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2) + "\n"


def _plot(path: Path, result: Any) -> None:
    from plots.pareto import plot_pareto  # matplotlib only when plotting

    best = result.best
    plot_pareto([r.as_dict() for r in result.rows], path,
                title=f"{result.experiment}: {result.num_gpus} GPUs, global batch "
                      f"{result.global_batch_size}",
                best_key=best.layout.key if best else None)


def _header(summary: dict[str, Any]) -> str:
    counts = summary["counts"]
    parts = [f"{counts.get(k, 0)} {label}" for k, label in (
        ("ok", "feasible"), ("oom", "out of memory when simulated"),
        ("memory", "rejected by the memory bound"), ("pruned", "pruned by the throughput bound"),
        ("invalid", "invalid"), ("error", "failed")) if counts.get(k)]
    rate = summary["layouts_per_s"]
    return (f"{summary['experiment']}: {summary['num_gpus']} GPUs, global batch "
            f"{summary['global_batch_size']}: {summary['evaluated']} layouts evaluated in "
            f"{summary['elapsed_s']:.1f} s ({rate:,.0f}/s; {summary['simulated']} simulated, "
            f"{summary['resumed']} from the database)\n  " + ", ".join(parts))


def top_table(rows: list[Any]) -> str:
    """The table of the best layouts ``sim search`` prints."""
    head = ("#", "layout", "step s", "tokens/s", "MFU %", "peak GiB", "bubble %")
    body = [(str(r.rank), r.layout.label(), f"{r.figure('step_time_s'):.3f}",
             f"{r.figure('tokens_per_s'):,.0f}",
             "n/a" if r.figure("mfu") is None else f"{100 * r.figure('mfu'):.1f}",
             f"{r.figure('peak_memory_gib'):.1f}", f"{100 * r.figure('bubble_fraction'):.1f}")
            for r in rows]
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]
    lines = []
    for row in (head, *body):
        cells = [c.ljust(w) if i == 1 else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
