"""Lowering: schedule + cost model + placement -> per-rank :class:`~workloads.program.Program`.

A chain of pure passes over the schedule's ops, taken in a topological order
(the order of a unit-duration symbolic run, so every producer is lowered before
its consumers):

1. each pipeline op becomes its cost model's segments (compute kernels and TP
   collectives) on every GPU of its TP group;
2. a pipeline send follows each op whose consumer stage lives on another rank
   (activations forward, gradients backward); the consumer depends on it;
3. after the last backward of each stage, the DP gradient collective
   (all-reduce, or reduce-scatter under ZeRO >= 1);
4. the optimizer step, then (ZeRO >= 1) the all-gather of updated parameters.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, Segment
from workloads.program import Program, ProgramBuilder
from workloads.schedules import (
    BACKWARD,
    FORWARD,
    WEIGHT_GRAD,
    Op,
    Schedule,
    schedule_deps,
    unit_times,
)


class CostModel(Protocol):
    """What lowering needs to know about a workload (see :mod:`workloads.costs`)."""

    w_retained_fraction: float

    def op_segments(self, op: Op, split_backward: bool) -> tuple[Segment, ...]: ...
    def activation_bytes_per_mb(self, stage: int) -> float: ...
    def p2p_bytes(self) -> float: ...
    def grad_bytes(self, stage: int) -> float: ...
    def static_bytes(self, stages: tuple[int, ...]) -> float: ...
    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None: ...


def topological_ops(schedule: Schedule) -> list[Op]:
    """All ops in an order where every op comes after its producers and its rank predecessors."""
    times = unit_times(schedule)
    rank_of = schedule.stage_rank
    return sorted(times, key=lambda op: (times[op][1], rank_of[op.stage], times[op][0]))


def _consumer_stage(op: Op, num_stages: int) -> int | None:
    if op.kind == FORWARD and op.stage + 1 < num_stages:
        return op.stage + 1
    if op.kind == BACKWARD and op.stage > 0:
        return op.stage - 1
    return None


@dataclass(frozen=True)
class Collapse:
    """Timers for a collapsed lowering: one representative GPU per pipeline rank.

    In a symmetric layout every TP and DP replica runs the same program, so only
    the GPU of TP rank 0, DP rank 0 of each pipeline rank is simulated. The TP
    collectives between an op's compute segments are folded into one compute
    op as blocking communication; its leading and closing collectives, its DP
    collectives and its pipeline sends stay instructions with precomputed
    durations (:func:`_fold`). All are timed on the real topology by
    ``collective_s`` together with the concurrent copies of the replicas they
    stand for (DESIGN.md, "Large clusters"), so where those copies are all the
    traffic there is, the collapsed step equals the full one
    (``tests/test_collapse.py``).
    """

    compute_s: Callable[[ComputeSeg], float]
    """Duration of a compute segment on the representative GPU."""
    collective_s: Callable[[str, tuple[tuple[int, ...], ...], float], float]
    """``collective_s(op, groups, nbytes)``: time of ``op`` run at once on every group."""


def lower(
    schedule: Schedule,
    costs: CostModel,
    placement: Placement,
    zero_stage: int = 0,
    collapse: Collapse | None = None,
) -> Program:
    """Lower one training step to per-GPU instructions. Pure and deterministic.

    With ``collapse``, only one representative GPU per pipeline rank gets a
    program (see :class:`Collapse`).
    """
    enabled = gc.isenabled()
    gc.disable()  # many long-lived objects, few cycles: the collector's scans would dominate
    try:
        return _lower(schedule, costs, placement, zero_stage, collapse)
    finally:
        if enabled:
            gc.enable()


def _lower(schedule: Schedule, costs: CostModel, placement: Placement, zero_stage: int,
           collapse: Collapse | None) -> Program:
    """:func:`lower`, with the garbage collector paused by the caller."""
    pp, tp, dp = placement.degree("pp"), placement.degree("tp"), placement.degree("dp")
    if schedule.num_ranks != pp:
        raise ValueError(f"schedule has {schedule.num_ranks} ranks but the layout has pp={pp}")
    if collapse is not None:
        tp_lanes, dp_lanes = 1, 1
    else:
        tp_lanes, dp_lanes = tp, dp
    b = ProgramBuilder()
    S, split = schedule.num_stages, schedule.split_backward
    owner = schedule.stage_rank
    final_op: dict[int, Op] = {}
    for ops in schedule.rank_ops:
        for op in ops:
            if op.kind == (WEIGHT_GRAD if split else BACKWARD):
                final_op[op.stage] = op
    order = topological_ops(schedule)
    index = {op: k for k, op in enumerate(order)}
    # lanes[r][d]: the GPUs of TP lanes 0..tp_lanes-1 of pipeline rank r, DP lane d
    lanes = [[[placement.gpu(tp=t, dp=d, pp=r) for t in range(tp_lanes)]
              for d in range(dp_lanes)] for r in range(pp)]
    # last[(k, g)] / sent[(k, g)]: the instruction on GPU g that completes op order[k] /
    # delivers its output to g (keys are op positions in ``order``: cheap to hash)
    last: dict[tuple[int, int], int] = {}
    sent: dict[tuple[int, int], int] = {}
    # an op's work and memory do not depend on its micro-batch index: cached per
    # (stage, kind, sequence chunk)
    op_cache: dict[Op, tuple[tuple[Segment, ...], int, float, float]] = {}
    transient = getattr(costs, "transient_bytes", None)
    fold_cache: dict[Op, _Folded] = {}
    pending = [0.0] * pp  # per rank, see _emit_folded
    send_cache: dict[tuple[int, int], float] = {}
    p2p = costs.p2p_bytes()
    groups_of = schedule.groups
    for k, op in enumerate(order):
        r = owner[op.stage]
        generic = Op(op.stage, op.kind, 0, op.seq)
        cached = op_cache.get(generic)
        if cached is None:
            segs = costs.op_segments(generic, split)
            act = _stash_bytes(costs, generic)
            alloc = act if op.kind == FORWARD else 0.0
            if op.kind == BACKWARD:
                free = act * (1 - costs.w_retained_fraction) if split else act
            elif op.kind == WEIGHT_GRAD:
                free = act * costs.w_retained_fraction
            else:
                free = 0.0
            # working memory held only while the op runs (recomputation, gradient buffers)
            if transient is not None:
                extra = transient(generic)
                alloc, free = alloc + extra, free + extra
            cached = op_cache[generic] = (segs, sum(isinstance(x, ComputeSeg) for x in segs),
                                          alloc, free)
        segs, n_compute, alloc, free = cached
        local = [(index[dep], owner[dep.stage] == r) for dep in schedule_deps(schedule, op)]
        op_name = str(op)
        group = groups_of[op]  # a fused group (DualPipe F&B) sends at its end
        sends = []
        for member in group if op == group[-1] else ():
            consumer = _consumer_stage(member, S)
            if consumer is None or owner[consumer] == r:
                continue
            fixed = None
            if collapse is not None:  # every replica's message crosses at once
                link = (r, owner[consumer])
                if link not in send_cache:
                    pairs = tuple((placement.gpu(tp=u, dp=e, pp=r),
                                   placement.gpu(tp=u, dp=e, pp=owner[consumer]))
                                  for e in range(dp) for u in range(tp))
                    send_cache[link] = collapse.collective_s("send", pairs, p2p)
                fixed = send_cache[link]
            what = "act" if member.kind == FORWARD else "grad"
            sends.append((index[member], member, owner[consumer], f"{member} {what}", fixed))
        if collapse is not None:
            (g,) = lanes[r][0]
            folded = fold_cache.get(generic)
            if folded is None:
                groups = tuple(placement.group("tp", placement.gpu(pp=r, dp=e))
                               for e in range(dp))
                folded = fold_cache[generic] = _fold(segs, collapse, groups)
            deps = tuple([last[(j, g)] if same else sent[(j, g)] for j, same in local])
            last[(k, g)] = _emit_folded(b, g, op, op_name, folded, deps, alloc, free,
                                        pending[r])
            if folded.trailing:
                pending[r] = folded.trailing_s
            elif folded.has_comm:
                pending[r] = 0.0
            else:  # pure compute: an earlier closing collective runs on meanwhile
                pending[r] = max(0.0, pending[r] - folded.whole.compute_s)
            for j, member, cr, name, fixed in sends:
                dst = lanes[cr][0][0]
                sent[(j, dst)] = b.send(g, dst, p2p, "pp", name, (last[(k, g)],),
                                        stage=member.stage, mb=member.mb, duration_s=fixed)
            continue
        comm_names = {i: f"{op_name} {seg.label}" for i, seg in enumerate(segs)
                      if isinstance(seg, CommSeg)}
        for d in range(dp_lanes):
            gpus = lanes[r][d]
            prev = {g: tuple([last[(j, g)] if same else sent[(j, g)] for j, same in local])
                    for g in gpus}
            seen_compute = 0
            for i, seg in enumerate(segs):
                if isinstance(seg, CommSeg):
                    ids = b.collective(tuple(gpus), prev, kind=seg.kind, name=comm_names[i],
                                       op=seg.op, nbytes=seg.nbytes, stage=op.stage, mb=op.mb)
                else:
                    seen_compute += 1
                    a_bytes = alloc if seen_compute == 1 else 0.0
                    f_bytes = free if seen_compute == n_compute else 0.0
                    label = op_name if seen_compute == 1 else seg.label
                    ids = {g: b.compute(g, op.kind, label, prev[g], flops=seg.flops,
                                        hbm_bytes=seg.hbm_bytes, duration_s=seg.duration_s,
                                        attn_flops=seg.attn_flops, gemm_dims=seg.gemm_dims,
                                        elementwise_bytes=seg.elementwise_bytes,
                                        stage=op.stage, mb=op.mb, alloc_bytes=a_bytes,
                                        free_bytes=f_bytes) for g in gpus}
                prev = {g: (ids[g],) for g in gpus}
            if segs:
                for g in gpus:
                    last[(k, g)] = prev[g][0]
            for j, member, cr, name, fixed in sends:
                dst_lane = lanes[cr][d]
                for t, g in enumerate(gpus):
                    dst = dst_lane[t]
                    sent[(j, dst)] = b.send(g, dst, p2p, "pp", name, (last[(k, g)],),
                                            stage=member.stage, mb=member.mb, duration_s=fixed)

    _lower_step_end(b, schedule, costs, placement, zero_stage, last, final_op, index, collapse)
    coords = [placement.coords(g) for g in range(placement.num_gpus)]
    gpu_names = tuple(f"gpu{g} pp{c['pp']} dp{c['dp']} tp{c['tp']}" for g, c in enumerate(coords))
    static_of_rank = [costs.static_bytes(_stages_of(schedule, r)) for r in range(pp)]
    static = tuple(static_of_rank[c["pp"]] for c in coords)
    simulated = None if collapse is None else tuple(placement.gpu(pp=r) for r in range(pp))
    return Program(placement.num_gpus, b.build(), static, schedule, gpu_names, simulated)


@dataclass(frozen=True)
class _CommRun:
    """Consecutive collectives of one kind, emitted as one instruction (collapsed lowering)."""

    kind: str
    op: str
    label: str
    nbytes: float
    duration_s: float


@dataclass(frozen=True)
class _Block:
    """Compute segments and the collectives between them, as one compute op."""

    compute_s: float
    comm_s: float
    """Blocking communication: the collectives between the compute segments."""
    comm_kind: str
    flops: float
    attn_flops: float


@dataclass(frozen=True)
class _Folded:
    """An op's segments as a collapsed lowering emits them (see :func:`_fold`)."""

    leading: tuple[_CommRun, ...]
    """Collectives before the first compute segment."""
    whole: _Block
    """From the first compute segment to the last."""
    head: _Block | None
    """Split form of ``whole`` (None without collectives inside): the compute before the
    first collective, ..."""
    first_comm: tuple[_CommRun, ...]
    """... that collective (with any directly following it), ..."""
    rest: _Block | None
    """... and the rest, from the next compute segment on."""
    trailing: tuple[_CommRun, ...]
    """Collectives after the last compute segment."""
    trailing_s: float = 0.0
    """Their total time."""
    has_comm: bool = False
    """Whether the op has any collective."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trailing_s", sum(run.duration_s for run in self.trailing))
        object.__setattr__(self, "has_comm",
                           bool(self.leading or self.trailing or self.head is not None))


def _comm_runs(segs: Sequence[Segment], collapse: Collapse,
               groups: tuple[tuple[int, ...], ...]) -> tuple[_CommRun, ...]:
    runs: list[_CommRun] = []
    for seg in segs:
        assert isinstance(seg, CommSeg)
        t = collapse.collective_s(seg.op, groups, seg.nbytes)
        if runs and runs[-1].kind == seg.kind:
            prev = runs[-1]
            runs[-1] = _CommRun(prev.kind, prev.op, f"{prev.label} + {seg.label}",
                                prev.nbytes + seg.nbytes, prev.duration_s + t)
        else:
            runs.append(_CommRun(seg.kind, seg.op, seg.label, seg.nbytes, t))
    return tuple(runs)


def _block(segs: Sequence[Segment], collapse: Collapse,
           groups: tuple[tuple[int, ...], ...]) -> _Block:
    work = [seg for seg in segs if isinstance(seg, ComputeSeg)]
    comm = [seg for seg in segs if isinstance(seg, CommSeg)]
    kinds = sorted({seg.kind for seg in comm})
    return _Block(sum(collapse.compute_s(seg) for seg in work),
                  sum(collapse.collective_s(seg.op, groups, seg.nbytes) for seg in comm),
                  kinds[0] if len(kinds) == 1 else "tp",
                  sum(seg.flops for seg in work), sum(seg.attn_flops for seg in work))


def _fold(segs: tuple[Segment, ...], collapse: Collapse,
          groups: tuple[tuple[int, ...], ...]) -> _Folded:
    """Fold an op's segments for the representative GPU of a collapsed lowering.

    The compute segments, with the TP collectives between them, become one
    compute op whose collectives are blocking communication: in the full
    lowering each of those collectives waits for the compute before it and
    the next compute waits for it. Collectives before the first compute
    segment (sequence parallelism's all-gather) and after the last (the
    closing all-reduce or reduce-scatter) stay separate instructions on their
    stream, as in the full lowering, where the next op's compute does not wait
    for this op's closing collective (only the op's consumers do). Every
    collective is timed with all ``groups`` (the TP groups of every DP
    replica of the pipeline rank) running it at once.
    """
    compute_at = [i for i, seg in enumerate(segs) if isinstance(seg, ComputeSeg)]
    if not compute_at:  # no compute: one blocking fold
        return _Folded((), _block(segs, collapse, groups), None, (), None, ())
    first, end = compute_at[0], compute_at[-1] + 1
    middle = segs[first:end]
    comm_at = [i for i, seg in enumerate(middle) if isinstance(seg, CommSeg)]
    head = first_comm = rest = None
    if comm_at:
        i = comm_at[0]
        j = next(k for k in range(i, len(middle)) if isinstance(middle[k], ComputeSeg))
        head = _block(middle[:i], collapse, groups)
        first_comm = _comm_runs(middle[i:j], collapse, groups)
        rest = _block(middle[j:], collapse, groups)
    return _Folded(_comm_runs(segs[:first], collapse, groups), _block(middle, collapse, groups),
                   head, first_comm or (), rest, _comm_runs(segs[end:], collapse, groups))


def _emit_runs(b: ProgramBuilder, g: int, op: Op, op_name: str, runs: tuple[_CommRun, ...],
               deps: tuple[int, ...]) -> tuple[int, ...]:
    """Emit collective runs one after the other on GPU ``g``; the last one's id (or ``deps``)."""
    for run in runs:
        deps = (b.collective((g,), {g: deps}, kind=run.kind, name=f"{op_name} {run.label}",
                             op=run.op, nbytes=run.nbytes, stage=op.stage, mb=op.mb,
                             duration_s=run.duration_s)[g],)
    return deps


