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
4. the optimizer step, then (ZeRO 1/2) the all-gather of updated parameters.

Ops that are more than a chain of compute and TP collectives go through
:class:`_PieceLowering`, which cuts them at their markers: ZeRO-3's per-layer
parameter gathers (prefetched one layer ahead) and gradient reduce-scatters,
the gradient buckets of ``overlap_grad_reduce`` (then no step-end collective),
context parallelism's ring attention and MoE all-to-alls over EP groups. The
DP group is the DP x CP group; expert gradients are reduced over the replicas
holding the same experts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from operator import itemgetter
from typing import Protocol

import numpy as np

from base.collector import gc_paused
from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, GradReady, ParamGather, RingAttention, Segment
from workloads.memory import op_alloc_free
from workloads.program import (
    COLLECTIVE,
    COMPUTE,
    SEND,
    Collective,
    ColumnarInstructions,
    Columns,
    Compute,
    Instruction,
    Program,
    ProgramBuilder,
    Send,
    columns_of,
)
from workloads.schedules import (
    BACKWARD,
    FORWARD,
    WEIGHT_GRAD,
    WHOLE,
    Op,
    Schedule,
    op_deps,
    producer_positions,
    producers_at,
    schedule_deps,
    unit_order,
    unit_times,
)


class CostModel(Protocol):
    """What lowering needs to know about a workload (see :mod:`workloads.costs`)."""

    w_retained_fraction: float

    def op_segments(self, op: Op, split_backward: bool,
                    markers: bool = False) -> tuple[Segment, ...]: ...
    def activation_bytes_per_mb(self, stage: int) -> float: ...
    def p2p_bytes(self) -> float: ...
    def grad_bytes(self, stage: int) -> float: ...
    def static_bytes(self, stages: tuple[int, ...]) -> float: ...
    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None: ...


def topological_ops(schedule: Schedule) -> list[Op]:
    """All ops in an order where every op comes after its producers and its rank predecessors."""
    return _topological(schedule)[0]


_KINDS = {FORWARD: 0, BACKWARD: 1, WEIGHT_GRAD: 2}
"""Op kinds as :func:`_topological` codes them."""


def _topological(schedule: Schedule, fields: bool = False
                 ) -> tuple[list[Op], tuple[np.ndarray | None, ...] | None]:
    """:func:`topological_ops`; with ``fields``, also the ops' stages, kind codes
    (:data:`_KINDS`), sequence fields and rank-order positions (:func:`unit_order`; None
    where it has none) in that order, as arrays."""
    times = unit_times(schedule)
    ops = list(times)
    n = len(ops)
    if not n:
        return ops, (*(np.zeros(0, np.int64),) * 3, None) if fields else None
    # sorted by (end, rank, start), ties in the symbolic run's order: a stable sort on keys
    # read into arrays (the ranks through the stages) instead of a key tuple per op
    spans = np.fromiter(chain.from_iterable(times.values()), float, 2 * n)
    coded = unit_order(schedule) if fields else None
    at = kinds = None
    if coded is not None:  # worked out by the symbolic run (the same codes as _kind_codes)
        at, stage, kinds, seq = coded
    elif fields:
        ints = np.fromiter(chain.from_iterable(map(itemgetter(0, 3), ops)), np.int64, 2 * n)
        stage, seq = ints[0::2], ints[1::2]
    else:
        stage = np.fromiter(map(itemgetter(0), ops), np.int64, n)
    ranks = np.asarray(schedule.stage_rank, dtype=np.int64)[stage]
    perm = np.lexsort((spans[0::2], ranks, spans[1::2]))
    order = list(map(ops.__getitem__, perm.tolist()))
    if not fields:
        return order, None
    if kinds is None:
        kinds = _kind_codes(ops)
    return order, (stage[perm], kinds[perm], seq[perm], None if at is None else at[perm])


def _kind_codes(ops: Sequence[Op]) -> np.ndarray:
    """The ops' kinds as :data:`_KINDS` codes (-1 for another kind)."""
    letters = "".join(map(itemgetter(1), ops))
    if len(letters) == len(ops) and letters.isascii():  # one character each: as bytes
        table = np.full(256, -1, dtype=np.int64)
        for name, code in _KINDS.items():
            table[ord(name)] = code
        return table[np.frombuffer(letters.encode(), dtype=np.uint8)]
    return np.fromiter((_KINDS.get(op.kind, -1) for op in ops), np.int64, len(ops))


def _positions(order: Sequence[Op], stage: np.ndarray, kind: np.ndarray,
               ops: Sequence[Op]) -> dict[Op, int]:
    """The position in ``order`` of each of ``ops``, the last op of its stage and kind in
    ``order`` (a final op: the last backward or W of its stage in its rank's order, which
    ``order`` keeps); looked up op by op where one is not."""
    key = stage * 3 + kind
    last = np.full(int(key.max(initial=0)) + 1, -1, dtype=np.int64)
    np.maximum.at(last, key, np.arange(len(order)))
    out = {}
    for op in ops:
        code = op.stage * 3 + _KINDS.get(op.kind, -1)
        k = int(last[code]) if 0 <= code < len(last) else -1
        if k < 0 or order[k] != op:
            wanted = set(ops)
            return {op: k for k, op in enumerate(order) if op in wanted}
        out[op] = k
    return out


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
    compute_s_of: Callable[[int], Callable[[ComputeSeg], float]] | None = None
    """Mixed GPU types: ``compute_s_of(gpu)`` times segments on that GPU (every GPU of a
    pipeline rank is of one type); None: ``compute_s`` holds for every GPU."""

    def on(self, gpu: int) -> Collapse:
        """This collapse with compute timed on representative ``gpu``'s own GPU type."""
        if self.compute_s_of is None:
            return self
        return replace(self, compute_s=self.compute_s_of(gpu), compute_s_of=None)


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
    # many long-lived objects, few cycles: the collector's scans would dominate; after, the
    # program's objects move to the oldest generation at once, else the first young
    # collection scans every one of them (a quarter second at 400k)
    with gc_paused():
        return _lower(schedule, costs, placement, zero_stage, collapse)


