"""Passes 2 and 3 over the ops, the reference op loop: each op of the schedule, in
lowering order (:mod:`.order`), becomes its cost model's segments (compute kernels and
the TP/SP collectives between them) on every simulated GPU of its pipeline rank, after
what completes or delivers its producers there; then its pipeline sends
(:mod:`.pipeline`). Ops with DP markers, ring attention or EP all-to-alls go through
:class:`~workloads.lowering.pieces.PieceLowering`; collapsed, an op is folded
(:func:`~workloads.lowering.collapse.fold`) on the representative GPU.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from topologies.placement import Placement
from workloads.costs import CommSeg, Segment
from workloads.lowering.collapse import (
    Collapse,
    Folded,
    StreamUse,
    emit_folded,
    fold,
    folded_plan,
    stream_cuts,
    stream_use,
)
from workloads.lowering.groups import tp_groups
from workloads.lowering.opcosts import CostModel, op_facts, op_p2p_bytes
from workloads.lowering.pieces import PieceLowering
from workloads.lowering.pipeline import (
    Lanes,
    PipeSend,
    emit_rendezvous,
    emit_replica_sends,
    emit_sends,
    pipeline_sends,
    sends_block,
)
from workloads.program import ProgramBuilder
from workloads.schedules import BACKWARD, WEIGHT_GRAD, Op, Schedule, schedule_deps

Facts = tuple[tuple[Segment, ...], int, float, float]
"""An op's segments, how many compute, bytes allocated at its start and freed at its end
(:func:`~workloads.lowering.opcosts.op_facts`)."""


class OpLoop:
    """The op loop of one lowering (its mutable state): :meth:`run` lowers the ops.

    ``last[(k, g)]``: the instruction on GPU ``g`` that completes op ``order[k]``;
    ``sent[(k, g)]``: the send that delivers its output to ``g``.
    """

    def __init__(self, b: ProgramBuilder, schedule: Schedule, costs: CostModel,
                 placement: Placement, collapse: Collapse | None, lanes: Lanes,
                 piecewise: PieceLowering | None, final_ops: Collection[Op], zero3: bool,
                 overlap: bool, cp_or_ep: bool, gathering: Collection[Op] = (),
                 per_microbatch: bool = False, steps: Mapping[Op, int] | None = None,
                 once: bool = False, *, remember: bool = True) -> None:
        self.b, self.schedule, self.costs = b, schedule, costs
        self.placement, self.collapse, self.lanes = placement, collapse, lanes
        self.piecewise = piecewise
        """Lowers every op under ZeRO-3 (``zero3``: its parameter gathers) or with CP or EP
        (``cp_or_ep``), else (``overlap``: the gradient buckets) the final ops only, and
        the ``gathering`` ops (each stage's first forward under ``overlap_param_gather``);
        with ``per_microbatch`` (a ZeRO-2 that reduces every micro-batch) every backward;
        with ``once`` (ZeRO-3 gathered once a step, ``zero3_once_per_step``) the ``gathering``
        ops (each stage's first forward) and the final ops only."""
        self.final_ops = final_ops
        self.gathering = gathering
        self.once = once
        self.zero3, self.overlap = zero3 and not once, overlap
        self.per_microbatch = per_microbatch
        self.every_op = self.zero3 or cp_or_ep
        self.last: dict[tuple[int, int], int] = {}
        self.sent: dict[tuple[int, int], int] = {}
        self.pending: list[dict[str, float]] = [{} for _ in range(schedule.num_ranks)]
        """Per rank, see :func:`~workloads.lowering.collapse.emit_folded`."""
        # an op's work and memory do not depend on its micro-batch index: cached per
        # (stage, kind, sequence chunk)
        self.facts: dict[Op, Facts] = {}
        self.folds: dict[Op, Folded] = {}
        self.plans: dict[tuple, tuple] | None = {} if remember else None
        """:func:`~workloads.lowering.collapse.folded_plan`'s memo (this lowering's folds);
        None (the reference, ``lower(..., reference=True)``): each worked out afresh."""
        self.send_s: dict[tuple[int, int, float], float] = {}
        self.blocking = sends_block(getattr(costs, "pp_send_blocking", False), schedule)
        """Pipeline sends block their sender on this schedule
        (:func:`~workloads.lowering.pipeline.sends_block`,
        :func:`~workloads.lowering.pipeline.wait_for_sends`)."""
        self.steps = steps if self.blocking else None
        """Blocking sends on DeepSpeed's 1F1B: each op's DeepSpeed step
        (:func:`~workloads.lowering.pipeline.deepspeed_steps`, the caller's, which orders the
        ops by it); the ops come in step order
        (:func:`~workloads.lowering.pipeline.deepspeed_order`) and each step's messages are
        rendezvous of their sender and receiver
        (:func:`~workloads.lowering.pipeline.emit_rendezvous`). None: sends block their
        sender only."""
        self.chain: dict[int, int] = {}
        """With :attr:`steps`: each GPU's latest instruction."""
        self.whole_p2p = costs.p2p_bytes()
        feature_p2p = getattr(costs, "feature_p2p_bytes", None)
        self.feature_p2p = 0.0 if feature_p2p is None else float(feature_p2p())
        """A multimodal model's features' gradient, sent by the LLM's first backward."""
        self.cuts: dict[int, frozenset[str]] = {}
        """Collapsed: by position, the kinds whose last folded collective the op cuts its
        compute at (:func:`~workloads.lowering.collapse.stream_cuts`)."""

    def run(self, order: Sequence[Op], index: Mapping[Op, int]) -> None:
        """Lower ``order`` (the lowering order; ``index``: each op's position in it)."""
        schedule, owner = self.schedule, self.schedule.stage_rank
        groups_of = schedule.groups if order else {}
        if self.collapse is not None:
            self.cuts = self._stream_cuts(order, index)
        steps, step = self.steps, -1
        deferred: list[tuple[int, int, PipeSend]] = []
        for k, op in enumerate(order):
            r = owner[op.stage]
            if steps is not None and steps[op] != step:
                step = steps[op]
                emit_rendezvous(self.b, deferred, self.lanes, self.chain, self.last,
                                self.sent)
                deferred = []
            generic = Op(op.stage, op.kind, 0, op.seq)
            p2p = op_p2p_bytes(self.costs, generic, self.whole_p2p)
            facts = self.facts.get(generic)
            if facts is None:
                facts = self.facts[generic] = op_facts(self.costs, generic,
                                                       schedule.split_backward)
            local = [(index[dep], owner[dep.stage] == r) for dep in schedule_deps(schedule, op)]
            group = groups_of[op]  # a fused group (DualPipe F&B) sends at its end
            sends = (pipeline_sends(schedule, group, r, index, self.collapse, self.placement,
                                    self.send_s, p2p, self.feature_p2p)
                     if op == group[-1] else [])
            if steps is not None:
                deferred.extend((k, r, send) for send in sends)
                sends = []
            if self._piecewise(op):
                self._pieces(k, op, r, local, facts, sends)
            elif self.collapse is not None:
                self._folded(k, op, generic, r, local, facts, sends)
            else:
                self._full(k, op, r, local, facts, sends)
            if steps is not None:
                for lane in self.lanes[r]:
                    for g in lane:
                        self.chain[g] = self.last[(k, g)]
        emit_rendezvous(self.b, deferred, self.lanes, self.chain, self.last, self.sent)

    def _stream_cuts(self, order: Sequence[Op], index: Mapping[Op, int]
                     ) -> dict[int, frozenset[str]]:
        """:func:`~workloads.lowering.collapse.stream_cuts` of the ops in ``order``, each
        as it is lowered (plain, or in pieces with or without DP markers)."""
        schedule, owner, piecewise = self.schedule, self.schedule.stage_rank, self.piecewise
        uses: dict[tuple[Op, bool | None], StreamUse] = {}
        rows = []
        for k, op in enumerate(order):
            r = owner[op.stage]
            generic = Op(op.stage, op.kind, 0, op.seq)
            marked = None
            if self._piecewise(op):
                marked = self._marked(op)
            use = uses.get((generic, marked))
            if use is None:
                if marked is None:
                    facts = self.facts.get(generic)
                    if facts is None:
                        facts = self.facts[generic] = op_facts(self.costs, generic,
                                                               schedule.split_backward)
                    use = stream_use([facts[0]])
                else:
                    assert piecewise is not None
                    use = piecewise.stream_use(op, marked)
                uses[(generic, marked)] = use
            latest = max((index[dep] for dep in schedule_deps(schedule, op)
                          if owner[dep.stage] == r), default=-1)
            rows.append((k, r, use, latest))
        return stream_cuts(rows)

    def _piecewise(self, op: Op) -> bool:
        """Whether ``op`` is lowered piece by piece (:attr:`piecewise`, which says which)."""
        return self.piecewise is not None and (
            self.every_op or op in self.final_ops or op in self.gathering or self._reduces(op))

    def _reduces(self, op: Op) -> bool:
        """Whether ``op`` reduce-scatters the gradients it completes itself: a backward (B or
        W) under a ZeRO-2 that reduces every micro-batch."""
        return self.per_microbatch and op.kind in (BACKWARD, WEIGHT_GRAD)

    def _marked(self, op: Op) -> bool:
        """Whether ``op`` is lowered with its DP markers: every op under ZeRO-3, the final
        ops with gradient buckets, every backward under a ZeRO-2 that reduces every
        micro-batch, the ops that gather the step's parameters (and under ``once`` the final
        ops, which reduce-scatter)."""
        return (self.zero3 or ((self.overlap or self.once) and op in self.final_ops)
                or self._reduces(op) or op in self.gathering)

    def _deps(self, g: int, local: Sequence[tuple[int, bool]]) -> tuple[int, ...]:
        """What op's first instruction on GPU ``g`` waits for: per producer (its position,
        whether on this rank) the instruction completing it there or the send delivering it."""
        last, sent = self.last, self.sent
        return tuple([last[(j, g)] if same else sent[(j, g)] for j, same in local])

    def _pieces(self, k: int, op: Op, r: int, local: Sequence[tuple[int, bool]], facts: Facts,
                sends: Sequence[PipeSend]) -> None:
        """An op with markers, ring attention or all-to-alls (:class:`PieceLowering`)."""
        assert self.piecewise is not None
        _, _, alloc, free = facts
        prev = {g: self._deps(g, local) for lane in self.lanes[r] for g in lane}
        self.piecewise.emit(k, op, r, prev, alloc, free, self.last, self.pending,
                            marked=self._marked(op),
                            cut=self.cuts.get(k, frozenset()))
        emit_sends(self.b, sends, self.lanes, r, k, self.last, self.sent, self.blocking)

    def _folded(self, k: int, op: Op, generic: Op, r: int, local: Sequence[tuple[int, bool]],
                facts: Facts, sends: Sequence[PipeSend]) -> None:
        """Collapsed: the op folded on the representative GPU, then its sends."""
        assert self.collapse is not None
        segs, _, alloc, free = facts
        (g,) = self.lanes[r][0]
        folded = self.folds.get(generic)
        if folded is None:
            folded = self.folds[generic] = fold(segs, self.collapse.on(g),
                                                tp_groups(self.placement, r))
        cut = self.cuts.get(k, frozenset())
        parts, after = folded_plan(folded, self.pending[r], cut, True, self.plans)
        self.last[(k, g)] = emit_folded(self.b, g, op, str(op), folded, self._deps(g, local),
                                        alloc, free, self.pending[r], cut, parts)
        self.pending[r] = after
        emit_replica_sends(self.b, sends, self.lanes, r, 0, k, self.last, self.sent,
                           self.blocking)

    def _full(self, k: int, op: Op, r: int, local: Sequence[tuple[int, bool]], facts: Facts,
              sends: Sequence[PipeSend]) -> None:
        """Every replica of rank ``r`` in turn: the op's segments on each of its TP lanes
        (collectives over the TP group, compute on each GPU; the op's memory allocated with
        its first compute segment and freed with its last), then that replica's sends."""
        b, last = self.b, self.last
        segs, n_compute, alloc, free = facts
        op_name = str(op)
        # per segment what every replica's copy shares: a collective's name, a compute op's
        # label and its fields after deps (ProgramBuilder.work)
        shared: list[tuple[str, tuple | None]] = []
        seen_compute = 0
        for seg in segs:
            if isinstance(seg, CommSeg):
                shared.append((f"{op_name} {seg.label}", None))
                continue
            seen_compute += 1
            shared.append((op_name if seen_compute == 1 else seg.label, b.work(
                flops=seg.flops, hbm_bytes=seg.hbm_bytes, duration_s=seg.duration_s,
                attn_flops=seg.attn_flops, gemm_dims=seg.gemm_dims,
                elementwise_bytes=seg.elementwise_bytes, stage=op.stage, mb=op.mb,
                alloc_bytes=alloc if seen_compute == 1 else 0.0,
                free_bytes=free if seen_compute == n_compute else 0.0)))
        chain = getattr(b, "chain", None)  # a packed builder adds the segments at once
        steps = [] if chain is None else [
            (op.kind, name, work, None) if work is not None else
            b.collective_step(seg.kind, name, seg.op, seg.nbytes, stage=op.stage,  # type: ignore
                              mb=op.mb, duration_s=seg.duration_s)
            for seg, (name, work) in zip(segs, shared, strict=True)]
        for d, gpus in enumerate(self.lanes[r]):
            prev = {g: self._deps(g, local) for g in gpus}
            if chain is not None and segs:
                end = chain(gpus, prev, steps)
                for t, g in enumerate(gpus):
                    last[(k, g)] = end + t
                emit_replica_sends(b, sends, self.lanes, r, d, k, last, self.sent,
                                   self.blocking)
                continue
            for seg, (name, work) in zip(segs, shared, strict=True):
                if work is None:
                    ids = b.collective(tuple(gpus), prev, kind=seg.kind, name=name,
                                       op=seg.op, nbytes=seg.nbytes, stage=op.stage, mb=op.mb,
                                       duration_s=seg.duration_s)
                else:
                    ids = b.compute_each(gpus, op.kind, name, prev, work)
                prev = {g: (ids[g],) for g in gpus}
            if segs:
                for g in gpus:
                    last[(k, g)] = prev[g][0]
            emit_replica_sends(b, sends, self.lanes, r, d, k, last, self.sent, self.blocking)
