"""The discrete-event engine: executes per-rank programs on a cluster. The only SimPy user.

Each (GPU, stream) runs its instructions in program order, like a CUDA
stream, each instruction once its dependencies have completed. Compute takes
its device-model time; sends and collectives become flows on the flow-level
network (:mod:`sim.network`), which shares link bandwidth max-min fairly and
adds each hop's latency. The engine never chooses order and never computes
statistics: it records a :class:`~sim.timeline.Timeline`.

How it runs (for speed; the semantics are those of one SimPy process per
stream): the program is a DAG whose edges are the instructions' ``deps`` and
stream order. Each instruction keeps a counter of unfinished predecessors;
when an instruction completes, its successors' counters drop and those at
zero start. Only things that take simulated time become SimPy events (a
compute op's end, a latency, a precomputed transfer, the network's next flow
end, one rate refresh per instant), so there is no process, no per-instruction
completion event and no condition event. The run records each instruction's
ready, compute-end and end times (arrays of doubles); the timeline's records are made
from them by :func:`sim.timeline.timeline_of`, in the reference at once, else when first
read (the statistics read :func:`sim.timeline.summaries_of` of the same times).

That event queue is the reference (SimPy's). The fast paths: the same events on the
run's own heap, ordered as SimPy orders timeouts (time, then scheduling order), without
SimPy's event objects; and a program whose every duration
is known up front and whose collectives have one member each (a collapsed one) runs
without the queue, as one pass on arrays (:mod:`sim.columnar`: the same times, plus the
latest predecessors, intervals and memory peaks the statistics read); its timeline's
records are made from those times by the same :func:`~sim.timeline.timeline_of`, when
first read (:meth:`Timeline.deferred`): a ``--json`` run never builds them.
``tests/test_differential.py`` checks the two against each other on random experiments.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from base.collector import gc_paused
from base.errors import DeadlockError
from sim.collectives import Transfer
from sim.columnar import ColumnarPass, run_columns
from sim.fastnet import FastFlowNetwork
from sim.lanes import lane_blocks
from sim.network import FlowNetwork
from sim.plans import CompiledPlan, PlanRun
from sim.rows import rows_stepper
from sim.selection import CollectivePlan, GroupProfile, collective_plan
from sim.timeline import FlowArrow, MemorySample, Span, Timeline, summaries_of, timeline_of
from topologies.cluster import Cluster, Endpoint, Route
from workloads.packed import (
    COLLECTIVE_ALGO,
    COLLECTIVE_DURATION_S,
    COLLECTIVE_GROUP,
    COLLECTIVE_KEY,
    COLLECTIVE_NBYTES,
    COLLECTIVE_OP,
    COLLECTIVE_SKEW,
    COMPUTE_BLOCKING_S,
    SEND_DURATION_S,
    PackedInstructions,
)
from workloads.program import (
    COLLECTIVE,
    COMPUTE,
    Collective,
    ColumnarInstructions,
    Compute,
    Instruction,
    Program,
    Send,
    columns_of,
)
from workloads.streams import StreamColumns, edges_of, stream_columns

if TYPE_CHECKING:
    import simpy

    from sim.commtime import CollectiveTimer

ComputeTimer = Callable[[Compute], float]


@dataclass
class EngineCounters:
    """What one run of the engine did; pass one to :func:`simulate_program` to fill it."""

    events: int = 0
    """SimPy events scheduled (and processed: a finished run leaves none pending); for a
    program run without the queue (:mod:`sim.columnar`), the events the queue would
    have processed."""
    instructions: int = 0
    flows: int = 0
    """Flows started on the network (sends and collective transfers)."""
    rate_recomputations: int = 0
    """Max-min recomputations (each over the component of flows a change touched)."""
    rerated_flows: int = 0
    """Flows re-rated, summed over recomputations."""
    bytes_on_link: dict[int, float] = field(default_factory=dict)
    """Bytes each link (index into ``cluster.links``) carried over the run; absent: none."""
    stepped: int = 0
    """Blocks of lanes completed in one step (:meth:`_Run._stepper`): how the own heap ran,
    not what it simulated (the rest is the same with none)."""
    rows: int = 0
    """Rows of such blocks completed in one step (:func:`sim.rows.rows_stepper`; their blocks
    counted in ``stepped`` too): likewise how it ran."""


@dataclass
class InstructionTimes:
    """When each instruction ran, indexed by instruction id; pass one to
    :func:`simulate_program` to fill it (read by :mod:`sim.idle`). Lists, but arrays of
    doubles (``array("d")``, the same floats) from a run on the engine's own heap."""

    ready_s: Sequence[float] = field(default_factory=list)
    """When its last predecessor (dependency or stream predecessor) completed: a compute op or
    send starts then; a collective member arrives then (the collective starts at the last
    member's arrival, plus the launch latency)."""
    end_s: Sequence[float] = field(default_factory=list)
    """When it completed."""
    mid_s: Sequence[float] = ()
    """Where a compute op's compute ended and its blocking communication began (see
    :func:`sim.timeline.timeline_of`)."""
    intervals: dict[tuple[int, str], array[float]] | None = None
    """The spans' intervals as :mod:`sim.stats` reads them (:data:`sim.stats.Intervals`): per
    ``(GPU, "compute")`` its compute stream's, per ``(GPU, kind)`` those of each
    communication kind, as flat ``[start, end, ...]`` lists, where the queue-free pass
    (:mod:`sim.columnar`) or a run on the own heap (:func:`sim.timeline.summaries_of`) worked
    them out without making the spans; None in the reference (the statistics read them from
    the spans)."""
    cause: Sequence[int] = field(default_factory=list)
    """Its latest-finishing predecessor (-1: none), as :mod:`sim.idle` follows chains: the
    stream predecessor, unless a dependency ended strictly later (the first such of the
    latest); every member of a collective takes that of the member that arrived last (the
    lowest id among equals). Recorded by the queue-free pass (:mod:`sim.columnar`, an
    ``array("q")``); empty otherwise."""
    arrays: tuple | None = None
    """``(ready_s, end_s)`` as float arrays, where the engine worked them out on arrays (the
    columnar pass, :mod:`sim.columnar`): what :func:`sim.idle.idle_breakdown` reads
    without converting the lists; None otherwise."""


def _stream_of(ins: Instruction) -> object:
    """The stream an instruction runs in order on, behind the previous one of that stream:
    a GPU's compute stream, its send stream to each destination, its collective stream of
    each kind. The one rule both DAG builders (:func:`_dag_on_arrays`,
    :meth:`_Run._build_dag`) apply."""
    cls = type(ins)
    return (ins.gpu if cls is Compute else
            (ins.gpu, ins.dst) if cls is Send else (ins.gpu, ins.kind))


def _predecessors(instrs: Sequence[Instruction]) -> tuple[array[int], array[int], array[int]]:
    """Per instruction its stream predecessor (-1: none; the instruction before it on its
    stream, :func:`_stream_of`) and its number of deps, and every instruction's deps in
    order, flat: one loop over the instructions, what both DAG builders start from."""
    n = len(instrs)
    before = array("q", [-1]) * n
    ndeps = array("q", bytes(8 * n))
    flat = array("q")
    last_in: dict[object, int] = {}  # per stream
    for ins in instrs:
        i, deps = ins.id, ins.deps
        key = _stream_of(ins)
        prev = last_in.get(key)
        if prev is not None:
            before[i] = prev
        last_in[key] = i
        if deps:
            ndeps[i] = len(deps)
            flat.extend(deps)
    return before, ndeps, flat