def _lower(schedule: Schedule, costs: CostModel, placement: Placement, zero_stage: int,
           collapse: Collapse | None, fast: bool = True) -> Program:
    """:func:`lower`, with the garbage collector paused by the caller.

    ``fast``: a collapsed lowering without piecewise ops or fused groups takes
    :func:`_lower_collapsed` (the same program, built faster); False forces the
    general loop (``tests/test_perf_paths.py`` compares the two).
    """
    pp, tp = placement.degree("pp"), placement.degree("tp")
    if schedule.num_ranks != pp:
        raise ValueError(f"schedule has {schedule.num_ranks} ranks but the layout has pp={pp}")
    replicas = replica_coords(placement)
    if collapse is not None:
        tp_lanes, lane_replicas = 1, replicas[:1]
    else:
        tp_lanes, lane_replicas = tp, replicas
    b = ProgramBuilder()
    S, split = schedule.num_stages, schedule.split_backward
    owner = schedule.stage_rank
    final_op: dict[int, Op] = {}
    for ops in schedule.rank_ops:
        for op in ops:
            if op.kind == (WEIGHT_GRAD if split else BACKWARD):
                final_op[op.stage] = op
    # lanes[r][e]: the GPUs of TP lanes 0..tp_lanes-1 of pipeline rank r, replica e (a
    # (cp, dp) coordinate)
    lanes = [[[placement.gpu(tp=t, cp=c, dp=d, pp=r) for t in range(tp_lanes)]
              for c, d in lane_replicas] for r in range(pp)]
    # last[(k, g)] / sent[(k, g)]: the instruction on GPU g that completes op order[k] /
    # delivers its output to g (keys are op positions in ``order``: cheap to hash)
    last: dict[tuple[int, int], int] = {}
    sent: dict[tuple[int, int], int] = {}
    # an op's work and memory do not depend on its micro-batch index: cached per
    # (stage, kind, sequence chunk)
    op_cache: dict[Op, tuple[tuple[Segment, ...], int, float, float]] = {}
    fold_cache: dict[Op, _Folded] = {}
    pending = [0.0] * pp  # per rank, see _emit_folded
    send_cache: dict[tuple[int, int, float], float] = {}
    whole_p2p = costs.p2p_bytes()
    zero3 = zero_stage == 3 and len(replicas) > 1
    overlap = bool(getattr(costs, "overlap_grad_reduce", False)) and len(replicas) > 1
    cp_or_ep = getattr(costs, "cp", 1) > 1 or getattr(costs, "ep", 1) > 1
    piecewise = (_PieceLowering(b, schedule, costs, placement, zero_stage, collapse, lanes)
                 if zero3 or overlap or cp_or_ep else None)
    final_ops = set(final_op.values())
    head: _Collapsed | None = None
    arrays = fast and collapse is not None and piecewise is None and not schedule.fused
    order, fields = _topological(schedule, fields=arrays)
    if arrays and order and fields is not None and fields[1].min() >= 0:  # F, B, W only
        # positions of the final ops only (the step end's); the op loop has its own
        index = _positions(order, fields[0], fields[1], list(final_ops))
        reps = [lane[0][0] for lane in lanes]
        head = _lower_collapsed(schedule, costs, collapse, placement, order, fields, reps,
                                b.default_algo)
        last = {(index[op], reps[owner[op.stage]]): int(head.done[index[op]])
                for op in final_ops}
        b = ProgramBuilder(head.size, head.keys)  # the step end follows the op loop's part
        order = []  # lowered: the general loop below has nothing left to do
    else:
        index = {op: k for k, op in enumerate(order)}
    groups_of = schedule.groups if order else {}
    for k, op in enumerate(order):
        r = owner[op.stage]
        generic = Op(op.stage, op.kind, 0, op.seq)
        p2p = _op_p2p_bytes(costs, generic, whole_p2p)
        cached = op_cache.get(generic)
        if cached is None:
            cached = op_cache[generic] = _op_facts(costs, generic, split)
        segs, n_compute, alloc, free = cached
        local = [(index[dep], owner[dep.stage] == r) for dep in schedule_deps(schedule, op)]
        op_name = str(op)
        group = groups_of[op]  # a fused group (DualPipe F&B) sends at its end
        sends = []
        for member in group if op == group[-1] else ():
            consumer = _consumer_stage(member, S)
            if consumer is None or owner[consumer] == r:
                continue
            fixed = None if collapse is None else _replica_send_s(
                collapse, placement, send_cache, r, owner[consumer], p2p)
            what = "act" if member.kind == FORWARD else "grad"
            sends.append((index[member], member, owner[consumer], f"{member} {what}", fixed))
        if piecewise is not None and (zero3 or cp_or_ep or op in final_ops):
            gpus = [g for group in lanes[r] for g in group]
            prev = {g: tuple([last[(j, g)] if same else sent[(j, g)] for j, same in local])
                    for g in gpus}
            piecewise.emit(k, op, r, prev, alloc, free, last, pending,
                     marked=zero3 or (overlap and op in final_ops))
            _emit_sends(b, sends, lanes, r, k, last, sent, p2p)
            continue
        if collapse is not None:
            (g,) = lanes[r][0]
            folded = fold_cache.get(generic)
            if folded is None:
                groups = tp_groups(placement, r)
                folded = fold_cache[generic] = _fold(segs, collapse.on(g), groups)
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
        for d in range(len(lanes[r])):
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

    _lower_step_end(b, schedule, costs, placement, zero_stage, last, final_op, index, collapse,
                    piecewise)
    coords = [placement.coords(g) for g in range(placement.num_gpus)]
    gpu_names = tuple(f"gpu{g} pp{c['pp']} dp{c['dp']} tp{c['tp']}" for g, c in enumerate(coords))
    static_of_rank = [costs.static_bytes(_stages_of(schedule, r)) for r in range(pp)]
    static = tuple(static_of_rank[c["pp"]] for c in coords)
    simulated = None if collapse is None else tuple(placement.gpu(pp=r) for r in range(pp))
    instructions = b.build() if head is None else _joined(head, b.build())
    return Program(placement.num_gpus, instructions, static, schedule, gpu_names, simulated)


def _joined(head: _Collapsed, tail: tuple[Instruction, ...]
            ) -> ColumnarInstructions | tuple[Instruction, ...]:
    """A collapsed program's instructions: ``head``'s (the op loop's, on arrays) and
    ``tail`` (the step end's), held as columns while nothing asks for the objects."""
    rest = columns_of(tail)
    if rest is None:  # not a collapsed step end (no such lowering): the objects now
        return head.build() + tail
    return ColumnarInstructions(head.columns_with(rest), lambda: head.build() + tail)


def _op_facts(costs: CostModel, generic: Op, split: bool
              ) -> tuple[tuple[Segment, ...], int, float, float]:
    """An op's segments, how many of them compute, and the bytes it allocates at its start
    and frees at its end (:func:`workloads.memory.op_alloc_free`); the same for every
    micro-batch (``generic`` has ``mb`` 0)."""
    segs = costs.op_segments(generic, split)
    alloc, free = op_alloc_free(costs, generic, split)
    return segs, sum(isinstance(x, ComputeSeg) for x in segs), alloc, free


