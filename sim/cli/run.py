"""``sim run FILE.yaml [--out DIR] [--json] [--fidelity F] [--steps N]``: one experiment.

Prints the summary table (or, with ``--json``, exactly the stats JSON object) and
with ``--out DIR`` writes ``stats.json``, ``trace.json``, ``timeline.png`` and
``idle.png``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from base.outputs import output_dir, outputs

__all__ = ["register", "summary_table"]


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def _placement_line(placement: dict | None) -> str:
    if not placement:
        return "n/a"
    spans = ", ".join(f"{dim.upper()} group spans {placement[f'{dim}_servers']} server(s)"
                      for dim in ("tp", "dp", "pp"))
    return f"{placement['order']} (innermost first): {spans}"


def summary_table(stats: dict) -> str:
    """The human-readable summary ``sim run`` prints."""
    lay = stats.get("layout", {})
    gpu = str(stats.get("gpu"))
    gpus = gpu if "x " in gpu else f"{stats['num_gpus']} x {gpu}"  # mixed: "16x A + 16x B"
    rows = [
        ("experiment", f"{stats.get('name')} ({stats.get('model')} on {gpus}, "
                       f"{stats.get('cluster')})"),
        ("layout", " ".join(f"{k}={v}" for k, v in lay.items()) +
         f"  schedule={stats.get('schedule')}  micro-batches={stats.get('num_microbatches')}"),
        ("placement", _placement_line(stats.get("placement"))),
        ("step time", _fmt(stats["step_time_s"] * 1e3, ".3f", " ms") + (
            f"  (period of {stats['steps_simulated']} steps back to back; first step "
            f"{stats['first_step_s'] * 1e3:.3f} ms)" if "first_step_s" in stats else "")),
        ("tokens/s", _fmt(stats["tokens_per_s"], ",.0f")),
        ("TFLOP/s per GPU", _fmt(stats["tflops_per_gpu"], ".1f")),
        ("MFU", _fmt(stats["mfu"] * 100 if stats["mfu"] is not None else None, ".1f", " %")),
        ("bubble fraction", _fmt(stats["bubble_fraction"] * 100, ".2f", " %")),
        ("peak memory", _fmt(stats["peak_memory_gib"], ".2f", " GiB") + " of " +
         _fmt(stats["memory_capacity_gib"], ".1f", " GiB") + ("  OUT OF MEMORY" if stats["oom"]
                                                               else "")),
    ]
    for r, gib in enumerate(stats.get("peak_memory_per_stage_gib", [])):
        rows.append((f"  pipeline stage {r}", _fmt(gib, ".2f", " GiB")))
    rows.append(("exposed comm", ""))
    for kind, sec in stats["exposed_comm_s"].items():
        rows.append((f"  {kind}", _fmt(sec * 1e3, ".3f", " ms")))
    idle = stats.get("idle_breakdown", {}).get("mean_s")
    if idle:
        rows.append(("idle per GPU (mean)", _fmt(idle["idle_s"] * 1e3, ".3f", " ms")))
        rows += [(f"  {cause}", _fmt(sec * 1e3, ".3f", " ms")) for cause, sec in idle.items()
                 if cause != "idle_s" and sec > 0]
    if "time_to_train_s" in stats:
        rows += [
            ("steps", str(stats["steps"])),
            ("time to train", _fmt(stats["time_to_train_s"], ",.3f", " s")),
            ("goodput", _fmt(stats["goodput"] * 100, ".2f", " %")),
            ("lost work", _fmt(stats["lost_work_s"], ",.3f", " s") +
             f" ({stats['failures']} failures)"),
        ]
        if stats.get("preemption_stall_s"):
            rows.append(("preemption stalls", _fmt(stats["preemption_stall_s"], ",.3f", " s")))
        if stats.get("preemption_lost_s"):
            rows.append(("preempted steps", _fmt(stats["preemption_lost_s"], ",.3f", " s")))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)


def _cmd_run(args: argparse.Namespace) -> int:
    from sim.api import load_experiment, simulate
    from sim.cli.figures import write_figures
    from sim.faults_run import RunResult, simulate_run

    out = output_dir(args.out) if args.out else None  # a bad --out fails before simulating
    exp = load_experiment(args.file)
    if args.steps is not None:
        result = simulate_run(exp, args.steps, fidelity=args.fidelity)
    else:
        result = simulate(exp, fidelity=args.fidelity)
    if out is not None:
        with outputs() as files:  # stats.json renamed into place last
            paths = result.write(out, files)
            if not args.no_plot:
                step = result.results[0] if isinstance(result, RunResult) else result
                paths.update(write_figures(step, out, files))
            files.commit()
    if args.json:
        sys.stdout.write(result.stats_json())
    else:
        print(summary_table(result.stats))
        if out is not None:
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def register(subparsers: Any) -> None:
    """Add the ``run`` command to ``sim``'s sub-command parsers."""
    run = subparsers.add_parser("run", help="simulate one training step of an experiment file")
    run.add_argument("file", help="experiment YAML file")
    run.add_argument("--out", metavar="DIR", help="write stats.json, trace.json, timeline.png, "
                     "idle.png")
    run.add_argument("--json", action="store_true", help="print exactly one JSON object")
    run.add_argument("--no-plot", action="store_true", help="with --out, skip timeline.png")
    run.add_argument("--steps", type=int, metavar="N",
                     help="simulate N training steps: adds time_to_train_s, goodput and "
                     "lost_work_s; the file's training.global_batch_schedule and faults "
                     "(gpu_failures, link_faults, preemptions) apply only with --steps")
    run.add_argument("--fidelity", choices=("auto", "full", "collapsed"), default="auto",
                     help="full: every GPU and flow; collapsed: one GPU per pipeline rank with "
                     "collectives timed on the topology; auto: full up to 64 GPUs")
    run.set_defaults(func=_cmd_run)
