"""Idle time of every GPU's compute stream, broken down by cause. Pure (no SimPy, no matplotlib).

Every instruction starts when its latest-finishing predecessor (a dependency
or its stream predecessor; for a collective, that of the member that
arrived last) completes, so the chain of latest predecessors from any
instruction back to the start of the run is contiguous in time: its end time
is the sum of the spans along that chain. Each span splits by cause: nominal
compute, the excess of compute on a straggler (``(1 - 1/s)`` of its duration
at slowdown ``s``; on a cluster mixing GPU types, all of an op's time beyond its
time on the fastest type), and communication of each kind (sends, collectives, the
blocking communication folded into a collapsed compute op). Summing along the
chain gives, for every instruction, its end time by cause.

An idle gap ``[a, b)`` of a GPU's compute stream runs from the end ``a`` of
its previous compute span to the moment ``b`` its next compute op ``x``
becomes ready (for the trailing gap, the end of the run). Both ends are
chain sums: ``b`` that of ``x``'s latest predecessor, ``a`` that of the
previous op. The gap's share of each cause is the difference of the two
sums (the common prefix of the chains cancels):

* nominal compute -> ``bubble``: the pipeline's own structure (fill, drain,
  the round trip of a micro-batch through later stages, unequal stages);
* straggler excess -> ``straggler``: what the gap would shrink by if every
  straggler ran at nominal speed (so one slow stage in 1F1B puts exactly the
  extra idle time it causes on ``straggler``), or, mixing GPU types, if every
  op ran as fast as on the fastest type;
* communication -> its kind (``tp``, ``cp``, ``ep``, ``pp``, ``dp``),
  including waiting for another replica's communication.

A share can come out negative when the chain that freed the GPU held more
of a cause than the chain that ended the gap; then the positive shares are
scaled down so that they sum to the gap. Either way every gap is split
completely, so each GPU's shares add up to its idle time (up to
floating-point rounding). With a window (the steady-state step of a
multi-step run) each gap counts with the part of it inside the window, its
shares scaled alike. ``failure`` (work lost to failures and restarts) is zero
within a step; a multi-step run adds it (``idle_breakdown_run_s`` of
:func:`sim.api.simulate_run`).

The idea is the critical-path analysis of parallel programs (Yang and Miller
1988, "Critical path analysis for the execution of parallel and distributed
programs"), applied per idle gap, with causes as in production breakdowns of
pipeline stalls (Feng et al. 2024, Optimus: DP, PP and TP waiting time).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from operator import sub

import numpy as np

from base.collector import gc_paused
from sim.chains import Hint, level_plan, levels, sum_levels
from sim.colshape import LatestRuns, bits, shape_of
from sim.intervalcols import grouped
from sim.timeline import COMM_KINDS, IDLE_CAUSES
from workloads.packed import PackedInstructions
from workloads.program import (
    COMPUTE,
    Collective,
    ColumnarInstructions,
    Columns,
    Compute,
    Program,
    Send,
)

_COMM = tuple(c for c in IDLE_CAUSES if c in COMM_KINDS)

_PARTS = ("bubble", *_COMM, "straggler")
"""Causes a span can hold (nominal compute is counted as ``bubble``)."""
_INDEX = {c: k for k, c in enumerate(_PARTS)}
_BUBBLE, _STRAGGLER = _INDEX["bubble"], _INDEX["straggler"]
_WIDTH = len(_PARTS)
"""Doubles in a chain sum's row (:func:`_cumulative`)."""


def _chains(program: Program, ready_s: Sequence[float], end_s: Sequence[float]
            ) -> tuple[array[float], array[int], dict[int, list[int]], array[int],
                       dict[int, tuple[float, int]]]:
    """Per instruction: start of its span and its latest-finishing predecessor (-1: none);
    per GPU, its compute ops in program order; per instruction the part (:data:`_PARTS`)
    its span adds to (a compute op's nominal part, ``bubble``, less its blocking
    communication: :func:`_add_own`), and the compute ops with blocking communication
    (its seconds and part), what :func:`_chain_rows` reads."""
    instrs = program.instructions
    if isinstance(instrs, PackedInstructions):  # the same loop on the packed columns
        from sim.packedpass import chains

        return chains(program, ready_s, end_s, _INDEX.get, _BUBBLE)
    start = array("d", ready_s[:len(instrs)])  # doubles, not float objects: memory
    cause = array("q", [-1]) * len(instrs)
    part = array("b", [_BUBBLE]) * len(instrs)
    blocked: dict[int, tuple[float, int]] = {}
    index = _INDEX.get
    last_compute: dict[int, int] = {}  # per GPU, the latest instruction of its compute stream
    last_other: dict[tuple[int, object], int] = {}  # per (GPU, dst) or (GPU, kind): sends,
    members: dict[int, list[int]] = {}  # collectives (keys as the engine's streams)
    compute: dict[int, list[int]] = {}
    for ins in instrs:
        i = ins.id
        cls = type(ins)
        if cls is Compute:
            g = ins.gpu
            best = last_compute.get(g, -1)
            last_compute[g] = i
            ops = compute.get(g)
            if ops is None:
                compute[g] = [i]
            else:
                ops.append(i)
            if ins.blocking_comm_s > 0:
                blocked[i] = (ins.blocking_comm_s, index(ins.blocking_comm_kind, _BUBBLE))
        else:  # a collective's stream is its kind (Collective.stream, without the call)
            key = (ins.gpu, ins.dst) if cls is Send else (ins.gpu, ins.kind)
            best = last_other.get(key, -1)
            last_other[key] = i
            part[i] = index(ins.kind, _BUBBLE)
        best_end = end_s[best] if best >= 0 else -1.0
        for d in ins.deps:
            if end_s[d] > best_end:
                best, best_end = d, end_s[d]
        cause[i] = best
        if cls is Collective and len(ins.group) > 1:  # a collective of one is its member's
            group = members.setdefault(ins.key, [])
            group.append(i)
            if len(group) == len(ins.group):  # its last member: settled (groups are disjoint)
                del members[ins.key]
                latest = max(group, key=lambda j: (ready_s[j], -j))
                for j in group:
                    start[j] = ready_s[latest]
                    cause[j] = cause[latest]
    for group in members.values():  # members missing (not in this program): as they are
        latest = max(group, key=lambda j: (ready_s[j], -j))
        for j in group:
            start[j] = ready_s[latest]
            cause[j] = cause[latest]
    return start, cause, compute, part, blocked


