"""The passes over every instruction of a run on the engine's own heap, for a packed program
(:mod:`workloads.packed`): the statistics' summaries (:func:`sim.timeline.summaries_of`) and
the idle breakdown's chains (:func:`sim.idle._chains`) read each instruction's GPU, deps
and the few fields they need of its template (worked out once per template), not a named
tuple made per instruction. The same results as the loops over the objects, step for step
(``tests/test_packed.py``).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

import numpy as np

from sim.timeline import COMM_KINDS, COMPUTE_STREAM, Summaries, _sample
from workloads.packed import PackedInstructions
from workloads.program import Collective, Compute, Program, Send
from workloads.streams import stream_columns

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
           index: Callable[[str, int], int], bubble: int
           ) -> tuple[array[float], array[int], dict[int, list[int]], array[int],
                      dict[int, tuple[float, int]]]:
    """:func:`sim.idle._chains` of a packed program on arrays (``index``: a part's index by
    name or ``bubble``, the bubble's): each instruction's cause is its stream predecessor
    (:func:`workloads.streams.stream_columns`, the engine's stream rule) unless a dependency
    ended strictly later, then the first of the latest; a collective's members (one template
    each, :class:`~workloads.packed.PackedBuilder`) take the start and cause of the member
    ready last (the lowest id among equals), where all of them are in the program."""
    instrs = program.instructions
    assert isinstance(instrs, PackedInstructions)
    n = len(instrs)
    templates = instrs.templates
    cls_of = np.fromiter((_COMPUTE if t[0] is Compute else _SEND if t[0] is Send
                          else _COLLECTIVE for t in templates), np.int8, len(templates))
    part_of = np.fromiter((bubble if cls is Compute else index(head[2] if cls is Send
                                                             else head[0], bubble)
                           for cls, head, _ in templates), np.int8, len(templates))
    size_of = np.fromiter((len(rest[2]) if cls is Collective else 0
                           for cls, _, rest in templates), np.int64, len(templates))
    tpl = np.frombuffer(instrs.tpl, dtype=np.int32)
    ready, end = _doubles(ready_s, n), _doubles(end_s, len(end_s))
    columns = stream_columns(instrs)
    assert columns is not None
    before, ndeps, flat = columns
    del columns
    cause = before  # then each instruction's own (the temporaries one at a time: memory)
    best_end = end[np.maximum(before, 0)]
    best_end[before < 0] = -1.0
    if len(flat):
        has = ndeps > 0
        with_deps = np.flatnonzero(has)
        at = np.cumsum(ndeps)
        at -= ndeps
        owner = np.repeat(np.arange(len(with_deps), dtype=np.int32), ndeps[has])
        del has, ndeps
        at = at[with_deps]
        dep_end = end[flat]
        latest = np.maximum.reduceat(dep_end, at)  # per instruction with deps
        del at
        hits = np.flatnonzero(dep_end == latest[owner])
        del dep_end
        owners = owner[hits]
        del owner
        firsts = hits[np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])]  # first latest
        del hits, owners
        later = latest > best_end[with_deps]
        cause[with_deps[later]] = flat[firsts[later]]
        del latest, firsts, later, with_deps
    del best_end, flat
    start = ready.copy()
    shared = np.flatnonzero((size_of > 1)[tpl])
    if len(shared):
        groups = tpl[shared]
        order = np.lexsort((shared, -ready[shared], groups))  # per group the latest first
        groups, members = groups[order], shared[order]
        del order
        heads = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        counts = np.diff(np.r_[heads, len(groups)])
        lead = np.repeat(members[heads], counts)
        start[members] = ready[lead]
        whole = np.repeat(counts == size_of[groups[heads]], counts)
        cause[members[whole]] = cause[lead[whole]]
        del groups, members, lead, whole
    del shared
    compute = np.flatnonzero(cls_of[tpl] == _COMPUTE)
    gpu = np.frombuffer(instrs.gpu, dtype=np.int32)[compute]
    by_gpu = np.argsort(gpu, kind="stable")
    sorted_gpu = gpu[by_gpu]
    cuts = np.flatnonzero(sorted_gpu[1:] != sorted_gpu[:-1]) + 1
    runs = np.split(compute[by_gpu], cuts)
    firsts = [int(run[0]) for run in runs]
    compute_of = {int(instrs.gpu[f]): run.tolist()
                  for f, run in sorted(zip(firsts, runs, strict=True), key=lambda x: x[0])}
    blocked: dict[int, tuple[float, int]] = {}
    blocking_of = {t: (rest[6], index(rest[7], bubble))
                   for t, (cls, _, rest) in enumerate(templates)
                   if cls is Compute and rest[6] > 0}
    if blocking_of:
        for i in np.flatnonzero(np.isin(tpl, list(blocking_of))).tolist():
            blocked[i] = blocking_of[int(tpl[i])]
    return (array("d", start.tobytes()), array("q", cause.tobytes()), compute_of,
            array("b", part_of[tpl].tobytes()), blocked)


def _doubles(values: Sequence[float], n: int) -> np.ndarray:
    """The first ``n`` of ``values`` as float64 (a view of an ``array("d")``'s buffer)."""
    if isinstance(values, array) and values.typecode == "d":
        return np.frombuffer(values, dtype=float)[:n]
    return np.asarray(values[:n], dtype=float)


def dag(instrs: PackedInstructions) -> tuple[array[int], array[int], array[int]]:
    """:func:`sim.engine._dag_on_arrays` of a packed program, with 4-byte temporaries where
    they fit (its peak is a large run's): per instruction its stream predecessor's edge,
    then its deps in order, sorted stably by predecessor."""
    n = len(instrs)
    columns = stream_columns(instrs)
    assert columns is not None
    before = columns.before.astype(np.int32)
    del columns
    first_dep = np.frombuffer(instrs.first, dtype=np.int64)
    ndeps = np.diff(first_dep).astype(np.int32)
    has = before >= 0
    edges = ndeps + has  # per instruction: its waiting count
    del ndeps
    at = np.cumsum(edges, dtype=np.int64)
    total = int(at[-1]) if n else 0
    at -= edges
    pred = np.empty(total, dtype=np.int32)
    stream = at[has]
    pred[stream] = before[has]
    del before, has, at
    is_dep = np.ones(total, dtype=bool)
    is_dep[stream] = False
    del stream
    pred[is_dep] = np.frombuffer(instrs.deps, dtype=np.int32)
    del is_dep
    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pred, minlength=n), out=first[1:])
    order = np.argsort(pred, kind="stable")
    del pred
    succ = np.repeat(np.arange(n, dtype=np.int32), edges)[order]
    del order
    out = array("i"), array("q"), array("i")
    for into, values in zip(out, (succ, first, edges), strict=True):
        into.frombytes(memoryview(values).cast("B"))
    return out