def _emit_block(b: ProgramBuilder, g: int, op: Op, op_name: str, block: _Block,
                deps: tuple[int, ...], alloc: float, free: float) -> int:
    return b.compute(g, op.kind, op_name, deps, stage=op.stage, mb=op.mb,
                     duration_s=block.compute_s, flops=block.flops, attn_flops=block.attn_flops,
                     blocking_comm_s=block.comm_s, blocking_comm_kind=block.comm_kind,
                     alloc_bytes=alloc, free_bytes=free)


def _emit_folded(b: ProgramBuilder, g: int, op: Op, op_name: str, folded: _Folded,
                 deps: tuple[int, ...], alloc: float, free: float, pending_s: float) -> int:
    """Emit a folded op on GPU ``g``; returns the id of its last instruction.

    ``pending_s`` bounds how long after this op's compute starts an earlier
    op's closing collective may still occupy the collective stream. In the
    full lowering the op's first inner collective queues behind it on that
    stream; when it may (``pending_s`` exceeds the compute before that
    collective), the op is emitted split (compute, collective, rest) so the
    collapsed program waits the same way. Otherwise one compute op suffices.
    """
    if folded.leading:
        deps = _emit_runs(b, g, op, op_name, folded.leading, deps)
    head, rest = folded.head, folded.rest
    if (head is not None and rest is not None and not folded.leading
            and pending_s > head.compute_s):
        first = _emit_block(b, g, op, op_name, head, deps, alloc, 0.0)
        deps = _emit_runs(b, g, op, op_name, folded.first_comm, (first,))
        last = _emit_block(b, g, op, op_name, rest, deps, 0.0, free)
    else:
        last = _emit_block(b, g, op, op_name, folded.whole, deps, alloc, free)
    if folded.trailing:
        return _emit_runs(b, g, op, op_name, folded.trailing, (last,))[0]
    return last


