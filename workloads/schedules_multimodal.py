"""Schedules of a multimodal model: an encoder's ops placed around an LLM pipeline.

A multimodal LLM (an image encoder feeding a decoder-only LLM) colocated as Optimus
does (Feng et al. 2024, sec. 4): every GPU holds a part of the encoder besides its LLM
stage, the encoder with its own parallel plan (:class:`~workloads.schedules.EncoderLayout`),
and each encoder stage's work for a micro-batch is cut into pieces (``E`` forward, ``G``
backward ops). The LLM runs 1F1B (Narayanan et al. 2021). The dependencies between
encoder and LLM come from the one rule (:func:`~workloads.schedules.op_deps`): a
micro-batch's encoder forward before its LLM forward on the first stage, its encoder
backward after its LLM backward there. The builders choose the order only:

* :func:`encoder_first`, the baseline: every rank runs the encoder forward of all
  micro-batches before its LLM ops and the encoder backward after them (Megatron-LM
  running a multimodal model's encoder as a separate phase, Feng et al. 2024, sec. 2.2).
* :func:`optimus`, Optimus's bubble scheduling (Feng et al. 2024, sec. 4.2, alg. 1):
  encoder pieces go into the LLM pipeline's bubbles, using the profiled (here:
  estimated) time of each op, without delaying any LLM op that does not need them.

Without an encoder plan both are plain 1F1B under their own name.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import count

from base.errors import ScheduleError
from workloads.schedules import (
    BACKWARD,
    ENCODER_BACKWARD,
    ENCODER_FORWARD,
    FORWARD,
    EncoderLayout,
    Op,
    Schedule,
    one_f_one_b,
    op_deps,
)


@dataclass(frozen=True)
class EncoderPlan:
    """What a multimodal builder needs: where the encoder runs and what its ops cost."""

    layout: EncoderLayout
    llm_s: tuple[tuple[float, float], ...]
    """Per pipeline rank, the estimated seconds of one LLM forward and backward."""
    encoder_s: tuple[tuple[float, float], ...]
    """Per pipeline rank, the estimated seconds of one encoder forward piece and one
    backward piece."""


def _renamed(base: Schedule, name: str, rank_ops: tuple[tuple[Op, ...], ...] | None = None,
             layout: EncoderLayout | None = None) -> Schedule:
    """``base`` (1F1B) under ``name``, with the given ops and encoder layout if any."""
    return Schedule(name, base.num_microbatches, base.stage_rank,
                    base.rank_ops if rank_ops is None else rank_ops,
                    notes="Feng et al. 2024", encoder=layout)


def _encoder_ops(r: int, m: int, pieces: int) -> tuple[list[Op], list[Op]]:
    """Rank ``r``'s encoder forward pieces (micro-batch order, pieces in order) and backward
    pieces (micro-batch order, pieces in reverse)."""
    fwd = [Op(r, ENCODER_FORWARD, mb, c) for mb in range(m) for c in range(pieces)]
    bwd = [Op(r, ENCODER_BACKWARD, mb, c) for mb in range(m) for c in reversed(range(pieces))]
    return fwd, bwd


def encoder_first(p: int, m: int, plan: EncoderPlan | None = None) -> Schedule:
    """The baseline: on every rank, the encoder forward of all ``m`` micro-batches, then the
    LLM's 1F1B ops, then the encoder backward of all micro-batches."""
    base = one_f_one_b(p, m)
    if plan is None:
        return _renamed(base, "encoder-first")
    pieces = plan.layout.pieces
    ranks = []
    for r in range(p):
        fwd, bwd = _encoder_ops(r, m, pieces)
        ranks.append((*fwd, *base.rank_ops[r], *bwd))
    return _renamed(base, "encoder-first", tuple(ranks), plan.layout)


def optimus(p: int, m: int, plan: EncoderPlan | None = None) -> Schedule:
    """Optimus's bubble scheduling (Feng et al. 2024, sec. 4.2) over 1F1B.

    A list-scheduling run over the estimated durations of ``plan`` (no communication),
    ranks advanced in time order. A free rank runs first the next encoder forward piece
    of a micro-batch that the first stage's next forward needs, or one of the ``pp_e - 1``
    after it (so that an encoder pipeline of ``pp_e`` stages stays full), if it is ready
    (an urgent piece: without it the pipeline cannot go on); else its next LLM op, if
    that is ready; otherwise it fills
    the bubble with the next ready encoder piece (forward first, then backward) if the
    piece ends before the LLM op could start at the earliest (a lower bound from the
    ranks' clocks and the producers' durations), so filling never delays an LLM op;
    after its last LLM op a rank runs the encoder pieces left. The order found is the
    schedule; the simulator then times it with the real costs and communication.
    Like Optimus's, the scheduler is a heuristic: with one encoder stage it was never
    slower than :func:`encoder_first` in our tests, with several it can be by a few
    per cent (``tests/test_multimodal.py``).
    """
    base = one_f_one_b(p, m)
    if plan is None:
        return _renamed(base, "optimus")
    layout = plan.layout
    if len(plan.llm_s) != p or len(plan.encoder_s) != p:
        raise ScheduleError(f"schedule optimus: the plan has costs for {len(plan.llm_s)} "
                            f"ranks, the pipeline {p}")
    return _renamed(base, "optimus", _BubbleFill(base, plan).run(), layout)