class _Excess:
    """What of a compute op's time counts as ``straggler``: ``(1 - 1/s)`` of it on a straggler
    of slowdown ``s`` (``slowdown``, per GPU); on a cluster mixing GPU types (``nominal``
    given: an op's time on the fastest type), all it takes beyond that time, which
    includes any straggler's slowdown. False (no excess anywhere) when neither is given."""

    __slots__ = ("slowdown", "nominal")

    def __init__(self, slowdown: Mapping[int, float],
                 nominal: Callable[[Compute], float] | None = None) -> None:
        self.slowdown, self.nominal = slowdown, nominal

    def __bool__(self) -> bool:
        return bool(self.slowdown) or self.nominal is not None

    def of(self, ins: Compute, work: float) -> float:
        """The excess of ``ins``, a compute op that ran ``work`` seconds."""
        if self.nominal is not None:
            excess = work - self.nominal(ins)
            return excess if excess > 0.0 else 0.0
        s = self.slowdown.get(ins.gpu, 1.0)
        return work * (1.0 - 1.0 / s) if s != 1.0 else 0.0


def _add_own(row: MutableSequence[float], ins: object, span: float, slowdown: _Excess) -> None:
    """Add an instruction's span, split by cause (:data:`_PARTS`), to ``row`` in place."""
    if type(ins) is Compute:
        blocking = min(ins.blocking_comm_s, span) if ins.blocking_comm_s > 0 else 0.0
        if blocking:
            row[_INDEX.get(ins.blocking_comm_kind, _BUBBLE)] += blocking
        work = span - blocking
        excess = slowdown.of(ins, work) if slowdown else 0.0
        row[_STRAGGLER] += excess
        row[_BUBBLE] += work - excess
    else:  # a kind outside COMM_KINDS would be a lowering bug: counted as bubble, not lost
        row[_INDEX.get(ins.kind, _BUBBLE)] += span


def _cumulative(program: Program, start: Sequence[float], cause: Sequence[int],
                end_s: Sequence[float], slowdown: _Excess) -> array[float]:
    """Per instruction, its end time by cause: the sum of its spans' parts along its chain,
    as a row of :data:`_WIDTH` doubles (instruction ``i``'s at ``i * _WIDTH``) of one flat
    array: 56 bytes an instruction, where a list of floats per row took about 150."""
    instrs = program.instructions
    zero = array("d", bytes(8 * _WIDTH))
    cum = array("d", bytes(8 * _WIDTH * len(instrs)))
    done = bytearray(len(instrs))
    index = _INDEX.get
    for i in range(len(instrs)):
        if done[i]:
            continue
        c = cause[i]
        if c >= 0 and not done[c]:  # a chain to a later id: sum it from its known end
            _fill_chain(i, instrs, start, cause, end_s, slowdown, cum, done)
            continue
        row = zero[:] if c < 0 else cum[c * _WIDTH:(c + 1) * _WIDTH]
        ins = instrs[i]
        if slowdown or type(ins) is not Compute:
            _add_own(row, ins, end_s[i] - start[i], slowdown)
        else:  # _add_own without stragglers: the blocking part, the rest is nominal
            span = end_s[i] - start[i]
            blocking = ins.blocking_comm_s
            if blocking > 0:
                if blocking > span:
                    blocking = span
                if blocking:
                    row[index(ins.blocking_comm_kind, _BUBBLE)] += blocking
                span -= blocking
            row[_BUBBLE] += span
        cum[i * _WIDTH:(i + 1) * _WIDTH] = row
        done[i] = 1
    return cum


