"""Faults over a training run: stragglers, GPU failures with checkpoint/restart, batch schedules.

Pure (no SimPy, no matplotlib) and deterministic: randomness only from the
seeds in the experiment file (:class:`random.Random`, never the global one).

* :func:`check_fault_targets` checks, when the experiment is built, that the links and
  servers the faults name exist.
* :func:`straggler_slowdowns` resolves ``faults.stragglers`` and
  ``faults.random_stragglers`` to a slowdown factor per GPU; the engine
  multiplies that GPU's compute times by it (:func:`sim.api.simulate`).
* :func:`simulate_failures` plays a run of steps against a failure process
  (exponential inter-arrival times from an MTBF, or given times): every
  ``checkpoint_interval_steps`` steps a checkpoint costs
  ``checkpoint_write_s``; a failure loses the work since the last checkpoint
  (and any checkpoint being written) and costs ``restart_s``, during which
  further failures restart the restart. This is the model of Young 1974 and
  Daly 2006, whose first-order expectation is :func:`young_daly_goodput`.
* :func:`batch_segments` resolves ``training.global_batch_schedule`` to runs
  of steps with one batch size each. Lau, Li, Xu, Liu and Kolar 2025
  ("Adaptive Batch Size Schedules for Distributed Training of Language Models
  with Data and Model Parallelism", CPAL 2025, PMLR 280:278-304) grow the
  global batch during pretraining by a gradient-noise test, under DP and FSDP;
  their schedule depends on the training dynamics, so the simulator takes the
  realized schedule as input. A larger batch means more micro-batches per
  pipeline (same micro-batch size and layout).
* :func:`mid_step_link_changes` turns link degradations and failures that strike in
  the middle of a step into bandwidth changes at their offsets in that step, which the
  flow network applies to the transfers in flight (:meth:`sim.network.FlowNetwork.set_capacity`);
  a failure (bandwidth 0) moves the transfers in flight across the link onto routes
  around it (:meth:`sim.network.FlowNetwork.reroute`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from base.errors import ConfigError, TopologyError
from sim.faults_config import FaultsConfig, GpuFailures, LinkFault, Preemption, RandomStragglers
from topologies.cluster import Cluster

HOUR_S = 3600.0


def _random_count(spec: RandomStragglers, num_gpus: int) -> int:
    given = [k for k in ("fraction", "count") if getattr(spec, k) is not None]
    if len(given) != 1:
        raise ConfigError("faults.random_stragglers: give exactly one of 'fraction' or 'count', "
                          f"got {given or 'neither'}")
    if spec.count is not None:
        if spec.count > num_gpus:
            raise ConfigError(f"faults.random_stragglers.count={spec.count} exceeds the "
                              f"cluster's {num_gpus} GPUs")
        return spec.count
    return max(1, round(spec.fraction * num_gpus))


def _random_slowdown(spec: RandomStragglers, rng: random.Random) -> float:
    if spec.slowdown is not None:
        return spec.slowdown
    if spec.slowdown_range is not None:
        return rng.uniform(*spec.slowdown_range)
    ln = spec.slowdown_lognormal
    return max(1.0, ln.median * math.exp(ln.sigma * rng.gauss(0.0, 1.0)))


def _check_random(spec: RandomStragglers) -> None:
    given = [k for k in ("slowdown", "slowdown_range", "slowdown_lognormal")
             if getattr(spec, k) is not None]
    if len(given) != 1:
        raise ConfigError("faults.random_stragglers: give exactly one of 'slowdown', "
                          f"'slowdown_range' or 'slowdown_lognormal', got {given or 'none'}")
    r = spec.slowdown_range
    if r is not None and (len(r) != 2 or r[0] < 1 or r[1] < r[0]):
        raise ConfigError(f"faults.random_stragglers.slowdown_range={r}: give [low, high] with "
                          "1 <= low <= high")


def check_fault_targets(faults: FaultsConfig | None, cluster: Cluster) -> None:
    """ConfigError unless every link fault names a link of ``cluster`` (both directions, as
    it changes both) and says what happens to it, and every preemption names one of its
    servers and a policy its options fit. Checked when the experiment is built, so a
    mistake is reported whether or not the run plays the faults (``sim run --steps``) and
    whenever they strike."""
    if faults is None:
        return
    for k, fault in enumerate(faults.link_faults):
        if len(fault.link) != 2:
            raise ConfigError(f"faults.link_faults[{k}].link={fault.link}: give [node_a, node_b]")
        if not fault.failed and fault.bandwidth_factor is None:
            raise ConfigError(f"faults.link_faults[{k}]: give bandwidth_factor or failed: true")
        try:
            cluster.resolve_link(fault.link)
            cluster.resolve_link(fault.link[::-1])
        except TopologyError as exc:
            raise ConfigError(f"faults.link_faults[{k}]: {exc}") from None
    hosts = len({cluster.host_of(g) for g in range(cluster.num_gpus)})
    for k, event in enumerate(faults.preemptions):
        if event.node >= hosts:
            raise ConfigError(f"faults.preemptions[{k}].node={event.node}: the cluster has "
                              f"{hosts} servers (0..{hosts - 1})")
        if event.policy == "rebalance" and event.replacement_s:
            raise ConfigError(f"faults.preemptions[{k}].replacement_s={event.replacement_s}: "
                              "only used with policy 'stall'")


def straggler_slowdowns(faults: FaultsConfig | None, num_gpus: int) -> dict[int, float]:
    """Compute slowdown factor per straggling GPU (GPUs not listed run at 1.0).

    Explicit ``stragglers`` first; ``random_stragglers`` picks its GPUs with
    ``random.Random(seed).sample`` and draws their factors in rank order; a GPU
    that is both gets the product. Factors of exactly 1 are dropped.
    """
    out: dict[int, float] = {}
    if faults is None:
        return out
    for k, s in enumerate(faults.stragglers):
        if s.gpu >= num_gpus:
            raise ConfigError(f"faults.stragglers[{k}].gpu={s.gpu}: the cluster has {num_gpus} "
                              f"GPUs (0..{num_gpus - 1})")
        if s.gpu in out:
            raise ConfigError(f"faults.stragglers[{k}].gpu={s.gpu} is listed twice")
        out[s.gpu] = s.slowdown
    spec = faults.random_stragglers
    if spec is not None:
        _check_random(spec)
        rng = random.Random(spec.seed)
        chosen = sorted(rng.sample(range(num_gpus), _random_count(spec, num_gpus)))
        for g in chosen:
            out[g] = out.get(g, 1.0) * _random_slowdown(spec, rng)
    return {g: f for g, f in sorted(out.items()) if f != 1.0}


# ----------------------------------------------------------------------------- batch schedule


def batch_segments(schedule: list[list[int]] | None, default_batch: int,
                   steps: int) -> tuple[tuple[int, int, int], ...]:
    """``(first_step, num_steps, global_batch_size)`` runs covering steps ``0 .. steps - 1``.

    ``schedule`` is ``training.global_batch_schedule``: ``[[step, batch], ...]``
    with strictly increasing steps starting at 0; each batch holds from its step
    until the next entry. Without one, every step uses ``default_batch``.
    """
    if steps < 1:
        raise ConfigError(f"--steps={steps}: must be at least 1")
    if not schedule:
        if schedule is not None:
            raise ConfigError("training.global_batch_schedule=[]: give at least [[0, batch]]")
        return ((0, steps, default_batch),)
    key = "training.global_batch_schedule"
    for k, entry in enumerate(schedule):
        if len(entry) != 2 or entry[0] < 0 or entry[1] < 1:
            raise ConfigError(f"{key}[{k}]={entry}: give [step, global_batch_size] with "
                              "step >= 0 and global_batch_size >= 1")
    if schedule[0][0] != 0:
        raise ConfigError(f"{key}[0]={schedule[0]}: the first entry must start at step 0")
    for k in range(1, len(schedule)):
        if schedule[k][0] <= schedule[k - 1][0]:
            raise ConfigError(f"{key}[{k}]={schedule[k]}: steps must increase "
                              f"(previous entry starts at step {schedule[k - 1][0]})")
    out = []
    for k, (start, batch) in enumerate(schedule):
        if start >= steps:
            break
        end = schedule[k + 1][0] if k + 1 < len(schedule) else steps
        out.append((start, min(end, steps) - start, batch))
    return tuple(out)


# ----------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class FailureRun:
    """Wall-clock accounting of a run under failures; ``time_to_train_s`` is the sum of the
    other four times."""

    time_to_train_s: float
    useful_s: float
    """Failure-free time of the steps (the work that counts)."""
    checkpoint_s: float
    """Checkpoint writes that completed."""
    lost_work_s: float
    """Work (and checkpoint writes) done since the last checkpoint when a failure struck."""
    restart_s: float
    """Restarts, including restarts cut short by another failure."""
    failures: int

    @property
    def goodput(self) -> float:
        """Useful work / elapsed time."""
        return self.useful_s / self.time_to_train_s if self.time_to_train_s > 0 else 1.0


def job_mtbf_s(spec: GpuFailures, num_gpus: int) -> float | None:
    """The whole job's mean time between failures in seconds (None: given times only)."""
    if spec.mtbf_hours is not None:
        return spec.mtbf_hours * HOUR_S
    if spec.gpu_mtbf_hours is not None:
        return spec.gpu_mtbf_hours * HOUR_S / num_gpus
    return None


