"""The immutable record of one simulation: spans on streams, send->recv flows, memory.

Produced by :mod:`sim.engine`, read by :mod:`sim.stats`, :mod:`sim.export` and
:mod:`plots`. Times are seconds from the start of the step.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

from workloads.packed import PackedInstructions
from workloads.program import Compute, Program, Send

COMPUTE_STREAM = "compute"
"""Name of every GPU's compute stream."""

COMPUTE_KINDS = ("F", "B", "W", "opt", "E", "G")
"""Span kinds that run on the compute stream (forward, backward, weight-grad, optimizer, and a
multimodal model's encoder forward and backward pieces)."""

COMM_KINDS = ("tp", "pp", "dp", "cp", "ep")
"""Span kinds of communication, as reported in ``exposed_comm_s``."""

IDLE_CAUSES = ("bubble", "tp", "cp", "ep", "pp", "dp", "straggler", "failure")
"""Causes of a GPU's compute-stream idle time, in the order ``idle_breakdown`` reports them:
the pipeline bubble, waiting on each kind of communication (:data:`COMM_KINDS`), on a
slower GPU, on a failure (:mod:`sim.idle`)."""
assert set(IDLE_CAUSES) >= set(COMM_KINDS)

_COLLECTIVE_ORDER = ("tp", "cp", "ep", "dp")
_P2P_STREAM = re.compile(r"^(recv<|send>)(\d+)$")


def stream_sort_key(stream: str) -> tuple[int, int, str]:
    """Display order of a GPU's streams: compute, tp, cp, ep, dp, others by name, then p2p.

    Point-to-point streams sort by peer GPU and then receive before send, so a
    middle pipeline stage shows ``recv<0``, ``send>0``, ``recv<2``, ``send>2``.
    """
    if stream == COMPUTE_STREAM:
        return (0, 0, "")
    if stream in _COLLECTIVE_ORDER:
        return (1, _COLLECTIVE_ORDER.index(stream), "")
    match = _P2P_STREAM.match(stream)
    if match is not None:
        return (3, int(match.group(2)), match.group(1))
    return (2, 0, stream)


