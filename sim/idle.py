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
from operator import sub

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


def idle_breakdown(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
                   gpus: Sequence[int], slowdown: Mapping[int, float] | None = None,
                   window: tuple[float, float] | None = None) -> dict[int, dict[str, float]]:
    """Per GPU in ``gpus``, its compute-stream idle seconds by cause (:data:`CAUSES`).

    ``ready_s`` and ``end_s`` are the engine's per-instruction times
    (:class:`sim.engine.InstructionTimes`); ``slowdown`` maps straggler GPUs to
    their compute slowdown factor; ``window`` (default: the whole run, from 0
    to the last end) limits the accounting to a time interval.
    """
    with gc_paused():  # many small lists, no cycles
        return _breakdown(program, ready_s, end_s, gpus, slowdown or {}, window)


def _breakdown(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
               gpus: Sequence[int], slowdown: Mapping[int, float],
               window: tuple[float, float] | None) -> dict[int, dict[str, float]]:
    """:func:`idle_breakdown`, with the garbage collector paused by the caller."""
    instrs = program.instructions
    if not instrs:
        return {g: dict.fromkeys(CAUSES, 0.0) for g in gpus}
    start, cause, compute_of = _chains(program, ready_s, end_s)
    cum = _cumulative(program, start, cause, end_s, slowdown)
    run_end = max(end_s)
    last = list(end_s).index(run_end)  # the first instruction to end the run
    lo, hi = window if window is not None else (0.0, run_end)
    zero = [0.0] * len(_PARTS)
    compute = {g: compute_of.get(g, []) for g in gpus}
    out: dict[int, dict[str, float]] = {}
    for g in gpus:
        shares = [0.0] * len(_PARTS)
        a, before = 0.0, zero  # end of the previous compute span, and its chain sum
        ops = compute[g]
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
