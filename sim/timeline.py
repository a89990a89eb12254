"""The immutable record of one simulation: spans on streams, send->recv flows, memory.

Produced by :mod:`sim.engine`, read by :mod:`sim.stats`, :mod:`sim.export` and
:mod:`plots`. Times are seconds from the start of the step.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

COMPUTE_STREAM = "compute"
"""Name of every GPU's compute stream."""

COMPUTE_KINDS = ("F", "B", "W", "opt")
"""Span kinds that run on the compute stream (forward, backward, weight-grad, optimizer)."""

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

    @classmethod
    def known(cls, num_gpus: int, spans: tuple[Span, ...], flows: tuple[FlowArrow, ...],
              memory: tuple[MemorySample, ...], gpu_names: tuple[str, ...] = (),
              gpus: tuple[int, ...] | None = None, *, end_s: float | None = None,
              peak_memory_by_gpu: dict[int, float] | None = None) -> Timeline:
        """A timeline whose producer already knows some of its summaries.

        ``end_s`` and ``peak_memory_by_gpu``, where given, are what the properties of
        the same names would work out in a pass over the records (the engine knows
        them as it assembles the records); they are stored as those properties' cached
        values, so reading them costs nothing. None: computed on first use, as for a
        timeline built directly. The caller vouches that they are equal (the engine's
        tests compare them).
        """
        timeline = cls(num_gpus, spans, flows, memory, gpu_names, gpus)
        # cached_property keeps its value in the instance dict, under its own name
        if end_s is not None:
            timeline.__dict__["end_s"] = end_s
        if peak_memory_by_gpu is not None:
            timeline.__dict__["peak_memory_by_gpu"] = peak_memory_by_gpu
        return timeline

    @classmethod
    def deferred(cls, num_gpus: int,
                 records: Callable[[], tuple[tuple[Span, ...], tuple[FlowArrow, ...],
                                             tuple[MemorySample, ...]]],
                 gpu_names: tuple[str, ...] = (), gpus: tuple[int, ...] | None = None, *,
                 end_s: float | None = None,
                 peak_memory_by_gpu: dict[int, float] | None = None,
                 memory_floor_by_gpu: dict[int, float] | None = None) -> Timeline:
        """A timeline whose records (``spans``, ``flows``, ``memory``) are made by
        ``records()`` when first read, as :meth:`known` otherwise.

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


_RECORDS = ("spans", "flows", "memory")
"""A :meth:`Timeline.deferred` timeline's records, in the order its maker returns them."""
