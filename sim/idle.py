"""Idle time of every GPU's compute stream, broken down by cause. Pure (no SimPy, no matplotlib).

Every instruction starts when its latest-finishing predecessor (a dependency
or its stream predecessor; for a collective, that of the member that
arrived last) completes, so the chain of latest predecessors from any
instruction back to the start of the run is contiguous in time: its end time
is the sum of the spans along that chain. Each span splits by cause: nominal
compute, the excess of compute on a straggler (``(1 - 1/s)`` of its duration
at slowdown ``s``), and communication of each kind (sends, collectives, the
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
  extra idle time it causes on ``straggler``);
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

from collections.abc import Mapping, Sequence
from itertools import chain, repeat
from operator import sub

import numpy as np

from sim.timeline import COMM_KINDS, gc_paused
from workloads.program import Collective, Compute, Program, Send

_COMM = ("tp", "cp", "ep", "pp", "dp")
_COMM = _COMM + tuple(k for k in COMM_KINDS if k not in _COMM)
CAUSES = ("bubble", *_COMM, "straggler", "failure")
"""Idle causes, in the order reported (communication kinds as in ``exposed_comm_s``)."""

_PARTS = ("bubble", *_COMM, "straggler")
"""Causes a span can hold (nominal compute is counted as ``bubble``)."""
_INDEX = {c: k for k, c in enumerate(_PARTS)}
_BUBBLE, _STRAGGLER = _INDEX["bubble"], _INDEX["straggler"]


def _chains(program: Program, ready_s: Sequence[float], end_s: Sequence[float]
            ) -> tuple[list[float], list[int], dict[int, list[int]]]:
    """Per instruction: start of its span and its latest-finishing predecessor (-1: none);
    and per GPU, its compute ops in program order."""
    instrs = program.instructions
    start = list(ready_s[:len(instrs)])
    cause = [-1] * len(instrs)
    last_compute: dict[int, int] = {}  # per GPU, the latest instruction of its compute stream
    last_other: dict[tuple[int, object], int] = {}  # per (GPU, dst) or (GPU, kind): sends,
    members: dict[int, list[int]] = {}  # collectives (keys as the engine's streams)
    compute: dict[int, list[int]] = {}
    for ins in instrs:
        i = ins.id
        cls = type(ins)
        if cls is Compute:
            best = last_compute.get(ins.gpu, -1)
            last_compute[ins.gpu] = i
            compute.setdefault(ins.gpu, []).append(i)
        else:
            key = (ins.gpu, ins.dst) if cls is Send else (ins.gpu, ins.stream)
            best = last_other.get(key, -1)
            last_other[key] = i
            if cls is Collective and len(ins.group) > 1:
                members.setdefault(ins.key, []).append(i)
        best_end = end_s[best] if best >= 0 else -1.0
        for d in ins.deps:
            if end_s[d] > best_end:
                best, best_end = d, end_s[d]
        cause[i] = best
    for group in members.values():  # a collective of one is its only member's
        latest = max(group, key=lambda j: (ready_s[j], -j))
        for j in group:
            start[j] = ready_s[latest]
            cause[j] = cause[latest]
    return start, cause, compute


def _add_own(row: list[float], ins: object, span: float, slowdown: Mapping[int, float]) -> None:
    """Add an instruction's span, split by cause (:data:`_PARTS`), to ``row`` in place."""
    if type(ins) is Compute:
        blocking = min(ins.blocking_comm_s, span) if ins.blocking_comm_s > 0 else 0.0
        if blocking:
            row[_INDEX.get(ins.blocking_comm_kind, _BUBBLE)] += blocking
        work = span - blocking
        s = slowdown.get(ins.gpu, 1.0) if slowdown else 1.0
        excess = work * (1.0 - 1.0 / s) if s != 1.0 else 0.0
        row[_STRAGGLER] += excess
        row[_BUBBLE] += work - excess
    else:  # a kind outside COMM_KINDS would be a lowering bug: counted as bubble, not lost
        row[_INDEX.get(ins.kind, _BUBBLE)] += span