class _BubbleFill:
    """The state of one :func:`optimus` run (see there)."""

    def __init__(self, base: Schedule, plan: EncoderPlan) -> None:
        self.p, self.m = base.num_ranks, base.num_microbatches
        self.layout = plan.layout
        self.llm = [list(ops) for ops in base.rank_ops]
        queues = [_encoder_ops(r, self.m, plan.layout.pieces) for r in range(self.p)]
        self.efwd = [q[0] for q in queues]
        self.ebwd = [q[1] for q in queues]
        self.pos = [[0, 0, 0] for _ in range(self.p)]  # next LLM, E, G op of each rank
        self.plan = plan
        self.end: dict[Op, float] = {}
        self.clock = [0.0] * self.p
        self.out: list[list[Op]] = [[] for _ in range(self.p)]
        # the micro-batch of each rank's next LLM forward, per LLM position
        self.stage0 = base.stage_rank[0]
        self.next_fwd: list[list[int]] = []
        for ops in self.llm:
            nxt, col = self.m, []
            for op in reversed(ops):
                if op.kind == FORWARD:
                    nxt = op.mb
                col.append(nxt)
            self.next_fwd.append(col[::-1] + [self.m])

    def dur(self, op: Op) -> float:
        """Estimated seconds of ``op`` (encoder ops: their stage field is their rank)."""
        r = op.stage
        if op.kind == FORWARD:
            return self.plan.llm_s[r][0]
        if op.kind == BACKWARD:
            return self.plan.llm_s[r][1]
        return self.plan.encoder_s[r][0 if op.kind == ENCODER_FORWARD else 1]

    def deps(self, op: Op) -> tuple[Op, ...]:
        """``op``'s producers by the one rule."""
        return op_deps(op, self.p, False, 1, self.layout)

    def ready(self, op: Op) -> float | None:
        """When ``op``'s producers are all done; None while one is not placed."""
        t = 0.0
        for d in self.deps(op):
            e = self.end.get(d)
            if e is None:
                return None
            t = max(t, e)
        return t

    def earliest_end(self, op: Op, memo: dict[Op, float]) -> float:
        """A lower bound on when ``op`` can end: placed, its end; else its rank's clock or
        its producers' earliest ends, whichever is later, plus its duration."""
        if op in self.end:
            return self.end[op]
        got = memo.get(op)
        if got is None:
            t = max([self.clock[op.stage], *(self.earliest_end(d, memo) for d in self.deps(op))])
            got = memo[op] = t + self.dur(op)
        return got

    def place(self, r: int, op: Op, t: float, which: int) -> None:
        """Run ``op`` on rank ``r`` from ``t``; ``which`` of its queues (LLM, E, G) moves on."""
        self.out[r].append(op)
        self.end[op] = t + self.dur(op)
        self.clock[r] = t + self.dur(op)
        self.pos[r][which] += 1

    def step(self, r: int) -> bool:
        """Place one op on rank ``r`` at its clock if one may go; whether one did."""
        t = self.clock[r]
        li, ei, gi = self.pos[r]
        llm = self.llm[r][li] if li < len(self.llm[r]) else None
        efwd = self.efwd[r][ei] if ei < len(self.efwd[r]) else None
        ebwd = self.ebwd[r][gi] if gi < len(self.ebwd[r]) else None
        e_ok = efwd is not None and (ready_e := self.ready(efwd)) is not None and ready_e <= t
        first = self.stage0  # the rank whose next forward waits for every encoder's features
        ahead = self.next_fwd[first][self.pos[first][0]] + self.layout.stages - 1
        if e_ok and efwd is not None and efwd.mb <= ahead:
            self.place(r, efwd, t, 1)
            return True
        if llm is not None:
            ready = self.ready(llm)
            if ready is not None and ready <= t:
                self.place(r, llm, t, 0)
                return True
        g_ok = ebwd is not None and (ready_g := self.ready(ebwd)) is not None and ready_g <= t
        limit = float("inf")
        if llm is not None:
            limit = self.earliest_end(llm, {}) - self.dur(llm)
        for ok, op, which in ((e_ok, efwd, 1), (g_ok, ebwd, 2)):
            if ok and op is not None and t + self.dur(op) <= limit:
                self.place(r, op, t, which)
                return True
        return False

    def run(self) -> tuple[tuple[Op, ...], ...]:
        """Place every op; each rank's ops in the order placed."""
        total = [len(self.llm[r]) + len(self.efwd[r]) + len(self.ebwd[r]) for r in range(self.p)]
        seq = count()
        heap = [(0.0, next(seq), r) for r in range(self.p)]
        ends: list[float] = []  # end times of placed ops, some already passed
        stuck = 0
        while heap:
            t, _, r = heapq.heappop(heap)  # every other rank's clock is t or later
            if self.step(r):
                stuck = 0
                heapq.heappush(ends, self.clock[r])
            else:
                while ends and ends[0] <= t:
                    heapq.heappop(ends)
                later = [c for q, c in enumerate(self.clock) if q != r and c > t]
                if ends:
                    later.append(ends[0])
                if later:
                    self.clock[r] = min(later)
                else:
                    stuck += 1
                    if stuck > self.p + 1:
                        raise ScheduleError("schedule optimus: the bubble filling found no "
                                            "op to run (a dependency cycle)")
            if len(self.out[r]) < total[r]:
                heapq.heappush(heap, (self.clock[r], next(seq), r))
        return tuple(tuple(ops) for ops in self.out)
