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
completion event and no condition event. Spans and memory samples are kept as
plain tuples and turned into timeline records once, in sorted order.

A program whose every duration is known up front (a collapsed one) runs without
the event queue: in one pass over the instructions in id order when that order
is topological (lowered programs), else by a pass in topological order; its
records go straight into per-stream lanes, each of which comes nearly sorted.
A program held as columns (a collapsed lowering's,
:class:`~workloads.program.ColumnarInstructions`) takes that pass on arrays
(:mod:`sim.columnar`: the same times, causes, intervals and memory peaks) and
returns a timeline whose span records the in-order pass makes when first read
(:meth:`Timeline.deferred`): a ``--json`` run never builds them.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from operator import itemgetter

import simpy

from base.collector import gc_paused
from base.errors import DeadlockError
from sim.collectives import AUTO, GroupProfile, Transfer, group_profile, resolve_algorithm
from sim.collectives import plan as plan_collective
from sim.columnar import ColumnarPass, run_columns
from sim.network import FlowNetwork
from sim.timeline import COMM_KINDS, FlowArrow, MemorySample, Span, Timeline
from topologies.cluster import Cluster, Endpoint, Route
from workloads.program import Collective, ColumnarInstructions, Compute, Program, Send

ComputeTimer = Callable[[Compute], float]
_COMM_KINDS = frozenset(COMM_KINDS)
_BYTES = itemgetter(2)  # MemorySample.bytes


@dataclass
class EngineCounters:
    """What one run of the engine did; pass one to :func:`simulate_program` to fill it."""

    events: int = 0
    """SimPy events scheduled (and processed: a finished run leaves none pending); for a
    program run without the queue (:meth:`_Run._run_fixed`), the events the queue would
    have processed."""
    instructions: int = 0
    flows: int = 0
    """Flows started on the network (sends and collective transfers)."""
    rate_recomputations: int = 0
    """Max-min recomputations (each over the component of flows a change touched)."""
    rerated_flows: int = 0
    """Flows re-rated, summed over recomputations."""


@dataclass
class InstructionTimes:
    """When each instruction ran, indexed by instruction id; pass one to
    :func:`simulate_program` to fill it (read by :mod:`sim.idle`)."""

    ready_s: list[float] = field(default_factory=list)
    """When its last predecessor (dependency or stream predecessor) completed: a compute op or
    send starts then; a collective member arrives then (the collective starts at the last
    member's arrival, plus the launch latency)."""
    end_s: list[float] = field(default_factory=list)
    """When it completed."""
    intervals: dict[tuple[int, str], array[float]] = field(default_factory=dict)
    """The spans' intervals as :mod:`sim.stats` reads them (:data:`sim.stats.Intervals`): per
    ``(GPU, "compute")`` its compute stream's, per ``(GPU, kind)`` those of each
    communication kind, as flat ``[start, end, ...]`` lists, recorded as the spans are
    (the columnar pass groups them otherwise: their order is not part of the contract)."""
    cause: list[int] = field(default_factory=list)
    """Its latest-finishing predecessor (-1: none), as :mod:`sim.idle` follows chains: the
    stream predecessor, unless a dependency ended strictly later (the first such of the
    latest); every member of a collective takes that of the member that arrived last (the
    lowest id among equals). Recorded by the queue-free pass over a program in id order
    (a collapsed one); empty otherwise."""
    arrays: tuple | None = None
    """``(ready_s, end_s)`` as float arrays, where the engine worked them out on arrays (the
    columnar pass, :mod:`sim.columnar`): what :func:`sim.idle.idle_breakdown` reads
    without converting the lists; None otherwise."""


def collective_plan(cluster: Cluster, op: str, algo: str, group: tuple[int, ...],
                    nbytes: float, profiles: dict[tuple[int, ...], GroupProfile] | None = None
                    ) -> tuple[Transfer, ...]:
    """The transfers of collective ``op`` over ``group`` as the engine runs them.

    The cluster's per-op override wins over ``algo``; ``auto`` (and ``nvls``) pick
    NCCL-like from the group's profile (:func:`sim.collectives.select_algorithm`);
    transfers carry the actual route latencies (:func:`sim.collectives.plan`).
    ``profiles``: a cache of group profiles on ``cluster``, by group (filled here).
    """
    algo = cluster.collective_algos.get(op, algo)
    profile = None
    if algo in (AUTO, "nvls"):
        profile = profiles.get(group) if profiles is not None else None
        if profile is None:
            profile = group_profile(cluster, group)
            if profiles is not None:
                profiles[group] = profile
    algo = resolve_algorithm(op, algo, nbytes, profile)
    host_of = {r: cluster.host_of(r) for r in group} if algo in ("hierarchical", "ring") else None
    return plan_collective(op, algo, group, nbytes, host_of=host_of,
                           nvswitch=profile.nvswitch if profile else None,
                           granularity=cluster.collective_granularity,
                           latency=lambda a, b: cluster.route(a, b).latency_s)


def step_latency_s(cluster: Cluster, step: Transfer) -> float:
    """Delay before ``step``'s flow starts: the plan's latency (else ``steps`` x the route's)
    plus ``steps`` x the cluster's per-step software latency."""
    hops = (step.steps * cluster.route(step.src, step.dst).latency_s if step.latency_s is None
            else step.latency_s)
    return hops + step.steps * cluster.collective_step_s


