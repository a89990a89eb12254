"""The Python API the CLI is built on: load, simulate, inspect, change.

    from sim import load_experiment, simulate
    exp = load_experiment("workloads/examples/gpt-1.3b-pp4.yaml")
    result = simulate(exp)
    print(result.stats["step_time_s"])
    faster = simulate(exp.with_changes({"schedule": "gpipe"}))
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from base.outputs import Outputs, output_dir, outputs
from sim import budget, reserved
from sim.a2aoverlap import lowering_costs as a2a_lowering_costs
from sim.amaxreduce import lowering_costs as amax_lowering_costs
from sim.calibration import default_profile
from sim.commtime import CollectiveTimer
from sim.cpoverlap import lowering_costs as cp_lowering_costs
from sim.device import DeviceProfile, compute_time_s, rank_timers
from sim.dpmodes import cycle_stats, ps_servers, stale_steps, steps_overlap
from sim.engine import InstructionTimes, simulate_program
from sim.experiment import Experiment
from sim.faults import (
    straggler_slowdowns,
)
from sim.fsdpoverlap import lowering_costs as fsdp_lowering_costs
from sim.gpu_profiles import generation_of
from sim.hostwait import lowering_costs as host_lowering_costs
from sim.idle import idle_breakdown, summarize
from sim.stats import RunFacts, compute_stats
from sim.statsjson import indented
from sim.timeline import Timeline
from sim.tpoverlap import lowering_costs
from topologies.hardware import GPUSpec
from topologies.placement import coordinate_columns, mixed_pipeline_ranks
from workloads.costs import ComputeSeg
from workloads.frameworks import fragmentation
from workloads.lowering import Collapse, lower
from workloads.multistep import repeat_program, step_end_times, without_dp
from workloads.program import Compute, Program


@dataclass(frozen=True, eq=False)
class Result:
    """One simulated step: the experiment, its lowered program, timeline and stats.

    For schedules whose steps overlap (and whenever ``steps > 1`` was asked), the
    program and timeline hold several steps and the stats describe the last one
    as a steady-state step (:func:`simulate`).
    """

    experiment: Experiment
    program: Program
    timeline: Timeline
    stats: dict[str, Any]
    steps: int = 1
    """Steps simulated back to back."""
    step_ends_s: tuple[float, ...] = ()
    """End of each simulated step (the last instruction of that step to finish)."""

    @property
    def first_step_s(self) -> float:
        """Time of the first step from an idle cluster (pipeline fill included)."""
        return self.step_ends_s[0] if self.step_ends_s else self.stats["step_time_s"]

    def stats_json(self) -> str:
        """The stats as the exact JSON text ``sim run --json`` prints (deterministic)."""
        return stats_json(self.stats)

    def write(self, out_dir: str | Path, files: Outputs | None = None, trace: str = "json",
              gpus: Sequence[int] | None = None) -> dict[str, Path]:
        """Write the trace (``trace``: a key of :data:`TRACE_FILES`; ``gpus``: only these
        GPUs) and ``stats.json`` into ``out_dir`` under temporary names and rename them
        into place, stats last (``files``: add them to a caller's set of outputs, which
        the caller commits). Figures: :func:`sim.cli.figures.write_figures`."""
        return write_step(out_dir, self.experiment.name, self.timeline, self.stats_json(), files,
                          trace, gpus)


def _not_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity in ``value`` (None: all finite)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list | tuple) else ()
    for key, item in items:
        found = _not_finite(item, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")
        if found:
            return found
    return None


def stats_json(stats: Mapping[str, Any]) -> str:
    """``stats`` as JSON text (indent 2, a final newline); ConfigError naming the statistic
    if one is NaN or infinite (inputs out of range: JSON has no such numbers). The text of
    :func:`sim.statsjson.indented` where it writes it (the same; ``json.dumps`` below is the
    reference, which encodes in Python whenever it indents)."""
    text = indented(stats)
    if text is not None:
        return text + "\n"
    try:
        return json.dumps(stats, indent=2, allow_nan=False) + "\n"
    except ValueError:  # the encoder refuses NaN and infinities: name the first
        bad = _not_finite(dict(stats), "stats")
        if not bad:
            raise
    raise ConfigError(f"{bad} is not a finite number; an input is out of the range this "
                      "simulator computes")


TRACE_FILES = {"json": "trace.json", "gz": "trace.json.gz", "none": None}
"""Trace formats :meth:`Result.write` offers, and the file each writes (gz: gzip, a
fraction of the size; none: no trace)."""


def write_step(out_dir: str | Path, name: str, timeline: Timeline, stats_text: str,
               files: Outputs | None = None, trace: str = "json",
               gpus: Sequence[int] | None = None) -> dict[str, Path]:
    """Write a step's trace and ``stats.json`` (see :meth:`Result.write`); a trace of
    another format left by an earlier run is removed, not to lie beside the new stats."""
    if trace not in TRACE_FILES:
        raise ConfigError(f"trace={trace!r}: choose one of {', '.join(TRACE_FILES)}")
    out = output_dir(out_dir)
    paths = {"stats": out / "stats.json"}
    with outputs() as own:
        mine = files or own
        target = TRACE_FILES[trace]
        if target is not None:
            from sim.export import write_chrome_trace  # (a `--json` run writes no trace)

            paths["trace"] = out / target
            write_chrome_trace(timeline, mine.temp(paths["trace"]), title=name, gpus=gpus)
        for other in TRACE_FILES.values():
            if other is not None and other != target:
                mine.remove(out / other)
        mine.temp(paths["stats"]).write_text(stats_text, encoding="utf-8")
        if files is None:
            own.commit()
    return paths


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
        ("num_params", exp.model.num_params() if exp.model else None),
        ("num_active_params", exp.model.active_params() if exp.model else None),
        ("cluster", exp.cluster.name),
        ("gpu", exp.cluster.gpu_summary()),
        ("fidelity", fidelity),
        ("placement", _placement_report(exp)),
    )
    return RunFacts(
        pipeline_rank=coordinate_columns(pl)["pp"],
        peak_flops=sum(g.peak_bf16_flops for g in exp.cluster.gpus) / exp.cluster.num_gpus
        if exp.cluster.heterogeneous else exp.cluster.gpu.peak_bf16_flops,
        memory_capacity_bytes=exp.cluster.gpu.hbm_capacity_bytes,
        memory_capacity_per_gpu=tuple(g.hbm_capacity_bytes for g in exp.cluster.gpus)
        if exp.cluster.heterogeneous else (),
        tokens_per_step=exp.tokens_per_step,
        model_flops_per_step=exp.model_flops_per_step,
        reserved_bytes=0.0 if exp.model is None or profile.reserved_from_run
        else profile.reserved_bytes,
        reserved_bytes_per_stage=reserved.per_stage(exp, generation_of)
        if exp.model is not None and profile.reserved_from_run else (),
        fragmentation=0.0 if exp.model is None else fragmentation(exp.framework,
                                                                  profile.fragmentation),
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


STEADY_STEPS = 3
"""Steps simulated for schedules whose steps overlap: the period is that of the middle one
(the start-up transient of the schedules here lasts one step)."""


def _fastest_type_time(timers: Sequence[Callable[[Compute], float]] | None
                       ) -> Callable[[Compute], float] | None:
    """On a cluster mixing GPU types (a timer per rank, shared by the ranks of a type), a
    compute op's time on the type that runs it fastest; None on a uniform cluster."""
    if timers is None:
        return None
    types = tuple(dict.fromkeys(timers))
    return lambda op: min(timer(op) for timer in types)