def _chain_rows(start: array[float], cause: array[int], end_s: Sequence[float],
                part: array[int], blocked: Mapping[int, tuple[float, int]]
                ) -> tuple[np.ndarray, list[int]] | None:
    """:func:`_cumulative` without stragglers, on arrays: the same floats, as a matrix of
    ``n + 1`` rows (the last one zero, the sum before a root) of the parts that any
    instruction adds to (:data:`_PARTS` indices, the second item; the others are zero).

    The chains form a forest (``cause``: each instruction's parent); a row is its parent's
    plus its own span in its part (``part``; a compute op's blocking communication,
    ``blocked``, first in that kind's part, the rest of its span in ``bubble``): one
    addition per part, as the loop makes it. So the rows are summed a level of the forest
    at a time (:func:`sim.chains.levels`: a few array operations per level, and the chains
    are as long as the step's critical path, not as the program), in any order within a
    level.
    None where ``cause`` is not a forest (the loop then decides)."""
    n = len(cause)
    parent = np.frombuffer(cause, dtype=np.int64)
    up = np.where(parent < 0, n, parent).astype(np.int32)  # n: the zero row before a root
    found = levels(up)
    if found is None:
        return None
    order, bounds = found
    begin_of = np.frombuffer(start, dtype=float)
    end_of = (np.frombuffer(end_s, dtype=float) if isinstance(end_s, array)
              else np.asarray(end_s, dtype=float))
    own = np.frombuffer(part, dtype=np.int8)
    if blocked:  # a compute op's blocking communication (its seconds, its part), else 0
        seconds, at_part = np.zeros(n), np.zeros(n, dtype=np.int8)
        ids = np.fromiter(blocked, dtype=np.intp, count=len(blocked))
        seconds[ids] = [s for s, _ in blocked.values()]
        at_part[ids] = [p for _, p in blocked.values()]
    # only the parts some instruction adds to (bubble always): the others stay zero, and a
    # zero part changes no gap's split (:func:`_split_gaps`)
    used = sorted({_BUBBLE, *np.flatnonzero(np.bincount(own, minlength=_WIDTH)).tolist(),
                   *(p for _, p in blocked.values())})
    column = np.zeros(_WIDTH, dtype=np.int8)
    column[used] = np.arange(len(used))
    own = column[own]
    if blocked:
        at_part = column[at_part]
    cum = np.zeros((n + 1, len(used)))
    lo = 0
    for hi in bounds:
        level = order[lo:hi]
        lo = hi
        rows = cum[up[level]]
        at = np.arange(len(level))
        span = end_of[level] - begin_of[level]
        if blocked:
            mine = np.flatnonzero(seconds[level] > 0)
            if len(mine):  # as the loop: min(blocking, span) to its part, then the rest
                cut = np.minimum(seconds[level[mine]], span[mine])
                rows[mine, at_part[level[mine]]] += cut
                span[mine] -= cut
        rows[at, own[level]] += span
        cum[level] = rows
    return cum, used


def _fill_chain(i: int, instrs: Sequence[object], start: Sequence[float],
                cause: Sequence[int], end_s: Sequence[float], slowdown: _Excess,
                cum: array[float], done: bytearray) -> None:
    """``cum`` of ``i`` and of the instructions on its chain that lack it (``done``), from
    the root."""
    zero = array("d", bytes(8 * _WIDTH))
    stack = [i]
    while stack:
        j = stack[-1]
        c = cause[j]
        if c >= 0 and not done[c]:
            stack.append(c)
            continue
        stack.pop()
        if not done[j]:
            row = zero[:] if c < 0 else cum[c * _WIDTH:(c + 1) * _WIDTH]
            _add_own(row, instrs[j], end_s[j] - start[j], slowdown)
            cum[j * _WIDTH:(j + 1) * _WIDTH] = row
            done[j] = 1


def _folded(instrs: Sequence) -> tuple[array[float], array[int]]:
    """Per instruction, a compute op's blocking communication (0: none, or not compute) and
    the part it counts in (:data:`_PARTS`)."""
    folded = array("d", bytes(8 * len(instrs)))
    part = array("b", [_BUBBLE]) * len(instrs)
    for i, ins in enumerate(instrs):
        if type(ins) is Compute and ins.blocking_comm_s > 0:
            folded[i] = ins.blocking_comm_s
            part[i] = _INDEX.get(ins.blocking_comm_kind, _BUBBLE)
    return folded, part


