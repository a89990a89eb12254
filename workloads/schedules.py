"""Pipeline schedules as pure data: the order of ops on each pipeline rank.

A schedule is order, not time. Bubbles are written nowhere: they emerge when
the engine runs the ops with real durations and the dependencies of
:func:`op_deps`. Every op has one text form, ``"<stage><kind><micro-batch>"``
(``"1F3"`` = stage 1, forward, micro-batch 3), used in reprs, error messages,
golden files and custom schedule files. Two backward-compatible extensions:

* a sequence chunk (Seq1F1B, Sun et al. 2024): ``"1F3.2"`` = stage 1, forward,
  micro-batch 3, sequence chunk 2; ops without the suffix cover the whole
  micro-batch;
* encoder ops (a multimodal model's encoder, Feng et al. 2024): ``"2E5.1"`` = the
  encoder forward piece 1 that pipeline rank 2 runs for micro-batch 5, ``"2G5.1"`` its
  backward; for these kinds the stage field is the pipeline rank that runs them and the
  suffix is the piece (a group of encoder layers), never omitted
  (:class:`EncoderLayout`);
* fused groups (DualPipe's overlapped forward/backward pairs, DeepSeek-AI
  2024, sec. 3.2.1): ops joined by ``&`` on a rank, e.g. ``"0F5&7B2&7W2"``,
  start together once every member's inputs are ready, run back to back as one
  compute op and release all their outputs at the group's end
  (:func:`schedule_deps`, :func:`list_schedule`).

Sources: GPipe (Huang et al. 2019); 1F1B / PipeDream-Flush (Narayanan et al.
2021, SC'21, sec. 2.2); Zero Bubble's split backward B/W (Qi et al. 2024).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from itertools import chain, repeat
from operator import itemgetter
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from base.errors import ScheduleError
from base.machine import machine

FORWARD = "F"
BACKWARD = "B"
WEIGHT_GRAD = "W"
KINDS = (FORWARD, BACKWARD, WEIGHT_GRAD)
ENCODER_FORWARD = "E"
"""A piece of a multimodal model's encoder forward (:class:`EncoderLayout`)."""
ENCODER_BACKWARD = "G"
"""A piece of the encoder's backward (its gradients)."""
ENCODER_KINDS = (ENCODER_FORWARD, ENCODER_BACKWARD)

_OP_RE = re.compile(r"^(\d+)([FBWEG])(\d+)(?:\.(\d+))?$")
FUSE = "&"
"""Joins the ops of a fused group in the text form: ``0F5&7B2``."""
WHOLE = -1
"""``Op.seq`` of an op that covers its whole micro-batch (no sequence chunks)."""


class Op(NamedTuple):
    """A pipeline op: stage ``stage`` runs ``kind`` for micro-batch ``mb`` (or one chunk of it).

    A typed named tuple rather than a frozen dataclass: schedules of large
    pipelines hold hundreds of thousands of ops, hashed and compared in dicts
    and sets by validation, the symbolic run and lowering; a tuple's hash and
    equality run in C (same values, same order: field by field).
    """

    stage: int
    """Model stage (chunk) index, 0 = first layers; with vpp > 1 there are pp * vpp stages."""
    kind: str
    """``F`` forward, ``B`` backward (input-gradient only if the schedule splits it), ``W``."""
    mb: int
    """Micro-batch index within the step, from 0."""
    seq: int = -1
    """Sequence chunk of the micro-batch, from 0 (Seq1F1B), or ``WHOLE`` (-1): all of it."""

    def __str__(self) -> str:
        base = f"{self.stage}{self.kind}{self.mb}"
        return base if self.seq == WHOLE else f"{base}.{self.seq}"

    def __repr__(self) -> str:
        return f"Op({self})"

    @classmethod
    def parse(cls, text: str) -> Op:
        """Parse the canonical text form, e.g. ``Op.parse("1F3")`` or ``Op.parse("1F3.2")``."""
        match = _OP_RE.match(text.strip())
        if not match:
            raise ScheduleError(
                f"op {text!r} is not of the form <stage><F|B|W|E|G><micro-batch>"
                "[.<sequence chunk>], e.g. '1F3' or '1F3.2'"
            )
        seq = WHOLE if match[4] is None else int(match[4])
        return cls(int(match[1]), match[2], int(match[3]), seq)

    def renumbered(self, mb: int) -> Op:
        """The same op for micro-batch ``mb``."""
        return Op(self.stage, self.kind, mb, self.seq)


_op = partial(tuple.__new__, Op)
"""``_op((stage, kind, mb, seq))``: an :class:`Op` from its four fields, without the named
tuple's Python-level ``__new__`` (op_deps builds hundreds of thousands)."""