def check_failures(spec: GpuFailures) -> None:
    """Cross-field rules of ``faults.gpu_failures`` (ConfigError naming the key)."""
    given = [k for k in ("mtbf_hours", "gpu_mtbf_hours", "times_s") if getattr(spec, k) is not None]
    if len(given) != 1:
        raise ConfigError("faults.gpu_failures: give exactly one of 'mtbf_hours', "
                          f"'gpu_mtbf_hours' or 'times_s', got {given or 'none'}")
    if spec.times_s is not None and any(t < 0 for t in spec.times_s):
        raise ConfigError(f"faults.gpu_failures.times_s={spec.times_s}: times must be >= 0")


class _Failures:
    """The failure process: next failure strictly after a time."""

    def __init__(self, spec: GpuFailures, num_gpus: int) -> None:
        self.mtbf_s = job_mtbf_s(spec, num_gpus)
        self.rng = random.Random(spec.seed)
        self.times = sorted(spec.times_s or ())
        self.k = 0

    def after(self, t: float) -> float:
        if self.mtbf_s is not None:
            return t + self.rng.expovariate(1.0 / self.mtbf_s)
        while self.k < len(self.times) and self.times[self.k] <= t:
            self.k += 1
        if self.k == len(self.times):
            return math.inf
        self.k += 1
        return self.times[self.k - 1]