def idle_breakdown(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
                   gpus: Sequence[int], slowdown: Mapping[int, float] | None = None,
                   window: tuple[float, float] | None = None,
                   cause: Sequence[int] | None = None,
                   nominal: Callable[[Compute], float] | None = None,
                   reference: bool = False) -> dict[int, dict[str, float]]:
    """Per GPU in ``gpus``, its compute-stream idle seconds by cause
    (:data:`sim.timeline.IDLE_CAUSES`).

    ``ready_s`` and ``end_s`` are the engine's per-instruction times
    (:class:`sim.engine.InstructionTimes`; lists, or float arrays as its
    ``arrays``); ``slowdown`` maps straggler GPUs to
    their compute slowdown factor; ``window`` (default: the whole run, from 0
    to the last end) limits the accounting to a time interval. ``cause``: each
    instruction's latest predecessor where the engine recorded it
    (:attr:`sim.engine.InstructionTimes.cause`), else worked out here.
    ``nominal``, on a cluster mixing GPU types: a compute op's time on the fastest type,
    so that waiting on a slower type counts as ``straggler`` (with the excess of any
    straggler), not as ``bubble``.

    Two ways, with the same floats: the reference follows the chains
    (:func:`_chains`), sums them (:func:`_cumulative`) and splits each GPU's gaps in a
    loop (:func:`_gap_loop`); the fast path does all of it on arrays (:func:`_columnar`),
    for a columnar program (a collapsed one) without stragglers whose latest predecessors
    the engine recorded. ``reference``: the reference even there.
    """
    with gc_paused():  # many small lists, no cycles
        return _breakdown(program, ready_s, end_s, gpus, _Excess(slowdown or {}, nominal),
                          window, None if reference else cause, reference)


def _breakdown(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
               gpus: Sequence[int], slowdown: _Excess,
               window: tuple[float, float] | None, known: Sequence[int] | None,
               reference: bool = False) -> dict[int, dict[str, float]]:
    """:func:`idle_breakdown`, with the garbage collector paused by the caller; the gaps
    split one by one (:func:`_gap_loop`) in the reference, else on arrays
    (:func:`_gaps_on_arrays`, the same floats)."""
    instrs = program.instructions
    if not len(instrs):
        return {g: dict.fromkeys(IDLE_CAUSES, 0.0) for g in gpus}
    if (known is not None and len(known) == len(instrs) and not slowdown
            and isinstance(instrs, ColumnarInstructions)):
        out = _columnar(instrs.columns, ready_s, end_s, known, gpus, window)
        if out is not None:
            return out
    if isinstance(ready_s, np.ndarray) or isinstance(end_s, np.ndarray):  # floats, not scalars
        ready_s, end_s = np.asarray(ready_s).tolist(), np.asarray(end_s).tolist()
    start, cause, compute_of, part, blocked = _chains(program, ready_s, end_s)
    rows = None if reference or slowdown else _chain_rows(start, cause, end_s, part, blocked)
    del part
    if rows is None:
        cum = _cumulative(program, start, cause, end_s, slowdown)
        matrix, used = np.frombuffer(cum, dtype=float).reshape(-1, _WIDTH), list(range(_WIDTH))
    else:
        matrix, used = rows
    run_end = max(end_s)
    last = end_s.index(run_end)  # the first instruction to end the run
    window = window if window is not None else (0.0, run_end)
    if not reference:
        return _gaps_on_arrays(blocked, compute_of, start, cause, end_s, matrix, used, run_end,
                               last, window, gpus)
    folded = _folded(instrs)
    zero = [0.0] * len(_PARTS)

    def row(i: int) -> Sequence[float]:
        return cum[i * _WIDTH:(i + 1) * _WIDTH] if i >= 0 else zero

    return {g: _row(_gap_loop(compute_of.get(g, []), start, cause, end_s, row, folded,
                              run_end, last, window)) for g in gpus}


def _row(shares: Sequence[float]) -> dict[str, float]:
    row = dict.fromkeys(IDLE_CAUSES, 0.0)
    row.update(zip(_PARTS, shares, strict=True))
    return row


def _gap_loop(ops: Sequence[int], start: Sequence[float], cause: Sequence[int],
              end_s: Sequence[float], row: Callable[[int], Sequence[float]],
              folded: tuple[Sequence[float], Sequence[int]], run_end: float, last: int,
              window: tuple[float, float]) -> list[float]:
    """One GPU's idle shares by part (:data:`_PARTS`), gap by gap: the gaps between its
    compute ops ``ops`` (in program order) and after the last one, each split by the
    difference of the chain sums (``row(i)``: instruction ``i``'s, zero for -1) at its two
    ends (module docstring), in the part of it inside ``window``."""
    lo, hi = window
    zero = [0.0] * len(_PARTS)
    shares = [0.0] * len(_PARTS)
    blocking_of, part_of = folded
    a, before = 0.0, zero  # end of the previous compute span, and its chain sum
    for k in range(len(ops) + 1):
        if k < len(ops):
            x = ops[k]
            b = start[x]
            after = row(cause[x])
        else:
            b, after = run_end, row(last)
        inside = (b if b < hi else hi) - (a if a > lo else lo)
        if b > a and inside > 0:
            # the gap's shares are the chain sums' differences, made non-negative and
            # scaled to sum to the gap; here directly to its part inside the window
            positive = [d if d > 0 else 0.0 for d in map(sub, after, before)]
            total = sum(positive)
            if total > 0:
                scale = inside / total
                for c, d in enumerate(positive):
                    if d:  # a zero part adds exactly nothing
                        shares[c] += d * scale
            else:
                shares[_BUBBLE] += inside
        if k < len(ops):
            x = ops[k]
            a = end_s[x]
            before = row(x)
            if blocking_of[x] > 0:  # the gap starts where its compute ends
                blocking = min(blocking_of[x], end_s[x] - start[x])
                a -= blocking
                before = list(before)
                before[part_of[x]] -= blocking
    return shares


