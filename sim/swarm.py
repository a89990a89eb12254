"""SWARM parallelism (Ryabinin et al. 2023): stage pools, stochastic wiring, rebalancing.

A swarm experiment (``parallel.swarm``, :mod:`sim.swarm_config`) is lowered as the fixed
pipeline of ``parallel.pp`` stages with one GPU each (the template), whose ops then move
onto peers:

* **stochastic wiring** (:func:`wire`): every micro-batch is routed, stage by stage, to a
  peer of that stage's pool drawn with probability proportional to the peer's throughput
  (:func:`peer_throughput`: micro-batches per second of the stage's forward and backward
  on the peer's own GPU, from the device model), from ``parallel.swarm.seed``;
* the template's F, B and W ops of a micro-batch run on the peer it was routed to, its
  pipeline messages go between those peers, ``activation_compression`` times fewer bytes
  (SWARM's 8-bit activations and gradients: 2 against bf16); each peer keeps the
  template's order of its stage's ops (a subsequence of a deadlock-free order is one);
* under ``schedule: 1f1b`` the template warms each stage up with as many micro-batches
  per peer of the largest pool as the plain pipeline does per GPU
  (:func:`workloads.schedules.one_f_one_b`'s ``window``), so a pool of k peers keeps about
  k times the micro-batches in flight;
* each pool all-reduces its stage's gradients (bf16) before every peer's optimizer step.

With one peer per stage the program is the template's, so the step is the fixed
pipeline's exactly (``tests/test_swarm.py``). Over ``sim run --steps`` peers are preempted
at ``faults.preemption_rate_per_hour`` and rejoin ``faults.rejoin_s`` later
(:func:`draw_peer_events`); after each such event SWARM's rebalancing (:func:`rebalanced`)
moves peers from the best- to the worst-provisioned stage; :mod:`sim.faults_run` plays
the events at step boundaries. Not modelled: a migrating peer's download of its new
stage's parameters, and the work in flight on a preempted peer (SWARM reroutes it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from base.errors import ConfigError
from sim.api import Result, _facts, _fastest_type_time
from sim.calibration import default_profile
from sim.device import DeviceProfile, compute_time_s, rank_timers
from sim.engine import InstructionTimes, simulate_program
from sim.experiment import Experiment
from sim.faults import HOUR_S, straggler_slowdowns
from sim.idle import idle_breakdown, summarize
from sim.stats import compute_stats
from workloads.lowering import lower
from workloads.program import Compute, Program, ProgramBuilder, Send
from workloads.schedules import one_f_one_b

AWAY = -1
"""The stage of a peer that has been preempted and not yet rejoined."""

MAX_PEER_EVENTS = 2000
"""Most preemptions and rejoins a run may draw: each changes the pools, and each new set of
pools is simulated (a fraction of a second to seconds each)."""


@dataclass(frozen=True)
class PeerEvent:
    """A peer leaving the swarm (preempted) or rejoining it, ``at_s`` seconds into the run."""

    at_s: float
    peer: int
    joins: bool


def initial_stages(pools: Sequence[int]) -> tuple[int, ...]:
    """Each peer's stage as ``parallel.swarm.pools`` gives them: the first ``pools[0]``
    GPUs serve stage 0, and so on."""
    return tuple(s for s, n in enumerate(pools) for _ in range(n))


def members(stage_of: Sequence[int], num_stages: int) -> tuple[tuple[int, ...], ...]:
    """The peers of each stage's pool, in rank order."""
    out: list[list[int]] = [[] for _ in range(num_stages)]
    for p, s in enumerate(stage_of):
        if s != AWAY:
            out[s].append(p)
    return tuple(tuple(m) for m in out)