def _cumulative(program: Program, start: Sequence[float], cause: Sequence[int],
                end_s: Sequence[float], slowdown: Mapping[int, float]) -> list[list[float]]:
    """Per instruction, its end time by cause: the sum of its spans' parts along its chain."""
    instrs = program.instructions
    zero = [0.0] * len(_PARTS)
    cum: list[list[float] | None] = [None] * len(instrs)
    index = _INDEX.get
    for i in range(len(instrs)):
        if cum[i] is not None:
            continue
        c = cause[i]
        if c >= 0 and cum[c] is None:  # a chain to a later id: sum it from its known end
            _fill_chain(i, instrs, start, cause, end_s, slowdown, cum)
            continue
        row = (zero if c < 0 else cum[c])[:]  # type: ignore[index]
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
        cum[i] = row
    return cum  # type: ignore[return-value]


def _fill_chain(i: int, instrs: Sequence[object], start: Sequence[float],
                cause: Sequence[int], end_s: Sequence[float], slowdown: Mapping[int, float],
                cum: list[list[float] | None]) -> None:
    """``cum`` of ``i`` and of the instructions on its chain that lack it, from the root."""
    zero = [0.0] * len(_PARTS)
    stack = [i]
    while stack:
        j = stack[-1]
        c = cause[j]
        if c >= 0 and cum[c] is None:
            stack.append(c)
            continue
        stack.pop()
        if cum[j] is None:
            row = (zero if c < 0 else cum[c])[:]  # type: ignore[index]
            _add_own(row, instrs[j], end_s[j] - start[j], slowdown)
            cum[j] = row


def _in_order(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
              cause: list[int], slowdown: Mapping[int, float]
              ) -> tuple[list[float], list[list[float]], dict[int, list[int]], list[float],
                         list[int]] | None:
    """:func:`_chains` and :func:`_cumulative` in one pass over the instructions in id order,
    given each one's latest predecessor (``cause``, as the engine records it): the same
    floats, when every chain runs to earlier ids (a lowered program); else None.
    ``cause`` is completed in place for collective members (they all take the one of the
    member that arrived last, as :func:`_chains` sets it). Also each compute op's blocking
    communication and its part (:func:`_folded`)."""
    instrs = program.instructions
    start = list(ready_s[:len(instrs)])
    zero = [0.0] * len(_PARTS)
    cum: list[list[float] | None] = [None] * len(instrs)
    compute: dict[int, list[int]] = {}
    members: dict[int, list[int]] = {}
    index = _INDEX.get
    bubble = _BUBBLE
    folded = [0.0] * len(instrs)  # per compute op, its blocking communication and its part
    folded_part = [bubble] * len(instrs)
    for i, ins in enumerate(instrs):
        cls = type(ins)
        if cls is Compute:
            ops = compute.get(ins[1])
            if ops is None:
                compute[ins[1]] = [i]
            else:
                ops.append(i)
        elif cls is Collective and len(ins[7]) > 1:
            group = members.get(ins[9])
            if group is None:
                group = members[ins[9]] = []
            group.append(i)
            if len(group) < len(ins[7]):
                continue
            latest = max(group, key=lambda j: (ready_s[j], -j))
            for j in group:
                start[j] = ready_s[latest]
                cause[j] = cause[latest]
            for j in group:
                c = cause[j]
                parent = cum[c] if c >= 0 else zero
                if parent is None:  # a chain to a later id
                    return None
                row = parent[:]
                _add_own(row, instrs[j], end_s[j] - start[j], slowdown)
                cum[j] = row
            continue
        c = cause[i]
        if c < 0:
            row = zero[:]
        else:
            row = cum[c]
            if row is None:  # a chain to a later id
                return None
            row = row[:]
        span = end_s[i] - start[i]
        if slowdown:
            _add_own(row, ins, span, slowdown)
        elif cls is Compute:  # _add_own without stragglers: the blocking part, then nominal
            blocking = ins[11]
            if blocking > 0:
                column = index(ins[12], bubble)
                folded[i], folded_part[i] = blocking, column
                if blocking > span:
                    blocking = span
                if blocking:
                    row[column] += blocking
                span -= blocking
            row[bubble] += span
        else:  # _add_own of a send (kind at 4) or a collective of one (kind at 2)
            row[index(ins[4] if cls is Send else ins[2], bubble)] += span
        cum[i] = row
    if any(len(group) < len(instrs[group[0]].group) for group in members.values()):
        return None
    if slowdown:  # folded was not filled
        folded, folded_part = _folded(instrs)
    return start, cum, compute, folded, folded_part  # type: ignore[return-value]


