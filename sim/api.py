"""The Python API the CLI is built on: load, simulate, inspect, change, plot.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from base.errors import ConfigError, TopologyError
from sim.calibration import default_profile
from sim.commtime import CollectiveTimer
from sim.device import DeviceProfile, compute_time_s, rank_timers
from sim.engine import InstructionTimes, simulate_program
from sim.experiment import Experiment
from sim.export import write_chrome_trace
from sim.faults import (
    FailureRun,
    batch_segments,
    job_mtbf_s,
    mid_step_link_changes,
    preempted_step_lost_s,
    simulate_failures,
    straggler_slowdowns,
    strikes_mid_step,
    young_daly_interval_s,
)
from sim.faults_config import LinkFault, Preemption
from sim.idle import CAUSES, idle_breakdown, summarize
from sim.stats import RunFacts, compute_stats
from sim.timeline import Timeline
from topologies.placement import mixed_pipeline_ranks
from workloads.costs import ComputeSeg
from workloads.lowering import Collapse, lower
from workloads.multistep import repeat_program, step_end_times
from workloads.program import Compute, Program
from workloads.schedules_advanced import OVERLAPPING_STEPS


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
            paths["idle"] = out / "idle.png"
            self.plot_idle(paths["idle"])
        return paths

    def plot_idle(self, path: str | Path) -> None:
        """Save the idle-time breakdown as stacked bars per GPU (``stats["idle_breakdown"]``)."""
        from plots.idle import plot_idle  # matplotlib only when plotting

        plot_idle(self.stats["idle_breakdown"], path,
                  title=f"{self.experiment.name}: idle time by cause per GPU")

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
        steps = f", {self.steps} steps back to back" if self.steps > 1 else ""
        title = (f"{exp.name}: {exp.schedule.name}, step {self.stats['step_time_s'] * 1e3:.1f} ms, "
                 f"bubble {self.stats['bubble_fraction']:.1%}{replica}{steps}")
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
        ("gpu", exp.cluster.gpu_summary()),
        ("fidelity", fidelity),
        ("placement", _placement_report(exp)),
    )
    return RunFacts(
        pipeline_rank=tuple(pl.coords(g)["pp"] for g in range(pl.num_gpus)),
        peak_flops=sum(g.peak_bf16_flops for g in exp.cluster.gpus) / exp.cluster.num_gpus
        if exp.cluster.heterogeneous else exp.cluster.gpu.peak_bf16_flops,
        memory_capacity_bytes=exp.cluster.gpu.hbm_capacity_bytes,
        memory_capacity_per_gpu=tuple(g.hbm_capacity_bytes for g in exp.cluster.gpus)
        if exp.cluster.heterogeneous else (),
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


def simulate(exp: Experiment, profile: DeviceProfile | None = None,
             fidelity: str = "auto", steps: int | None = None,
             link_changes: Sequence[tuple[float, Mapping[int, float]]] = (),
             collective_timer: CollectiveTimer | None = None,
             reference: bool = False) -> Result:
    """Lower ``exp`` to per-GPU programs, run them on its cluster and compute the stats.

    ``fidelity``: ``full`` simulates every GPU and every collective as flows;
    ``collapsed`` simulates one GPU per pipeline rank with TP and DP collectives
    timed on the real topology (:mod:`sim.commtime`); ``auto`` picks full up to
    :data:`AUTO_FULL_MAX_GPUS` GPUs, and always with stragglers (they break the
    symmetry collapsing relies on; ``collapsed`` with stragglers is a ConfigError).

    ``steps``: how many steps to run back to back (:func:`workloads.multistep.repeat_program`).
    Default: one, except for schedules whose steps overlap
    (:data:`~workloads.schedules_advanced.OVERLAPPING_STEPS`: ZB-H2 and ZB-V with
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
    same floats as a fresh one. A timer of another cluster is a ValueError.

    ``reference``: run every stage's reference implementation (the engine's event queue,
    the idle breakdown's plain loops) instead of its fast path; the results are the same
    (``tests/test_differential.py``), only slower.
    """
    if collective_timer is not None and collective_timer.cluster is not exp.cluster:
        raise ValueError("collective_timer: it times another cluster than the experiment's")
    if fidelity not in FIDELITIES:
        raise ConfigError(f"fidelity={fidelity!r}: choose one of {', '.join(FIDELITIES)}")
    if steps is not None and steps < 1:
        raise ConfigError(f"steps={steps}: must be at least 1")
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

    def base_time(item: Compute | ComputeSeg) -> float:
        if item.duration_s is not None:
            return item.duration_s
        return compute_time_s(gpu, profile, item.flops, item.hbm_bytes, item.attn_flops,
                              item.elementwise_bytes, kernel, item.gemm_dims)

    def rank_time(item: Compute) -> float:
        return timers[item.gpu](item)  # type: ignore[index]

    own_time = base_time if timers is None else rank_time

    def slowed_time(item: Compute) -> float:
        return own_time(item) * slowdown.get(item.gpu, 1.0)

    work_time = slowed_time if slowdown else own_time
    if link_changes and fidelity == "collapsed":
        raise ConfigError("fidelity='collapsed': links that change in the middle of a step "
                          "need every transfer simulated; use fidelity full (or auto)")
    if fidelity == "auto":
        fidelity = ("full" if exp.cluster.num_gpus <= AUTO_FULL_MAX_GPUS or slowdown or mixed
                    or link_changes else "collapsed")
    collapse = None
    if fidelity == "collapsed":
        collapse = Collapse(compute_s=base_time if timers is None else timers[0],
                            collective_s=collective_timer or CollectiveTimer(exp.cluster),
                            compute_s_of=None if timers is None else timers.__getitem__)
    program = lower(exp.schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage,
                    collapse)
    overlapping = exp.schedule.name in OVERLAPPING_STEPS
    n = steps if steps is not None else (STEADY_STEPS if overlapping else 1)
    if n > 1:
        program = repeat_program(program, n, barrier=not overlapping)
    times = InstructionTimes()
    timeline = simulate_program(program, exp.cluster, work_time, times=times,
                                link_changes=link_changes, event_queue=reference)
    ends = step_end_times(program, times.end_s) if n > 1 else (timeline.end_s,)
    # the steady step: a middle one, with a step before it (fill) and after it (drain)
    window = (ends[n // 2 - 1], ends[n // 2]) if n > 1 else None
    stats = compute_stats(timeline, _facts(exp, fidelity, profile), window, times.intervals)
    if n > 1:
        stats["steps_simulated"] = n
        stats["first_step_s"] = ends[0]
    if slowdown:
        stats["stragglers"] = {str(g): f for g, f in slowdown.items()}
    ready_s, end_s = times.arrays or (times.ready_s, times.end_s)
    idle = idle_breakdown(program, ready_s, end_s, timeline.simulated_gpus, slowdown, window,
                          times.cause, _fastest_type_time(timers), reference)
    stats["idle_breakdown"] = summarize(idle)
    return Result(exp, program, timeline, stats, n, tuple(ends))


@dataclass(frozen=True, eq=False)
class RunResult:
    """A multi-step run (``sim run --steps N``): the simulated steps and the run's stats."""

    results: tuple[Result, ...]
    """One simulation per distinct (global batch size, link state), in order of first use."""
    stats: dict[str, Any]
    """The first simulation's step stats plus the run keys (:func:`simulate_run`)."""

    def stats_json(self) -> str:
        return json.dumps(self.stats, indent=2) + "\n"

    def write(self, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
        """As :meth:`Result.write` for the first simulated step, with the run's stats."""
        paths = self.results[0].write(out_dir, plot)
        paths["stats"].write_text(self.stats_json(), encoding="utf-8")
        return paths


def _with_cluster(exp: Experiment, changes: list, upto: int) -> Experiment:
    """``exp`` with the link faults among the first ``upto`` events applied to its cluster."""
    degraded: dict[tuple, float] = {}
    failed = []
    for _, change in changes[:upto]:
        if not isinstance(change, LinkFault):
            continue
        link = tuple(change.link)  # a pair, with what happens to it: check_fault_targets
        if change.failed:
            failed.append(link)
        else:
            assert change.bandwidth_factor is not None
            degraded[link] = degraded.get(link, 1.0) * change.bandwidth_factor
    if not degraded and not failed:
        return exp
    try:
        cluster = exp.cluster.with_link_changes(degraded=degraded, failed=failed)
    except TopologyError as exc:
        raise ConfigError(f"faults.link_faults: {exc}") from None
    return replace(exp, cluster=cluster)


def _rebalanced(exp: Experiment, events: list, upto: int) -> Experiment:
    """``exp`` without the DP replicas that lost a server to a ``rebalance`` preemption among
    the first ``upto`` events; the same global batch over the remaining replicas."""
    cluster, pl = exp.cluster, exp.placement
    hosts = {cluster.host_of(g) for g in range(cluster.num_gpus)}
    lost: set[int] = set()
    last = -1
    for k, event in events[:upto]:
        if isinstance(event, Preemption) and event.policy == "rebalance":
            lost.add(event.node)
            last = k
    if not lost:
        return exp
    dp = pl.degree("dp")
    gone = {pl.coords(g)["dp"] for g in range(cluster.num_gpus) if cluster.host_of(g) in lost}
    left = dp - len(gone)
    if left < 1:
        raise ConfigError(f"faults.preemptions[{last}]: policy 'rebalance' needs a DP replica "
                          f"left, but servers {sorted(lost)} hold GPUs of all {dp}; use "
                          "policy 'stall'")
    assert lost <= hosts
    # the run plays the file's link faults and preemptions from its own list of events
    # (simulate_run); the smaller cluster need not have the servers they name
    changes = {"cluster.num_gpus": cluster.num_gpus // dp * left, "parallel.dp": left,
               "training.global_batch_size": exp.global_batch_size,
               "training.num_microbatches": None,
               "faults.link_faults": None, "faults.preemptions": None}
    try:
        return exp.with_changes(changes)
    except ConfigError as exc:
        raise ConfigError(f"faults.preemptions[{last}]: rebalancing to dp={left}: {exc}") from None


def simulate_run(exp: Experiment, steps: int, profile: DeviceProfile | None = None,
                 fidelity: str = "auto") -> RunResult:
    """``steps`` training steps with the experiment's batch schedule and faults.

    Each distinct global batch size (``training.global_batch_schedule``) and
    fault state (``faults.link_faults``, ``faults.preemptions``) is simulated
    once (:func:`simulate`: one step, or the steady period of overlapping
    schedules); a run of ``k`` steps of it takes ``first_step_s + (k - 1)
    step_time_s``, where the first step of a run starts from an idle pipeline
    (equal to the step time under the step barrier). A link degradation or failure
    takes effect at its ``at_s`` (counted in failure-free time) in the middle of the
    step it strikes in, where steps are simulated in full (fidelity ``full``, or
    ``auto`` up to :data:`AUTO_FULL_MAX_GPUS` GPUs) and do not overlap: that step is
    simulated with the link's bandwidth changing then, the transfers in flight
    re-rated, or with the link failing then, the transfers in flight across it moved
    with the bytes they have left onto the routes of the cluster without it (no
    extra latency) and later transfers taking those routes
    (:func:`sim.faults.mid_step_link_changes`); the steps after it run on the
    changed cluster. A failure that partitions the network is a ConfigError naming
    the pair. Link faults where steps are collapsed or overlap take effect at the
    first step boundary at or after their ``at_s``. A preemption with policy
    ``stall`` pauses the run for ``replacement_s`` (SWARM-style: the pipeline
    waits for a replacement peer and loses no work, Ryabinin et al. 2023); with
    ``rebalance`` the run goes on with the DP replicas that kept all their servers,
    and the step in flight at ``at_s`` is lost (``preemption_lost_s``, counted from
    its start) and rerun on them, unless it ends within the preemption's
    ``notice_s`` (then, as at a step boundary, nothing is lost). GPU failures then play
    against the step times (:func:`sim.faults.simulate_failures`). Adds
    ``time_to_train_s``, ``goodput`` (useful work / elapsed), ``lost_work_s``
    and the other run keys to the stats.
    """
    faults = exp.config.faults
    segments = batch_segments(exp.config.training.global_batch_schedule, exp.global_batch_size,
                              steps)
    events: list = sorted([*enumerate(faults.link_faults if faults else ()),
                           *enumerate(faults.preemptions if faults else ())],
                          key=lambda e: (e[1].at_s, isinstance(e[1], Preemption), e[0]))
    cache: dict[tuple[int, int], Result] = {}

    def run_of(batch: int, upto: int) -> Result:
        if (batch, upto) not in cache:
            variant = exp
            if batch != exp.global_batch_size:
                try:
                    variant = exp.with_changes({"training.global_batch_size": batch,
                                                "training.num_microbatches": None})
                except ConfigError as exc:
                    raise ConfigError(f"training.global_batch_schedule: batch {batch}: {exc}"
                                      ) from None
            variant = _with_cluster(_rebalanced(variant, events, upto), events, upto)
            try:
                cache[(batch, upto)] = simulate(variant, profile, fidelity)
            except TopologyError as exc:
                raise ConfigError(f"faults.link_faults: {exc}") from None
        return cache[(batch, upto)]

    step_s: list[float] = []
    rows = []
    transitions: dict[int, Result] = {}
    """Simulations of steps in which links degraded or failed, by row."""
    # mid-step link faults where steps are simulated in full (flows can be re-rated/rerouted)
    mid_step = exp.schedule.name not in OVERLAPPING_STEPS and (
        fidelity == "full" or (fidelity == "auto" and exp.cluster.num_gpus <= AUTO_FULL_MAX_GPUS))
    t, applied, stall, preempted = 0.0, 0, 0.0, 0.0
    for first, count, batch in segments:
        left, fresh = count, True
        while left > 0:
            while applied < len(events) and events[applied][1].at_s <= t:
                event = events[applied][1]
                if isinstance(event, Preemption) and event.policy == "stall":
                    stall += event.replacement_s
                applied += 1
                fresh = True
            res = run_of(batch, applied)
            period = res.stats["step_time_s"]
            n0 = len(step_s)
            step = res.first_step_s if fresh else period
            lost = (preempted_step_lost_s(events[applied][1], t, t + step)
                    if applied < len(events) else 0.0)
            if lost:  # a server goes mid-step: the step is lost and rerun without it
                preempted += lost
                applied += 1
                fresh = True
                continue
            changes, n_mid = mid_step_link_changes(res.experiment.cluster, events, applied, t,
                                                   t + step) if mid_step else ([], 0)
            if changes:  # link faults strike during this step: it runs with them
                try:
                    mid = simulate(res.experiment, profile, fidelity, link_changes=changes)
                except TopologyError as exc:
                    raise ConfigError(f"faults.link_faults: {exc}") from None
                transitions[len(rows)] = mid
                rows.append({"first_step": first + count - left, "steps": 1,
                             "global_batch_size": batch, "faults_applied": applied + n_mid,
                             "mid_step_faults": n_mid,
                             "dp": res.experiment.placement.degree("dp"),
                             "first_step_s": mid.first_step_s, "step_time_s": mid.first_step_s})
                step_s.append(mid.first_step_s)
                t += mid.first_step_s
                left -= 1
                applied += n_mid
                fresh = True
                continue
            if fresh:
                step_s.append(res.first_step_s)
                t += res.first_step_s
                left -= 1
                fresh = False
            next_at = events[applied][1].at_s if applied < len(events) else math.inf
            if left > 0 and t < next_at:
                # a mid-step link fault, or a preemption that loses the step it strikes
                # in, stops the run before that step
                to_event = (math.floor if mid_step and applied < len(events)
                            and strikes_mid_step(events[applied][1]) else math.ceil)
                n = left if next_at == math.inf or period <= 0 else min(
                    left, to_event((next_at - t) / period))
                if n and applied < len(events):
                    t0 = t + (n - 1) * period  # the last of the n steps
                    if preempted_step_lost_s(events[applied][1], t0, t0 + period):
                        n -= 1
                step_s.extend([period] * n)
                t += n * period
                left -= n
            rows.append({"first_step": first + count - left - (len(step_s) - n0),
                         "steps": len(step_s) - n0, "global_batch_size": batch,
                         "faults_applied": applied,
                         "dp": res.experiment.placement.degree("dp"),
                         "first_step_s": res.first_step_s, "step_time_s": period})
    spec = faults.gpu_failures if faults else None
    num_gpus = exp.cluster.num_gpus
    run = simulate_failures(step_s, spec, num_gpus)
    base = next(iter(cache.values()))
    stats = dict(base.stats)
    tokens = None
    if exp.model is not None:
        tokens = sum(r["steps"] * r["global_batch_size"] for r in rows) * exp.model.seq_length
    elapsed = run.time_to_train_s + stall + preempted
    stats.update({
        "steps": steps,
        "time_to_train_s": elapsed,
        "goodput": run.useful_s / elapsed if elapsed > 0 else 1.0,
        "lost_work_s": run.lost_work_s,
        "useful_work_s": run.useful_s,
        "checkpoint_s": run.checkpoint_s,
        "restart_s": run.restart_s,
        "failures": run.failures,
        "preemption_stall_s": stall,
        "preemption_lost_s": preempted,
        "train_tokens_per_s": tokens / elapsed if tokens and elapsed else None,
        "run_segments": rows,
        "idle_breakdown_run_s": _run_idle(rows, cache, run, stall + preempted, transitions),
    })
    if spec is not None:
        mtbf = job_mtbf_s(spec, num_gpus)
        if mtbf is not None and spec.checkpoint_write_s > 0:
            stats["checkpoint_interval_opt_s"] = young_daly_interval_s(spec.checkpoint_write_s,
                                                                       mtbf)
    return RunResult(tuple(cache.values()), stats)


def _run_idle(rows: list[dict], cache: dict[tuple[int, int], Result], run: FailureRun,
              stall_s: float, transitions: Mapping[int, Result]) -> dict[str, float]:
    """Mean idle seconds per GPU over the whole run, by cause.

    Each run of steps counts its simulated step's breakdown per step, plus the
    first step's excess over the period as ``bubble`` (pipeline fill);
    ``failure`` is the time lost to failures, restarts, checkpoint writes and
    preemption stalls. (After a rebalance, fewer GPUs share the steps; the mean
    is per GPU of each simulated step.)
    """
    total = dict.fromkeys(CAUSES, 0.0)
    for j, row in enumerate(rows):
        res = transitions.get(j) or cache[(row["global_batch_size"], row["faults_applied"])]
        mean = res.stats["idle_breakdown"]["mean_s"]
        for cause in CAUSES:
            total[cause] += mean[cause] * row["steps"]
        if row["steps"]:
            total["bubble"] += row["first_step_s"] - row["step_time_s"]
    total["failure"] += run.lost_work_s + run.restart_s + run.checkpoint_s + stall_s
    total["idle_s"] = sum(total[c] for c in CAUSES)
    return total