def _dag_on_arrays(instrs: Sequence[Instruction]) -> tuple[array[int], array[int], array[int]]:
    """:meth:`_Run._build_dag`'s ``succ`` (4-byte ids here), ``first`` and ``waiting`` from
    each instruction's stream predecessor and deps, read as columns
    (:func:`workloads.streams.stream_columns`, else from the loop :func:`_predecessors`): the
    edges in the order that loop meets them (per instruction its stream edge, then its deps),
    sorted stably by predecessor, are the successor lists in the order the reference fills
    them."""
    n = len(instrs)
    if isinstance(instrs, PackedInstructions):  # the same arrays with smaller temporaries
        from sim.packedpass import dag

        return dag(instrs)
    columns = stream_columns(instrs)
    if columns is None:
        columns = StreamColumns(*(np.frombuffer(values, dtype=np.int64)
                                  for values in _predecessors(instrs)))
    pred, edges, _ = edges_of(columns)
    del columns
    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pred, minlength=n), out=first[1:])
    order = np.argsort(pred, kind="stable")
    del pred  # the temporaries one at a time: their peak is the run's on a large program
    succ = np.repeat(np.arange(n, dtype=np.int32), edges)[order]  # ids fit: < 2**31
    del order
    out = array("i"), array("q"), array("i")
    for into, values in zip(out, (succ, first, edges.astype(np.int32)), strict=True):
        into.frombytes(memoryview(values).cast("B"))  # no copy in between
    return out