def _folded(instrs: Sequence) -> tuple[list[float], list[int]]:
    """Per instruction, a compute op's blocking communication (0: none, or not compute) and
    the part it counts in (:data:`_PARTS`)."""
    folded = [0.0] * len(instrs)
    part = [_BUBBLE] * len(instrs)
    for i, ins in enumerate(instrs):
        if type(ins) is Compute and ins.blocking_comm_s > 0:
            folded[i] = ins.blocking_comm_s
            part[i] = _INDEX.get(ins.blocking_comm_kind, _BUBBLE)
    return folded, part


def idle_breakdown(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
                   gpus: Sequence[int], slowdown: Mapping[int, float] | None = None,
                   window: tuple[float, float] | None = None,
                   cause: Sequence[int] | None = None) -> dict[int, dict[str, float]]:
    """Per GPU in ``gpus``, its compute-stream idle seconds by cause (:data:`CAUSES`).

    ``ready_s`` and ``end_s`` are the engine's per-instruction times
    (:class:`sim.engine.InstructionTimes`); ``slowdown`` maps straggler GPUs to
    their compute slowdown factor; ``window`` (default: the whole run, from 0
    to the last end) limits the accounting to a time interval. ``cause``: each
    instruction's latest predecessor where the engine recorded it
    (:attr:`sim.engine.InstructionTimes.cause`), else worked out here.
    """
    with gc_paused():  # many small lists, no cycles
        return _breakdown(program, ready_s, end_s, gpus, slowdown or {}, window, cause)


def _breakdown(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
               gpus: Sequence[int], slowdown: Mapping[int, float],
               window: tuple[float, float] | None, known: Sequence[int] | None = None
               ) -> dict[int, dict[str, float]]:
    """:func:`idle_breakdown`, with the garbage collector paused by the caller."""
    instrs = program.instructions
    if not instrs:
        return {g: dict.fromkeys(CAUSES, 0.0) for g in gpus}
    fast = None
    if known is not None and len(known) == len(instrs):
        cause = list(known)
        fast = _in_order(program, ready_s, end_s, cause, slowdown)
    folded: tuple[list[float], list[int]] | None = None
    if fast is not None:
        start, cum, compute_of, *pair = fast
        folded = (pair[0], pair[1])
    else:
        start, cause, compute_of = _chains(program, ready_s, end_s)
        cum = _cumulative(program, start, cause, end_s, slowdown)
    run_end = max(end_s)
    last = list(end_s).index(run_end)  # the first instruction to end the run
    lo, hi = window if window is not None else (0.0, run_end)
    zero = [0.0] * len(_PARTS)
    compute = {g: compute_of.get(g, []) for g in gpus}
    out: dict[int, dict[str, float]] = {}
    arrays: _Arrays | None = None  # for GPUs with many compute ops
    for g in gpus:
        ops = compute[g]
        if len(ops) > SMALL:
            if arrays is None:
                arrays = _Arrays(folded or _folded(instrs), start, cause, end_s, cum)
            shares = arrays.gap_shares(ops, run_end, last, lo, hi)
            row = dict.fromkeys(CAUSES, 0.0)
            row.update(zip(_PARTS, shares, strict=True))
            out[g] = row
            continue
        shares = [0.0] * len(_PARTS)
        a, before = 0.0, zero  # end of the previous compute span, and its chain sum
        for k in range(len(ops) + 1):
            if k < len(ops):
                x = ops[k]
                b = start[x]
                after = cum[cause[x]] if cause[x] >= 0 else zero
            else:
                b, after = run_end, cum[last]
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
                ins = instrs[ops[k]]
                a = end_s[ops[k]]
                before = cum[ops[k]]
                if ins.blocking_comm_s > 0:  # the gap starts where its compute ends
                    blocking = min(ins.blocking_comm_s, end_s[ops[k]] - start[ops[k]])
                    a -= blocking
                    before = list(before)
                    before[_INDEX.get(ins.blocking_comm_kind, _BUBBLE)] -= blocking
        row = dict.fromkeys(CAUSES, 0.0)
        for c, name in enumerate(_PARTS):
            row[name] = shares[c]
        out[g] = row
    return out