class Span(NamedTuple):
    """One interval of work on one stream of one GPU.

    Timeline records are typed named tuples rather than frozen dataclasses: a
    large run creates about a million of them, and a tuple is built in half the
    time (immutable and compared by value either way).
    """

    gpu: int
    """Global GPU rank."""
    stream: str
    """Stream name: ``compute``, ``tp``, ``dp``, ``send>3`` (p2p to GPU 3), ``recv<2``."""
    kind: str
    """One of COMPUTE_KINDS or COMM_KINDS."""
    name: str
    """Display name; pipeline ops use the canonical text form, e.g. ``1F3``."""
    start_s: float
    end_s: float
    stage: int = -1
    """Pipeline stage (model chunk) or -1."""
    mb: int = -1
    """Micro-batch index or -1."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class FlowArrow(NamedTuple):
    """A point-to-point message: drawn as an arrow from the send span to the recv span."""

    send: int
    """Index of the send span in ``Timeline.spans``."""
    recv: int
    """Index of the matching receive span in ``Timeline.spans``."""


class MemorySample(NamedTuple):
    """Allocated bytes on one GPU from ``time_s`` until the next sample of that GPU."""

    gpu: int
    time_s: float
    bytes: float


# Span.end_s; MemorySample.gpu and .bytes (fields by position: C-speed getters)
_END_S, _GPU, _BYTES = itemgetter(5), itemgetter(0), itemgetter(2)
_ORDER, _SPAN = itemgetter(2), itemgetter(3)  # of a lane record (start, end, order, Span)


@dataclass(frozen=True)
class Timeline:
    """Everything that happened in one simulated step, in deterministic order."""

    num_gpus: int
    spans: tuple[Span, ...]
    flows: tuple[FlowArrow, ...]
    memory: tuple[MemorySample, ...]
    """Per-GPU step function of allocated bytes, sorted by (gpu, time)."""
    gpu_names: tuple[str, ...] = ()
    """Optional label per GPU, e.g. ``node0/gpu3 pp1 dp0 tp1``."""
    gpus: tuple[int, ...] | None = None
    """GPUs that were simulated (None = all); a collapsed run simulates one per class."""
    collectives: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    """Each multi-GPU collective: the indices in ``spans`` of its members' spans, in the
    order of its process group (a trace draws them as a chain of arrows). A factory
    default, so that no class attribute hides a :meth:`deferred` timeline's record."""

    @classmethod
    def known(cls, num_gpus: int, spans: tuple[Span, ...], flows: tuple[FlowArrow, ...],
              memory: tuple[MemorySample, ...], gpu_names: tuple[str, ...] = (),
              gpus: tuple[int, ...] | None = None, *, end_s: float | None = None,
              peak_memory_by_gpu: dict[int, float] | None = None,
              collectives: tuple[tuple[int, ...], ...] = ()) -> Timeline:
        """A timeline whose producer already knows some of its summaries.

        ``end_s`` and ``peak_memory_by_gpu``, where given, are what the properties of
        the same names would work out in a pass over the records (the engine knows
        them as it assembles the records); they are stored as those properties' cached
        values, so reading them costs nothing. None: computed on first use, as for a
        timeline built directly. The caller vouches that they are equal (the engine's
        tests compare them).
        """
        timeline = cls(num_gpus, spans, flows, memory, gpu_names, gpus, collectives)
        # cached_property keeps its value in the instance dict, under its own name
        if end_s is not None:
            timeline.__dict__["end_s"] = end_s
        if peak_memory_by_gpu is not None:
            timeline.__dict__["peak_memory_by_gpu"] = peak_memory_by_gpu
        return timeline

    @classmethod
    def deferred(cls, num_gpus: int,
                 records: Callable[[], tuple[tuple[Span, ...], tuple[FlowArrow, ...],
                                             tuple[MemorySample, ...],
                                             tuple[tuple[int, ...], ...]]],
                 gpu_names: tuple[str, ...] = (), gpus: tuple[int, ...] | None = None, *,
                 end_s: float | None = None,
                 peak_memory_by_gpu: dict[int, float] | None = None,
                 memory_floor_by_gpu: dict[int, float] | None = None) -> Timeline:
        """A timeline whose records (``spans``, ``flows``, ``memory``, ``collectives``)
        are made by ``records()`` when first read, as :meth:`known` otherwise.

        A large collapsed run's statistics need only the summaries its producer knows
        (the engine's queue-free pass on columns, :mod:`sim.columnar`), while building
        a million span records takes seconds: they are built only if something reads
        them (a trace, a plot, a comparison). The timeline is the same either way:
        it compares, prints and pickles with its records.
        """
        timeline = cls.__new__(cls)
        for name, value in (("num_gpus", num_gpus), ("gpu_names", gpu_names), ("gpus", gpus)):
            object.__setattr__(timeline, name, value)
        timeline.__dict__["_records"] = records
        for name, value in (("end_s", end_s), ("peak_memory_by_gpu", peak_memory_by_gpu),
                            ("memory_floor_by_gpu", memory_floor_by_gpu)):
            if value is not None:
                timeline.__dict__[name] = value
        return timeline

    def __getattr__(self, name: str) -> object:
        """The records of a :meth:`deferred` timeline, made on first read."""
        records = self.__dict__.get("_records") if name in _RECORDS else None
        if records is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        for field_name, value in zip(_RECORDS, records(), strict=True):
            self.__dict__[field_name] = value
        del self.__dict__["_records"]
        return self.__dict__[name]

    def __getstate__(self) -> dict:
        if "_records" in self.__dict__:
            getattr(self, "spans")  # noqa: B009 (makes the records)
        return self.__dict__

    @property
    def records_made(self) -> bool:
        """Whether the records exist (always, but for a :meth:`deferred` timeline not yet
        read)."""
        return "_records" not in self.__dict__

    @property
    def simulated_gpus(self) -> tuple[int, ...]:
        return tuple(range(self.num_gpus)) if self.gpus is None else self.gpus

    @cached_property
    def end_s(self) -> float:
        """Makespan: end of the last span (0 when empty)."""
        return max(map(_END_S, self.spans), default=0.0)

    def spans_of(self, gpu: int, stream: str | None = None) -> list[Span]:
        return [s for s in self.spans if s.gpu == gpu and (stream is None or s.stream == stream)]

    @cached_property
    def peak_memory_by_gpu(self) -> dict[int, float]:
        """Largest allocated bytes of each GPU with memory samples, in one pass."""
        peaks: dict[int, float] = {}
        for g, samples in groupby(self.memory, _GPU):  # one run per GPU when sorted
            top = max(map(_BYTES, samples))
            if top > peaks.get(g, float("-inf")):
                peaks[g] = top
        return peaks

    def peak_memory_bytes(self, gpu: int) -> float:
        return self.peak_memory_by_gpu.get(gpu, 0.0)

    @cached_property
    def memory_floor_by_gpu(self) -> dict[int, float]:
        """Smallest allocated bytes of each GPU with memory samples, in one pass (its static
        state, the sample at time 0, before any op allocates)."""
        floors: dict[int, float] = {}
        for g, samples in groupby(self.memory, _GPU):  # one run per GPU when sorted
            low = min(map(_BYTES, samples))
            if low < floors.get(g, float("inf")):
                floors[g] = low
        return floors