@dataclass(frozen=True)
class EncoderLayout:
    """Where a multimodal schedule's encoder ops run, as the dependency rule reads it.

    Optimus (Feng et al. 2024, sec. 4) colocates the encoder on the LLM's GPUs with its
    own parallel plan: the ``p`` pipeline ranks of an LLM pipeline hold ``p / stages``
    encoder pipelines of ``stages`` stages each (encoder pipeline ``q``'s stage ``j`` on
    rank ``q * stages + j``), which split each LLM micro-batch's inputs between them
    (encoder data parallelism). Each encoder stage's work for a micro-batch is cut into
    ``pieces`` ops (groups of layers), so that a scheduler can fit them into bubbles.
    """

    stages: int
    """Encoder pipeline stages (``parallel.encoder.pp``); divides the LLM's ``pp``."""
    pieces: int
    """Ops each encoder stage's forward (and backward) of one micro-batch is cut into."""

    def stage_of(self, rank: int) -> int:
        """The encoder stage pipeline rank ``rank`` holds."""
        return rank % self.stages

    def last_ranks(self, p: int) -> tuple[int, ...]:
        """The ranks holding an encoder pipeline's last stage (their outputs feed the LLM)."""
        return tuple(range(self.stages - 1, p, self.stages))


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered ops of one training step of a pipeline."""

    name: str
    """Schedule name as used in the experiment file, e.g. ``1f1b``."""
    num_microbatches: int
    """m, micro-batches per step per pipeline."""
    stage_rank: tuple[int, ...]
    """stage_rank[s] = pipeline rank that owns stage s; len = number of stages."""
    rank_ops: tuple[tuple[Op, ...], ...]
    """rank_ops[r] = the ops rank r runs, in program order."""
    split_backward: bool = False
    """True when B is only the input gradient and W ops carry the weight gradient."""
    notes: str = field(default="", compare=False)
    """Free text: source and assumptions of the builder."""
    fused: frozenset[Op] = frozenset()
    """Ops fused with the next op on their rank (text form ``a&b``): a fused group starts when
    every member's inputs are ready, runs its members back to back as one compute op and
    releases their outputs at its end (DualPipe's overlapped F&B; a full backward B&W)."""
    seq_chunks: int = 1
    """k, sequence chunks per micro-batch (Seq1F1B); 1 = ops cover whole micro-batches."""
    encoder: EncoderLayout | None = None
    """The encoder ops' layout of a multimodal schedule (ops ``E`` and ``G``); None: no
    encoder ops."""

    @property
    def num_ranks(self) -> int:
        return len(self.rank_ops)

    @property
    def num_stages(self) -> int:
        return len(self.stage_rank)

    @property
    def chunks_per_rank(self) -> int:
        return self.num_stages // self.num_ranks

    @cached_property
    def groups(self) -> Mapping[Op, tuple[Op, ...]]:
        """Each op's fused group, members in program order; ``(op,)`` for an op run alone
        (read-only: a schedule is shared, :func:`workloads.registry.built_schedule`)."""
        if not self.fused:
            return MappingProxyType({op: (op,) for ops in self.rank_ops for op in ops})
        out: dict[Op, tuple[Op, ...]] = {}
        for ops in self.rank_ops:
            for group in _split_groups(ops, self.fused):
                out.update(dict.fromkeys(group, group))
        return MappingProxyType(out)

    @cached_property
    def op_counts(self) -> Mapping[tuple[int, str, int], int]:
        """How many ops each (stage, kind, sequence field) has (read-only: a schedule is
        shared); counted on the arrays validation keeps where the ops code (:func:`_coded`)."""
        coded = _rank_coded(self)
        if coded is None:
            return MappingProxyType(Counter(map(itemgetter(0, 1, 3),
                                                chain.from_iterable(self.rank_ops))))
        stage, kind, _, seq, *_ = coded
        width = int(seq.max()) + 2  # sequence fields from WHOLE = -1 up
        found = np.bincount((stage * 3 + kind) * width + (seq + 1))
        letters = {code: name for name, code in _KIND_CODE.items()}
        return MappingProxyType({(key // width // 3, letters[key // width % 3],
                                  key % width - 1): count
                                 for key, count in enumerate(found.tolist()) if count})

    def grid(self) -> str:
        """The op grid, one line per rank: readable in a diff; :func:`from_text` parses it."""
        rows = []
        for r, ops in enumerate(self.rank_ops):
            tokens = (FUSE.join(map(str, g)) for g in _split_groups(ops, self.fused))
            rows.append(f"rank {r}: " + " ".join(tokens))
        return "\n".join(rows)

    def __str__(self) -> str:
        head = f"Schedule {self.name} (p={self.num_ranks}, m={self.num_microbatches})"
        return f"{head}\n{self.grid()}"


def _split_groups(ops: Sequence[Op], fused: frozenset[Op]) -> list[tuple[Op, ...]]:
    """A rank's ops cut into fused groups (an op in ``fused`` joins the next op)."""
    if not fused:
        return [(op,) for op in ops]
    groups: list[tuple[Op, ...]] = []
    current: list[Op] = []
    for op in ops:
        current.append(op)
        if op not in fused:
            groups.append(tuple(current))
            current = []
    if current:
        groups.append(tuple(current))
    return groups


def op_deps(
    op: Op, num_stages: int, split_backward: bool, seq_chunks: int = 1,
    encoder: EncoderLayout | None = None,
) -> tuple[Op, ...]:
    """The ops ``op`` must wait for besides program order on its rank (DESIGN.md rule).

    F(s, m) after F(s-1, m); B(s, m) after B(s+1, m) and after F(s, m) (its
    stashed activations); W(s, m) after B(s, m). With ``seq_chunks = k > 1``
    (Seq1F1B, Sun et al. 2024, sec. 3) ops carry a sequence chunk ``c`` and
    causal attention adds: forward chunk c after forward chunk c-1 of the same
    micro-batch on the same stage (it attends to their keys and values), and
    backward chunks run in reverse, chunk c after chunk c+1 (the later chunks
    produce gradients for chunk c's keys and values).

    With an ``encoder`` (:class:`EncoderLayout`, Feng et al. 2024, sec. 3) encoder
    pieces chain like layers: E(r, m, c) after E(r, m, c-1), the first piece after the
    previous encoder stage's last (rank r-1); the LLM's first forward F(0, m) after the
    last piece of every encoder pipeline's last stage (it consumes their features); the
    encoder backward runs the pieces in reverse, G(r, m, c) after E(r, m, c) (its stash)
    and G(r, m, c+1), the last piece after the next encoder stage's first or, on an
    encoder pipeline's last stage, after the LLM's first backward B(0, m) (the gradient
    of the features).
    """
    s, kind, m, c = op
    if kind == FORWARD:
        deps = [_op((s - 1, FORWARD, m, c))] if s > 0 else []
        if c > 0:
            deps.append(_op((s, FORWARD, m, c - 1)))
        if encoder is not None and s == 0:
            last = encoder.pieces - 1
            deps += [_op((r, ENCODER_FORWARD, m, last))
                     for r in encoder.last_ranks(num_stages)]
        return tuple(deps)
    if kind == BACKWARD:
        deps = [_op((s, FORWARD, m, c))]
        if s < num_stages - 1:
            deps.append(_op((s + 1, BACKWARD, m, c)))
        if c != WHOLE and c < seq_chunks - 1:
            deps.append(_op((s, BACKWARD, m, c + 1)))
        return tuple(deps)
    if kind in ENCODER_KINDS:
        if encoder is None:
            raise ScheduleError(f"op {op} is an encoder op but the schedule has no encoder")
        return _encoder_deps(op, encoder)
    if not split_backward:
        raise ScheduleError(f"op {op} is a W but the schedule does not split the backward")
    return (_op((s, BACKWARD, m, c)),)


def _encoder_deps(op: Op, encoder: EncoderLayout) -> tuple[Op, ...]:
    """:func:`op_deps` of an encoder op (``E`` or ``G``) of pipeline rank ``op.stage``."""
    r, kind, m, c = op
    j, last = encoder.stage_of(r), encoder.pieces - 1
    if kind == ENCODER_FORWARD:
        if c > 0:
            return (_op((r, ENCODER_FORWARD, m, c - 1)),)
        return (_op((r - 1, ENCODER_FORWARD, m, last)),) if j > 0 else ()
    deps = [_op((r, ENCODER_FORWARD, m, c))]
    if c < last:
        deps.append(_op((r, ENCODER_BACKWARD, m, c + 1)))
    elif j < encoder.stages - 1:
        deps.append(_op((r + 1, ENCODER_BACKWARD, m, 0)))
    else:
        deps.append(_op((0, BACKWARD, m, WHOLE)))
    return tuple(deps)


def schedule_deps(schedule: Schedule, op: Op) -> tuple[Op, ...]:
    """All ops ``op`` waits for in ``schedule`` besides program order on its rank.

    :func:`op_deps`, plus, for the first op of a fused group, the outside
    dependencies of the other members: the group starts only when all its
    inputs are there (DualPipe runs an overlapped F&B pair once both the
    forward's activation and the backward's gradient have arrived).
    """
    own = op_deps(op, schedule.num_stages, schedule.split_backward, schedule.seq_chunks,
                  schedule.encoder)
    if not schedule.fused:
        return own
    group = schedule.groups.get(op, (op,))
    if len(group) == 1 or op != group[0]:
        return own
    out = dict.fromkeys(own)
    for member in group[1:]:
        deps = op_deps(member, schedule.num_stages, schedule.split_backward, schedule.seq_chunks,
                       schedule.encoder)
        out.update(dict.fromkeys(d for d in deps if d not in group))
    return tuple(out)


def required_ops(
    num_stages: int, num_microbatches: int, split_backward: bool, seq_chunks: int = 1,
    encoder: EncoderLayout | None = None,
) -> list[Op]:
    """Every op a valid schedule runs exactly once (with sequence chunks 0..k-1 if k > 1,
    and with an ``encoder`` every rank's encoder pieces, forward and backward)."""
    kinds = KINDS if split_backward else (FORWARD, BACKWARD)
    seqs = range(seq_chunks) if seq_chunks > 1 else (WHOLE,)
    out = [
        Op(s, k, mb, c)
        for s in range(num_stages)
        for mb in range(num_microbatches)
        for c in seqs
        for k in kinds
    ]
    if encoder is not None:
        out += [Op(r, k, mb, c) for r in range(num_stages) for mb in range(num_microbatches)
                for c in range(encoder.pieces) for k in ENCODER_KINDS]
    return out


def validate(schedule: Schedule) -> None:
    """Check a schedule before it runs; raise :class:`ScheduleError` with the op grid if bad.

    Checks: each (stage, micro-batch[, sequence chunk]) has exactly one F and
    one B (and one W if split), every op sits on the rank that owns its stage,
    fused groups are well formed, and a symbolic run with unit durations
    completes (no deadlock; the error prints the per-rank op grid and marks
    the ops that wait forever).
    """
    p, k = schedule.num_ranks, schedule.seq_chunks
    if p < 1 or schedule.num_microbatches < 1:
        raise ScheduleError(f"schedule {schedule.name}: needs p >= 1 and m >= 1")
    if k < 1:
        raise ScheduleError(f"schedule {schedule.name}: sequence chunks k={k} must be >= 1")
    for s, r in enumerate(schedule.stage_rank):
        if not 0 <= r < p:
            raise ScheduleError(f"stage {s} is owned by rank {r}, outside 0..{p - 1}")
    if not schedule.fused and _well_formed(schedule):
        unit_spans(schedule)
        return
    seen: dict[Op, int] = {}
    stage_rank, num_stages = schedule.stage_rank, schedule.num_stages
    for r, ops in enumerate(schedule.rank_ops):
        for op in ops:
            kinds = KINDS + ENCODER_KINDS if schedule.encoder is not None else KINDS
            if op.kind not in kinds or not 0 <= op.stage < num_stages:
                raise ScheduleError(f"rank {r}: op {op} has no such stage or kind")
            if op in seen:
                raise ScheduleError(f"op {op} appears twice (ranks {seen[op]} and {r})")
            if stage_rank[op.stage] != r:
                raise ScheduleError(
                    f"op {op} is on rank {r} but stage {op.stage} lives on rank "
                    f"{stage_rank[op.stage]}"
                )
            seen[op] = r
    _check_complete(schedule, seen)
    _check_fused(schedule, seen)
    unit_spans(schedule)


def _well_formed(schedule: Schedule) -> bool:
    """Whether the checks of :func:`validate` before the symbolic run all pass, worked out on
    arrays: every op of a known stage and kind, on the rank owning its stage, within the
    micro-batches and sequence chunks, W only if the backward is split, none twice, and
    as many as :func:`required_ops` (so all of them). False: some check fails (the op by
    op checks then name it)."""
    n = sum(map(len, schedule.rank_ops))
    S, M, K = schedule.num_stages, schedule.num_microbatches, max(schedule.seq_chunks, 1)
    if not n or n != S * M * K * (3 if schedule.split_backward else 2):
        return False
    coded = _rank_coded(schedule)  # (a builder's, kept: the ops are not listed again)
    if coded is None:
        return False
    stage, *_, own = coded
    rank = np.repeat(np.arange(schedule.num_ranks), [len(ops) for ops in schedule.rank_ops])
    if not np.array_equal(np.asarray(schedule.stage_rank, dtype=np.int64)[stage], rank):
        return False
    return bool(np.bincount(own).max() == 1)  # n ops, none twice


def _required(schedule: Schedule, op: Op) -> bool:
    """Whether ``op`` (of a known stage and kind) is one :func:`required_ops` lists."""
    k = schedule.seq_chunks
    if op.kind in ENCODER_KINDS:
        assert schedule.encoder is not None  # validate admits encoder ops only then
        return 0 <= op.mb < schedule.num_microbatches and 0 <= op.seq < schedule.encoder.pieces
    return (0 <= op.mb < schedule.num_microbatches
            and (0 <= op.seq < k if k > 1 else op.seq == WHOLE)
            and (op.kind != WEIGHT_GRAD or schedule.split_backward))


def _check_complete(schedule: Schedule, seen: dict[Op, int]) -> None:
    """Raise unless the (distinct) ops ``seen`` are exactly :func:`required_ops`.

    Distinct ops that are all required are all of them iff there are as many; the
    list of required ops is built only to name what is missing.
    """
    k = schedule.seq_chunks
    kinds = len(KINDS) if schedule.split_backward else 2
    count = schedule.num_stages * schedule.num_microbatches * k * kinds
    if schedule.encoder is not None:
        count += schedule.num_stages * schedule.num_microbatches * schedule.encoder.pieces * 2
    if len(seen) == count and all(_required(schedule, op) for op in seen):
        return
    need = required_ops(
        schedule.num_stages, schedule.num_microbatches, schedule.split_backward, k,
        schedule.encoder,
    )
    need_set = set(need)
    missing = [op for op in need if op not in seen]
    extra = [op for op in seen if op not in need_set]
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + " ".join(map(str, missing[:8])))
        if extra:
            parts.append("unexpected " + " ".join(map(str, extra[:8])))
        raise ScheduleError(f"schedule {schedule.name}: " + "; ".join(parts))


