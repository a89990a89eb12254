"""Lower bounds of a layout's peak memory and step time, without simulating it.

The memory bounds follow the memory model (:mod:`workloads.memory`): the quick one
needs no schedule, the exact one walks each rank's program order as the engine
allocates. The step-time bounds time ops with the device model and, for collapsed
fidelity, the TP and DP collectives of the first and last pipeline ranks; the loose
one needs no schedule, the tight one is a list schedule of the built plan
(:func:`sim.search.plan.list_run`). Property tests check every bound against the
simulator.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from base.errors import ConfigError, ScheduleError
from sim.calibration import default_profile
from sim.commtime import CollectiveTimer
from sim.device import DeviceProfile, compute_time_s
from sim.search.layouts import Layout
from sim.search.plan import (
    KINDS,
    PLAN_CACHE_OPS,
    SLOT,
    Plan,
    build_plan,
    light_plan,
    list_run,
    plan_size,
    restore_plan,
)
from sim.search.space import SearchContext
from sim.tpoverlap import all_reduces_beside
from topologies.hardware import GiB
from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, GradReady, ParamGather, RingAttention
from workloads.frameworks import fragmentation
from workloads.lowering.groups import dp_groups
from workloads.memory import device_bytes, oom, stash_at_rows
from workloads.registry import SCHEDULES, overlaps_steps
from workloads.schedules import FORWARD, Op
from workloads.transformer import TransformerCosts

OOM_SLACK = 1e-9
"""Relative slack of the memory pre-filter: a bound this close to the capacity is not rejected
(the engine sums the same bytes in another order)."""


def _op_shape(costs: TransformerCosts) -> tuple[Any, ...]:
    """The layout settings an op's segments depend on (cache keys; not dp, not stages)."""
    return (costs.micro_batch_size, costs.tp, costs.sequence_parallel, costs.recompute,
            costs.zero_stage, getattr(costs, "cp", 1), getattr(costs, "ep", 1))


def _work_shape(costs: TransformerCosts) -> tuple[Any, ...]:
    """What an op's compute and TP collectives depend on besides its stage's layer count:
    :meth:`TransformerCosts.op_segments` without markers does not read the ZeRO stage or
    dp (ZeRO-3's gathers are markers), so layouts that differ only there share cache
    entries (a test checks the independence)."""
    return (costs.micro_batch_size, costs.tp, costs.sequence_parallel, costs.recompute,
            getattr(costs, "cp", 1), getattr(costs, "ep", 1))


def _op_stage_key(costs: TransformerCosts, stage: int) -> tuple[Any, ...]:
    """What an op's compute and TP collectives read of its stage: its layer count, its dense
    layers, whether it is the first (the embedding's gradient) and whether the last (the
    head); stages alike in these share cache entries."""
    return (costs.stage_layers[stage], costs.stage_dense_layers(stage), stage == 0,
            stage == len(costs.stage_layers) - 1)


def _op_key(costs: TransformerCosts, stage: int, kind: str, split: bool) -> tuple[Any, ...]:
    """What one op's compute and TP collectives (:meth:`TransformerCosts.op_segments`
    without markers) read: :func:`_work_shape`, :func:`_op_stage_key`, the op's kind and
    whether the backward is split. A forward reads neither whether the backward is split
    nor, without TP (the input embedding's collective runs in the first stage's forward,
    a partitioned pipeline gather's in every other's), whether its stage is the first:
    such forwards share entries (a test checks the independence)."""
    layers, dense, first, last = _op_stage_key(costs, stage)
    if kind == FORWARD:
        split = False
        if costs.tp == 1:
            first = False
    return (*_work_shape(costs), layers, dense, first, last, kind, split)


def _state_shape(costs: TransformerCosts) -> tuple[Any, ...]:
    """What the model state (:meth:`TransformerCosts.static_bytes`) and the optimizer step
    depend on: parameters per GPU and how ZeRO shards them, not the micro-batch, SP or
    recomputation (a test checks the independence)."""
    return (costs.tp, getattr(costs, "cp", 1), getattr(costs, "ep", 1), costs.dp,
            costs.zero_stage, costs.stage_layers)


StateTerms = tuple[float, tuple[tuple[float, float | None, float | None], ...]]
"""Static bytes of all stages, and per screened pipeline rank (optimizer step, ZeRO's
parameter all-gather or None, ZeRO-3's DP stream per micro-batch or None); no ranks
where the model state alone cannot fit (:meth:`Bounds._state_terms`)."""


def state_family(layout: Layout) -> tuple[Any, ...]:
    """The family of layouts that share their model-state terms in screening
    (:meth:`Bounds.screen_terms`): all but the micro-batch size, sequence parallelism and
    recomputation."""
    return (layout.tp, layout.cp, layout.ep, layout.pp, layout.dp, layout.vpp,
            layout.schedule, layout.placement, layout.zero_stage)


family_of = attrgetter("tp", "cp", "ep", "pp", "dp", "vpp", "schedule", "placement", "zero_stage")
"""``family_of(layout) == state_family(layout)``, the tuple built in C (screening asks it
of every layout: the parent of a multi-worker search for the whole space, a worker for
each layout it screens); a test checks the two agree."""
group_of = attrgetter("tp", "cp", "ep", "pp")
"""``group_of(layout) == family_group(state_family(layout))``, built in C."""
_work_key = attrgetter("tp", "cp", "ep", "pp", "dp", "vpp", "schedule", "placement",
                       "micro_batch_size", "sequence_parallel", "recompute")