_GAPS_AT_ONCE = 1 << 16
"""Gaps :func:`_gaps_on_arrays` splits in one batch of GPUs (its arrays: ~1 MB a part)."""


def _gaps_on_arrays(blocked: Mapping[int, tuple[float, int]],
                    compute_of: Mapping[int, list[int]],
                    start: array[float], cause: array[int], end_s: Sequence[float],
                    matrix: np.ndarray, used: Sequence[int], run_end: float, last: int,
                    window: tuple[float, float], gpus: Sequence[int]
                    ) -> dict[int, dict[str, float]]:
    """The per-GPU loop of :func:`_breakdown` (:func:`_gap_loop` on each GPU) on arrays: the
    gaps of a batch of GPUs, one row each (padded with empty gaps), split at once by
    :func:`_split_gaps`, the same floating-point operations. ``start`` and ``cause`` as
    :func:`_chains` makes them; ``matrix``: per instruction a row of the chain sums of
    the parts ``used`` (:data:`_PARTS` indices; the others are zero), as
    :func:`_chain_rows` makes them, or every part's (:func:`_cumulative`); ``blocked``: the
    compute ops with blocking communication (its seconds, its part), as :func:`_chains`
    makes it."""
    column = np.zeros(_WIDTH, dtype=np.intp)
    column[list(used)] = np.arange(len(used))
    begin_of = np.frombuffer(start, dtype=float)
    cause_of = np.frombuffer(cause, dtype=np.int64)
    end_of = (np.frombuffer(end_s, dtype=float) if isinstance(end_s, array)
              else np.asarray(end_s, dtype=float))
    lo, hi = window
    out: dict[int, dict[str, float]] = {}
    batch: list[int] = []
    gaps = 0
    for pos, g in enumerate(gpus):
        batch.append(g)
        gaps += len(compute_of.get(g, ())) + 1
        if gaps < _GAPS_AT_ONCE and pos + 1 < len(gpus):
            continue
        lists = [compute_of.get(h, []) for h in batch]
        count = np.array([len(ops) for ops in lists], dtype=np.intp)
        ops = np.full((len(batch), int(count.max())), -1, dtype=np.intp)
        folded = np.zeros(ops.shape)
        part = np.full(ops.shape, _BUBBLE, dtype=np.intp)
        for row, ids in enumerate(lists):
            ops[row, :len(ids)] = ids
            if blocked:
                for k, i in enumerate(ids):
                    cut = blocked.get(i)
                    if cut is not None:  # a compute op's blocking communication
                        folded[row, k], part[row, k] = cut
        rows = np.arange(len(batch))
        valid = ops >= 0
        at = np.where(valid, ops, 0)
        begin = np.where(valid, begin_of[at], 0.0)
        finish = np.where(valid, end_of[at], 0.0)
        has = folded > 0
        cut = np.minimum(folded, finish - begin)  # the blocking communication at its end
        zero = np.zeros((len(batch), 1))
        a = np.hstack((zero, np.where(has, finish - np.where(has, cut, 0.0), finish)))
        b = np.hstack((begin, zero))
        b[rows, count] = run_end
        none = np.full((len(batch), 1), -1, dtype=np.intp)
        after_at = np.hstack((np.where(valid, cause_of[at], -1), none))
        after_at[rows, count] = last
        before_at = np.hstack((none, ops))
        after = matrix[np.maximum(after_at, 0)]
        after[after_at < 0] = 0.0
        before = matrix[np.maximum(before_at, 0)]
        before[before_at < 0] = 0.0
        g_at, k_at = np.nonzero(has)
        if len(g_at):
            before[g_at, k_at + 1, column[part[g_at, k_at]]] -= cut[g_at, k_at]
        shares = np.zeros((len(batch), _WIDTH))
        shares[:, used] = _split_gaps(a, b, after, before, lo, hi, int(column[_BUBBLE]))
        out.update(zip(batch, map(_row, shares.tolist()), strict=True))
        batch, gaps = [], 0
    return out


def _split_gaps(a: np.ndarray, b: np.ndarray, after: np.ndarray, before: np.ndarray,
                lo: float, hi: float, bubble: int = _BUBBLE) -> np.ndarray:
    """The idle shares by part of gaps ``[a, b)`` cut to ``[lo, hi]``, along the last axis of
    ``a`` and ``b`` (the gaps of a GPU in order; a gap with ``b <= a`` adds nothing), with
    chain sums ``after`` and ``before`` at their ends (a last axis more, by part; ``bubble``
    the index of that part): the floating-point operations of :func:`_gap_loop`, each
    part summed over the gaps in order (a cumulative sum: no reassociation). ``after``
    and ``before`` are overwritten."""
    parts = after.shape[-1]
    inside = np.minimum(b, hi) - np.maximum(a, lo)
    taken = (b > a) & (inside > 0)
    positive = np.subtract(after, before, out=after)
    np.copyto(positive, 0.0, where=~(positive > 0))  # d if d > 0 else 0.0
    total = positive[..., 0].copy()
    for c in range(1, parts):  # sum(positive), in order
        total += positive[..., c]
    spread = taken & (total > 0)
    scale = np.divide(inside, total, out=np.zeros(b.shape), where=spread)
    contrib = np.multiply(positive, scale[..., None], out=before)  # zero where not spread
    contrib[..., bubble] = np.where(taken & ~spread, inside, contrib[..., bubble])
    return np.cumsum(contrib, axis=-2)[..., -1, :]