_RECORDS = ("spans", "flows", "memory", "collectives")
"""A :meth:`Timeline.deferred` timeline's records, in the order its maker returns them."""


def timeline_of(program: Program, ready_s: Sequence[float], mid_s: Sequence[float],
                end_s: Sequence[float]) -> Timeline:
    """The timeline of ``program`` run with these per-instruction times: the one place
    records are made, whichever engine pass worked the times out (:mod:`sim.engine`).

    ``ready_s``: when each instruction's last predecessor completed (a compute op or send
    starts then; a collective starts at its members' latest); ``mid_s``: where a compute
    op's compute span ends and its blocking communication begins (``ready + duration``);
    ``end_s``: when it completed. Spans are sorted by (gpu, stream, start, end, instruction
    id); each GPU's memory samples are its static bytes at time 0, then each compute op's
    allocation at its start and free at its end, in program order (with durations never
    negative, their times do not decrease).
    """
    instrs = program.instructions
    gpus = (tuple(range(program.num_gpus)) if program.simulated_gpus is None
            else program.simulated_gpus)
    new = tuple.__new__  # records built without Python-level __new__
    plain: dict[tuple[int, str], list[Span]] = {}
    """(GPU, stream) -> spans of the streams whose spans come in order (compute, send,
    receive: one stream's instructions in program order, each after the previous ended)"""
    lanes: dict[tuple[int, str], list[tuple]] = {}
    """(GPU, stream) -> (start, end, order, Span) of the collective streams, which the
    blocking communication of compute ops joins out of order"""
    arrows: list[tuple[tuple[int, str], tuple[int, str]]] = []
    """(send lane, receive lane) pairs: their k-th spans pair up"""
    sends: dict[tuple[int, int], tuple[list[Span], str, list[Span], str]] = {}
    memory: dict[int, list[MemorySample]] = {
        g: [new(MemorySample, (g, 0.0, program.static_bytes[g]))] for g in gpus}
    mem_now = list(program.static_bytes)
    members: dict[int, list[int]] = {}
    collectives: list[list[int]] = []
    """the member instructions of each multi-GPU collective, in its group's order"""
    for ins in instrs:
        cls = type(ins)
        if cls is Compute:
            (i, g, kind, name, _, _, _, _, _, _, _, blocking, comm, alloc, free, stage,
             mb) = ins
            t, mid, stop = ready_s[i], mid_s[i], end_s[i]
            if alloc or free:
                samples = memory.get(g)
                if samples is None:
                    samples = memory[g] = []
                if alloc:
                    mem_now[g] += alloc
                    samples.append(new(MemorySample, (g, t, mem_now[g])))
                if free:
                    mem_now[g] -= free
                    samples.append(new(MemorySample, (g, stop, mem_now[g])))
            own = plain.get((g, COMPUTE_STREAM))
            if own is None:
                own = plain[(g, COMPUTE_STREAM)] = []
            own.append(new(Span, (g, COMPUTE_STREAM, kind, name, t, mid, stage, mb)))
            if blocking > 0:
                lanes.setdefault((g, comm), []).append((mid, stop, 4 * i + 1, new(
                    Span, (g, comm, comm, f"{name} {comm}", mid, stop, stage, mb))))
        elif cls is Send:
            i, g, dst, _, kind, name, _, stage, mb, _ = ins
            lane = sends.get((g, dst))
            if lane is None:
                out, back = f"send>{dst}", f"recv<{g}"
                lane = sends[(g, dst)] = (plain.setdefault((g, out), []), out,
                                          plain.setdefault((dst, back), []), back)
                arrows.append(((g, out), (dst, back)))
            t, stop = ready_s[i], end_s[i]
            lane[0].append(new(Span, (g, lane[1], kind, name, t, stop, stage, mb)))
            lane[2].append(new(Span, (dst, lane[3], kind, name, t, stop, stage, mb)))
        else:
            i, g, kind, name = ins[0], ins[1], ins[2], ins[3]
            group = ins[7]
            arrived = _arrived(members, i, group, ins[9], ready_s)
            if arrived is None:
                continue
            waiting, start = arrived
            if len(group) > 1:
                rank = {gpu: r for r, gpu in enumerate(group)}
                collectives.append(sorted(waiting, key=lambda j: rank[instrs[j].gpu]))
            for j in waiting:
                m = instrs[j]
                lanes.setdefault((m.gpu, kind), []).append((start, end_s[j], 4 * j, new(
                    Span, (m.gpu, kind, kind, m.name, start, end_s[j], m.stage, m.mb))))
    spans: list[Span] = []
    base: dict[tuple[int, str], int] = {}  # a plain lane's first index
    index_of: dict[int, int] = {}  # a collective member's order key -> its span's index
    for key in sorted(lanes.keys() | plain.keys()):
        own = plain.get(key)
        if own is not None:
            base[key] = len(spans)
            spans.extend(own)
            continue
        recs = lanes[key]
        recs.sort()
        if collectives:
            index_of.update(zip(map(_ORDER, recs), range(len(spans), len(spans) + len(recs)),
                                strict=True))
        spans.extend(map(_SPAN, recs))
    pairs: list[tuple[int, int]] = []
    for send, recv in arrows:
        first, n = base[recv], len(plain[send])
        pairs.extend(zip(range(base[send], base[send] + n), range(first, first + n),
                         strict=True))
    flows = tuple(map(partial(tuple.__new__, FlowArrow), sorted(pairs)))
    samples: list[MemorySample] = []
    peaks: dict[int, float] = {}
    for g, recs in sorted(memory.items()):
        samples.extend(recs)
        peaks[g] = max(map(_BYTES, recs))
    clock = max(end_s, default=0.0)
    groups = tuple(tuple(index_of[4 * j] for j in members_of) for members_of in collectives)
    return Timeline.known(program.num_gpus, tuple(spans), flows, tuple(samples),
                          program.gpu_names, gpus, end_s=clock if clock > 0 else None,
                          peak_memory_by_gpu=peaks, collectives=groups)


