"""Ops that are more than a chain of compute and TP collectives, cut at their markers:
ZeRO-3's per-layer parameter gathers and gradient reduce-scatters and the gradient
buckets of ``overlap_grad_reduce`` (pass 4 inside the ops), context parallelism's ring
attention and MoE all-to-alls over EP groups (pass 3); see :class:`PieceLowering`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, GradReady, ParamGather, RingAttention, Segment
from workloads.lowering.collapse import (
    Collapse,
    Folded,
    StreamUse,
    emit_folded,
    fold,
    folded_plan,
    stream_use,
    with_all_to_all,
)
from workloads.lowering.grads import grad_op
from workloads.lowering.groups import (
    ALL_TO_ALL_ALGO,
    Groups,
    cp_groups,
    dp_groups,
    ep_groups,
    etp_groups,
    expert_replicas,
    rank_expert_groups,
    tp_groups,
)
from workloads.lowering.opcosts import CostModel
from workloads.lowering.pipeline import Lanes
from workloads.program import Collective, Compute, ProgramBuilder
from workloads.schedules import Op, Schedule


@dataclass(frozen=True)
class Piece:
    """A run of an op's segments between DP markers: the parameters it needs gathered
    first (ZeRO-3), its compute and TP collectives, the gradients it finishes."""

    gather: ParamGather | None
    segs: tuple[Segment, ...]
    ready: tuple[GradReady, ...]
    compute_before: int
    """Compute segments of the op before this piece (for where memory is allocated/freed)."""

    @cached_property
    def num_compute(self) -> int:
        """Compute segments of this piece (counted once: a piece is lowered for every
        micro-batch of its op)."""
        return sum(isinstance(seg, ComputeSeg) for seg in self.segs)

    @cached_property
    def runs(self) -> tuple[tuple[tuple[Segment, ...], int], ...]:
        """:func:`ring_runs` of its segments, each with its compute segments' count (worked
        out once)."""
        return tuple((tuple(run), sum(isinstance(seg, ComputeSeg) for seg in run))
                     for run in ring_runs(self.segs))


TEMPLATE_CACHE = 1024
"""Op shapes whose instructions :class:`PieceLowering` keeps (it starts over past this many)."""

_UNFIT = object()
"""An op shape :class:`PieceLowering` always emits afresh (:meth:`PieceLowering._template`)."""


def ring_runs(segs: Sequence[Segment]) -> list[list[Segment]]:
    """A piece's segments as a collapsed lowering folds them: the runs between ring
    attentions (:func:`~workloads.lowering.collapse.fold` each) and each ring attention
    alone."""
    runs: list[list[Segment]] = [[]]
    for seg in segs:
        if isinstance(seg, RingAttention):
            runs += [[seg], []]
        else:
            runs[-1].append(seg)
    return [run for run in runs if run]


def split_pieces(segs: Sequence[Segment]) -> tuple[Piece, ...]:
    """Cut an op's marked segments into pieces: a :class:`ParamGather` opens a piece, a
    :class:`GradReady` closes one (the segments after it start the next)."""
    pieces: list[Piece] = []
    gather: ParamGather | None = None
    body: list[Segment] = []
    ready: list[GradReady] = []
    before = 0

    def close() -> None:
        nonlocal gather, body, ready, before
        if gather is not None or body or ready:
            piece = Piece(gather, tuple(body), tuple(ready), before)
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


class PieceLowering:
    """Lowers ops that are more than a chain of compute and TP collectives (mutable state
    of one lowering pass): DP collectives inside ops and context-parallel ring attention.

    ZeRO-3 (Rajbhandari et al. 2020, sec. 5.3 and 7.2; PyTorch FSDP): before
    each piece (a layer, the head) its parameters are all-gathered over the DP
    group on the ``dp`` stream, issued one piece ahead (the gather for piece
    n+1 waits only for piece n-1 to end, so it overlaps piece n; the first
    piece of the rank's next op is prefetched during the last piece of this
    one); after each piece's backward its gradients are reduce-scattered.
    Every micro-batch gathers again and reduce-scatters its own gradients. A ZeRO-2 that
    reduces every micro-batch (``per_microbatch``: PyTorch FSDP without ``no_sync``,
    DeepSpeed's stage 2) reduce-scatters the same per-layer units in every backward, with
    no gathers.

    ``overlap_grad_reduce`` (Megatron-LM's ``--overlap-grad-reduce``, PyTorch
    DDP buckets, Li et al. 2020): in the last backward (or W) of each stage,
    gradients fill buckets of ``grad_bucket_bytes`` in backward order; a full
    bucket is reduced (all-reduce, or reduce-scatter under ZeRO-1/2) as soon as
    the piece that completes it ends; the remainder goes when the op ends. With
    ``grad_buckets_stage0_only`` (Megatron-core's DDP) only stage 0 is bucketed: every
    other stage is one bucket, reduced when its last backward ends.

    ``overlap_param_gather`` (Megatron-core's distributed optimizer, core r0.8.0
    megatron/core/optimizer/distrib_optimizer.py): the step's first forward of each stage
    gathers its parameters bucket by bucket, each all-gather dispatched when the forward
    waits for the one before (``_finish_param_sync_helper``), the first at the step's start
    (``zero_grad``); a rank's model chunks are one chain in forward order, so the next
    chunk's gather (``gather_chain``) is dispatched when the forward reaches the last
    bucket of the chunk before. Stage 0 is bucketed by layer, every other stage is one
    bucket (:meth:`~workloads.transformer.TransformerCosts._stage_gather`).

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
    group (ep consecutive DP ranks; with an expert TP size of its own, the expert grid's,
    :func:`ep_groups`); with ``overlap_grad_reduce`` the expert
    gradients fill their own buckets, reduced over the replicas holding the
    same experts (:func:`expert_groups`).
    """

    def __init__(self, b: ProgramBuilder, schedule: Schedule, costs: CostModel,
                 placement: Placement, zero_stage: int, collapse: Collapse | None,
                 lanes: Lanes, gather_chain: Mapping[Op, Op] | None = None,
                 per_microbatch: bool = False, once: bool = False, *,
                 remember: bool = True) -> None:
        self.b, self.costs, self.placement = b, costs, placement
        self.gather_chain = gather_chain or {}
        """``overlap_param_gather``: per first forward of a stage, the next one on its rank
        (:func:`~workloads.lowering.order.gather_chain`), whose gather it dispatches."""
        self.collapse = None if collapse is None else with_all_to_all(collapse)
        self.schedule, self.lanes = schedule, lanes
        self.zero3 = zero_stage == 3
        self.prefetch_next = self.zero3 and not once
        """ZeRO-3 per op: an op's last piece gathers the next op's first unit; not with
        ``once`` (``zero3_once_per_step``: only a stage's first forward gathers, from its
        start)."""
        self.per_unit = self.zero3 or per_microbatch
        """Each gradient unit reduce-scattered as its backward finishes it (ZeRO-3, and a ZeRO-2
        that reduces every micro-batch), not in buckets of the step's last backward."""
        self.grad_op = grad_op(zero_stage)
        self.bucket_bytes = float(getattr(costs, "grad_bucket_bytes", 25e6))
        self.stage0_only = bool(getattr(costs, "grad_buckets_stage0_only", False))
        """Only stage 0 is cut into buckets; every other stage is one (Megatron-core)."""
        self.tp = placement.degree("tp")
        self.ep = int(getattr(costs, "ep", 1))
        self.etp: int | None = getattr(costs, "expert_tp", None)
        """Expert TP degree (None: the TP degree)."""
        self.expert_replicas = expert_replicas(placement, self.ep, self.etp)
        """GPUs holding the same expert shards (the expert-data-parallel group size)."""
        self.next_op = {op: ops[i + 1] for ops in schedule.rank_ops
                        for i, op in enumerate(ops[:-1])}
        self.cache: dict[tuple[Op, bool], tuple[Piece, ...]] = {}
        self.fold_cache: dict[tuple, Folded] = {}
        self.templates: dict[tuple, tuple | object] | None = {} if remember else None
        """Collapsed ops without DP markers, by shape: what :meth:`emit` emitted for the last
        one (:meth:`_template`), repeated for the next (:meth:`_replay`); None (the
        reference): every op emitted afresh."""
        self.plans: dict[tuple, tuple] | None = {} if remember else None
        """:func:`~workloads.lowering.collapse.folded_plan`'s memo (this lowering's folds);
        None (the reference, ``lower(..., reference=True)``): each worked out afresh."""
        self.prefetched: dict[Op, dict[int, tuple[int, ...]]] = {}
        """Gathers issued ahead for the first piece of an op, by GPU."""
        self.ends: dict[int, list[int]] = {}
        """Per GPU, the ends of its last two pieces."""
        self.dp_last: dict[int, int] = {}
        """Per GPU, its last DP collective issued during the ops."""
        self.reduced: set[int] = set()
        """Stages whose gradients were reduced during their ops (none left for the step end)."""
        self.cp_group: dict[int, tuple[int, ...]] = {}
        """All-gather CP: each GPU's CP group (``placement.group("cp", g)``, kept)."""
        cp = placement.degree("cp")
        self.ring_next = {g: placement.gpu(**{**placement.coords(g),
                                              "cp": (placement.coords(g)["cp"] + 1) % cp})
                          for g in range(placement.num_gpus)} if cp > 1 else {}
        self.ring_pairs: dict[int, tuple[tuple[int, int], ...]] = {}
        """Ring CP: pipeline rank ``r``'s (GPU, next GPU) pairs of one pass, kept per rank."""

    def _etp_groups(self, r: int) -> Groups:
        """The expert-TP groups of pipeline rank ``r`` (:func:`etp_groups`; none without an
        expert TP degree of its own, whose collectives then run over the TP groups)."""
        if self.etp is None:
            return ()
        return etp_groups(self.placement, r, self.ep, self.etp)

    def pieces(self, op: Op, marked: bool) -> tuple[Piece, ...]:
        """``op``'s segments (``marked``: with its DP markers) cut into pieces, cached per
        (stage, kind, sequence chunk)."""
        generic = Op(op.stage, op.kind, 0, op.seq)
        hit = self.cache.get((generic, marked))
        if hit is None:
            split = self.schedule.split_backward
            segs = self.costs.op_segments(generic, split, markers=True) if marked else \
                self.costs.op_segments(generic, split)
            hit = self.cache[(generic, marked)] = split_pieces(segs)
        return hit

    def stream_use(self, op: Op, marked: bool) -> StreamUse:
        """How ``op`` (``marked``: with its DP markers) meets its communication streams
        collapsed (:func:`~workloads.lowering.collapse.stream_use`): its pieces' runs."""
        return stream_use([run for piece in self.pieces(op, marked) if piece.segs
                           for run in ring_runs(piece.segs)])

    def _cut_runs(self, op: Op, marked: bool, cut: frozenset[str]
                  ) -> dict[tuple[int, int], frozenset[str]]:
        """Where ``cut`` (the kinds to cut at their last collective of ``op``) applies: by
        (piece, run), the kinds whose last collective that run holds."""
        where: dict[str, tuple[int, int]] = {}
        for n, piece in enumerate(self.pieces(op, marked)):
            for i, run in enumerate(ring_runs(piece.segs)):
                for seg in run:
                    if isinstance(seg, CommSeg) and seg.kind in cut:
                        where[seg.kind] = (n, i)
        out: dict[tuple[int, int], frozenset[str]] = {}
        for kind, at in where.items():
            out[at] = out.get(at, frozenset()) | {kind}
        return out

    # ---------------------------------------------------------------- DP collectives
    def _dp(self, r: int, deps: Mapping[int, tuple[int, ...]], name: str, op: str,
            nbytes: float, stage: int, mb: int) -> dict[int, int]:
        """One DP collective per TP lane of pipeline rank ``r``."""
        return self._dp_groups(r, dp_groups(self.placement, r), deps, name, op, nbytes, stage,
                               mb)

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
        return self._gather_after(r, op, gather, deps)

    def _gather_after(self, r: int, op: Op, gather: ParamGather,
                      deps: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
        """All-gather ``gather`` (for ``op``) after ``deps``; the ids by GPU."""
        ids = self._dp(r, deps, f"{op} {gather.label} all_gather", "all_gather",
                       gather.nbytes, op.stage, op.mb)
        out = {g: (i,) for g, i in ids.items()}
        if gather.expert_nbytes > 0 and self.expert_replicas > 1:
            more = self._expert_dp(r, deps, f"{op} {gather.label} experts all_gather",
                                   "all_gather", gather.expert_nbytes, op.stage, op.mb)
            out = {g: out[g] + (more[g],) for g in out}
        return out

    def _chain(self, r: int, nxt: Op, reached: Mapping[int, tuple[int, ...]],
               gpus: Sequence[int]) -> None:
        """Dispatch ``nxt``'s first gather once the forward has ``reached`` the piece whose
        gather it waits for (Megatron-core's forward pre-hook dispatches the next bucket's
        all-gather as it waits for this one)."""
        pieces = self.pieces(nxt, True)
        first = pieces[0].gather if pieces else None
        if first is not None:
            self.prefetched[nxt] = self._gather_after(r, nxt, first,
                                                      {g: reached[g] for g in gpus})

    def _end_piece(self, g: int, end: int) -> None:
        ends = self.ends.setdefault(g, [])
        ends.append(end)
        del ends[:-2]

    # ---------------------------------------------------------------- one op
    def emit(self, k: int, op: Op, r: int, prev: dict[int, tuple[int, ...]], alloc: float,
             free: float, last: dict[tuple[int, int], int], pending: list[dict[str, float]],
             marked: bool, cut: frozenset[str] = frozenset()) -> None:
        """Emit ``op`` (position ``k`` of the lowering order) on every simulated GPU of
        rank ``r``, starting after ``prev[g]``; its last instruction goes to ``last``.
        ``marked``: with its DP markers (ZeRO-3, or the bucketed final backward); ``cut``
        (collapsed): the kinds whose last collective the op cuts its compute at
        (:func:`~workloads.lowering.collapse.emit_folded`)."""
        shape = None
        if (self.templates is not None and self.collapse is not None and not marked
                and not self.prefetch_next and op not in self.prefetched):
            # an op without DP markers, collapsed: its instructions are those of the last op
            # of its shape, renumbered (:meth:`_replay`)
            shape = (Op(op.stage, op.kind, 0, op.seq), cut, tuple(pending[r].items()), alloc,
                     free, tuple(map(len, prev.values())))
            template = self.templates.get(shape)
            if template is not None:
                if template is not _UNFIT:
                    self._replay(template, k, op, r, prev, last, pending)
                    return
                shape = None
            else:
                start, first_key = self.b.next_id, self.b._next_key
        pieces = self.pieces(op, marked)
        cuts = self._cut_runs(op, marked, cut) if cut else {}
        total = sum(piece.num_compute for piece in pieces)
        gpus = list(prev)
        initial = prev[gpus[0]] if shape is not None else ()
        ahead = self.prefetched.pop(op, None)
        bucket, n_buckets = 0.0, 0
        expert_bucket, n_expert = 0.0, 0
        size = self.bucket_bytes if op.stage == 0 or not self.stage0_only else float("inf")
        chained = self.gather_chain.get(op) if marked else None
        last_gather = max((n for n, piece in enumerate(pieces) if piece.gather is not None),
                          default=-1)
        for n, piece in enumerate(pieces):
            if piece.gather is not None and ahead is None:
                ahead = self._gather(r, op, piece.gather, gpus, 2)
            gathered, ahead = ahead, None
            if chained is not None and n == last_gather:
                self._chain(r, chained, prev, gpus)
            follow = pieces[n + 1].gather if n + 1 < len(pieces) else None
            if follow is not None:
                ahead = self._gather(r, op, follow, gpus, 1)
            elif n + 1 == len(pieces) and self.prefetch_next and op in self.next_op:
                nxt = self.next_op[op]
                first = self.pieces(nxt, True)[0].gather if self.pieces(nxt, True) else None
                if first is not None:
                    self.prefetched[nxt] = self._gather(r, nxt, first, gpus, 1)
            if gathered is not None:
                prev = {g: prev[g] + gathered[g] for g in gpus}
            if piece.segs:
                prev = self._emit_body(op, (n, marked), piece, r, prev, alloc, free, total,
                                       pending, n + 1 == len(pieces),
                                       {i: kinds for (m, i), kinds in cuts.items() if m == n})
                for g in gpus:
                    self._end_piece(g, prev[g][0])
            for ready in piece.ready:
                if self.per_unit:
                    self._dp(r, prev, f"{op} {ready.label} reduce_scatter", "reduce_scatter",
                             ready.nbytes, op.stage, op.mb)
                    if ready.expert_nbytes > 0 and self.expert_replicas > 1:
                        self._expert_dp(r, prev, f"{op} {ready.label} experts reduce_scatter",
                                        "reduce_scatter", ready.expert_nbytes, op.stage, op.mb)
                    continue
                bucket += ready.nbytes
                while bucket >= size:
                    self._bucket(r, op, prev, size, n_buckets)
                    bucket -= size
                    n_buckets += 1
                expert_bucket += ready.expert_nbytes if self.expert_replicas > 1 else 0.0
                while expert_bucket >= size:
                    self._bucket(r, op, prev, size, n_expert, expert=True)
                    expert_bucket -= size
                    n_expert += 1
        if not self.per_unit and any(piece.ready for piece in pieces):
            if bucket > 0.5:  # bytes: what float sums leave over is not a bucket
                self._bucket(r, op, prev, bucket, n_buckets)
            if expert_bucket > 0.5:
                self._bucket(r, op, prev, expert_bucket, n_expert, expert=True)
            self.reduced.add(op.stage)
        if marked and (self.zero3 or (self.per_unit and any(piece.ready for piece in pieces))):
            self.reduced.add(op.stage)
        for g in gpus:
            last[(k, g)] = prev[g][0]
        if shape is not None:
            if len(self.templates) >= TEMPLATE_CACHE:
                self.templates.clear()
            self.templates[shape] = self._template(op, pieces, gpus[0], start, first_key,
                                                   initial, last[(k, gpus[0])], pending[r])

    def _template(self, op: Op, pieces: Sequence[Piece], g: int, start: int, first_key: int,
                  initial: tuple[int, ...], end: int, pending: dict[str, float]
                  ) -> tuple | object:
        """What :meth:`emit` just emitted for ``op`` on GPU ``g`` (ids from ``start``,
        collective keys from ``first_key``, after ``initial``), as :meth:`_replay` repeats it
        for another op of its shape (which has as many producers): each instruction with its
        dependencies (whether all of ``initial`` first, then offsets of the op's own
        instructions), its name as the op's name and what follows it (or a label of its
        own); the ends of its pieces, its last
        instruction, and the rank's pending collectives after it. :data:`_UNFIT` where any of
        that does not hold (an op with DP work, a send, a dependency on anything but its
        producers, all of them first, and its own instructions): such an op is always
        emitted afresh."""
        if any(piece.gather is not None or piece.ready for piece in pieces):
            return _UNFIT
        b, op_name = self.b, str(op)
        emitted = b.instructions[start - b.first_id:]
        # the ends a piece adds (self.ends keeps a GPU's last two)
        pieces_ends = min(sum(1 for piece in pieces if piece.segs), 2)
        ends = self.ends.get(g, [])[len(self.ends.get(g, [])) - pieces_ends:]
        if not emitted or end < start or any(e < start for e in ends):
            return _UNFIT
        rows = []
        key = first_key
        n = len(initial)
        for ins in emitted:
            t = type(ins)
            if t not in (Compute, Collective) or ins.gpu != g or ins.mb != op.mb:
                return _UNFIT
            # after the op's producers (all of initial, first) and its own instructions
            after = n > 0 and ins.deps[:n] == initial
            own = ins.deps[n:] if after else ins.deps
            if any(d < start for d in own):
                return _UNFIT
            deps = (after, tuple(d - start for d in own))
            name = ins.name
            if name == op_name or name.startswith(op_name + " "):
                name = name[len(op_name):]
                named = True
            else:
                named = False
            if t is Collective:
                if ins.key != key:
                    return _UNFIT
                key += 1
            rows.append((ins, deps, named, name))
        return tuple(rows), tuple(e - start for e in ends), end - start, pending

    def _replay(self, template: tuple, k: int, op: Op, r: int,
                prev: dict[int, tuple[int, ...]], last: dict[tuple[int, int], int],
                pending: list[dict[str, float]]) -> None:
        """Emit ``op`` as the op :meth:`_template` recorded (of the same shape: (stage, kind,
        sequence chunk), cut, the rank's pending collectives, memory): the same
        instructions but for their ids, dependencies before the op (``prev``), names, micro-
        batch and collective keys, which are ``op``'s; the same pieces' ends, last
        instruction and pending collectives after it. What :meth:`emit` would emit:
        everything else it reads is a function of that shape (folds, splits, timings), and
        ``lower(..., reference=True)`` emits every op afresh
        (``tests/test_differential.py``)."""
        rows, piece_ends, end, after = template
        b = self.b
        (g,) = prev
        initial = prev[g]
        start = b.next_id
        op_name, mb = str(op), op.mb
        new, append = tuple.__new__, b.instructions.append
        i = start
        for ins, (after_initial, own), named, name in rows:
            deps = tuple([start + d for d in own])
            if after_initial:
                deps = initial + deps
            if named:
                name = op_name + name
            if type(ins) is Compute:
                append(new(Compute, (i, ins[1], ins[2], name, deps, *ins[5:16], mb)))
            else:
                append(new(Collective, (i, ins[1], ins[2], name, deps, ins[5], ins[6], ins[7],
                                        ins[8], b.new_key(), ins[10], mb, ins[12], ins[13])))
            i += 1
        for e in piece_ends:
            self._end_piece(g, start + e)
        pending[r] = after
        last[(k, g)] = start + end

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
        """A collective over each expert-data-parallel group of rank ``r`` (MoE, experts
        apart)."""
        groups = rank_expert_groups(self.placement, r, self.ep, self.etp)
        return self._dp_groups(r, groups, deps, name, op, nbytes, stage, mb)

    def _emit_body(self, op: Op, key: tuple, piece: Piece, r: int,
                   prev: dict[int, tuple[int, ...]], alloc: float, free: float, total: int,
                   pending: list[dict[str, float]], is_last: bool,
                   cuts: Mapping[int, frozenset[str]]) -> dict[int, tuple[int, ...]]:
        """A piece's compute, TP collectives and ring attention; each GPU's last instruction.

        Memory: ``alloc`` goes with the op's first compute segment, ``free`` with its
        last (of ``total``). ``cuts`` (collapsed): by run, the kinds it cuts its compute at
        (:meth:`_cut_runs`)."""
        if self.collapse is not None:
            return self._emit_collapsed(op, key, piece, r, prev, alloc, free, total, pending,
                                        is_last, cuts)
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
                for group in ep_groups(self.placement, r, self.ep, self.etp):
                    ids = b.collective(group, {g: cur[g] for g in group}, kind=seg.kind,
                                       name=f"{op_name} {seg.label}", op=seg.op,
                                       nbytes=seg.nbytes, stage=op.stage, mb=op.mb,
                                       algo=ALL_TO_ALL_ALGO, skew=seg.skew,
                                       duration_s=seg.duration_s)
                    for g in group:
                        cur[g] = (ids[g],)
                continue
            if isinstance(seg, CommSeg) and seg.group == "etp":
                for group in self._etp_groups(r):
                    ids = b.collective(group, {g: cur[g] for g in group}, kind=seg.kind,
                                       name=f"{op_name} {seg.label}", op=seg.op,
                                       nbytes=seg.nbytes, stage=op.stage, mb=op.mb,
                                       duration_s=seg.duration_s)
                    for g in group:
                        cur[g] = (ids[g],)
                continue
            for tp_group in self.lanes[r]:
                if isinstance(seg, CommSeg):
                    ids = b.collective(tuple(tp_group), {g: cur[g] for g in tp_group},
                                       kind=seg.kind, name=f"{op_name} {seg.label}",
                                       op=seg.op, nbytes=seg.nbytes, stage=op.stage, mb=op.mb,
                                       duration_s=seg.duration_s)
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

    def _cp_group(self, g: int) -> tuple[int, ...]:
        """The CP group of GPU ``g``, in CP order (worked out once per GPU)."""
        group = self.cp_group.get(g)
        if group is None:
            group = self.cp_group[g] = self.placement.group("cp", g)
        return group

    def _cp_collective_full(self, op: Op, ring: RingAttention, cur: dict[int, tuple[int, ...]],
                            name: str, kind_op: str) -> dict[int, tuple[int, ...]]:
        """``kind_op`` over the CP group of every GPU in ``cur`` (all-gather CP)."""
        out = dict(cur)
        for group in dict.fromkeys(self._cp_group(g) for g in cur):
            ids = self.b.collective(group, {x: cur[x] for x in group}, kind=ring.kind,
                                    name=f"{op} {ring.label} {name}", op=kind_op,
                                    nbytes=ring.nbytes, stage=op.stage, mb=op.mb)
            out.update({x: (ids[x],) for x in group})
        return out

    def _ring_full(self, op: Op, ring: RingAttention, cur: dict[int, tuple[int, ...]]
                   ) -> dict[int, tuple[int, ...]]:
        """Ring attention on every GPU of the rank: block j waits for the pass that brought
        its K/V; the pass of block j + 1 leaves once block j's K/V arrived. All-gather CP
        (``ring.gathered``): the gather, the blocks, in the backward the reduce-scatter."""
        b, blk = self.b, ring.block
        if ring.gathered:
            cur = self._cp_collective_full(op, ring, cur, "all_gather", "all_gather")
            for _ in range(ring.steps):
                for g in cur:
                    cur[g] = (b.compute(g, op.kind, blk.label, cur[g], flops=blk.flops,
                                        hbm_bytes=blk.hbm_bytes, attn_flops=blk.attn_flops,
                                        elementwise_bytes=blk.elementwise_bytes,
                                        gemm_dims=blk.gemm_dims, stage=op.stage, mb=op.mb),)
            if ring.scatter_grads:
                cur = self._cp_collective_full(op, ring, cur, "reduce_scatter", "reduce_scatter")
            return cur
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

    def _emit_collapsed(self, op: Op, key: tuple, piece: Piece, r: int,
                        prev: dict[int, tuple[int, ...]], alloc: float, free: float,
                        total: int, pending: list[dict[str, float]], is_last: bool,
                        cuts: Mapping[int, frozenset[str]]) -> dict[int, tuple[int, ...]]:
        """Collapsed: the piece's runs between ring attentions are folded like whole ops
        (:func:`fold`, with the same bookkeeping of the TP stream's closing collective);
        each ring step is a timed pass and a compute block."""
        b, op_name = self.b, str(op)
        assert self.collapse is not None
        (g,) = prev
        deps = prev[g]
        runs = piece.runs
        seen = piece.compute_before
        for i, (run, n_compute) in enumerate(runs):
            if isinstance(run[0], RingAttention):
                deps, ring_s = self._ring_collapsed(op, run[0], g, r, deps)
                pending[r] = {kind: left - ring_s for kind, left in pending[r].items()
                              if left > ring_s}
                continue
            folded = self.fold_cache.get((Op(op.stage, op.kind, 0, op.seq), key, i))
            if folded is None:
                folded = fold(run, self.collapse.on(g), tp_groups(self.placement, r),
                              ep_groups(self.placement, r, self.ep, self.etp),
                              self._etp_groups(r))
                self.fold_cache[(Op(op.stage, op.kind, 0, op.seq), key, i)] = folded
            a = alloc if seen == 0 and n_compute else 0.0
            f = free if n_compute and seen + n_compute == total else 0.0
            seen += n_compute
            cut = cuts.get(i, frozenset())
            parts, after = folded_plan(folded, pending[r], cut, is_last and i + 1 == len(runs),
                                       self.plans)
            end = emit_folded(b, g, op, op_name, folded, deps, a, f, pending[r], cut, parts)
            deps = (end,)
            pending[r] = after
        return {g: deps}

    def _ring_collapsed(self, op: Op, ring: RingAttention, g: int, r: int,
                        deps: tuple[int, ...]) -> tuple[tuple[int, ...], float]:
        """The ring (or the all-gather CP) on the representative GPU ``g``, each collective
        timed with all of rank ``r``'s CP groups at once; its last instruction and the time
        it takes alone."""
        assert self.collapse is not None
        p = self.placement
        if ring.gathered:
            return self._gathered_collapsed(op, ring, g, r, deps)
        pairs = self.ring_pairs.get(r)
        if pairs is None:
            pairs = tuple((x, self.ring_next[x]) for group in tp_groups(p, r) for x in group)
            self.ring_pairs[r] = pairs
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
        return deps, ring.steps * block_s

    def _gathered_collapsed(self, op: Op, ring: RingAttention, g: int, r: int,
                            deps: tuple[int, ...]) -> tuple[tuple[int, ...], float]:
        """All-gather CP on the representative GPU: the gather, the blocks, in the backward
        the reduce-scatter (:meth:`_ring_collapsed`)."""
        assert self.collapse is not None
        groups = cp_groups(self.placement, r)
        block_s = self.collapse.on(g).compute_s(ring.block)
        blk = ring.block
        times = {kind_op: self.collapse.collective_s(kind_op, groups, ring.nbytes)
                 for kind_op in ("all_gather", "reduce_scatter")[:1 + ring.scatter_grads]}

        def collective(kind_op: str, after: tuple[int, ...]) -> tuple[int, ...]:
            return (self.b.collective((g,), {g: after}, kind=ring.kind,
                                      name=f"{op} {ring.label} {kind_op}", op=kind_op,
                                      nbytes=ring.nbytes, stage=op.stage, mb=op.mb,
                                      duration_s=times[kind_op])[g],)

        deps = collective("all_gather", deps)
        for _ in range(ring.steps):
            deps = (self.b.compute(g, op.kind, blk.label, deps, duration_s=block_s,
                                   flops=blk.flops, attn_flops=blk.attn_flops,
                                   stage=op.stage, mb=op.mb),)
        if ring.scatter_grads:
            deps = collective("reduce_scatter", deps)
        total = ring.steps * block_s + sum(times.values())
        return deps, total
