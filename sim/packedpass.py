"""The passes over every instruction of a run on the engine's own heap, for a packed program
(:mod:`workloads.packed`): the statistics' summaries (:func:`sim.timeline.summaries_of`) and
the idle breakdown's chains (:func:`sim.idle._chains`) read each instruction's GPU, deps
and the few fields they need of its template (worked out once per template), not a named
tuple made per instruction. The same results as the loops over the objects, step for step
(``tests/test_packed.py``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from sim.timeline import COMM_KINDS, COMPUTE_STREAM, Summaries, _sample
from workloads.packed import PackedInstructions
from workloads.program import Collective, Compute, Program, Send

_COMPUTE, _SEND, _COLLECTIVE = 0, 1, 2


def summaries(program: Program, ready_s: Sequence[float], mid_s: Sequence[float],
              end_s: Sequence[float]) -> Summaries:
    """:func:`sim.timeline.summaries_of` of a packed program."""
    instrs = program.instructions
    assert isinstance(instrs, PackedInstructions)
    gpus = (tuple(range(program.num_gpus)) if program.simulated_gpus is None
            else program.simulated_gpus)
    comm_kinds = frozenset(COMM_KINDS)
    infos = []  # per template what the loop reads (Compute fields after deps: rest[k - 5])
    for cls, head, rest in instrs.templates:
        if cls is Compute:
            kind = head[0]
            blocking, comm = rest[6], rest[7]
            infos.append((_COMPUTE, kind if kind in comm_kinds else None,
                          comm if blocking > 0 and comm in comm_kinds else None,
                          rest[8], rest[9]))
        elif cls is Send:
            kind = head[2]
            infos.append((_SEND, kind if kind in comm_kinds else None, head[0], 0.0, 0.0))
        else:
            kind = head[0]
            infos.append((_COLLECTIVE, kind if kind in comm_kinds else None, len(rest[2]),
                          rest[4], 0.0))
    intervals: dict[tuple[int, str], array] = {}
    mem_now = list(program.static_bytes)
    peaks = {g: mem_now[g] for g in gpus}
    floors = dict(peaks)
    members: dict[int, list[int]] = {}
    gpu_of = instrs.gpu

    def lane(key: tuple[int, str]) -> array:
        out = intervals.get(key)
        if out is None:
            out = intervals[key] = array("d")
        return out

    compute_lane: dict[int, array] = {}
    for i, (g, t) in enumerate(zip(gpu_of, instrs.tpl, strict=True)):
        cls, kind, third, alloc, free = infos[t]
        if cls == _COMPUTE:
            start, mid = ready_s[i], mid_s[i]
            if alloc or free:
                if alloc:
                    mem_now[g] += alloc
                    _sample(peaks, floors, g, mem_now[g])
                if free:
                    mem_now[g] -= free
                    _sample(peaks, floors, g, mem_now[g])
            stream = compute_lane.get(g)
            if stream is None:
                stream = compute_lane[g] = lane((g, COMPUTE_STREAM))
            stream.append(start)
            stream.append(mid)
            if kind is not None:
                own = lane((g, kind))
                own.append(start)
                own.append(mid)
            if third is not None:
                own = lane((g, third))
                own.append(mid)
                own.append(end_s[i])
        elif cls == _SEND:
            if kind is not None:
                start, stop = ready_s[i], end_s[i]
                for gpu in (g, third):
                    own = lane((gpu, kind))
                    own.append(start)
                    own.append(stop)
        else:
            if third > 1:
                key = alloc
                waiting = members.get(key)
                if waiting is None:
                    members[key] = [i]
                    continue
                waiting.append(i)
                if len(waiting) < third:
                    continue
                del members[key]
                start = max([ready_s[j] for j in waiting])
            else:
                waiting, start = [i], ready_s[i]
            if kind is not None:
                for j in waiting:
                    own = lane((gpu_of[j], kind))
                    own.append(start)
                    own.append(end_s[j])
    return Summaries(intervals, dict(sorted(peaks.items())), dict(sorted(floors.items())),
                     max(end_s, default=0.0))


def chains(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
           index: dict, bubble: int
           ) -> tuple[array[float], array[int], dict[int, list[int]], array[int],
                      dict[int, tuple[float, int]]]:
    """:func:`sim.idle._chains` of a packed program (``index``: a part's index by name,
    ``bubble``: the bubble's)."""
    instrs = program.instructions
    assert isinstance(instrs, PackedInstructions)
    n = len(instrs)
    infos = []  # per template: class, stream (beside the GPU), part, blocking, group, key
    for cls, head, rest in instrs.templates:
        if cls is Compute:
            blocking = rest[6]
            infos.append((_COMPUTE, None, bubble,
                          (blocking, index(rest[7], bubble)) if blocking > 0 else None, 0, 0))
        elif cls is Send:
            infos.append((_SEND, head[0], index(head[2], bubble), None, 0, 0))
        else:
            assert cls is Collective
            infos.append((_COLLECTIVE, head[0], index(head[0], bubble), None, len(rest[2]),
                          rest[4]))
    start = array("d", ready_s[:n])
    cause = array("q", [-1]) * n
    part = array("b", [bubble]) * n
    blocked: dict[int, tuple[float, int]] = {}
    last_compute: dict[int, int] = {}
    last_other: dict[tuple[int, object], int] = {}
    members: dict[int, list[int]] = {}
    compute: dict[int, list[int]] = {}
    deps, first = instrs.deps, instrs.first
    at = 0
    for i, (g, t) in enumerate(zip(instrs.gpu, instrs.tpl, strict=True)):
        cls, stream, own, block, size, key = infos[t]
        if cls == _COMPUTE:
            best = last_compute.get(g, -1)
            last_compute[g] = i
            ops = compute.get(g)
            if ops is None:
                compute[g] = [i]
            else:
                ops.append(i)
            if block is not None:
                blocked[i] = block
        else:
            other = (g, stream)
            best = last_other.get(other, -1)
            last_other[other] = i
            part[i] = own
        best_end = end_s[best] if best >= 0 else -1.0
        stop = first[i + 1]
        if stop > at:
            for d in deps[at:stop]:
                if end_s[d] > best_end:
                    best, best_end = d, end_s[d]
            at = stop
        cause[i] = best
        if size > 1:
            group = members.setdefault(key, [])
            group.append(i)
            if len(group) == size:
                del members[key]
                latest = max(group, key=lambda j: (ready_s[j], -j))
                for j in group:
                    start[j] = ready_s[latest]
                    cause[j] = cause[latest]
    for group in members.values():  # members missing (not in this program): as they are
        latest = max(group, key=lambda j: (ready_s[j], -j))
        for j in group:
            start[j] = ready_s[latest]
    return start, cause, compute, part, blocked
