"""Run statistics from a timeline: the ``sim run --json`` object. Pure (no SimPy, no matplotlib)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sim.timeline import COMM_KINDS, COMPUTE_STREAM, Span, Timeline, gc_paused
from topologies.hardware import GiB


@dataclass(frozen=True)
class RunFacts:
    """What stats need to know besides the timeline."""

    pipeline_rank: tuple[int, ...]
    """Pipeline rank of each GPU."""
    peak_flops: float
    """Dense BF16 peak of one GPU, FLOP/s."""
    memory_capacity_bytes: float
    tokens_per_step: float | None
    model_flops_per_step: float | None
    reserved_bytes: float = 0.0
    """Per-GPU memory outside tracked tensors (CUDA context, workspaces)."""
    fragmentation: float = 0.0
    """Allocator overhead as a fraction of the dynamic memory above the static state
    (activations, working buffers: what the caching allocator carves and frees each
    step); the static state (weights, gradients, optimizer), allocated once in a few
    large blocks, has none."""
    extra: tuple[tuple[str, object], ...] = ()
    """Descriptive keys copied into the stats (layout, schedule, ...)."""
    memory_capacity_per_gpu: tuple[float, ...] = ()
    """A mixed cluster's capacity of each GPU, bytes: each GPU's peak is checked against
    its own (``oom_gpus``); empty: ``memory_capacity_bytes`` for all."""


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as sorted, disjoint intervals (empty ones dropped)."""
    merged: list[tuple[float, float]] = []
    lo = hi = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if hi is not None and start <= hi:
            if end > hi:
                hi = end
        else:
            if hi is not None:
                merged.append((lo, hi))
            lo, hi = start, end
    if hi is not None:
        merged.append((lo, hi))
    return merged  # type: ignore[return-value]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Length of union ``a`` not covered by union ``b`` (both sorted, disjoint)."""
    covered, j, nb = 0.0, 0, len(b)
    for start, end in a:
        while j < nb and b[j][1] <= start:
            j += 1
        k = j
        while k < nb:
            lo, hi = b[k]
            if not lo < end:
                break
            # min(end, hi) - max(start, lo), without the calls
            covered += (hi if hi < end else end) - (lo if lo > start else start)
            k += 1
    return _length(a) - covered


def _clipped(intervals: Iterable[tuple[float, float]], window: tuple[float, float] | None
             ) -> Iterable[tuple[float, float]]:
    """``intervals`` cut to ``window`` (unchanged without one)."""
    if window is None:
        return intervals
    lo, hi = window
    return ((max(a, lo), min(b, hi)) for a, b in intervals)


def _intervals(spans: Iterable[Span], gpus: Sequence[int]
               ) -> tuple[dict[int, list[tuple[float, float]]],
                          dict[int, dict[str, list[tuple[float, float]]]]]:
    """Per GPU, the intervals of its compute-stream spans and, per communication kind, those
    of its spans of that kind, in one pass over the spans."""
    on_compute: dict[int, list[tuple[float, float]]] = {g: [] for g in gpus}
    of_kind = {g: {kind: [] for kind in COMM_KINDS} for g in gpus}
    for g, stream, kind, _, start, end, _, _ in spans:
        if stream == COMPUTE_STREAM:
            on_compute[g].append((start, end))
        same = of_kind[g].get(kind)
        if same is not None:
            same.append((start, end))
    return on_compute, of_kind


def _peak_memory(timeline: Timeline, gpus: Sequence[int], facts: RunFacts) -> dict[int, float]:
    """Per GPU: static state + (peak − static) x (1 + fragmentation) + reserved bytes.

    The static state is the GPU's lowest allocated bytes (its sample at time 0,
    before any op allocates); fragmentation applies to the dynamic part only."""
    floor: dict[int, float] = {}
    if facts.fragmentation:
        for m in timeline.memory:
            if m.bytes < floor.get(m.gpu, float("inf")):
                floor[m.gpu] = m.bytes
    out = {}
    for g in gpus:
        peak = timeline.peak_memory_bytes(g)
        static = floor.get(g, 0.0)
        out[g] = static + (peak - static) * (1 + facts.fragmentation) + facts.reserved_bytes
    return out


