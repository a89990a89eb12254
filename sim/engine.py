"""The discrete-event engine: executes per-rank programs on a cluster. The only SimPy user.

One SimPy process per (GPU, stream), like CUDA streams: each runs its
instructions in program order, each instruction once its dependencies have
completed. Compute takes its device-model time; sends and collectives become
flows on the flow-level network (:mod:`sim.network`), which shares link
bandwidth max-min fairly and adds each hop's latency. The engine never chooses
order and never computes statistics: it records a :class:`~sim.timeline.Timeline`.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Generator

import simpy

from sim.collectives import AUTO, Transfer, group_profile, resolve_algorithm
from sim.collectives import plan as plan_collective
from sim.errors import DeadlockError
from sim.network import FlowNetwork
from sim.timeline import FlowArrow, MemorySample, Span, Timeline
from topologies.cluster import Cluster
from workloads.program import Collective, Compute, Instruction, Program, Send

ComputeTimer = Callable[[Compute], float]


class _Run:
    """State of one simulation; discarded after :func:`simulate_program` returns."""

    def __init__(self, program: Program, cluster: Cluster, timer: ComputeTimer) -> None:
        self.env = simpy.Environment()
        self.program = program
        self.cluster = cluster
        self.timer = timer
        self.net = FlowNetwork(cluster.link_bandwidth_Bps)
        self.done = [self.env.event() for _ in program.instructions]
        self.flow_events: dict[int, simpy.Event] = {}
        self.next_flow = 0
        self.wake_version = 0
        self.refresh_pending = False
        self.arrivals: dict[int, list[int]] = defaultdict(list)
        self.collective_done: dict[int, simpy.Event] = {}
        self.collective_start: dict[int, float] = {}
        self.spans: list[Span] = []
        self.arrows: list[tuple[int, int]] = []
        self.mem_now = list(program.static_bytes)
        self.gpus = (tuple(range(program.num_gpus)) if program.simulated_gpus is None
                     else program.simulated_gpus)
        self.memory = [MemorySample(g, 0.0, program.static_bytes[g]) for g in self.gpus]
        self.position: dict[tuple[int, str], int] = {}
        self.streams: dict[tuple[int, str], list[Instruction]] = defaultdict(list)
        for ins in program.instructions:
            self.streams[(ins.gpu, ins.stream)].append(ins)

    # ------------------------------------------------------------------ network

    def _reschedule(self) -> None:
        t_end = self.net.next_end_s()
        if math.isinf(t_end):
            return
        self.wake_version += 1
        version = self.wake_version
        wake = self.env.timeout(max(0.0, t_end - self.env.now))
        wake.callbacks.append(lambda _ev: self._on_wake(version))

    def _refresh(self, _event: simpy.Event) -> None:
        """Recompute rates once for all flows that started at this instant."""
        self.refresh_pending = False
        self.net.refresh(self.env.now)
        self._reschedule()

    def _on_wake(self, version: int) -> None:
        if version != self.wake_version:
            return
        for fid in self.net.finish_due(self.env.now):
            self.flow_events.pop(fid).succeed()
        self._reschedule()

    def transfer(self, src: int, dst: int, nbytes: float) -> Generator:
        """Move ``nbytes`` from GPU src to GPU dst: route latency, then a fair-shared flow."""
        route = self.cluster.route(src, dst)
        if route.latency_s > 0:
            yield self.env.timeout(route.latency_s)
        if nbytes > 0 and route.links:
            fid = self.next_flow
            self.next_flow += 1
            event = self.env.event()
            self.flow_events[fid] = event
            self.net.start(self.env.now, fid, route.links, nbytes)
            if not self.refresh_pending:
                self.refresh_pending = True
                self.env.timeout(0).callbacks.append(self._refresh)
            yield event

    # ------------------------------------------------------------------ memory

    def _mem(self, gpu: int, delta: float) -> None:
        if delta:
            self.mem_now[gpu] += delta
            self.memory.append(MemorySample(gpu, self.env.now, self.mem_now[gpu]))

    # ------------------------------------------------------------------ instructions

    def _compute(self, ins: Compute) -> Generator:
        start = self.env.now
        self._mem(ins.gpu, ins.alloc_bytes)
        duration = self.timer(ins)
        if duration + ins.blocking_comm_s > 0:
            yield self.env.timeout(duration + ins.blocking_comm_s)
        self._mem(ins.gpu, -ins.free_bytes)
        self.spans.append(Span(ins.gpu, "compute", ins.kind, ins.name, start, start + duration,
                               ins.stage, ins.mb))
        if ins.blocking_comm_s > 0:
            self.spans.append(Span(ins.gpu, ins.blocking_comm_kind, ins.blocking_comm_kind,
                                   f"{ins.name} {ins.blocking_comm_kind}", start + duration,
                                   self.env.now, ins.stage, ins.mb))

    def _send(self, ins: Send) -> Generator:
        start = self.env.now
        if ins.duration_s is not None:  # precomputed (collapsed simulation)
            yield self.env.timeout(ins.duration_s)
        else:
            yield from self.transfer(ins.gpu, ins.dst, ins.nbytes)
        end = self.env.now
        self.spans.append(Span(ins.gpu, ins.stream, ins.kind, ins.name, start, end, ins.stage,
                               ins.mb))
        self.spans.append(Span(ins.dst, f"recv<{ins.gpu}", ins.kind, ins.name, start, end,
                               ins.stage, ins.mb))
        self.arrows.append((len(self.spans) - 2, len(self.spans) - 1))

    def _run_collective(self, ins: Collective, finished: simpy.Event) -> Generator:
        if self.cluster.collective_launch_s > 0:
            yield self.env.timeout(self.cluster.collective_launch_s)
        steps = self._collective_plan(ins)
        if steps:
            done = self.env.event()
            self._run_plan(steps, done)
            yield done
        finished.succeed()

    def _collective_plan(self, ins: Collective) -> tuple[Transfer, ...]:
        """The plan of ``ins``: the cluster's per-op override, else the instruction's algorithm;
        ``auto`` picks NCCL-like (:func:`sim.collectives.select_algorithm`). Cached per run."""
        cache: dict = self.__dict__.setdefault("_plans", {})
        key = (ins.op, ins.algo, ins.group, ins.nbytes)
        steps = cache.get(key)
        if steps is None:
            c = self.cluster
            algo = c.collective_algos.get(ins.op, ins.algo)
            profile = group_profile(c, ins.group) if algo in (AUTO, "nvls") else None
            algo = resolve_algorithm(ins.op, algo, ins.nbytes, profile)
            host_of = {r: c.host_of(r) for r in ins.group} if algo == "hierarchical" else None
            steps = plan_collective(ins.op, algo, ins.group, ins.nbytes, host_of=host_of,
                                    nvswitch=profile.nvswitch if profile else None,
                                    granularity=c.collective_granularity,
                                    latency=lambda a, b: c.route(a, b).latency_s)
            cache[key] = steps
        return steps

    def _run_plan(self, steps: tuple[Transfer, ...], done: simpy.Event) -> None:
        """Run a plan's transfers as their dependencies arrive; succeed ``done`` after the last.

        Driven by callbacks, not one SimPy process per transfer, and arrivals are
        drained from a queue, so long zero-time chains do not recurse.
        """
        waiting = [len(s.deps) for s in steps]
        dependents: list[list[int]] = [[] for _ in steps]
        for i, s in enumerate(steps):
            for d in s.deps:
                dependents[d].append(i)
        left = [len(steps)]
        queue: deque[int] = deque()
        draining = [False]

        def arrive(i: int) -> None:
            queue.append(i)
            if draining[0]:
                return
            draining[0] = True
            while queue:
                j = queue.popleft()
                left[0] -= 1
                for k in dependents[j]:
                    waiting[k] -= 1
                    if waiting[k] == 0:
                        self._run_step(steps[k], k, arrive)
            draining[0] = False
            if left[0] == 0:
                done.succeed()

        for i, s in enumerate(steps):
            if not s.deps:
                self._run_step(s, i, arrive)

    def _run_step(self, step: Transfer, index: int, arrive: Callable[[int], None]) -> None:
        """Start one transfer: its latency (the plan's, else ``steps`` x the route's) plus
        ``steps`` x the cluster's per-step latency, then its flow."""
        route = self.cluster.route(step.src, step.dst)
        hops = step.steps * route.latency_s if step.latency_s is None else step.latency_s
        latency = hops + step.steps * self.cluster.collective_step_s

        def start(_event: simpy.Event | None = None) -> None:
            if step.nbytes > 0 and route.links:
                fid = self.next_flow
                self.next_flow += 1
                event = self.env.event()
                event.callbacks.append(lambda _ev: arrive(index))
                self.flow_events[fid] = event
                self.net.start(self.env.now, fid, route.links, step.nbytes)
                if not self.refresh_pending:
                    self.refresh_pending = True
                    self.env.timeout(0).callbacks.append(self._refresh)
            else:
                arrive(index)

        if latency > 0:
            self.env.timeout(latency).callbacks.append(start)
        else:
            start()

    def _collective(self, ins: Collective) -> Generator:
        members = self.arrivals[ins.key]
        members.append(ins.gpu)
        finished = self.collective_done.setdefault(ins.key, self.env.event())
        if len(members) == len(ins.group):
            self.collective_start[ins.key] = self.env.now
            if ins.duration_s is not None:  # precomputed (collapsed simulation)
                self.env.timeout(ins.duration_s).callbacks.append(
                    lambda _ev: finished.succeed())
            else:
                self.env.process(self._run_collective(ins, finished))
        yield finished
        self.spans.append(Span(ins.gpu, ins.stream, ins.kind, ins.name,
                               self.collective_start[ins.key], self.env.now, ins.stage, ins.mb))

    def stream_process(self, key: tuple[int, str]) -> Generator:
        for i, ins in enumerate(self.streams[key]):
            self.position[key] = i
            pending = [self.done[d] for d in ins.deps if not self.done[d].triggered]
            if len(pending) == 1:
                yield pending[0]
            elif pending:
                yield self.env.all_of(pending)
            if isinstance(ins, Compute):
                yield from self._compute(ins)
            elif isinstance(ins, Send):
                yield from self._send(ins)
            else:
                yield from self._collective(ins)
            self.done[ins.id].succeed()
        self.position[key] = len(self.streams[key])

    # ------------------------------------------------------------------ run

    def run(self) -> Timeline:
        for key in self.streams:
            self.env.process(self.stream_process(key))
        self.env.run()
        self._check_finished()
        return self._timeline()

    def _check_finished(self) -> None:
        stalled = []
        for key, instrs in self.streams.items():
            pos = self.position.get(key, 0)
            if pos < len(instrs):
                ins = instrs[pos]
                instrs_all = self.program.instructions
                waits = [f"{instrs_all[d].name}@gpu{instrs_all[d].gpu}"
                         for d in ins.deps if not self.done[d].triggered]
                if isinstance(ins, Collective) and not waits:
                    missing = sorted(set(ins.group) - set(self.arrivals[ins.key]))
                    waits = [f"collective members {missing}"]
                stalled.append(f"gpu{key[0]}/{key[1]}: {ins.name} waits on {', '.join(waits)}")
        if stalled:
            shown = "; ".join(stalled[:12])
            more = f" (+{len(stalled) - 12} more)" if len(stalled) > 12 else ""
            raise DeadlockError(f"simulation stalled at t={self.env.now:.6g}s: {shown}{more}")

    def _timeline(self) -> Timeline:
        order = sorted(range(len(self.spans)), key=lambda i: (
            self.spans[i].gpu, self.spans[i].stream, self.spans[i].start_s, self.spans[i].end_s, i))
        new_index = {old: new for new, old in enumerate(order)}
        spans = tuple(self.spans[i] for i in order)
        arrows = tuple(FlowArrow(s, r) for s, r in sorted(
            (new_index[s], new_index[r]) for s, r in self.arrows))
        memory = tuple(sorted(self.memory, key=lambda m: (m.gpu, m.time_s)))
        return Timeline(self.program.num_gpus, spans, arrows, memory, self.program.gpu_names,
                        self.gpus)


def simulate_program(program: Program, cluster: Cluster, timer: ComputeTimer) -> Timeline:
    """Run ``program`` on ``cluster``; ``timer`` gives each compute op's duration in seconds.

    Raises :class:`DeadlockError` naming the stalled streams if some instruction
    can never run.
    """
    if program.num_gpus > cluster.num_gpus:
        raise ValueError(f"program needs {program.num_gpus} GPUs, cluster has {cluster.num_gpus}")
    return _Run(program, cluster, timer).run()
