"""The fast path of a collapsed lowering: its op loop laid out on arrays.

A collapsed lowering whose ops are each a chain of compute and TP collectives, unfused
(no piecewise op, no fused group), builds the program of the reference op loop
(:mod:`workloads.lowering.ops`), instruction for instruction, as
:class:`~workloads.program.Columns`: every (stage, kind, sequence chunk) is worked out
once and its micro-batches' instructions come out of array operations; the instruction
objects are built only if something asks for them. ``lower(..., reference=True)`` runs
the reference instead, and ``tests/test_lowering_paths.py`` proves the two equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from operator import itemgetter

import numpy as np

from base.equalmemo import EqualMemo
from topologies.placement import Placement
from workloads.lowering.collapse import (
    Block,
    Collapse,
    Folded,
    StreamUse,
    first_cuts,
    folded_alike,
    folded_use,
    pending_after,
    replica_send_s,
    split_points,
)
from workloads.lowering.groups import Groups, tp_groups
from workloads.lowering.opcosts import CostModel, op_facts, op_p2p_bytes, op_work_facts
from workloads.lowering.order import KINDS, producers_by_op
from workloads.lowering.pipeline import consumer_stage
from workloads.program import (
    COLLECTIVE,
    COMPUTE,
    EQUAL_VOLUMES,
    SEND,
    Collective,
    ColumnarInstructions,
    Columns,
    Compute,
    Instruction,
    Send,
    columns_of,
)
from workloads.schedules import FORWARD, WHOLE, Op, Schedule, producer_positions, producers_at


def joined(head: ColumnarOps, tail: tuple[Instruction, ...]
           ) -> ColumnarInstructions | tuple[Instruction, ...]:
    """A collapsed program's instructions: ``head``'s (the op loop's, on arrays) and
    ``tail`` (the step end's), held as columns while nothing asks for the objects."""
    rest = columns_of(tail)
    if rest is None:  # not a collapsed step end (no such lowering): the objects now
        return head.build() + tail
    return ColumnarInstructions(head.columns_with(rest), lambda: head.build() + tail)


def lower_collapsed(schedule: Schedule, costs: CostModel, collapse: Collapse,
                    placement: Placement, order: Sequence[Op],
                    fields: tuple[np.ndarray, ...], reps: Sequence[int], algo: str,
                    blocking: bool = False, step: np.ndarray | None = None,
                    unnamed: bool = True) -> ColumnarOps:
    """The op loop of a collapsed lowering whose ops are each a chain of compute and TP
    collectives, unfused (no piecewise op, no fused group): the program of the reference
    op loop (:class:`~workloads.lowering.ops.OpLoop`), instruction for instruction, laid
    out on arrays.

    Everything but names, ids and dependencies is the same for every micro-batch of a
    (stage, kind, sequence chunk): worked out once per such triple (:class:`_Plan`:
    :func:`op_facts`, :func:`fold`, the pipeline send's time), it makes an op's
    instructions a template (:func:`_slots`: leading collectives, the folded compute,
    split or not as :func:`emit_folded` decides and cut where :func:`stream_cuts` says
    (:func:`_cut_ops`), trailing collectives, the send), each
    instruction after an op's first depending on the one before it. Ids, the first
    instruction's dependencies (what completes or delivers each producer) and every
    field the engine reads then come out of array operations over all ops at once
    (:class:`ColumnarOps`); the instruction objects are built only if asked for.

    ``blocking``: pipeline sends block their sender
    (:func:`~workloads.lowering.pipeline.sends_block`): each send is followed by its
    ``pp wait``, which completes the op. With ``step`` too (each op's DeepSpeed step,
    :func:`~workloads.lowering.pipeline.deepspeed_steps`; ``order`` sorted by it, as
    :func:`~workloads.lowering.pipeline.deepspeed_order`), the sends leave the ops: each
    step's messages are rendezvous of their two GPUs after the step's ops
    (:func:`~workloads.lowering.pipeline.emit_rendezvous`, :func:`_rendezvous`).

    ``unnamed``: fold each op's segments with its layers unnamed (:func:`op_work_facts`:
    the same work without building each layer's labels); the runs of collectives the
    instruction objects name are then named from a fold of the named segments
    (:func:`op_facts`, the reference, which ``unnamed=False`` folds throughout) when an
    object is built (:meth:`ColumnarOps.build`). Nothing else of a fold reads a label.
    """
    S, split = schedule.num_stages, schedule.split_backward
    owner = schedule.stage_rank
    whole_p2p = costs.p2p_bytes()
    send_cache: dict[tuple[int, int, float], float] = {}
    stage, kind, seq, at = fields  # of the ops in order (topological)
    used_at, plan_of, rank_at, cols = _STRUCTURE.get(
        (*fields, len(order), schedule), lambda: _op_structure(schedule, order, fields))
    plans: list[_Plan] = []
    groups: dict[int, Groups] = {}  # per rank, its TP groups
    folds = costs.__dict__.setdefault("_memo_folds", {})  # kept with its op segments
    # the ops folded from their unnamed segments (op_work_facts), each plan's runs named by
    # a fold of its named segments when an instruction object asks (named, below)
    facts = op_work_facts if unnamed else op_facts
    named: list[Callable[[], Folded]] = []
    for k in used_at.tolist():
        st, kd, _, sq = order[k]
        r, g = owner[st], reps[owner[st]]
        generic = Op(st, kd, 0, sq)
        segs, _, alloc, free = facts(costs, generic, split)
        if r not in groups:
            groups[r] = tp_groups(placement, r)
        folded, use = (folded_alike if unnamed else folded_use)(segs, collapse.on(g),
                                                                 groups[r], folds)
        named.append(partial(_named_fold, costs, generic, split, collapse.on(g), groups[r],
                             folds))
        consumer = consumer_stage(generic, S)
        p2p = op_p2p_bytes(costs, generic, whole_p2p)
        send = None
        if consumer is not None and owner[consumer] != r:
            send = (reps[owner[consumer]], " act" if kd == FORWARD else " grad",
                    replica_send_s(collapse, placement, send_cache, r, owner[consumer], p2p),
                    p2p)
        head, rest = folded.head, folded.rest
        split_at = (head.compute_s if head is not None and rest is not None
                    and not folded.leading else None)
        plans.append(_Plan(r, g, folded, alloc, free, send, split_at, use))
    kinds = sorted({kind for p in plans for kind in p.use.kinds})
    split_op = _split_ops(plans, plan_of, rank_at, len(reps), kinds)
    cut_op = _cut_ops(plans, plan_of, rank_at, cols, kinds)
    m = len(kinds)
    per = 1 << (2 * m)  # variants per plan: each set of kinds split at, times each cut
    variant = plan_of * per + (split_op << m) + cut_op
    used = np.flatnonzero(np.bincount(variant, minlength=per * len(plans))).tolist()
    # the op's sends: after it (waited on where they block), or (rendezvous) not in it
    tail = () if step is not None else (("send", "wait") if blocking else ("send",))
    templates = {v: _slots(plans[v // per],
                           frozenset(kd for b, kd in enumerate(kinds) if v >> (m + b) & 1),
                           frozenset(kd for b, kd in enumerate(kinds) if v >> b & 1), tail)
                 for v in used}
    base = per * len(plans)  # rendezvous: plan p's message is templates base + 2p, + 2p + 1
    if step is not None:
        for p in sorted(set(plan_of.tolist())):
            if plans[p].send is not None:
                templates[base + 2 * p] = (("send",), ("wait",))
                templates[base + 2 * p + 1] = (("recv",),)
                used += [base + 2 * p, base + 2 * p + 1]
    sizes = np.zeros(base + 2 * len(plans), dtype=np.int64)
    starts = np.zeros(base + 2 * len(plans), dtype=np.int64)  # each template's first slot row
    rows: list[tuple[_Plan, tuple]] = []
    for v in used:
        sizes[v], starts[v] = len(templates[v]), len(rows)
        plan = plans[v // per] if v < base else plans[(v - base) // 2]
        rows.extend((plan, slot) for slot in templates[v])
    table = _slot_table(rows)
    has_send = np.array([p.send is not None for p in plans], dtype=bool)[plan_of]
    if step is None:
        offset, done, ext, row, op_kind, first_id, sig_rows, sig_of_row, keys = _LAID.get(
            ("sends", blocking, variant, sizes, starts, has_send, rank_at, kind, table.cls,
             *cols),
            lambda: _laid_out(variant, sizes, starts, has_send, cols, rank_at, kind,
                              table.cls, blocking))
        layout = ColumnarOps(order, plans, templates, variant, per, offset, ext, algo, done,
                             keys)
    else:
        sent_to = np.array([reps.index(p.send[0]) if p.send is not None else -1
                            for p in plans], dtype=np.int64)[plan_of]
        units, offset, done, ext, row, op_kind, first_id, sig_rows, sig_of_row, keys = \
            _LAID.get(("rendezvous", variant, sizes, starts, has_send, rank_at, kind,
                       table.cls, step, sent_to, plan_of, *cols),
                      lambda: _rendezvous(variant, sizes, starts, has_send, cols, rank_at,
                                          kind, table.cls, step, sent_to, plan_of,
                                          per * len(plans)))
        unit_variant, unit_op = units
        layout = ColumnarOps(itemgetter(*unit_op.tolist())(order) if len(unit_op) > 1
                             else tuple(order[j] for j in unit_op.tolist()), plans, templates,
                             unit_variant, per, offset, ext, algo, done, keys)
    if facts is not op_facts:
        def named_template(v: int) -> tuple[tuple, ...]:
            """Template ``v`` with its plan folded from its named segments."""
            p = v // per
            return _slots(replace(plans[p], folded=named[p]()),
                          frozenset(kd for b, kd in enumerate(kinds) if v >> (m + b) & 1),
                          frozenset(kd for b, kd in enumerate(kinds) if v >> b & 1), tail)

        layout.named = named_template
    layout.parts = (table, row, op_kind, sig_of_row,
                    layout.instructions_at(first_id.take(list(sig_rows))))
    return layout


def _named_fold(costs: CostModel, generic: Op, split: bool, collapse: Collapse,
                groups: Groups, folds: dict) -> Folded:
    """The fold of ``generic``'s named segments (:func:`op_facts`), remembered as the
    reference's are (:func:`folded_use`)."""
    return folded_use(op_facts(costs, generic, split)[0], collapse, groups, folds)[0]


def _op_structure(schedule: Schedule, order: Sequence[Op], fields: tuple[np.ndarray, ...]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """What :func:`lower_collapsed` reads of its ops' structure (``fields``, of the ops in
    ``order``): the position of each plan's first op (one plan per (stage, kind, sequence
    chunk), numbered by first use) and each op's plan; each op's pipeline rank; its
    producers' positions (-1: none)."""
    n = len(order)
    stage, kind, seq, at = fields
    triple = (stage * 3 + kind) * (int(seq.max(initial=0)) + 2) + (seq + 1)
    first = np.full(int(triple.max(initial=0)) + 1, n, dtype=np.int64)
    np.minimum.at(first, triple, np.arange(n))
    used_at = np.sort(first[first < n])
    number = np.zeros(len(first), dtype=np.int64)
    number[triple[used_at]] = np.arange(len(used_at))
    plan_of = number[triple]
    rank_at = np.asarray(schedule.stage_rank, dtype=np.int64)[stage]
    # the producer columns the symbolic run worked out, renumbered for this order
    found = producer_positions(schedule, order) if at is None else producers_at(schedule, at)
    cols = [np.asarray(col, dtype=np.int64) for col in found] if found is not None else []
    if found is None or any(col.max(initial=-1) >= n for col in cols):
        # not a schedule's ops, or producers missing (lowering takes validated ones)
        cols = [np.asarray(col, dtype=np.int64) for col in
                producers_by_op(schedule, order, {op: k for k, op in enumerate(order)})]
    return used_at, plan_of, rank_at, tuple(cols)


_STRUCTURE = EqualMemo(size=4, max_elements=1 << 18)
""":func:`_op_structure` of the last few schedules (kept with their ops' fields, each
schedule an immutable object shared by the runs of its (p, m, v),
:func:`workloads.registry.built_schedule`; a schedule is equal only to itself): a repeat or
another layout with the same pipeline reads its ops' plans, ranks and producers again
without the gathers, the unbuffered ``minimum.at`` and the producers' renumbering."""


_LAID = EqualMemo(size=8, max_elements=1 << 18, total_elements=1 << 19)
""":func:`_laid_out` of the last few structures (a repeat, or the same layout with other
costs, lays out the same ids and dependencies; so does a search's later layout of an
earlier one's schedule on the same ranks: GPT-3 175B TP4 PP16 with micro-batch 1 and TP8
PP16 with micro-batch 2, other layouts between them)."""


def _laid_out(variant: np.ndarray, sizes: np.ndarray, starts: np.ndarray,
              has_send: np.ndarray, cols: Sequence[np.ndarray], rank_at: np.ndarray,
              kind: np.ndarray, slot_cls: np.ndarray, blocking: bool = False) -> tuple:
    """The ids and dependencies of :func:`lower_collapsed`'s ops, from their structure
    alone: per op (its template ``variant``, each template's size and first slot row, whether
    it ends with a send, and with ``blocking`` the send's wait, its producers' positions
    ``cols``, its rank and kind code) its first id, the instruction completing it, what its
    first instruction waits for (what completes or delivers each producer); per instruction
    its slot row and op kind; per slot row its first instance and its signature (compute
    rows with an instance: ``slot_cls``), and the collectives' count."""
    count = sizes[variant]
    offset = np.cumsum(count) - count  # each op's first id
    # the instruction completing each op (the send's wait where sends block, the last)
    done = offset + count - 1 - (0 if blocking else has_send)
    # the send delivering its output
    arrived = np.where(has_send, offset + count - 1 - int(blocking), 0)
    ext = _producers(cols, rank_at, done, arrived)
    return (offset, done, ext, *_rows(variant, count, offset, starts, kind, slot_cls))


def _producers(cols: Sequence[np.ndarray], rank_at: np.ndarray, done: np.ndarray,
               arrived: np.ndarray) -> np.ndarray:
    """Per op, what its first instruction waits for: per producer (``cols``, positions, -1
    for none) the instruction completing it (``done``) on the op's rank, else the one
    delivering its output there (``arrived``)."""
    ext = np.full((len(rank_at), 3), -1, dtype=np.int64)
    for c, x in enumerate(cols):
        there = x >= 0
        safe = np.where(there, x, 0)
        ext[:, c] = np.where(there, np.where(rank_at[safe] == rank_at, done[safe],
                                             arrived[safe]), -1)
    return ext


def _rows(variant: np.ndarray, count: np.ndarray, offset: np.ndarray, starts: np.ndarray,
          kind: np.ndarray, slot_cls: np.ndarray) -> tuple:
    """Per instruction of units (ops, or rendezvous parts) of templates ``variant``, sizes
    ``count``, first ids ``offset`` and op kinds ``kind``: its slot row and op kind; per slot
    row its first instance and its signature; and the collectives' count
    (:func:`_laid_out`)."""
    total = int(count.sum())
    ids = np.arange(total, dtype=np.int64)
    # an instruction's slot row: its template's first row plus its place in its op (id
    # - the op's first id), the per-op terms repeated over the op's instructions (one
    # gather of n ops, not two of every instruction)
    row = np.repeat(starts[variant] - offset, count) + ids
    # compute timers read no id, name, dependency or micro-batch: one signature per slot row,
    # its representative the slot's first instance
    first_id = np.full(len(slot_cls), total, dtype=np.int64)
    np.minimum.at(first_id, row, ids)
    sig_rows = tuple(np.flatnonzero((slot_cls == COMPUTE) & (first_id < total)).tolist())
    sig_of_row = np.full(len(slot_cls), -1, dtype=np.int32)  # (the column laid from it: int32)
    sig_of_row[list(sig_rows)] = np.arange(len(sig_rows))
    return (row, np.repeat(kind, count), first_id, sig_rows, sig_of_row,
            int(np.count_nonzero(slot_cls[row] == COLLECTIVE)))


def _rendezvous(variant: np.ndarray, sizes: np.ndarray, starts: np.ndarray,
                has_send: np.ndarray, cols: Sequence[np.ndarray], rank_at: np.ndarray,
                kind: np.ndarray, slot_cls: np.ndarray, step: np.ndarray,
                sent_to: np.ndarray, plan_of: np.ndarray, base: int) -> tuple:
    """:func:`_laid_out` where each pipeline message is a rendezvous
    (:func:`~workloads.lowering.pipeline.emit_rendezvous`, the reference): the ops (in
    ``step`` order, their templates without sends) and, before the first op of the step
    after an op's (after the last op, for the last step's), the op's message as two units,
    send and wait on the sender's GPU (templates ``base + 2p``, p its plan) then the recv
    on the receiver's (``base + 2p + 1``), a step's activations first, each kind in op
    order. The send waits for the latest instruction of either GPU before it, the wait and
    the recv for the send; an op waits for its producer's wait (its own rank) or recv
    (``sent_to``, the receiver's rank). Returns (each unit's template and op), the units'
    first ids, the instruction completing each op, each unit's first instruction's
    dependencies, and :func:`_rows`'s."""
    n = len(variant)
    count = sizes[variant]
    msgs = np.flatnonzero(has_send)
    k = len(msgs)
    src = np.concatenate((np.arange(n), msgs, msgs))  # each unit's op
    what = np.repeat(np.arange(3), (n, k, k))  # op, send and wait, recv
    after = step[msgs] + 1
    grad = (kind[msgs] != KINDS[FORWARD]).astype(np.int64)
    # by step (messages before the step's ops), then messages by kind and op, ops by position
    perm = np.lexsort((what, src, np.concatenate((np.zeros(n, np.int64), grad, grad)),
                       np.concatenate((np.ones(n, np.int64), np.zeros(2 * k, np.int64))),
                       np.concatenate((step, after, after))))
    src, what = src[perm], what[perm]
    msg_t = base + 2 * plan_of[src] + (what == 2)
    unit_variant = np.where(what == 0, variant[src], msg_t)
    size = np.where(what == 0, count[src], 2 - (what == 2))
    offset = np.cumsum(size) - size
    end = offset + size - 1
    at = np.empty(len(src), dtype=np.int64)  # each unit's place
    at[perm] = np.arange(len(src))
    op_unit, send_unit, recv_unit = at[:n], at[n:n + k], at[n + k:]
    done = offset[op_unit] + size[op_unit] - 1
    done[msgs] = offset[send_unit] + 1  # the wait
    arrived = np.zeros(n, dtype=np.int64)
    arrived[msgs] = offset[recv_unit]
    ext = np.full((len(src), 3), -1, dtype=np.int64)
    ext[op_unit] = _producers(cols, rank_at, done, arrived)
    # the latest instruction of a GPU (a rank's) before a unit: its last unit there before it
    rank_of = np.where(what == 2, sent_to[src], rank_at[src])  # where each unit ends
    units = len(src)
    keys = np.sort(rank_of * units + np.arange(units))
    sender, receiver = rank_at[msgs], sent_to[msgs]
    for c, r in enumerate((sender, receiver)):
        j = np.searchsorted(keys, r * units + send_unit) - 1
        safe = np.maximum(j, 0)
        hit = (j >= 0) & (keys[safe] // units == r)
        ext[send_unit, c] = np.where(hit, end[keys[safe] % units], -1)
    ext[recv_unit, 0] = offset[send_unit]
    return ((unit_variant, src), offset, done, ext,
            *_rows(unit_variant, size, offset, starts, kind[src], slot_cls))


@dataclass(frozen=True)
class _Plan:
    """What every micro-batch of one (stage, kind, sequence chunk) emits (collapsed)."""

    rank: int
    gpu: int
    folded: Folded
    alloc: float
    free: float
    send: tuple[int, str, float, float] | None
    """(destination GPU, name suffix, duration, bytes) of its pipeline send, if any."""
    split_at: float | None
    """Where its compute may be split (:func:`emit_folded`) with one kind of collective:
    the head's compute time (None with leading collectives, or none inside)."""
    use: StreamUse
    """How it meets its communication streams (:func:`stream_use`)."""


def _by_rank(rank: np.ndarray) -> np.ndarray:
    """The stable sort of pipeline ranks (positions grouped by rank, each rank's in order):
    a radix sort on 16-bit keys where the ranks fit (numpy's stable sort of int64 is a
    merge sort: 0.59 -> 0.08 ms for GPT-3 175B's 6,144 ops), the same permutation."""
    small = not len(rank) or int(rank.max()) <= np.iinfo(np.uint16).max
    return np.argsort(rank.astype(np.uint16) if small else rank, kind="stable")


def _split_ops(plans: Sequence[_Plan], plan_of: np.ndarray, rank_at: np.ndarray,
               ranks: int, kinds: Sequence[str]) -> np.ndarray:
    """Per op (in lowering order), the kinds at whose first collective it is split
    (:func:`first_cuts`), bit ``b`` for ``kinds[b]``: where its compute up to there is
    shorter than what the rank's earlier closing collective of that kind may still take
    (``pending``, as the reference op loop keeps it per rank)."""
    n = len(plan_of)
    split_at = np.array([np.nan if p.split_at is None else p.split_at for p in plans])
    if not n or np.isnan(split_at).all():
        return np.zeros(n, dtype=np.int64)
    if len(kinds) == 1 and all(p.folded.trailing or p.folded.has_comm for p in plans):
        # one kind: split at its first collective, the head's end
        # after each op, pending is its closing collectives' time (or 0): before an op,
        # that of the rank's previous op
        after = np.array([p.folded.trailing_s if p.folded.trailing else 0.0 for p in plans])
        ops, previous = _RANK_NEXT.get((rank_at, plan_of), lambda: _rank_next(rank_at, plan_of))
        before = np.zeros(n)
        before[ops] = after[previous]
        at = split_at[plan_of]
        return np.where(np.isnan(at), False, before > np.nan_to_num(at)).astype(np.int64)
    # several kinds, or an op of pure compute among them: op by op, as the op loop
    pending: list[dict[str, float]] = [{} for _ in range(ranks)]
    bit = {kind: 1 << b for b, kind in enumerate(kinds)}
    out = np.zeros(n, dtype=np.int64)
    for k, p in enumerate(plan_of.tolist()):
        plan = plans[p]
        r = plan.rank
        out[k] = sum(bit[kind] for kind in first_cuts(plan.folded, pending[r]))
        pending[r] = pending_after(pending[r], plan.folded)
    return out


def _rank_next(rank_at: np.ndarray, plan_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each op with an earlier op on its rank (in lowering order), and that op's plan."""
    by_rank = _by_rank(rank_at)
    same = rank_at[by_rank[1:]] == rank_at[by_rank[:-1]]
    return by_rank[1:][same], plan_of[by_rank[:-1][same]]


_RANK_NEXT = EqualMemo(size=4, max_elements=1 << 18)
""":func:`_rank_next` of the last few op structures (their ranks and plans: a repeat, or a
sweep over one layout, reads them again; :func:`_op_structure` hands out the same arrays)."""


def _cut_ops(plans: Sequence[_Plan], plan_of: np.ndarray, rank_at: np.ndarray,
             cols: Sequence[np.ndarray], kinds: Sequence[str]) -> np.ndarray:
    """Per op (in lowering order), the kinds it cuts its compute at (:func:`stream_cuts`),
    bit ``b`` for ``kinds[b]``: an op whose last collective of a kind is folded, when the
    rank's next op with a collective of that kind leads with one and waits for no op of
    the rank from this one on (``cols``: the positions of its producers, -1 for none).
    :func:`_cut_ops_plain`'s bits, with the pairs of a rank's consecutive ops using a kind
    that do not wait on each other's rank (:func:`_next_users`) kept per structure and
    plans using the kind: only whether the later one leads and the earlier one folds
    is read per call."""
    n = len(plan_of)
    out = np.zeros(n, dtype=np.int64)
    for b, kind in enumerate(kinds):
        uses = np.array([kind in p.use.kinds for p in plans], dtype=bool)
        before, before_plan, after_plan = _NEXT_USERS.get(
            (uses, plan_of, rank_at, *cols),
            lambda uses=uses: _next_users(uses, plan_of, rank_at, cols))
        leads = np.array([kind in p.use.leading for p in plans], dtype=bool)
        folded = np.array([kind in p.use.folded_last for p in plans], dtype=bool)
        out[before[leads[after_plan] & folded[before_plan]]] |= 1 << b
    return out


def _next_users(uses: np.ndarray, plan_of: np.ndarray, rank_at: np.ndarray,
                cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ops whose plan ``uses`` a kind, each with the rank's next one that does, where that
    one waits for no op of the rank from the first on: the first ops, and both's plans."""
    latest = np.full(len(plan_of), -1, dtype=np.int64)  # per op, its latest producer on its rank
    for col in cols:
        safe = np.where(col >= 0, col, 0)
        latest = np.maximum(latest, np.where((col >= 0) & (rank_at[safe] == rank_at), col, -1))
    at = np.flatnonzero(uses[plan_of])
    at = at[_by_rank(rank_at[at])]  # per rank, in lowering order
    before, after = at[:-1], at[1:]
    pair = (rank_at[before] == rank_at[after]) & (latest[after] < before)
    before, after = before[pair], after[pair]
    return before, plan_of[before], plan_of[after]


_NEXT_USERS = EqualMemo(size=8, max_elements=1 << 18)
""":func:`_next_users` of the last few structures and kinds' users."""


def _cut_ops_plain(plans: Sequence[_Plan], plan_of: np.ndarray, rank_at: np.ndarray,
                   cols: Sequence[np.ndarray], kinds: Sequence[str]) -> np.ndarray:
    """:func:`_cut_ops` worked out whole on every call (the reference,
    ``tests/test_perf_columns.py``)."""
    n = len(plan_of)
    out = np.zeros(n, dtype=np.int64)
    latest = np.full(n, -1, dtype=np.int64)  # per op, its latest producer on its rank
    for col in cols:
        safe = np.where(col >= 0, col, 0)
        latest = np.maximum(latest, np.where((col >= 0) & (rank_at[safe] == rank_at), col, -1))
    for b, kind in enumerate(kinds):
        uses = np.array([kind in p.use.kinds for p in plans], dtype=bool)[plan_of]
        leads = np.array([kind in p.use.leading for p in plans], dtype=bool)[plan_of]
        folded = np.array([kind in p.use.folded_last for p in plans], dtype=bool)[plan_of]
        at = np.flatnonzero(uses)
        at = at[_by_rank(rank_at[at])]  # per rank, in lowering order
        before, after = at[:-1], at[1:]
        hit = ((rank_at[before] == rank_at[after]) & leads[after] & folded[before]
               & (latest[after] < before))
        out[before[hit]] |= 1 << b
    return out


def _slots(plan: _Plan, first: frozenset[str], cut: frozenset[str],
           tail: tuple[str, ...] = ("send",)) -> tuple[tuple, ...]:
    """An op's instructions in order (:func:`emit_folded`, then its send): ``("run",
    CommRun)``, ``("block", Block, alloc, free)`` and ``tail``'s where it sends: ``("send",)``
    and, where sends block, ``("wait",)`` (a rendezvous's templates: ``("send",),
    ("wait",)`` and ``("recv",)``, :func:`_rendezvous`)."""
    f = plan.folded
    out: list[tuple] = [("run", run) for run in f.leading]
    parts = f.split(split_points(f, first, cut))
    for i, part in enumerate(parts):
        if isinstance(part, Block):
            out.append(("block", part, plan.alloc if i == 0 else 0.0,
                        plan.free if i == len(parts) - 1 else 0.0))
        else:
            out += [("run", run) for run in part]
    out += [("run", run) for run in f.trailing]
    if plan.send is not None:
        out += [(x,) for x in tail]
    return tuple(out)


@dataclass(eq=False, repr=False)  # arrays (see sim.columnar._Plan)
class _SlotTable:
    """Per template slot row, the fields the engine reads (``kind`` of a compute op is its
    op's: see :meth:`kind_of`)."""

    names: tuple[str, ...]
    cls: np.ndarray
    gpu: np.ndarray
    kind: np.ndarray
    """Code of a run's or send's kind; -1 for compute (the op's kind: the first three names
    are F, B and W, coded as :data:`KINDS`)."""
    dst: np.ndarray
    fixed_s: np.ndarray
    blocking_s: np.ndarray
    comm: np.ndarray
    alloc: np.ndarray
    free: np.ndarray



def _slot_table(rows: Sequence[tuple[_Plan, tuple]]) -> _SlotTable:
    """The fields of every slot row (:class:`_SlotTable`)."""
    names = {k: i for i, k in enumerate((*KINDS, "pp"))}  # op kinds first, as KINDS
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
            assert not blk.parts  # without CP and EP, the only collectives in ops are TP's
            cls.append(COMPUTE)
            kind.append(-1)
            dst.append(-1)
            fixed.append(np.nan)
            blocking.append(blk.comm_s)
            comm.append(names.setdefault(blk.comm_kind, len(names)))
            alloc.append(slot[2])
            free.append(slot[3])
        elif what in ("wait", "recv"):  # a blocking send's zero-time waits
            assert plan.send is not None
            cls.append(COMPUTE)
            gpu[-1] = plan.gpu if what == "wait" else plan.send[0]
            kind.append(-1)
            dst.append(-1)
            fixed.append(np.nan)
            blocking.append(0.0)
            comm.append(names.setdefault("tp", len(names)))
            alloc.append(0.0)
            free.append(0.0)
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
    # GPUs and name codes as int32 (GPU ids far below 2**31): the program's columns laid
    # out from these take their type, half the bytes of int64 (1T: 4 x 3 MB -> 4 x 1.5 MB)
    return _SlotTable(tuple(names), np.array(cls, dtype=np.int8), np.array(gpu, dtype=np.int32),
                      np.array(kind, dtype=np.int32), np.array(dst, dtype=np.int32),
                      np.array(fixed, dtype=float), np.array(blocking, dtype=float),
                      np.array(comm, dtype=np.int32), np.array(alloc, dtype=float),
                      np.array(free, dtype=float))


_STRUCTURES = EqualMemo(size=8, max_elements=1 << 18, total_elements=1 << 19)
""":func:`_structure_with` of the last few structures (as :data:`_LAID`)."""


def _structure_with(table: _SlotTable, row: np.ndarray, op_kind: np.ndarray,
                    offset: np.ndarray, ext: np.ndarray, tail: Columns) -> tuple:
    """The structure of :meth:`ColumnarOps.columns_with`'s columns (names, ``cls``, ``gpu``,
    ``kind``, ``dst``, ``comm``, ``deps``) and the tail's codes renumbered: from the slot
    table's, each instruction's slot row and op kind, each op's first id and producers,
    and the tail's structure."""
    n, m = len(row), len(tail)
    names = (*table.names, *(x for x in tail.names if x not in table.names))
    code = {x: k for k, x in enumerate(names)}
    remap = np.array([code[x] for x in tail.names] + [-1], dtype=np.int64)

    def laid(values: np.ndarray, rest: np.ndarray) -> np.ndarray:
        out = np.empty(n + m, dtype=values.dtype)
        out[:n] = values.take(row)
        out[n:] = rest
        return out

    kind = laid(table.kind, remap[tail.kind])
    np.copyto(kind[:n], op_kind, where=kind[:n] < 0)  # a compute slot: its op's kind
    width = max(3, tail.deps.shape[1])
    # ids as 32-bit integers where they fit: half the bytes of the widest column (1T: 6 MB)
    deps = np.full((n + m, width), -1, dtype=np.int32 if n + m < 2**31 else np.int64)
    deps[:n, 0] = np.arange(-1, n - 1)  # each instruction waits for the one before ...
    deps[offset, :3] = ext  # ... but an op's first, for its producers
    deps[n:, :tail.deps.shape[1]] = tail.deps
    return (names, laid(table.cls, tail.cls), laid(table.gpu, tail.gpu), kind,
            laid(table.dst, tail.dst), laid(table.comm, remap[tail.comm]), deps, remap)


class ColumnarOps:
    """The op loop of a collapsed lowering on arrays (:func:`lower_collapsed`): its
    :class:`Columns`, and its instructions as objects on demand (:meth:`build`)."""

    def __init__(self, order: Sequence[Op], plans: Sequence[_Plan],
                 templates: Mapping[int, tuple[tuple, ...]], variant: np.ndarray, per: int,
                 offset: np.ndarray, ext: np.ndarray, algo: str, done: np.ndarray,
                 keys: int) -> None:
        self.order, self.plans, self.templates = order, plans, templates
        self.variant, self.offset, self.ext = variant, offset, ext
        """Per op: its template, its first id, what its first instruction waits for."""
        self.per = per
        """Templates per plan: template ``v`` is of plan ``v // per``."""
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
        self.named: Callable[[int], tuple[tuple, ...]] | None = None
        """Template ``v`` with its runs of collectives named, where :attr:`templates` holds
        them folded from unnamed segments (:func:`lower_collapsed`'s ``unnamed``); None:
        :attr:`templates` is named."""
        self._labels: dict[int, tuple[str | None, ...]] = {}

    def columns_with(self, tail: Columns) -> Columns:
        """The columns of this part's instructions followed by ``tail``'s (the step end,
        whose ids follow): laid out at their final size at once, the structure's
        (:func:`_structure_with`) kept for the last few structures."""
        table, row, op_kind, sig_of_row, signatures = self.parts
        n, m = len(row), len(tail)
        names, cls, gpu, kind, dst, comm, deps, remap = _STRUCTURES.get(
            (table.names, table.cls, table.gpu, table.kind, table.dst, table.comm, row,
             op_kind, self.offset, self.ext, tail.names, tail.cls, tail.gpu, tail.kind,
             tail.dst, tail.comm, tail.deps),
            lambda: _structure_with(table, row, op_kind, self.offset, self.ext, tail))

        def laid(values: np.ndarray, rest: np.ndarray) -> np.ndarray:
            out = np.empty(n + m, dtype=values.dtype)
            out[:n] = values.take(row)  # (np.take into out= buffers its result: slower)
            out[n:] = rest
            return out

        return Columns(names, cls, gpu, kind, dst, deps, laid(table.fixed_s, tail.fixed_s),
                       laid(table.blocking_s, tail.blocking_s), comm,
                       laid(table.alloc, tail.alloc_bytes), laid(table.free, tail.free_bytes),
                       laid(sig_of_row, np.where(tail.signature >= 0,
                                                 tail.signature + len(signatures), -1)),
                       (*signatures, *tail.signatures))

    def instruction(self, i: int) -> Instruction:
        """Instruction ``i`` as :meth:`build` builds it (but a collective's key: 0)."""
        k = int(self.offset.searchsorted(i, "right")) - 1
        at = i - int(self.offset[k])
        ops, _ = self._op(k, int(self.offset[k]), 0, at)
        return ops[at]

    def instructions_at(self, ids: np.ndarray) -> tuple[Instruction, ...]:
        """:meth:`instruction` of each of ``ids`` (the reference): their ops found in one
        search, and a compute op, wait or receive built alone, without going through its
        op's other slots (a collective through :meth:`_op`, for its key)."""
        ids = np.asarray(ids, dtype=np.int64)
        ks = (self.offset.searchsorted(ids, "right") - 1).tolist()
        firsts = self.offset.take(ks).tolist() if ks else []
        out: list[Instruction] = []
        for i, k, first in zip(ids.tolist(), ks, firsts, strict=True):
            at = i - first
            v = int(self.variant[k])
            slot = self.templates[v][at]
            if slot[0] not in ("block", "wait", "recv"):
                out.append(self._op(k, first, 0, at)[0][at])  # type: ignore[arg-type]
                continue
            st, kind, mb, seq = self.order[k]
            deps = tuple([d for d in self.ext[k].tolist() if d >= 0]) if not at else (i - 1,)
            out.append(_compute_slot(slot, i, self._plan_of(v), kind, _op_name(st, kind, mb, seq),
                                     deps, st, mb))
        return tuple(out)

    def _plan_of(self, v: int) -> _Plan:
        """The plan of template ``v``."""
        base = self.per * len(self.plans)
        return self.plans[v // self.per] if v < base else self.plans[(v - base) // 2]

    def labels(self, v: int) -> tuple[str | None, ...]:
        """Per slot of template ``v``, its run's label (None for another slot): from
        :attr:`named` where the template was folded unnamed (worked out on first use)."""
        found = self._labels.get(v)
        if found is None:
            slots = self.templates[v]
            if self.named is not None and v < self.per * len(self.plans):
                slots = self.named(v)
                assert [x[0] for x in slots] == [x[0] for x in self.templates[v]]
            found = self._labels[v] = tuple(x[1].label if x[0] == "run" else None
                                            for x in slots)
        return found

    def _op(self, k: int, i: int, key: int, only: int | None = None
            ) -> tuple[list[Instruction | None], int]:
        """Op ``order[k]``'s instructions, the first with id ``i``, collective keys from
        ``key``; and the next key. With ``only``, just its instruction at that position
        (the others None)."""
        new = tuple.__new__
        st, kind, mb, seq = self.order[k]
        v = int(self.variant[k])
        plan = self._plan_of(v)
        g = plan.gpu
        name = _op_name(st, kind, mb, seq)
        deps = tuple([d for d in self.ext[k].tolist() if d >= 0])
        out: list[Instruction | None] = []
        labels = None
        for j, slot in enumerate(self.templates[v]):
            what = slot[0]
            if only is not None and j != only:
                out.append(None)
                key += what == "run"
            elif what == "run":
                run = slot[1]
                if labels is None:
                    labels = self.labels(v)
                out.append(new(Collective, (i, g, run.kind, f"{name} {labels[j]}", deps, run.op,
                                            self.algo, (g,), run.nbytes, key, st, mb,
                                            run.duration_s, EQUAL_VOLUMES)))
                key += 1
            elif what == "send":
                dst, suffix, fixed, nbytes = plan.send  # type: ignore[misc]
                out.append(new(Send, (i, g, dst, nbytes, "pp", name + suffix, deps, st, mb,
                                      fixed)))
            else:
                out.append(_compute_slot(slot, i, plan, kind, name, deps, st, mb))
            deps = (i,)
            i += 1
        return out, key

    def build(self) -> tuple[Instruction, ...]:
        """Every instruction as an object, in id order: those of the reference op loop."""
        out: list[Instruction] = []
        key = 0
        for k, i in enumerate(self.offset.tolist()):
            ops, key = self._op(k, i, key)
            out.extend(ops)  # type: ignore[arg-type]  # (all built)
        return tuple(out)


def _op_name(st: int, kind: str, mb: int, seq: int) -> str:
    """An op's name, ``str(Op(st, kind, mb, seq))``."""
    return f"{st}{kind}{mb}" if seq == WHOLE else f"{st}{kind}{mb}.{seq}"


def _compute_slot(slot: tuple, i: int, plan: _Plan, kind: str, name: str,
                  deps: tuple[int, ...], st: int, mb: int) -> Compute:
    """Instruction ``i`` of a ``block`` slot (the op's folded compute), or of a ``wait`` or
    ``recv`` slot (a blocking send's wait on the sender, or its receive: a rendezvous's),
    of op ``name`` on ``plan``'s GPU."""
    new = tuple.__new__
    if slot[0] == "block":
        blk, alloc, free = slot[1], slot[2], slot[3]
        return new(Compute, (i, plan.gpu, kind, name, deps, blk.flops, 0.0, blk.compute_s,
                             blk.attn_flops, (), 0.0, blk.comm_s, blk.comm_kind, alloc, free,
                             st, mb))
    assert plan.send is not None
    on = plan.gpu if slot[0] == "wait" else plan.send[0]
    return new(Compute, (i, on, kind, f"{name} pp {slot[0]}", deps, 0.0, 0.0, 0.0, 0.0, (),
                         0.0, 0.0, "tp", 0.0, 0.0, st, mb))
