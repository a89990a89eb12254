"""Pass 2, pipeline send/recv: after an op whose consumer stage lives on another pipeline
rank, a send of its output (activations forward, gradients backward) from every
simulated GPU to its peer there; the consumer waits for the send's arrival.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from topologies.placement import Placement
from workloads.lowering.collapse import Collapse, replica_send_s
from workloads.program import ProgramBuilder
from workloads.schedules import BACKWARD, FORWARD, Op, Schedule

PipeSend = tuple[int, Op, int, str, "float | None"]
"""One pipeline message of an op: (position of the sending op in the lowering order, that
op, consumer's pipeline rank, name, fixed duration or None)."""

Lanes = list[list[list[int]]]
"""``lanes[r][e][t]``: the simulated GPU of TP lane t, replica e (a (cp, dp) coordinate)
of pipeline rank r."""


def consumer_stage(op: Op, num_stages: int) -> int | None:
    """The stage that consumes ``op``'s output: the next one of a forward, the previous
    one of a backward; None for the last forward, the first backward and W."""
    if op.kind == FORWARD and op.stage + 1 < num_stages:
        return op.stage + 1
    if op.kind == BACKWARD and op.stage > 0:
        return op.stage - 1
    return None


def pipeline_sends(schedule: Schedule, group: Sequence[Op], r: int, index: Mapping[Op, int],
                   collapse: Collapse | None, placement: Placement,
                   cache: dict[tuple[int, int, float], float], p2p: float) -> list[PipeSend]:
    """The pipeline messages of ``group`` (an op, or a fused group such as DualPipe's F&B,
    which sends at its end) on rank ``r`` whose consumer lives on another rank; collapsed,
    each timed with every replica's copy (:func:`~workloads.lowering.collapse.replica_send_s`)."""
    owner = schedule.stage_rank
    sends = []
    for member in group:
        consumer = consumer_stage(member, schedule.num_stages)
        if consumer is None or owner[consumer] == r:
            continue
        fixed = None if collapse is None else replica_send_s(
            collapse, placement, cache, r, owner[consumer], p2p)
        what = "act" if member.kind == FORWARD else "grad"
        sends.append((index[member], member, owner[consumer], f"{member} {what}", fixed))
    return sends


def emit_sends(b: ProgramBuilder, sends: Sequence[PipeSend], lanes: Lanes, r: int, k: int,
               last: Mapping[tuple[int, int], int], sent: dict[tuple[int, int], int],
               p2p: float) -> None:
    """Each pipeline send of op ``order[k]``, from every simulated lane of rank ``r``, each
    after the instruction completing the op there (``last``); ``sent[(j, dst)]``: the send
    that delivers op ``order[j]``'s output to GPU ``dst``."""
    for j, member, cr, name, fixed in sends:
        for d, gpus in enumerate(lanes[r]):
            for t, g in enumerate(gpus):
                dst = lanes[cr][d][t]
                sent[(j, dst)] = b.send(g, dst, p2p, "pp", name, (last[(k, g)],),
                                        stage=member.stage, mb=member.mb, duration_s=fixed)


def emit_replica_sends(b: ProgramBuilder, sends: Sequence[PipeSend], lanes: Lanes, r: int,
                       d: int, k: int, last: Mapping[tuple[int, int], int],
                       sent: dict[tuple[int, int], int], p2p: float) -> None:
    """:func:`emit_sends` from replica ``d``'s lanes only (the full lowering sends each
    replica's messages right after that replica's part of the op)."""
    gpus = lanes[r][d]
    for j, member, cr, name, fixed in sends:
        dst_lane = lanes[cr][d]
        for t, g in enumerate(gpus):
            sent[(j, dst_lane[t])] = b.send(g, dst_lane[t], p2p, "pp", name, (last[(k, g)],),
                                            stage=member.stage, mb=member.mb, duration_s=fixed)
