"""Pass 2, pipeline send/recv: after an op whose consumer stage lives on another pipeline
rank, a send of its output (activations forward, gradients backward) from every
simulated GPU to its peer there; the consumer waits for the send's arrival. Where sends
block (``pp_send_blocking``, :func:`sends_block`: DeepSpeed's pipeline engine, Megatron-LM
without a virtual pipeline), the sender's compute stream waits for them too: a zero-time
``pp wait`` instruction after them, which later ops there follow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from topologies.placement import Placement
from workloads.frameworks import SEND_BLOCKING
from workloads.lowering.collapse import Collapse, replica_send_s
from workloads.program import ProgramBuilder
from workloads.schedules import (
    BACKWARD,
    ENCODER_FORWARD,
    FORWARD,
    WEIGHT_GRAD,
    Op,
    Schedule,
    rank_coded,
)

PipeSend = tuple[int, Op, int, str, "float | None", float]
"""One pipeline message of an op: (position of the sending op in the lowering order, that
op, consumer's pipeline rank, name, fixed duration or None, bytes)."""

Lanes = list[list[list[int]]]
"""``lanes[r][e][t]``: the simulated GPU of TP lane t, replica e (a (cp, dp) coordinate)
of pipeline rank r."""


def sends_block(blocking: bool | str, schedule: Schedule) -> bool:
    """Whether pipeline sends block their sender on ``schedule`` under ``blocking``, a cost
    model's ``pp_send_blocking``: True or ``always``, False or ``never``, or
    ``non-interleaved``: where each pipeline rank holds one stage (no virtual pipeline), as
    Megatron-LM decides it: ``megatron/training/arguments.py`` ``validate_args`` turns
    ``overlap_p2p_comm`` off without a virtual pipeline and passes ``batch_p2p_comm = not
    overlap_p2p_comm``, so each ``send_forward_recv_backward`` etc. waits on its requests and
    ``torch.cuda.synchronize()``s (``megatron/core/pipeline_parallel/p2p_communication.py``
    ``_communicate``, core_r0.8.0 baf94af and main d98e8a6); with several model chunks a
    rank (the interleaved schedule, V-shaped ones) ``overlap_p2p_comm`` is on by default and
    the chunks' handles are waited on only before the next chunk: not blocking."""
    if isinstance(blocking, bool):
        return blocking
    if blocking == "non-interleaved":
        return schedule.num_stages == schedule.num_ranks
    if blocking not in SEND_BLOCKING:
        raise ValueError(f"pp_send_blocking={blocking!r}: one of {', '.join(SEND_BLOCKING)}")
    return blocking == "always"


def consumer_stage(op: Op, num_stages: int) -> int | None:
    """The stage that consumes ``op``'s output: the next one of a forward, the previous
    one of a backward; None for the last forward, the first backward and W."""
    if op.kind == FORWARD and op.stage + 1 < num_stages:
        return op.stage + 1
    if op.kind == BACKWARD and op.stage > 0:
        return op.stage - 1
    return None


def consumer_ranks(op: Op, schedule: Schedule) -> tuple[int, ...]:
    """The pipeline ranks whose ops consume ``op``'s output (:func:`consumer_stage`'s owner),
    with a multimodal schedule's encoder (:class:`~workloads.schedules.EncoderLayout`)
    also: an encoder stage's last forward piece feeds the next encoder stage, or on an
    encoder pipeline's last stage the LLM's first stage; the first backward piece sends
    its gradient to the previous encoder stage; the LLM's first backward sends the
    features' gradient to every encoder pipeline's last stage."""
    enc = schedule.encoder
    if enc is None or op.kind in (FORWARD, WEIGHT_GRAD) or (op.kind == BACKWARD and op.stage):
        consumer = consumer_stage(op, schedule.num_stages)
        return () if consumer is None else (schedule.stage_rank[consumer],)
    if op.kind == BACKWARD:
        return enc.last_ranks(schedule.num_ranks)
    j = enc.stage_of(op.stage)
    if op.kind == ENCODER_FORWARD:
        if op.seq < enc.pieces - 1:
            return ()
        return (op.stage + 1,) if j < enc.stages - 1 else (schedule.stage_rank[0],)
    return (op.stage - 1,) if op.seq == 0 and j > 0 else ()


def pipeline_sends(schedule: Schedule, group: Sequence[Op], r: int, index: Mapping[Op, int],
                   collapse: Collapse | None, placement: Placement,
                   cache: dict[tuple[int, int, float], float], p2p: float,
                   feature_p2p: float = 0.0) -> list[PipeSend]:
    """The pipeline messages of ``group`` (an op, or a fused group such as DualPipe's F&B,
    which sends at its end) on rank ``r`` whose consumer lives on another rank; collapsed,
    each timed with every replica's copy (:func:`~workloads.lowering.collapse.replica_send_s`).
    Each message carries ``p2p`` bytes, except the gradient of an encoder's features that
    the LLM's first backward sends (``feature_p2p``)."""
    sends = []
    for member in group:
        nbytes = feature_p2p if member.kind == BACKWARD and member.stage == 0 else p2p
        what = {FORWARD: "act", ENCODER_FORWARD: "features"}.get(member.kind, "grad")
        for cr in consumer_ranks(member, schedule):
            if cr == r:
                continue
            fixed = None if collapse is None else replica_send_s(
                collapse, placement, cache, r, cr, nbytes)
            sends.append((index[member], member, cr, f"{member} {what}", fixed, nbytes))
    return sends


def emit_sends(b: ProgramBuilder, sends: Sequence[PipeSend], lanes: Lanes, r: int, k: int,
               last: dict[tuple[int, int], int], sent: dict[tuple[int, int], int],
               blocking: bool = False) -> None:
    """Each pipeline send of op ``order[k]``, from every simulated lane of rank ``r``, each
    after the instruction completing the op there (``last``); ``sent[(j, dst)]``: the send
    that delivers op ``order[j]``'s output to GPU ``dst``. ``blocking``: then the sender
    waits for them (:func:`wait_for_sends`)."""
    mine: dict[int, list[int]] = {}
    for j, member, cr, name, fixed, nbytes in sends:
        for d, gpus in enumerate(lanes[r]):
            for t, g in enumerate(gpus):
                dst = lanes[cr][d][t]
                sent[(j, dst)] = b.send(g, dst, nbytes, "pp", name, (last[(k, g)],),
                                        stage=member.stage, mb=member.mb, duration_s=fixed)
                mine.setdefault(g, []).append(sent[(j, dst)])
    if blocking and sends:
        for g, ids in mine.items():
            last[(k, g)] = wait_for_sends(b, g, sends[-1][1], tuple(ids))


def emit_replica_sends(b: ProgramBuilder, sends: Sequence[PipeSend], lanes: Lanes, r: int,
                       d: int, k: int, last: dict[tuple[int, int], int],
                       sent: dict[tuple[int, int], int], blocking: bool = False) -> None:
    """:func:`emit_sends` from replica ``d``'s lanes only (the full lowering sends each
    replica's messages right after that replica's part of the op)."""
    gpus = lanes[r][d]
    mine: dict[int, list[int]] = {g: [] for g in gpus}
    for j, member, cr, name, fixed, nbytes in sends:
        dst_lane = lanes[cr][d]
        for t, g in enumerate(gpus):
            i = b.send(g, dst_lane[t], nbytes, "pp", name, (last[(k, g)],),
                       stage=member.stage, mb=member.mb, duration_s=fixed)
            sent[(j, dst_lane[t])] = i
            mine[g].append(i)
    if blocking and sends:
        member = sends[-1][1]
        for g in gpus:
            last[(k, g)] = wait_for_sends(b, g, member, tuple(mine[g]))


def wait_for_sends(b: ProgramBuilder, g: int, member: Op, send_ids: tuple[int, ...]) -> int:
    """A blocking send's wait on GPU ``g``: a zero-time compute instruction after its sends
    ``send_ids`` of ``member``'s output; it becomes what completes the op there, so the
    GPU's next op, and everything that follows the op, waits for the messages to arrive.
    DeepSpeed's ``deepspeed/runtime/pipe/p2p.py`` ``send`` (v0.6.5) calls ``dist.send``
    without ``async_op``, which the NCCL backend makes the current stream wait on, and
    ``PipelineEngine._exec_schedule`` runs ``SendActivation`` and ``SendGrad`` in line with
    the forward and backward passes."""
    return b.compute(g, member.kind, f"{member} pp wait", send_ids, duration_s=0.0,
                     stage=member.stage, mb=member.mb)


def deepspeed_steps(schedule: Schedule) -> dict[Op, int] | None:
    """Each op's step in DeepSpeed's ``TrainSchedule`` (``deepspeed/runtime/pipe/schedule.py``,
    v0.3.0 to v0.6.5): with p stages and m micro-batches a step of stage s is a forward
    step or a backward step by the parity of step and stage, ``F(s, i)`` runs in step
    ``2i + s`` and ``B(s, i)`` in step ``2i + 2p - 1 - s`` (``_step_to_micro_batch``);
    the output of an op of step t is sent in step t + 1, where its consumer receives it.
    None where ``schedule`` is not that order: one stage per rank, F and B only, and each
    rank's ops in the order of their steps (Megatron's 1F1B, which DeepSpeed's steps give).
    Worked out once per schedule and kept on it, read-only (as
    :func:`~workloads.lowering.order.topological`)."""
    if "_deepspeed_steps" not in schedule.__dict__:
        steps = _deepspeed_steps(schedule)
        schedule.__dict__["_deepspeed_steps"] = (None if steps is None
                                                 else MappingProxyType(steps))
    return schedule.__dict__["_deepspeed_steps"]


def _deepspeed_steps(schedule: Schedule, reference: bool = False) -> dict[Op, int] | None:
    """:func:`deepspeed_steps`, worked out: on the ops' arrays (:func:`~workloads.schedules.
    rank_coded`: each op's step from its stage, kind and micro-batch at once, each rank's
    steps checked to increase at once, then the ops and steps zipped into the dict), else,
    or with ``reference``, op by op (the same dict, in the same order: tests/
    test_deepspeed_steps.py)."""
    p = schedule.num_stages
    if (schedule.num_ranks != p or schedule.split_backward or schedule.fused
            or schedule.seq_chunks != 1 or schedule.encoder is not None
            or any(schedule.stage_rank[s] != s for s in range(p))):
        return None
    step = None if reference else _coded_steps(schedule)
    if step is not None:
        if not len(step):
            return {}
        if int(step.min()) < 0:  # a W op
            return None
        # each rank's steps increase (a rank's first op starts its run)
        lengths = np.array([len(ops) for ops in schedule.rank_ops], dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        first = np.zeros(len(step), dtype=bool)
        first[starts[starts < len(step)]] = True
        if not (first[1:] | (step[1:] > step[:-1])).all():
            return None
        return dict(zip([op for ops in schedule.rank_ops for op in ops], step.tolist(),
                        strict=True))
    steps: dict[Op, int] = {}
    for ops in schedule.rank_ops:
        previous = -1
        for op in ops:
            if op.kind == FORWARD:
                t = 2 * op.mb + op.stage
            elif op.kind == BACKWARD:
                t = 2 * op.mb + 2 * p - 1 - op.stage
            else:
                return None
            if t <= previous:
                return None
            steps[op] = previous = t
    return steps


def _coded_steps(schedule: Schedule) -> np.ndarray | None:
    """The DeepSpeed step of each op of ``schedule`` (one stage per rank) in rank order, from
    its op arrays (:func:`~workloads.schedules.rank_coded`): ``2 mb + s`` for ``F(s, mb)``,
    ``2 mb + 2p - 1 - s`` for ``B``, -1 for a W; None where the ops do not code. Kept on the
    schedule, read-only: :func:`_deepspeed_steps` and :func:`deepspeed_permutation` both read
    them."""
    if "_coded_steps" not in schedule.__dict__:
        coded = rank_coded(schedule)
        step = None
        if coded is not None:
            stage, kind, mb = coded[:3]
            p = schedule.num_stages
            step = np.where(kind > 1, -1, 2 * mb + np.where(kind == 0, stage, 2 * p - 1 - stage))
            step.flags.writeable = False
        schedule.__dict__["_coded_steps"] = step
    return schedule.__dict__["_coded_steps"]


def deepspeed_permutation(schedule: Schedule, order: Sequence[Op], steps: Mapping[Op, int],
                          at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`deepspeed_order` of ``order`` (the schedule's topological order,
    :func:`~workloads.lowering.order.topological`) as positions in it, and the sorted ops'
    steps: worked out once per schedule and kept on it, read-only. ``at``: each op's
    position in rank order (``topological``'s field), where the steps are read from the
    ops' arrays (:func:`_coded_steps`) rather than looked up op by op in ``steps`` (the
    reference: the same integers, ``tests/test_deepspeed_steps.py``)."""
    found = schedule.__dict__.get("_deepspeed_permutation")
    if found is None or len(found[0]) != len(order):
        by_rank = _coded_steps(schedule) if at is not None and len(at) == len(order) else None
        step = (by_rank.take(at) if by_rank is not None
                else np.fromiter(map(steps.__getitem__, order), np.int64, len(order)))
        perm = np.argsort(step, kind="stable")
        found = (perm, step[perm])
        for a in found:
            a.flags.writeable = False
        schedule.__dict__["_deepspeed_permutation"] = found
    return found


def deepspeed_order(order: Sequence[Op], steps: Mapping[Op, int]) -> tuple[Op, ...]:
    """``order`` sorted by DeepSpeed step (:func:`deepspeed_steps`; stable, so the ops of
    one step keep their order): a topological order too, since an op's producers run in
    earlier steps."""
    return tuple(sorted(order, key=steps.__getitem__))


def emit_rendezvous(b: ProgramBuilder, sends: Sequence[tuple[int, int, PipeSend]],
                    lanes: Lanes, chain: dict[int, int], last: dict[tuple[int, int], int],
                    sent: dict[tuple[int, int], int]) -> None:
    """The pipeline messages of one DeepSpeed step, each a rendezvous of two blocking
    calls: ``sends`` are (position of the producing op, its rank, the message) for the ops
    of the previous step, activations first (``deepspeed/runtime/pipe/schedule.py``
    TrainSchedule, v0.3.0 to v0.6.5: a backward step sends the activation of its stage's last
    forward and then receives a gradient, a forward step receives an activation and then
    sends its last backward's gradient: the pair of neighbouring stages talking in a step
    runs them in the same order). A message leaves when both its sender and its receiver
    have reached it, after everything each of them issued before (``chain[g]``: the
    latest instruction of GPU ``g``): ``deepspeed/runtime/pipe/p2p.py`` ``send`` and
    ``recv`` are blocking ``dist.send``/``dist.recv`` (v0.6.5) or ``dist.broadcast`` over
    the two stages' group (v0.3.0 to v0.5.x), and NCCL moves a point-to-point message
    only once both sides have posted it. Both GPUs then wait for it to arrive: a zero-time
    ``pp wait`` on the sender, ``pp recv`` on the receiver, which their next instructions
    follow."""
    ordered = sorted(sends, key=lambda s: (s[2][1].kind != FORWARD, s[0]))
    for k, r, (j, member, cr, name, fixed, nbytes) in ordered:
        for d, gpus in enumerate(lanes[r]):
            for t, g in enumerate(gpus):
                dst = lanes[cr][d][t]
                deps = tuple(chain[x] for x in (g, dst) if x in chain)
                i = b.send(g, dst, nbytes, "pp", name, deps, stage=member.stage,
                           mb=member.mb, duration_s=fixed)
                chain[g] = last[(k, g)] = wait_for_sends(b, g, member, (i,))
                chain[dst] = sent[(j, dst)] = b.compute(
                    dst, member.kind, f"{member} pp recv", (i,), duration_s=0.0,
                    stage=member.stage, mb=member.mb)
