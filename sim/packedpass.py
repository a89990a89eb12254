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

from sim.timeline import COMM_KINDS, COMPUTE_STREAM, Summaries
from workloads.packed import (
    COLLECTIVE_GROUP,
    COMPUTE_ALLOC,
    COMPUTE_BLOCKING_KIND,
    COMPUTE_BLOCKING_S,
    COMPUTE_FREE,
    PackedInstructions,
)
from workloads.program import COLLECTIVE, COMPUTE, SEND, Collective, Compute, Program, Send
from workloads.streams import packed_before

_CHUNK = 1 << 20  # records worked on at a time (8 MiB an int64 temporary)


def summaries(program: Program, ready_s: Sequence[float], mid_s: Sequence[float],
              end_s: Sequence[float]) -> Summaries | None:
    """:func:`sim.timeline.summaries_of` of a packed program, on arrays (None where a record's
    key would not fit 62 bits, or a collective's members are not consecutive ids: the loop
    then). The loop appends each
    interval to its lane (GPU, stream) as it meets an instruction (a collective's members' at
    its last member, in id order): here every interval is a record (its lane, the id that
    appends it and its place among that id's appends), and each lane's records sorted by the
    last two are its list, the lanes in the order of their first record (the dict's). Only the
    keys are sorted (not an index with them): a record's interval is read back from its key
    (the id's class and, by its place, a collective's member: its ready and end, a compute
    op's ready and mid or, for its blocking communication, mid and end; a collective's
    members' start is their latest ready, kept at the last member's id). The
    memory samples are each GPU's running sums, the same additions in the same order."""
    instrs = program.instructions
    assert isinstance(instrs, PackedInstructions)
    n = len(instrs)
    gpus = (tuple(range(program.num_gpus)) if program.simulated_gpus is None
            else program.simulated_gpus)
    names = (COMPUTE_STREAM, *COMM_KINDS)
    code = {name: k for k, name in enumerate(names)}  # a lane: GPU * len(names) + code
    width = len(names)
    templates = instrs.templates
    t = len(templates)
    t_cls = instrs.classes()
    t_kind = np.full(t, -1, dtype=np.int64)  # a comm kind's code, -1: none
    t_comm = np.full(t, -1, dtype=np.int64)  # a compute op's blocking comm's, -1: none
    t_third = np.zeros(t, dtype=np.int64)  # a send's destination, a collective's size
    t_alloc, t_free = np.zeros(t), np.zeros(t)
    for k, (cls, head, rest) in enumerate(templates):
        if cls is Compute:
            kind, comm = head[0], rest[COMPUTE_BLOCKING_KIND]
            if rest[COMPUTE_BLOCKING_S] > 0 and comm in COMM_KINDS:
                t_comm[k] = code[comm]
            t_alloc[k], t_free[k] = rest[COMPUTE_ALLOC], rest[COMPUTE_FREE]
        elif cls is Send:  # head: (dst, nbytes, kind, name)
            kind, t_third[k] = head[2], head[0]
        else:
            kind, t_third[k] = head[0], len(rest[COLLECTIVE_GROUP])
        if kind in COMM_KINDS:
            t_kind[k] = code[kind]
    tpl = np.frombuffer(instrs.tpl, dtype=np.int32)
    gpu = np.frombuffer(instrs.gpu, dtype=np.int32)
    ready, mid, end = _doubles(ready_s, n), _doubles(mid_s, n), _doubles(end_s, n)
    # a record's key: (lane, the id appending it, its place), one int64 (the order of the
    # three); its interval's ends beside it
    places = max(3, int(t_third[t_cls == COLLECTIVE].max(initial=0)))
    if (program.num_gpus * width + 1) * (n + 1) * places >= 2**62:
        return None
    span = n * places
    keys: list[np.ndarray] = []  # (distinct keys: sorted below, their order here is free)

    def record(lane: np.ndarray, at: np.ndarray, sub: np.ndarray | int) -> None:
        key = lane * span
        key += at * places
        key += sub
        keys.append(key)

    shares: list[np.ndarray] = []
    for x in range(0, n, _CHUNK):  # the ids a chunk at a time (see _CHUNK)
        row, on = tpl[x:x + _CHUNK], gpu[x:x + _CHUNK]
        cls = t_cls[row]
        compute = np.flatnonzero(cls == COMPUTE)
        g = on[compute].astype(np.int64)
        kinds = row[compute]
        compute += x
        record(g * width, compute, 0)
        for which, sub in ((t_kind, 1), (t_comm, 2)):
            lane = which[kinds]
            keep = lane >= 0
            if keep.any():
                record(g[keep] * width + lane[keep], compute[keep], sub)
        sends = np.flatnonzero(cls == SEND)
        lane = t_kind[row[sends]]
        keep = lane >= 0
        at, lane = sends[keep], lane[keep]
        for sub, ends in enumerate((on[at].astype(np.int64), t_third[row[at]])):
            record(ends * width + lane, at + x, sub)
        collective = np.flatnonzero((cls == COLLECTIVE) & (t_kind[row] >= 0))
        size = t_third[row[collective]]
        alone = collective[size <= 1]
        record(on[alone].astype(np.int64) * width + t_kind[row[alone]], alone + x, 0)
        shares.append(collective[size > 1] + x)
        del row, on, cls, compute, g, kinds, lane, keep, sends, at, collective, size, alone
    low_of = ready  # per id, the low end of the intervals it appends (below: a copy)
    shared = np.concatenate(shares)  # a collective's members: consecutive ids, one template
    del shares
    if len(shared):
        low_of = ready.copy()  # the id that appends them: its members' latest start
        group = tpl[shared]
        heads = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        # the members a chunk of whole groups at a time
        cuts = [c for c in np.unique(np.searchsorted(
            heads, np.arange(0, len(shared), _CHUNK))).tolist() if c < len(heads)]
        cuts.append(len(heads))
        for h0, h1 in zip(cuts[:-1], cuts[1:], strict=True):
            s0 = int(heads[h0])
            s1 = int(heads[h1]) if h1 < len(heads) else len(shared)
            if not _members(shared[s0:s1], group[s0:s1], heads[h0:h1] - s0, t_third,
                            t_kind, gpu, width, ready, low_of, record):
                return None  # members not consecutive ids: a record could not name its
                # member
        del group, heads
    del shared
    key = np.concatenate(keys)
    keys.clear()
    key.sort(kind="stable")  # distinct keys: one order for any sort; a merge of the sorted
    # runs the records were made in (0.08 s against 0.42 for quicksort at 4,096 GPUs)
    # each record's interval from its key, a chunk of records at a time (temporaries of
    # ``_CHUNK`` items, which the allocator hands back and reuses: whole-length ones are
    # fresh mappings, each page faulted in and zeroed by the kernel)
    total = len(key)
    built: dict[int, array] = {}  # per lane, its intervals' ends, in order
    starts_at: list[np.ndarray] = []  # where a lane's records begin, and that lane
    lanes_at: list[np.ndarray] = []
    previous = -1
    for x in range(0, total, _CHUNK):
        y = min(x + _CHUNK, total)
        lane, at = np.divmod(key[x:y], span)
        at, sub = np.divmod(at, places)  # the id ``at`` and place ``sub`` that append it
        edge = np.flatnonzero(np.r_[lane[0] != previous, lane[1:] != lane[:-1]])
        starts_at.append(edge + x)
        lanes_at.append(lane[edge])
        previous = int(lane[-1])
        row = tpl[at]
        what = t_cls[row]
        pairs = np.empty((y - x, 2))
        pairs[:, 0] = low_of[at]  # a compute op's: ready, its blocking comm's end
        pairs[:, 1] = end[at]
        member = np.flatnonzero((what == COLLECTIVE) & (t_third[row] > 1))
        if len(member):  # a shared collective's member's end, named by the place
            pairs[member, 1] = end[at[member] + (sub[member] - t_third[row[member]] + 1)]
        del member, row
        compute = what == COMPUTE
        early = np.flatnonzero(compute & (sub < 2))  # a compute op's compute or launch span
        pairs[early, 1] = mid[at[early]]
        late = np.flatnonzero(compute & (sub == 2))  # its blocking communication
        pairs[late, 0] = mid[at[late]]
        del at, sub, what, compute, early, late
        # each lane's records in the chunk, added to its array (one begun in an earlier
        # chunk goes on)
        cut = edge.tolist()
        if not cut or cut[0]:
            cut.insert(0, 0)
        cut.append(y - x)
        for u, v in zip(cut[:-1], cut[1:], strict=True):
            which = int(lane[u])
            ends = built.get(which)
            if ends is None:
                built[which] = array("d", pairs[u:v].tobytes())
            else:
                ends.frombytes(pairs[u:v].tobytes())
        del lane, edge, pairs
    del low_of
    starts = np.concatenate(starts_at) if starts_at else np.zeros(0, dtype=np.int64)
    lane = np.concatenate(lanes_at) if lanes_at else np.zeros(0, dtype=np.int64)
    first = np.argsort(key[starts] % span)  # the lanes in the order of their first
    del key
    intervals: dict[tuple[int, str], array] = {}
    for which in lane[first].tolist():
        intervals[(which // width, names[which % width])] = built.pop(which)
    peaks, floors = _memory(program, gpus, gpu, tpl, t_alloc, t_free)
    every = _doubles(end_s, len(end_s))  # max(end_s, default=0.0): the same value (ends
    clock = float(every.max()) if len(every) else 0.0  # >= 0, no NaN), without a Python step
    return Summaries(intervals, peaks, floors, clock)


def _members(shared: np.ndarray, group: np.ndarray, heads: np.ndarray, t_third: np.ndarray,
             t_kind: np.ndarray, gpu: np.ndarray, width: int, ready: np.ndarray,
             low_of: np.ndarray, record: Callable[..., None]) -> bool:
    """:func:`summaries`' records of whole groups of shared collectives' members (``shared``,
    their templates ``group``, where each group begins ``heads``): each member's interval,
    appended by the group's last member, whose low end is the members' latest start. False:
    the members are not consecutive ids."""
    counts = np.diff(np.r_[heads, len(shared)])
    whole = np.repeat(counts == t_third[group[heads]], counts)
    last = np.repeat(shared[heads + counts - 1], counts)  # what appends them
    place = np.arange(len(shared)) - np.repeat(heads, counts)
    at = shared[whole]
    if not np.array_equal(at, last[whole] - t_third[group[whole]] + 1 + place[whole]):
        return False
    low_of[last[whole]] = np.repeat(np.maximum.reduceat(ready[shared], heads), counts)[whole]
    record(gpu[at].astype(np.int64) * width + t_kind[group[whole]], last[whole], place[whole])
    return True


def _memory(program: Program, gpus: Sequence[int], gpu: np.ndarray, tpl: np.ndarray,
            t_alloc: np.ndarray, t_free: np.ndarray
            ) -> tuple[dict[int, float], dict[int, float]]:
    """Each GPU's memory peak and floor (:func:`sim.timeline._sample`): its static bytes, then
    per compute op in order its allocation added and its release taken, each a sample."""
    static = program.static_bytes
    peaks = {g: static[g] for g in gpus}
    floors = dict(peaks)
    moves = np.flatnonzero(((t_alloc != 0) | (t_free != 0))[tpl])  # (per template, gathered)
    if len(moves):
        row = tpl[moves]
        alloc, free = t_alloc[row], t_free[row]
        del row
        delta = np.stack((alloc, -free), axis=1).ravel()
        sample = np.stack((alloc != 0, free != 0), axis=1).ravel()
        owner = np.repeat(gpu[moves], 2)
        del alloc, free
        by_gpu = np.argsort(owner, kind="stable")
        owner, delta, sample = owner[by_gpu], delta[by_gpu], sample[by_gpu]
        cuts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1], True])
        for x, y in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            g = int(owner[x])
            taken = sample[x:y]
            if not taken.any():
                continue
            base = static[g]
            sums = np.cumsum(np.r_[base, delta[x:y][taken]])[1:]
            # (x - f equals x + (-f); a skipped zero adds nothing): the loop's sums
            high, low = float(sums.max()), float(sums.min())
            if g in peaks:
                peaks[g], floors[g] = max(peaks[g], high), min(floors[g], low)
            else:
                peaks[g], floors[g] = high, low
    return dict(sorted(peaks.items())), dict(sorted(floors.items()))


