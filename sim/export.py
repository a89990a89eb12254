"""Chrome Trace Event Format export of a :class:`~sim.timeline.Timeline`, and a checker.

The output opens in https://ui.perfetto.dev (and legacy ``chrome://tracing``):

* one *process* per GPU that has spans or memory samples (``pid = gpu + 1``:
  Perfetto treats pid 0 as the Linux swapper, google/perfetto#394), named from
  ``Timeline.gpu_names`` when given, else ``GPU <rank>``;
* one *thread* per stream, in the order of :func:`sim.timeline.stream_sort_key` (compute, tp,
  cp, ep, dp, other streams by name, then ``recv<j``/``send>j`` by peer). Thread
  ids are unique in the whole trace and never equal a pid. Should spans of one
  stream overlap without nesting, the stream is split over extra lanes
  (``dp #2``) so that every thread holds properly nested slices;
* a complete event (``ph: "X"``) per span: category = span kind, args ``stage``,
  ``mb``, ``kind``, ``stream``;
* a flow arrow per :class:`~sim.timeline.FlowArrow`: ``ph: "s"`` at the send span's
  start and ``ph: "f"`` with ``bp: "e"`` inside the receive span (at the first
  instant of it that is not before the send started), with the same ``id``,
  ``cat`` and ``name``, which Perfetto uses together to pair them;
* a chain of flow arrows per multi-GPU collective (``Timeline.collectives``), from
  each member's span to the next member's in the process group's order, category
  ``collective``, so that Perfetto shows which spans on which GPUs are one
  all-reduce (ids after the point-to-point ones);
* a counter track ``memory`` per GPU (``ph: "C"``, args ``{"GiB": bytes / 2**30}``).

A trace may hold a subset of the GPUs (``gpus``: a 1,024-GPU full-fidelity step
is a 140 MB trace; one pipeline tells most of the story): spans, memory and
flows of the others are left out, a flow with one end outside too, and
``otherData.gpus`` lists the GPUs kept. A path ending in ``.gz`` is written
gzip-compressed, with a zero mtime and no file name in the header, so that the
same timeline still gives the same bytes; :func:`load_trace` and
:func:`check_trace` read either.

Perfetto reads JSON events in timestamp order (file order on ties), binds a flow
event to the innermost slice open on its thread at that moment, and drops a flow
whose end it reads before its start (``flow_end_without_start``; source:
``src/trace_processor/importers/json`` and ``importers/common/flow_tracker.cc``).
Timed events are therefore written in time order, and within one timestamp in
an order that binds every flow event to its own span (a topological order of
the "must be read before" relation). The format itself is Google's "Trace Event
Format" document (Catapult, 2016).

Times become integer nanoseconds before microseconds, so ``ts`` and ``dur`` carry
at most three decimals and the same timeline always gives the same bytes. This
module is pure: no simpy, no matplotlib.
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.timeline import FlowArrow, Span, Timeline, stream_sort_key

__all__ = [
    "TOLERANCE_US",
    "check_trace",
    "chrome_trace",
    "dumps_trace",
    "flow_bindings",
    "load_trace",
    "write_chrome_trace",
]

TOLERANCE_US = 1e-6
"""Slack, in microseconds, when :func:`check_trace` compares event boundaries."""

_GIB = float(2**30)
_NS_PER_S = 1e9
_FLOW_CATEGORY = "p2p"
_COLLECTIVE_CATEGORY = "collective"
_METADATA_ARG = {
    "process_name": "name",
    "process_labels": "labels",
    "process_sort_index": "sort_index",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}
_KNOWN_PHASES = frozenset("BEXIiCbensftMPONDR")
_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_LEVEL = 6
"""zlib's default: near level 9's size at a fraction of its time on trace text."""


# ---------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Placed:
    """A span with integer-nanosecond bounds and the lane of its stream it was put on."""

    index: int
    span: Span
    start_ns: int
    end_ns: int
    lane: int


@dataclass(order=True, slots=True)
class _Timed:
    """One timed trace event awaiting its place in the file."""

    ts_ns: int
    key: tuple[int, ...]
    """Preferred order among events of equal timestamp (smaller first)."""
    event: dict[str, Any] = field(compare=False)
    track: tuple[int, int] = field(compare=False)
    span: int = field(compare=False)
    """Index of the span this event is (``X``) or binds to (flow events)."""


def _to_ns(seconds: float, what: str) -> int:
    if not math.isfinite(seconds):
        raise ValueError(f"cannot export {what}: time {seconds!r} s is not finite")
    return round(seconds * _NS_PER_S)


def _us(ns: int) -> float:
    """Nanoseconds to microseconds (three decimals at most); never ``-0.0``."""
    return ns / 1000 + 0.0


def _place_spans(timeline: Timeline) -> dict[tuple[int, str], list[_Placed]]:
    """Group spans by (gpu, stream), in (start, longest first) order, with nesting lanes.

    A span that a flow arrow starts or ends at holds no other span of its lane, so
    that no child can hide it from the flow event that binds to it.
    """
    endpoints = {index for flow, _ in _arrows(timeline) for index in (flow.send, flow.recv)}
    groups: dict[tuple[int, str], list[tuple[int, int, int, Span]]] = {}
    for index, span in enumerate(timeline.spans):
        what = f"span #{index} {span.name!r} on GPU {span.gpu} stream {span.stream!r}"
        if span.gpu < 0:
            raise ValueError(f"cannot export {what}: GPU {span.gpu} is negative")
        start_ns, end_ns = _to_ns(span.start_s, what), _to_ns(span.end_s, what)
        if end_ns < start_ns:
            raise ValueError(
                f"cannot export {what}: it ends at {span.end_s!r} s, before it starts at "
                f"{span.start_s!r} s"
            )
        groups.setdefault((span.gpu, span.stream), []).append((start_ns, end_ns, index, span))
    placed: dict[tuple[int, str], list[_Placed]] = {}
    for key, items in groups.items():
        items.sort(key=lambda item: (item[0], -item[1], item[2]))
        lanes: list[list[tuple[int, bool]]] = []
        out: list[_Placed] = []
        for start_ns, end_ns, index, span in items:
            lane_no = _first_fitting_lane(lanes, start_ns, end_ns)
            if lane_no == len(lanes):
                lanes.append([])
            lanes[lane_no].append((end_ns, index not in endpoints))
            out.append(_Placed(index, span, start_ns, end_ns, lane_no))
        placed[key] = out
    return placed


def _first_fitting_lane(lanes: list[list[tuple[int, bool]]], start_ns: int, end_ns: int) -> int:
    """First lane where [start, end] nests or is disjoint; ``len(lanes)`` if none.

    Each lane is a stack of (end time, may hold children) of its open spans.
    Ended spans (end <= start) are popped, as Perfetto pops them when a slice starts.
    """
    for lane_no, stack in enumerate(lanes):
        while stack and stack[-1][0] <= start_ns:
            stack.pop()
        if not stack or (stack[-1][0] >= end_ns and stack[-1][1]):
            return lane_no
    return len(lanes)


def _gpu_label(timeline: Timeline, gpu: int) -> str:
    if gpu < len(timeline.gpu_names) and timeline.gpu_names[gpu]:
        return timeline.gpu_names[gpu]
    return f"GPU {gpu}"


def _metadata(name: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid}
    if tid is not None:
        event["tid"] = tid
    event["args"] = {_METADATA_ARG[name]: value}
    return event


def _only_gpus(timeline: Timeline, gpus: Iterable[int]) -> Timeline:
    """``timeline`` with the spans, memory samples and flows of ``gpus`` only (a flow
    with an end on another GPU is left out); ``ValueError`` for a GPU not in it."""
    keep = set(gpus)
    bad = sorted(g for g in keep if not 0 <= g < timeline.num_gpus)
    if bad:
        raise ValueError(f"cannot export GPUs {bad}: the timeline has GPUs 0.."
                         f"{timeline.num_gpus - 1}")
    new_index: dict[int, int] = {}
    spans: list[Span] = []
    for index, span in enumerate(timeline.spans):
        if span.gpu in keep:
            new_index[index] = len(spans)
            spans.append(span)
    flows = tuple(FlowArrow(new_index[f.send], new_index[f.recv]) for f in timeline.flows
                  if f.send in new_index and f.recv in new_index)
    collectives = tuple(kept for kept in (tuple(new_index[i] for i in group if i in new_index)
                                          for group in timeline.collectives) if len(kept) > 1)
    memory = tuple(m for m in timeline.memory if m.gpu in keep)
    return Timeline.known(timeline.num_gpus, tuple(spans), flows, memory, timeline.gpu_names,
                          timeline.gpus, end_s=timeline.end_s, collectives=collectives)


def _arrows(timeline: Timeline) -> list[tuple[FlowArrow, str]]:
    """Every arrow a trace draws, with its category: the point-to-point messages, then
    each collective's chain (member k -> member k + 1)."""
    arrows = [(flow, _FLOW_CATEGORY) for flow in timeline.flows]
    for group in timeline.collectives:
        arrows.extend((FlowArrow(a, b), _COLLECTIVE_CATEGORY)
                      for a, b in zip(group, group[1:], strict=False))
    return arrows