class _CompiledPlan:
    """A plan's transfers resolved once per run: routes, start delays and dependency lists.

    ``route``: the run's routes (link indices into the run's cluster); ``epoch``: the
    run's routing epoch they were taken in. A link failure in the middle of the run starts
    a new epoch, and a transfer started after it takes its route again (:meth:`links_of`;
    its start delay, the plan's latency, is kept)."""

    __slots__ = ("deps", "dependents", "ends", "epochs", "latency", "links", "nbytes", "roots")

    def __init__(self, cluster: Cluster, steps: tuple[Transfer, ...],
                 route: Callable[[Endpoint, Endpoint], Route] | None = None,
                 epoch: int = 0) -> None:
        route = route or cluster.route
        self.ends = [(s.src, s.dst) for s in steps]
        self.epochs = [epoch] * len(steps)
        self.deps = [len(s.deps) for s in steps]
        self.dependents: list[list[int]] = [[] for _ in steps]
        for i, s in enumerate(steps):
            for d in s.deps:
                self.dependents[d].append(i)
        self.latency = [step_latency_s(cluster, s) for s in steps]
        self.links = [route(s.src, s.dst).links for s in steps]
        self.nbytes = [s.nbytes for s in steps]
        self.roots = [i for i, s in enumerate(steps) if not s.deps]

    def links_of(self, k: int, run: _Run) -> tuple[int, ...]:
        """Transfer ``k``'s links, taken again if links failed since they were taken."""
        if self.epochs[k] != run.epoch:
            self.links[k] = run.route(*self.ends[k]).links
            self.epochs[k] = run.epoch
        return self.links[k]


class _PlanRun:
    """One execution of a compiled plan: transfers start as their dependencies arrive.

    A transfer waits its start delay (:func:`step_latency_s`), then moves its
    bytes as a flow. Transfers that become ready together with the same delay
    share one SimPy event (they would start at the same instant anyway).
    Arrivals are drained from a queue, so long zero-time chains do not recurse.
    """

    __slots__ = ("draining", "done", "left", "plan", "queue", "run", "waiting")

    def __init__(self, run: _Run, plan: _CompiledPlan, done: Callable[[], None]) -> None:
        self.run = run
        self.plan = plan
        self.done = done
        self.waiting = list(plan.deps)
        self.left = len(plan.deps)
        self.queue: deque[int] = deque()
        self.draining = False

    def begin(self) -> None:
        self._start(self.plan.roots)

    def _start(self, ready: list[int]) -> None:
        """Start transfers that just became ready: now if without delay, else grouped by delay."""
        latency = self.plan.latency
        later: dict[float, list[int]] = {}
        for k in ready:
            lat = latency[k]
            if lat > 0:
                group = later.get(lat)
                if group is None:
                    later[lat] = [k]
                else:
                    group.append(k)
            else:
                self._flow(k)
        for lat, group in later.items():
            self.run._after(lat, self._delayed, group)

    def _delayed(self, event: simpy.Event) -> None:
        for k in event.value:
            self._flow(k)

    def _flow(self, k: int) -> None:
        plan, run = self.plan, self.run
        links = plan.links[k] if plan.epochs[k] == run.epoch else plan.links_of(k, run)
        nbytes = plan.nbytes[k]
        if nbytes > 0 and links:
            run._flow(links, nbytes, lambda: self.arrive(k), plan.ends[k])
        else:
            self.arrive(k)

    def arrive(self, i: int) -> None:
        """Transfer ``i`` has arrived: release its dependents; ``done()`` after the last."""
        queue = self.queue
        queue.append(i)
        if self.draining:
            return
        self.draining = True
        waiting, dependents = self.waiting, self.plan.dependents
        while queue:
            j = queue.popleft()
            self.left -= 1
            ready = []
            for k in dependents[j]:
                waiting[k] -= 1
                if waiting[k] == 0:
                    ready.append(k)
            if ready:
                self._start(ready)
        self.draining = False
        if self.left == 0:
            self.done()