def chains(program: Program, ready_s: Sequence[float], end_s: Sequence[float],
           index: Callable[[str, int], int], bubble: int
           ) -> tuple[array[float], array[int], dict[int, np.ndarray], array[int],
                      dict[int, tuple[float, int]]]:
    """:func:`sim.idle._chains` of a packed program on arrays (each GPU's compute ops an
    int64 array, not a list) (``index``: a part's index by
    name or ``bubble``, the bubble's): each instruction's cause is its stream predecessor
    (:func:`workloads.streams.stream_columns`, the engine's stream rule) unless a dependency
    ended strictly later, then the first of the latest; a collective's members (one template
    each, :class:`~workloads.packed.PackedBuilder`) take the start and cause of the member
    ready last (the lowest id among equals), where all of them are in the program."""
    instrs = program.instructions
    assert isinstance(instrs, PackedInstructions)
    n = len(instrs)
    templates = instrs.templates
    cls_of = instrs.classes()
    part_of = np.fromiter((bubble if cls is Compute else index(head[2] if cls is Send
                                                             else head[0], bubble)
                           for cls, head, _ in templates), np.int8, len(templates))
    size_of = np.fromiter((len(rest[COLLECTIVE_GROUP]) if cls is Collective else 0
                           for cls, _, rest in templates), np.int64, len(templates))
    tpl = np.frombuffer(instrs.tpl, dtype=np.int32)
    ready, end = _doubles(ready_s, n), _doubles(end_s, len(end_s))
    # the stream predecessors the engine's DAG build kept (else worked out), the deps as the
    # program holds them (4-byte ids: only read)
    before = packed_before(instrs).astype(np.int64)  # a copy: written below
    ndeps = np.diff(np.frombuffer(instrs.first, dtype=np.int64))
    flat = np.frombuffer(instrs.deps, dtype=np.int32)
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
    compute = np.flatnonzero(cls_of[tpl] == COMPUTE)
    gpu = np.frombuffer(instrs.gpu, dtype=np.int32)[compute]
    by_gpu = np.argsort(gpu, kind="stable")
    sorted_gpu = gpu[by_gpu]
    cuts = np.flatnonzero(sorted_gpu[1:] != sorted_gpu[:-1]) + 1
    runs = np.split(compute[by_gpu], cuts)
    firsts = [int(run[0]) for run in runs]
    compute_of = {int(instrs.gpu[f]): run  # views of one array: 8 bytes an op, no int objects
                  for f, run in sorted(zip(firsts, runs, strict=True), key=lambda x: x[0])}
    blocked: dict[int, tuple[float, int]] = {}
    blocking_of = {t: (rest[COMPUTE_BLOCKING_S], index(rest[COMPUTE_BLOCKING_KIND], bubble))
                   for t, (cls, _, rest) in enumerate(templates)
                   if cls is Compute and rest[COMPUTE_BLOCKING_S] > 0}
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
    before = packed_before(instrs, keep=True).astype(np.int32, copy=False)  # kept: chains
    first_dep = np.frombuffer(instrs.first, dtype=np.int64)
    ndeps = np.subtract(first_dep[1:], first_dep[:-1], dtype=np.int32)  # (np.diff's, in 4
    # bytes: a dep's offset fits, the deps being int32 ids)
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
    # the three arrays made in the run's own buffers (not NumPy temporaries copied into
    # them: one fresh mapping each, not two, and one pass less over them)
    out = array("i", b"\0\0\0\0") * total, array("q", b"\0" * 8) * (n + 1), array("i")
    first = np.frombuffer(out[1], dtype=np.int64)
    np.cumsum(np.bincount(pred, minlength=n), out=first[1:])
    order = np.argsort(pred, kind="stable")
    del pred
    np.take(np.repeat(np.arange(n, dtype=np.int32), edges), order,
            out=np.frombuffer(out[0], dtype=np.int32), mode="clip")  # (every index in
    # range: "clip" only lets ``take`` write to ``out`` unbuffered)
    del order, first
    out[2].frombytes(memoryview(edges).cast("B"))
    return out