WORK_TIMERS = 16
"""(GPU, profile, attention kernel) triples whose :func:`work_timer` is kept."""

WORK_SIGNATURES = 1 << 16
"""Work signatures a :func:`work_timer` remembers (it starts over past this many)."""


def work_timer(gpu: GPUSpec, profile: DeviceProfile, kernel: str
               ) -> Callable[[Compute | ComputeSeg], float]:
    """A compute op's (or segment's) time on ``gpu`` with ``profile`` and attention
    ``kernel``: its fixed ``duration_s``, else :func:`~sim.device.compute_time_s` of its work,
    remembered per work signature (a full program repeats each op on every replica). One
    timer per triple, kept across calls (:data:`WORK_TIMERS`): the same function object for
    the same device, so what is remembered by timer (the collapsed lowering's folds,
    :func:`workloads.lowering.collapse.folded_use`) is shared by the layouts a search or a
    sweep simulates on it. A fresh one where the profile cannot be hashed."""
    try:
        return _work_timer(gpu, profile, kernel)
    except TypeError:  # an unhashable profile (a user's, with a list in it)
        return _work_timer.__wrapped__(gpu, profile, kernel)


@lru_cache(maxsize=WORK_TIMERS)
def _work_timer(gpu: GPUSpec, profile: DeviceProfile, kernel: str
                ) -> Callable[[Compute | ComputeSeg], float]:
    """:func:`work_timer`, one per triple."""
    timed: dict[tuple, float] = {}
    """Per work signature, its time."""

    def base_time(item: Compute | ComputeSeg) -> float:
        if item.duration_s is not None:
            return item.duration_s
        key = (item.flops, item.hbm_bytes, item.attn_flops, item.elementwise_bytes,
               item.gemm_dims)
        t = timed.get(key)
        if t is None:
            if len(timed) >= WORK_SIGNATURES:
                timed.clear()
            t = timed[key] = compute_time_s(gpu, profile, item.flops, item.hbm_bytes,
                                            item.attn_flops, item.elementwise_bytes, kernel,
                                            item.gemm_dims)
        return t

    base_time.by_work = True  # type: ignore[attr-defined]  # see sim.engine._Run.by_work
    return base_time