def chrome_trace(timeline: Timeline, title: str = "", gpus: Iterable[int] | None = None
                 ) -> dict[str, Any]:
    """Return ``timeline`` as a Chrome Trace Event Format object (see the module docstring).

    ``gpus``: export only these GPUs (default: all; ``otherData.gpus`` then lists
    them). Event order is fixed: process then thread metadata, then complete and
    flow events in time order, then memory counters by (GPU, time). Raises
    ``ValueError`` for a span that ends before it starts, a non-finite time, a
    negative GPU, a flow whose span index is out of range, or ``gpus`` not in
    the timeline.
    """
    kept = None if gpus is None else sorted(set(gpus))
    if kept is not None:
        timeline = _only_gpus(timeline, kept)
    placed = _place_spans(timeline)
    memory = sorted(
        (m.gpu, _to_ns(m.time_s, f"memory sample of GPU {m.gpu}"), order, m.bytes)
        for order, m in enumerate(timeline.memory)
    )
    gpus = sorted({gpu for gpu, _ in placed} | {sample[0] for sample in memory})
    max_pid = max(gpus, default=-1) + 1

    threads: list[tuple[int, str, int]] = []  # (gpu, stream, lane) in display order
    for gpu, stream in sorted(placed, key=lambda k: (k[0], stream_sort_key(k[1]))):
        lanes = 1 + max(p.lane for p in placed[(gpu, stream)])
        threads.extend((gpu, stream, lane) for lane in range(lanes))
    tid_of = {thread: max_pid + 1 + n for n, thread in enumerate(threads)}

    events: list[dict[str, Any]] = []
    for gpu in gpus:
        events.append(_metadata("process_name", gpu + 1, None, _gpu_label(timeline, gpu)))
        events.append(_metadata("process_sort_index", gpu + 1, None, gpu))
    previous_gpu, order = -1, 0
    for gpu, stream, lane in threads:
        order = order + 1 if gpu == previous_gpu else 0
        previous_gpu = gpu
        tid = tid_of[(gpu, stream, lane)]
        label = stream if lane == 0 else f"{stream} #{lane + 1}"
        events.append(_metadata("thread_name", gpu + 1, tid, label))
        events.append(_metadata("thread_sort_index", gpu + 1, tid, order))

    events.extend(_timed_events(timeline, placed, tid_of))

    for gpu, time_ns, _, value in memory:
        events.append(
            {
                "name": "memory",
                "ph": "C",
                "ts": _us(time_ns),
                "pid": gpu + 1,
                "tid": gpu + 1,
                "args": {"GiB": round(value / _GIB, 9) + 0.0},
            }
        )

    other = {
        "title": title,
        "generator": "llm-cluster-sim sim.export",
        "num_gpus": timeline.num_gpus,
        "num_spans": len(timeline.spans),
        "num_flows": len(timeline.flows),
        "num_collectives": len(timeline.collectives),
        "end_us": _us(_to_ns(timeline.end_s, "timeline end")),
    }
    if kept is not None:
        other["gpus"] = kept
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _timed_events(
    timeline: Timeline,
    placed: dict[tuple[int, str], list[_Placed]],
    tid_of: dict[tuple[int, str, int], int],
) -> list[dict[str, Any]]:
    """Complete and flow events, ordered so that Perfetto binds every flow event right."""
    where: dict[int, _Placed] = {}
    track_of: dict[int, tuple[int, int]] = {}
    timed: list[_Timed] = []
    for (gpu, stream), group in placed.items():
        for rank, p in enumerate(group):
            where[p.index] = p
            track = (gpu + 1, tid_of[(gpu, stream, p.lane)])
            track_of[p.index] = track
            span = p.span
            event = {
                "name": span.name or span.kind,
                "cat": span.kind,
                "ph": "X",
                "ts": _us(p.start_ns),
                "dur": _us(p.end_ns - p.start_ns),
                "pid": track[0],
                "tid": track[1],
                "args": {
                    "stage": span.stage,
                    "mb": span.mb,
                    "kind": span.kind,
                    "stream": span.stream,
                },
            }
            timed.append(_Timed(p.start_ns, (0, track[1], rank), event, track, p.index))

    for flow_no, (flow, category) in enumerate(_arrows(timeline)):
        for role, index in (("send", flow.send), ("recv", flow.recv)):
            if not 0 <= index < len(timeline.spans):
                raise ValueError(
                    f"cannot export flow #{flow_no}: its {role} span index {index} is not in "
                    f"0..{len(timeline.spans) - 1}"
                )
        send, recv = where[flow.send], where[flow.recv]
        s_ns = send.start_ns
        f_ns = min(max(s_ns, recv.start_ns), recv.end_ns)
        name = send.span.name or send.span.kind
        for phase, ts_ns, index in (("s", s_ns, flow.send), ("f", f_ns, flow.recv)):
            track = track_of[index]
            event = {
                "name": name,
                "cat": category,
                "ph": phase,
                "id": flow_no + 1,
                "ts": _us(ts_ns),
                "pid": track[0],
                "tid": track[1],
            }
            if phase == "f":
                event["bp"] = "e"
            key = (1 if phase == "s" else 2, flow_no)
            timed.append(_Timed(ts_ns, key, event, track, index))

    timed.sort()
    out: list[dict[str, Any]] = []
    start = 0
    while start < len(timed):
        stop = start
        while stop < len(timed) and timed[stop].ts_ns == timed[start].ts_ns:
            stop += 1
        out.extend(t.event for t in _order_instant(timed[start:stop], where))
        start = stop
    return out