def _stash_bytes(costs: CostModel, op: Op) -> float:
    """Activation bytes ``op``'s forward stashes and its backward (and W) frees.

    A Seq1F1B sequence chunk (``op.seq >= 0``) stashes its share of the
    micro-batch's activations, given by the cost model's ``seq_chunk_share``
    (only the synthetic model has sequence chunks for now).
    """
    whole = costs.activation_bytes_per_mb(op.stage)
    if op.seq < 0:
        return whole
    share = getattr(costs, "seq_chunk_share", None)
    if share is None:
        raise ValueError(f"op {op} is a sequence chunk but {type(costs).__name__} has none")
    return whole * share(op)


def _stages_of(schedule: Schedule, rank: int) -> tuple[int, ...]:
    return tuple(s for s, r in enumerate(schedule.stage_rank) if r == rank)


def _lower_step_end(
    b: ProgramBuilder,
    schedule: Schedule,
    costs: CostModel,
    placement: Placement,
    zero_stage: int,
    last: Mapping[tuple[int, int], int],
    final_op: Mapping[int, Op],
    index: Mapping[Op, int],
    collapse: Collapse | None,
) -> None:
    """DP gradient collectives per stage (in the order stages finish), optimizer, ZeRO gather.

    ``last[(index[op], g)]`` is the instruction that completes ``op`` on GPU ``g``.
    """
    pp, tp, dp = placement.degree("pp"), placement.degree("tp"), placement.degree("dp")
    stages = sorted(final_op, key=lambda s: index[final_op[s]])
    waits: dict[int, list[int]] = {g: [] for g in range(placement.num_gpus)}
    grad_op = "reduce_scatter" if zero_stage >= 1 else "all_reduce"
    lanes = 1 if collapse is not None else tp

    def dp_collective(r: int, t: int, deps: dict[int, tuple[int, ...]], name: str, op: str,
                      nbytes: float, stage: int = -1) -> dict[int, int]:
        group = tuple(placement.gpu(tp=t, dp=d, pp=r) for d in range(dp))
        if collapse is None:
            return b.collective(group, deps, kind="dp", name=name, op=op, nbytes=nbytes,
                                stage=stage)
        groups = tuple(tuple(placement.gpu(tp=u, dp=d, pp=r) for d in range(dp))
                       for u in range(tp))
        rep = group[0]
        return b.collective((rep,), deps, kind="dp", name=name, op=op, nbytes=nbytes,
                            stage=stage, duration_s=collapse.collective_s(op, groups, nbytes))

    def lane_gpus(r: int, t: int) -> tuple[int, ...]:
        if collapse is not None:
            return (placement.gpu(pp=r),)
        return tuple(placement.gpu(tp=t, dp=d, pp=r) for d in range(dp))

    for s in stages:
        r = schedule.stage_rank[s]
        for t in range(lanes):
            deps = {g: (last[(index[final_op[s]], g)],) for g in lane_gpus(r, t)}
            nbytes = costs.grad_bytes(s)
            if dp > 1 and nbytes > 0:
                ids = dp_collective(r, t, deps, f"stage{s} grad {grad_op}", grad_op, nbytes, s)
                for g, i in ids.items():
                    waits[g].append(i)
            else:
                for g, d in deps.items():
                    waits[g].extend(d)
    for r in range(pp):
        mine = _stages_of(schedule, r)
        seg = costs.optimizer_segment(mine)
        if seg is None:
            continue
        for t in range(lanes):
            fixed = None if collapse is None else collapse.compute_s(seg)
            opt = {g: b.compute(g, "opt", "optimizer", tuple(waits[g]), flops=seg.flops,
                                hbm_bytes=seg.hbm_bytes, elementwise_bytes=seg.elementwise_bytes,
                                duration_s=fixed)
                   for g in lane_gpus(r, t)}
            if zero_stage >= 1 and dp > 1:
                nbytes = sum(costs.grad_bytes(s) for s in mine)
                dp_collective(r, t, {g: (i,) for g, i in opt.items()}, "param all_gather",
                              "all_gather", nbytes)
