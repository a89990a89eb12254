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
from collections import defaultdict
from collections.abc import Callable, Generator

import simpy

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
        self.memory = [MemorySample(g, 0.0, b) for g, b in enumerate(program.static_bytes)]
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
        if duration > 0:
            yield self.env.timeout(duration)
        self._mem(ins.gpu, -ins.free_bytes)
        self.spans.append(Span(ins.gpu, "compute", ins.kind, ins.name, start, self.env.now,
                               ins.stage, ins.mb))

    def _send(self, ins: Send) -> Generator:
        start = self.env.now
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
        steps = plan_collective(ins.op, ins.algo, ins.group, ins.nbytes)
        arrived = [self.env.event() for _ in steps]
        for i, step in enumerate(steps):
            self.env.process(self._run_step(step, [arrived[d] for d in step.deps], arrived[i]))
        if arrived:
            yield self.env.all_of(arrived)
        finished.succeed()

    def _run_step(self, step, deps: list[simpy.Event], arrived: simpy.Event) -> Generator:
        if deps:
            yield self.env.all_of(deps)
        yield from self.transfer(step.src, step.dst, step.nbytes)
        arrived.succeed()

    def _collective(self, ins: Collective) -> Generator:
        members = self.arrivals[ins.key]
        members.append(ins.gpu)
        finished = self.collective_done.setdefault(ins.key, self.env.event())
        if len(members) == len(ins.group):
            self.collective_start[ins.key] = self.env.now
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
        return Timeline(self.program.num_gpus, spans, arrows, memory, self.program.gpu_names)


def simulate_program(program: Program, cluster: Cluster, timer: ComputeTimer) -> Timeline:
    """Run ``program`` on ``cluster``; ``timer`` gives each compute op's duration in seconds.

    Raises :class:`DeadlockError` naming the stalled streams if some instruction
    can never run.
    """
    if program.num_gpus > cluster.num_gpus:
        raise ValueError(f"program needs {program.num_gpus} GPUs, cluster has {cluster.num_gpus}")
    return _Run(program, cluster, timer).run()