def _columnar(columns: Columns, ready_s: Sequence[float], end_s: Sequence[float],
              cause: Sequence[int], gpus: Sequence[int], window: tuple[float, float] | None
              ) -> dict[int, dict[str, float]] | None:
    """:func:`_breakdown` of a columnar program without stragglers (a collapsed one, run by
    :mod:`sim.columnar`), on arrays: the same floats.

    Its collectives have one member each, so every instruction's span starts at its ready
    time and every chain runs to earlier ids. An instruction adds its span to one part
    (a send or collective to its kind's, a compute op to ``bubble``, less its blocking
    communication, which goes to that kind's): the chain sums of a part are a running
    sum along the chains (:func:`_chain_sums`, here on rows laid out by
    :func:`sim.chains.level_plan` and read through each instruction's row). The gaps of all GPUs
    are split at once (:func:`_split_gaps`, one row of gaps per GPU). None (the caller
    takes the general path) where a compute op's blocking communication is of a kind
    outside :data:`_PARTS`: it then adds to ``bubble`` twice. What depends on the
    program's structure alone (:class:`_IdlePlan`) is kept on its shape
    (:func:`sim.colshape.shape_of`), made by :func:`_idle_plan` on first use.
    """
    shape = shape_of(columns)
    plan = shape.derived(("idle", tuple(gpus)), lambda: _idle_plan(columns, gpus))
    if plan.declined:
        return None
    start = np.asarray(ready_s, dtype=float)
    end = np.asarray(end_s, dtype=float)
    causes = np.asarray(cause, dtype=np.intp)
    runs = shape.derived(("idle runs", tuple(gpus)), LatestRuns) if shape.kept else None
    if runs is None:
        return _columnar_sums(columns, plan, start, end, causes, gpus, window)
    key = (bits(end), bits(start), np.asarray(causes, dtype=np.int64), bits(columns.blocking_s),
           bits(np.array([] if window is None else [1.0, *window])))
    found = runs.find(key)
    if found is None:
        found = _columnar_sums(columns, plan, start, end, causes, gpus, window)
        runs.keep(tuple(a.copy() for a in key), {g: dict(row) for g, row in found.items()},
                  IDLE_KEPT, IDLE_KEPT_ROWS)
    return {g: dict(row) for g, row in found.items()}


IDLE_KEPT = 6
"""Per kept shape, the latest idle breakdowns :func:`_columnar` keeps (at most, in a
:class:`~sim.colshape.LatestRuns` by the inputs :func:`_columnar_sums` reads besides the
structure: every instruction's ready and end times, latest predecessor and blocking
communication, and the window; ``tests/test_idle.py`` holds a warm breakdown to a cold
one's), as the engine's pass keeps its runs (:data:`sim.columnar.PASSES_KEPT`)."""

IDLE_KEPT_ROWS = 1 << 20
"""... and at most this many instructions over them (four arrays of 8 bytes each)."""