def simulate(exp: Experiment, profile: DeviceProfile | None = None,
             fidelity: str = "auto", steps: int | None = None,
             link_changes: Sequence[tuple[float, Mapping[int, float]]] = (),
             collective_timer: CollectiveTimer | None = None,
             reference: bool = False, idle: bool = True) -> Result:
    """Lower ``exp`` to per-GPU programs, run them on its cluster and compute the stats.

    ``fidelity``: ``full`` simulates every GPU and every collective as flows;
    ``collapsed`` simulates one GPU per pipeline rank with TP and DP collectives
    timed on the real topology (:mod:`sim.commtime`); ``auto`` picks full up to
    :data:`AUTO_FULL_MAX_GPUS` GPUs, and always with stragglers (they break the
    symmetry collapsing relies on; ``collapsed`` with stragglers is a ConfigError).

    ``steps``: how many steps to run back to back (:func:`workloads.multistep.repeat_program`).
    Default: one, except for schedules whose steps overlap
    (:attr:`~workloads.registry.ScheduleKind.steady_period`: ZB-H2 and ZB-V with
    the Zero Bubble paper's optimizer post-validation), which run
    :data:`STEADY_STEPS`. With ``n > 1`` steps, ``step_time_s`` is the period
    between the ends of steps ``n//2 - 1`` and ``n//2`` (a middle step: the one
    before it absorbs the pipeline fill, the one after it the drain) and the
    other per-step stats are counted in that window (DESIGN.md
    ``step_time_s``); schedules with the step barrier give the same numbers as
    one step.

    ``link_changes``: ``(at_s, {link index: bandwidth_Bps})``, links degraded (or, at
    bandwidth 0, failed) in the middle of the run (:func:`sim.engine.simulate_program`);
    they need every transfer
    simulated as flows, so ``auto`` runs full fidelity and ``collapsed`` is a ConfigError.

    ``collective_timer``: the collapsed fidelity's timings of collectives on the real
    topology, to share between calls on the same cluster (``sim search`` simulates many
    layouts on one): its timings depend on the cluster alone, so a shared one gives the
    same floats as a fresh one. A timer of another cluster is a ValueError. None: the
    cluster's own (:meth:`CollectiveTimer.shared`), or with ``reference`` a fresh one.

    Data-parallel modes (:mod:`sim.dpmodes`): under ``parallel.dp_mode:
    parameter_server`` the step pushes to and pulls from the server ranks (full
    fidelity only); with ``training.max_staleness`` S >= 1, :func:`sim.dpmodes.stale_steps`
    steps run without a barrier; with ``training.sync_every`` H > 1 a local step (the
    program without DP communication) is simulated too and the stats describe the mean
    step of a cycle (:func:`sim.dpmodes.cycle_stats`).

    ``reference``: run every stage's reference implementation (lowering's op loop, the
    engine's event queue, the idle breakdown's plain loops) instead of its fast path; the
    results are the same (``tests/test_differential.py``), only slower.

    ``idle``: compute the idle-time breakdown (``stats["idle_breakdown"]``); a caller that
    reads only the step time and the memory (``sim validate``: each of its corpus rows is
    simulated three times) leaves it out, a sixth to a third of a collapsed run.
    """
    if collective_timer is not None and collective_timer.cluster is not exp.cluster:
        raise ValueError("collective_timer: it times another cluster than the experiment's")
    if fidelity not in FIDELITIES:
        raise ConfigError(f"fidelity={fidelity!r}: choose one of {', '.join(FIDELITIES)}")
    if steps is not None and steps < 1:
        raise ConfigError(f"steps={steps}: must be at least 1")
    if exp.config.parallel.swarm is not None:
        if steps not in (None, 1) or link_changes or collective_timer is not None:
            raise ConfigError("parallel.swarm: simulated one step at a time, on its own "
                              "cluster (use sim run --steps for a run)")
        from sim.swarm import simulate_swarm  # it builds on this module

        return simulate_swarm(exp, profile, fidelity, reference=reference)
    # a mixed cluster times each rank on its own GPU, with its type's profile
    timers = rank_timers(exp.cluster.gpus, lambda spec: profile or default_profile(spec.name),
                         exp.config.training.attention) if exp.cluster.heterogeneous else None
    mixed = mixed_pipeline_ranks(exp.placement, exp.cluster.gpu_of) if timers else ()
    if mixed and fidelity == "collapsed":
        raise ConfigError(f"fidelity='collapsed': pipeline ranks {list(mixed)} mix GPU types, so "
                          "one GPU per pipeline rank cannot stand for all; use fidelity full "
                          "(or auto)")
    profile = profile or default_profile(exp.cluster.gpu.name)
    gpu = exp.cluster.gpu
    kernel = exp.config.training.attention
    slowdown = straggler_slowdowns(exp.config.faults, exp.cluster.num_gpus)
    if slowdown and fidelity == "collapsed":
        raise ConfigError(f"fidelity='collapsed': faults.stragglers on GPUs {sorted(slowdown)} "
                          "make replicas differ, so one GPU per pipeline rank cannot stand for "
                          "all; use fidelity full (or auto)")

    # the reference times with a timer of its own, as it times collectives (nothing kept)
    base_time = (_work_timer.__wrapped__(gpu, profile, kernel) if reference
                 else work_timer(gpu, profile, kernel))

    def rank_time(item: Compute) -> float:
        return timers[item.gpu](item)  # type: ignore[index]

    own_time = base_time if timers is None else rank_time

    def slowed_time(item: Compute) -> float:
        return own_time(item) * slowdown.get(item.gpu, 1.0)

    work_time = slowed_time if slowdown else own_time
    if link_changes and fidelity == "collapsed":
        raise ConfigError("fidelity='collapsed': links that change in the middle of a step "
                          "need every transfer simulated; use fidelity full (or auto)")
    training = exp.config.training
    staleness = training.max_staleness
    overlapping = steps_overlap(exp)
    n = steps if steps is not None else (stale_steps(staleness) if staleness else
                                         STEADY_STEPS if overlapping else 1)
    note = None
    work = budget.estimate(exp, n)
    servers = ps_servers(exp)
    if servers and fidelity == "collapsed":
        raise ConfigError("fidelity='collapsed': parallel.dp_mode parameter_server simulates "
                          "its pushes and pulls as flows; use fidelity full (or auto)")
    if fidelity == "auto":
        must = bool(slowdown or mixed or link_changes or servers)
        fidelity = "full" if exp.cluster.num_gpus <= AUTO_FULL_MAX_GPUS or must else "collapsed"
        if fidelity == "full" and not must and not work.fits("full", packs=not reference):
            fidelity = "collapsed"
            note = (f"fidelity auto: full would create about "
                    f"{work.instructions('full')[0]:,.0f} instructions, "
                    f"more than {budget.MAX_PROGRAM_BYTES / 1e9:g} GB; simulated collapsed")
    work.check(fidelity, packs=not reference)
    collapse = None
    timer = collective_timer or (CollectiveTimer(exp.cluster) if reference
                                 else CollectiveTimer.shared(exp.cluster))
    if fidelity == "collapsed":
        collapse = Collapse(compute_s=base_time if timers is None else timers[0],
                            collective_s=timer,
                            compute_s_of=None if timers is None else timers.__getitem__)
    costs = lowering_costs(exp, base_time, timer)  # one GPU type (checked by the experiment)
    costs = a2a_lowering_costs(exp, costs, base_time)
    costs = host_lowering_costs(exp, costs, base_time)
    costs = fsdp_lowering_costs(exp, costs, base_time, timer)
    costs = cp_lowering_costs(exp, costs, base_time, timer)
    costs = amax_lowering_costs(exp, costs, timer)
    program = lower(exp.schedule, costs, exp.placement, exp.config.parallel.zero_stage,
                    collapse, reference, servers)
    facts = _facts(exp, fidelity, profile)

    def run(program: Program) -> Result:
        if n > 1:
            program = repeat_program(program, n, barrier=not overlapping, staleness=staleness)
        return _run(exp, program, n, work_time, facts, link_changes, reference, slowdown,
                    note, timers, idle)

    result = run(program)
    if training.sync_every > 1:  # local SGD: a cycle of H - 1 local steps and a sync step
        local = run(without_dp(program))
        stats = cycle_stats(result.stats, local.stats, training.sync_every)
        ends = result.step_ends_s if n > 1 else (stats["step_time_s"],)
        return Result(exp, result.program, result.timeline, stats, n, ends)
    return result


