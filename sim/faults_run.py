"""Runs of many steps (``sim run --steps N``): failures, checkpoints, link faults,
preemptions and a changing global batch, over steps simulated by :func:`sim.api.simulate`.

The fault models (when failures strike, what a step loses, Young/Daly) are in
:mod:`sim.faults`; this module plays them out over a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from base.errors import ConfigError, TopologyError
from base.outputs import Outputs
from sim.api import AUTO_FULL_MAX_GPUS, Result, simulate, stats_json, write_step
from sim.batch_policy import load_curve, policy_schedule, steps_to_tokens
from sim.config import MAX_BATCH_SIZES
from sim.device import DeviceProfile
from sim.dpmodes import run_steps, steps_overlap
from sim.experiment import Experiment
from sim.faults import (
    FailureRun,
    batch_segments,
    job_mtbf_s,
    mid_step_link_changes,
    preempted_step_lost_s,
    simulate_failures,
    strikes_mid_step,
    young_daly_interval_s,
)
from sim.faults_config import LinkFault, Preemption
from sim.swarm import (
    AWAY,
    PeerEvent,
    Swarm,
    after_event,
    draw_peer_events,
    initial_stages,
    members,
    simulate_swarm,
)
from sim.timeline import IDLE_CAUSES


@dataclass(frozen=True, eq=False)
class RunResult:
    """A multi-step run (``sim run --steps N``): the simulated steps and the run's stats."""

    results: tuple[Result, ...]
    """One simulation per distinct (global batch size, link state), in order of first use."""
    stats: dict[str, Any]
    """The first simulation's step stats plus the run keys (:func:`simulate_run`)."""

    def stats_json(self) -> str:
        """The stats as the exact JSON text ``sim run --json`` prints (deterministic)."""
        return stats_json(self.stats)

    def write(self, out_dir: str | Path, files: Outputs | None = None, trace: str = "json",
              gpus: Sequence[int] | None = None) -> dict[str, Path]:
        """As :meth:`Result.write` for the first simulated step, with the run's stats."""
        first = self.results[0]
        return write_step(out_dir, first.experiment.name, first.timeline, self.stats_json(),
                          files, trace, gpus)


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


def _batch_variant(exp: Experiment, batch: int) -> Experiment:
    """``exp`` with global batch ``batch`` (``training.global_batch_schedule``)."""
    if batch == exp.global_batch_size:
        return exp
    try:
        return exp.with_changes({"training.global_batch_size": batch,
                                 "training.num_microbatches": None})
    except ConfigError as exc:
        raise ConfigError(f"training.global_batch_schedule: batch {batch}: {exc}") from None


def simulate_run(exp: Experiment, steps: int, profile: DeviceProfile | None = None,
                 fidelity: str = "auto") -> RunResult:
    """``steps`` training steps with the experiment's batch schedule and faults
    (:func:`_play`); a swarm's drawn preemptions (:class:`_Peers`) are drawn up to a
    horizon, four times longer until the run ends within it (each peer's draws extend
    the same stream, so the run is that of the unbounded draw)."""
    faults = exp.config.faults
    rate = faults.preemption_rate_per_hour if faults else None
    if exp.config.parallel.swarm is None or rate is None:
        played = _play(exp, steps, profile, fidelity, None)
        assert played is not None
        return played
    peers = _Peers(exp, profile, fidelity)
    horizon = peers.horizon_s(steps)
    while True:
        peers.draw(horizon)
        played = _play(exp, steps, profile, fidelity, peers)
        if played is not None:
            return played
        horizon *= 4