class Summaries(NamedTuple):
    """What the statistics read of a timeline, worked out from an engine run's times without
    making its records (:func:`summaries_of`)."""

    intervals: dict[tuple[int, str], array]
    """As :attr:`sim.engine.InstructionTimes.intervals`: per ``(GPU, "compute")`` the
    compute-stream spans', per ``(GPU, kind)`` those of each communication kind, flat
    ``[start, end, ...]``."""
    peaks: dict[int, float]
    """:attr:`Timeline.peak_memory_by_gpu` of the records."""
    floors: dict[int, float]
    """:attr:`Timeline.memory_floor_by_gpu` of the records."""
    clock: float
    """The latest end time (0 when none)."""


def summaries_of(program: Program, ready_s: Sequence[float], mid_s: Sequence[float],
                 end_s: Sequence[float]) -> Summaries:
    """The :class:`Summaries` of the timeline :func:`timeline_of` makes of the same times, in
    one pass over the instructions and without a record: each span's interval (as
    :func:`sim.stats.span_intervals` reads it from the spans), the memory samples' peaks and
    floors by the same running sums (``tests/test_engine_records.py`` compares them)."""
    if isinstance(program.instructions, PackedInstructions):  # the same loop on its columns
        from sim.packedpass import summaries

        packed = summaries(program, ready_s, mid_s, end_s)
        if packed is not None:
            return packed
    gpus = (tuple(range(program.num_gpus)) if program.simulated_gpus is None
            else program.simulated_gpus)
    comm_kinds = frozenset(COMM_KINDS)
    intervals: dict[tuple[int, str], array] = {}
    mem_now = list(program.static_bytes)
    peaks = {g: mem_now[g] for g in gpus}
    floors = dict(peaks)
    members: dict[int, list[int]] = {}
    instrs = program.instructions

    def lane(key: tuple[int, str]) -> array:
        out = intervals.get(key)
        if out is None:
            out = intervals[key] = array("d")
        return out

    compute_lane: dict[int, array] = {}  # per GPU, its compute stream's lane (of intervals)
    for ins in instrs:
        cls = type(ins)
        if cls is Compute:
            i, g, kind = ins[0], ins[1], ins[2]
            blocking, comm, alloc, free = ins[11], ins[12], ins[13], ins[14]
            t, mid = ready_s[i], mid_s[i]
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
            stream.append(t)
            stream.append(mid)
            if kind in comm_kinds:  # as span_intervals would count it (no compute kind is)
                own = lane((g, kind))
                own.append(t)
                own.append(mid)
            if blocking > 0 and comm in comm_kinds:
                own = lane((g, comm))
                own.append(mid)
                own.append(end_s[i])
        elif cls is Send:
            i, g, dst, kind = ins[0], ins[1], ins[2], ins[4]
            if kind in comm_kinds:
                t, stop = ready_s[i], end_s[i]
                for gpu in (g, dst):
                    own = lane((gpu, kind))
                    own.append(t)
                    own.append(stop)
        else:
            i, kind, group = ins[0], ins[2], ins[7]
            if len(group) > 1:  # _arrived, inline (once per member)
                waiting = members.get(ins[9])
                if waiting is None:
                    members[ins[9]] = [i]
                    continue
                waiting.append(i)
                if len(waiting) < len(group):
                    continue
                del members[ins[9]]
                start = max([ready_s[j] for j in waiting])
            else:
                waiting, start = [i], ready_s[i]
            if kind in comm_kinds:
                for j in waiting:
                    key = (instrs[j][1], kind)
                    own = intervals.get(key)  # lane(key), inline (once per member)
                    if own is None:
                        own = intervals[key] = array("d")
                    own.append(start)
                    own.append(end_s[j])
    return Summaries(intervals, dict(sorted(peaks.items())), dict(sorted(floors.items())),
                     max(end_s, default=0.0))


def _arrived(members: dict, i: int, group: tuple, key: object, ready_s: Sequence[float]
             ) -> tuple[list[int], float] | None:
    """Instruction ``i`` of collective ``key`` over ``group`` has been reached: None while
    other members are still to come (``members`` keeps those waiting), else every member's
    index and the collective's start, when the last of them was ready."""
    if len(group) <= 1:
        return [i], ready_s[i]
    waiting = members.setdefault(key, [])
    waiting.append(i)
    if len(waiting) < len(group):
        return None
    del members[key]
    return waiting, max(ready_s[j] for j in waiting)


def _sample(peaks: dict[int, float], floors: dict[int, float], g: int, now: float) -> None:
    """GPU ``g`` holds ``now`` bytes: its peak and floor so far."""
    if g not in peaks:
        peaks[g] = floors[g] = now
    elif now > peaks[g]:
        peaks[g] = now
    elif now < floors[g]:
        floors[g] = now