def _columnar_sums(columns: Columns, plan: _IdlePlan, start: np.ndarray, end: np.ndarray,
                   causes: np.ndarray, gpus: Sequence[int],
                   window: tuple[float, float] | None) -> dict[int, dict[str, float]]:
    """:func:`_columnar`'s breakdown worked out (the reference of a kept one)."""
    n = len(columns)
    # per instruction a row of what it adds to each part used (the owns of _chain_sums: its
    # amount in its part, a blocked op's blocking communication in that kind's, 0.0 elsewhere),
    # the rows in the level order of the chains (their layout kept with the causes, where
    # they are the latest run's of this shape: sim.chains.Hint); summed there in place (row
    # n: zero)
    shape = shape_of(columns)
    forest = shape.derived(("chains",), Hint).forest_for(causes)
    at, order = forest.at, forest.order
    width = len(plan.used)
    amount_at, blocked_ids, blocking_at = _scatter(plan, order, shape.kept)
    # what each instruction adds to its part (a compute op's nominal part is bubble); a
    # blocked compute op adds its blocking communication to that kind's part too (made
    # after the chains' layout, freed once written: 1T 3 x 3 MB less at the breakdown's
    # memory peak)
    span = end - start
    blocking = np.minimum(columns.blocking_s, span)
    amount = np.where(plan.blocked, span - blocking, span)
    del span
    matrix = np.zeros((n + 1) * width)
    matrix[amount_at] = amount.take(order)
    matrix[blocking_at] = blocking.take(blocked_ids)
    del blocking, amount
    matrix = matrix.reshape(n + 1, width)
    forest.sum_levels(matrix)
    del forest, order, amount_at, blocked_ids, blocking_at  # (the layout's rows kept: at)
    run_end = float(end.max())
    last = int(np.argmax(end == run_end))  # the first instruction to end the run
    lo, hi = window if window is not None else (0.0, run_end)
    ops, count_a, has = plan.ops, plan.count, plan.has
    rows = np.arange(len(gpus))
    # the chain sums at each gap's two ends gathered first, and the sums and the chains'
    # layout freed (where not kept) before the gaps' own arrays are made (1T: ~25 MB less
    # at the breakdown's memory peak)
    after_at = np.hstack((np.append(np.where(causes < 0, n, causes), n)[ops],
                          np.full((len(gpus), 1), n)))
    after_at[rows, count_a] = last
    after = matrix.take(at.take(after_at), axis=0)  # (GPU, gap, part)
    before = matrix.take(at.take(plan.before_at), axis=0)
    del matrix, at, after_at

    def padded(values: np.ndarray, fill: float = 0.0) -> np.ndarray:
        return np.append(values, fill)[ops]

    begin, finish = padded(start), padded(end)
    folded = padded(np.where(plan.blocked, columns.blocking_s, 0.0))
    cut = np.minimum(folded, finish - begin)  # blocking communication at a compute op's end
    zero = np.zeros((len(gpus), 1))
    a = np.hstack((zero, np.where(has, finish - np.where(has, cut, 0.0), finish)))
    b = np.hstack((begin, zero))
    b[rows, count_a] = run_end
    if len(plan.blocked_at[0]):  # (before[g, k + 1, part] -= cut[g, k], on flat views)
        cut_at, before_cell = plan.blocked_flat
        flat = before.reshape(-1)
        flat[before_cell] -= cut.reshape(-1).take(cut_at)
    found = _split_gaps(a, b, after, before, lo, hi, plan.bubble)
    shares = np.zeros((len(gpus), len(_PARTS)))
    shares[:, plan.used] = found
    return {g: _row(row) for g, row in zip(gpus, shares.tolist(), strict=True)}


def _scatter(plan: _IdlePlan, order: np.ndarray, keep: bool = True
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where :func:`_columnar` writes each instruction's amount and each blocked compute op's
    blocking communication in the flat chain-sum matrix (rows in the level ``order`` of the
    chains, a column per part used), and the blocked ops in that order: per row its own
    part's column, and per blocked op its blocking kind's (``matrix[rows, column] =``,
    ``matrix[blocked rows, comm column] =``, the same cells written in the same order). Kept
    on the plan for the latest ``order`` (the same object while the chains' layout is
    kept, :class:`sim.chains.Hint`), where ``keep`` (a plan kept on its shape)."""
    kept = plan.scatter[0] if plan.scatter else None  # (one read: another thread may write)
    if kept is not None and kept[0] is order:
        return kept[1]
    width = len(plan.used)
    mine = np.flatnonzero(plan.blocked.take(order))
    ids = order.take(mine)
    cell = np.int32 if (len(order) + 1) * width <= np.iinfo(np.int32).max else np.intp
    found = (np.arange(len(order), dtype=cell) * width + plan.column_of.take(order), ids,
             mine * width + plan.comm_column_of.take(ids))
    if keep:
        plan.scatter[:] = [(order, found)]
    return found


@dataclass(frozen=True, eq=False, repr=False)  # (see sim.columnar._Plan)
class _IdlePlan:
    """What :func:`_columnar` derives from a program's structure alone (its shape,
    :mod:`sim.colshape`): made by :func:`_idle_plan`."""

    declined: bool
    """A compute op's blocking communication of a kind outside :data:`_PARTS`."""
    blocked: np.ndarray
    """The compute ops with blocking communication."""
    used: list[int]
    """The parts any instruction adds to (bubble always)."""
    column_of: np.ndarray
    """Per instruction, the column (of :attr:`used`) of its part."""
    comm_column_of: np.ndarray
    """Per instruction, the column of its blocking communication's part (bubble's for
    none)."""
    bubble: int
    """Bubble's column."""
    ops: np.ndarray
    """Per GPU a row of its compute ops in program order, padded with ``n`` (no op)."""
    count: np.ndarray
    """Per GPU, its compute ops."""
    has: np.ndarray
    """Per GPU and compute op (:attr:`ops`), whether it has blocking communication."""
    before_at: np.ndarray
    """Per GPU and gap, the instruction before it (``n``: none)."""
    blocked_at: tuple[np.ndarray, np.ndarray]
    """Where :attr:`has` is true (GPU, position)."""
    blocked_part: np.ndarray
    """There, the column of its blocking communication's part."""
    blocked_flat: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.intp), np.zeros(0, np.intp))
    """:attr:`blocked_at` in the flat views of a row per GPU of its compute ops' values, and
    of the chain sums before each gap (a GPU's gaps, a part's column in each)."""
    scatter: list = field(default_factory=list)
    """The latest chains' order and :func:`_scatter`'s positions for it."""