class _Run:
    """State of one simulation; discarded after :func:`simulate_program` returns."""

    stepping = True
    """Whether blocks of lanes may complete in one step (:meth:`_stepper`) on the own heap;
    False: one by one, its reference (``tests/test_lanes.py`` runs both)."""
    rows = True
    """Whether the DP replicas' blocks of lanes in one heap entry may complete as one
    two-dimensional block (:func:`sim.rows.rows_stepper`) while ``stepping``; False: block by
    block, its reference (``tests/test_rows.py`` runs both)."""

    sends = True
    """Whether a packed program's pipeline sends are batched on the own heap: a send's flow
    start after its route's latency shares the heap entry of the send scheduled just before
    it for the same instant (:meth:`_after_own`, the same event numbers; :meth:`_send_flows`
    starts them in turn), and sends whose flows end at one wake-up complete in one list with
    the collectives' members beside them (:meth:`_finished_flows`). The same events, flows and
    order as one by one; False: one by one, its reference (``tests/test_sends.py``)."""

    share_plans = True
    """Whether a packed collective's new plan may be an earlier group's of its class,
    relabelled, while no link has failed (:meth:`_plan_for`); False: every group planned by
    :func:`~sim.selection.collective_plan`, its reference (``tests/test_plan_classes.py``)."""

    memo_work = True
    """Whether a packed compute op's (duration, total) is kept per its template's ``rest``
    value where the timer reads only the work (:meth:`_compute_times`); False: per template,
    each template's op timed by the timer, its reference (``tests/test_work_memo.py``)."""

    def __init__(self, program: Program, cluster: Cluster, timer: ComputeTimer,
                 reference: bool = False) -> None:
        self.env: simpy.Environment | None = None
        """The reference's event queue; None: the run's own heap (:meth:`_after`)."""
        if reference:
            import simpy  # the reference alone runs on SimPy: imported when it runs

            self.env = simpy.Environment()
        self.now = 0.0
        """The simulated time: that of the event being processed."""
        self.heap: list[tuple[float, int, Callable[[object], None], object]] = []
        """The own queue's pending events: (time, sequence number, callback, value)."""
        self.program = program
        self.cluster = cluster
        self.timer = timer
        self.net = (FlowNetwork if reference else FastFlowNetwork)(cluster.link_bandwidth_Bps)
        """The flow network: the reference's on SimPy's queue, its fast path
        (:class:`sim.fastnet.FastFlowNetwork`, the same rates) on the own heap."""
        self.bundling = not reference
        """Whether a flat collective plan's transfers may start as one bundle of flows
        (:meth:`_bundle_start`): on the own heap, while no link changes."""
        self._finish_due = (self.net.finish_due if reference
                            else self.net.finish_due_items)  # type: ignore[attr-defined]
        """What a wake-up finishes: flows by id, a bundle as its first flow (one completion)."""
        if not reference:
            self.net.on_split = self._unbundled  # type: ignore[attr-defined]
        self.route: Callable[[Endpoint, Endpoint], Route] = cluster.route
        """Routes as link indices into ``cluster.links`` (those of
        :class:`~topologies.cluster.Rerouted` after a link failure)."""
        self.topology = cluster
        """The cluster collectives are planned on (``cluster`` without its failed links
        after a failure)."""
        self.epoch = 0
        """Routing epoch: how many times links failed in the middle of the run."""
        self.failed: set[int] = set()
        self.flow_ends: dict[int, tuple[Endpoint, Endpoint]] | None = None
        """Each active flow's (src, dst), kept only when links fail during the run."""
        self.events = 0
        self.flows = 0
        self.intervals: dict[tuple[int, str], array[float]] | None = None
        """See :attr:`InstructionTimes.intervals` (filled by :meth:`_deferred` and
        :meth:`_summarized`)."""
        self.cause: Sequence[int] = []
        """See :attr:`InstructionTimes.cause` (filled by :meth:`_deferred` only)."""
        self.arrays: tuple | None = None
        """See :attr:`InstructionTimes.arrays` (filled by :meth:`_deferred` only)."""
        self.flow_done: dict[int, tuple[Callable[[int], None], int]] = {}
        """Per active flow, what its arrival calls: ``(callback, argument)``."""
        self.wake_version = 0
        self.wake_at = -1.0
        self.refresh_pending = False
        self._plans: dict[tuple, CollectivePlan] = {}
        self._merged: dict[tuple[int, ...], tuple[list, tuple]] = {}
        """Per plans' routes in turn (their ids), those routes and their concatenation: the
        routes of one bundle of several plans' flows (:meth:`_merged_routes`)."""
        self._profiles: dict[tuple[int, ...], GroupProfile] = {}  # per group, see collective_plan
        self._timers: dict[tuple, CollectiveTimer] = {}
        """Per (algorithm, skew), the planner whose plans :meth:`_plan_for` shares by class."""
        self._compiled: dict[int, CompiledPlan] = {}
        self._by_rest: dict[tuple, tuple[float, float]] = {}
        """A compute template's ``rest`` -> its (duration, total) (:meth:`_compute_times`)."""
        """Per plan (by identity; plans live in ``_plans``), what running it needs."""
        self.members: dict[int, list[int]] = {}
        """Collectives in progress: key -> the members arrived."""
        self.gpus = (tuple(range(program.num_gpus)) if program.simulated_gpus is None
                     else program.simulated_gpus)
        # per instruction, the times the timeline's records are made from (timeline_of),
        # made when the run takes the event queue (:meth:`_zero_times`); the queue-free pass
        # hands over its own (:meth:`_deferred`)
        self.started: list[float] | array[float] = []
        """When it became ready (its last predecessor completed)."""
        self.mid: list[float] | array[float] = []
        """A compute op's start + compute duration (its blocking communication follows)."""
        self.ended: list[float] | array[float] = []
        self.completed = 0
        self.ready: deque[int] = deque()
        self.draining = False
        self.batch: list[int] | None = None
        """The compute ops whose ends the latest heap entry holds, while it is the latest
        event scheduled and not yet popped (:meth:`_loop`); ``batch_seq``: the event's number
        of the last one of them, ``batch_at`` their end."""
        self.batch_seq = -1
        self.batch_at = -1.0
        self.calls: tuple[Callable[[object], None], list] | None = None
        """Likewise for the collectives' launches and bundle starts (:meth:`_after_own`): the
        latest heap entry's callback and its values, while it is the latest event scheduled
        and not yet popped; ``calls_seq`` and ``calls_at`` as ``batch_seq`` and ``batch_at``."""
        self.calls_seq = -1
        self.calls_at = -1.0
        self._tables: tuple | None = None
        """Per template of a packed program, what :meth:`_start_ready` reads
        (:meth:`_packed_tables`); made at the first start."""
        instrs = program.instructions
        by_work = bool(getattr(timer, "by_work", False))
        self.packed: tuple = ((instrs.templates, instrs.tpl, by_work,
                               [None] * len(instrs.templates))
                              if isinstance(instrs, PackedInstructions) else (None,) * 4)
        """A packed program's (templates, template per instruction, ``by_work``, durations):
        ``by_work``, whether ``timer`` reads only a compute op's fields after its deps (its
        work, as :meth:`workloads.program.ProgramBuilder.work` holds them), its ops of one
        template then timed once (the durations, per template); (None,) * 4: not packed."""
        self.lanes = bytearray(len(instrs))
        """Per instruction of a packed program, ``L`` where a block of ``L`` lanes begins there
        (:func:`sim.lanes.lane_blocks`), else 0; made with the DAG."""
        self.stepped = 0
        self.rowed = 0
        """Rows of blocks completed in one step (:func:`sim.rows.rows_stepper`)."""
        """Blocks of lanes completed in one step (:meth:`_stepper`)."""
        if self.env is None and self.packed[0] is not None:  # the own heap's fast path
            self._release = self._release_packed  # type: ignore[method-assign]

    def _zero_times(self) -> None:
        """Every instruction's ready, mid and end time, 0 until the event queue sets them: on
        the own heap arrays of doubles (8 bytes each, not a float object and a pointer), in
        the reference lists. Made only for a run on the queue: the queue-free pass
        (:func:`sim.columnar.run_columns`) computes its own, and three such arrays of
        Megatron 1T's 391,424 instructions (9 MB, their pages faulted in by the copies)
        were ~5 ms of its ``sim run`` for nothing."""
        n = len(self.program.instructions)
        zeros = [0.0] * n if self.env is not None else array("d", bytes(8 * n))
        self.started, self.mid, self.ended = zeros, zeros[:], zeros[:]

    def _build_dag(self, program: Program) -> None:
        """Successor lists and unfinished-predecessor counters (deps + stream order).

        The successors are held compressed (CSR): instruction ``i``'s are
        ``succ[first[i]:first[i + 1]]``, in the order the instructions naming them come
        (a stream successor before the same instruction as a dependent): 8 bytes an edge
        and an instruction, where a list per instruction took about 90 bytes. Both start
        from one loop over the instructions (:func:`_predecessors`); the reference then fills
        the lists in two more, the fast path sorts the edges on arrays
        (:func:`_dag_on_arrays`, the same arrays)."""
        if self.env is None:
            self.succ, self.first, self.waiting = _dag_on_arrays(program.instructions)
            self.finished = bytearray(len(program.instructions))
            self.completed = 0
            if self.packed[0] is not None and self.stepping:
                self.lanes = lane_blocks(self.packed[1], self.succ, self.first)
            return
        instrs = program.instructions
        n = len(instrs)
        before = _predecessors(instrs)[0]  # the stream predecessor, -1: none
        count = array("q", bytes(8 * (n + 1)))  # successors of each instruction, shifted by one
        for ins in instrs:
            prev = before[ins.id]
            if prev >= 0:
                count[prev + 1] += 1
            for d in ins.deps:
                count[d + 1] += 1
        first = array("q", accumulate(count))
        fill = first[:n]  # the next free slot of each instruction's successors
        succ = array("q", bytes(8 * first[n]))
        waiting = array("i", bytes(4 * n))
        for ins in instrs:
            i, deps = ins.id, ins.deps
            prev = before[i]
            if prev >= 0:
                succ[fill[prev]] = i
                fill[prev] += 1
            waiting[i] = len(deps) + (prev >= 0)
            for d in deps:
                succ[fill[d]] = i
                fill[d] += 1
        self.waiting = waiting
        self.succ, self.first = succ, first
        self.finished = bytearray(n)
        self.completed = 0

    # ------------------------------------------------------------------ scheduling

    def _after(self, delay: float, callback: Callable[[object], None],
               value: object = None) -> None:
        """Run ``callback(value)`` ``delay`` seconds from now: one event, on the run's own heap
        ordered as SimPy orders timeouts (time, then scheduling order), or, in the reference,
        one SimPy timeout."""
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        self.events += 1
        if self.env is None:
            heappush(self.heap, (self.now + delay, self.events, callback, value))
        else:
            self.env.timeout(delay, value).callbacks.append(
                lambda event: self._fire(event, callback))

    def _fire(self, event: simpy.Event, callback: Callable[[object], None]) -> None:
        """A SimPy timeout of the reference is due: its callback at its time."""
        self.now = self.env.now  # type: ignore[union-attr]
        callback(event.value)

    def _loop(self) -> None:
        """Process the own heap's events in order until none is left (SimPy's ``run()``).

        Compute ops' ends (the commonest events, pushed with the function :meth:`_complete`
        as their mark, not bound to the run: :meth:`_drain`) complete here, a heap entry at a
        time (:meth:`_release`): those pushed one after another for the same instant share
        one entry (a list of ids), which holds the places in SimPy's order of that many
        events in a row (nothing can come between them), and completes them in that
        order."""
        heap, complete, release, each = self.heap, _Run._complete, self._release, _Run._each
        launched, launched_all = self._launched_own, self._launched_all
        started, started_all = self._bundle_start, self._bundle_start_all
        ended, members = self._end_collective, self.members
        send_flow, send_flows = self._sends_due, self._send_flows
        grouped = self.rows and self.stepping  # collectives ending in a row: one list
        while heap:
            at, _, callback, value = heappop(heap)
            self.now = at
            if callback is complete:
                if value is self.batch:
                    self.batch = None  # popped: later ends at this instant start a new entry
                release(value)
            elif callback is each:  # several events of one callback in a row (_after_own)
                if value is self.calls:
                    self.calls = None
                callback, values = value
                if callback == launched:
                    launched_all(values)
                elif callback == started:
                    started_all(values)
                elif callback == send_flow:
                    send_flows(values)
                elif callback == ended and grouped and len(values) > 1:
                    ids = members.pop(values[0])  # as _finished_flows: their members
                    for key in values[1:]:  # released as one list (the DP replicas'
                        ids += members.pop(key)  # blocks, now in one list, as rows)
                    release(ids)
                else:
                    for value in values:
                        callback(value)
            else:
                callback(value)

    def _each(self, value: object) -> None:
        """The mark of a heap entry of several events of one callback (:meth:`_after_own`)."""
        raise AssertionError("handled by _loop")

    def _after_own(self, delay: float, callback: Callable[[object], None],
                   value: object) -> None:
        """:meth:`_after` on the own heap (``delay`` >= 0), an event that follows the latest
        one scheduled, for the same instant and callback, sharing its heap entry (as compute
        ends do, :meth:`_loop`): those events are processed one after another, in the order
        they were scheduled, nothing between them (no other event has a place among theirs:
        their numbers are consecutive, and one scheduled while they run comes after them)."""
        at = self.now + delay
        events = self.events
        calls = self.calls
        if (calls is not None and self.calls_seq == events and self.calls_at == at
                and calls[0] == callback):
            calls[1].append(value)
        else:
            self.calls = calls = (callback, [value])
            self.calls_at = at
            heappush(self.heap, (at, events + 1, _Run._each, calls))
        self.events = self.calls_seq = events + 1

    def _after_own_all(self, delay: float, callback: Callable[[object], None],
                       values: list) -> None:
        """:meth:`_after_own` of each of ``values`` in turn (consecutive events of one instant
        and callback: the first may start a heap entry, the others join it), in one call."""
        at = self.now + delay
        events = self.events
        calls = self.calls
        if (calls is not None and self.calls_seq == events and self.calls_at == at
                and calls[0] == callback):
            calls[1].extend(values)
        else:
            self.calls = calls = (callback, values)
            self.calls_at = at
            heappush(self.heap, (at, events + 1, _Run._each, calls))
        self.events = self.calls_seq = events + len(values)

    def _complete(self, i: int) -> None:
        """Instruction ``i`` is done: release its successors; start those now free."""
        self._release((i,))

    def _release(self, ids: list[int] | tuple[int, ...]) -> None:
        """Instructions ``ids`` are done, now, in this order: each releases its successors,
        and those it frees start before the next completes (as SimPy runs that many
        completions in a row). The one completion step of :meth:`_complete`, a heap entry
        of compute ends (:meth:`_loop`) and a collective's members
        (:meth:`_finish_collective`)."""
        finished, ended, waiting, ready = self.finished, self.ended, self.waiting, self.ready
        succ, first, now = self.succ, self.first, self.now
        for i in ids:
            finished[i] = 1
            ended[i] = now
            for j in succ[first[i]:first[i + 1]]:
                left = waiting[j] - 1
                waiting[j] = left
                if not left:
                    ready.append(j)
            if ready and not self.draining:
                self._drain()
        self.completed += len(ids)

    def _release_packed(self, ids: list[int] | tuple[int, ...]) -> None:
        """:meth:`_release` and :meth:`_drain` in one, for a packed program on the own heap:
        the same completions and starts in the same order (each completion's successors
        released, then every instruction ready started before the next completes; nested
        completions while starting, as a zero-time op's, only release), with the drain's
        state set up once per call instead of once per completion, and an instruction's
        class, compute time and collective fields read from per-template tables instead of
        its template tuple each time (its object made only for a send, or for a timer that
        reads more than the work). The reference is :meth:`_release` with :meth:`_drain`
        (SimPy's queue, and a plain program on the own heap): ``tests/test_packed.py`` and
        ``tests/test_differential.py`` run both."""
        if self.draining:  # a completion while starting (zero-time): release only, which
            _Run._release(self, ids)  # is what the reference does while draining
            return
        self.draining = True
        self._start_ready(ids)
        self.draining = False
        self.completed += len(ids)

    def _start_ready(self, ids: Sequence[int]) -> None:
        """:meth:`_release_packed`'s loop: complete ``ids`` in turn, each followed by starting
        every instruction then ready (the drain, :meth:`_drain`'s packed branch); a block of
        lanes (:mod:`sim.lanes`) in a row in ``ids`` completes in one step where it can
        (:meth:`_stepper`), with the same effects."""
        state = self._tables
        if state is None:
            state = self._tables = self._packed_tables()
        (finished, ended, waiting, ready, succ, first, instrs, members, started, mid, timer,
         heap, code, timed, templates, by_work, tpl, lanes, stepped, rows) = state
        now = self.now
        key_at, group_at = COLLECTIVE_KEY, COLLECTIVE_GROUP
        popleft, append = ready.popleft, ready.append
        count = len(ids)
        p = 0
        flat = rows is None or count < 4  # no rows of blocks to try (any more)
        while p < count:
            i = ids[p]
            size = lanes[i]
            done = 0
            if size and not flat and count - p >= 2 * size:
                done = rows(ids, p, i, size, now)
                flat = not done  # once not: block by block for the rest of ids
            if done:
                p += done  # the rows' blocks completed and their successors started
            elif size and ids[p:p + size] == list(range(i, i + size)) and stepped(i, size, now):
                p += size  # the block's lanes completed and their successors started
            else:
                p += 1
                finished[i] = 1
                ended[i] = now
                for j in succ[first[i]:first[i + 1]]:
                    left = waiting[j] - 1
                    waiting[j] = left
                    if not left:
                        append(j)
            while ready:
                i = popleft()
                t = tpl[i]
                c = code[t]
                if c == COMPUTE:
                    pair = timed[t] if by_work else None  # once per template
                    if pair is None:
                        pair = self._compute_times(i, t)
                        if by_work:
                            timed[t] = pair
                    duration, total = pair
                    started[i] = now
                    mid[i] = now + duration
                    if not total > 0:  # ends now: _complete's release, inline (while
                        finished[i] = 1  # draining, a completion only releases)
                        ended[i] = now
                        for j in succ[first[i]:first[i + 1]]:
                            left = waiting[j] - 1
                            waiting[j] = left
                            if not left:
                                append(j)
                        self.completed += 1
                        continue
                    at = now + total  # _after on the own heap, inline
                    batch = self.batch
                    events = self.events
                    if batch is not None and self.batch_seq == events and self.batch_at == at:
                        batch.append(i)  # the next event in SimPy's order: the same entry
                    else:
                        self.batch = batch = [i]
                        self.batch_at = at
                        heappush(heap, (at, events + 1, _Run._complete, batch))  # _loop
                    self.events = self.batch_seq = events + 1
                elif c == COLLECTIVE:  # a member arrives (without the object)
                    started[i] = now
                    rest = templates[t][2]
                    key = rest[key_at]
                    arrived = members.get(key)
                    if arrived is None:
                        members[key] = arrived = [i]
                    else:
                        arrived.append(i)
                    if len(arrived) >= len(rest[group_at]):
                        self._arrived_packed(rest, key)
                elif self.sends:
                    self._start_send_packed(i, t)
                else:
                    self._start_send(i, instrs._make(i))

    def _packed_tables(self) -> tuple:
        """What :meth:`_start_ready` reads, bound once per run: the run's arrays and, per
        template of a packed program, its class code and a compute op's (duration, duration
        + blocking communication) once timed (where ``by_work``): 9 bytes a template (a
        collective's members share one; a large run has millions); and the step of a block
        of lanes (:meth:`_stepper`)."""
        templates, tpl, by_work, _ = self.packed
        code = self.program.instructions.classes().tobytes()  # CLASS_CODE of each (0-2)
        timed: list[tuple[float, float] | None] = [None] * len(templates)
        return (self.finished, self.ended, self.waiting, self.ready, self.succ, self.first,
                self.program.instructions, self.members, self.started, self.mid, self.timer,
                self.heap, code, timed, templates, by_work, tpl, self.lanes,
                self._stepper(code, timed),
                rows_stepper(self, code, timed) if self.rows and self.stepping else None)

    def _stepper(self, code: bytes, timed: list) -> Callable[[int, int, float], bool]:
        """``step(b, size, now)``: complete lanes ``b`` ... ``b + size - 1`` (a block of
        :func:`sim.lanes.lane_blocks`: each lane's successors are lane 0's shifted by its
        place) in one step, with what completing them one after another, each followed by
        starting what it freed (:meth:`_start_ready`), does: the same counters, times,
        members, heap entry and event numbers. Only where that is provably so: every
        successor block's counters equal across lanes (so each lane frees the same places),
        at most one of them freed, and that one a compute op of positive time timed by its
        work alone (the same start, duration and end on each lane, its ends the next events
        of one heap entry), or a collective's members whose last arrival is the block's last
        lane. False, with nothing done: complete them one by one. The run's arrays are bound
        once (a closure)."""
        succ, waiting, first, finished = self.succ, self.waiting, self.first, self.finished
        ended, started, mid, members, heap = self.ended, self.started, self.mid, self.members, \
            self.heap
        templates, tpl, by_work, _ = self.packed
        arrived_packed = self._arrived_packed
        fills: dict[int, list[array[int]]] = {}  # per size, per counter: size copies of it
        ones = {size: b"\x01" * size for size in range(1, 256)}
        stamps: dict[int, array[float]] = {}  # per size, size copies of the time stamped
        stamped = [-1.0]  # that time
        run = self

        def step(b: int, size: int, now: float) -> bool:
            heads = succ[first[b]:first[b + 1]]
            fill = fills.get(size)
            if fill is None:
                fill = fills[size] = [array("i", [w]) * size for w in range(8)]
            freed = -1
            for s in heads:
                w = waiting[s]
                if not 0 < w < 8 or waiting[s:s + size] != fill[w]:
                    return False
                if w == 1:
                    if freed >= 0:
                        return False  # two freed per lane: their starts interleave
                    freed = s
            if freed >= 0:
                t = tpl[freed]
                c = code[t]
                if c == COMPUTE:
                    if not by_work:
                        return False  # the timer reads the GPU: lanes may differ
                    pair = timed[t]
                    if pair is None:
                        pair = timed[t] = run._compute_times(freed, t)
                    duration, total = pair
                    if not total > 0:
                        return False
                elif c == COLLECTIVE:
                    rest = templates[t][2]
                    key = rest[COLLECTIVE_KEY]
                    arrived = members.get(key)
                    need = len(rest[COLLECTIVE_GROUP])
                    if (len(arrived) if arrived is not None else 0) + size - 1 >= need:
                        return False  # it would start before the block's last lane
                else:
                    return False
            run.stepped += 1
            end = b + size
            finished[b:end] = ones[size]
            if stamped[0] != now:
                stamps.clear()
                stamped[0] = now
            stamp = stamps.get(size)
            if stamp is None:
                stamp = stamps[size] = array("d", [now]) * size
            ended[b:end] = stamp
            for s in heads:
                waiting[s:s + size] = fill[waiting[s] - 1]
            if freed < 0:
                return True
            end = freed + size
            started[freed:end] = stamp
            if c == COMPUTE:
                mid[freed:end] = array("d", [now + duration]) * size
                at = now + total  # _start_ready's heap entry, for the lanes in turn
                batch, events = run.batch, run.events
                if batch is not None and run.batch_seq == events and run.batch_at == at:
                    batch.extend(range(freed, end))
                else:
                    run.batch = batch = list(range(freed, end))
                    run.batch_at = at
                    heappush(heap, (at, events + 1, _Run._complete, batch))
                run.events = run.batch_seq = events + size
            else:
                if arrived is None:
                    members[key] = arrived = list(range(freed, end))
                else:
                    arrived.extend(range(freed, end))
                if len(arrived) >= need:
                    arrived_packed(rest, key)
            return True

        return step

    def _arrived_packed(self, rest: tuple, key: int) -> None:
        """:meth:`_arrived` for a packed program's collective, from its template's ``rest``."""
        duration = rest[COLLECTIVE_DURATION_S]
        if duration is not None:  # precomputed (collapsed simulation, a fixed exposed time)
            if duration >= 0:  # the DP replicas' ends at one instant share a heap entry
                self._after_own(duration, self._end_collective, key)
            else:
                self._after(duration, self._end_collective, key)  # (its error)
            return
        plan = self._plan_for(rest)
        if plan.launch_s > 0:
            self._after_own(plan.launch_s, self._launched_own, (key, plan))
        else:
            self._launched_own((key, plan))

    def _compute_times(self, i: int, t: int) -> tuple[float, float]:
        """Packed compute instruction ``i``'s (duration, total): its compute time (the
        timer's) and that plus its blocking communication (its template ``t``'s). Where
        ``by_work`` both are functions of the template's ``rest`` (the fields after the deps)
        alone, kept per ``rest`` value (``_by_rest``): a full program's op copies of one work
        have templates of their own (their names differ: the micro-batch) but equal
        ``rest`` (GPT-3 175B on 4,096 GPUs: 239,648 compute templates, 1,043 distinct), so
        the op is made and timed once per work, not once per template. The timer keys its
        own memo on fields of ``rest`` by equality too (:func:`sim.api.work_timer`)."""
        rest = self.packed[0][t][2]
        if not (self.packed[2] and self.memo_work):
            duration = self.timer(self.program.instructions._make(i))
            return duration, duration + rest[COMPUTE_BLOCKING_S]
        by_rest = self._by_rest
        try:
            pair = by_rest.get(rest)
        except TypeError:  # an unhashable field: timed alone
            duration = self.timer(self.program.instructions._make(i))
            return duration, duration + rest[COMPUTE_BLOCKING_S]
        if pair is None:
            duration = self.timer(self.program.instructions._make(i))
            pair = by_rest[rest] = (duration, duration + rest[COMPUTE_BLOCKING_S])
        return pair

    def _plan_for(self, rest: tuple) -> CollectivePlan:
        """The plan of a packed collective, from its template's ``rest`` (kept per spec in
        ``_plans``: the same plan whenever it is asked for; not per template, which is one
        collective's alone, its key among its fields). A new spec's plan is, where
        ``share_plans`` and no link has failed, that of an earlier group of its class
        relabelled (:meth:`sim.commtime.CollectiveTimer.plans`, one timer per algorithm and
        skew: the same plan as :func:`~sim.selection.collective_plan`'s, by the argument
        there, held to it by ``tests/test_commtime_classes.py``); at 4,096 GPUs the 512 TP
        groups of a size are one class."""
        spec = (rest[COLLECTIVE_OP], rest[COLLECTIVE_ALGO], rest[COLLECTIVE_GROUP],
                rest[COLLECTIVE_NBYTES], rest[COLLECTIVE_SKEW])
        plan = self._plans.get(spec)
        if plan is None:
            if self.share_plans and self.topology is self.cluster:
                how = (spec[1], spec[4])
                timer = self._timers.get(how)
                if timer is None:
                    from sim.commtime import CollectiveTimer  # (it imports this module)

                    timer = self._timers[how] = CollectiveTimer(self.cluster, *how)
                plan = timer.plans(spec[0], [spec[2]], spec[3])[0]
            else:
                plan = collective_plan(self.topology, *spec[:4], self._profiles, spec[4])
            self._plans[spec] = plan
        return plan

    def _launched_own(self, value: tuple[int, CollectivePlan]) -> None:
        """:meth:`_launched` on the own heap: a flat plan (:attr:`CompiledPlan.flat`: every
        transfer starts together after one delay, none depending on another, each of the
        same bytes over a route) schedules the start of its transfers as :class:`PlanRun`
        would (one event, after the delay), without the run's object, and they start as
        one bundle of flows where their timing is provably that of one flow
        (:meth:`_bundle_start`); any other plan runs as in :meth:`_launched`."""
        key, plan = value
        steps = plan.transfers
        if not steps:
            self._finish_collective(key)
            return
        compiled = self._compiled.get(id(steps))
        if compiled is None:
            compiled = self._compiled[id(steps)] = CompiledPlan(self.topology, steps,
                                                                 self.route, self.epoch)
        if compiled.flat and self.bundling:
            self._after_own(compiled.later[0][0], self._bundle_start, (compiled, key))
        else:
            PlanRun(self, compiled, self._finish_collective, key).begin()

    def _bundle_start(self, value: tuple[CompiledPlan, int]) -> None:
        """A flat plan's delay has passed: its transfers start, as one bundle of flows
        (:meth:`sim.fastnet.FastFlowNetwork.start_bundle`) whose one completion ends the
        collective (the last of their arrivals one by one would: none releases a transfer,
        and no other flow's id lies among theirs), or else one by one
        (:meth:`PlanRun._delayed`). The same flows (ids, bytes, rates, ends) either way."""
        compiled, key = value
        group = compiled.later[0][1]
        routes = compiled.routes
        if routes is None:
            routes = compiled.routes = tuple([compiled.links[k] for k in group])
        fid = self.flows
        if self.bundling and self.net.start_bundle(  # type: ignore[attr-defined]
                self.now, fid, routes, compiled.nbytes[0]):
            self.flows = fid + len(group)
            self.flow_done[fid] = (self._bundle_done, value)
            if not self.refresh_pending:
                self.refresh_pending = True
                self._after(0, self._refresh)
        else:
            PlanRun(self, compiled, self._finish_collective, key)._delayed(group)

    def _launched_all(self, values: list[tuple[int, CollectivePlan]]) -> None:
        """:meth:`_launched_own` of each value in turn (a heap entry's launches), the run's
        look-ups bound once and a flat plan's start scheduled by :meth:`_after_own`: the same
        calls, in the same order."""
        compiled_of, start, after_all = self._compiled, self._bundle_start, self._after_own_all
        pending: list[tuple[CompiledPlan, int]] = []  # consecutive starts after one delay
        delay = 0.0
        for value in values:
            key, plan = value
            steps = plan.transfers
            compiled = compiled_of.get(id(steps)) if steps else None
            if compiled is None or not compiled.flat or not self.bundling:
                if pending:
                    after_all(delay, start, pending)
                    pending = []
                self._launched_own(value)
                continue
            later = compiled.later[0][0]
            if pending and later != delay:
                after_all(delay, start, pending)
                pending = []
            delay = later
            pending.append((compiled, key))
        if pending:
            after_all(delay, start, pending)

    def _bundle_start_all(self, values: list[tuple[CompiledPlan, int]]) -> None:
        """:meth:`_bundle_start` of each value in turn (a heap entry's bundle starts), the
        run's look-ups bound once: the same calls, in the same order."""
        start_bundle = self.net.start_bundle  # type: ignore[attr-defined]
        flow_done, done, now = self.flow_done, self._bundle_done, self.now
        if len(values) > 1 and self.bundling and self.rows and self.stepping:
            merged = self._merged_routes(values)
            fid = self.flows
            if merged is not None and start_bundle(now, fid, merged, values[0][0].nbytes[0]):
                self.flows = fid + len(merged)  # the same ids as the bundles one by one
                flow_done[fid] = (self._bundles_done, values)
                if not self.refresh_pending:
                    self.refresh_pending = True
                    self._after(0, self._refresh)
                return
        for value in values:
            compiled = value[0]
            routes = compiled.routes
            if routes is None or not self.bundling:
                self._bundle_start(value)
                continue
            fid = self.flows
            if start_bundle(now, fid, routes, compiled.nbytes[0]):
                self.flows = fid + len(routes)
                flow_done[fid] = (done, value)
                if not self.refresh_pending:
                    self.refresh_pending = True
                    self._after(0, self._refresh)
            else:
                PlanRun(self, compiled, self._finish_collective, value[1])._delayed(
                    compiled.later[0][1])

    def _merged_routes(self, values: list[tuple[CompiledPlan, int]]
                       ) -> tuple[tuple[int, ...], ...] | None:
        """The routes of ``values``' bundles in turn, as one bundle's
        (:meth:`_bundle_start_all`), where each one's routes are known and their bytes are one
        value; kept per the plans' routes (by identity, the tuples held beside), so that the
        network's look-up of the bundle's shape is by one tuple's identity too. None: not
        mergeable."""
        parts = []
        nbytes = values[0][0].nbytes[0]
        for compiled, _ in values:
            routes = compiled.routes
            if routes is None or compiled.nbytes[0] != nbytes:
                return None
            parts.append(routes)
        key = tuple(map(id, parts))
        known = self._merged.get(key)
        if known is None:
            known = self._merged[key] = (parts, tuple(
                route for routes in parts for route in routes))
        return known[1]

    def _bundle_done(self, value: tuple[CompiledPlan, int]) -> None:
        self._release(self.members.pop(value[1]))  # _finish_collective, inline

    def _bundles_done(self, values: list[tuple[CompiledPlan, int]]) -> None:
        """A bundle of several plans' flows (:meth:`_bundle_start_all`) ended: each plan's
        :meth:`_bundle_done` in turn (as their bundles, ending at one instant, would)."""
        for value in values:
            self._bundle_done(value)

    def _unbundled(self, first: int) -> None:
        """A bundle of flows (:meth:`_bundle_start`) became its flows: each one's arrival as
        if they had started one by one (a run of the plan counting them down)."""
        on_done, value = self.flow_done[first]
        for compiled, key in (value if on_done == self._bundles_done else (value,)):
            run = PlanRun(self, compiled, self._finish_collective, key)
            group = compiled.later[0][1]
            for k, t in enumerate(group):
                self.flow_done[first + k] = (run.arrive, t)
            first += len(group)  # the next plan's bundle's flows (_bundle_start_all)

    def _drain(self) -> None:
        """Start ready instructions; a queue, so zero-time chains do not recurse."""
        self.draining = True
        ready, instrs, members = self.ready, self.program.instructions, self.members
        started, mid, timer, complete = self.started, self.mid, self.timer, self._complete
        heap = self.heap if self.env is None else None
        templates, tpl, by_work, durations = self.packed
        packed = templates is not None
        key_at, group_at, blocking_at = COLLECTIVE_KEY, COLLECTIVE_GROUP, COMPUTE_BLOCKING_S
        while ready:
            i = ready.popleft()
            if packed:  # the class and shared fields from the template; the object if needed
                cls, _, rest = templates[tpl[i]]  # type: ignore[index]
                if cls is Collective:
                    started[i] = self.now  # a member arrives (below, without the object)
                    key = rest[key_at]
                    waiting = members.get(key)
                    if waiting is None:
                        members[key] = waiting = [i]
                    else:
                        waiting.append(i)
                    if len(waiting) >= len(rest[group_at]):
                        self._arrived(instrs[i])
                    continue
                if cls is Compute:
                    t = tpl[i]  # type: ignore[index]
                    duration = durations[t] if by_work else None  # once per template
                    if duration is None:
                        duration = timer(instrs._make(i))  # type: ignore[union-attr]
                        if by_work:
                            durations[t] = duration
                    blocking = rest[blocking_at]
                else:
                    ins = instrs._make(i)  # type: ignore[union-attr]
            else:
                ins = instrs[i]
                cls = type(ins)
                if cls is Compute:
                    duration, blocking = timer(ins), ins.blocking_comm_s
            if cls is Compute:  # its compute, then its blocking communication: one event
                now = self.now
                started[i] = now
                mid[i] = now + duration
                total = duration + blocking
                if not total > 0:
                    complete(i)
                elif heap is not None:  # _after on the own heap, inline
                    at = now + total
                    batch = self.batch
                    if batch is not None and self.batch_seq == self.events and self.batch_at == at:
                        batch.append(i)  # the next event in SimPy's order: the same entry
                    else:
                        self.batch = batch = [i]
                        self.batch_at = at
                        heappush(heap, (at, self.events + 1, _Run._complete, batch))  # _loop
                    self.events += 1
                    self.batch_seq = self.events
                else:
                    self._after(total, complete, i)
            elif cls is Send:
                self._start_send(i, ins)
            else:  # a member reaches a collective (_arrive, inline up to the last one)
                started[i] = self.now
                waiting = members.get(ins.key)
                if waiting is None:
                    members[ins.key] = waiting = [i]
                else:
                    waiting.append(i)
                if len(waiting) >= len(ins.group):
                    self._arrived(ins)
        self.draining = False

    # ------------------------------------------------------------------ network

    def _reschedule(self) -> None:
        t_end = self.net.next_end_s()
        if t_end == float("inf"):
            return
        now = self.now
        delay = max(0.0, t_end - now)
        at = now + delay
        if at == self.wake_at:  # the pending wake-up already fires then
            return
        self.wake_version += 1
        self.wake_at = at
        self._after(delay, self._on_wake, self.wake_version)

    def _refresh(self, _value: object) -> None:
        """Recompute rates once for all flows that started at this instant."""
        self.refresh_pending = False
        self.net.refresh(self.now)
        self._reschedule()

    def _on_wake(self, version: int) -> None:
        if version != self.wake_version:
            return
        self.wake_at = -1.0
        done = self._finish_due(self.now)
        flow_done, ends = self.flow_done, self.flow_ends
        if self.rows and self.stepping:  # bundles ending in a row release as one list
            self._finished_flows(done)
        else:
            for fid in done:
                if ends is not None:
                    del ends[fid]
                on_done, arg = flow_done.pop(fid)
                on_done(arg)
        self._reschedule()

    def _finished_flows(self, done: list[int]) -> None:
        """:meth:`_on_wake`'s arrivals, where bundles (:meth:`_bundle_done`) that end one after
        another release their collectives' members as one list: completing it does what
        releasing them one list after another does (:meth:`_release_packed` completes a list
        in turn, each completion followed by the starts it frees, and nothing else comes
        between the calls), and the DP replicas' blocks of lanes, now in one list, may step as
        rows (:func:`sim.rows.rows_stepper`). The members are taken when their bundle's turn
        comes, before the bundles before them are released: no instruction a release starts
        joins a collective whose members have all arrived."""
        flow_done, ends, members = self.flow_done, self.flow_ends, self.members
        bundle_done, bundles_done = self._bundle_done, self._bundles_done
        complete = self._complete if self.sends else None
        ids: list[int] | None = None
        for fid in done:
            if ends is not None:
                del ends[fid]
            on_done, arg = flow_done.pop(fid)
            if on_done == complete:  # a send's flow (_complete: _release of its id alone)
                if ids is None:
                    ids = [arg]  # type: ignore[list-item]
                else:
                    ids.append(arg)  # type: ignore[arg-type]
                continue
            if on_done == bundle_done:
                mine = members.pop(arg[1])  # type: ignore[index]
                if ids is None:
                    ids = mine
                else:
                    ids += mine
                continue
            if on_done == bundles_done:  # several plans' bundles as one: each in turn
                for value in arg:  # type: ignore[attr-defined]
                    mine = members.pop(value[1])
                    if ids is None:
                        ids = mine
                    else:
                        ids += mine
                continue
            if ids is not None:
                self._release(ids)
                ids = None
            on_done(arg)
        if ids is not None:
            self._release(ids)

    def change_links_at(self, at_s: float, capacity_Bps: Mapping[int, float]) -> None:
        """From ``at_s`` on, links (by index) carry new bandwidths, flows in flight re-rated
        (:meth:`sim.network.FlowNetwork.set_capacity`); a bandwidth of 0 is a failure
        (:meth:`_fail_links`)."""
        self.bundling = False  # flows in flight may be rerouted or re-rated one by one
        if any(bps == 0 for bps in capacity_Bps.values()) and self.flow_ends is None:
            self.flow_ends = {}
        self._after(at_s, self._change_links, capacity_Bps)

    def _change_links(self, changes: Mapping[int, float]) -> None:
        failed = [link for link, bps in changes.items() if bps == 0]
        degraded = {link: bps for link, bps in changes.items()
                    if bps != 0 and link not in self.failed}
        if degraded:
            self.net.set_capacity(self.now, degraded)
        if failed:
            self._fail_links(failed)
        self._reschedule()

    def _fail_links(self, failed: list[int]) -> None:
        """Links (by index) fail now: routes avoid them from now on.

        Every flow in flight across a failed link moves, with the bytes it has left, to
        the route of ``cluster`` without the failed links
        (:meth:`~topologies.cluster.Cluster.rerouted`: same shortest-path / ECMP rule,
        in this cluster's link indices) without a new latency (its bytes are already
        streaming); flows not crossing them keep their routes. Transfers started later take
        the new routes: sends, and the transfers of collective plans, including plans in
        progress (which keep their algorithm and latencies); collectives started later are
        planned on the cluster without the failed links. A failed link keeps its
        bandwidth but no flow crosses it again. A pair the failures disconnect raises
        TopologyError naming it when a flow in flight or a later transfer needs it.
        """
        self.failed.update(failed)
        rerouted = self.cluster.rerouted(self.failed)
        self.route, self.topology = rerouted.route, rerouted.cluster
        self.epoch += 1
        self._plans.clear()
        self._profiles.clear()
        self._compiled.clear()
        ends = self.flow_ends
        assert ends is not None
        moves = {fid: rerouted.route(*ends[fid]).links for fid in self.net.crossing(failed)}
        if moves:
            self.net.reroute(self.now, moves)

    def _flow(self, links: tuple[int, ...], nbytes: float, on_done: Callable[[int], None],
              arg: int, ends: tuple[Endpoint, Endpoint]) -> None:
        """Start a fair-shared flow from ``ends[0]`` to ``ends[1]`` over ``links`` now;
        ``on_done(arg)`` when its last byte arrives."""
        fid = self.flows
        self.flows += 1
        self.flow_done[fid] = (on_done, arg)
        if self.flow_ends is not None:
            self.flow_ends[fid] = ends
        self.net.start(self.now, fid, links, nbytes)
        if not self.refresh_pending:
            self.refresh_pending = True
            self._after(0, self._refresh)

    # ------------------------------------------------------------------ instructions

    def _start_send(self, i: int, ins: Send) -> None:
        self.started[i] = self.now
        if ins.duration_s is not None:  # precomputed (collapsed simulation)
            self._after(ins.duration_s, self._end_send, (i, ins))
            return
        route = self.route(ins.gpu, ins.dst)
        if route.latency_s > 0:
            if self.env is None and self.sends:  # consecutive sends of an instant: one entry
                self._after_own(route.latency_s, self._sends_due,
                                (i, ins.gpu, ins.dst, ins.nbytes, route.links, self.epoch))
            else:
                self._after(route.latency_s, self._send_flow, (i, ins, route.links, self.epoch))
        else:
            self._send_flow_now(i, ins, route.links)

    def _send_flow(self, value: tuple[int, Send, tuple[int, ...], int]) -> None:
        i, ins, links, epoch = value
        if epoch != self.epoch:  # links failed during the latency: the new route
            links = self.route(ins.gpu, ins.dst).links
        self._send_flow_now(i, ins, links)

    def _start_send_packed(self, i: int, t: int) -> None:
        """:meth:`_start_send` of a packed program's send ``i`` (template ``t``) with the sends
        batched (:attr:`sends`): its GPU, destination and bytes read from the columns and its
        template (head ``(dst, nbytes, kind, name)``), not a named tuple made per send; one
        with a precomputed duration, or a route without latency, as :meth:`_start_send`."""
        instrs = self.program.instructions
        head, rest = instrs.templates[t][1:]
        if rest[SEND_DURATION_S] is not None:
            self._start_send(i, instrs._make(i))
            return
        gpu, dst = instrs.gpu[i], head[0]
        self.started[i] = self.now
        route = self.route(gpu, dst)
        if route.latency_s > 0:
            self._after_own(route.latency_s, self._sends_due,
                            (i, gpu, dst, head[1], route.links, self.epoch))
        else:
            self._send_flow_now(i, instrs._make(i), route.links)

    def _sends_due(self, value: object) -> None:
        """The mark of a heap entry of batched sends' flow starts (:meth:`_send_flows`)."""
        raise AssertionError("handled by _loop")

    def _send_flows(self, values: list[tuple[int, int, int, float, tuple[int, ...], int]]
                    ) -> None:
        """:meth:`_send_flow` of each value ``(id, gpu, dst, bytes, links, epoch)`` in turn (a
        heap entry's sends, :meth:`_after_own`), :meth:`_send_flow_now` and :meth:`_flow`
        inline: the same flows, ids, refresh event and completions, in the same order."""
        flow_done, start, complete, now = self.flow_done, self.net.start, self._complete, \
            self.now
        for i, gpu, dst, nbytes, links, epoch in values:
            if epoch != self.epoch:  # links failed during the latency: the new route
                links = self.route(gpu, dst).links
            if not (nbytes > 0 and links):
                complete(i)  # may start more (its successors): state read again below
                continue
            fid = self.flows
            self.flows = fid + 1
            flow_done[fid] = (complete, i)
            if self.flow_ends is not None:
                self.flow_ends[fid] = (gpu, dst)
            start(now, fid, links, nbytes)
            if not self.refresh_pending:
                self.refresh_pending = True
                self._after(0, self._refresh)

    def _send_flow_now(self, i: int, ins: Send, links: tuple[int, ...]) -> None:
        """Route latency has passed: the message's bytes as one flow."""
        if ins.nbytes > 0 and links:
            self._flow(links, ins.nbytes, self._complete, i, (ins.gpu, ins.dst))
        else:
            self._complete(i)

    def _end_send(self, value: tuple[int, Send]) -> None:
        self._complete(value[0])

    def _arrived(self, ins: Collective) -> None:
        """The last member has reached collective ``ins``: it starts."""
        key = ins.key
        if ins.duration_s is not None:  # precomputed (collapsed simulation)
            self._after(ins.duration_s, self._end_collective, key)
        else:
            plan = self._collective_plan(ins)
            if plan.launch_s > 0:
                self._after(plan.launch_s, self._launched, (key, plan))
            else:
                self._launched((key, plan))

    def _launched(self, value: tuple[int, CollectivePlan]) -> None:
        """Collective ``key`` is launched: its plan's transfers run."""
        key, plan = value
        steps = plan.transfers
        if steps:
            self._run_plan(steps, self._finish_collective, key)
        else:
            self._finish_collective(key)

    def _end_collective(self, key: int) -> None:
        self._finish_collective(key)

    def _finish_collective(self, key: int) -> None:
        """Collective ``key`` is done: each member completes in turn (:meth:`_release`)."""
        self._release(self.members.pop(key))

    def _collective_plan(self, ins: Collective) -> CollectivePlan:
        """The plan of ``ins`` (:func:`collective_plan`), cached per run."""
        key = (ins.op, ins.algo, ins.group, ins.nbytes, ins.skew)
        steps = self._plans.get(key)
        if steps is None:
            steps = self._plans[key] = collective_plan(self.topology, ins.op, ins.algo,
                                                       ins.group, ins.nbytes, self._profiles,
                                                       ins.skew)
        return steps

    def _run_plan(self, steps: tuple[Transfer, ...], done: Callable[[int], None],
                  arg: int) -> None:
        """Run a plan's transfers as their dependencies arrive; call ``done(arg)`` after the
        last."""
        compiled = self._compiled.get(id(steps))
        if compiled is None:
            compiled = self._compiled[id(steps)] = CompiledPlan(self.topology, steps,
                                                                 self.route, self.epoch)
        PlanRun(self, compiled, done, arg).begin()

    # ------------------------------------------------------------------ run

    def run(self, queue: bool = False) -> Timeline:
        """Execute the program: on the event queue (SimPy's in the reference, else the run's
        own heap, :meth:`_after`), or, unless ``queue``, where no transfer shares the network
        (every send and collective has a precomputed duration and every collective one
        member, as in a collapsed program), by the queue-free pass on arrays
        (:func:`sim.columnar.run_columns`), which computes the same times."""
        instrs = self.program.instructions
        if not queue:
            columns = (instrs.columns if isinstance(instrs, ColumnarInstructions)
                       else columns_of(instrs))
            fast = run_columns(columns, self.timer, self.program.static_bytes,
                               self.gpus) if columns is not None else None
            if fast is not None:
                return self._deferred(fast)
        self._zero_times()
        self._build_dag(self.program)
        waiting = self.waiting
        if self.env is None and isinstance(waiting, array) and waiting.itemsize == 4:
            # the ids with no predecessor, in order, on the counters' buffer: a full run's
            # millions of counters without a Python step each (the reference: the loop)
            self.ready.extend(np.flatnonzero(np.frombuffer(waiting, dtype=np.int32) == 0)
                              .tolist())
        else:
            self.ready.extend(i for i, w in enumerate(waiting) if not w)
        del waiting
        self._drain()
        if self.env is None:
            self._loop()
        else:
            self.env.run()
        self._check_finished(self.now)
        del self.succ, self.first, self.waiting  # the DAG's state, not the records': memory
        if isinstance(self.net, FastFlowNetwork):
            self.net.settle()  # the bytes each link carried: the log freed before the summaries
        self._tables = None  # 9 bytes a template, at the summaries' peak otherwise
        self.lanes = bytearray()
        if self.env is not None:  # the reference makes the records at once
            return timeline_of(self.program, self.started, self.mid, self.ended)
        return self._summarized()

    def _summarized(self) -> Timeline:
        """The outcome of a run on the own heap: the statistics' summaries worked out from
        the times (:func:`sim.timeline.summaries_of`), the records made from the same times
        when first read (:meth:`Timeline.deferred`): a full-fidelity run's spans are most of
        its memory, and a ``--json`` run never reads them."""
        ready, mid, end = self.started, self.mid, self.ended
        summary = summaries_of(self.program, ready, mid, end)
        self.intervals = summary.intervals
        return self._timeline_of(ready, lambda: mid, end, summary.clock, summary.peaks,
                                 summary.floors)

    def _deferred(self, fast: ColumnarPass) -> Timeline:
        """The outcome of the queue-free pass; the timeline's records are made from its
        times when first read (:meth:`Timeline.deferred`, :func:`sim.timeline.timeline_of`)."""
        self.started, self.ended = fast.ready_s, fast.end_s  # type: ignore[assignment]
        self.mid = fast.mid_a  # type: ignore[assignment]
        self.cause, self.intervals = fast.cause, fast.intervals
        self.events = fast.events
        self.arrays = (fast.ready_a, fast.end_a)
        self.completed = len(fast.end_s)
        return self._timeline_of(fast.ready_s, fast.mid_a.tolist, fast.end_s, fast.clock,
                                 fast.peak_bytes, fast.floor_bytes)

    def _timeline_of(self, ready: Sequence[float], mid: Callable[[], Sequence[float]],
                     end: Sequence[float], clock: float, peaks: dict[int, float],
                     floors: dict[int, float]) -> Timeline:
        """The outcome of a run on the own heap or of the queue-free pass: its instructions'
        ready, mid (as read when the records are first made) and end times, its clock and
        memory peaks and floors by GPU; the records made from the times when first read
        (:meth:`Timeline.deferred`, :func:`sim.timeline.timeline_of`)."""
        program = self.program

        def records() -> tuple[tuple[Span, ...], tuple[FlowArrow, ...],
                               tuple[MemorySample, ...], tuple[tuple[int, ...], ...]]:
            with gc_paused():
                timeline = timeline_of(program, ready, mid(), end)
                return timeline.spans, timeline.flows, timeline.memory, timeline.collectives

        return Timeline.deferred(program.num_gpus, records, program.gpu_names, self.gpus,
                                 end_s=clock if clock > 0 else None, peak_memory_by_gpu=peaks,
                                 memory_floor_by_gpu=floors)

    def _check_finished(self, now: float) -> None:
        instrs = self.program.instructions
        if self.completed == len(instrs):
            return
        streams: dict[tuple[int, str], list[int]] = {}
        for ins in instrs:
            streams.setdefault((ins.gpu, ins.stream), []).append(ins.id)
        stalled = []
        for (gpu, stream), order in streams.items():
            pos = next((i for i in order if not self.finished[i]), None)
            if pos is None:
                continue
            ins = instrs[pos]
            waits = [f"{instrs[d].name}@gpu{instrs[d].gpu}"
                     for d in ins.deps if not self.finished[d]]
            if isinstance(ins, Collective) and not waits:
                arrived = {instrs[i].gpu for i in self.members.get(ins.key, ())}
                missing = sorted(set(ins.group) - arrived)
                waits = [f"collective members {missing}"]
            stalled.append(f"gpu{gpu}/{stream}: {ins.name} waits on {', '.join(waits)}")
        shown = "; ".join(stalled[:12])
        more = f" (+{len(stalled) - 12} more)" if len(stalled) > 12 else ""
        raise DeadlockError(f"simulation stalled at t={now:.6g}s: {shown}{more}")

    def close(self) -> None:
        """Break the run's reference cycles, whichever way it ended: the fast network's split
        hook and the packed release bound on the instance point back at the run. Made under
        :func:`~base.collector.gc_paused`, which moves what it made to the oldest generation,
        such a cycle lives until a full collection, and with it the whole run's state (its
        program, network, times): a process simulating many programs (``sim validate``'s
        workers, a search's) then grew by every run's state until one came (docs/status.md,
        worker memory)."""
        if isinstance(self.net, FastFlowNetwork):
            self.net.on_split = None
        self.__dict__.pop("_release", None)

    def counters(self, out: EngineCounters) -> None:
        out.events = self.events
        out.instructions = len(self.program.instructions)
        out.flows = self.flows
        out.rate_recomputations = self.net.recomputations
        out.rerated_flows = self.net.rerated_flows
        out.bytes_on_link = dict(self.net.bytes_on_link)
        out.stepped = self.stepped
        out.rows = self.rowed