"""What a layout's work terms in screening depend on (:meth:`Bounds.screen_terms`): all but
the ZeRO stage."""


def family_group(family: tuple[Any, ...]) -> tuple[int, int, int, int]:
    """The ``(tp, cp, ep, pp)`` group of a :func:`state_family` (its first four fields): the
    families of a group share their DP groups and collective times."""
    return family[:4]


def screens_by_family(ctx: SearchContext) -> bool:
    """Whether screening composes its bounds from terms cached by family
    (:meth:`Bounds.screen_terms`): a uniform cluster and a layer split that depends only
    on the stage count (not ``balanced``, which depends on each layout's cost model)."""
    return not ctx.cluster.heterogeneous and ctx.config.parallel.layers_per_stage != "balanced"


def _stage_class(costs: TransformerCosts, stage: int) -> tuple[Any, ...]:
    """What a stage's activations and working memory depend on within one cost model: for
    a plain transformer whose layers are alike (no dense first layers, every layer
    recomputed alike) its layer count, whether it is the first stage (ZeRO-3 gathers
    the embedding there) and whether it is the last (the head); otherwise the stage
    itself. A test checks the memory walk against one without these caches."""
    if (type(costs) is not TransformerCosts or costs.model.first_dense_layers
            or costs.recompute_num_layers is not None
            or costs.recompute_every_k_layers is not None):
        return ("stage", stage)
    return (costs.stage_layers[stage], stage == 0, stage == len(costs.stage_layers) - 1)