def _run(exp: Experiment, program: Program, n: int, work_time: Callable[[Compute], float],
         facts: RunFacts, link_changes: Sequence[tuple[float, Mapping[int, float]]],
         reference: bool, slowdown: Mapping[int, float], note: str | None,
         timers: Sequence[Callable[[Compute], float]] | None, idle: bool = True) -> Result:
    """Run a lowered (possibly repeated) program of ``n`` steps and compute its stats (without
    ``idle``, not the idle breakdown)."""
    times = InstructionTimes()
    timeline = simulate_program(program, exp.cluster, work_time, times=times,
                                link_changes=link_changes, event_queue=reference)
    ends = step_end_times(program, times.end_s) if n > 1 else (timeline.end_s,)
    # the steady step: a middle one, with a step before it (fill) and after it (drain)
    window = (ends[n // 2 - 1], ends[n // 2]) if n > 1 else None
    stats = compute_stats(timeline, facts, window, times.intervals)
    times.intervals = None  # read: ~16 B an instruction less at the idle breakdown's peak
    if n > 1:
        stats["steps_simulated"] = n
        stats["first_step_s"] = ends[0]
    if note:
        stats["fidelity_note"] = note
    if slowdown:
        stats["stragglers"] = {str(g): f for g, f in slowdown.items()}
    if idle:
        ready_s, end_s = times.arrays or (times.ready_s, times.end_s)
        stats["idle_breakdown"] = summarize(idle_breakdown(
            program, ready_s, end_s, timeline.simulated_gpus, slowdown, window, times.cause,
            _fastest_type_time(timers), reference))
    return Result(exp, program, timeline, stats, n, tuple(ends))