SMALL = 64
"""GPUs with up to this many compute ops have their gaps split by the plain loop of
:func:`_breakdown`; more, by :func:`_gap_shares` on arrays (the same floats)."""


class _Arrays:
    """The per-instruction facts the gaps of :func:`_breakdown` read, as arrays: for GPUs
    with many compute ops, :meth:`gap_shares` splits all their gaps at once."""

    def __init__(self, folded: tuple[list[float], list[int]], start: Sequence[float],
                 cause: Sequence[int], end_s: Sequence[float], cum: Sequence[list[float]]
                 ) -> None:
        n, parts = len(cum), len(_PARTS)
        self.folded = np.array(folded[0], dtype=float)
        self.part = np.array(folded[1], dtype=np.intp)
        self.start = np.array(start[:n], dtype=float)
        self.end = np.array(end_s[:n], dtype=float)
        causes = np.array(cause[:n], dtype=np.intp)
        self.cause = np.where(causes < 0, n, causes)  # row n: zero (no predecessor)
        self.rows = [*cum, [0.0] * parts]

    def gap_shares(self, ops: list[int], run_end: float, last: int, lo: float, hi: float
                   ) -> list[float]:
        """One GPU's idle shares by part (:data:`_PARTS`): the loop of :func:`_breakdown` over
        its compute ops ``ops``, gap by gap, with the same floating-point operations.

        Gap ``k`` runs from ``a`` (the end of op ``k - 1``'s compute, 0 for the first)
        to ``b`` (op ``k``'s start, the run's end for the last), with chain sums
        ``before`` (op ``k - 1``'s, less its blocking communication) and ``after`` (that
        of op ``k``'s latest predecessor, of instruction ``last`` for the trailing gap).
        Each part is summed over the gaps in order, as the loop adds them (a cumulative
        sum: no reassociation).
        """
        parts = len(_PARTS)
        at = np.array(ops, dtype=np.intp)
        begin, finish = self.start[at], self.end[at]
        folded = self.folded[at]
        has = folded > 0
        rows = np.flatnonzero(has)
        row = self.rows.__getitem__  # the chain sums of the gaps' ends, read row by row
        after = np.fromiter(chain.from_iterable(map(row, [*self.cause[at].tolist(), last])),
                            float, (len(ops) + 1) * parts).reshape(-1, parts)
        before = np.fromiter(chain(repeat(0.0, parts), chain.from_iterable(map(row, ops))),
                             float, (len(ops) + 1) * parts).reshape(-1, parts)
        blocking = np.minimum(folded, finish - begin)
        a = np.concatenate(([0.0], np.where(has, finish - np.where(has, blocking, 0.0), finish)))
        if len(rows):
            before[rows + 1, self.part[at[rows]]] -= blocking[rows]
        b = np.append(begin, run_end)
        inside = np.minimum(b, hi) - np.maximum(a, lo)
        taken = (b > a) & (inside > 0)
        diff = after - before
        positive = np.where(diff > 0, diff, 0.0)
        total = positive[:, 0].copy()
        for c in range(1, parts):  # sum(positive), in order
            total = total + positive[:, c]
        spread = taken & (total > 0)
        scale = np.divide(inside, total, out=np.zeros(len(b)), where=spread)
        contrib = np.where(spread[:, None] & (positive != 0), positive * scale[:, None], 0.0)
        contrib[:, _BUBBLE] = np.where(taken & ~spread, inside, contrib[:, _BUBBLE])
        return np.cumsum(contrib, axis=0)[-1].tolist()


def summarize(per_gpu: Mapping[int, Mapping[str, float]]) -> dict:
    """The ``idle_breakdown`` stats entry: ``mean_s`` over GPUs and ``per_gpu_s`` (JSON keys
    are GPU ranks as strings), each a mapping cause -> seconds plus ``idle_s``, their sum."""
    def with_total(shares: Mapping[str, float]) -> dict[str, float]:
        row = {cause: shares.get(cause, 0.0) for cause in CAUSES}
        row["idle_s"] = sum(row.values())
        return row

    rows = {str(g): with_total(s) for g, s in sorted(per_gpu.items())}
    n = len(rows) or 1
    mean = {cause: sum(r[cause] for r in rows.values()) / n for cause in CAUSES}
    return {"mean_s": with_total(mean), "per_gpu_s": rows}