def _check_fused(schedule: Schedule, seen: dict[Op, int]) -> None:
    if not schedule.fused:
        return
    for op in sorted(schedule.fused):
        if op not in seen:
            raise ScheduleError(f"schedule {schedule.name}: fused op {op} is not in the schedule")
        if schedule.rank_ops[seen[op]][-1] == op:
            raise ScheduleError(
                f"schedule {schedule.name}: op {op} is fused ('&') with the next op but is the "
                f"last op of rank {seen[op]}"
            )
    for group in {g for g in schedule.groups.values() if len(g) > 1}:
        _internal_order(schedule, group)  # a lone op cannot wait on a later member


def _internal_order(schedule: Schedule, group: tuple[Op, ...]) -> None:
    """Raise if a member of a fused group waits on a later member (it could never start)."""
    for i, op in enumerate(group):
        deps = op_deps(op, schedule.num_stages, schedule.split_backward, schedule.seq_chunks,
                       schedule.encoder)
        later = [d for d in deps if d in group[i + 1 :]]
        if later:
            raise ScheduleError(
                f"schedule {schedule.name}: in fused group {FUSE.join(map(str, group))} op {op} "
                f"waits on {later[0]}, which comes after it"
            )


def list_schedule(
    schedule: Schedule, duration: Callable[[Op], float], reference: bool = False
) -> dict[Op, tuple[float, float]]:
    """Symbolic list-schedule run: each op starts when its rank is free and its producers are done.

    This is the exact oracle for pipeline timing without communication
    (REFERENCES.md, "one slow stage in 1F1B"). Returns ``{op: (start, end)}``,
    the interval each op computes. A fused group starts when its rank is free
    and every member's outside producers are done, runs its members back to
    back, and its outputs count as done only at the group's end.
    Raises :class:`ScheduleError` naming the blocked ops if the schedule deadlocks.

    Passes over the ranks in order, each rank running as far as its producers
    allow, until no rank can move. A rank blocked on a producer is not
    re-examined until that producer is done, and each group's producers are
    listed once, as op positions, so the cost is linear in the ops plus the passes.

    A schedule without fused groups takes a fast path (:func:`_list_unfused`, its
    producers worked out on arrays by :func:`producer_positions`); ``reference`` runs
    the general loop instead, with the same result.
    """
    order = list(chain.from_iterable(schedule.rank_ops))
    found = None if schedule.fused or reference else producer_positions(schedule, order)
    if found is not None:
        starts, ends, scheduled = _list_unfused(schedule, list(map(duration, order)), order,
                                                found)
    else:
        starts, ends, scheduled = _list_groups(schedule, list(map(duration, order)), order,
                                               *_groups_and_deps(schedule, order))
    return {order[k]: (starts[k], ends[k]) for k in scheduled}  # type: ignore[misc]