MAX_FAILURES = 1_000_000
"""Most failures a run may be expected to see (:func:`check_failure_budget`): each is
drawn and played out one by one, about a microsecond each."""


def _checkpoint_segments(step_s: Sequence[tuple[float, int]], every: int
                         ) -> list[tuple[float, int]]:
    """The work between checkpoints as runs of (seconds, count): ``every`` steps each, the
    last one shorter if the steps do not divide. Each segment's work is the exact sum of
    its steps rounded once (as :func:`math.fsum` of them), whatever its runs of steps."""
    out: list[tuple[float, int]] = []
    pending, have = Fraction(0), 0
    for d, n in step_s:
        left = n
        if have:  # complete the segment begun by the previous runs
            take = min(every - have, left)
            pending += Fraction(d) * take
            have += take
            left -= take
            if have == every:
                out.append((float(pending), 1))
                pending, have = Fraction(0), 0
        if left >= every:
            out.append((float(Fraction(d) * every), left // every))
            left %= every
        if left:
            pending += Fraction(d) * left
            have += left
    if have:
        out.append((float(pending), 1))
    return out


def check_failure_budget(spec: GpuFailures, segments: Sequence[tuple[float, int]],
                         num_gpus: int) -> None:
    """ConfigError naming the MTBF key unless the run is expected to see at most
    :data:`MAX_FAILURES` failures. With exponential failures of mean M, finishing a
    segment of ``w`` seconds (work and checkpoint write) takes ``exp(w/M) - 1`` failures
    on average, and each restart of ``R`` seconds ``exp(R/M)`` attempts: a job MTBF far
    below the checkpoint interval or the restart never finishes."""
    mtbf = job_mtbf_s(spec, num_gpus)
    if mtbf is None:
        return
    write, restart = spec.checkpoint_write_s, spec.restart_s
    expected = 0.0
    for work, count in segments:
        x, r = (work + write) / mtbf, restart / mtbf
        expected = math.inf if x + r > 700 else expected + count * math.expm1(x) * math.exp(r)
    if expected > MAX_FAILURES:
        work = max(w for w, _ in segments)
        key = ("restart_s" if restart >= work + write else "checkpoint_write_s" if write >= work
               else "mtbf_hours" if spec.mtbf_hours is not None else "gpu_mtbf_hours")
        many = "more than 1e300" if expected == math.inf else f"about {expected:,.3g}"
        raise ConfigError(
            f"faults.gpu_failures.{key}={getattr(spec, key)}: the run would see {many} "
            f"failures (a job MTBF of {mtbf:.3g} s against {work:.3g} s of work between "
            f"checkpoints, checkpoint_write_s={write:g}, restart_s={restart:g}), more than the "
            f"{MAX_FAILURES:,} a run may simulate")


def simulate_failures(step_s: Sequence[tuple[float, int]], spec: GpuFailures | None,
                      num_gpus: int) -> FailureRun:
    """Play the steps ``step_s`` (runs of (failure-free duration, count)) against
    ``spec``'s failures.

    Checkpoints are written after every ``checkpoint_interval_steps`` steps
    (not after the last step). An exponential failure process is memoryless,
    so after each failure the next one is drawn afresh from its time. Identical
    checkpoint intervals between two failures are played at once, so the cost grows with
    the failures and the runs of steps, not with the steps.
    """
    useful = float(sum((Fraction(d) * n for d, n in step_s), Fraction(0)))
    if spec is None:
        return FailureRun(useful, useful, 0.0, 0.0, 0.0, 0)
    check_failures(spec)
    segments = _checkpoint_segments(step_s, spec.checkpoint_interval_steps)
    check_failure_budget(spec, segments, num_gpus)
    process = _Failures(spec, num_gpus)
    t = lost = restart = checkpoint = 0.0
    failures = 0
    next_fail = process.after(0.0)
    plays = [(work, count, spec.checkpoint_write_s) for work, count in segments]
    if plays:  # no checkpoint after the last step
        work, count, write = plays.pop()
        plays += [(work, count - 1, write), (work, 1, 0.0)]
    for work, count, write in plays:
        need = work + write
        while count > 0:
            if next_fail < t + need:  # a failure in this interval: lose it, restart
                lost += next_fail - t
                t = next_fail
                failures += 1
                next_fail = process.after(t)
                while next_fail < t + spec.restart_s:  # a failure during the restart
                    restart += next_fail - t
                    t = next_fail
                    failures += 1
                    next_fail = process.after(t)
                t += spec.restart_s
                restart += spec.restart_s
                if failures > 10 * MAX_FAILURES:
                    raise ConfigError(f"faults.gpu_failures: more than {10 * MAX_FAILURES:,} "
                                      "failures drawn; the run does not progress")
                continue
            # the intervals that end before the next failure, at once
            k = count if need <= 0 or next_fail == math.inf else \
                max(1, min(count, int((next_fail - t) // need)))
            if k > 1 and next_fail < t + k * need:  # rounding: the k-th one fails
                k -= 1
            t += need if k == 1 else k * need
            checkpoint += write * k
            count -= k
    return FailureRun(useful + checkpoint + lost + restart, useful, checkpoint, lost, restart,
                      failures)


def young_daly_goodput(interval_s: float, checkpoint_s: float, restart_s: float,
                       mtbf_s: float) -> float:
    """First-order expected goodput with checkpoints every ``interval_s`` of work.

    Daly 2006's first-order model (after Young 1974): a failure strikes on average
    halfway through an interval of ``interval_s + checkpoint_s`` and costs that
    half plus ``restart_s``, so the wall time ``T_w`` of ``T_s`` of work obeys
    ``T_w = T_s (1 + δ/τ) + (T_w / M) (R + (τ + δ)/2)``, i.e. goodput
    ``T_s / T_w = τ/(τ + δ) · (1 − (R + (τ + δ)/2) / M)``.
    """
    tau, delta = interval_s, checkpoint_s
    return tau / (tau + delta) * (1.0 - (restart_s + (tau + delta) / 2.0) / mtbf_s)


def young_daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Optimal work between checkpoints (seconds).

    Young 1974: ``sqrt(2 δ M)``. Daly 2006's higher-order estimate, used here:
    ``sqrt(2 δ M) [1 + (1/3) sqrt(δ / 2M) + (1/9) (δ / 2M)] - δ`` for ``δ < 2M``,
    else ``M``.
    """
    delta, m = checkpoint_s, mtbf_s
    if delta >= 2.0 * m:
        return m
    x = delta / (2.0 * m)
    return math.sqrt(2.0 * delta * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def preempted_step_lost_s(event: LinkFault | Preemption, t0_s: float, t1_s: float) -> float:
    """Seconds of a step running from ``t0_s`` to ``t1_s`` lost to ``event``: a ``rebalance``
    preemption striking inside it (``t0_s < at_s < t1_s``) with a notice that ends before
    the step does loses the step up to ``at_s`` (the DP replicas on the lost server never
    deliver their gradients, so it is rerun on the replicas left); 0 otherwise (a ``stall``
    pauses the pipeline and loses nothing, SWARM-style)."""
    if not isinstance(event, Preemption) or event.policy != "rebalance":
        return 0.0
    if t0_s < event.at_s < t1_s and event.at_s + event.notice_s < t1_s:
        return event.at_s - t0_s
    return 0.0


def strikes_mid_step(event: LinkFault | Preemption) -> bool:
    """Whether ``event`` changes links in the middle of a step: a link degradation or
    failure (a preemption changes the layout instead: it loses the step in flight or waits
    for the step boundary, :func:`preempted_step_lost_s`)."""
    return isinstance(event, LinkFault) and (event.failed or event.bandwidth_factor is not None)


def mid_step_link_changes(cluster: Cluster, events: Sequence[tuple[int, LinkFault | Preemption]],
                          start: int, t0_s: float, t1_s: float
                          ) -> tuple[list[tuple[float, dict[int, float]]], int]:
    """The link degradations and failures among ``events[start:]`` (``(index in
    faults.link_faults, event)``, sorted by time) that strike inside a step running from
    ``t0_s`` to ``t1_s``.

    Returns them as ``link_changes`` for :func:`sim.engine.simulate_program`: ``(offset
    from t0_s, {link index: bandwidth_Bps})``, bandwidths on ``cluster`` (the state
    before them) with repeated degradations of one link multiplied, a failed link (both
    directions, as :meth:`~topologies.cluster.Cluster.with_link_changes` fails it) at
    bandwidth 0, which the engine reroutes around; and how many events they are. It
    stops at the first preemption: that changes the layout, so it waits for the step
    boundary.
    """
    changes: list[tuple[float, dict[int, float]]] = []
    now: dict[int, float] = {}
    k = start
    while k < len(events):
        index, event = events[k]
        if not strikes_mid_step(event) or not t0_s < event.at_s < t1_s:
            break
        assert isinstance(event, LinkFault)  # its link a pair: check_fault_targets
        try:
            if event.failed:
                step = dict.fromkeys(cluster.link_indices(event.link), 0.0)
            else:
                assert event.bandwidth_factor is not None
                base = cluster.degraded_bandwidths({tuple(event.link): event.bandwidth_factor})
                step = {i: now.get(i, cluster.link_bandwidth_Bps[i]) * event.bandwidth_factor
                        for i in base}
        except TopologyError as exc:
            raise ConfigError(f"faults.link_faults[{index}]: {exc}") from None
        now.update(step)
        changes.append((event.at_s - t0_s, step))
        k += 1
    return changes, k - start