def wire(pools: Sequence[Sequence[int]], weight: Callable[[int, int], float],
         num_microbatches: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """Stochastic wiring: for each micro-batch, the peer of each stage it is routed to,
    drawn from ``pools[s]`` with probability ``weight(peer, s)`` over the pool's total
    (:func:`random.Random.choices` from ``seed``; a pool of one peer draws nothing)."""
    rng = random.Random(seed)
    weights = [[weight(p, s) for p in pool] for s, pool in enumerate(pools)]
    paths = []
    for _ in range(num_microbatches):
        paths.append(tuple(pool[0] if len(pool) == 1 else
                           rng.choices(pool, weights=weights[s])[0]
                           for s, pool in enumerate(pools)))
    return tuple(paths)


def pool_throughputs(stage_of: Sequence[int], num_stages: int,
                     throughput: Callable[[int, int], float]) -> list[float]:
    """Each stage's pool throughput: its peers' throughputs on it, summed exactly rounded
    (:func:`math.fsum`: pools of the same peers tie exactly, whatever their order)."""
    return [math.fsum(throughput(p, s) for p in pool)
            for s, pool in enumerate(members(stage_of, num_stages))]


def rebalanced(stage_of: Sequence[int], num_stages: int,
               throughput: Callable[[int, int], float]) -> tuple[int, ...]:
    """SWARM's adaptive rebalancing (Ryabinin et al. 2023, sec. 3.2): while moving one peer
    from the stage of the highest pool throughput to that of the lowest raises the lowest,
    move the peer of that stage that raises it most (the lowest-numbered on a tie; stages
    tie-break by number too). Each move raises the minimum, so it ends; with identical
    peers and stages the pools end within one peer of each other."""
    now = list(stage_of)
    while True:
        total = pool_throughputs(now, num_stages, throughput)
        low = min(total)
        lo, hi = total.index(low), total.index(max(total))
        if lo == hi:
            return tuple(now)
        best, best_min = None, low
        for p, s in enumerate(now):
            if s != hi:
                continue
            trial = list(now)
            trial[p] = lo
            moved = pool_throughputs(trial, num_stages, throughput)
            if min(moved) > best_min:
                best, best_min = p, min(moved)
        if best is None:
            return tuple(now)
        now[best] = lo


def after_event(stage_of: Sequence[int], home: Sequence[int], event: PeerEvent,
                num_stages: int, throughput: Callable[[int, int], float],
                rebalance: bool) -> tuple[int, ...]:
    """The peers' stages after ``event``: a preempted peer leaves its pool; a rejoining one
    joins the stage of the lowest pool throughput (with ``rebalance``) or its own
    (``home``); then, with ``rebalance``, :func:`rebalanced`."""
    now = list(stage_of)
    if event.joins:
        now[event.peer] = home[event.peer]
        if rebalance:
            total = pool_throughputs(stage_of, num_stages, throughput)
            now[event.peer] = total.index(min(total))
    else:
        now[event.peer] = AWAY
    return rebalanced(now, num_stages, throughput) if rebalance else tuple(now)


def draw_peer_events(rate_per_hour: float, rejoin_s: float, seed: int, num_peers: int,
                     horizon_s: float) -> list[PeerEvent]:
    """Each peer's preemptions up to ``horizon_s``: exponential times up with mean
    ``1 / rate_per_hour`` hours, each followed by ``rejoin_s`` away; each peer has its own
    stream from ``seed``, so a longer horizon extends the same draws. Sorted by time, then
    peer, leaving before joining."""
    events = []
    mean_up = HOUR_S / rate_per_hour
    expected = num_peers * horizon_s / (mean_up + rejoin_s)
    if expected > MAX_PEER_EVENTS / 2:
        raise ConfigError(f"faults.preemption_rate_per_hour={rate_per_hour:g}: about "
                          f"{2 * expected:,.0f} preemptions and rejoins of {num_peers} peers "
                          f"over the {horizon_s:,.0f} s run, more than the "
                          f"{MAX_PEER_EVENTS:,} a run may simulate; run fewer --steps")
    for p in range(num_peers):
        rng = random.Random(f"swarm-preemption {seed} {p}")
        t = 0.0
        while True:
            t += rng.expovariate(1.0 / mean_up)
            if t > horizon_s:
                break
            events.append(PeerEvent(t, p, False))
            t += rejoin_s
            if t > horizon_s:
                break
            events.append(PeerEvent(t, p, True))
    return sorted(events, key=lambda e: (e.at_s, e.peer, e.joins))


# ----------------------------------------------------------------------------- one step


def _compute_timer(exp: Experiment, profile: DeviceProfile | None
                   ) -> tuple[Callable[[Compute], float], tuple | None]:
    """Each compute op's time on its own GPU (as :func:`sim.api.simulate` times it), and
    the per-rank timers of a mixed cluster (None on a uniform one)."""
    cluster, kernel = exp.cluster, exp.config.training.attention
    if cluster.heterogeneous:
        timers = rank_timers(cluster.gpus, lambda spec: profile or default_profile(spec.name),
                             kernel)
        return (lambda op: timers[op.gpu](op)), timers
    gpu, prof = cluster.gpu, profile or default_profile(cluster.gpu.name)

    def base(op: Compute) -> float:
        if op.duration_s is not None:
            return op.duration_s
        return compute_time_s(gpu, prof, op.flops, op.hbm_bytes, op.attn_flops,
                              op.elementwise_bytes, kernel, op.gemm_dims)

    return base, None


@dataclass(frozen=True, eq=False)
class Swarm:
    """A swarm experiment ready to simulate for any set of pools: its template pipeline
    program and each peer's throughput on each stage."""

    exp: Experiment
    template: Program
    work_time: Callable[[Compute], float]
    timers: tuple | None
    slowdown: dict[int, float]
    stage_ops: tuple[tuple[Compute, ...], ...]
    """Micro-batch 0's compute ops of each stage in the template."""
    rates: dict[tuple[int, int], float] = field(default_factory=dict)
    """:meth:`throughput` by (peer, stage), as computed."""

    @classmethod
    def of(cls, exp: Experiment, profile: DeviceProfile | None = None,
           reference: bool = False) -> Swarm:
        """Lower ``exp``'s template pipeline (``parallel.swarm`` required)."""
        if exp.config.parallel.swarm is None:
            raise ValueError("not a swarm experiment: parallel.swarm is missing")
        base, timers = _compute_timer(exp, profile)
        slowdown = straggler_slowdowns(exp.config.faults, exp.cluster.num_gpus)
        work = base if not slowdown else (
            lambda op: base(op) * slowdown.get(op.gpu, 1.0))
        schedule = exp.schedule
        window = max(exp.config.parallel.swarm.pools)
        if schedule.name == "1f1b" and window > 1:
            schedule = one_f_one_b(schedule.num_ranks, schedule.num_microbatches, window)
        template = lower(schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage,
                         None, reference)
        ops: list[list[Compute]] = [[] for _ in range(exp.placement.degree("pp"))]
        for ins in template.instructions:
            if isinstance(ins, Compute) and ins.mb == 0:
                ops[ins.gpu].append(ins)
        return cls(exp, template, work, timers, slowdown, tuple(tuple(o) for o in ops))

    @property
    def num_stages(self) -> int:
        """Pipeline stages (pools)."""
        return len(self.stage_ops)

    def throughput(self, peer: int, stage: int) -> float:
        """Micro-batches per second that ``peer`` computes on ``stage``: one over the time
        of the stage's forward and backward (and W) of one micro-batch on its GPU."""
        if (peer, stage) not in self.rates:
            t = math.fsum(self.work_time(op._replace(gpu=peer)) for op in self.stage_ops[stage])
            self.rates[(peer, stage)] = 1.0 / t if t > 0 else math.inf
        return self.rates[(peer, stage)]

    def program(self, stage_of: Sequence[int]) -> tuple[Program, tuple[tuple[int, ...], ...]]:
        """The step's program with the peers serving ``stage_of`` (each peer's stage, or
        :data:`AWAY`), and the wiring (each micro-batch's peer per stage)."""
        cfg = self.exp.config.parallel.swarm
        assert cfg is not None
        pools = members(stage_of, self.num_stages)
        empty = [s for s, pool in enumerate(pools) if not pool]
        if empty:
            raise ConfigError(f"parallel.swarm: stages {empty} have no peer")
        paths = wire(pools, self.throughput, self.exp.num_microbatches, cfg.seed)
        kept, opts = [], []
        for ins in self.template.instructions:
            if isinstance(ins, Compute) and ins.kind == "opt":
                opts.append(ins)
            elif isinstance(ins, Compute):
                assert ins.mb >= 0, f"a compute op of no micro-batch: {ins}"
                kept.append(ins._replace(gpu=paths[ins.mb][ins.gpu]))
            elif isinstance(ins, Send):
                path = paths[ins.mb]
                kept.append(ins._replace(gpu=path[ins.gpu], dst=path[ins.dst],
                                         nbytes=ins.nbytes / cfg.activation_compression))
            else:  # one GPU per stage and no replicas: no collective in the template
                raise AssertionError(f"unexpected instruction in a swarm template: {ins}")
        assert all(o.id >= len(kept) for o in opts), "the optimizer step comes last"
        last: dict[int, int] = {}
        for ins in kept:
            last[ins.gpu] = ins.id
        opt_of = {opt.gpu: opt for opt in opts}
        b = ProgramBuilder(len(kept))
        for s, pool in enumerate(pools):
            opt = opt_of.get(s)
            if len(pool) == 1:  # the template's own step end
                if opt is not None:
                    b.compute(pool[0], "opt", opt.name, opt.deps,
                              **_opt_fields(opt, cfg.weight_sharing))
                continue
            nbytes = self.exp.costs.grad_bytes(s) / cfg.weight_sharing
            reduced = {p: (last[p],) if p in last else () for p in pool}
            if nbytes > 0:
                reduced = {p: (i,) for p, i in b.collective(
                    pool, reduced, kind="dp", name="swarm grad all_reduce", op="all_reduce",
                    nbytes=nbytes, stage=s).items()}
            if opt is not None:
                for p in pool:
                    b.compute(p, "opt", opt.name, reduced[p],
                              **_opt_fields(opt, cfg.weight_sharing))
        present = tuple(p for p, s in enumerate(stage_of) if s != AWAY)
        static = tuple(self.template.static_bytes[s] / cfg.weight_sharing if s != AWAY else 0.0
                       for s in stage_of)
        names = tuple(f"gpu{p} stage{s}" if s != AWAY else f"gpu{p} away"
                      for p, s in enumerate(stage_of))
        program = Program(len(stage_of), (*kept, *b.build()), static, self.template.schedule,
                          names, None if len(present) == len(stage_of) else present,
                          dict(self.template.meta))
        return program, paths


def _opt_fields(opt: Compute, sharing: int) -> dict:
    """The work of a template optimizer op, for a copy on a peer whose stage shares its
    weights ``sharing``-fold (1/sharing of the parameters to update)."""
    if sharing == 1:
        return {"flops": opt.flops, "hbm_bytes": opt.hbm_bytes,
                "elementwise_bytes": opt.elementwise_bytes, "duration_s": opt.duration_s}
    return {"flops": opt.flops / sharing, "hbm_bytes": opt.hbm_bytes / sharing,
            "elementwise_bytes": opt.elementwise_bytes / sharing,
            "duration_s": None if opt.duration_s is None else opt.duration_s / sharing}


def simulate_swarm(exp: Experiment, profile: DeviceProfile | None = None,
                   fidelity: str = "auto", stage_of: Sequence[int] | None = None,
                   swarm: Swarm | None = None, reference: bool = False) -> Result:
    """One step of a swarm experiment with the peers serving ``stage_of`` (default: the
    pools of ``parallel.swarm.pools``), every peer simulated (fidelity ``full``; ``auto``
    is full, ``collapsed`` a ConfigError). Returns a :class:`sim.api.Result` whose stats
    add ``swarm``: the pools, their throughputs and the micro-batches each peer ran."""
    if fidelity == "collapsed":
        raise ConfigError("fidelity='collapsed': parallel.swarm routes each micro-batch to "
                          "its own peers, so every peer is simulated; use fidelity full (or "
                          "auto)")
    cfg = exp.config.parallel.swarm
    assert cfg is not None
    swarm = swarm or Swarm.of(exp, profile, reference)
    stage_of = tuple(stage_of) if stage_of is not None else initial_stages(cfg.pools)
    program, paths = swarm.program(stage_of)
    times = InstructionTimes()
    timeline = simulate_program(program, exp.cluster, swarm.work_time, times=times,
                                event_queue=reference)
    facts = _facts(exp, "full", profile or default_profile(exp.cluster.gpu.name))
    facts = replace(facts, pipeline_rank=tuple(max(s, 0) for s in stage_of))
    stats = compute_stats(timeline, facts, None, times.intervals)
    if swarm.slowdown:
        stats["stragglers"] = {str(g): f for g, f in swarm.slowdown.items()}
    ready_s, end_s = times.arrays or (times.ready_s, times.end_s)
    idle = idle_breakdown(program, ready_s, end_s, timeline.simulated_gpus, swarm.slowdown,
                          None, times.cause, _fastest_type_time(swarm.timers), reference)
    stats["idle_breakdown"] = summarize(idle)
    pools = members(stage_of, swarm.num_stages)
    runs = [0] * len(stage_of)
    for path in paths:
        for p in path:
            runs[p] += 1
    stats["swarm"] = {
        "pools": [len(pool) for pool in pools],
        "peers_away": sum(1 for s in stage_of if s == AWAY),
        "pool_throughput_mb_per_s": pool_throughputs(stage_of, swarm.num_stages,
                                                     swarm.throughput),
        "activation_compression": cfg.activation_compression,
        "microbatches_per_peer": runs,
    }
    return Result(exp, program, timeline, stats, 1, (timeline.end_s,))
