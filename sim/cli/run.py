"""``sim run FILE.yaml [--out DIR] [--json] [--fidelity F] [--steps N]``: one experiment.

Prints the summary table (or, with ``--json``, exactly the stats JSON object) and
with ``--out DIR`` writes ``stats.json``, ``trace.json``, ``timeline.png`` and
``idle.png``. ``--trace gz`` writes ``trace.json.gz`` instead, ``--trace none`` no
trace, and ``--trace-gpus`` limits the trace to some GPUs (a 1,024-GPU
full-fidelity trace is 140 MB).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from base.collector import gc_paused
from base.errors import ConfigError
from base.outputs import check_output_dir, outputs

__all__ = ["gpu_list", "register", "summary_table"]

LEFT_TO_EXIT: list[object] = []
"""The experiment and result of a ``sim run`` whose process ends right after it
(:func:`sim.cli.command`, ``args.until_exit``): kept, so that the process's end returns
their memory at once instead of the return of :func:`_cmd_run` freeing them object by
object (~7 ms of Megatron 1T's run)."""


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def _placement_line(placement: dict | None) -> str:
    if not placement:
        return "n/a"
    spans = ", ".join(f"{dim.upper()} group spans {placement[f'{dim}_servers']} server(s)"
                      for dim in ("tp", "dp", "pp"))
    return f"{placement['order']} (innermost first): {spans}"


def _params_line(stats: dict) -> str:
    total, active = stats.get("num_params"), stats.get("num_active_params")
    if total is None:
        return "n/a"
    if active is None or active == total:
        return f"{total / 1e9:.2f} B"
    return f"{total / 1e9:.2f} B, {active / 1e9:.2f} B active per token"


def summary_table(stats: dict) -> str:
    """The human-readable summary ``sim run`` prints."""
    lay = stats.get("layout", {})
    gpu = str(stats.get("gpu"))
    gpus = gpu if "x " in gpu else f"{stats['num_gpus']} x {gpu}"  # mixed: "16x A + 16x B"
    rows = [
        ("experiment", f"{stats.get('name')} ({stats.get('model')} on {gpus}, "
                       f"{stats.get('cluster')})"),
        ("parameters", _params_line(stats)),
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
    rows += _dp_mode_rows(stats)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)


def _dp_mode_rows(stats: dict) -> list[tuple[str, str]]:
    """Summary rows of the data-parallel modes and the batch policy (docs/dp-modes.md)."""
    rows = []
    if "sync_every" in stats:
        rows.append(("local SGD", f"sync every {stats['sync_every']} steps: sync step "
                     f"{stats['sync_step_time_s'] * 1e3:.3f} ms, local step "
                     f"{stats['local_step_time_s'] * 1e3:.3f} ms"))
    if "steps_run" in stats:
        rows.append(("steps run", f"{stats['steps_run']:,} (tokens_factor "
                     f"{stats['tokens_factor']:g})"))
    policy = stats.get("batch_policy")
    if policy:
        batches = ", ".join(f"{b} from step {s}" for s, b in policy["schedule"])
        rows.append(("batch policy", f"{policy['rule']}: {batches}; "
                     f"{policy['steps_run']:,} steps"))
    return rows


def gpu_list(text: str) -> tuple[int, ...] | str:
    """``--trace-gpus``: ``all``, ``pipeline`` (one GPU per pipeline stage: tp0 dp0), or
    ranks and inclusive ranges such as ``0,7,8-15``."""
    if text in ("all", "pipeline"):
        return text
    ranks: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected 'all', 'pipeline' or ranks like 0,7,8-15") from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"{text!r}: {part.strip()!r} is not a rank or an "
                                             "increasing range of ranks")
        if last - first >= 1 << 20:
            raise argparse.ArgumentTypeError(f"{text!r}: {part.strip()!r} is too long a range")
        ranks.extend(range(first, last + 1))
    return tuple(dict.fromkeys(ranks))


def _trace_gpus(spec: tuple[int, ...] | str, exp: Any) -> tuple[int, ...] | None:
    """The GPUs ``--trace-gpus`` names for ``exp`` (None: all); ConfigError if one is not
    a GPU of the cluster."""
    pl = exp.placement
    if spec == "all":
        return None
    if spec == "pipeline":
        return tuple(pl.gpu(pp=r) for r in range(pl.degree("pp")))
    bad = [g for g in spec if g >= pl.num_gpus]
    if bad:
        raise ConfigError(f"--trace-gpus: GPU {bad[0]} is not in the cluster (GPUs 0.."
                          f"{pl.num_gpus - 1})")
    return spec


