"""The Python API the CLI is built on: load, simulate, inspect, change, plot.

    from sim import load_experiment, simulate
    exp = load_experiment("workloads/examples/gpt-1.3b-pp4.yaml")
    result = simulate(exp)
    print(result.stats["step_time_s"])
    faster = simulate(exp.with_changes({"schedule": "gpipe"}))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.calibration import default_profile
from sim.commtime import CollectiveTimer
from sim.device import DeviceProfile, compute_time_s
from sim.engine import simulate_program
from sim.errors import ConfigError
from sim.experiment import Experiment
from sim.export import write_chrome_trace
from sim.stats import RunFacts, compute_stats
from sim.timeline import Timeline
from workloads.costs import ComputeSeg
from workloads.lowering import Collapse, lower
from workloads.program import Compute, Program


@dataclass(frozen=True, eq=False)
class Result:
    """One simulated step: the experiment, its lowered program, timeline and stats."""

    experiment: Experiment
    program: Program
    timeline: Timeline
    stats: dict[str, Any]

    def stats_json(self) -> str:
        """The stats as the exact JSON text ``sim run --json`` prints (deterministic)."""
        return json.dumps(self.stats, indent=2) + "\n"

    def write(self, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
        """Write ``stats.json``, ``trace.json`` and (if ``plot``) ``timeline.png``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"stats": out / "stats.json", "trace": out / "trace.json"}
        paths["stats"].write_text(self.stats_json(), encoding="utf-8")
        write_chrome_trace(self.timeline, paths["trace"], title=self.experiment.name)
        if plot:
            paths["timeline"] = out / "timeline.png"
            self.plot(paths["timeline"])
        return paths

    def plot(self, path: str | Path, gpus: list[int] | None = None) -> None:
        """Save the Gantt chart of the timeline (PNG or SVG by suffix).

        By default it shows one pipeline: the GPU of TP rank 0, DP rank 0 of
        every pipeline stage (the other replicas run the same program).
        """
        from plots.timeline import plot_timeline  # matplotlib only when plotting

        exp = self.experiment
        pl = exp.placement
        if gpus is None:
            gpus = [pl.gpu(pp=r) for r in range(pl.degree("pp"))]
        replica = " (one pipeline: tp0 dp0)" if len(gpus) < pl.num_gpus else ""
        title = (f"{exp.name}: {exp.schedule.name}, step {self.stats['step_time_s'] * 1e3:.1f} ms, "
                 f"bubble {self.stats['bubble_fraction']:.1%}{replica}")
        plot_timeline(self.timeline, path, title=title, gpus=gpus)


def load_experiment(path: str | Path) -> Experiment:
    """Load and validate an experiment YAML file (raises ConfigError on bad input)."""
    return Experiment.from_yaml(path)


def _facts(exp: Experiment, fidelity: str, profile: DeviceProfile) -> RunFacts:
    pl = exp.placement
    layout = {"tp": pl.degree("tp"), "pp": pl.degree("pp"), "dp": pl.degree("dp"),
              "cp": pl.degree("cp"), "vpp": exp.schedule.chunks_per_rank}
    extra = (
        ("name", exp.name),
        ("schedule", exp.schedule.name),
        ("layout", layout),
        ("num_microbatches", exp.num_microbatches),
        ("global_batch_size", exp.global_batch_size),
        ("model", exp.model.name if exp.model else "synthetic"),
        ("cluster", exp.cluster.name),
        ("gpu", exp.cluster.gpu.name),
        ("fidelity", fidelity),
        ("placement", _placement_report(exp)),
    )
    return RunFacts(
        pipeline_rank=tuple(pl.coords(g)["pp"] for g in range(pl.num_gpus)),
        peak_flops=exp.cluster.gpu.peak_bf16_flops,
        memory_capacity_bytes=exp.cluster.gpu.hbm_capacity_bytes,
        tokens_per_step=exp.tokens_per_step,
        model_flops_per_step=exp.model_flops_per_step,
        reserved_bytes=0.0 if exp.model is None else profile.reserved_bytes,
        fragmentation=0.0 if exp.model is None else profile.fragmentation,
        extra=extra,
    )


FIDELITIES = ("auto", "full", "collapsed")
AUTO_FULL_MAX_GPUS = 64
"""``fidelity="auto"`` simulates every GPU up to this many GPUs, and collapses above."""


def _placement_report(exp: Experiment) -> dict:
    """Where the layout's groups landed: the order and, per dimension, GPU 0's group
    and how many servers it spans."""
    pl, cluster = exp.placement, exp.cluster
    order = "-".join(dim for dim, _ in pl.sizes)
    report: dict = {"order": order}
    for dim in ("tp", "dp", "pp"):
        group = pl.group(dim, 0)
        report[f"{dim}_group_of_gpu0"] = list(group)
        report[f"{dim}_servers"] = len({cluster.host_of(g) for g in group})
    return report


def simulate(exp: Experiment, profile: DeviceProfile | None = None,
             fidelity: str = "auto") -> Result:
    """Lower ``exp`` to per-GPU programs, run them on its cluster and compute the stats.

    ``fidelity``: ``full`` simulates every GPU and every collective as flows;
    ``collapsed`` simulates one GPU per pipeline rank with TP and DP collectives
    timed on the real topology (:mod:`sim.commtime`); ``auto`` picks full up to
    :data:`AUTO_FULL_MAX_GPUS` GPUs.
    """
    if fidelity not in FIDELITIES:
        raise ConfigError(f"fidelity={fidelity!r}: choose one of {', '.join(FIDELITIES)}")
    profile = profile or default_profile(exp.cluster.gpu.name)
    gpu = exp.cluster.gpu
    kernel = exp.config.training.attention

    def work_time(item: Compute | ComputeSeg) -> float:
        if item.duration_s is not None:
            return item.duration_s
        return compute_time_s(gpu, profile, item.flops, item.hbm_bytes, item.attn_flops,
                              item.elementwise_bytes, kernel, item.gemm_dims)

    if fidelity == "auto":
        fidelity = "full" if exp.cluster.num_gpus <= AUTO_FULL_MAX_GPUS else "collapsed"
    collapse = None
    if fidelity == "collapsed":
        collapse = Collapse(compute_s=work_time, collective_s=CollectiveTimer(exp.cluster))
    program = lower(exp.schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage,
                    collapse)
    timeline = simulate_program(program, exp.cluster, work_time)
    return Result(exp, program, timeline, compute_stats(timeline, _facts(exp, fidelity, profile)))
