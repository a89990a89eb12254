"""Command line: ``sim run FILE.yaml [--out DIR] [--json]``.

Invalid input of any kind exits with status 2 and one line on stderr starting
with ``error:`` that names the offending key and value; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from base.errors import SimError
from sim.cli_collective import register as register_collective
from sim.cli_compare import register as register_compare
from sim.cli_search import register as register_search
from sim.cli_validate import register as register_validate


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one ``error:`` line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


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
    from sim.api import load_experiment, simulate, simulate_run

    exp = load_experiment(args.file)
    if args.steps is not None:
        result = simulate_run(exp, args.steps, fidelity=args.fidelity)
    else:
        result = simulate(exp, fidelity=args.fidelity)
    if args.out:
        paths = result.write(args.out, plot=not args.no_plot)
    if args.json:
        sys.stdout.write(result.stats_json())
    else:
        print(summary_table(result.stats))
        if args.out:
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sim", description="Discrete-event simulator for distributed LLM "
                     "training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="simulate one training step of an experiment file")
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
    register_compare(sub)
    register_collective(sub)
    register_search(sub)
    register_validate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SimError as exc:
        message = str(exc).splitlines()
        sys.stderr.write(f"error: {' | '.join(line.strip() for line in message if line.strip())}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. `sim run ... | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