def _order_instant(group: list[_Timed], where: dict[int, _Placed]) -> list[_Timed]:
    """Order events of one timestamp so that each flow event binds to its own span.

    Must-precede edges: on each thread, complete events in (longest first) order;
    a complete event before the flow events bound to it, and those before the
    thread's next complete event; a flow event bound to a span that began earlier
    before every complete event starting now on its thread (which would hide
    it); a flow's start before its end. Kahn's algorithm, smallest key first; on
    a cycle (only possible for contrived timelines) the rest follows in key order.
    """
    if len(group) == 1:
        return group
    ts_ns = group[0].ts_ns
    after: list[list[int]] = [[] for _ in group]
    x_on_track: dict[tuple[int, int], list[int]] = {}
    x_of_span: dict[int, int] = {}
    for n, item in enumerate(group):  # group is sorted by key: X events by thread order
        if item.event["ph"] == "X":
            x_on_track.setdefault(item.track, []).append(n)
            x_of_span[item.span] = n
    for chain in x_on_track.values():
        for a, b in zip(chain, chain[1:], strict=False):
            after[a].append(b)
    starts: dict[int, int] = {}
    for n, item in enumerate(group):
        ph = item.event["ph"]
        if ph == "X":
            continue
        if ph == "s":
            starts[item.event["id"]] = n
        elif item.event["id"] in starts:
            after[starts[item.event["id"]]].append(n)
        chain = x_on_track.get(item.track, [])
        if where[item.span].start_ns == ts_ns and item.span in x_of_span:
            own = x_of_span[item.span]
            after[own].append(n)
            position = chain.index(own)
            if position + 1 < len(chain):
                after[n].append(chain[position + 1])
        elif chain:
            after[n].append(chain[0])
    indegree = [0] * len(group)
    for successors in after:
        for m in successors:
            indegree[m] += 1
    ready = [(group[n].key, n) for n in range(len(group)) if indegree[n] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for m in after[n]:
            indegree[m] -= 1
            if indegree[m] == 0:
                heapq.heappush(ready, (group[m].key, m))
    if len(order) < len(group):
        done = set(order)
        order.extend(n for n in range(len(group)) if n not in done)
    return [group[n] for n in order]


def dumps_trace(trace: dict[str, Any]) -> str:
    """Serialise a trace object deterministically: compact JSON, one event per line."""

    def compact(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    lines = ",\n".join(compact(event) for event in trace["traceEvents"])
    rest = "".join(
        f",\n{compact(key)}:{compact(value)}"
        for key, value in trace.items()
        if key != "traceEvents"
    )
    return f'{{"traceEvents":[\n{lines}\n]{rest}}}\n'


def write_chrome_trace(timeline: Timeline, path: str | Path, title: str = "",
                       gpus: Iterable[int] | None = None) -> None:
    """Write :func:`chrome_trace` of ``timeline`` (``gpus`` only, if given) to ``path``
    (see :func:`dumps_trace`), gzip-compressed if ``path`` ends in ``.gz``.

    The same timeline, title and GPUs always give byte-identical files. Parent
    directories are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps_trace(chrome_trace(timeline, title, gpus)).encode("utf-8")
    if path.suffix.lower() != ".gz":
        path.write_bytes(text)
        return
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                compresslevel=_GZIP_LEVEL) as packed:
        packed.write(text)


def load_trace(path: str | Path) -> Any:
    """The JSON object of a trace file, plain or gzip-compressed (told by its first bytes)."""
    data = Path(path).read_bytes()
    if data.startswith(_GZIP_MAGIC):
        data = gzip.decompress(data)
    return json.loads(data)


# ---------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _describe(n: int, event: Any) -> str:
    if isinstance(event, dict):
        return f"event #{n} (ph={event.get('ph')!r}, name={event.get('name')!r})"
    return f"event #{n}"


def check_trace(trace: Mapping[str, Any] | str | Path) -> list[str]:
    """Structural problems of a Chrome trace object, as sentences; empty means valid.

    ``trace`` is the object, or the path of a ``.json`` or ``.json.gz`` file
    (:func:`load_trace`).
    Checks that ``traceEvents`` is a list of objects with a known ``ph``; complete
    events have ``name``, ``ph``, ``ts``, ``dur >= 0``, ``pid`` and ``tid``;
    complete events of one (pid, tid) nest (any two are disjoint or one contains
    the other, within :data:`TOLERANCE_US`); flow events have ``id``, ``pid``,
    ``tid``, ``ts``; every flow start ``s`` has exactly one end ``f`` with the same
    ``id`` and vice versa, with equal ``cat`` and ``name``; read as Perfetto does
    (see :func:`flow_bindings`), each flow event binds to a slice on its thread
    and each start is read before its end (checked only once everything else
    passes); counters have numeric args; metadata events are
    ``process_*``/``thread_*`` with the argument they need.
    """
    if isinstance(trace, str | Path):
        trace = load_trace(trace)
    if not isinstance(trace, dict):
        return ["trace is not a JSON object"]
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["trace has no 'traceEvents' list"]
    problems: list[str] = []
    slices: dict[tuple[Any, Any], list[tuple[float, float, int]]] = {}
    flows: dict[str, dict[str, list[int]]] = {}
    for n, event in enumerate(events):
        where = _describe(n, event)
        if not isinstance(event, dict):
            problems.append(f"{where} is not a JSON object")
            continue
        ph = event.get("ph")
        if not isinstance(ph, str) or ph not in _KNOWN_PHASES:
            problems.append(f"{where} has unknown phase ph={ph!r}")
        elif ph == "X":
            if _check_complete(where, event, problems):
                ts = float(event["ts"])
                slices.setdefault((event["pid"], event["tid"]), []).append(
                    (ts, ts + float(event["dur"]), n)
                )
        elif ph in ("s", "f"):
            if _check_fields(where, event, ("name", "ph", "id", "ts", "pid", "tid"), problems):
                flows.setdefault(repr(event["id"]), {"s": [], "f": []})[ph].append(n)
        elif ph == "C":
            _check_counter(where, event, problems)
        elif ph == "M":
            _check_metadata(where, event, problems)
    for key in sorted(slices, key=repr):
        problems.extend(_nesting_problems(key, slices[key]))
    problems.extend(_pairing_problems(events, flows))
    if not problems:
        problems.extend(_binding_problems(events))
    return problems


def _check_fields(
    where: str, event: dict[str, Any], fields: Sequence[str], problems: list[str]
) -> bool:
    missing = [f for f in fields if f not in event]
    if missing:
        problems.append(f"{where} lacks field(s) {', '.join(missing)}")
        return False
    if "ts" in fields and not _is_number(event["ts"]):
        problems.append(f"{where} has a non-numeric or non-finite ts={event['ts']!r}")
        return False
    return True


def _check_complete(where: str, event: dict[str, Any], problems: list[str]) -> bool:
    if not _check_fields(where, event, ("name", "ph", "ts", "dur", "pid", "tid"), problems):
        return False
    dur = event["dur"]
    if not _is_number(dur):
        problems.append(f"{where} has a non-numeric or non-finite dur={dur!r}")
        return False
    if dur < 0:
        problems.append(f"{where} has negative dur={dur!r} at ts={event['ts']!r}")
        return False
    if not isinstance(event["name"], str):
        problems.append(f"{where} has a name that is not a string")
    return True


def _check_counter(where: str, event: dict[str, Any], problems: list[str]) -> None:
    if not _check_fields(where, event, ("name", "ph", "ts", "pid", "args"), problems):
        return
    args = event["args"]
    if not isinstance(args, dict) or not args:
        problems.append(f"{where} needs counter args as a non-empty object, got {args!r}")
        return
    bad = sorted(str(k) for k, v in args.items() if not _is_number(v))
    if bad:
        problems.append(f"{where} has non-numeric counter value(s) for {', '.join(bad)}")


def _check_metadata(where: str, event: dict[str, Any], problems: list[str]) -> None:
    name = event.get("name")
    if name not in _METADATA_ARG:
        problems.append(f"{where}: metadata name must be one of {sorted(_METADATA_ARG)}")
        return
    needed = ("name", "ph", "pid", "args") + (("tid",) if name.startswith("thread_") else ())
    if not _check_fields(where, event, needed, problems):
        return
    args, key = event["args"], _METADATA_ARG[name]
    if not isinstance(args, dict) or key not in args:
        problems.append(f"{where} needs args.{key}, got args={args!r}")
        return
    value = args[key]
    if key == "sort_index" and (not isinstance(value, int) or isinstance(value, bool)):
        problems.append(f"{where} needs an integer sort_index, got {value!r}")
    elif key != "sort_index" and not isinstance(value, str):
        problems.append(f"{where} needs a string {key}, got {value!r}")


def _nesting_problems(key: tuple[Any, Any], intervals: list[tuple[float, float, int]]) -> list[str]:
    """Partial overlaps among one thread's complete events (sweep with a stack)."""
    problems: list[str] = []
    stack: list[tuple[float, float, int]] = []
    for start, end, n in sorted(intervals, key=lambda i: (i[0], -i[1], i[2])):
        while stack and stack[-1][1] <= start + TOLERANCE_US:
            stack.pop()
        if stack and end > stack[-1][1] + TOLERANCE_US:
            top = stack[-1]
            problems.append(
                f"complete events #{top[2]} [{top[0]}, {top[1]}] and #{n} [{start}, {end}] "
                f"on pid {key[0]!r} tid {key[1]!r} overlap without nesting"
            )
            continue
        stack.append((start, end, n))
    return problems


def _pairing_problems(events: list[Any], flows: dict[str, dict[str, list[int]]]) -> list[str]:
    problems: list[str] = []
    for flow_id in sorted(flows):
        starts, ends = flows[flow_id]["s"], flows[flow_id]["f"]
        if len(starts) != 1 or len(ends) != 1:
            problems.append(
                f"flow id {flow_id} has {len(starts)} start(s) 's' and {len(ends)} end(s) 'f'; "
                "expected exactly one of each"
            )
            continue
        s, f = events[starts[0]], events[ends[0]]
        if (s.get("cat"), s["name"]) != (f.get("cat"), f["name"]):
            problems.append(
                f"flow id {flow_id}: start #{starts[0]} has cat/name {s.get('cat')!r}/"
                f"{s['name']!r} but end #{ends[0]} has {f.get('cat')!r}/{f['name']!r}, so "
                "Perfetto will not pair them"
            )
    return problems


def flow_bindings(trace: dict[str, Any]) -> dict[Any, tuple[int | None, int | None]]:
    """Which complete event each flow's start and end bind to, read the way Perfetto does.

    Returns ``{flow id: (index of the X event bound by 's', index bound by 'f')}``,
    ``None`` where nothing binds. Timed events are read in (ts, file order); an
    ``X`` event first closes the slices of its thread that ended by its start and
    then opens; ``s`` and ``f`` with ``bp: "e"`` bind to the innermost open slice
    of their thread, provided it encloses ``ts``; other ``f`` bind to the next
    slice that opens on their thread. An end read before its start binds nothing.
    Assumes the trace has no structural problems (run :func:`check_trace`).
    """
    timed = [
        (float(e["ts"]), n)
        for n, e in enumerate(trace["traceEvents"])
        if e.get("ph") in ("X", "s", "f")
    ]
    timed.sort()
    events = trace["traceEvents"]
    stacks: dict[tuple[Any, Any], list[tuple[float, int]]] = {}
    pending: dict[tuple[Any, Any], list[Any]] = {}
    bound: dict[Any, list[int | None]] = {}
    for ts, n in timed:
        event = events[n]
        track = (event["pid"], event["tid"])
        stack = stacks.setdefault(track, [])
        if event["ph"] == "X":
            while stack and stack[-1][0] <= ts + TOLERANCE_US:
                stack.pop()
            stack.append((ts + float(event["dur"]), n))
            for flow_id in pending.pop(track, []):
                bound[flow_id][1] = n
            continue
        flow_id = event["id"]
        if event["ph"] == "s":
            bound[flow_id] = [None, None]
        elif flow_id not in bound:
            continue  # an end read before its start: Perfetto drops it
        elif event.get("bp") != "e":
            pending.setdefault(track, []).append(flow_id)
            continue
        if stack:
            end, top = stack[-1]
            if float(events[top]["ts"]) - TOLERANCE_US <= ts <= end + TOLERANCE_US:
                bound[flow_id][0 if event["ph"] == "s" else 1] = top
    ids = sorted({e["id"] for e in events if e.get("ph") in ("s", "f")}, key=repr)
    return {
        flow_id: (bound[flow_id][0], bound[flow_id][1]) if flow_id in bound else (None, None)
        for flow_id in ids
    }


def _binding_problems(events: list[Any]) -> list[str]:
    problems: list[str] = []
    for flow_id, (send, recv) in flow_bindings({"traceEvents": events}).items():
        if send is None:
            problems.append(
                f"flow id {flow_id!r}: its start 's' binds to no slice (no complete event on "
                "its thread encloses its ts)"
            )
        if recv is None:
            problems.append(
                f"flow id {flow_id!r}: its end 'f' binds to no slice (none encloses its ts, "
                "or it is read before its start: put the end no earlier than the start)"
            )
    return problems
