"""Layers per pipeline stage from the cost, network and memory models.

:func:`rank_time_model` is the per-rank time of one micro-batch that
``layers_per_stage: balanced`` (:func:`sim.experiment.balanced_layers`) equalises.
``layers_per_stage: auto`` (:func:`auto_layers`) adds to it what balancing leaves out:
each stage's pipeline send/recv over the actual links between its GPUs and the
neighbouring stages' (all of a boundary's messages at once, sharing the links max-min
fairly, :func:`sim.network.makespan_s`) and each stage's memory limit
(:mod:`workloads.memory`), and splits the layers by dynamic programming over
contiguous stages, minimising the slowest stage (as Alpa's inter-operator pass, Zheng
et al. 2022, sec. 5.2, and Luo et al. 2022 plan pipelines over heterogeneous links).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from base.errors import ConfigError
from sim.calibration import default_profile
from sim.device import work_timer
from sim.network import makespan_s
from sim.selection import estimate, group_profile, resolve_algorithm
from topologies.cluster import Cluster
from topologies.placement import Placement
from workloads import memory, schedules
from workloads.costs import CommSeg, ComputeSeg, RingAttention, split_layers
from workloads.frameworks import FrameworkProfile, fragmentation
from workloads.transformer import TransformerCosts

StageCost = Callable[[int, int], float]
"""``cost(stage, layers)``: seconds per micro-batch of ``stage`` holding ``layers``
layers (``math.inf``: it cannot hold them)."""


def rank_time_model(costs: TransformerCosts, schedule: schedules.Schedule,
                    placement: Placement, cluster: Cluster) -> StageCost:
    """``cost(r, n)``: one micro-batch's F, B (and W) of all stages of pipeline rank ``r``
    holding ``n`` layers in all (split over its stages as evenly as possible, earlier
    ones first): compute on the rank's GPUs by the device model, each GPU type with its
    calibrated profile (the slowest type where a rank mixes them; ring attention's
    blocks counted, its passes not), plus its TP collectives by the α-β estimate of
    :mod:`sim.collectives` on the rank's TP group (uncontended, NCCL-like algorithm
    choice). Pipeline, DP and EP traffic, memory and the optimizer step are not counted.
    """
    S = schedule.num_stages
    pp = placement.degree("pp")
    split = schedule.split_backward
    kinds = (schedules.FORWARD, schedules.BACKWARD) + ((schedules.WEIGHT_GRAD,) if split else ())
    stages_of = [[s for s in range(S) if schedule.stage_rank[s] == r] for r in range(pp)]
    types = [dict.fromkeys(cluster.gpu_of(g) for g in range(placement.num_gpus)
                           if placement.coords(g)["pp"] == r) for r in range(pp)]
    timers = {spec: work_timer(spec, default_profile(spec.name), costs.attention)
              for spec in dict.fromkeys(cluster.gpus)}
    groups = [group_profile(cluster, placement.group("tp", placement.gpu(pp=r)))
              for r in range(pp)]
    comm_cache: dict[tuple[int, str, float], float] = {}

    def comm_s(r: int, seg: CommSeg) -> float:
        key = (r, seg.op, seg.nbytes)
        if key not in comm_cache:
            prof = groups[r]
            algo = resolve_algorithm(seg.op, cluster.collective_algos.get(seg.op, "auto"),
                                     seg.nbytes, prof)
            comm_cache[key] = (0.0 if prof.n <= 1 or seg.group != "tp" else
                               estimate(seg.op, algo, seg.nbytes, prof))
        return comm_cache[key]

    def cost(r: int, n: int) -> float:
        probe = [1] * S
        for s, k in zip(stages_of[r], split_layers(n, len(stages_of[r])), strict=True):
            probe[s] = k
        c = replace(costs, stage_layers=tuple(probe))
        segs = [seg for s in stages_of[r] for kind in kinds
                for seg in c.op_segments(schedules.Op(s, kind, 0), split)]
        work = [(seg, 1) for seg in segs if isinstance(seg, ComputeSeg)]
        work += [(seg.block, seg.steps) for seg in segs if isinstance(seg, RingAttention)]
        comm = sum(comm_s(r, seg) for seg in segs if isinstance(seg, CommSeg))
        return max(sum(k * timers[spec](seg) for seg, k in work) for spec in types[r]) + comm

    return cost


def _partition_dp(cost: list[list[float]], num_layers: int, num_stages: int,
                  combine: Callable[[float, float], float]) -> tuple[float, tuple[int, ...]]:
    """The split of ``num_layers`` into ``num_stages`` contiguous stages of at least one layer
    minimising the ``combine``-fold of their costs ``cost[s][n]`` (``max`` or ``+``, both
    monotone, so the best split's prefixes are best splits of theirs), and that value:
    ``best[s][l] = min over n of combine(best[s-1][l-n], cost[s-1][n])``, O(S·L²).
    Among equal values, the first found (earlier stages fewer layers)."""
    S, L = num_stages, num_layers
    best = [0.0] + [math.inf] * L
    choice: list[list[int]] = []
    for s in range(S):
        new, pick = [math.inf] * (L + 1), [0] * (L + 1)
        for done in range(s + 1, L - (S - s - 1) + 1):
            for n in range(1, done - s + 1):
                value = combine(best[done - n], cost[s][n])
                if value < new[done]:
                    new[done], pick[done] = value, n
        best = new
        choice.append(pick)
    out, left = [], L
    for s in reversed(range(S)):
        out.append(choice[s][left])
        left -= choice[s][left]
    return best[L], tuple(reversed(out))


def min_max_partition(cost: StageCost, num_layers: int, num_stages: int
                      ) -> tuple[int, ...] | None:
    """The split of ``num_layers`` layers into ``num_stages`` contiguous stages of at least
    one layer each that minimises the largest ``cost(stage, layers)``; None if every split
    has a stage of infinite cost. Dynamic programming (:func:`_partition_dp`), twice:
    first the least possible largest cost M, then, among the splits whose every stage
    costs at most M, the one of least sum of squared costs (the stages that do not set the
    pace share the slack evenly, rather than as the first minimiser found left it)."""
    S, L = num_stages, num_layers
    if not 1 <= S <= L:
        raise ValueError(f"{L} layers cannot fill {S} stages")
    c = [[cost(s, n) if 1 <= n <= L - S + 1 else math.inf for n in range(L + 1)]
         for s in range(S)]
    pace, split = _partition_dp(c, L, S, max)
    if pace == math.inf:
        return None
    # squares of costs over the pace: at most 1 each, so they cannot overflow
    squares = [[math.inf if x > pace else (x / pace) ** 2 if pace > 0 else 0.0 for x in row]
               for row in c]
    return _partition_dp(squares, L, S, operator.add)[1]


def _boundary_s(cluster: Cluster, placement: Placement, src: int, dst: int,
                nbytes: float) -> float:
    """Time the links between rank ``src``'s GPUs and rank ``dst``'s are busy with one
    micro-batch's pipeline messages (one per tp, cp, dp coordinate, all at once): their
    max-min makespan on the cluster's links. Route latency is left out: it delays a
    message but occupies neither the stage nor the link, so in the steady state of a
    pipeline it overlaps the other micro-batches' work."""
    flows = []
    for g in range(placement.num_gpus):
        at = placement.coords(g)
        if at["pp"] != src:
            continue
        route = cluster.route(g, placement.gpu(**{**at, "pp": dst}))
        flows.append((0.0, route.links, nbytes))
    return makespan_s(flows, cluster.link_bandwidth_Bps)


def _run_reserved(placement: Placement, cluster: Cluster, framework: FrameworkProfile | None,
                  costs: TransformerCosts) -> tuple[float, ...]:
    """Each pipeline rank's reserved memory from the run (:func:`sim.reserved.by_rank`:
    context, cuBLAS workspaces, NCCL buffers; without TP overlap's userbuffers, which the
    split does not change), under ``framework`` (Megatron-LM's without one)."""
    from sim import reserved
    from sim.gpu_profiles import generation_of
    from workloads.frameworks import framework as named

    return tuple(r.total for r in reserved.by_rank(
        placement, cluster, framework or named("megatron"), costs.model, False, 0, 0, False,
        generation_of))


def _memory_fits(costs: TransformerCosts, schedule: schedules.Schedule, placement: Placement,
                 cluster: Cluster, framework: FrameworkProfile | None = None
                 ) -> Callable[[int, int], bool]:
    """``fits(r, n)``: whether rank ``r`` holding ``n`` layers stays within every one of its
    GPUs' memory at its peak, by the memory model (static state, the stash of the
    micro-batches in flight at each op's start in program order, the op's working memory,
    the allocator's fragmentation and the run's reserved memory, :mod:`workloads.memory`,
    :mod:`sim.reserved`), with each
    GPU type's profile; the fragmentation is ``framework``'s
    (:func:`workloads.frameworks.fragmentation`, as ``sim run``'s verdict), the device
    profile's without one."""
    pp = placement.degree("pp")
    split = schedule.split_backward
    specs = [dict.fromkeys(cluster.gpu_of(g) for g in range(placement.num_gpus)
                           if placement.coords(g)["pp"] == r) for r in range(pp)]
    rows = [memory.in_flight(schedule.rank_ops[r], (r,), split, costs.w_retained_fraction)
            for r in range(pp)]
    S = schedule.num_stages
    run_reserved = _run_reserved(placement, cluster, framework, costs)

    def fits(r: int, n: int) -> bool:
        probe = [1] * S
        probe[r] = n
        c = replace(costs, stage_layers=tuple(probe))
        act = c.activation_bytes_per_mb(r)
        slots = rows[r][:, -1].astype(int)
        per_slot = {k: c.transient_bytes(schedules.Op(k // 3, "FBW"[k % 3], 0))
                    for k in np.unique(slots).tolist()}
        dynamic = float((rows[r][:, 0] * act + np.array([per_slot[k] for k in
                                                          slots.tolist()])).max())
        static = c.static_bytes((r,))
        for spec in specs[r]:
            prof = default_profile(spec.name)
            frag = (prof.fragmentation if framework is None
                    else fragmentation(framework, prof.fragmentation))
            resv = run_reserved[r] if prof.reserved_from_run else prof.reserved_bytes
            peak = memory.device_bytes(static, dynamic, frag, resv)
            if memory.oom(peak, spec.hbm_capacity_bytes):
                return False
        return True

    return fits


def auto_layers(costs: TransformerCosts, schedule: schedules.Schedule, placement: Placement,
                cluster: Cluster, framework: FrameworkProfile | None = None) -> tuple[int, ...]:
    """Layers per stage for ``layers_per_stage: auto``: the contiguous split minimising the
    slowest stage's time per micro-batch, a stage's time being :func:`rank_time_model`'s
    (compute and TP collectives) plus its pipeline traffic, the activation it receives
    and sends forward and the gradient it receives and sends back, each boundary timed
    with all its messages at once on the actual links (:func:`_boundary_s`), subject to
    every stage fitting its GPUs' memory (:func:`_memory_fits`); if no split fits, the
    fastest split regardless of memory (the run then reports ``oom``). One stage per
    pipeline rank only (ConfigError otherwise)."""
    if schedule.chunks_per_rank != 1:
        raise ConfigError(f"parallel.layers_per_stage='auto': one model chunk per pipeline "
                          f"rank only (schedule {schedule.name!r} has "
                          f"{schedule.chunks_per_rank}); use 'balanced' or a list")
    S, L = schedule.num_stages, costs.model.num_layers
    time_of = rank_time_model(costs, schedule, placement, cluster)
    nbytes = costs.p2p_bytes()
    forward = [_boundary_s(cluster, placement, r, r + 1, nbytes) for r in range(S - 1)]
    backward = [_boundary_s(cluster, placement, r + 1, r, nbytes) for r in range(S - 1)]
    p2p = [(forward[r - 1] + backward[r - 1] if r > 0 else 0.0)
           + (forward[r] + backward[r] if r < S - 1 else 0.0) for r in range(S)]
    fits = _memory_fits(costs, schedule, placement, cluster, framework)

    def stage_s(r: int, n: int) -> float:
        return time_of(r, n) + p2p[r]

    def within_memory(r: int, n: int) -> float:
        return stage_s(r, n) if fits(r, n) else math.inf

    split = min_max_partition(within_memory, L, S) or min_max_partition(stage_s, L, S)
    assert split is not None  # finite costs: every split is feasible
    return split