def _list_groups(schedule: Schedule, duration: Sequence[float], order: list[Op],
                 first: Sequence[int], deps: Sequence[Sequence[int]]
                 ) -> tuple[list[float], list[float | None], list[int]]:
    """The general loop of :func:`list_schedule`, the ops' durations given in ``order``
    (every rank's ops, each rank's in program order). Its groups: ``first``, the position
    of each group's first op, in that order, and ``len(order)`` last (a group runs to the
    next one's first op; every rank's first op starts one); ``deps``, the groups' producers
    as columns, each indexed by group, of positions (``len(order)``: a producer missing from
    the schedule, never done; ``len(order) + 1``: none, always done). Its intervals as each
    op's start and end, by position in ``order`` (the ends with a last slot, None), and the
    positions of the result's ops, in its order."""
    p, n = schedule.num_ranks, len(order)
    # group end time of each done op; slot n stands for a producer missing from the
    # schedule, which is never done, and slot n + 1 for an absent one, always done
    ready: list[float | None] = [None] * (n + 1) + [-math.inf]
    starts = [0.0] * n
    ends: list[float | None] = [None] * (n + 1)
    bounds = [0]  # each rank's ops, then its groups
    for ops in schedule.rank_ops:
        bounds.append(bounds[-1] + len(ops))
    gbounds = [bisect_left(first, b) for b in bounds]
    nxt = gbounds[:-1]  # each rank's next group
    free_at = [0.0] * p
    blocked = [-1] * p  # the producer a rank's next group waits for (-1: none)
    scheduled: list[int] = []  # op positions in the order they are placed
    remaining = n
    while remaining:
        progressed = False
        for r in range(p):
            wait = blocked[r]
            if wait >= 0 and ready[wait] is None:
                continue
            g = start = nxt[r]
            stop, done = gbounds[r + 1], free_at[r]
            wait = -1
            while g < stop:
                t = done
                for column in deps:
                    d = column[g]
                    end = ready[d]
                    if end is None:
                        wait = d
                        break
                    if end > t:
                        t = end
                if wait >= 0:
                    break
                a, b = first[g], first[g + 1]
                if b - a == 1:
                    starts[a], done = t, t + duration[a]
                    ends[a] = ready[a] = done
                    scheduled.append(a)
                else:  # a fused group: its members back to back, all done at its end
                    _internal_order(schedule, order[a:b])
                    for j in range(a, b):
                        starts[j], t = t, t + duration[j]
                        ends[j] = t
                    for j in range(a, b):
                        ready[j] = t
                    scheduled.extend(range(a, b))
                    done = t
                g += 1
            blocked[r] = wait
            if g > start:
                free_at[r] = done
                nxt[r] = g
                remaining -= first[g] - first[start]
                progressed = True
        if not progressed:
            pos = [first[nxt[r]] - bounds[r] for r in range(p)]
            done_at = {op: ready[k] for k, op in enumerate(order) if ready[k] is not None}
            raise ScheduleError(_deadlock_message(schedule, pos, done_at))  # type: ignore[arg-type]
    return starts, ends, scheduled


def _list_unfused(schedule: Schedule, duration: Sequence[float], order: list[Op],
                  columns: tuple[np.ndarray, np.ndarray, np.ndarray]
                  ) -> tuple[list[float], list[float | None], list[int]]:
    """:func:`list_schedule` of a schedule without fused groups, its ops' durations given in
    ``order`` and their producers as the columns of :func:`producer_positions`: the same
    passes, op by op. Its intervals as each op's start and end, by position in ``order``
    (the ends with a last slot, None), and the positions of the result's ops, in its
    order.

    Ops with at most two producers (all but Seq1F1B's backwards) take an unrolled loop
    (:func:`_list_two`, Megatron 1T's 131,072 ops in ~30 instead of ~37 ms), equal to the
    general loop's result (``list_schedule(..., reference=True)``,
    ``tests/test_schedule_fastpaths.py``); with a third producer column, the general loop
    itself (:func:`_list_groups`), every op a group of its own, its producers read from
    the columns."""
    if len(columns) > 2 and bool((columns[2] >= 0).any()):
        n = len(order)  # every op a group; an absent producer, n + 1, is always done
        deps = [machine(np.where(col < 0, n + 1, col), "q") for col in columns]
        return _list_groups(schedule, duration, order, list(range(n + 1)), deps)
    return _list_two(schedule, duration, order, columns[0], columns[1])


def _list_two(schedule: Schedule, duration: Sequence[float], order: list[Op],
              first: np.ndarray, second: np.ndarray
              ) -> tuple[list[float], list[float | None], list[int]]:
    """:func:`_list_unfused` of ops with at most two producers (``first`` and ``second``,
    -1 where absent). An absent producer reads a slot past the missing one's, holding
    -inf (never later than the rank's free time, and never None), so each op reads both
    columns without a test; a rank's run of ops placed in one pass is kept as a range,
    the result's order their concatenation."""
    p, n = schedule.num_ranks, len(order)
    absent = n + 1
    c0 = machine(np.where(first < 0, absent, first), "q")
    c1 = machine(np.where(second < 0, absent, second), "q")
    ready: list[float | None] = [None] * (n + 2)  # slot n: a missing producer, never done
    ready[absent] = -math.inf
    starts = [0.0] * n
    bounds = [0]
    for ops in schedule.rank_ops:
        bounds.append(bounds[-1] + len(ops))
    nxt = bounds[:-1]  # each rank's next op
    free_at = [0.0] * p
    blocked = [absent] * p  # the producer a rank's next op waits for (absent: none)
    runs: list[range] = []  # each rank's ops placed in a pass, in the order they are placed
    remaining = n
    while remaining:
        progressed = False
        for r in range(p):
            if ready[blocked[r]] is None:
                continue
            j = start = nxt[r]
            stop, done = bounds[r + 1], free_at[r]
            while j < stop:
                a = ready[c0[j]]
                b = ready[c1[j]]
                if a is None or b is None:
                    blocked[r] = c0[j] if a is None else c1[j]
                    break
                t = a if a > done else done
                if b > t:
                    t = b
                starts[j] = t
                done = ready[j] = t + duration[j]
                j += 1
            if j > start:
                runs.append(range(start, j))
                free_at[r] = done
                nxt[r] = j
                remaining -= j - start
                progressed = True
        if not progressed:
            pos = [nxt[r] - bounds[r] for r in range(p)]
            done_at = {op: ready[k] for k, op in enumerate(order) if ready[k] is not None}
            raise ScheduleError(_deadlock_message(schedule, pos, done_at))  # type: ignore[arg-type]
    del ready[absent]
    return starts, ready, list(chain.from_iterable(runs))


