"""Several jobs on one cluster, simulated together so their traffic shares its links.

A multi-job file (:mod:`sim.jobs_config`) lists experiments, each on its own GPUs of one
shared cluster. Each job is built as an experiment on its share of the cluster
(:meth:`topologies.cluster.Cluster.subset`: its GPUs renumbered 0..n-1, the graph and links
the shared one's) and lowered on its own; the programs are then moved onto their global
GPUs and merged into one program that one engine run executes on the shared cluster. A
job's flows therefore share every link they cross with the other jobs' flows, max-min
fairly (:mod:`sim.network`), and the stats of each job are computed from its own slice
of the run exactly as :func:`sim.api.simulate` computes a lone experiment's.

Jobs run at full fidelity only: collapsed fidelity simulates one GPU per pipeline rank
and times TP and DP collectives on an empty network (:mod:`sim.commtime`), which is what
would hide the other jobs' traffic, so ``fidelity='collapsed'`` is a ConfigError and
``auto`` means full. All jobs start together at time 0; each job's step time is its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from base.outputs import Outputs
from sim import budget
from sim.api import (
    FIDELITIES,
    STEADY_STEPS,
    Result,
    _facts,
    _fastest_type_time,
    stats_json,
    write_step,
)
from sim.calibration import default_profile
from sim.config import read_yaml
from sim.device import DeviceProfile, rank_timers, work_timer
from sim.engine import EngineCounters, InstructionTimes, simulate_program
from sim.experiment import Experiment, build_experiment
from sim.idle import idle_breakdown, summarize
from sim.stats import compute_stats
from sim.timeline import Timeline, timeline_of
from topologies.build import build_cluster
from topologies.cluster import Cluster
from workloads.lowering import lower
from workloads.multistep import repeat_program, step_end_times
from workloads.program import Collective, Compute, Instruction, Program, Send
from workloads.registry import overlaps_steps

BUSIEST_LINKS = 10
"""Links ``link_utilisation`` lists by name (the busiest first)."""


@dataclass(frozen=True, eq=False)
class Job:
    """One job of a multi-job file."""

    name: str
    gpus: tuple[int, ...]
    """Its GPUs on the shared cluster, in the order of its ranks."""
    experiment: Experiment
    """The job built on its share of the cluster (ranks 0..len(gpus)-1)."""


@dataclass(frozen=True, eq=False)
class JobSet:
    """Jobs sharing one cluster (:func:`build_jobs`)."""

    name: str
    cluster: Cluster
    jobs: tuple[Job, ...]

    def only(self, name: str) -> JobSet:
        """The same cluster with one of the jobs alone on it (its "alone" baseline)."""
        kept = tuple(job for job in self.jobs if job.name == name)
        if not kept:
            raise ConfigError(f"jobs: no job named {name!r}")
        return replace(self, jobs=kept)


def build_jobs(data: Any, base_dir: Path | None = None) -> JobSet:
    """Validate a parsed multi-job file and build its jobs; ConfigError naming the job
    (``jobs[i] (name): ...``) for an invalid one, and naming both jobs where two share
    a GPU."""
    from sim.jobs_config import gpu_ids, parse_jobs  # its models: built for jobs files only

    cfg = parse_jobs(data)
    spread = getattr(cfg.cluster, "gpu_speed_spread", None)
    if spread is not None:
        raise ConfigError(f"cluster.gpu_speed_spread={spread!r}: not with jobs, since it paces "
                          "every GPU by the slowest of the whole cluster, where each job waits "
                          "only for its own; simulate a job alone to see its pacing")
    cluster = build_cluster(cfg.cluster)
    owner: dict[int, str] = {}
    jobs = []
    for i, job in enumerate(cfg.jobs):
        where = f"jobs[{i}] ({job.name})"
        if job.name in (j.name for j in jobs):
            raise ConfigError(f"{where}.name: another job is named {job.name!r}")
        gpus = gpu_ids(job.gpus, cluster.num_gpus, f"{where}.gpus")
        shared = [g for g in gpus if g in owner]
        if shared:
            other = owner[shared[0]]
            raise ConfigError(f"jobs {other!r} and {job.name!r} both use GPU"
                              f"{'s' if len(shared) > 1 else ''} "
                              f"{', '.join(map(str, shared[:8]))}"
                              f"{' ...' if len(shared) > 8 else ''}; jobs may not share GPUs")
        owner.update(dict.fromkeys(gpus, job.name))
        raw = {k: v for k, v in data["jobs"][i].items() if k != "gpus"}
        raw["cluster"] = data["cluster"]
        try:
            exp = build_experiment(raw, base_dir, cluster=cluster.subset(gpus))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        jobs.append(Job(job.name, gpus, exp))
    return JobSet(cfg.name, cluster, tuple(jobs))


def load_jobs(path: str | Path) -> JobSet:
    """Load and build a multi-job file (ConfigError on bad input)."""
    return build_jobs(read_yaml(path), base_dir=Path(path).parent)


def _relocated(program: Program, gpus: Sequence[int], first_id: int, first_key: int
               ) -> list[Instruction]:
    """``program``'s instructions on global GPUs ``gpus[local]``, ids from ``first_id`` and
    collective keys from ``first_key`` on (a job's part of the merged program)."""
    out: list[Instruction] = []
    new = tuple.__new__  # as the lowering builds them: without Python-level __new__
    for ins in program.instructions:
        cls = type(ins)
        head = (ins.id + first_id, gpus[ins.gpu])
        deps = tuple([d + first_id for d in ins.deps])
        if cls is Compute:  # id, gpu, kind, name, deps, ...
            out.append(new(cls, (*head, *ins[2:4], deps, *ins[5:])))
        elif cls is Send:  # id, gpu, dst, nbytes, kind, name, deps, ...
            out.append(new(cls, (*head, gpus[ins.dst], *ins[3:6], deps, *ins[7:])))
        else:  # id, gpu, kind, name, deps, op, algo, group, nbytes, key, ...
            out.append(new(cls, (*head, *ins[2:4], deps, *ins[5:7],
                                 tuple([gpus[g] for g in ins.group]), ins.nbytes,
                                 ins.key + first_key, *ins[10:])))
    return out


def _job_timer(exp: Experiment, profile: DeviceProfile | None
               ) -> tuple[Callable[[Compute], float], Sequence[Callable[[Compute], float]] | None]:
    """A job's compute timer as :func:`sim.api.simulate` times its ops: one for every rank
    of a uniform cluster, and the per-rank timers (by local rank) of a mixed one (None:
    uniform)."""
    kernel = exp.config.training.attention
    if exp.cluster.heterogeneous:
        timers = rank_timers(exp.cluster.gpus,
                             lambda spec: profile or default_profile(spec.name), kernel)
        return timers[0], timers
    gpu = exp.cluster.gpu
    return work_timer(gpu, profile or default_profile(gpu.name), kernel), None


@dataclass(frozen=True, eq=False)
class JobsResult:
    """Jobs simulated together: one :class:`~sim.api.Result` per job (its own program,
    timeline and stats, on its own ranks) and the merged run's timeline and stats."""

    jobset: JobSet
    results: tuple[Result, ...]
    timeline: Timeline
    """The merged run on the shared cluster's GPUs."""
    stats: dict[str, Any]
    """``name``, ``cluster``, ``num_gpus``, ``fidelity``, ``jobs`` (each job's stats, the
    keys of a lone run's plus ``gpus``) and ``link_utilisation``."""
    counters: EngineCounters
    """What the engine did (events, flows, max-min re-ratings) for all jobs together."""

    def stats_json(self) -> str:
        """The stats as the exact JSON text ``sim run --json`` prints."""
        return stats_json(self.stats)

    def write(self, out_dir: str | Path, files: Outputs | None = None, trace: str = "json",
              gpus: Sequence[int] | None = None) -> dict[str, Path]:
        """Write the merged run's trace (global GPU ids) and ``stats.json``, as
        :meth:`sim.api.Result.write` does."""
        return write_step(out_dir, self.jobset.name, self.timeline, self.stats_json(), files,
                          trace, gpus)


def _link_utilisation(cluster: Cluster, bytes_on_link: dict[int, float], span_s: float
                      ) -> dict[str, Any]:
    """Each finite link's bytes over what it could carry in ``span_s`` (the whole run):
    how many links carried traffic, their mean utilisation and the busiest by name."""
    used = [(b / (cluster.link_bandwidth_Bps[i] * span_s), i, b)
            for i, b in sorted(bytes_on_link.items())
            if b > 0 and math.isfinite(cluster.link_bandwidth_Bps[i]) and span_s > 0]
    used.sort(key=lambda u: (-u[0], u[1]))
    return {
        "span_s": span_s,
        "links_used": len(used),
        "mean": sum(u for u, _, _ in used) / len(used) if used else 0.0,
        "busiest": [{"link": cluster.link_name(i), "bytes": b, "utilisation": u}
                    for u, i, b in used[:BUSIEST_LINKS]],
    }


def _check_budget(jobset: JobSet, steps: Sequence[int]) -> None:
    """ConfigError naming the largest job unless the merged program stays within
    :data:`sim.budget.MAX_PROGRAM_BYTES` (every job at full fidelity, its instructions
    merged into one program of named tuples)."""
    sizes = [budget.estimate(job.experiment, n).bytes("full", packs=False)
             for job, n in zip(jobset.jobs, steps, strict=True)]
    need = sum(size for _, size, _ in sizes)
    if need > budget.MAX_PROGRAM_BYTES:
        largest = jobset.jobs[max(range(len(sizes)), key=lambda j: sizes[j][1])].name
        raise ConfigError(f"jobs: together they would create about "
                          f"{sum(n for n, _, _ in sizes):,.0f} "
                          f"instructions (~{need / 1e9:,.1f} GB), more than the "
                          f"{budget.MAX_PROGRAM_BYTES / 1e9:g} GB a run may use; the largest "
                          f"is job {largest!r} (fewer GPUs or micro-batches)")


def simulate_jobs(jobset: JobSet, profile: DeviceProfile | None = None,
                  fidelity: str = "auto", reference: bool = False) -> JobsResult:
    """Run every job of ``jobset`` together on its cluster (module docstring).

    Each job runs as many steps as :func:`sim.api.simulate` would run it alone (one, or
    :data:`~sim.api.STEADY_STEPS` for schedules whose steps overlap) and its stats are
    taken the same way. ``fidelity``: ``auto`` and ``full`` simulate every GPU;
    ``collapsed`` is a ConfigError (module docstring). ``reference``: the reference
    lowering and event queue (:func:`sim.api.simulate`).
    """
    if fidelity not in FIDELITIES:
        raise ConfigError(f"fidelity={fidelity!r}: choose one of {', '.join(FIDELITIES)}")
    if fidelity == "collapsed":
        raise ConfigError("fidelity='collapsed': jobs sharing a cluster are simulated in full "
                          "(one GPU per pipeline rank, with collectives timed on an empty "
                          "network, would hide the other jobs' traffic); use fidelity full "
                          "(or auto)")
    cluster = jobset.cluster
    parts: list[tuple[Job, Program, int, int]] = []
    merged: list[Instruction] = []
    static = [0.0] * cluster.num_gpus
    names = [""] * cluster.num_gpus
    job_of = [-1] * cluster.num_gpus
    first_key = 0
    steps = [STEADY_STEPS if overlaps_steps(job.experiment.schedule.name) else 1
             for job in jobset.jobs]
    _check_budget(jobset, steps)
    for j, (job, n) in enumerate(zip(jobset.jobs, steps, strict=True)):
        exp = job.experiment
        if exp.config.parallel.tp_comm_overlap:
            raise ConfigError(f"jobs: {job.name}: parallel.tp_comm_overlap times its TP "
                              "collectives without the network, which would hide the other "
                              "jobs' traffic; leave it out")
        overlapping = n > 1
        # exp.costs as built: every TP collective a flow on the shared network, none given
        # an exposed time from an empty one (sim.tpoverlap's second all-gathers and
        # tp_async_grad_all_reduce's backward all-reduces block here)
        program = lower(exp.schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage,
                        None, reference)
        if n > 1:
            program = repeat_program(program, n, barrier=not overlapping)
        parts.append((job, program, len(merged), n))
        merged.extend(_relocated(program, job.gpus, len(merged), first_key))
        first_key += 1 + max((ins.key for ins in program.instructions
                              if type(ins) is Collective), default=-1)
        for local, g in enumerate(job.gpus):
            static[g] = program.static_bytes[local]
            names[g] = f"{job.name} {program.gpu_names[local]}" if program.gpu_names else job.name
            job_of[g] = j
    gpus = tuple(sorted(g for job in jobset.jobs for g in job.gpus))
    whole = Program(cluster.num_gpus, tuple(merged), tuple(static), parts[0][1].schedule,
                    tuple(names), gpus)
    timers = [_job_timer(job.experiment, profile) for job in jobset.jobs]
    local_of = [0] * cluster.num_gpus
    for job in jobset.jobs:
        for local, g in enumerate(job.gpus):
            local_of[g] = local

    def timer(op: Compute) -> float:
        own, ranks = timers[job_of[op.gpu]]
        return ranks[local_of[op.gpu]](op) if ranks else own(op)

    times = InstructionTimes()
    counters = EngineCounters()
    timeline = simulate_program(whole, cluster, timer, counters, times=times,
                                event_queue=reference)
    results = tuple(_job_result(job, program, first, n, times, timers[j][1], profile)
                    for j, (job, program, first, n) in enumerate(parts))
    stats: dict[str, Any] = {
        "name": jobset.name,
        "cluster": cluster.name,
        "num_gpus": cluster.num_gpus,
        "fidelity": "full",
        "jobs": [r.stats for r in results],
        "link_utilisation": _link_utilisation(cluster, counters.bytes_on_link,
                                              timeline.end_s),
    }
    return JobsResult(jobset, results, timeline, stats, counters)


def _job_result(job: Job, program: Program, first: int, n: int, times: InstructionTimes,
                rank_timers_: Sequence[Callable[[Compute], float]] | None,
                profile: DeviceProfile | None) -> Result:
    """One job's result from its slice of the merged run's times (ids ``first`` on)."""
    exp = job.experiment
    last = first + len(program.instructions)
    ready, end = times.ready_s[first:last], times.end_s[first:last]
    mid = times.mid_s[first:last]
    timeline = timeline_of(program, ready, mid, end)
    ends = step_end_times(program, end) if n > 1 else (timeline.end_s,)
    window = (ends[n // 2 - 1], ends[n // 2]) if n > 1 else None
    own_profile = profile or default_profile(exp.cluster.gpu.name)
    stats = compute_stats(timeline, _facts(exp, "full", own_profile), window)
    if n > 1:
        stats["steps_simulated"] = n
        stats["first_step_s"] = ends[0]
    cause = [c - first if c >= 0 else -1 for c in times.cause[first:last]]
    idle = idle_breakdown(program, ready, end, timeline.simulated_gpus, {}, window,
                          cause, _fastest_type_time(rank_timers_))
    stats["idle_breakdown"] = summarize(idle)
    stats["gpus"] = list(job.gpus)
    return Result(exp, program, timeline, stats, n, tuple(ends))