def _cmd_run(args: argparse.Namespace) -> int:
    # importing the simulator (its config models above all) and building the experiment
    # make many long-lived objects and little garbage: the collector's scans of them were
    # 60 ms of Megatron 1T's `sim run` (base.collector)
    # (multi-step runs, jobs files and figures import their modules when asked for: a
    # step's `sim run --json` needs none of them)
    with gc_paused():
        from sim.api import simulate
        from sim.config import is_jobs_file, read_yaml
        from sim.experiment import build_experiment

        out = check_output_dir(args.out) if args.out else None  # fails before simulating
        data = read_yaml(args.file)
        exp = None if is_jobs_file(data) else build_experiment(data, Path(args.file).parent)
    if exp is None:
        from sim.jobs import build_jobs

        return _run_jobs(args, build_jobs(data, Path(args.file).parent), out)
    gpus = _trace_gpus(args.trace_gpus, exp)
    if args.steps is not None:
        from sim.faults_run import simulate_run

        result = simulate_run(exp, args.steps, fidelity=args.fidelity)
    else:
        result = simulate(exp, fidelity=args.fidelity)
    if out is not None:
        from sim.cli.figures import write_figures

        # a multi-step run's figures are its first step's (sim.faults_run.RunResult)
        step = result.results[0] if args.steps is not None else result
        with outputs() as files:  # stats.json renamed into place last
            paths = result.write(out, files, args.trace, gpus)
            if not args.no_plot:
                paths.update(write_figures(step, out, files))
            files.commit()
    if args.json:
        sys.stdout.write(result.stats_json())
    else:
        print(summary_table(result.stats))
        if out is not None:
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    if getattr(args, "until_exit", False):
        LEFT_TO_EXIT.append((exp, result))
    return 0


def jobs_table(stats: dict) -> str:
    """The human-readable summary of a multi-job run: each job's table, then the links."""
    parts = [f"job {job['name']} on GPUs {_ranges(job['gpus'])}\n{summary_table(job)}"
             for job in stats["jobs"]]
    links = stats["link_utilisation"]
    rows = [f"links over {links['span_s'] * 1e3:.3f} ms: {links['links_used']} carried "
            f"traffic, mean utilisation {links['mean'] * 100:.1f} %"]
    rows += [f"  {link['link']}  {link['utilisation'] * 100:.1f} %"
             for link in links["busiest"]]
    return "\n\n".join([*parts, "\n".join(rows)])


def _ranges(gpus: list[int]) -> str:
    """``0-7,16-23`` for a list of GPU ids."""
    runs: list[list[int]] = []
    for g in gpus:
        if runs and runs[-1][1] == g - 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _run_jobs(args: argparse.Namespace, jobset: Any, out: Any) -> int:
    """``sim run`` of a multi-job file (:mod:`sim.jobs`): one step of every job, together."""
    from sim.jobs import simulate_jobs

    if args.steps is not None:
        raise ConfigError("--steps: a multi-job file runs one step of each job; leave --steps "
                          "out")
    gpus = args.trace_gpus
    if gpus == "pipeline":
        raise ConfigError("--trace-gpus=pipeline: a multi-job file has a pipeline per job; "
                          "give GPU ids or all")
    if gpus != "all":
        bad = [g for g in gpus if g >= jobset.cluster.num_gpus]
        if bad:
            raise ConfigError(f"--trace-gpus: GPU {bad[0]} is not in the cluster (GPUs 0.."
                              f"{jobset.cluster.num_gpus - 1})")
    result = simulate_jobs(jobset, fidelity=args.fidelity)
    paths: dict = {}
    if out is not None:
        with outputs() as files:
            paths = result.write(out, files, args.trace, None if gpus == "all" else gpus)
            files.commit()
    if args.json:
        sys.stdout.write(result.stats_json())
    else:
        print(jobs_table(result.stats))
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
    run.add_argument("--trace", choices=("json", "gz", "none"), default="json",
                     help="with --out: write trace.json (json, the default), trace.json.gz "
                     "(gz: gzip, a fraction of the size) or no trace (none)")
    run.add_argument("--trace-gpus", type=gpu_list, default="all", metavar="GPUS",
                     help="with --out: only these GPUs in the trace: all (default), pipeline "
                     "(one GPU per pipeline stage, tp0 dp0) or ranks like 0,7,8-15")
    run.add_argument("--no-plot", action="store_true",
                     help="with --out, skip the figures (timeline.png, idle.png)")
    run.add_argument("--steps", type=int, metavar="N",
                     help="simulate N training steps: adds time_to_train_s, goodput and "
                     "lost_work_s; the file's training.global_batch_schedule and faults "
                     "(gpu_failures, link_faults, preemptions) apply only with --steps")
    run.add_argument("--fidelity", choices=("auto", "full", "collapsed"), default="auto",
                     help="full: every GPU and flow; collapsed: one GPU per pipeline rank with "
                     "collectives timed on the topology; auto: full up to 64 GPUs")
    run.set_defaults(func=_cmd_run)