def compute_stats(timeline: Timeline, facts: RunFacts,
                  window: tuple[float, float] | None = None) -> dict:
    """The stats object of DESIGN.md (keys in a fixed order; values plain JSON types).

    ``window``: for a multi-step run, the steady-state step ``(end of step k, end of
    step k + 1)``: ``step_time_s`` is its length (the period of back-to-back steps)
    and busy, idle and exposed communication are counted inside it; peak memory is
    over the whole run. Without it, the whole timeline is one step.

    - ``bubble_fraction``: Σ over pipeline ranks of compute-stream idle time ÷
      (pp × step_time), averaged over DP/TP replicas = mean over GPUs of idle/step.
    - ``bubble_ratio``: idle ÷ busy, the papers' (p − 1)/m form.
    - ``exposed_comm_s[kind]``: per GPU, time when a ``kind`` transfer involving it
      runs and its compute stream is idle; the mean over GPUs.
    """
    with gc_paused():  # a large timeline: many intervals, no cycles
        return _compute_stats(timeline, facts, window)


def _compute_stats(timeline: Timeline, facts: RunFacts,
                   window: tuple[float, float] | None) -> dict:
    """:func:`compute_stats`, with the garbage collector paused by the caller."""
    n = timeline.num_gpus
    gpus = timeline.simulated_gpus
    step = timeline.end_s if window is None else window[1] - window[0]
    on_compute, of_kind = _intervals(timeline.spans, gpus)
    busy = {g: _union(_clipped(on_compute[g], window)) for g in gpus}
    idle = [step - _length(b) for b in busy.values()]
    bubble = sum(idle) / (len(gpus) * step) if step > 0 else 0.0
    exposed = {}
    for kind in COMM_KINDS:
        total = 0.0
        for g in gpus:
            comm = _union(_clipped(of_kind[g][kind], window))
            total += _minus(comm, busy[g]) if comm else 0.0
        exposed[kind] = total / len(gpus)
    peaks = _peak_memory(timeline, gpus, facts)
    pp = max(facts.pipeline_rank) + 1 if facts.pipeline_rank else 1
    per_stage = [max(p for g, p in peaks.items() if facts.pipeline_rank[g] == r) / GiB
                 for r in range(pp)]
    tokens_per_s = facts.tokens_per_step / step if facts.tokens_per_step and step > 0 else None
    tflops = (facts.model_flops_per_step / step / n / 1e12
              if facts.model_flops_per_step and step > 0 else None)
    mfu = (tflops * 1e12 / facts.peak_flops
           if tflops is not None and facts.peak_flops not in (0, float("inf")) else None)
    peak = max(peaks.values()) / GiB if peaks else 0.0
    capacity = facts.memory_capacity_bytes / GiB
    per_gpu = facts.memory_capacity_per_gpu
    over = [g for g in gpus if peaks[g] > per_gpu[g]] if per_gpu else []
    if per_gpu and peaks:  # the capacity of the GPU with the largest peak
        capacity = per_gpu[max(peaks, key=peaks.__getitem__)] / GiB
    stats = {
        "step_time_s": step,
        "num_gpus": n,
        "tokens_per_s": tokens_per_s,
        "tflops_per_gpu": tflops,
        "mfu": mfu,
        "bubble_fraction": bubble,
        "bubble_ratio": bubble / (1 - bubble) if bubble < 1 else None,
        "peak_memory_gib": peak,
        "memory_capacity_gib": capacity if capacity != float("inf") else None,
        "oom": bool(over) if per_gpu else peak > capacity,
        "exposed_comm_s": exposed,
        "peak_memory_per_stage_gib": per_stage,
        "compute_busy_s_mean": sum(_length(b) for b in busy.values()) / len(gpus),
    }
    if per_gpu:
        stats["oom_gpus"] = over
    stats.update(dict(facts.extra))
    return stats