def _groups_and_deps(schedule: Schedule, order: list[Op]
                     ) -> tuple[list[int], list[list[int]]]:
    """``order``'s groups as :func:`_list_groups` reads them: the position of each group's
    first op (then ``len(order)``), and the columns of their producers
    (:func:`schedule_deps` of a group's members outside it, as positions: a producer
    missing from the schedule ``len(order)``, none ``len(order) + 1``)."""
    n = len(order)
    get = {op: k for k, op in enumerate(order)}.get
    if not schedule.fused:  # every op a group of its own: its producers are its op_deps
        S, split, k = schedule.num_stages, schedule.split_backward, schedule.seq_chunks
        enc = schedule.encoder
        first = list(range(n + 1))
        producers = [[get(d, n) for d in op_deps(op, S, split, k, enc)] for op in order]
    else:
        first, producers, at = [], [], 0
        for ops in schedule.rank_ops:
            for group in _split_groups(ops, schedule.fused):
                first.append(at)
                at += len(group)
                if len(group) == 1:  # an op never waits on itself
                    found = schedule_deps(schedule, group[0])
                else:
                    found = tuple(d for op in group for d in schedule_deps(schedule, op)
                                  if d not in group)
                producers.append([get(d, n) for d in found])
        first.append(n)
    width = max(map(len, producers), default=0)
    return first, [[found[i] if i < len(found) else n + 1 for found in producers]
                   for i in range(width)]


_KIND_CODE = {FORWARD: 0, BACKWARD: 1, WEIGHT_GRAD: 2}


def _coded(schedule: Schedule, order: Sequence[Op]
           ) -> tuple[np.ndarray, ...] | None:
    """``order``'s ops as arrays: stage, kind code (:data:`_KIND_CODE`), micro-batch,
    sequence field, sequence chunk index (0 for whole ops) and each op's key
    (:func:`_op_key`); None when
    an op lies outside the schedule's stages, kinds, micro-batches and sequence chunks,
    or is a W of a schedule that does not split the backward."""
    n = len(order)
    stage = np.fromiter(map(itemgetter(0), order), np.int64, n)
    kind = np.fromiter(map(_KIND_CODE.get, map(itemgetter(1), order), repeat(-1)), np.int64, n)
    mb = np.fromiter(map(itemgetter(2), order), np.int64, n)
    seq = np.fromiter(map(itemgetter(3), order), np.int64, n)
    return _code_arrays(schedule, stage, kind, mb, seq)