class _Peers:
    """A swarm's peers over a run: the preemptions and rejoins drawn up to a horizon, and
    the pools after each (:func:`sim.swarm.after_event`), simulated once per set of pools
    and batch size."""

    def __init__(self, exp: Experiment, profile: DeviceProfile | None, fidelity: str) -> None:
        cfg = exp.config.parallel.swarm
        assert cfg is not None
        self.exp, self.profile, self.fidelity = exp, profile, fidelity
        self.swarms: dict[int, Swarm] = {}
        self.variants: dict[tuple[int, int], Experiment] = {}
        self.home = initial_stages(cfg.pools)
        self.rebalance = cfg.rebalance
        self.results: dict[tuple[int, tuple[int, ...]], Result] = {}
        self.events: list[PeerEvent] = []
        self.horizon = 0.0

    def swarm(self, variant: Experiment) -> Swarm:
        """The template of ``variant`` (one per batch size and link state)."""
        key = id(variant)
        if key not in self.swarms:
            self.swarms[key] = Swarm.of(variant, self.profile)
        return self.swarms[key]

    def horizon_s(self, steps: int) -> float:
        """A first horizon: twice the run's failure-free time with every peer present."""
        step = self.step(self.exp, self.home)
        assert step is not None
        return max(2.0 * steps * step.first_step_s, 1.0)

    def draw(self, horizon_s: float) -> None:
        """Draw the preemptions and rejoins up to ``horizon_s`` (:attr:`events`) and the
        peers' stages after each (:attr:`states`)."""
        faults = self.exp.config.faults
        assert faults is not None and faults.preemption_rate_per_hour is not None
        self.horizon = horizon_s
        self.events = draw_peer_events(faults.preemption_rate_per_hour, faults.rejoin_s,
                                       faults.preemption_seed, self.exp.cluster.num_gpus,
                                       horizon_s)
        stages = self.exp.placement.degree("pp")
        swarm = self.swarm(self.exp)
        self.states = [self.home]
        for event in self.events:
            self.states.append(after_event(self.states[-1], self.home, event, stages,
                                           swarm.throughput, self.rebalance))

    def variant(self, batch: int, events: list, upto: int,
                make: Callable[[], Experiment]) -> Experiment:
        """The experiment of a batch size and the link faults among the first ``upto``
        ``events`` (``make`` builds it), one object per such state."""
        key = (batch, sum(1 for _, event in events[:upto] if isinstance(event, LinkFault)))
        if key not in self.variants:
            self.variants[key] = make()
        return self.variants[key]

    def state(self, events: list, upto: int) -> tuple[int, ...]:
        """The peers' stages after the first ``upto`` of the run's ``events``."""
        k = sum(1 for _, event in events[:upto] if isinstance(event, PeerEvent))
        return self.states[k]

    def step(self, variant: Experiment, stage_of: tuple[int, ...]) -> Result | None:
        """One step of ``variant`` with the peers at ``stage_of``; None if a stage has no
        peer (the pipeline waits for one)."""
        if any(not pool for pool in members(stage_of, variant.placement.degree("pp"))):
            return None
        key = (id(variant), stage_of)
        if key not in self.results:
            self.results[key] = simulate_swarm(variant, self.profile, self.fidelity, stage_of,
                                               self.swarm(variant))
        return self.results[key]


def _play(exp: Experiment, steps: int, profile: DeviceProfile | None, fidelity: str,
          peers: _Peers | None) -> RunResult | None:
    """``steps`` training steps with the experiment's batch schedule and faults; None when
    the run outlasts the horizon of ``peers``' drawn preemptions (a swarm).

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

    ``training.tokens_factor`` f (:mod:`sim.dpmodes`) makes the run ceil(steps·f)
    steps (``steps_run``); ``training.batch_policy`` (:mod:`sim.batch_policy`) makes
    the global batch schedule over them, and its ``target_tokens`` ends the run at the
    step that reaches it (``batch_policy`` in the stats).
    """
    faults = exp.config.faults
    training = exp.config.training
    factor = training.tokens_factor
    steps_run = run_steps(steps, factor) if steps >= 1 else steps
    schedule, policy = training.global_batch_schedule, training.batch_policy
    if policy is not None and steps >= 1:
        schedule, steps_run = _policy_run(exp, steps_run)
    segments = batch_segments(schedule, exp.global_batch_size, steps_run)
    events: list = sorted([*enumerate(faults.link_faults if faults else ()),
                           *enumerate(faults.preemptions if faults else ()),
                           *enumerate(peers.events if peers else ())],
                          key=lambda e: (e[1].at_s, isinstance(e[1], Preemption), e[0]))
    cache: dict[tuple[int, int], Result] = {}

    def run_of(batch: int, upto: int) -> Result | None:
        if peers is not None:  # a swarm: its pools after the peers' events so far
            if (batch, upto) not in cache:
                variant = peers.variant(batch, events, upto,
                                        lambda: _with_cluster(_batch_variant(exp, batch),
                                                              events, upto))
                res = peers.step(variant, peers.state(events, upto))
                if res is None:
                    return None
                cache[(batch, upto)] = res
            return cache[(batch, upto)]
        if (batch, upto) not in cache:
            variant = _with_cluster(_rebalanced(_batch_variant(exp, batch), events, upto),
                                    events, upto)
            try:
                cache[(batch, upto)] = simulate(variant, profile, fidelity)
            except TopologyError as exc:
                raise ConfigError(f"faults.link_faults: {exc}") from None
        return cache[(batch, upto)]

    step_s: list[tuple[float, int]] = []
    """The steps' failure-free durations as runs of (duration, count): a run of 10^9 steps
    is a few runs, not 10^9 floats."""
    done = 0
    rows = []
    transitions: dict[int, Result] = {}
    """Simulations of steps in which links degraded or failed, by row."""
    # mid-step link faults where steps are simulated in full (flows can be re-rated/rerouted)
    mid_step = peers is None and not steps_overlap(exp) and (
        fidelity == "full" or (fidelity == "auto" and exp.cluster.num_gpus <= AUTO_FULL_MAX_GPUS))
    t, applied, stall, preempted, waited = 0.0, 0, 0.0, 0.0, 0.0
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
            if res is None:  # a swarm stage has no peer: no step until the next peer event
                if applied == len(events):
                    return None  # past the horizon of the draws
                waited += events[applied][1].at_s - t
                t = events[applied][1].at_s
                fresh = True
                continue
            period = res.stats["step_time_s"]
            n0 = done
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
                step_s.append((mid.first_step_s, 1))
                done += 1
                t += mid.first_step_s
                left -= 1
                applied += n_mid
                fresh = True
                continue
            if fresh:
                step_s.append((res.first_step_s, 1))
                done += 1
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
                step_s.append((period, n))
                done += n
                t += n * period
                left -= n
            rows.append({"first_step": first + count - left - (done - n0),
                         "steps": done - n0, "global_batch_size": batch,
                         "faults_applied": applied,
                         "dp": res.experiment.placement.degree("dp"),
                         "first_step_s": res.first_step_s, "step_time_s": period})
            if peers is not None:
                rows[-1]["pools"] = res.stats["swarm"]["pools"]
    if peers is not None and t > peers.horizon:
        return None  # events past the horizon may strike: draw further
    spec = faults.gpu_failures if faults else None
    num_gpus = exp.cluster.num_gpus
    run = simulate_failures(step_s, spec, num_gpus)
    base = next(iter(cache.values()))
    stats = dict(base.stats)
    tokens = None
    if exp.model is not None:
        tokens = sum(r["steps"] * r["global_batch_size"] for r in rows) * exp.model.seq_length
    elapsed = run.time_to_train_s + stall + preempted + waited
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
        "idle_breakdown_run_s": _run_idle(rows, cache, run, stall + preempted + waited,
                                          transitions),
    })
    if factor != 1:
        stats.update({"tokens_factor": factor, "steps_run": steps_run})
    if policy is not None:
        stats["batch_policy"] = {"rule": policy.rule, "schedule": schedule,
                                 "steps_run": steps_run, "tokens": tokens}
    if peers is not None:
        gone = [e for _, e in events[:applied] if isinstance(e, PeerEvent) and not e.joins]
        stats["swarm_run"] = {"peer_preemptions": len(gone),
                              "pool_empty_wait_s": waited,
                              "peers_away_at_end": sum(1 for s in peers.state(events, applied)
                                                       if s == AWAY)}
    if spec is not None:
        mtbf = job_mtbf_s(spec, num_gpus)
        if mtbf is not None and spec.checkpoint_write_s > 0:
            stats["checkpoint_interval_opt_s"] = young_daly_interval_s(spec.checkpoint_write_s,
                                                                       mtbf)
    return RunResult(tuple(cache.values()), stats)