class Bounds:
    """Lower bounds of a layout's peak memory and step time, without simulating it.

    Schedule-free (cheap, for screening): :meth:`quick_memory_bound_gib` and
    :meth:`loose_step_bound_s`. On the layout's built schedule (:meth:`plan`, for
    judging): :meth:`memory_bound_gib`, the exact memory walk, and :meth:`step_bound_s`,
    a list schedule of its ops. ``comm`` (valid for collapsed fidelity): time the
    TP and DP collectives of the first and the last pipeline rank as a
    collapsed simulation does (:class:`sim.commtime.CollectiveTimer`, all
    replicas' groups at once) and add them to the step bounds; other ranks'
    ops count their compute only, which keeps the bound a bound (a shorter op
    never makes a list schedule longer) and the cost independent of ``pp``.
    Caches live on the instance.
    """

    def __init__(self, ctx: SearchContext, profile: DeviceProfile | None = None,
                 comm: bool = True, collapsed_only: bool = False) -> None:
        """``profile``: the device profile of every GPU type (None: each type's default, as
        ``simulate`` times a mixed cluster; reserved memory and fragmentation come from
        rank 0's, as in its stats). ``collapsed_only``: every simulation is collapsed
        (fidelity ``collapsed``), so a layout whose pipeline ranks mix GPU types, which
        ``simulate`` refuses to collapse, is screened out as ``invalid``. Collectives are
        timed by the cluster's shared timer (:meth:`CollectiveTimer.shared`), whose
        timings the search's simulations in this process reuse, and the other way round."""
        self.ctx = ctx
        self.profile = profile or default_profile(ctx.cluster.gpu.name)
        self.comm = comm
        self.collapsed_only = collapsed_only
        types = ctx.cluster.gpu_types
        self._types = types
        """The cluster's GPU types; ranks' types are indices into it (ctx.rank_types)."""
        self._profiles = tuple(profile or default_profile(t.name) for t in types)
        self._type_capacity_gib = tuple(t.hbm_capacity_bytes / GiB for t in types)
        self._uniform = not ctx.cluster.heterogeneous
        self.timer = CollectiveTimer.shared(ctx.cluster)
        self._comm: dict[tuple, float] = {}
        self._opt: dict[tuple, float] = {}
        self._loose: dict[tuple, tuple[list[float], list[float]]] = {}
        self._groups: dict[tuple[str, int, int, int, int], tuple[tuple[int, ...], ...]] = {}
        self._plans: OrderedDict[tuple[str, int, int, int], Plan | str] = OrderedDict()
        self._plan_ops = 0
        """Ops of the plans kept (:data:`PLAN_CACHE_OPS`)."""
        self._built: list[tuple[str, int, int, int]] = []
        """Keys of the plans :meth:`plan` built, in order (not those adopted)."""
        self._op_cache: dict[tuple, tuple[float, tuple[tuple[str, float], ...]]] = {}
        self._static: dict[tuple, float] = {}
        self._markers: dict[tuple, tuple[tuple[str, float], ...]] = {}
        self._work: dict[tuple, tuple] = {}
        self._act: dict[tuple, float] = {}
        self._rank_act: dict[tuple, float] = {}
        self._transient: dict[tuple, float] = {}
        self._state: dict[tuple, tuple] = {}
        """Terms of :meth:`screen_terms` by family."""
        self._split: frozenset[str] | None = None
        self._capacity_gib = max(self._type_capacity_gib)
        """The largest GPU memory of the cluster (all of them on a uniform cluster)."""
        self._tokens = ctx.global_batch_size * ctx.model.seq_length

    def num_microbatches(self, layout: Layout) -> int:
        """Micro-batches per step of ``layout`` (the global batch over micro-batch x dp)."""
        return self.ctx.global_batch_size // (layout.micro_batch_size * layout.dp)

    def _fits(self, gib: float, capacity_gib: float | None = None) -> bool:
        """Whether ``gib`` fits ``capacity_gib`` (default: the largest GPU's memory)."""
        cap = self._capacity_gib if capacity_gib is None else capacity_gib
        return not oom(gib, cap, OOM_SLACK)

    def rank_types(self, layout: Layout) -> tuple[tuple[int, ...], ...]:
        """Per pipeline rank, the GPU types of its GPUs (indices into the cluster's types)."""
        return self.ctx.rank_types(layout.tp, layout.cp, layout.dp, layout.pp, layout.placement)

    def mixed(self, layout: Layout) -> bool:
        """Whether some pipeline rank of ``layout`` mixes GPU types."""
        return not self._uniform and any(len(t) > 1 for t in self.rank_types(layout))

    def _gib(self, static_bytes: float, dynamic_bytes: float,
             reserved: float | None = None) -> float:
        """GiB a GPU holding ``static_bytes`` of model state and ``dynamic_bytes`` of
        activations and working buffers reports (:func:`workloads.memory.device_bytes`:
        fragmentation on the dynamic part, reserved memory on top, as
        :func:`sim.stats.compute_stats` counts it); ``reserved`` the GPU's reserved bytes
        (None: the least any layout reserves, :meth:`reserved_floor`)."""
        return device_bytes(static_bytes, dynamic_bytes,
                            fragmentation(self.ctx.framework, self.profile.fragmentation),
                            self.reserved_floor() if reserved is None else reserved) / GiB

    def reserved_floor(self) -> float:
        """Reserved bytes no layout goes under: the profile's own where it does not take
        reserved memory from the run, else a lazily loaded context and the cuBLAS workspaces
        (:func:`sim.reserved.floor_bytes`) of the cluster's GPUs, the least."""
        if not self.profile.reserved_from_run:
            return self.profile.reserved_bytes
        from sim import reserved
        from sim.gpu_profiles import generation_of

        return min(reserved.floor_bytes(generation_of(t.name)) for t in self._types)

    def reserved_bytes(self, layout: Layout) -> tuple[float, ...]:
        """Each pipeline rank's reserved bytes under ``layout``, as ``sim run`` counts them
        (:mod:`sim.reserved`; the profile's constant where it does not take them from the
        run), cached by the layout's groups."""
        key = ("reserved", layout.tp, layout.cp, layout.dp, layout.pp, layout.placement)
        got = self._static.get(key)
        if got is None:
            if not self.profile.reserved_from_run:
                got = (self.profile.reserved_bytes,) * layout.pp
            else:
                from sim import reserved
                from sim.gpu_profiles import generation_of

                ctx = self.ctx
                got = tuple(r.total for r in reserved.by_rank(
                    ctx.placement(layout.tp, layout.cp, layout.dp, layout.pp,
                                  layout.placement),
                    ctx.cluster, ctx.framework, ctx.model, False, ctx.config.model.seq_length,
                    layout.micro_batch_size, ctx.config.training.precision == "fp8",
                    generation_of))
            self._static[key] = got
        return got

    # --------------------------------------------------------------- schedules
    def plan(self, layout: Layout) -> Plan | str:
        """The built schedule of ``layout``, or why the builder refuses it (LRU-cached)."""
        key = (layout.schedule, layout.pp, self.num_microbatches(layout), layout.vpp)
        plan = self._plans.get(key)
        if plan is None:
            try:
                plan = build_plan(*key, self.ctx.costs.w_retained_fraction,
                                   self.ctx.config.training.seq_chunks)
            except ScheduleError as exc:
                plan = f"schedule={layout.schedule!r}: {exc}"
            self._keep_plan(key, plan)
            self._built.append(key)
        else:
            self._plans.move_to_end(key)
        return plan

    def _keep_plan(self, key: tuple[str, int, int, int], plan: Plan | str) -> None:
        self._plans[key] = plan
        self._plan_ops += plan_size(plan)
        while self._plan_ops > PLAN_CACHE_OPS and len(self._plans) > 1:
            self._plan_ops -= plan_size(self._plans.popitem(last=False)[1])

    @property
    def plans_built(self) -> int:
        """Plans :meth:`plan` has built so far (:meth:`plans_since` counts from it)."""
        return len(self._built)

    def plans_since(self, start: int) -> tuple[tuple[tuple[str, int, int, int], Any], ...]:
        """The plans :meth:`plan` built after the first ``start``, still kept, packed without
        their schedules (:func:`~sim.search.plan.light_plan`): for another worker's
        :meth:`adopt_plans`."""
        plans = self._plans
        return tuple((key, light_plan(plans[key])) for key in self._built[start:]
                     if key in plans)

    def adopt_plans(self, plans: Iterable[tuple[tuple[str, int, int, int], Any]]) -> None:
        """Take plans another worker built (:meth:`plans_since`; restored by
        :func:`~sim.search.plan.restore_plan`): a plan is a pure function of
        its key (the schedule, ``pp``, the micro-batch count, ``vpp``) and the context's
        ``w_retained_fraction`` and ``seq_chunks``, the same in every worker of a search,
        so a verdict judged on it is the one judged on a plan built here. Plans kept here
        are kept as they are."""
        have = self._plans
        for key, plan in plans:
            if key not in have:
                self._keep_plan(key, restore_plan(plan))

    def _stage_rank(self, name: str, p: int, v: int) -> tuple[int, ...] | None:
        """Which rank holds each stage (it does not depend on m): from a small build."""
        sched = self.ctx.stage_schedule(name, p, v)  # cached there
        return None if sched is None else sched.stage_rank

    # --------------------------------------------------------------- memory
    def quick_memory_bound_gib(self, costs: TransformerCosts, pp: int,
                               reserved: float | None = None) -> float:
        """Schedule-free bound: the average static state per rank plus one micro-batch of the
        lightest stage (some rank holds at least the average, every rank at least one).
        :meth:`Screener.screen` holds it against the largest GPU memory of the cluster (on a mixed
        cluster the fullest rank may sit on its biggest GPUs); :meth:`Screener.judge` checks every
        rank against its own GPUs."""
        stages = tuple(range(len(costs.stage_layers)))
        key = ("static", *_state_shape(costs))
        static = self._static.get(key)
        if static is None:
            static = self._static[key] = costs.static_bytes(stages)
        key = ("act", *_op_shape(costs), costs.stage_layers)
        act = self._static.get(key)
        if act is None:
            act = self._static[key] = min(costs.activation_bytes_per_mb(s) for s in stages)
        return self._gib(static / pp, act, reserved)

    def memory_bound_gib(self, costs: TransformerCosts, plan: Plan,
                         reserved: Sequence[float] | None = None) -> list[float]:
        """Lower bound of each pipeline rank's peak memory, GiB, as the statistics count it
        (:meth:`_gib`).

        The static state of the rank's stages (:meth:`TransformerCosts.static_bytes`)
        plus, at the start of each op in the rank's program order
        (:func:`workloads.memory.in_flight`),
        the stashed activations (``activation_bytes_per_mb`` of each stage times its
        in-flight count) and the op's working memory (``transient_bytes``, if the
        cost model has it); the largest of these. The engine allocates exactly this
        way (ops on a rank run one at a time in program order), so the bound is
        tight for the current memory model and stays a bound if the engine tracks
        more.
        """
        transient = getattr(costs, "transient_bytes", None)
        # cached per cost-model shape and stage class: many layouts (schedules, m) and
        # stages share them
        shape = (*_op_shape(costs), costs.dp, costs.stage_layers)
        classes = [_stage_class(costs, s) for s in range(len(costs.stage_layers))]
        lut = None
        if plan.exact and transient is not None:
            lut = np.zeros(3 * len(classes))
            for k in range(len(lut)):
                key = (shape, classes[k // 3], k % 3)
                t = self._transient.get(key)
                if t is None:
                    t = self._transient[key] = transient(Op(k // 3, KINDS[k % 3], 0))
                lut[k] = t
        out = []
        resv = [None] * len(plan.rank_stages) if reserved is None else reserved
        for (stages, rows), r in zip(zip(plan.rank_stages, plan.in_flight, strict=True), resv,
                                     strict=True):
            key = ("rank static", *_state_shape(costs), stages)
            static = self._static.get(key)
            if static is None:
                static = self._static[key] = costs.static_bytes(stages)
            if plan.exact:
                act = [self._stage_act(costs, shape, classes[s], s) for s in stages]
                extra = lut[rows[:, -1].astype(int)] if lut is not None else 0.0
                dynamic = float((stash_at_rows(rows, act) + extra).max())
                out.append(self._gib(static, dynamic, r))
            else:
                out.append(self._gib(static, 0.0, r))
        return out

    def _stage_act(self, costs: TransformerCosts, shape: tuple[Any, ...],
                   stage_class: tuple[Any, ...], stage: int) -> float:
        """``costs.activation_bytes_per_mb(stage)``, cached by shape and stage class."""
        key = (shape, stage_class)
        act = self._rank_act.get(key)
        if act is None:
            act = self._rank_act[key] = costs.activation_bytes_per_mb(stage)
        return act

    # --------------------------------------------------------------- time
    def _op_time(self, costs: TransformerCosts, stage: int, kind: str, split: bool,
                 types: tuple[int, ...] = (0,)) -> tuple[float, tuple[tuple[str, float], ...]]:
        """(compute seconds, ((TP collective, bytes), ...)) of one op of ``stage``.

        Compute is timed by the device model as ``simulate`` times it, on the fastest of
        the GPU types ``types`` (those of the rank that runs the op: each of its GPUs
        takes at least that long). The
        collectives are those between the op's first and last compute segment:
        a collapsed simulation folds them into the op as blocking communication
        (:func:`workloads.lowering._fold`); the leading and trailing ones run on
        their own stream and are left out (a bound may only leave work out).
        """
        key = (*_op_key(costs, stage, kind, split), types)
        hit = self._op_cache.get(key)
        if hit is not None:
            return hit
        kernel = costs.attention
        segs = costs.op_work(Op(stage, kind, 0), split)  # op_segments, unnamed layers
        at = [i for i, seg in enumerate(segs) if isinstance(seg, ComputeSeg)]
        work: list[tuple[ComputeSeg, int]] = []
        comms = []
        # the backward all-reduces run beside the wgrad GEMMs (sim.tpoverlap): left out
        beside = all_reduces_beside(costs)
        for i, seg in enumerate(segs):
            if isinstance(seg, ComputeSeg):
                work.append((seg, 1))
            elif isinstance(seg, RingAttention):  # its blocks' compute; the passes may hide
                work.append((seg.block, seg.steps))
            elif (isinstance(seg, CommSeg) and seg.group == "tp" and at and at[0] < i < at[-1]
                  and not (beside and seg.label.endswith("bwd all-reduce"))):
                comms.append((seg.op, seg.nbytes))
            # other collectives (EP all-to-all) and ZeRO-3 markers: left out

        def seconds(seg: ComputeSeg, t: int) -> float:
            return seg.duration_s if seg.duration_s is not None else compute_time_s(
                self._types[t], self._profiles[t], seg.flops, seg.hbm_bytes, seg.attn_flops,
                seg.elementwise_bytes, kernel, seg.gemm_dims)

        compute = min(sum(k * seconds(seg, t) for seg, k in work) for t in types)
        out = self._op_cache[key] = (compute, tuple(comms))
        return out

    def _placement(self, layout: Layout) -> Placement:
        return self.ctx.placement(layout.tp, layout.cp, layout.dp, layout.pp, layout.placement)

    def _dp_timed(self, layout: Layout) -> bool:
        """Whether the bounds time the DP collectives: the plain end-of-step gradient
        collective (and ZeRO-1/2's parameter all-gather) of the collapsed lowering. Not
        with ZeRO-3, overlapped gradient buckets, CP or EP, whose gradient traffic is
        split up or goes over other groups (left out: a bound may only leave work out)."""
        return (layout.dp > 1 and layout.zero_stage < 3 and layout.cp == 1 and layout.ep == 1
                and not self.ctx.config.parallel.overlap_grad_reduce)

    def _comm_ranks(self, layout: Layout) -> frozenset[int]:
        """Pipeline ranks whose collectives the bounds time (all others: compute only). None
        (an empty set) where a pipeline rank mixes GPU types: ``simulate`` runs such a
        layout in full fidelity, which the collapsed collective times do not bound."""
        return frozenset({0, layout.pp - 1}) if self.comm and not self.mixed(layout) \
            else frozenset()

    def _group_set(self, dim: str, layout: Layout, r: int) -> tuple[tuple[int, ...], ...]:
        """Every replica's ``dim`` group of pipeline rank ``r``, as the collapsed lowering
        passes them to the timer (TP: one group per DP replica; DP: one per TP lane)."""
        key = (dim, layout.tp, layout.dp, layout.pp, r, layout.placement)
        groups = self._groups.get(key)
        if groups is None:
            pl = self._placement(layout)
            if dim == "tp":
                groups = tuple(pl.group("tp", pl.gpu(pp=r, dp=e)) for e in range(layout.dp))
            else:
                groups = tuple(tuple(pl.gpu(tp=u, dp=e, pp=r) for e in range(layout.dp))
                               for u in range(layout.tp))
            self._groups[key] = groups
        return groups

    def _collective_s(self, dim: str, layout: Layout, r: int, op: str, nbytes: float,
                      one: bool = False) -> float:
        """``op`` on every replica's ``dim`` group of pipeline rank ``r`` (the timer's time,
        cached under a small key: the timer's own key holds every GPU of the groups).

        ``one``: on the first replica's group alone, a lower bound of that (the other
        replicas' flows can only compete with its flows) and 30-300 times cheaper to time
        for 1,024 GPUs; equal to it when the groups share no link (e.g. TP inside servers).
        """
        key = (dim, layout.tp, layout.dp, layout.pp, r, op, nbytes, one, layout.placement)
        t = self._comm.get(key)
        if t is None:
            groups = self._group_set(dim, layout, r)
            t = self._comm[key] = self.timer(op, groups[:1] if one else groups, nbytes)
        return t

    def _tp_comm_s(self, costs: TransformerCosts, stage: int, kind: str, split: bool,
                   layout: Layout, r: int, one: bool = False) -> float:
        """The TP collectives a collapsed simulation folds into one op of ``stage`` on rank r
        (``one``: see :meth:`_collective_s`)."""
        key = ("op", *_op_key(costs, stage, kind, split), layout.dp, layout.pp, r, one)
        t = self._comm.get(key)
        if t is None:
            comms = self._op_time(costs, stage, kind, split)[1]
            each: dict[tuple[str, float], float] = {}  # an op's layers repeat the same few
            for c in comms:
                if c not in each:
                    each[c] = self._collective_s("tp", layout, r, c[0], c[1], one)
            t = self._comm[key] = sum(each[c] for c in comms)  # in order: the same float
        return t

    def _table(self, layout: Layout, costs: TransformerCosts, plan: Plan) -> list[float]:
        """Seconds of one op per ``3·stage + kind`` slot: compute, plus the TP collectives a
        collapsed simulation folds into the op on the ranks of :meth:`_comm_ranks`."""
        kinds = KINDS if plan.split_backward else KINDS[:2]
        timed = self._comm_ranks(layout) if layout.tp > 1 else frozenset()
        types = self.rank_types(layout)
        table = [0.0] * (3 * len(plan.stage_rank))
        for s, r in enumerate(plan.stage_rank):
            for kind in kinds:
                compute = self._op_time(costs, s, kind, plan.split_backward, types[r])[0]
                if r in timed:
                    compute += self._tp_comm_s(costs, s, kind, plan.split_backward, layout, r)
                table[3 * s + SLOT[kind]] = compute
        return table

    def _optimizer_s(self, costs: TransformerCosts, stages: tuple[int, ...],
                     types: tuple[int, ...] = (0,)) -> float:
        """The optimizer step of a rank holding ``stages``, on the fastest of its ``types``."""
        key = (*_state_shape(costs), stages, types)
        t = self._opt.get(key)
        if t is None:
            seg = costs.optimizer_segment(stages)
            t = 0.0 if seg is None else min(compute_time_s(
                self._types[i], self._profiles[i], seg.flops, seg.hbm_bytes, seg.attn_flops,
                seg.elementwise_bytes, costs.attention, seg.gemm_dims) for i in types)
            self._opt[key] = t
        return t

    def step_bound_s(self, layout: Layout, costs: TransformerCosts, plan: Plan) -> float:
        """Lower bound of the simulated step time of ``layout``, seconds.

        A list schedule of the plan (:func:`list_run`): every op takes its
        compute time (plus, with ``comm``, its TP collectives), starts as soon
        as its rank is free and its producers are done, and messages between
        stages take no time. The engine runs the same ops in the same program
        order under the same dependencies, with messages and contention that
        only delay them, so each op ends no earlier there. Each rank then runs
        its optimizer step; with ``comm`` and ``dp > 1`` the optimizer also
        waits for the DP gradient collective of the rank's last stage, and
        ZeRO's parameter all-gather follows it. The step is at least the
        latest of these over ranks.

        Schedules whose consecutive steps overlap
        (:func:`workloads.registry.overlaps_steps`: the step time is the period of
        back-to-back steps): every rank still runs its whole step's work once per period,
        so the bound is the busiest rank's ops (as timed above) plus its optimizer step.
        """
        if not plan.exact:
            return 0.0
        table = self._table(layout, costs, plan)
        types = self.rank_types(layout)
        ops = plan.timing
        if overlaps_steps(layout.schedule):
            busy = [self._optimizer_s(costs, stages, types[r])
                    for r, stages in enumerate(plan.rank_stages)]
            for i, r in enumerate(ops.op_rank):
                busy[r] += table[ops.op_slot[i]]
            return max(busy)
        end = list_run(plan, table)
        timed = self._comm_ranks(layout) if self._dp_timed(layout) else frozenset()
        bound = 0.0
        for r, stages in enumerate(plan.rank_stages):
            last = end[ops.last_op[r]] if ops.last_op[r] >= 0 else 0.0
            opt = self._optimizer_s(costs, stages, types[r])
            rank_end = last + opt
            if r in timed and ops.final_op[r] >= 0:
                rs, ag = self._dp_collectives_s(layout, costs, r, plan)
                rank_end = max(last, end[ops.final_op[r]] + rs) + opt + ag
            bound = max(bound, rank_end)
        return bound

    def _dp_collectives_s(self, layout: Layout, costs: TransformerCosts, r: int, plan: Plan
                          ) -> tuple[float, float]:
        """(The gradient collective of rank r's last stage, ZeRO's parameter all-gather),
        seconds, as the collapsed lowering times them."""
        final_stage = plan.timing.op_slot[plan.timing.final_op[r]] // 3
        nbytes = costs.grad_bytes(final_stage)
        grad_op = "reduce_scatter" if layout.zero_stage >= 1 else "all_reduce"
        rs = self._collective_s("dp", layout, r, grad_op, nbytes) if nbytes > 0 else 0.0
        ag = 0.0
        if layout.zero_stage >= 1:
            ag = self._collective_s("dp", layout, r, "all_gather",
                                    sum(costs.grad_bytes(s) for s in plan.rank_stages[r]))
        return rs, ag

    def loose_step_bound_s(self, layout: Layout, costs: TransformerCosts) -> float:
        """Schedule-free lower bound of the step time, seconds.

        On the first and the last pipeline rank (a bound on any rank bounds the
        step): the forwards of the stages before the rank's first stage run
        before it can start, then its ``m`` micro-batches of ops on its stages
        (with ``comm``, plus their TP collectives, timed on one replica's group:
        :meth:`_collective_s` with ``one``), its optimizer step and, with
        ``comm`` and ZeRO, its parameter all-gather. Schedules with overlapping steps:
        the rank's work alone (a period has no fill, see :meth:`step_bound_s`).
        """
        m = self.num_microbatches(layout)
        split = layout.schedule in self._split_schedules()
        stage_rank = self._stage_rank(layout.schedule, layout.pp, layout.vpp)
        types = self.rank_types(layout)
        stage_types = None
        if not self._uniform:  # each stage on its rank's GPUs (unknown rank: any type)
            every = tuple(range(len(self._types)))
            stage_types = (tuple(types[r] for r in stage_rank) if stage_rank is not None
                           else (every,) * len(costs.stage_layers))
        forward_chain, per_mb = self._stage_times(costs, split, stage_types)
        if stage_rank is None:
            return m * sum(per_mb) / layout.pp
        timed = self._comm_ranks(layout)
        bound = 0.0
        for r in sorted({0, layout.pp - 1}):
            mine, busy = self._rank_busy(costs, layout, split, stage_rank, per_mb, timed, r)
            end = m * busy + self._optimizer_s(costs, mine, types[r])
            if r in timed and self._zero3_timed(layout, costs):
                bound = max(bound, m * sum(self._zero3_stream_s(costs, s, k, split, layout, r)
                                           for s in mine for k in KINDS))
            if overlaps_steps(layout.schedule):  # a period: no fill, see step_bound_s
                bound = max(bound, end)
                continue
            end += forward_chain[mine[0]]
            if r in timed and layout.zero_stage >= 1 and self._dp_timed(layout):
                end += self._collective_s("dp", layout, r, "all_gather",
                                          sum(costs.grad_bytes(s) for s in mine))
            bound = max(bound, end)
        return bound

    def _zero3_timed(self, layout: Layout, costs: TransformerCosts) -> bool:
        """Whether the bounds time ZeRO-3's DP stream (:meth:`_zero3_stream_s`): ZeRO-3 over
        more than one replica, micro-batches not cut into sequence chunks (each chunk would
        be an op of its own), gathered per op (not once a step,
        :attr:`~TransformerCosts.zero3_once_per_step`, whose stream is busy once a stage and
        not timed here)."""
        return (layout.zero_stage == 3 and layout.dp * layout.cp > 1
                and not SCHEDULES[layout.schedule].seq_chunks
                and not costs.zero3_once_per_step)

    def _zero3_stream_s(self, costs: TransformerCosts, stage: int, kind: str, split: bool,
                        layout: Layout, r: int) -> float:
        """ZeRO-3: seconds the DP stream of pipeline rank ``r`` is busy for one op of
        ``stage`` (0 for a kind the schedule does not run).

        The ZeRO-3 lowering (:class:`workloads.lowering.pieces.PieceLowering`) issues, for
        every op of every micro-batch, one all-gather per
        :class:`~workloads.costs.ParamGather` of the op's marked segments and one
        reduce-scatter per :class:`~workloads.costs.GradReady`, over the rank's DP x CP
        groups (:func:`workloads.lowering.groups.dp_groups`), all on the GPU's one ``dp``
        stream, in issue order. So the stream is busy at least ``m`` times the sum over
        the rank's stages and kinds, and a step (or, with overlapping steps, a period) is
        at least that long. Each collective is timed on the first group alone (a lower
        bound, see :meth:`_collective_s`); experts' collectives are left out.
        """
        if kind == KINDS[2] and not split:
            return 0.0
        key = ("z3", *_op_shape(costs), costs.dp, costs.stage_layers, stage, kind, split)
        comms = self._markers.get(key)
        if comms is None:
            segs = costs.op_segments(Op(stage, kind, 0), split, markers=True)
            comms = self._markers[key] = tuple(
                ("all_gather" if isinstance(seg, ParamGather) else "reduce_scatter", seg.nbytes)
                for seg in segs if isinstance(seg, ParamGather | GradReady) and seg.nbytes > 0)
        total = 0.0
        for op, nbytes in comms:
            key = ("z3 dp", layout.tp, layout.cp, layout.dp, layout.pp, r, op, nbytes,
                   layout.placement)
            t = self._comm.get(key)
            if t is None:
                groups = dp_groups(self._placement(layout), r)
                t = self._comm[key] = self.timer(op, groups[:1], nbytes)
            total += t
        return total

    # --------------------------------------------------------------- screening by family
    @property
    def families(self) -> bool:
        """Whether :meth:`screen_terms` applies: a uniform cluster and a layer split that
        depends only on the stage count (not ``balanced``, which depends on each layout's
        cost model)."""
        return screens_by_family(self.ctx)

    def screen_terms(self, layout: Layout) -> tuple[float, float | None]:
        """(:meth:`quick_memory_bound_gib`, :meth:`loose_step_bound_s` or None where the
        memory bound does not fit), composed from terms shared by families of layouts.

        The work of a layout (:meth:`_act_term`: its activations; :meth:`_work_terms`: its
        ops' compute and TP collectives, the forward chain) depends on everything but the
        ZeRO stage, and is needed only where the memory bound fits; its
        model state (:meth:`_state_terms`: static bytes, optimizer step, ZeRO's parameter
        all-gather, ZeRO-3's DP stream) on neither the micro-batch size, sequence
        parallelism nor recomputation. Each is computed once per family, with the
        reference methods, and combined here in the reference's order of operations,
        so the bounds are the same floats without building a cost model per layout.
        """
        pp, dp = layout.pp, layout.dp
        work_key = _work_key(layout)
        state_key = family_of(layout)
        state = self._state.get(state_key)
        if state is None:
            state = self._state[state_key] = self._state_terms(layout)
        static, state_ranks = state
        act = self._act.get(work_key)
        if act is None:
            act = self._act[work_key] = self._act_term(layout)
        quick = self._gib(static / pp, act, min(self.reserved_bytes(layout)))
        if not self._fits(quick):  # memory first: the step's terms are not needed
            return quick, None
        work = self._work.get(work_key)
        if work is None:
            work = self._work[work_key] = self._work_terms(layout)
        flat, overlapping, work_ranks = work
        m = self.ctx.global_batch_size // (layout.micro_batch_size * dp)
        if flat is not None:
            return quick, m * flat / pp
        bound = 0.0
        for (busy, chain), (opt, ag, z3) in zip(work_ranks, state_ranks, strict=True):
            end = m * busy + opt
            if z3 is not None:
                bound = max(bound, m * z3)
            if overlapping:
                bound = max(bound, end)
                continue
            end += chain
            if ag is not None:
                end += ag
            bound = max(bound, end)
        return quick, bound

    def state_terms(self, layout: Layout) -> StateTerms | None:
        """The model-state terms of ``layout``'s family (:func:`state_family`), as
        :meth:`screen_terms` uses them, or None where its cost model cannot be built
        (screening then finds the layout ``invalid``)."""
        key = family_of(layout)
        state = self._state.get(key)
        if state is None:
            try:
                state = self._state[key] = self._state_terms(layout)
            except ConfigError:
                return None
        return state

    def adopt_state_terms(self, terms: Iterable[tuple[tuple[Any, ...], StateTerms]]) -> None:
        """Take families' state terms computed elsewhere (:meth:`state_terms` of another
        worker: a pure function of the family, so the same floats)."""
        self._state.update(terms)

    def _act_term(self, layout: Layout) -> float:
        """The lightest stage's activations per micro-batch, as
        :meth:`quick_memory_bound_gib` computes them."""
        costs = self.ctx.costs_for(layout, layout.pp * layout.vpp)
        key = ("act", *_op_shape(costs), costs.stage_layers)
        act = self._static.get(key)
        if act is None:
            act = self._static[key] = min(costs.activation_bytes_per_mb(s)
                                          for s in range(len(costs.stage_layers)))
        return act

    def _rank_busy(self, costs: TransformerCosts, layout: Layout, split: bool,
                   stage_rank: Sequence[int], per_mb: Sequence[float], timed: Container[int],
                   r: int) -> tuple[tuple[int, ...], float]:
        """(Pipeline rank ``r``'s stages, its busy time per micro-batch: its stages' ops
        and, where timed, their TP collectives on one replica's group), the one sum
        :meth:`loose_step_bound_s` and :meth:`_work_terms` both take."""
        mine = tuple(s for s, owner in enumerate(stage_rank) if owner == r)
        busy = sum(per_mb[s] for s in mine)
        if r in timed and layout.tp > 1:
            kinds = KINDS if split else KINDS[:2]
            busy += sum(self._tp_comm_s(costs, s, k, split, layout, r, one=True)
                        for s in mine for k in kinds)
        return mine, busy

    def _work_terms(self, layout: Layout) -> tuple[float | None, bool,
                                                   tuple[tuple[float, float], ...]]:
        """(The sum of one micro-batch over all stages where the schedule's stage owners
        are unknown (else None), whether steps overlap, per screened rank (busy time of
        one micro-batch, forward chain before its first stage)), as
        :meth:`loose_step_bound_s` computes them."""
        costs = self.ctx.costs_for(layout, layout.pp * layout.vpp)
        split = layout.schedule in self._split_schedules()
        stage_rank = self._stage_rank(layout.schedule, layout.pp, layout.vpp)
        forward_chain, per_mb = self._stage_times(costs, split)
        if stage_rank is None:
            return sum(per_mb), False, ()
        timed = self._comm_ranks(layout)
        ranks = []
        for r in sorted({0, layout.pp - 1}):
            mine, busy = self._rank_busy(costs, layout, split, stage_rank, per_mb, timed, r)
            ranks.append((busy, forward_chain[mine[0]]))
        return None, overlaps_steps(layout.schedule), tuple(ranks)

    def _state_terms(self, layout: Layout) -> StateTerms:
        """(Static bytes of all stages, per screened rank (optimizer step, ZeRO's parameter
        all-gather or None, ZeRO-3's DP stream per micro-batch or None)), as
        :meth:`quick_memory_bound_gib` and :meth:`loose_step_bound_s` compute them."""
        costs = self.ctx.costs_for(layout, layout.pp * layout.vpp)
        stages = tuple(range(len(costs.stage_layers)))
        key = ("static", *_state_shape(costs))
        static = self._static.get(key)
        if static is None:
            static = self._static[key] = costs.static_bytes(stages)
        stage_rank = self._stage_rank(layout.schedule, layout.pp, layout.vpp)
        if stage_rank is None or not self._fits(self._gib(static / layout.pp, 0.0)):
            # the second: the model state alone does not fit, so no layout of the family
            # passes the quick memory bound (activations only add to it) and its step
            # terms (optimizer, DP collectives) are never read
            return static, ()
        split = layout.schedule in self._split_schedules()
        types = self.rank_types(layout)
        timed = self._comm_ranks(layout)
        ranks = []
        for r in sorted({0, layout.pp - 1}):
            mine = tuple(s for s, owner in enumerate(stage_rank) if owner == r)
            opt = self._optimizer_s(costs, mine, types[r])
            ag = None
            if r in timed and layout.zero_stage >= 1 and self._dp_timed(layout):
                ag = self._collective_s("dp", layout, r, "all_gather",
                                        sum(costs.grad_bytes(s) for s in mine))
            z3 = None
            if r in timed and self._zero3_timed(layout, costs):
                z3 = sum(self._zero3_stream_s(costs, s, k, split, layout, r)
                         for s in mine for k in KINDS)
            ranks.append((opt, ag, z3))
        return static, tuple(ranks)

    def _stage_times(self, costs: TransformerCosts, split: bool,
                     stage_types: tuple[tuple[int, ...], ...] | None = None
                     ) -> tuple[list[float], list[float]]:
        """(compute of the forwards before each stage, compute of one micro-batch per stage),
        each stage on the fastest of its ``stage_types`` (None: the uniform cluster's GPU)."""
        key = (*_work_shape(costs), costs.stage_layers, split, stage_types)
        hit = self._loose.get(key)
        if hit is None:
            kinds = KINDS if split else KINDS[:2]
            n = len(costs.stage_layers)
            of = stage_types or ((0,),) * n
            per_mb: list[float] = []
            chain = [0.0]
            alike: dict[tuple[Any, ...], tuple[float, float]] = {}
            for s in range(n):  # stages alike in what _op_time's key holds: timed once
                like = (*_op_stage_key(costs, s), of[s])
                times = alike.get(like)
                if times is None:
                    times = alike[like] = (
                        sum(self._op_time(costs, s, k, split, of[s])[0] for k in kinds),
                        self._op_time(costs, s, FORWARD, split, of[s])[0])
                per_mb.append(times[0])
                chain.append(chain[-1] + times[1])
            hit = self._loose[key] = (chain, per_mb)
        return hit

    def _split_schedules(self) -> frozenset[str]:
        """Schedules that split the backward into B and W (their W is timed apart)."""
        if self._split is None:
            split = set()
            for name, vpps in self.ctx.schedule_vpps.items():
                try:
                    if build_plan(name, 2, 4, (vpps or (2,))[0], 0.5, 1).split_backward:
                        split.add(name)
                except (ScheduleError, ValueError):
                    continue
            self._split = frozenset(split)
        return self._split