def _code_arrays(schedule: Schedule, stage: np.ndarray, kind: np.ndarray, mb: np.ndarray,
                 seq: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """:func:`_coded` of ops given as their stage, kind code, micro-batch and sequence field
    (non-empty arrays)."""
    S, M = schedule.num_stages, schedule.num_microbatches
    k = schedule.seq_chunks
    K = k if k > 1 else 1
    chunk = seq if k > 1 else seq - WHOLE
    if (stage.min() < 0 or stage.max() >= S or kind.min() < 0
            or kind.max() >= (3 if schedule.split_backward else 2) or mb.min() < 0
            or mb.max() >= M or chunk.min() < 0 or chunk.max() >= K):
        return None
    return stage, kind, mb, seq, chunk, _op_key(schedule, stage, kind, mb, chunk)


def _rank_coded(schedule: Schedule, order: Sequence[Op] | None = None
                ) -> tuple[np.ndarray, ...] | None:
    """:func:`_coded` of the schedule's ops in rank order (``order``, where the caller has
    it: each rank's in program order), worked out once and kept on the schedule
    (read-only arrays): validation's checks, its symbolic run and
    :attr:`Schedule.op_counts` read them."""
    if "_rank_coded" not in schedule.__dict__:
        if order is None:
            order = list(chain.from_iterable(schedule.rank_ops))
        coded = _coded(schedule, order) if order else None
        for a in coded or ():
            a.flags.writeable = False
        schedule.__dict__["_rank_coded"] = coded  # a frozen instance's cache, as cached_property
    return schedule.__dict__["_rank_coded"]


def rank_coded(schedule: Schedule) -> tuple[np.ndarray, ...] | None:
    """The schedule's ops in rank order (each rank's in program order) as read-only arrays:
    stage, kind code (:data:`_KIND_CODE`), micro-batch, sequence field, sequence chunk and
    key (:func:`_coded`); None where an op does not code. Kept on the schedule."""
    return _rank_coded(schedule)


def with_coded(schedule: Schedule, stage: np.ndarray, kind: np.ndarray, mb: np.ndarray,
               seq: np.ndarray) -> Schedule:
    """``schedule``, keeping :func:`_rank_coded` of its ops as a builder that knows them as
    arrays gives them (the stage, kind code, micro-batch and sequence field of each op in
    rank order), instead of reading them off the ops: 131,072 ops of Megatron 1T's
    interleaved schedule cost ~19 ms that way, ~1 ms this way. The builder's arrays must
    be those of its ops (``tests/test_schedules_coded.py`` holds each such builder to
    :func:`_coded`); validation then checks the ops through them, as it would."""
    if schedule.fused or not len(stage):
        return schedule
    coded = _code_arrays(schedule, stage, kind, mb, seq)
    for a in coded or ():
        a.flags.writeable = False
    schedule.__dict__["_rank_coded"] = coded  # a frozen instance's cache, as cached_property
    return schedule


def _op_key(schedule: Schedule, stage: np.ndarray, kind: int | np.ndarray, mb: np.ndarray,
            chunk: np.ndarray) -> np.ndarray:
    """A distinct integer per (stage, kind, micro-batch, chunk), below S·3·M·K."""
    M, K = schedule.num_microbatches, max(schedule.seq_chunks, 1)
    return ((stage * 3 + kind) * M + mb) * K + chunk


def producer_positions(schedule: Schedule, order: Sequence[Op],
                       coded: tuple[np.ndarray, ...] | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """For each op of ``order``, the positions in ``order`` of its :func:`op_deps`, in that
    order (``len(order)`` for a producer missing from it), worked out on arrays: three
    integer arrays, the first, second and third producer of each op, -1 past its last one.

    None when an op lies outside the schedule's stages, kinds, micro-batches and
    sequence chunks, or repeats, or is a W of a schedule that does not split the
    backward: the caller then takes :func:`op_deps` op by op (which names the problem).
    ``coded``: :func:`_coded` of ``order``, where the caller has it.
    """
    n = len(order)
    if not n:
        return (np.zeros(0, dtype=np.int64),) * 3
    if coded is None:
        coded = _coded(schedule, order)
    if coded is None:
        return None
    stage, kind, mb, seq, chunk, own = coded
    S, k = schedule.num_stages, schedule.seq_chunks
    K = k if k > 1 else 1
    # a producer's key (_op_key) is the op's own plus a constant: the chunk's stride is 1,
    # the kind's M K, the stage's 3 M K (no key worked out again: 1F1B on 16 ranks with 48
    # micro-batches 1.18 -> 0.76 M instructions); a key past either end reads the padding
    # (a negative index wraps into it), and is masked
    kind_step = schedule.num_microbatches * K
    stage_step = 3 * kind_step
    at = np.full(S * stage_step + stage_step, n, dtype=np.int64)
    positions = np.arange(n, dtype=np.int64)
    at[own] = positions
    if not np.array_equal(at[own], positions):  # an op twice
        return None
    none = np.full(n, -1, dtype=np.int64)
    fwd, bwd, wgt = kind == 0, kind == 1, kind == 2
    # F(s, m, c) after F(s-1, m, c) and F(s, m, c-1); B(s, m, c) after F(s, m, c),
    # B(s+1, m, c) and B(s, m, c+1); W(s, m, c) after B(s, m, c) (op_deps, in its order)
    first = np.where(fwd & (stage > 0), at[own - stage_step], none)
    first = np.where(bwd | wgt, at[own - kind_step], first)
    second = np.where(fwd & (seq > 0), at[own - 1], none)
    second = np.where(bwd & (stage < S - 1), at[own + stage_step], second)
    third = np.where(bwd & (seq != WHOLE) & (seq < k - 1), at[own + 1], none)
    # present producers first, in order
    gap = first < 0
    first, second, third = (np.where(gap, second, first), np.where(gap, third, second),
                            np.where(gap, none, third))
    gap = second < 0
    second, third = np.where(gap, third, second), np.where(gap, none, third)
    return first, second, third


def unit_times(schedule: Schedule) -> Mapping[Op, tuple[float, float]]:
    """:func:`list_schedule` with unit durations (the symbolic run :func:`validate` checks and
    lowering orders ops by), computed once per schedule and kept on it (read-only)."""
    cached = schedule.__dict__.get("_unit_times")
    if cached is None:
        ops, start, end = unit_spans(schedule)
        cached = dict(zip(ops, zip(start.tolist(), end.tolist(), strict=True), strict=True))
        schedule.__dict__["_unit_times"] = cached  # a frozen instance's cache, as cached_property
    return MappingProxyType(cached)


def unit_spans(schedule: Schedule) -> tuple[tuple[Op, ...], np.ndarray, np.ndarray]:
    """:func:`unit_times` as its ops (in its order) and their starts and ends (read-only
    arrays): what lowering reads, without the mapping (a dict of every op)."""
    found = schedule.__dict__.get("_unit_spans")
    if found is None:
        found, run = _unit_run(schedule)
        for a in found[1:]:
            a.flags.writeable = False
        schedule.__dict__["_unit_spans"] = found  # a frozen instance's cache, as cached_property
        schedule.__dict__["_unit_rank_run"] = run
    return found


def _unit_run(schedule: Schedule) -> tuple[tuple[tuple[Op, ...], np.ndarray, np.ndarray],
                                           tuple[np.ndarray, ...] | None]:
    """:func:`unit_spans` and, for a schedule without fused groups
    whose ops code (:func:`_coded`), what it worked out on the way in rank order (the
    ops of all ranks, each rank's in program order): the rank-order position of each op
    of the result in its order, the :func:`_coded` arrays and the producer columns of
    :func:`producer_positions` (:func:`unit_order`, :func:`producers_at`). From
    :data:`SWEEP_RANKS` ranks, such a schedule's run is :func:`_unit_sweep`'s (its ops by
    start and rank), else the loop's (its ops as its passes placed them): the same times."""
    order = list(chain.from_iterable(schedule.rank_ops))  # (C's loop: half a comprehension's)
    coded = None if schedule.fused or not order else _rank_coded(schedule, order)
    found = None if coded is None else producer_positions(schedule, order, coded)
    if found is None:
        times = list_schedule(schedule, lambda op: 1.0)
        spans = np.array(list(times.values()), dtype=float).reshape(len(times), 2)
        return (tuple(times), spans[:, 0], spans[:, 1]), None
    swept = (_unit_sweep([len(ops) for ops in schedule.rank_ops], found)
             if schedule.num_ranks >= SWEEP_RANKS else None)
    if swept is not None:  # (a deadlock: the loop below names it)
        at, start = swept
        run = (at, *coded[:4], *found)
        for a in run:  # kept on a shared schedule
            a.flags.writeable = False
        # the ops in that order, gathered in C: as objects of an array, taken by index
        # (1T: 32 against 42 M instructions an itemgetter of the indices took)
        ops = tuple(np.fromiter(order, dtype=object, count=len(order))[at].tolist())
        return (ops, start, start + 1.0), run
    starts, ends, scheduled = _list_unfused(schedule, [1.0] * len(order), order, found)
    n = len(order)
    at = np.fromiter(scheduled, dtype=np.int64, count=n)  # (fromiter: faster than np.array)
    del ends[len(order)]  # the missing producer's slot
    run = (at, *coded[:4], *found)
    for a in run:  # kept on a shared schedule
        a.flags.writeable = False
    ops = tuple(map(order.__getitem__, scheduled))
    return (ops, np.fromiter(starts, dtype=float, count=n)[at],
            np.fromiter(ends, dtype=float, count=n)[at]), run


SWEEP_RANKS = 16
"""Pipeline ranks from which :func:`_unit_run` takes :func:`_unit_sweep` (a few array calls
per unit of time, each over the ranks) instead of the loop (:func:`_list_unfused`, op by
op): the sweep wins where a step starts many ops. Instructions per run (callgrind),
sweep against loop: Megatron 1T's interleaved schedule (64 ranks, 512 micro-batches, 2
chunks: 131,072 ops in 2,174 steps) 115 against 423 M; 32 ranks, 256, 2: 47 against 106
M; 1F1B on 16 ranks, 192 micro-batches (GPT-3 175B's in-process run): 16.5 against 25.3
M; interleaved on 16 ranks, 64, 2: 11.6 against 13.6 M; 1F1B on 8 ranks, 64: 5.5
against 4.1 M (the loop's)."""


def _unit_sweep(lengths: Sequence[int], columns: Sequence[np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """The unit-duration run of :func:`_list_unfused` (every op takes 1), a unit of time at
    a time: at step ``t`` every rank whose next op's producers were all placed at earlier
    steps (ended by ``t``) starts that op at ``t``; the loop's starts, as each op starts
    when its rank is free (its previous op, started at ``t - 1`` at the latest, ended by
    ``t``) and its producers have ended, all at whole times. The ops of ranks of
    ``lengths`` ops each, in rank order, their producers the columns of
    :func:`producer_positions` (-1: none; ``sum(lengths)``: missing from the schedule).

    Returns the rank-order positions of the ops in the order of their (start, rank), and
    their starts (floats, read-only where kept); None where a step starts no op (a
    deadlock: every rank waits on an op never placed). The loop places the same ops at
    the same times in another order (its passes'); what reads the run sorts it by
    (end, rank, start), which is this order (a rank runs one op a unit of time), or needs
    only producers before consumers (:func:`sim.search.plan.list_run`)."""
    p, n = len(lengths), sum(lengths)
    rank = np.repeat(np.arange(p, dtype=np.int64), lengths)
    # op k at slot k + rank[k]: after each rank's ops a slot whose producer is never done,
    # where the rank's cursor stays once it is through; slot n + p: that producer (and one
    # missing from the schedule), n + p + 1: an absent one, done from the start
    size = n + p
    ids = np.arange(n, dtype=np.int64)
    slot = np.empty(n + 2, dtype=np.int64)
    np.add(ids, rank, out=slot[:n])
    slot[n], slot[n + 1] = size, size + 1
    # a producer earlier on the op's own rank is placed before the rank reaches the op:
    # not checked (1F1B's and interleaved's backward on its forward), the others packed
    # first, so that fewer columns are read a step (1T: one)
    first_of_rank = np.repeat(np.cumsum(lengths) - lengths, lengths)
    cols = [np.where((col >= first_of_rank) & (col < ids), -1, col) for col in columns]
    for _ in range(len(cols) - 1):
        for c in range(len(cols) - 1):
            gap = cols[c] < 0
            cols[c], cols[c + 1] = (np.where(gap, cols[c + 1], cols[c]),
                                    np.where(gap, -1, cols[c + 1]))
    producers = []
    for col in [col for col in cols if (col >= 0).any()] or [np.full(n, -1, np.int64)]:
        by_slot = np.full(size, size, dtype=np.int64)
        by_slot[slot[:n]] = slot[np.where(col < 0, n + 1, col)]
        producers.append(by_slot)
    done = np.zeros(size + 2, dtype=bool)
    done[size + 1] = True
    cursor = np.zeros(p, dtype=np.int64)
    np.cumsum(lengths[:-1], out=cursor[1:])
    cursor += np.arange(p)
    first, rest = producers[0], producers[1:]
    steps: list[np.ndarray] = []
    left = n
    while left:
        # (the arrays' take methods: np.take adds two Python calls a take)
        ok = done.take(first.take(cursor))
        for col in rest:
            ok &= done.take(col.take(cursor))
        placed = cursor[ok]
        if not len(placed):
            return None
        done[placed] = True
        steps.append(placed)
        cursor += ok
        left -= len(placed)
    position = np.empty(size, dtype=np.int64)  # (of a slot of an op)
    position[slot[:n]] = np.arange(n, dtype=np.int64)
    start = np.repeat(np.arange(len(steps), dtype=float), list(map(len, steps)))
    return position[np.concatenate(steps)], start


def unit_order(schedule: Schedule) -> tuple[np.ndarray, ...] | None:
    """For the ops of :func:`unit_times` in its order: their positions in rank order, and
    their stages, kind codes (:data:`_KIND_CODE`) and sequence fields, as arrays; None
    where :func:`unit_times` did not work them out (fused groups, ops that do not code)."""
    unit_spans(schedule)
    run = schedule.__dict__["_unit_rank_run"]
    if run is None:
        return None
    at = run[0]
    return at, run[1][at], run[2][at], run[4][at]


def producers_at(schedule: Schedule, positions: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """:func:`producer_positions` of the ops at rank-order ``positions`` (a permutation of
    them, :func:`unit_order`), as positions in that order: the rank order's columns,
    kept by :func:`unit_times`, renumbered. None where it kept none."""
    unit_spans(schedule)
    run = schedule.__dict__["_unit_rank_run"]
    if run is None:
        return None
    n = len(positions)
    new = np.empty(n + 1, dtype=np.int64)
    new[positions] = np.arange(n, dtype=np.int64)
    new[n] = n  # a producer missing from the schedule stays missing
    return tuple(np.where(col >= 0, new[col], -1) for col in (c[positions] for c in run[5:]))


_GRID_CONTEXT = 6
"""Ops shown on each side of a blocked op in a deadlock message (the rest are elided)."""


def _deadlock_message(schedule: Schedule, pos: Sequence[int], done: Mapping[Op, float]) -> str:
    """The per-rank op grid with each rank's blocked group marked ``*`` and what it waits on.

    Every op from the marked one to the end of its rank waits forever; the
    marked one names the producers (and their ranks) that can never finish.
    Long rows are elided around the blocked op.
    """
    lines = [f"schedule {schedule.name} deadlocks; ops marked * wait forever:"]
    for r, ops in enumerate(schedule.rank_ops):
        tokens = []
        at = None
        i = 0
        for group in _split_groups(ops, schedule.fused):
            text = FUSE.join(map(str, group))
            if i == pos[r]:
                at = len(tokens)
                waits = [
                    f"{d} later on rank {r}" if schedule.stage_rank[d.stage] == r
                    else f"{d}@rank{schedule.stage_rank[d.stage]}"
                    for op in group
                    for d in schedule_deps(schedule, op)
                    if d not in done and d not in group
                ]
                text = f"*{text}(waits {','.join(dict.fromkeys(waits))})"
            tokens.append(text)
            i += len(group)
        if at is None:
            lines.append(f"  rank {r}: (all {len(ops)} ops done)")
            continue
        lo, hi = max(0, at - _GRID_CONTEXT), min(len(tokens), at + _GRID_CONTEXT + 1)
        shown = tokens[lo:hi]
        if lo:
            shown.insert(0, f"...({lo} done)")
        if hi < len(tokens):
            shown.append(f"...(+{len(tokens) - hi} more)")
        lines.append(f"  rank {r}: " + " ".join(shown))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- builders


def _check_pm(name: str, p: int, m: int) -> None:
    if p < 1:
        raise ScheduleError(f"schedule {name}: pipeline size p={p} must be >= 1")
    if m < 1:
        raise ScheduleError(f"schedule {name}: micro-batches m={m} must be >= 1")


def _plain_stage_rank(p: int) -> tuple[int, ...]:
    return tuple(range(p))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): all forwards, then all backwards in reverse order.

    Step time (m + p - 1)(F + B) with uniform stages; holds m micro-batches of activations.
    """
    _check_pm("gpipe", p, m)
    ranks = tuple(
        tuple(Op(r, FORWARD, i) for i in range(m))
        + tuple(Op(r, BACKWARD, i) for i in reversed(range(m)))
        for r in range(p)
    )
    return Schedule("gpipe", m, _plain_stage_rank(p), ranks, notes="Huang et al. 2019")


def one_f_one_b(p: int, m: int, window: int = 1) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021, SC'21, fig. 4 top).

    Rank r warms up with min(p - r - 1, m) forwards, alternates one forward and
    one backward, then drains the backwards. At most p - r micro-batches are in
    flight on rank r. Step time (m + p - 1)(F + B) with uniform stages.

    ``window``: warm up with ``min(window * (p - r - 1), m)`` forwards instead, for a
    stage served by a pool of ``window`` peers (:mod:`sim.swarm`: each peer keeps about
    as many micro-batches in flight as one GPU of the plain pipeline); still free of
    deadlock, as each rank warms up at least as much as the next.
    """
    _check_pm("1f1b", p, m)
    kind, mb = _one_f_one_b_coded(p, m, window)  # the ops as arrays (with_coded)
    stage = np.repeat(np.arange(p, dtype=np.int64), 2 * m)
    # the ops themselves taken from the pool by those arrays (equal, field for field, to
    # the loop of _one_f_one_b_reference: tests/test_schedule_fastpaths.py)
    ops = _whole_ops(stage, kind, mb)
    ranks = tuple(tuple(ops[r * 2 * m:(r + 1) * 2 * m]) for r in range(p))
    return with_coded(
        Schedule("1f1b", m, _plain_stage_rank(p), ranks, notes="Narayanan et al. 2021"),
        stage, kind, mb, np.full(2 * m * p, WHOLE, dtype=np.int64))


_KIND_LETTERS = np.array([FORWARD, BACKWARD, WEIGHT_GRAD], dtype=object)
"""Each kind code's letter (:data:`_KIND_CODE`), indexed by an array of codes: the same
string objects as the named constants."""

_POOL_MAX = 1 << 18
"""Most ops :func:`_whole_ops` keeps in its pool (~25 MB at ~100 B an op); a schedule
needing a larger pool builds its ops without one."""

_pool: list[np.ndarray] = [np.empty((0, 2, 0), dtype=object)]
"""The op pool of :func:`_whole_ops`: ``_pool[0][stage, kind code, micro-batch]`` is
``Op(stage, kind, micro-batch)`` (sequence field ``WHOLE``), for the kinds F and B and
every stage and micro-batch below the array's bounds."""


def _whole_ops(stage: np.ndarray, kind: np.ndarray, mb: np.ndarray) -> list[Op]:
    """The whole-micro-batch ops (sequence field ``WHOLE``) of the given stages, kind codes
    (:data:`_KIND_CODE`: F or B, 0 or 1) and micro-batches (non-empty arrays, in range), as
    a list.

    Ops are immutable values, so schedules share them: they are taken from a pool kept
    across builds (a numpy array of objects, gathered in C), the pool grown to the bounds
    asked for where it falls short. Making a named tuple costs ~1,300 instructions even
    in C (``tuple.__new__`` on a subclass), gathering one from the pool ~100: the 1,536
    ops of 1F1B on 16 ranks with 48 micro-batches, after the 6,144 of 192 micro-batches,
    ~0.2 M instructions instead of ~2.5 M. Beyond :data:`_POOL_MAX` ops the ops are made
    afresh (map over zip, in C)."""
    pool = _pool[0]
    need_s, need_m = int(stage.max()) + 1, int(mb.max()) + 1
    have_s, _, have_m = pool.shape
    if need_s > have_s or need_m > have_m:
        size_s, size_m = max(need_s, have_s), max(need_m, have_m)
        if size_s * 2 * size_m > _POOL_MAX:
            return list(map(_op, zip(stage.tolist(), _KIND_LETTERS[kind].tolist(),
                                     mb.tolist(), repeat(WHOLE))))
        grown = np.empty((size_s, 2, size_m), dtype=object)
        grown[:have_s, :, :have_m] = pool
        for s in range(size_s):
            for k, letter in enumerate((FORWARD, BACKWARD)):
                lo = have_m if s < have_s else 0
                grown[s, k, lo:] = np.fromiter(  # (objects: not read as sequences)
                    map(_op, zip(repeat(s), repeat(letter), range(lo, size_m), repeat(WHOLE))),
                    dtype=object, count=size_m - lo)
        _pool[0] = pool = grown
    return pool[stage, kind, mb].tolist()


def _one_f_one_b_reference(p: int, m: int, window: int = 1) -> Schedule:
    """:func:`one_f_one_b`, op by op in the order of its description (the reference its
    array-built ops are tested against; without the coded arrays)."""
    _check_pm("1f1b", p, m)
    ranks = []
    for r in range(p):
        warmup = min(window * (p - r - 1), m)
        ops: list[Op] = [Op(r, FORWARD, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops.append(Op(r, FORWARD, warmup + i))
            ops.append(Op(r, BACKWARD, i))
        ops.extend(Op(r, BACKWARD, i) for i in range(m - warmup, m))
        ranks.append(tuple(ops))
    return Schedule("1f1b", m, _plain_stage_rank(p), tuple(ranks), notes="Narayanan et al. 2021")


def _one_f_one_b_coded(p: int, m: int, window: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The kind codes and micro-batches of :func:`one_f_one_b`'s ops in rank order, for all
    ranks at once (a row of 2m places per rank; a rank's loop of a dozen array calls took
    ~60 us a rank): the warm-up's forwards, then forward and backward in turn, then the
    remaining backwards."""
    place = np.arange(2 * m, dtype=np.int64)
    warmup = np.minimum(window * (p - 1 - np.arange(p, dtype=np.int64)), m)[:, None]
    inner = place - warmup  # (a place in the alternating part, where 0 <= inner < 2 steady)
    steady = m - warmup
    alternating = (inner >= 0) & (inner < 2 * steady)
    odd = inner & 1
    kind = np.where(place < warmup, 0, np.where(alternating, odd, 1))
    mb = np.where(place < warmup, place,
                  np.where(alternating, np.where(odd == 1, inner >> 1, warmup + (inner >> 1)),
                           inner - steady))
    return kind.reshape(-1), mb.reshape(-1)


def from_text(
    text: str, num_microbatches: int | None = None, name: str = "custom", vpp: int | None = None
) -> Schedule:
    """Parse a custom schedule: one line per pipeline rank of ops in canonical text form.

    Blank lines and ``#`` comments are ignored; an optional ``rank N:`` prefix is
    allowed. Stage ownership is taken from where the ops sit; a schedule with W
    ops splits the backward; ops joined by ``&`` form a fused group; ops with a
    sequence-chunk suffix (``1F3.2``) make a Seq1F1B-style schedule with
    k = 1 + the largest chunk index.
    """
    rows: list[tuple[Op, ...]] = []
    fused: set[Op] = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.lower().startswith("rank") and ":" in line:
            line = line.split(":", 1)[1]
        row: list[Op] = []
        for token in line.split():
            members = [Op.parse(part) for part in token.split(FUSE)]
            fused.update(members[:-1])
            row.extend(members)
        rows.append(tuple(row))
    if not rows:
        raise ScheduleError("custom schedule has no ops")
    owner: dict[int, int] = {}
    for r, ops in enumerate(rows):
        for op in ops:
            if owner.setdefault(op.stage, r) != r:
                raise ScheduleError(
                    f"op {op} is on rank {r} but stage {op.stage} also has ops on rank "
                    f"{owner[op.stage]}"
                )
    num_stages = max(owner) + 1
    if len(owner) != num_stages:  # the first gap, without a list as long as the stage numbers
        gap = next(s for s, t in enumerate(sorted(owner)) if s != t)
        raise ScheduleError(f"custom schedule has no ops for stage {gap} (its stages go up "
                            f"to {num_stages - 1}, {num_stages - len(owner):,} of them missing)")
    m = max(op.mb for ops in rows for op in ops) + 1
    if num_microbatches is not None and m != num_microbatches:
        raise ScheduleError(
            f"custom schedule has {m} micro-batches but the experiment needs {num_microbatches}"
        )
    split = any(op.kind == WEIGHT_GRAD for ops in rows for op in ops)
    k = max(op.seq for ops in rows for op in ops) + 1
    sched = Schedule(name, m, tuple(owner[s] for s in range(num_stages)), tuple(rows), split,
                     fused=frozenset(fused), seq_chunks=max(k, 1))
    validate(sched)
    return sched


def count_in_flight(ops: Iterable[Op]) -> int:
    """Most micro-batches whose forward ran and whose backward has not, in program order."""
    live = peak = 0
    for op in ops:
        if op.kind == FORWARD:
            live += 1
            peak = max(peak, live)
        elif op.kind == BACKWARD:
            live -= 1
    return peak