def _policy_run(exp: Experiment, steps: int) -> tuple[list[list[int]], int]:
    """The global batch schedule ``training.batch_policy`` makes over ``steps`` steps, and
    the steps the run takes: ``steps``, or those that reach ``target_tokens`` (times
    ``tokens_factor``)."""
    training = exp.config.training
    policy = training.batch_policy
    assert policy is not None
    curve = (load_curve(policy.statistic, exp.base_dir) if policy.statistic is not None
             else None)
    unit = training.micro_batch_size * exp.placement.degree("dp")
    schedule = policy_schedule(policy, curve, exp.global_batch_size, unit, steps,
                               MAX_BATCH_SIZES)
    if policy.target_tokens is None or exp.model is None:
        return schedule, steps
    needed = policy.target_tokens * training.tokens_factor
    return schedule, steps_to_tokens(schedule, exp.model.seq_length, needed, steps)


def _run_idle(rows: list[dict], cache: dict[tuple[int, int], Result], run: FailureRun,
              stall_s: float, transitions: Mapping[int, Result]) -> dict[str, float]:
    """Mean idle seconds per GPU over the whole run, by cause.

    Each run of steps counts its simulated step's breakdown per step, plus the
    first step's excess over the period as ``bubble`` (pipeline fill);
    ``failure`` is the time lost to failures, restarts, checkpoint writes and
    preemption stalls. (After a rebalance, fewer GPUs share the steps; the mean
    is per GPU of each simulated step.)
    """
    total = dict.fromkeys(IDLE_CAUSES, 0.0)
    for j, row in enumerate(rows):
        res = transitions.get(j) or cache[(row["global_batch_size"], row["faults_applied"])]
        mean = res.stats["idle_breakdown"]["mean_s"]
        for cause in IDLE_CAUSES:
            total[cause] += mean[cause] * row["steps"]
        if row["steps"]:
            total["bubble"] += row["first_step_s"] - row["step_time_s"]
    total["failure"] += run.lost_work_s + run.restart_s + run.checkpoint_s + stall_s
    total["idle_s"] = sum(total[c] for c in IDLE_CAUSES)
    return total