def _lower_collapsed(schedule: Schedule, costs: CostModel, collapse: Collapse,
                     placement: Placement, order: Sequence[Op],
                     fields: tuple[np.ndarray, ...], reps: Sequence[int], algo: str
                     ) -> _Collapsed:
    """The op loop of a collapsed lowering whose ops are each a chain of compute and TP
    collectives, unfused (no piecewise op, no fused group): the program of the general
    loop of :func:`_lower`, instruction for instruction, laid out on arrays.

    Everything but names, ids and dependencies is the same for every micro-batch of a
    (stage, kind, sequence chunk): worked out once per such triple (:class:`_Plan`:
    :func:`_op_facts`, :func:`_fold`, the pipeline send's time), it makes an op's
    instructions a template (:func:`_slots`: leading collectives, the folded compute,
    split or not as :func:`_emit_folded` decides, trailing collectives, the send), each
    instruction after an op's first depending on the one before it. Ids, the first
    instruction's dependencies (what completes or delivers each producer) and every
    field the engine reads then come out of array operations over all ops at once
    (:class:`_Collapsed`); the instruction objects are built only if asked for.
    """
    S, split = schedule.num_stages, schedule.split_backward
    owner = schedule.stage_rank
    whole_p2p = costs.p2p_bytes()
    n = len(order)
    send_cache: dict[tuple[int, int, float], float] = {}
    stage, kind, seq, at = fields  # of the ops in order (_topological)
    # one plan per (stage, kind, sequence chunk), numbered by first use
    triple = (stage * 3 + kind) * (int(seq.max(initial=0)) + 2) + (seq + 1)
    first = np.full(int(triple.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, triple, np.arange(n))
    used_at = np.sort(first[first < n])
    number = np.zeros(len(first), dtype=np.int64)
    number[triple[used_at]] = np.arange(len(used_at))
    plan_of = number[triple]
    plans: list[_Plan] = []
    groups: dict[int, Groups] = {}  # per rank, its TP groups
    for k in used_at.tolist():
        st, kd, _, sq = order[k]
        r, g = owner[st], reps[owner[st]]
        generic = Op(st, kd, 0, sq)
        segs, _, alloc, free = _op_facts(costs, generic, split)
        if r not in groups:
            groups[r] = tp_groups(placement, r)
        folded = _fold(segs, collapse.on(g), groups[r])
        consumer = _consumer_stage(generic, S)
        p2p = _op_p2p_bytes(costs, generic, whole_p2p)
        send = None
        if consumer is not None and owner[consumer] != r:
            send = (reps[owner[consumer]], " act" if kd == FORWARD else " grad",
                    _replica_send_s(collapse, placement, send_cache, r, owner[consumer], p2p),
                    p2p)
        head, rest = folded.head, folded.rest
        split_at = (head.compute_s if head is not None and rest is not None
                    and not folded.leading else None)
        plans.append(_Plan(r, g, folded, alloc, free, send, split_at))
    rank_at = np.asarray(owner, dtype=np.int64)[stage]
    split_op = _split_ops(plans, plan_of, rank_at, len(reps))
    variant = plan_of * 2 + split_op
    used = np.flatnonzero(np.bincount(variant, minlength=2 * len(plans))).tolist()
    templates = {v: _slots(plans[v // 2], bool(v % 2)) for v in used}
    sizes = np.zeros(2 * len(plans), dtype=np.int64)
    starts = np.zeros(2 * len(plans), dtype=np.int64)  # each template's first slot row
    rows: list[tuple[_Plan, tuple]] = []
    for v in used:
        sizes[v], starts[v] = len(templates[v]), len(rows)
        rows.extend((plans[v // 2], slot) for slot in templates[v])
    count = sizes[variant]
    offset = np.cumsum(count) - count  # each op's first id
    total = int(count.sum())
    has_send = np.array([p.send is not None for p in plans], dtype=bool)[plan_of]
    done = offset + count - 1 - has_send  # the instruction completing each op
    arrived = np.where(has_send, offset + count - 1, 0)  # the send delivering its output
    # the producer columns the symbolic run worked out, renumbered for this order
    found = producer_positions(schedule, order) if at is None else producers_at(schedule, at)
    cols = [np.asarray(col, dtype=np.int64) for col in found] if found is not None else []
    if found is None or any(col.max(initial=-1) >= n for col in cols):
        # not a schedule's ops, or producers missing (lowering takes validated ones)
        cols = [np.asarray(col, dtype=np.int64) for col in
                _producers_by_op(schedule, order, {op: k for k, op in enumerate(order)})]
    ext = np.full((n, 3), -1, dtype=np.int64)  # what completes or delivers each producer
    for c, x in enumerate(cols):
        there = x >= 0
        safe = np.where(there, x, 0)
        ext[:, c] = np.where(there, np.where(rank_at[safe] == rank_at, done[safe],
                                             arrived[safe]), -1)
    op_of = np.repeat(np.arange(n), count)
    ids = np.arange(total, dtype=np.int64)
    row = starts[variant[op_of]] + (ids - offset[op_of])
    table = _slot_table(rows)
    # compute timers read no id, name, dependency or micro-batch: one signature per slot row,
    # its representative the slot's first instance
    first_id = np.full(len(rows), total, dtype=np.int64)
    np.minimum.at(first_id, row, ids)
    sig_rows = [j for j in range(len(rows)) if table.cls[j] == COMPUTE and first_id[j] < total]
    sig_of_row = np.full(len(rows), -1, dtype=np.int64)
    sig_of_row[sig_rows] = np.arange(len(sig_rows))
    layout = _Collapsed(order, plans, templates, variant, offset, ext, algo, done,
                        int(np.count_nonzero(table.cls[row] == COLLECTIVE)))
    layout.parts = (table, row, kind[op_of], sig_of_row,
                    tuple(layout.instruction(int(first_id[j])) for j in sig_rows))
    return layout


@dataclass(frozen=True)
class _Plan:
    """What every micro-batch of one (stage, kind, sequence chunk) emits (collapsed)."""

    rank: int
    gpu: int
    folded: _Folded
    alloc: float
    free: float
    send: tuple[int, str, float, float] | None
    """(destination GPU, name suffix, duration, bytes) of its pipeline send, if any."""
    split_at: float | None
    """Where its compute may be split (:func:`_emit_folded`): the head's compute time."""


def _split_ops(plans: Sequence[_Plan], plan_of: np.ndarray, rank_at: np.ndarray,
               ranks: int) -> np.ndarray:
    """Per op (in lowering order), whether it is emitted split (:func:`_emit_folded`): its
    head's compute is shorter than what the rank's earlier closing collective may still
    take (``pending``, as the general loop keeps it per rank)."""
    n = len(plan_of)
    split_at = np.array([np.nan if p.split_at is None else p.split_at for p in plans])
    if not n or np.isnan(split_at).all():
        return np.zeros(n, dtype=np.int64)
    if all(p.folded.trailing or p.folded.has_comm for p in plans):
        # after each op, pending is its closing collectives' time (or 0): before an op,
        # that of the rank's previous op
        after = np.array([p.folded.trailing_s if p.folded.trailing else 0.0 for p in plans])
        by_rank = np.argsort(rank_at, kind="stable")
        before = np.zeros(n)
        same = rank_at[by_rank[1:]] == rank_at[by_rank[:-1]]
        before[by_rank[1:][same]] = after[plan_of[by_rank[:-1][same]]]
        at = split_at[plan_of]
        return np.where(np.isnan(at), False, before > np.nan_to_num(at)).astype(np.int64)
    pending = [0.0] * ranks
    out = np.zeros(n, dtype=np.int64)
    for k, p in enumerate(plan_of.tolist()):
        plan = plans[p]
        f, r = plan.folded, plan.rank
        if plan.split_at is not None and pending[r] > plan.split_at:
            out[k] = 1
        if f.trailing:
            pending[r] = f.trailing_s
        elif f.has_comm:
            pending[r] = 0.0
        else:
            pending[r] = max(0.0, pending[r] - f.whole.compute_s)
    return out


def _slots(plan: _Plan, split: bool) -> tuple[tuple, ...]:
    """An op's instructions in order (:func:`_emit_folded`, then its send): ``("run",
    _CommRun)``, ``("block", _Block, alloc, free)`` and ``("send",)``."""
    f = plan.folded
    out: list[tuple] = [("run", run) for run in f.leading]
    if split:
        out.append(("block", f.head, plan.alloc, 0.0))
        out += [("run", run) for run in f.first_comm]
        out.append(("block", f.rest, 0.0, plan.free))
    else:
        out.append(("block", f.whole, plan.alloc, plan.free))
    out += [("run", run) for run in f.trailing]
    if plan.send is not None:
        out.append(("send",))
    return tuple(out)


@dataclass
class _SlotTable:
    """Per template slot row, the fields the engine reads (``kind`` of a compute op is its
    op's: see :meth:`kind_of`)."""

    names: tuple[str, ...]
    cls: np.ndarray
    gpu: np.ndarray
    kind: np.ndarray
    """Code of a run's or send's kind; -1 for compute (the op's kind: the first three names
    are F, B and W, coded as :data:`_KINDS`)."""
    dst: np.ndarray
    fixed_s: np.ndarray
    blocking_s: np.ndarray
    comm: np.ndarray
    alloc: np.ndarray
    free: np.ndarray



def _slot_table(rows: Sequence[tuple[_Plan, tuple]]) -> _SlotTable:
    """The fields of every slot row (:class:`_SlotTable`)."""
    names = {k: i for i, k in enumerate((*_KINDS, "pp"))}  # op kinds first, as _KINDS
    cls, gpu, kind, dst, fixed, blocking, comm, alloc, free = ([] for _ in range(9))
    for plan, slot in rows:
        gpu.append(plan.gpu)
        what = slot[0]
        if what == "run":
            run = slot[1]
            cls.append(COLLECTIVE)
            kind.append(names.setdefault(run.kind, len(names)))
            dst.append(-1)
            fixed.append(run.duration_s)
            blocking.append(0.0)
            comm.append(-1)
            alloc.append(0.0)
            free.append(0.0)
        elif what == "block":
            blk = slot[1]
            cls.append(COMPUTE)
            kind.append(-1)
            dst.append(-1)
            fixed.append(np.nan)
            blocking.append(blk.comm_s)
            comm.append(names.setdefault(blk.comm_kind, len(names)))
            alloc.append(slot[2])
            free.append(slot[3])
        else:
            assert plan.send is not None
            cls.append(SEND)
            kind.append(names["pp"])
            dst.append(plan.send[0])
            fixed.append(plan.send[2])
            blocking.append(0.0)
            comm.append(-1)
            alloc.append(0.0)
            free.append(0.0)
    return _SlotTable(tuple(names), np.array(cls, dtype=np.int8), np.array(gpu, dtype=np.int64),
                      np.array(kind, dtype=np.int64), np.array(dst, dtype=np.int64),
                      np.array(fixed, dtype=float), np.array(blocking, dtype=float),
                      np.array(comm, dtype=np.int64), np.array(alloc, dtype=float),
                      np.array(free, dtype=float))


class _Collapsed:
    """The op loop of a collapsed lowering on arrays (:func:`_lower_collapsed`): its
    :class:`Columns`, and its instructions as objects on demand (:meth:`build`)."""

    def __init__(self, order: Sequence[Op], plans: Sequence[_Plan],
                 templates: Mapping[int, tuple[tuple, ...]], variant: np.ndarray,
                 offset: np.ndarray, ext: np.ndarray, algo: str, done: np.ndarray,
                 keys: int) -> None:
        self.order, self.plans, self.templates = order, plans, templates
        self.variant, self.offset, self.ext = variant, offset, ext
        """Per op: its template, its first id, what its first instruction waits for."""
        self.algo = algo
        self.done = done
        """Per op, the instruction that completes it."""
        self.size = int(offset[-1] + len(templates[int(variant[-1])])) if len(offset) else 0
        """Instructions."""
        self.keys = keys
        """Collective keys used (0 .. keys - 1, in id order)."""
        self.parts: tuple
        """What :meth:`columns_with` lays out: the slot table, each instruction's slot row
        and op kind code, each slot row's signature and the signatures' representatives."""

    def columns_with(self, tail: Columns) -> Columns:
        """The columns of this part's instructions followed by ``tail``'s (the step end,
        whose ids follow): laid out at their final size at once."""
        table, row, op_kind, sig_of_row, signatures = self.parts
        n, m = len(row), len(tail)
        names = (*table.names, *(x for x in tail.names if x not in table.names))
        code = {x: k for k, x in enumerate(names)}
        remap = np.array([code[x] for x in tail.names] + [-1], dtype=np.int64)

        def laid(values: np.ndarray, rest: np.ndarray) -> np.ndarray:
            out = np.empty(n + m, dtype=values.dtype)
            np.take(values, row, out=out[:n])
            out[n:] = rest
            return out

        kind = laid(table.kind, remap[tail.kind])
        compute = kind[:n] < 0
        kind[:n][compute] = op_kind[compute]
        width = max(3, tail.deps.shape[1])
        deps = np.full((n + m, width), -1, dtype=np.int64)
        deps[self.offset, :3] = self.ext  # an op's first instruction: its producers
        later = np.ones(n, dtype=bool)
        later[self.offset] = False
        deps[:n, 0][later] = np.flatnonzero(later) - 1  # the others: the one before
        deps[n:, :tail.deps.shape[1]] = tail.deps
        return Columns(names, laid(table.cls, tail.cls), laid(table.gpu, tail.gpu), kind,
                       laid(table.dst, tail.dst), deps, laid(table.fixed_s, tail.fixed_s),
                       laid(table.blocking_s, tail.blocking_s),
                       laid(table.comm, remap[tail.comm]),
                       laid(table.alloc, tail.alloc_bytes), laid(table.free, tail.free_bytes),
                       laid(sig_of_row, np.where(tail.signature >= 0,
                                                 tail.signature + len(signatures), -1)),
                       (*signatures, *tail.signatures))

    def instruction(self, i: int) -> Instruction:
        """Instruction ``i`` as :meth:`build` builds it (but a collective's key: 0)."""
        k = int(np.searchsorted(self.offset, i, side="right")) - 1
        ops, _ = self._op(k, int(self.offset[k]), 0)
        return ops[i - int(self.offset[k])]

    def _op(self, k: int, i: int, key: int) -> tuple[list[Instruction], int]:
        """Op ``order[k]``'s instructions, the first with id ``i``, collective keys from
        ``key``; and the next key."""
        new = tuple.__new__
        st, kind, mb, seq = self.order[k]
        v = int(self.variant[k])
        plan = self.plans[v // 2]
        g = plan.gpu
        name = f"{st}{kind}{mb}" if seq == WHOLE else f"{st}{kind}{mb}.{seq}"  # str(op)
        deps = tuple([d for d in self.ext[k].tolist() if d >= 0])
        out: list[Instruction] = []
        for slot in self.templates[v]:
            what = slot[0]
            if what == "run":
                run = slot[1]
                out.append(new(Collective, (i, g, run.kind, f"{name} {run.label}", deps, run.op,
                                            self.algo, (g,), run.nbytes, key, st, mb,
                                            run.duration_s)))
                key += 1
            elif what == "block":
                blk, alloc, free = slot[1], slot[2], slot[3]
                out.append(new(Compute, (i, g, kind, name, deps, blk.flops, 0.0, blk.compute_s,
                                         blk.attn_flops, (), 0.0, blk.comm_s, blk.comm_kind,
                                         alloc, free, st, mb)))
            else:
                dst, suffix, fixed, nbytes = plan.send  # type: ignore[misc]
                out.append(new(Send, (i, g, dst, nbytes, "pp", name + suffix, deps, st, mb,
                                      fixed)))
            deps = (i,)
            i += 1
        return out, key

    def build(self) -> tuple[Instruction, ...]:
        """Every instruction as an object, in id order: those of the general loop."""
        out: list[Instruction] = []
        key = 0
        for k, i in enumerate(self.offset.tolist()):
            ops, key = self._op(k, i, key)
            out.extend(ops)
        return tuple(out)


def _producers_by_op(schedule: Schedule, order: Sequence[Op], index: Mapping[Op, int]
                     ) -> tuple[list[int], list[int], list[int]]:
    """:func:`~workloads.schedules.producer_positions` op by op (:func:`op_deps`), for ops
    it declines; a producer missing from ``order`` raises KeyError, as lowering did."""
    cols: tuple[list[int], list[int], list[int]] = ([], [], [])
    S, split, chunks = schedule.num_stages, schedule.split_backward, schedule.seq_chunks
    for op in order:
        found = [index[d] for d in op_deps(op, S, split, chunks)]
        found += [-1] * (3 - len(found))
        for col, x in zip(cols, found, strict=True):
            col.append(x)
    return cols


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


Groups = tuple[tuple[int, ...], ...]


def _comm_runs(segs: Sequence[Segment], collapse: Collapse, groups: Groups,
               ep_groups: Groups = ()) -> tuple[_CommRun, ...]:
    runs: list[_CommRun] = []
    for seg in segs:
        assert isinstance(seg, CommSeg)
        t = collapse.collective_s(seg.op, ep_groups if seg.group == "ep" else groups,
                                  seg.nbytes)
        if runs and runs[-1].kind == seg.kind:
            prev = runs[-1]
            runs[-1] = _CommRun(prev.kind, prev.op, f"{prev.label} + {seg.label}",
                                prev.nbytes + seg.nbytes, prev.duration_s + t)
        else:
            runs.append(_CommRun(seg.kind, seg.op, seg.label, seg.nbytes, t))
    return tuple(runs)


def _block(segs: Sequence[Segment], collapse: Collapse, groups: Groups,
           ep_groups: Groups = ()) -> _Block:
    work = [seg for seg in segs if isinstance(seg, ComputeSeg)]
    comm = [seg for seg in segs if isinstance(seg, CommSeg)]
    kinds = sorted({seg.kind for seg in comm})
    return _Block(sum(collapse.compute_s(seg) for seg in work),
                  sum(collapse.collective_s(seg.op, ep_groups if seg.group == "ep" else groups,
                                            seg.nbytes) for seg in comm),
                  kinds[0] if len(kinds) == 1 else "tp",
                  sum(seg.flops for seg in work), sum(seg.attn_flops for seg in work))


def _fold(segs: tuple[Segment, ...], collapse: Collapse, groups: Groups,
          ep_groups: Groups = ()) -> _Folded:
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
    replica of the pipeline rank) running it at once; MoE all-to-alls with all
    ``ep_groups`` (the rank's EP groups).
    """
    eg = ep_groups
    compute_at = [i for i, seg in enumerate(segs) if isinstance(seg, ComputeSeg)]
    if not compute_at:  # no compute: one blocking fold
        return _Folded((), _block(segs, collapse, groups, eg), None, (), None, ())
    first, end = compute_at[0], compute_at[-1] + 1
    middle = segs[first:end]
    comm_at = [i for i, seg in enumerate(middle) if isinstance(seg, CommSeg)]
    head = first_comm = rest = None
    if comm_at:
        i = comm_at[0]
        j = next(k for k in range(i, len(middle)) if isinstance(middle[k], ComputeSeg))
        head = _block(middle[:i], collapse, groups, eg)
        first_comm = _comm_runs(middle[i:j], collapse, groups, eg)
        rest = _block(middle[j:], collapse, groups, eg)
    return _Folded(_comm_runs(segs[:first], collapse, groups, eg),
                   _block(middle, collapse, groups, eg), head, first_comm or (), rest,
                   _comm_runs(segs[end:], collapse, groups, eg))


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


def replica_coords(placement: Placement) -> list[tuple[int, int]]:
    """The (cp, dp) coordinates of the replicas of a pipeline rank's TP group."""
    return [(c, d) for c in range(placement.degree("cp")) for d in range(placement.degree("dp"))]


def grad_group(placement: Placement, t: int, r: int) -> tuple[int, ...]:
    """The GPUs that reduce gradients together with TP lane ``t`` of pipeline rank ``r``:
    the DP group times the CP group (Megatron's data-parallel-with-CP group), by GPU id."""
    return tuple(sorted(placement.gpu(tp=t, cp=c, dp=d, pp=r)
                        for c, d in replica_coords(placement)))


def ep_groups(placement: Placement, r: int, ep: int) -> Groups:
    """Every EP group of pipeline rank ``r``: ep consecutive DP ranks, same tp and cp."""
    return tuple(placement.ep_group(placement.gpu(tp=t, cp=c, dp=d, pp=r), ep)
                 for t in range(placement.degree("tp")) for c, d in replica_coords(placement)
                 if d % ep == 0)


def expert_groups(placement: Placement, t: int, r: int, ep: int) -> Groups:
    """The groups that reduce expert gradients for TP lane ``t`` of rank ``r``: the DP x CP
    replicas with the same EP rank (they hold the same experts), by GPU id."""
    return tuple(tuple(sorted(placement.gpu(tp=t, cp=c, dp=d, pp=r)
                              for c, d in replica_coords(placement) if d % ep == i))
                 for i in range(ep))


def tp_groups(placement: Placement, r: int) -> tuple[tuple[int, ...], ...]:
    """Every TP group of pipeline rank ``r`` (one per (cp, dp) replica)."""
    return tuple(placement.group("tp", placement.gpu(pp=r, cp=c, dp=d))
                 for c, d in replica_coords(placement))


ALL_TO_ALL_ALGO = "pairwise"
"""MoE all-to-alls: the one all-to-all algorithm (NCCL's pairwise exchange)."""


def _with_all_to_all(collapse: Collapse) -> Collapse:
    """``collapse`` timing all-to-alls with :data:`ALL_TO_ALL_ALGO`.

    The timer of :mod:`sim.commtime` is built for one algorithm (the default, ``auto``); a second
    instance of the same class on the same cluster times the all-to-alls. Timers
    of another shape are used as they are.
    """
    timer = collapse.collective_s
    cluster = getattr(timer, "cluster", None)
    if cluster is None:
        return collapse
    pairwise = type(timer)(cluster, algo=ALL_TO_ALL_ALGO)

    def timed(op: str, groups: Groups, nbytes: float) -> float:
        return (pairwise if op == "all_to_all" else timer)(op, groups, nbytes)

    return replace(collapse, collective_s=timed)


def _emit_sends(b: ProgramBuilder, sends: list, lanes: list[list[list[int]]], r: int, k: int,
                last: Mapping[tuple[int, int], int], sent: dict[tuple[int, int], int],
                p2p: float) -> None:
    """Each pipeline send of op ``order[k]``, from every simulated lane of rank ``r``."""
    for j, member, cr, name, fixed in sends:
        for d, gpus in enumerate(lanes[r]):
            for t, g in enumerate(gpus):
                dst = lanes[cr][d][t]
                sent[(j, dst)] = b.send(g, dst, p2p, "pp", name, (last[(k, g)],),
                                        stage=member.stage, mb=member.mb, duration_s=fixed)


def _op_p2p_bytes(costs: CostModel, op: Op, whole: float) -> float:
    """Pipeline message of ``op``: ``whole`` (the cost model's ``p2p_bytes``), or for a
    Seq1F1B sequence chunk (``op.seq >= 0``) the cost model's ``seq_p2p_bytes`` (the
    chunk's tokens) where it has one."""
    per_chunk = getattr(costs, "seq_p2p_bytes", None) if op.seq >= 0 else None
    return whole if per_chunk is None else float(per_chunk(op))


def _replica_send_s(collapse: Collapse, placement: Placement,
                    cache: dict[tuple[int, int, float], float], src: int, dst: int,
                    nbytes: float) -> float:
    """Time of a pipeline message from rank ``src`` to rank ``dst`` (collapsed lowering):
    every (tp, cp, dp) replica's copy crosses at once, timed together on the topology;
    cached by ``(src, dst, nbytes)``."""
    key = (src, dst, nbytes)
    if key not in cache:
        pairs = tuple((placement.gpu(tp=u, cp=c, dp=e, pp=src),
                       placement.gpu(tp=u, cp=c, dp=e, pp=dst))
                      for c, e in replica_coords(placement)
                      for u in range(placement.degree("tp")))
        cache[key] = collapse.collective_s("send", pairs, nbytes)
    return cache[key]


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
    piecewise: _PieceLowering | None = None,
) -> None:
    """DP gradient collectives per stage (in the order stages finish), optimizer, ZeRO gather.

    ``last[(index[op], g)]`` is the instruction that completes ``op`` on GPU ``g``.
    Stages whose gradients ``piecewise`` already reduced during their backward (buckets,
    ZeRO-3) get no collective here; the optimizer waits for the GPU's last DP
    collective instead. ZeRO-3 gathers no parameters after the optimizer (the
    next step's forward gathers them layer by layer).
    """
    reduced = piecewise.reduced if piecewise is not None else set()
    pp, tp = placement.degree("pp"), placement.degree("tp")
    dp = len(replica_coords(placement))  # gradients are reduced over the DP x CP group
    stages = sorted(final_op, key=lambda s: index[final_op[s]])
    waits: dict[int, list[int]] = {g: [] for g in range(placement.num_gpus)}
    grad_op = "reduce_scatter" if zero_stage >= 1 else "all_reduce"
    lanes = 1 if collapse is not None else tp

    def dp_collective(r: int, t: int, deps: dict[int, tuple[int, ...]], name: str, op: str,
                      nbytes: float, stage: int = -1) -> dict[int, int]:
        group = grad_group(placement, t, r)
        if collapse is None:
            return b.collective(group, deps, kind="dp", name=name, op=op, nbytes=nbytes,
                                stage=stage)
        groups = tuple(grad_group(placement, u, r) for u in range(tp))
        rep = group[0]
        return b.collective((rep,), deps, kind="dp", name=name, op=op, nbytes=nbytes,
                            stage=stage, duration_s=collapse.collective_s(op, groups, nbytes))

    def lane_gpus(r: int, t: int) -> tuple[int, ...]:
        if collapse is not None:
            return (placement.gpu(pp=r),)
        return grad_group(placement, t, r)

    ep = int(getattr(costs, "ep", 1))
    expert_bytes = getattr(costs, "expert_grad_bytes", None)

    def expert_collective(r: int, t: int, deps: Mapping[int, tuple[int, ...]], name: str,
                          op: str, nbytes: float, stage: int = -1) -> dict[int, int]:
        """MoE with ep > 1: the experts' collective over each expert-data-parallel group."""
        if collapse is not None:
            rep = placement.gpu(pp=r)
            groups = tuple(grp for u in range(tp) for grp in expert_groups(placement, u, r, ep))
            return b.collective((rep,), {rep: deps[rep]}, kind="dp", name=name, op=op,
                                nbytes=nbytes, stage=stage,
                                duration_s=collapse.collective_s(op, groups, nbytes))
        ids: dict[int, int] = {}
        for group in expert_groups(placement, t, r, ep):
            ids.update(b.collective(group, {g: deps[g] for g in group}, kind="dp", name=name,
                                    op=op, nbytes=nbytes, stage=stage))
        return ids

    for s in stages:
        r = schedule.stage_rank[s]
        for t in range(lanes):
            deps = {g: (last[(index[final_op[s]], g)],) for g in lane_gpus(r, t)}
            nbytes = costs.grad_bytes(s)
            if dp > 1 and nbytes > 0 and s not in reduced:
                ids = dp_collective(r, t, deps, f"stage{s} grad {grad_op}", grad_op, nbytes, s)
                for g, i in ids.items():
                    waits[g].append(i)
            else:
                for g, d in deps.items():
                    waits[g].extend(d)
            nbytes = expert_bytes(s) if expert_bytes is not None else 0.0
            if nbytes > 0 and dp // ep > 1 and s not in reduced:
                ids = expert_collective(r, t, deps, f"stage{s} expert grad {grad_op}", grad_op,
                                        nbytes, s)
                for g, i in ids.items():
                    waits[g].append(i)
    if piecewise is not None:
        for g, i in piecewise.dp_last.items():
            waits[g].append(i)
    for r in range(pp):
        mine = _stages_of(schedule, r)
        seg = costs.optimizer_segment(mine)
        if seg is None:
            continue
        for t in range(lanes):
            fixed = None if collapse is None else collapse.on(placement.gpu(pp=r)).compute_s(seg)
            opt = {g: b.compute(g, "opt", "optimizer", tuple(waits[g]), flops=seg.flops,
                                hbm_bytes=seg.hbm_bytes, elementwise_bytes=seg.elementwise_bytes,
                                duration_s=fixed)
                   for g in lane_gpus(r, t)}
            if zero_stage in (1, 2) and dp > 1:
                nbytes = sum(costs.grad_bytes(s) for s in mine)
                dp_collective(r, t, {g: (i,) for g, i in opt.items()}, "param all_gather",
                              "all_gather", nbytes)
                nbytes = sum(expert_bytes(s) for s in mine) if expert_bytes is not None else 0.0
                if nbytes > 0 and dp // ep > 1:
                    expert_collective(r, t, {g: (i,) for g, i in opt.items()},
                                      "expert param all_gather", "all_gather", nbytes)


@dataclass(frozen=True)
class _Piece:
    """A run of an op's segments between DP markers: the parameters it needs gathered
    first (ZeRO-3), its compute and TP collectives, the gradients it finishes."""

    gather: ParamGather | None
    segs: tuple[Segment, ...]
    ready: tuple[GradReady, ...]
    compute_before: int
    """Compute segments of the op before this piece (for where memory is allocated/freed)."""

    @property
    def num_compute(self) -> int:
        return sum(isinstance(seg, ComputeSeg) for seg in self.segs)


def split_pieces(segs: Sequence[Segment]) -> tuple[_Piece, ...]:
    """Cut an op's marked segments into pieces: a :class:`ParamGather` opens a piece, a
    :class:`GradReady` closes one (the segments after it start the next)."""
    pieces: list[_Piece] = []
    gather: ParamGather | None = None
    body: list[Segment] = []
    ready: list[GradReady] = []
    before = 0

    def close() -> None:
        nonlocal gather, body, ready, before
        if gather is not None or body or ready:
            piece = _Piece(gather, tuple(body), tuple(ready), before)
            pieces.append(piece)
            before += piece.num_compute
        gather, body, ready = None, [], []

    for seg in segs:
        if isinstance(seg, ParamGather):
            close()
            gather = seg
        elif isinstance(seg, GradReady):
            ready.append(seg)
        else:
            if ready:
                close()
            body.append(seg)
    close()
    return tuple(pieces)


class _PieceLowering:
    """Lowers ops that are more than a chain of compute and TP collectives (mutable state
    of one lowering pass): DP collectives inside ops and context-parallel ring attention.

    ZeRO-3 (Rajbhandari et al. 2020, sec. 5.3 and 7.2; PyTorch FSDP): before
    each piece (a layer, the head) its parameters are all-gathered over the DP
    group on the ``dp`` stream, issued one piece ahead (the gather for piece
    n+1 waits only for piece n-1 to end, so it overlaps piece n; the first
    piece of the rank's next op is prefetched during the last piece of this
    one); after each piece's backward its gradients are reduce-scattered.
    Every micro-batch gathers again and reduce-scatters its own gradients.

    ``overlap_grad_reduce`` (Megatron-LM's ``--overlap-grad-reduce``, PyTorch
    DDP buckets, Li et al. 2020): in the last backward (or W) of each stage,
    gradients fill buckets of ``grad_bucket_bytes`` in backward order; a full
    bucket is reduced (all-reduce, or reduce-scatter under ZeRO-1/2) as soon as
    the piece that completes it ends; the remainder goes when the op ends.

    All DP collectives of a GPU share its ``dp`` stream, in issue order (one stream per
    communication kind): a gather queues behind reduce-scatters issued before it, e.g. the
    first layers' gathers of a forward behind the previous backward's last reduce-scatter.
    The gathered working set is memory of the ops (``transient_bytes``), not of these
    instructions. The DP group is the DP x CP group (:func:`grad_group`).

    Ring attention (:class:`~workloads.costs.RingAttention`): block j >= 1 of the
    attention core waits for the K/V block sent to this GPU by its CP ring
    predecessor; each GPU forwards a block once it has arrived. In the full
    lowering these are point-to-point sends of kind ``cp``; collapsed, the
    representative GPU's own send stands for its receive (every ring member
    sends at once), timed with all ring pairs of the pipeline rank.

    MoE (ep > 1): the all-to-alls (``CommSeg(group="ep")``) run over each EP
    group of ep consecutive DP ranks; with ``overlap_grad_reduce`` the expert
    gradients fill their own buckets, reduced over the replicas holding the
    same experts (:func:`expert_groups`).
    """

    def __init__(self, b: ProgramBuilder, schedule: Schedule, costs: CostModel,
                 placement: Placement, zero_stage: int, collapse: Collapse | None,
                 lanes: list[list[list[int]]]) -> None:
        self.b, self.costs, self.placement = b, costs, placement
        self.collapse = None if collapse is None else _with_all_to_all(collapse)
        self.schedule, self.lanes = schedule, lanes
        self.zero3 = zero_stage == 3
        self.grad_op = "reduce_scatter" if zero_stage >= 1 else "all_reduce"
        self.bucket_bytes = float(getattr(costs, "grad_bucket_bytes", 25e6))
        self.tp = placement.degree("tp")
        self.ep = int(getattr(costs, "ep", 1))
        self.expert_replicas = len(replica_coords(placement)) // self.ep
        """GPUs holding the same experts (the expert-data-parallel group size)."""
        self.next_op = {op: ops[i + 1] for ops in schedule.rank_ops
                        for i, op in enumerate(ops[:-1])}
        self.cache: dict[tuple[Op, bool], tuple[_Piece, ...]] = {}
        self.fold_cache: dict[tuple, _Folded] = {}
        self.prefetched: dict[Op, dict[int, tuple[int, ...]]] = {}
        """Gathers issued ahead for the first piece of an op, by GPU."""
        self.ends: dict[int, list[int]] = {}
        """Per GPU, the ends of its last two pieces."""
        self.dp_last: dict[int, int] = {}
        """Per GPU, its last DP collective issued during the ops."""
        self.reduced: set[int] = set()
        """Stages whose gradients were reduced during their ops (none left for the step end)."""
        cp = placement.degree("cp")
        self.ring_next = {g: placement.gpu(**{**placement.coords(g),
                                              "cp": (placement.coords(g)["cp"] + 1) % cp})
                          for g in range(placement.num_gpus)} if cp > 1 else {}

    def pieces(self, op: Op, marked: bool) -> tuple[_Piece, ...]:
        generic = Op(op.stage, op.kind, 0, op.seq)
        hit = self.cache.get((generic, marked))
        if hit is None:
            split = self.schedule.split_backward
            segs = self.costs.op_segments(generic, split, markers=True) if marked else \
                self.costs.op_segments(generic, split)
            hit = self.cache[(generic, marked)] = split_pieces(segs)
        return hit

    # ---------------------------------------------------------------- DP collectives
    def _dp(self, r: int, deps: Mapping[int, tuple[int, ...]], name: str, op: str,
            nbytes: float, stage: int, mb: int) -> dict[int, int]:
        """One DP collective per TP lane of pipeline rank ``r``."""
        groups = tuple(grad_group(self.placement, t, r) for t in range(self.tp))
        return self._dp_groups(r, groups, deps, name, op, nbytes, stage, mb)

    def _dp_groups(self, r: int, groups: tuple[tuple[int, ...], ...],
                   deps: Mapping[int, tuple[int, ...]], name: str, op: str, nbytes: float,
                   stage: int, mb: int) -> dict[int, int]:
        """A DP-stream collective over each of ``groups`` (GPUs of pipeline rank ``r``); when
        collapsed, one instruction on the representative GPU timed for all groups at once."""
        b = self.b
        if self.collapse is not None:
            rep = self.placement.gpu(pp=r)
            ids = b.collective((rep,), {rep: deps[rep]}, kind="dp", name=name, op=op,
                               nbytes=nbytes, stage=stage, mb=mb,
                               duration_s=self.collapse.collective_s(op, groups, nbytes))
        else:
            ids = {}
            for group in groups:
                ids.update(b.collective(group, {g: deps[g] for g in group}, kind="dp",
                                        name=name, op=op, nbytes=nbytes, stage=stage, mb=mb))
        self.dp_last.update(ids)
        return ids

    def _gather(self, r: int, op: Op, gather: ParamGather, gpus: Sequence[int],
                back: int) -> dict[int, tuple[int, ...]]:
        """All-gather ``gather`` once the piece ``back`` pieces ago on each GPU has ended
        (its experts' part over the replicas holding them); the ids by GPU."""
        deps = {}
        for g in gpus:
            ends = self.ends.get(g, [])
            deps[g] = (ends[-back],) if len(ends) >= back else ()
        ids = self._dp(r, deps, f"{op} {gather.label} all_gather", "all_gather",
                       gather.nbytes, op.stage, op.mb)
        out = {g: (i,) for g, i in ids.items()}
        if gather.expert_nbytes > 0 and self.expert_replicas > 1:
            more = self._expert_dp(r, deps, f"{op} {gather.label} experts all_gather",
                                   "all_gather", gather.expert_nbytes, op.stage, op.mb)
            out = {g: out[g] + (more[g],) for g in out}
        return out

    def _end_piece(self, g: int, end: int) -> None:
        ends = self.ends.setdefault(g, [])
        ends.append(end)
        del ends[:-2]

    # ---------------------------------------------------------------- one op
    def emit(self, k: int, op: Op, r: int, prev: dict[int, tuple[int, ...]], alloc: float,
             free: float, last: dict[tuple[int, int], int], pending: list[float],
             marked: bool) -> None:
        """Emit ``op`` (position ``k`` of the lowering order) on every simulated GPU of
        rank ``r``, starting after ``prev[g]``; its last instruction goes to ``last``.
        ``marked``: with its DP markers (ZeRO-3, or the bucketed final backward)."""
        pieces = self.pieces(op, marked)
        total = sum(piece.num_compute for piece in pieces)
        gpus = list(prev)
        ahead = self.prefetched.pop(op, None)
        bucket, n_buckets = 0.0, 0
        expert_bucket, n_expert = 0.0, 0
        for n, piece in enumerate(pieces):
            if piece.gather is not None and ahead is None:
                ahead = self._gather(r, op, piece.gather, gpus, 2)
            gathered, ahead = ahead, None
            follow = pieces[n + 1].gather if n + 1 < len(pieces) else None
            if follow is not None:
                ahead = self._gather(r, op, follow, gpus, 1)
            elif n + 1 == len(pieces) and self.zero3 and op in self.next_op:
                nxt = self.next_op[op]
                first = self.pieces(nxt, True)[0].gather if self.pieces(nxt, True) else None
                if first is not None:
                    self.prefetched[nxt] = self._gather(r, nxt, first, gpus, 1)
            if gathered is not None:
                prev = {g: prev[g] + gathered[g] for g in gpus}
            if piece.segs:
                prev = self._emit_body(op, (n, marked), piece, r, prev, alloc, free, total,
                                       pending, n + 1 == len(pieces))
                for g in gpus:
                    self._end_piece(g, prev[g][0])
            for ready in piece.ready:
                if self.zero3:
                    self._dp(r, prev, f"{op} {ready.label} reduce_scatter", "reduce_scatter",
                             ready.nbytes, op.stage, op.mb)
                    if ready.expert_nbytes > 0 and self.expert_replicas > 1:
                        self._expert_dp(r, prev, f"{op} {ready.label} experts reduce_scatter",
                                        "reduce_scatter", ready.expert_nbytes, op.stage, op.mb)
                    continue
                bucket += ready.nbytes
                while bucket >= self.bucket_bytes:
                    self._bucket(r, op, prev, self.bucket_bytes, n_buckets)
                    bucket -= self.bucket_bytes
                    n_buckets += 1
                expert_bucket += ready.expert_nbytes if self.expert_replicas > 1 else 0.0
                while expert_bucket >= self.bucket_bytes:
                    self._bucket(r, op, prev, self.bucket_bytes, n_expert, expert=True)
                    expert_bucket -= self.bucket_bytes
                    n_expert += 1
        if not self.zero3 and any(piece.ready for piece in pieces):
            if bucket > 0.5:  # bytes: what float sums leave over is not a bucket
                self._bucket(r, op, prev, bucket, n_buckets)
            if expert_bucket > 0.5:
                self._bucket(r, op, prev, expert_bucket, n_expert, expert=True)
            self.reduced.add(op.stage)
        if self.zero3 and marked:
            self.reduced.add(op.stage)
        for g in gpus:
            last[(k, g)] = prev[g][0]

    def _bucket(self, r: int, op: Op, prev: Mapping[int, tuple[int, ...]], nbytes: float,
                i: int, expert: bool = False) -> None:
        """A gradient bucket's collective; ``expert``: over the expert-data-parallel groups."""
        if not expert:
            self._dp(r, prev, f"stage{op.stage} grad bucket{i} {self.grad_op}", self.grad_op,
                     nbytes, op.stage, -1)
            return
        self._expert_dp(r, prev, f"stage{op.stage} expert grad bucket{i} {self.grad_op}",
                        self.grad_op, nbytes, op.stage, -1)

    def _expert_dp(self, r: int, deps: Mapping[int, tuple[int, ...]], name: str, op: str,
                   nbytes: float, stage: int, mb: int) -> dict[int, int]:
        """A collective over each expert-data-parallel group of rank ``r`` (MoE, ep > 1)."""
        groups = tuple(grp for t in range(self.tp)
                       for grp in expert_groups(self.placement, t, r, self.ep))
        return self._dp_groups(r, groups, deps, name, op, nbytes, stage, mb)

    def _emit_body(self, op: Op, key: tuple, piece: _Piece, r: int,
                   prev: dict[int, tuple[int, ...]], alloc: float, free: float, total: int,
                   pending: list[float], is_last: bool) -> dict[int, tuple[int, ...]]:
        """A piece's compute, TP collectives and ring attention; each GPU's last instruction.

        Memory: ``alloc`` goes with the op's first compute segment, ``free`` with its
        last (of ``total``)."""
        if self.collapse is not None:
            return self._emit_collapsed(op, key, piece, r, prev, alloc, free, total, pending,
                                        is_last)
        b, op_name = self.b, str(op)
        cur = dict(prev)
        seen = piece.compute_before
        for seg in piece.segs:
            if isinstance(seg, RingAttention):
                cur = self._ring_full(op, seg, cur)
                continue
            if isinstance(seg, ComputeSeg):
                seen += 1
            if isinstance(seg, CommSeg) and seg.group == "ep":
                for group in ep_groups(self.placement, r, self.ep):
                    ids = b.collective(group, {g: cur[g] for g in group}, kind=seg.kind,
                                       name=f"{op_name} {seg.label}", op=seg.op,
                                       nbytes=seg.nbytes, stage=op.stage, mb=op.mb,
                                       algo=ALL_TO_ALL_ALGO)
                    for g in group:
                        cur[g] = (ids[g],)
                continue
            for tp_group in self.lanes[r]:
                if isinstance(seg, CommSeg):
                    ids = b.collective(tuple(tp_group), {g: cur[g] for g in tp_group},
                                       kind=seg.kind, name=f"{op_name} {seg.label}",
                                       op=seg.op, nbytes=seg.nbytes, stage=op.stage, mb=op.mb)
                else:
                    label = op_name if seen == 1 else seg.label
                    ids = {g: b.compute(g, op.kind, label, cur[g], flops=seg.flops,
                                        hbm_bytes=seg.hbm_bytes, duration_s=seg.duration_s,
                                        attn_flops=seg.attn_flops, gemm_dims=seg.gemm_dims,
                                        elementwise_bytes=seg.elementwise_bytes,
                                        stage=op.stage, mb=op.mb,
                                        alloc_bytes=alloc if seen == 1 else 0.0,
                                        free_bytes=free if seen == total else 0.0)
                           for g in tp_group}
                for g in tp_group:
                    cur[g] = (ids[g],)
        return cur

    def _ring_full(self, op: Op, ring: RingAttention, cur: dict[int, tuple[int, ...]]
                   ) -> dict[int, tuple[int, ...]]:
        """Ring attention on every GPU of the rank: block j waits for the pass that brought
        its K/V; the pass of block j + 1 leaves once block j's K/V arrived."""
        b, blk = self.b, ring.block
        start = dict(cur)
        recv: dict[int, int] = {}
        for j in range(ring.steps):
            if j >= 1:
                arrived = {}
                for g in cur:
                    dst = self.ring_next[g]
                    arrived[dst] = b.send(g, dst, ring.nbytes, ring.kind,
                                          f"{op} {ring.label} pass{j}",
                                          start[g] if j == 1 else (recv[g],),
                                          stage=op.stage, mb=op.mb)
                recv = arrived
            for g in cur:
                deps = cur[g] + ((recv[g],) if j >= 1 else ())
                cur[g] = (b.compute(g, op.kind, blk.label, deps, flops=blk.flops,
                                    hbm_bytes=blk.hbm_bytes, attn_flops=blk.attn_flops,
                                    elementwise_bytes=blk.elementwise_bytes,
                                    gemm_dims=blk.gemm_dims, stage=op.stage, mb=op.mb),)
        return cur

    def _emit_collapsed(self, op: Op, key: tuple, piece: _Piece, r: int,
                        prev: dict[int, tuple[int, ...]], alloc: float, free: float,
                        total: int, pending: list[float], is_last: bool
                        ) -> dict[int, tuple[int, ...]]:
        """Collapsed: the piece's runs between ring attentions are folded like whole ops
        (:func:`_fold`, with the same bookkeeping of the TP stream's closing collective);
        each ring step is a timed pass and a compute block."""
        b, op_name = self.b, str(op)
        assert self.collapse is not None
        (g,) = prev
        deps = prev[g]
        runs: list[list[Segment]] = [[]]
        for seg in piece.segs:
            if isinstance(seg, RingAttention):
                runs += [[seg], []]
            else:
                runs[-1].append(seg)
        runs = [run for run in runs if run]
        seen = piece.compute_before
        for i, run in enumerate(runs):
            if isinstance(run[0], RingAttention):
                deps = self._ring_collapsed(op, run[0], g, r, deps)
                pending[r] = max(0.0, pending[r] - run[0].steps * self.collapse.on(g).compute_s(
                    run[0].block))
                continue
            folded = self.fold_cache.get((Op(op.stage, op.kind, 0, op.seq), key, i))
            if folded is None:
                folded = _fold(tuple(run), self.collapse.on(g), tp_groups(self.placement, r),
                               ep_groups(self.placement, r, self.ep))
                self.fold_cache[(Op(op.stage, op.kind, 0, op.seq), key, i)] = folded
            n_compute = sum(isinstance(seg, ComputeSeg) for seg in run)
            a = alloc if seen == 0 and n_compute else 0.0
            f = free if n_compute and seen + n_compute == total else 0.0
            seen += n_compute
            end = _emit_folded(b, g, op, op_name, folded, deps, a, f, pending[r])
            deps = (end,)
            final = is_last and i + 1 == len(runs)
            if folded.trailing:
                pending[r] = folded.trailing_s if final else 0.0
            elif folded.has_comm:
                pending[r] = 0.0
            else:
                pending[r] = max(0.0, pending[r] - folded.whole.compute_s)
        return {g: deps}

    def _ring_collapsed(self, op: Op, ring: RingAttention, g: int, r: int,
                        deps: tuple[int, ...]) -> tuple[int, ...]:
        assert self.collapse is not None
        p = self.placement
        pairs = tuple((x, self.ring_next[x]) for group in tp_groups(p, r) for x in group)
        pass_s = self.collapse.collective_s("send", pairs, ring.nbytes)
        block_s = self.collapse.on(g).compute_s(ring.block)
        blk = ring.block
        start, sent = deps, None
        for j in range(ring.steps):
            if j >= 1:
                sent = self.b.collective((g,), {g: start if j == 1 else (sent,)}, kind=ring.kind,
                                         name=f"{op} {ring.label} pass{j}", op="send",
                                         nbytes=ring.nbytes, stage=op.stage, mb=op.mb,
                                         duration_s=pass_s)[g]
            deps = (self.b.compute(g, op.kind, blk.label, deps + ((sent,) if j >= 1 else ()),
                                   duration_s=block_s, flops=blk.flops,
                                   attn_flops=blk.attn_flops, stage=op.stage, mb=op.mb),)
        return deps