class _Run:
    """State of one simulation; discarded after :func:`simulate_program` returns."""

    def __init__(self, program: Program, cluster: Cluster, timer: ComputeTimer) -> None:
        self.env = simpy.Environment()
        self.program = program
        self.cluster = cluster
        self.timer = timer
        self.net = FlowNetwork(cluster.link_bandwidth_Bps)
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
        self.intervals: dict[tuple[int, str], array[float]] = {}
        """See :attr:`InstructionTimes.intervals` (filled as the timeline is assembled)."""
        self.cause: list[int] = []
        """See :attr:`InstructionTimes.cause` (filled by :meth:`_run_in_order` only)."""
        self.arrays: tuple | None = None
        """See :attr:`InstructionTimes.arrays` (filled by :meth:`_deferred` only)."""
        self.flow_done: dict[int, Callable[[], None]] = {}
        self.wake_version = 0
        self.wake_at = -1.0
        self.refresh_pending = False
        self._plans: dict[tuple, tuple[Transfer, ...]] = {}
        self._profiles: dict[tuple[int, ...], GroupProfile] = {}  # per group, see collective_plan
        self._compiled: dict[int, _CompiledPlan] = {}
        """Per plan (by identity; plans live in ``_plans``), what running it needs."""
        # collectives in progress: key -> member instruction ids, start time
        self.members: dict[int, list[int]] = {}
        self.collective_start: dict[int, float] = {}
        # records, turned into Spans / MemorySamples by _timeline
        self.spans: list[tuple] = []
        self.lanes: dict[tuple[int, str], list[tuple]] | None = None
        """Span records already per stream (:meth:`_run_in_order`), else None."""
        self.memory_lanes: dict[int, list] = {}
        """Per GPU, its memory records ``(time, creation order, bytes)``, or (when
        :attr:`memory_in_order`) its samples, already in order (:meth:`_run_in_order`)."""
        self.memory_in_order = False
        self.plain_lanes: dict[tuple[int, str], list[Span]] = {}
        """Spans of the streams whose spans came in order (:meth:`_run_in_order`)."""
        self.arrows: list[tuple[int, int]] = []
        self.lane_arrows: list[tuple[tuple[int, str], tuple[int, str]]] = []
        """(send lane, receive lane) of :attr:`plain_lanes` whose spans pair up in order."""
        self.mem_now = list(program.static_bytes)
        self.gpus = (tuple(range(program.num_gpus)) if program.simulated_gpus is None
                     else program.simulated_gpus)
        self.memory: list[tuple[int, float, int, float]] = [
            (g, 0.0, k - len(self.gpus), program.static_bytes[g]) for k, g in enumerate(self.gpus)]
        self.started = [0.0] * len(program.instructions)
        self.ended = [0.0] * len(program.instructions)
        self.completed = 0
        self.ready: deque[int] = deque()
        self.draining = False
        self.clock = 0.0

    def _build_dag(self, program: Program) -> None:
        """Successor lists and unfinished-predecessor counters (deps + stream order)."""
        instrs = program.instructions
        n = len(instrs)
        waiting = [0] * n
        succ: list[list[int]] = [[] for _ in range(n)]
        last_in: dict[object, int] = {}  # per stream (keys as in _run_in_order)
        for ins in instrs:
            i, deps = ins.id, ins.deps
            cls = type(ins)
            key = (ins.gpu if cls is Compute else
                   (ins.gpu, ins.dst) if cls is Send else (ins.gpu, ins.kind))
            before = last_in.get(key)
            if before is None:
                waiting[i] = len(deps)
            else:
                succ[before].append(i)
                waiting[i] = len(deps) + 1
            last_in[key] = i
            for d in deps:
                succ[d].append(i)
        self.waiting = waiting
        self.succ = succ
        self.finished = bytearray(n)
        self.completed = 0

    # ------------------------------------------------------------------ scheduling

    def _after(self, delay: float, callback: Callable[[simpy.Event], None],
               value: object = None) -> None:
        """Run ``callback(event)`` ``delay`` seconds from now (one SimPy event)."""
        self.events += 1
        self.env.timeout(delay, value).callbacks.append(callback)

    def _complete(self, i: int) -> None:
        """Instruction ``i`` is done: release its successors; start those now free."""
        self.finished[i] = 1
        self.completed += 1
        self.ended[i] = self.env.now
        waiting, ready = self.waiting, self.ready
        for j in self.succ[i]:
            left = waiting[j] - 1
            waiting[j] = left
            if not left:
                ready.append(j)
        if not self.draining:
            self._drain()

    def _drain(self) -> None:
        """Start ready instructions; a queue, so zero-time chains do not recurse."""
        self.draining = True
        ready, instrs = self.ready, self.program.instructions
        while ready:
            i = ready.popleft()
            ins = instrs[i]
            if isinstance(ins, Compute):
                self._start_compute(i, ins)
            elif isinstance(ins, Send):
                self._start_send(i, ins)
            else:
                self._arrive(i, ins)
        self.draining = False

    # ------------------------------------------------------------------ network

    def _reschedule(self) -> None:
        t_end = self.net.next_end_s()
        if t_end == float("inf"):
            return
        now = self.env.now
        delay = max(0.0, t_end - now)
        at = now + delay
        if at == self.wake_at:  # the pending wake-up already fires then
            return
        self.wake_version += 1
        self.wake_at = at
        self._after(delay, self._on_wake, self.wake_version)

    def _refresh(self, _event: simpy.Event) -> None:
        """Recompute rates once for all flows that started at this instant."""
        self.refresh_pending = False
        self.net.refresh(self.env.now)
        self._reschedule()

    def _on_wake(self, event: simpy.Event) -> None:
        if event.value != self.wake_version:
            return
        self.wake_at = -1.0
        done = self.net.finish_due(self.env.now)
        flow_done = self.flow_done
        for fid in done:
            flow_done.pop(fid)()
        self._reschedule()

    def change_links_at(self, at_s: float, capacity_Bps: Mapping[int, float]) -> None:
        """From ``at_s`` on, links (by index) carry new bandwidths, flows in flight re-rated
        (:meth:`sim.network.FlowNetwork.set_capacity`); a bandwidth of 0 is a failure
        (:meth:`_fail_links`)."""
        if any(bps == 0 for bps in capacity_Bps.values()) and self.flow_ends is None:
            self.flow_ends = {}
        self._after(at_s, self._change_links, capacity_Bps)

    def _change_links(self, event: simpy.Event) -> None:
        changes: Mapping[int, float] = event.value
        failed = [link for link, bps in changes.items() if bps == 0]
        degraded = {link: bps for link, bps in changes.items()
                    if bps != 0 and link not in self.failed}
        if degraded:
            self.net.set_capacity(self.env.now, degraded)
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
            self.net.reroute(self.env.now, moves)

    def _flow(self, links: tuple[int, ...], nbytes: float, on_done: Callable[[], None],
              ends: tuple[Endpoint, Endpoint]) -> None:
        """Start a fair-shared flow from ``ends[0]`` to ``ends[1]`` over ``links`` now;
        ``on_done()`` when its last byte arrives."""
        fid = self.flows
        self.flows += 1
        if self.flow_ends is None:
            self.flow_done[fid] = on_done
        else:
            self.flow_ends[fid] = ends

            def done() -> None:
                del self.flow_ends[fid]  # type: ignore[union-attr]
                on_done()

            self.flow_done[fid] = done
        self.net.start(self.env.now, fid, links, nbytes)
        if not self.refresh_pending:
            self.refresh_pending = True
            self._after(0, self._refresh)

    # ------------------------------------------------------------------ memory

    def _mem(self, gpu: int, delta: float) -> None:
        if delta:
            self.mem_now[gpu] += delta
            self.memory.append((gpu, self.env.now, len(self.memory), self.mem_now[gpu]))

    # ------------------------------------------------------------------ instructions

    def _start_compute(self, i: int, ins: Compute) -> None:
        self.started[i] = self.env.now
        if ins.alloc_bytes:
            self._mem(ins.gpu, ins.alloc_bytes)
        duration = self.timer(ins)
        total = duration + ins.blocking_comm_s
        if total > 0:
            self._after(total, self._end_compute, (i, ins, duration))
        else:
            self._finish_compute(i, ins, duration)

    def _end_compute(self, event: simpy.Event) -> None:
        self._finish_compute(*event.value)

    def _finish_compute(self, i: int, ins: Compute, duration: float) -> None:
        start, now = self.started[i], self.env.now
        if ins.free_bytes:
            self._mem(ins.gpu, -ins.free_bytes)
        spans = self.spans
        spans.append((ins.gpu, "compute", start, start + duration, len(spans), ins.kind, ins.name,
                      ins.stage, ins.mb))
        if ins.blocking_comm_s > 0:
            kind = ins.blocking_comm_kind
            spans.append((ins.gpu, kind, start + duration, now, len(spans), kind,
                          f"{ins.name} {kind}", ins.stage, ins.mb))
        self._complete(i)

    def _start_send(self, i: int, ins: Send) -> None:
        self.started[i] = self.env.now
        if ins.duration_s is not None:  # precomputed (collapsed simulation)
            self._after(ins.duration_s, self._end_send, (i, ins))
            return
        route = self.route(ins.gpu, ins.dst)
        if route.latency_s > 0:
            self._after(route.latency_s, self._send_flow, (i, ins, route.links, self.epoch))
        else:
            self._send_flow_now(i, ins, route.links)

    def _send_flow(self, event: simpy.Event) -> None:
        i, ins, links, epoch = event.value
        if epoch != self.epoch:  # links failed during the latency: the new route
            links = self.route(ins.gpu, ins.dst).links
        self._send_flow_now(i, ins, links)

    def _send_flow_now(self, i: int, ins: Send, links: tuple[int, ...]) -> None:
        """Route latency has passed: the message's bytes as one flow."""
        if ins.nbytes > 0 and links:
            self._flow(links, ins.nbytes, lambda: self._finish_send(i, ins), (ins.gpu, ins.dst))
        else:
            self._finish_send(i, ins)

    def _end_send(self, event: simpy.Event) -> None:
        self._finish_send(*event.value)

    def _finish_send(self, i: int, ins: Send) -> None:
        start, end = self.started[i], self.env.now
        spans = self.spans
        k = len(spans)
        spans.append((ins.gpu, ins.stream, start, end, k, ins.kind, ins.name, ins.stage, ins.mb))
        spans.append((ins.dst, f"recv<{ins.gpu}", start, end, k + 1, ins.kind, ins.name,
                      ins.stage, ins.mb))
        self.arrows.append((k, k + 1))
        self._complete(i)

    def _arrive(self, i: int, ins: Collective) -> None:
        """A member reaches collective ``ins``; the last one to arrive starts it."""
        self.started[i] = self.env.now
        members = self.members.setdefault(ins.key, [])
        members.append(i)
        if len(members) < len(ins.group):
            return
        key = ins.key
        self.collective_start[key] = self.env.now
        if ins.duration_s is not None:  # precomputed (collapsed simulation)
            self._after(ins.duration_s, self._end_collective, key)
        elif self.cluster.collective_launch_s > 0:
            self._after(self.cluster.collective_launch_s, self._launched, ins)
        else:
            self._run_collective(ins)

    def _launched(self, event: simpy.Event) -> None:
        self._run_collective(event.value)

    def _run_collective(self, ins: Collective) -> None:
        steps = self._collective_plan(ins)
        key = ins.key
        if steps:
            self._run_plan(steps, lambda: self._finish_collective(key))
        else:
            self._finish_collective(key)

    def _end_collective(self, event: simpy.Event) -> None:
        self._finish_collective(event.value)

    def _finish_collective(self, key: int) -> None:
        start, now = self.collective_start.pop(key), self.env.now
        instrs, spans = self.program.instructions, self.spans
        members = self.members.pop(key)
        for i in members:
            ins = instrs[i]
            spans.append((ins.gpu, ins.stream, start, now, len(spans), ins.kind, ins.name,
                          ins.stage, ins.mb))
        for i in members:
            self._complete(i)

    def _collective_plan(self, ins: Collective) -> tuple[Transfer, ...]:
        """The plan of ``ins`` (:func:`collective_plan`), cached per run."""
        key = (ins.op, ins.algo, ins.group, ins.nbytes)
        steps = self._plans.get(key)
        if steps is None:
            steps = self._plans[key] = collective_plan(self.topology, ins.op, ins.algo,
                                                       ins.group, ins.nbytes, self._profiles)
        return steps

    def _run_plan(self, steps: tuple[Transfer, ...], done: Callable[[], None]) -> None:
        """Run a plan's transfers as their dependencies arrive; call ``done()`` after the last."""
        compiled = self._compiled.get(id(steps))
        if compiled is None:
            compiled = self._compiled[id(steps)] = _CompiledPlan(self.topology, steps,
                                                                 self.route, self.epoch)
        _PlanRun(self, compiled, done).begin()

    # ------------------------------------------------------------------ run

    def run(self, queue: bool = False) -> Timeline:
        """Execute the program. Without transfers on the network (every send and collective
        has a precomputed duration, as in a collapsed program) and unless ``queue``, by the
        exact queue-free pass :meth:`_run_fixed`; else on the SimPy event queue."""
        instrs = self.program.instructions
        if not queue and isinstance(instrs, ColumnarInstructions):
            fast = run_columns(instrs.columns, self.timer, self.program.static_bytes, self.gpus)
            if fast is not None:
                return self._deferred(fast)
        if not queue and all(type(ins) is Compute or ins.duration_s is not None
                             for ins in instrs):
            if not self._run_in_order():
                self._build_dag(self.program)
                self._run_fixed()
            self._check_finished(self.clock)
            return self._timeline()
        self._build_dag(self.program)
        self.ready.extend(i for i, w in enumerate(self.waiting) if not w)
        self._drain()
        self.env.run()
        self._check_finished(self.env.now)
        return self._timeline()

    def _deferred(self, fast: ColumnarPass) -> Timeline:
        """The outcome of the in-order pass as :func:`sim.columnar.run_columns` worked it out
        on a columnar program; the timeline's records are left to that pass, run on the
        instruction objects when they are first read (:meth:`Timeline.deferred`)."""
        self.started, self.ended = fast.ready_s, fast.end_s  # type: ignore[assignment]
        self.cause, self.intervals = fast.cause, fast.intervals
        self.events, self.clock = fast.events, fast.clock
        self.arrays = (fast.ready_a, fast.end_a)
        self.completed = len(fast.end_s)
        program, cluster, timer, ends = self.program, self.cluster, self.timer, fast.end_s

        def records() -> tuple[tuple[Span, ...], tuple[FlowArrow, ...],
                               tuple[MemorySample, ...]]:
            with gc_paused():
                run = _Run(program, cluster, timer)
                if not run._run_in_order() or run.ended != ends:
                    raise AssertionError("the columnar pass and the in-order pass differ")
                timeline = run._timeline()
                return timeline.spans, timeline.flows, timeline.memory

        return Timeline.deferred(program.num_gpus, records, program.gpu_names, self.gpus,
                                 end_s=fast.clock if fast.clock > 0 else None,
                                 peak_memory_by_gpu=fast.peak_bytes,
                                 memory_floor_by_gpu=fast.floor_bytes)

    def _run_in_order(self) -> bool:
        """:meth:`_run_fixed` in one pass over the instructions in id order, if that order runs.

        In a lowered program every instruction comes after its dependencies and
        its stream predecessor, and a collective's members come before anything
        that waits on them. Then each instruction's ready time is known when the
        pass reaches it, and the pass computes, with the same floating-point
        operations, exactly what :meth:`_run_fixed` computes in its topological
        order, without successor lists, counters or queue (a GPU's memory changes
        in program order of its compute stream either way). Records go straight
        into per-stream lanes (:meth:`_assemble`). Returns False, having recorded
        nothing, as soon as an instruction waits on one not yet finished (the
        caller then runs :meth:`_run_fixed`, which also reports deadlocks).
        """
        instrs, timer = self.program.instructions, self.timer
        n = len(instrs)
        end: list[float | None] = [None] * n
        ready = [0.0] * n
        cause = [-1] * n
        mem_now = list(self.mem_now)
        lanes: dict[tuple[int, str], list[tuple]] = {}
        """(GPU, stream) -> (start, end, creation order, Span) records: the collective streams,
        which the blocking communication of compute ops joins out of order"""
        plain: dict[tuple[int, str], list[Span]] = {}
        """(GPU, stream) -> spans, of the streams whose spans come in order (compute, send,
        receive: one stream's instructions in program order, each starting after the
        previous ended; a negative duration, which would break that, declines the pass)"""
        compute_lane: list[list[Span] | None] = [None] * len(mem_now)
        ivals: dict[tuple[int, str], array[float]] = {}  # see InstructionTimes.intervals
        busy: list[array[float]] = [array("d") for _ in mem_now]  # per GPU, compute intervals
        folds: list[tuple | None] = [None] * len(mem_now)
        """per GPU, (kind, lane, intervals) of its latest blocking communication"""
        comm_kinds = _COMM_KINDS
        last_compute = [-1] * len(mem_now)  # per GPU, its compute stream's latest instruction
        streams: dict[tuple[int, object], list] = {}
        """(GPU, dst) of a send stream or (GPU, kind) of a collective one -> [latest id, lane,
        stream name, intervals]: a collective stream's interval array (None for a kind outside
        COMM_KINDS), a send stream's (sender's array, receiver's array, kind) of its last
        message's kind (None before its first message of a communication kind)"""
        recv_lane: dict[tuple[int, int], list] = {}  # (GPU, dst) -> [lane, name] at dst
        memory: dict[int, list[tuple[float, int, float]]] = {}
        arrows: list[tuple[tuple[int, str], tuple[int, str]]] = []
        """(send lane, receive lane) pairs: their spans pair up in order"""
        arrived: dict[int, list[tuple[int, list]]] = {}
        new = tuple.__new__  # a record's Span, built without Python-level __new__
        events = 0
        clock = 0.0
        for ins in instrs:
            # each kind's fields unpacked at once (instructions are named tuples)
            cls = type(ins)
            if cls is Compute:
                (i, g, kind, name, deps, _, _, _, _, _, _, blocking, comm, alloc, free, stage,
                 mb) = ins
                prev = last_compute[g]
                last_compute[g] = i
            elif cls is Send:
                i, g, dst, _, kind, name, deps, stage, mb, fixed = ins
                stream = streams.get((g, dst))
                if stream is None:
                    lane_name = f"send>{dst}"
                    stream = streams[(g, dst)] = [-1, plain.setdefault((g, lane_name), []),
                                                  lane_name, None]
                prev = stream[0]
                stream[0] = i
            else:
                i, g, kind, name, deps, _, _, group, _, key, stage, mb, fixed = ins
                stream = streams.get((g, kind))
                if stream is None:
                    stream = streams[(g, kind)] = [-1, lanes.setdefault((g, kind), []), kind,
                                                   ivals.setdefault((g, kind), array("d"))
                                                   if kind in comm_kinds else None]
                prev = stream[0]
                stream[0] = i
            t = 0.0
            # the latest-finishing predecessor, the stream predecessor first among equals
            # (InstructionTimes.cause)
            latest, latest_end = prev, -1.0
            if prev >= 0:
                e = end[prev]
                if e is None:
                    return False
                latest_end = e
                if e > t:
                    t = e
            for d in deps:
                e = end[d] if d < i else None
                if e is None:
                    return False
                if e > latest_end:
                    latest, latest_end = d, e
                if e > t:
                    t = e
            ready[i] = t
            cause[i] = latest
            if cls is Compute:
                duration = timer(ins)
                if duration < 0 or blocking < 0:
                    return False
                total = duration + blocking
                if total > 0:
                    stop = t + total
                    events += 1
                else:
                    stop = t
                if alloc or free:  # samples already in (time, creation) order: see below
                    samples = memory.get(g)
                    if samples is None:
                        samples = memory[g] = []
                    if alloc:
                        mem_now[g] += alloc
                        samples.append(new(MemorySample, (g, t, mem_now[g])))
                    if free:
                        mem_now[g] -= free
                        samples.append(new(MemorySample, (g, stop, mem_now[g])))
                own = compute_lane[g]
                if own is None:
                    own = compute_lane[g] = plain.setdefault((g, "compute"), [])
                    ivals[(g, "compute")] = busy[g]
                mid = t + duration
                own.append(new(Span, (g, "compute", kind, name, t, mid, stage, mb)))
                on = busy[g]
                on.append(t)
                on.append(mid)
                if kind in comm_kinds:
                    ivals.setdefault((g, kind), array("d")).extend((t, mid))
                if blocking > 0:
                    fold = folds[g]
                    if fold is None or fold[0] != comm:  # the lane of (g, comm) and its intervals
                        lane = lanes.get((g, comm))
                        if lane is None:
                            lane = lanes[(g, comm)] = []
                        iv = ivals.get((g, comm))
                        if iv is None and comm in comm_kinds:
                            iv = ivals[(g, comm)] = array("d")
                        fold = folds[g] = (comm, lane, iv)
                    fold[1].append((mid, stop, 4 * i + 1, new(
                        Span, (g, comm, comm, f"{name} {comm}", mid, stop, stage, mb))))
                    if fold[2] is not None:
                        fold[2].append(mid)
                        fold[2].append(stop)
                end[i] = stop
            elif cls is Send:
                if fixed < 0:
                    return False
                stop = t + fixed
                events += 1
                stream[1].append(new(Span, (g, stream[2], kind, name, t, stop, stage, mb)))
                other = recv_lane.get((g, dst))
                if other is None:
                    recv = f"recv<{g}"
                    other = recv_lane[(g, dst)] = [plain.setdefault((dst, recv), []), recv]
                    arrows.append(((g, stream[2]), (dst, recv)))  # k-th send -> k-th receive
                other[0].append(new(Span, (dst, other[1], kind, name, t, stop, stage, mb)))
                if kind in comm_kinds:
                    if stream[3] is None or stream[3][2] != kind:  # first, or a new kind
                        stream[3] = (ivals.setdefault((g, kind), array("d")),
                                     ivals.setdefault((dst, kind), array("d")), kind)
                    mine, theirs, _ = stream[3]
                    mine.append(t)
                    mine.append(stop)
                    theirs.append(t)
                    theirs.append(stop)
                end[i] = stop
            elif len(group) == 1:  # a collective of one starts when its member arrives
                stop = t + fixed
                events += 1
                stream[1].append((t, stop, 4 * i, new(Span, (
                    g, kind, kind, name, t, stop, stage, mb))))
                if stream[3] is not None:
                    stream[3].append(t)
                    stream[3].append(stop)
                end[i] = stop
            else:
                members = arrived.get(key)
                if members is None:
                    members = arrived[key] = []
                members.append((i, stream))
                if len(members) < len(group):
                    continue
                del arrived[key]
                start = max(ready[j] for j, _ in members)
                # every member waits for the member that arrived last (the first among equals)
                first = cause[max(members, key=lambda x: (ready[x[0]], -x[0]))[0]]
                for j, _ in members:
                    cause[j] = first
                stop = start + fixed
                events += 1
                for j, lane in members:
                    m = instrs[j]
                    lane[1].append((start, stop, 4 * j, new(Span, (
                        m.gpu, lane[2], m.kind, m.name, start, stop, m.stage, m.mb))))
                    if lane[3] is not None:
                        lane[3].append(start)
                        lane[3].append(stop)
                    end[j] = stop
            if stop > clock:
                clock = stop
        if arrived:  # a collective some member never reached: let _run_fixed report it
            return False
        # A GPU's samples come from its compute stream in program order, each op starting
        # after the previous one ended and freeing at or after it allocated (durations are
        # not negative here): their times never decrease, so the (time, creation order) in
        # which the timeline keeps them is the order they came in. The static sample at
        # time 0, created first, goes first.
        for g, t, _, b in self.memory:
            memory.setdefault(g, []).insert(0, new(MemorySample, (g, t, b)))
        self.lanes, self.memory_lanes = lanes, memory
        self.memory_in_order = True
        self.plain_lanes, self.lane_arrows = plain, arrows
        self.intervals = ivals
        self.mem_now = mem_now
        self.finished = bytearray(b"\x01") * n
        self.completed = n
        self.started, self.ended = ready, end  # type: ignore[assignment]
        self.cause = cause
        self.events = events
        self.clock = clock
        return True

    def _run_fixed(self) -> None:
        """Execute a program whose every duration is known up front, without an event queue.

        Nothing shares bandwidth, so an instruction starts exactly when its last
        predecessor (dependency or stream predecessor) ends, a collective when
        its last member arrives, and ends ``duration`` later: the longest-path
        recurrence of the DAG, evaluated in topological order with the same
        floating-point operations the event queue performs (``start + delay``).
        Records get the event queue's order where it matters: memory samples of
        a GPU in program order of its compute stream, span ties in instruction
        order. ``events`` counts the SimPy events the queue would have processed.
        """
        instrs, succ, waiting = self.program.instructions, self.succ, self.waiting
        finished, timer, spans, memory = self.finished, self.timer, self.spans, self.memory
        mem_now, arrows, ended = self.mem_now, self.arrows, self.ended
        ready_at = [0.0] * len(instrs)
        queue = deque(i for i, w in enumerate(waiting) if not w)
        arrived: dict[int, list[int]] = {}
        events = completed = 0
        clock = 0.0
        while queue:
            i = queue.popleft()
            ins = instrs[i]
            start = ready_at[i]
            if isinstance(ins, Compute):
                g = ins.gpu
                if ins.alloc_bytes:
                    mem_now[g] += ins.alloc_bytes
                    memory.append((g, start, 2 * i, mem_now[g]))
                duration = timer(ins)
                total = duration + ins.blocking_comm_s
                if total > 0:
                    end = start + total
                    events += 1
                else:
                    end = start
                if ins.free_bytes:
                    mem_now[g] -= ins.free_bytes
                    memory.append((g, end, 2 * i + 1, mem_now[g]))
                spans.append((g, "compute", start, start + duration, 4 * i, ins.kind, ins.name,
                              ins.stage, ins.mb))
                if ins.blocking_comm_s > 0:
                    comm = ins.blocking_comm_kind
                    spans.append((g, comm, start + duration, end, 4 * i + 1, comm,
                                  f"{ins.name} {comm}", ins.stage, ins.mb))
                done = (i,)
            elif isinstance(ins, Send):
                assert ins.duration_s is not None
                end = start + ins.duration_s
                events += 1
                spans.append((ins.gpu, ins.stream, start, end, 4 * i, ins.kind, ins.name,
                              ins.stage, ins.mb))
                spans.append((ins.dst, f"recv<{ins.gpu}", start, end,
                              4 * i + 1, ins.kind, ins.name, ins.stage, ins.mb))
                arrows.append((4 * i, 4 * i + 1))
                done = (i,)
            else:
                assert ins.duration_s is not None
                members = arrived.setdefault(ins.key, [])
                members.append(i)
                if len(members) < len(ins.group):
                    continue
                del arrived[ins.key]
                start = max(ready_at[j] for j in members)
                end = start + ins.duration_s
                events += 1
                for j in members:
                    m = instrs[j]
                    spans.append((m.gpu, m.stream, start, end, 4 * j, m.kind, m.name, m.stage,
                                  m.mb))
                done = tuple(members)
            if end > clock:
                clock = end
            for j in done:
                finished[j] = 1
                completed += 1
                ended[j] = end
                for k in succ[j]:
                    if end > ready_at[k]:
                        ready_at[k] = end
                    left = waiting[k] - 1
                    waiting[k] = left
                    if not left:
                        queue.append(k)
        self.members = arrived
        self.started = ready_at
        self.events = events
        self.completed = completed
        self.clock = clock

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

    def _timeline(self) -> Timeline:
        """Spans sorted by (gpu, stream, start, end, creation order); memory by (gpu, time)."""
        lanes = self.lanes
        if lanes is None:  # flat records (event queue, _run_fixed): into lanes
            lanes = {}
            new = tuple.__new__
            ivals: dict[tuple[int, str], array[float]] = {}  # see InstructionTimes.intervals
            comm_kinds = _COMM_KINDS
            for g, stream, start, end, k, kind, name, stage, mb in self.spans:
                rec = (start, end, k, new(Span, (g, stream, kind, name, start, end, stage, mb)))
                lane = lanes.get((g, stream))
                if lane is None:
                    lanes[(g, stream)] = [rec]
                else:
                    lane.append(rec)
                if stream == "compute":
                    on = ivals.get((g, stream))
                    if on is None:
                        on = ivals[(g, stream)] = array("d")
                    on.append(start)
                    on.append(end)
                if kind in comm_kinds:
                    on = ivals.get((g, kind))
                    if on is None:
                        on = ivals[(g, kind)] = array("d")
                    on.append(start)
                    on.append(end)
            self.intervals = ivals
            memory: dict[int, list[tuple[float, int, float]]] = {}
            for g, t, k, b in self.memory:
                memory.setdefault(g, []).append((t, k, b))
        else:
            memory = self.memory_lanes
        return self._assemble(lanes, memory)

    def _assemble(self, lanes: dict[tuple[int, str], list[tuple]],
                  memory: dict[int, list[tuple[float, int, float]]]) -> Timeline:
        """The timeline from per-stream records ``(start, end, creation order, span)`` and
        per-GPU memory samples ``(time, creation order, bytes)``; with the in-order pass,
        also the streams whose spans came in order (:attr:`plain_lanes`).

        Records of one stream mostly come in start order already (program order),
        so sorting each stream's list costs about one comparison per record, where
        sorting them all together would cost a logarithm more; the result is the
        same total order (gpu, stream, start, end, creation order).
        """
        spans: list[Span] = []
        position: dict[int, int] = {}  # creation order -> index, for records with arrows
        base: dict[tuple[int, str], int] = {}  # a plain lane's first index
        plain = self.plain_lanes
        order_of, span_of = itemgetter(2), itemgetter(3)
        for key in sorted(lanes.keys() | plain.keys()) if plain else sorted(lanes):
            own = plain.get(key)
            if own is not None:
                base[key] = len(spans)
                spans.extend(own)
                continue
            recs = lanes[key]
            recs.sort()
            if self.arrows and key[1][:5] in ("send>", "recv<"):
                position.update(zip(map(order_of, recs), range(len(spans), len(spans) + len(recs)),
                                    strict=True))
            spans.extend(map(span_of, recs))
        pairs = [(position[s], position[r]) for s, r in self.arrows]
        for send, recv in self.lane_arrows:
            first, n = base[recv], len(plain[send])
            pairs.extend(zip(range(base[send], base[send] + n), range(first, first + n),
                             strict=True))
        lanes.clear()  # the records die here, before the collector is back (simulate_program)
        arrows = tuple(map(partial(tuple.__new__, FlowArrow), sorted(pairs)))
        samples: list[MemorySample] = []
        make_sample = partial(tuple.__new__, MemorySample)
        peaks: dict[int, float] = {}
        for g, recs in sorted(memory.items()):
            if self.memory_in_order:
                samples.extend(recs)
                peaks[g] = max(map(_BYTES, recs))
                continue
            recs.sort()
            times, _, sizes = zip(*recs, strict=True)
            samples.extend(map(make_sample, zip(repeat(g, len(recs)), times, sizes, strict=True)))
            peaks[g] = max(sizes)
        # what the timeline's cached properties would work out in a pass over its records,
        # known here: the peak of each GPU's samples and, after the queue-free pass, the
        # makespan (every span ends by its instruction's end, the latest of which is the
        # clock, and that instruction's last span ends then)
        return Timeline.known(self.program.num_gpus, tuple(spans), arrows, tuple(samples),
                              self.program.gpu_names, self.gpus,
                              end_s=self.clock if self.lanes is not None and self.clock > 0
                              else None,
                              peak_memory_by_gpu=peaks)

    def counters(self, out: EngineCounters) -> None:
        out.events = self.events
        out.instructions = len(self.program.instructions)
        out.flows = self.flows
        out.rate_recomputations = self.net.recomputations
        out.rerated_flows = self.net.rerated_flows


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
    A program without network transfers (all durations precomputed, as a
    collapsed one) runs without the event queue unless ``event_queue`` (the
    result is the same; the flag exists to check that). ``times``, if given, is filled
    with each instruction's ready and end times. ``link_changes``: ``(at_s, {link index:
    bandwidth_Bps})`` pairs, links degraded (or restored) in the middle of the run; the
    flows then in flight are re-rated (precomputed durations are not affected). A
    bandwidth of 0 fails the link: flows in flight across it continue on the route of the
    cluster without it, and later transfers take such routes (:meth:`_Run._fail_links`).
    """
    if program.num_gpus > cluster.num_gpus:
        raise ValueError(f"program needs {program.num_gpus} GPUs, cluster has {cluster.num_gpus}")
    with gc_paused():
        run = _Run(program, cluster, timer)
        for at_s, capacity in link_changes:
            run.change_links_at(at_s, capacity)
        try:
            timeline = run.run(queue=event_queue or bool(link_changes))
            if times is not None:
                times.ready_s, times.end_s = run.started, run.ended
                times.intervals, times.cause = run.intervals, run.cause
                times.arrays = run.arrays
            return timeline
        finally:
            if counters is not None:
                run.counters(counters)