def _idle_plan(columns: Columns, gpus: Sequence[int]) -> _IdlePlan:
    """The :class:`_IdlePlan` of ``columns`` for ``gpus``: what :func:`_columnar` computed
    from the structure on every call before its shape kept it."""
    n = len(columns)
    # (parts and columns as bytes: the per-instruction columns of the plan, 1T 2 x 3 MB as
    # intp, are 2 x 0.4 MB)
    index = np.array([_INDEX.get(name, _BUBBLE) for name in columns.names] + [_BUBBLE],
                     dtype=np.int8)
    compute = columns.cls == COMPUTE
    blocked = compute & (columns.blocking_s > 0)
    comm_part = index[columns.comm]
    part = np.where(compute, _BUBBLE, index[columns.kind])
    # the parts any instruction adds to (bubble always): the others' chain sums are zero,
    # and a zero part changes no gap's split (+0.0 in each sum), so they are left out
    present = np.zeros(len(_PARTS), dtype=bool)
    present[[_BUBBLE, *np.flatnonzero(np.bincount(part, minlength=len(_PARTS))).tolist(),
             *np.flatnonzero(np.bincount(comm_part[blocked], minlength=len(_PARTS))).tolist()]
            ] = True
    used = np.flatnonzero(present).tolist()
    column = np.full(len(_PARTS), -1, dtype=np.int8)
    column[used] = np.arange(len(used))
    # per GPU a row of its compute ops in program order, padded with n (no op)
    ids = np.flatnonzero(compute)
    gpu = columns.gpu[ids]
    by_gpu = grouped(gpu, int(gpu.max()) + 1 if len(gpu) else 1)
    ids, gpu = ids[by_gpu], gpu[by_gpu]
    cuts = np.flatnonzero(gpu[1:] != gpu[:-1]) + 1
    compute_of = {int(gpu[a]): ids[a:b]
                  for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(ids)], strict=True)}
    count = [len(compute_of.get(g, ())) for g in gpus]
    ops = np.full((len(gpus), max(count, default=0)), n, dtype=np.intp)
    for row, g in enumerate(gpus):
        ops[row, :count[row]] = compute_of.get(g, ())
    has = np.append(blocked, False)[ops]
    g_at, k_at = np.nonzero(has)
    blocked_part = column[np.append(comm_part, _BUBBLE)[ops[g_at, k_at]]]
    gaps = ops.shape[1] + 1
    return _IdlePlan(bool((comm_part[blocked] == _BUBBLE).any()), blocked, used,
                     column.take(part), column.take(comm_part), int(column[_BUBBLE]), ops,
                     np.array(count, dtype=np.intp), has,
                     np.hstack((np.full((len(gpus), 1), n), ops)), (g_at, k_at),
                     blocked_part,
                     (g_at * ops.shape[1] + k_at,
                      (g_at * gaps + k_at + 1) * len(used) + blocked_part))


def _chain_sums(cause: Sequence[int], owns: Sequence[np.ndarray]) -> np.ndarray:
    """Per array of ``owns`` and instruction, the sum of that array along the instruction's
    chain, added one by one from the root (``cause[i]``: the one before it, -1 for a root):
    an array of shape ``(len(owns), n + 1)`` whose last column is zero (the sum before a
    root).

    Worked out a level of the chains' tree at a time (:func:`sim.chains.level_plan`,
    :func:`sim.chains.sum_levels`): each level's sums are their causes' (a level up, done)
    plus their
    own values, the additions a loop from the roots makes, on rows of all arrays at once;
    the rows laid out level by level, so that a level is a slice and only the parents'
    rows are gathered. ~2,700 levels of 392,000 instructions in Megatron 1T: 60 ms with
    the rows in id order, where a loop over the instructions took 140 (the idle breakdown
    of 1T, 122-132 ms with those, 82-91 with the rows by level)."""
    n, k = len(cause), len(owns)
    if not n:
        return np.zeros((k, 1))
    at, _, parent, bounds = level_plan(cause)
    sums = np.zeros((n + 1, k))
    sums[at[:n]] = np.stack(owns, axis=1)
    sum_levels(sums, parent, bounds)
    return sums[at].T


def summarize(per_gpu: Mapping[int, Mapping[str, float]]) -> dict:
    """The ``idle_breakdown`` stats entry: ``mean_s`` over GPUs and ``per_gpu_s`` (JSON keys
    are GPU ranks as strings), each a mapping cause -> seconds plus ``idle_s``, their sum."""
    def with_total(shares: Mapping[str, float]) -> dict[str, float]:
        row = {cause: shares.get(cause, 0.0) for cause in IDLE_CAUSES}
        row["idle_s"] = sum(row.values())
        return row

    rows = {str(g): with_total(s) for g, s in sorted(per_gpu.items())}
    n = len(rows) or 1
    mean = {cause: sum(r[cause] for r in rows.values()) / n for cause in IDLE_CAUSES}
    return {"mean_s": with_total(mean), "per_gpu_s": rows}