def simulate_program(program: Program, cluster: Cluster, timer: ComputeTimer,
                     counters: EngineCounters | None = None, *,
                     event_queue: bool = False,
                     times: InstructionTimes | None = None,
                     link_changes: Sequence[tuple[float, Mapping[int, float]]] = ()
                     ) -> Timeline:
    """Run ``program`` on ``cluster``; ``timer`` gives each compute op's duration in seconds
    (from the op's work: a program held as columns has it called once per compute signature,
    ops equal but in id, name, dependencies and micro-batch, :mod:`sim.columnar`).

    Raises :class:`DeadlockError` naming the stalled streams if some instruction
    can never run. ``counters``, if given, is filled with what the run did.
    A program without network transfers (every send and collective precomputed, every
    collective of one member, as a collapsed one) runs without the event queue
    (:mod:`sim.columnar`) unless ``event_queue``, which runs the reference, on SimPy's
    event queue; any other program runs on the engine's own heap of timeouts, ordered as
    SimPy orders them (the result is the same: ``tests/test_differential.py``). ``times``,
    if given, is filled with each instruction's ready and end times. ``link_changes``:
    ``(at_s, {link index: bandwidth_Bps})`` pairs, links degraded (or restored) in the
    middle of the run; the flows then in flight are re-rated (precomputed durations are not
    affected). A
    bandwidth of 0 fails the link: flows in flight across it continue on the route of the
    cluster without it, and later transfers take such routes (:meth:`_Run._fail_links`).
    """
    if program.num_gpus > cluster.num_gpus:
        raise ValueError(f"program needs {program.num_gpus} GPUs, cluster has {cluster.num_gpus}")
    with gc_paused():
        run = _Run(program, cluster, timer, reference=event_queue)
        for at_s, capacity in link_changes:
            run.change_links_at(at_s, capacity)
        try:
            timeline = run.run(queue=event_queue or bool(link_changes))
            if times is not None:
                times.ready_s, times.end_s = run.started, run.ended
                times.mid_s = run.mid
                times.intervals, times.cause = run.intervals, run.cause
                times.arrays = run.arrays
            return timeline
        finally:
            if counters is not None:
                run.counters(counters)
            run.close()
