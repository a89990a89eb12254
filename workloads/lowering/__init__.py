"""Lowering: schedule + cost model + placement -> per-rank :class:`~workloads.program.Program`.

A chain of passes (DESIGN.md), one module each:

1. :mod:`.order`, the schedule: the ops in a topological order (that of a
   unit-duration symbolic run, so every producer is lowered before its consumers)
   and each op's producers;
2. :mod:`.pipeline`, pipeline send/recv: a send follows each op whose consumer stage
   lives on another rank (activations forward, gradients backward); the consumer
   depends on it;
3. :mod:`.ops`, TP/SP/CP/EP collectives per layer: each op becomes its cost model's
   segments (compute kernels and TP collectives) on every GPU of its TP group;
   :mod:`.pieces` cuts ops at their markers for context parallelism's ring attention,
   MoE all-to-alls over EP groups and the DP collectives inside ops;
4. :mod:`.tied`, the tied embedding's gradients all-reduced over the first and last
   pipeline rank where the framework does it; :mod:`.grads`, DP/ZeRO gradients: after
   the last backward of each stage, the gradient collective over the DP x CP group
   (all-reduce, or reduce-scatter under ZeRO >= 1); with ``overlap_grad_reduce`` in
   buckets during that backward, under ZeRO-3 per layer, overlapped with the ops
   (:mod:`.pieces`), parameters gathered one layer ahead, and per layer in every backward
   under a ZeRO-2 that reduces every micro-batch (FSDP's, DeepSpeed's);
5. :mod:`.optimizer`, the optimizer step, then (ZeRO 1/2) the all-gather of updated
   parameters; with ``overlap_param_gather`` that all-gather is each stage's first
   forward's instead, Megatron-core's way (:mod:`.pieces`): stage 0 layer by layer, every
   other stage whole, one chain per rank from the step's start.

Passes 2 and 3 run op by op in one loop (the instructions of an op and its sends are
numbered together); :mod:`.collapse` folds them for one representative GPU per
pipeline rank. That loop is the reference; a collapsed lowering of plain ops has a fast
path on arrays (:mod:`.columnar`), proven equal by ``tests/test_lowering_paths.py``.
"""

from __future__ import annotations

from functools import lru_cache
from operator import itemgetter

from base.collector import gc_paused
from topologies.placement import PLACEMENT_CACHE, Placement, coordinate_columns
from workloads.lowering.collapse import Collapse
from workloads.lowering.columnar import joined, lower_collapsed
from workloads.lowering.dataparallel import DataParallel
from workloads.lowering.grads import reduce_gradients
from workloads.lowering.groups import replica_coords
from workloads.lowering.opcosts import CostModel, stages_of
from workloads.lowering.ops import OpLoop
from workloads.lowering.optimizer import optimizer_step
from workloads.lowering.order import (
    final_ops,
    first_forwards,
    gather_chain,
    positions,
    topological,
    topological_ops,
)
from workloads.lowering.paramserver import push_pull
from workloads.lowering.pieces import PieceLowering
from workloads.lowering.pipeline import (
    deepspeed_order,
    deepspeed_permutation,
    deepspeed_steps,
    sends_block,
)
from workloads.lowering.tied import reduce_tied_gradients
from workloads.packed import PackedBuilder
from workloads.program import Program, ProgramBuilder
from workloads.schedules import Schedule

__all__ = ["Collapse", "CostModel", "lower", "topological_ops"]


def lower(
    schedule: Schedule,
    costs: CostModel,
    placement: Placement,
    zero_stage: int = 0,
    collapse: Collapse | None = None,
    reference: bool = False,
    servers: tuple[int, ...] = (),
) -> Program:
    """Lower one training step to per-GPU instructions. Pure and deterministic.

    ``servers``: the ranks of parameter servers (``parallel.dp_mode:
    parameter_server``), after the layout's GPUs; pass 4 and 5 are then
    :mod:`.paramserver`'s pushes and pulls (ZeRO-0, not collapsed). The program then
    spans the servers too, and its simulated GPUs are the workers.

    With ``collapse``, only one representative GPU per pipeline rank gets a
    program (see :class:`Collapse`). ``reference``: build it with the reference op loop
    (:mod:`.ops`) even where the fast path (:mod:`.columnar`) applies; the program is
    the same.
    """
    # many long-lived objects, few cycles: the collector's scans would dominate; after, the
    # program's objects move to the oldest generation at once, else the first young
    # collection scans every one of them (a quarter second at 400k)
    with gc_paused():
        return _lower(schedule, costs, placement, zero_stage, collapse, servers, reference)


def _lower(schedule: Schedule, costs: CostModel, placement: Placement, zero_stage: int,
           collapse: Collapse | None, servers: tuple[int, ...], reference: bool) -> Program:
    """:func:`lower`, with the garbage collector paused by the caller."""
    pp, tp = placement.degree("pp"), placement.degree("tp")
    if schedule.num_ranks != pp:
        raise ValueError(f"schedule has {schedule.num_ranks} ranks but the layout has pp={pp}")
    replicas = replica_coords(placement)
    tp_lanes, lane_replicas = (1, replicas[:1]) if collapse is not None else (tp, replicas)
    # lanes[r][e]: the GPUs of TP lanes 0..tp_lanes-1 of pipeline rank r, replica e (a
    # (cp, dp) coordinate)
    lanes = [[[placement.gpu(tp=t, cp=c, dp=d, pp=r) for t in range(tp_lanes)]
              for c, d in lane_replicas] for r in range(pp)]
    # a full program packed (workloads.packed): ~20 bytes an instruction, not ~250
    b = ProgramBuilder() if collapse is not None or reference else PackedBuilder()
    final_op = final_ops(schedule)
    zero3 = zero_stage == 3 and len(replicas) > 1
    # ZeRO-3 kept unsharded under PP (torchtitan's FSDP2): each stage's parameters gathered in
    # its first forward, its gradients reduce-scattered after its final op, nothing in between
    once = zero3 and bool(getattr(costs, "zero3_once_per_step", False))
    overlap = bool(getattr(costs, "overlap_grad_reduce", False)) and len(replicas) > 1
    cp_or_ep = getattr(costs, "cp", 1) > 1 or getattr(costs, "ep", 1) > 1
    # overlap_param_gather: each stage's first forward gathers the parameters layer by layer
    gather_ahead = (bool(getattr(costs, "overlap_param_gather", False)) and zero_stage in (1, 2)
                    and len(replicas) > 1)
    # ZeRO-2 as FSDP and DeepSpeed run it: every backward reduce-scatters layer by layer
    per_microbatch = (bool(getattr(costs, "reduces_every_microbatch", False)) and zero_stage == 2
                      and len(replicas) > 1)
    piecewise = (PieceLowering(b, schedule, costs, placement, zero_stage, collapse, lanes,
                               gather_chain(schedule) if gather_ahead else None, per_microbatch,
                               once, remember=not reference)
                 if zero3 or overlap or cp_or_ep or gather_ahead or per_microbatch else None)
    # the columnar fast path lowers F, B and W ops only: a multimodal schedule's encoder ops
    # (and the F ops that wait on several of them) take the op loop
    blocking = sends_block(getattr(costs, "pp_send_blocking", False), schedule)
    # blocking sends on a 1F1B order: DeepSpeed's steps (Megatron-LM's send/recv pairs), in
    # whose order the ops are lowered, each message a rendezvous of its two GPUs
    steps = deepspeed_steps(schedule) if blocking else None
    fast = (not reference and collapse is not None and piecewise is None and not schedule.fused
            and schedule.encoder is None)
    order, fields = topological(schedule, fields=fast)
    head = None
    if fast and order and fields is not None and fields[1].min() >= 0:  # F, B, W only
        step = None
        if steps is not None:  # the op loop's order (deepspeed_order), fields alike
            perm, step = deepspeed_permutation(schedule, order, steps, fields[3])
            order = itemgetter(*perm.tolist())(order) if len(order) > 1 else order
            fields = tuple(None if f is None else f[perm] for f in fields)
        # positions of the final ops only (the step end's); the op loop has its own
        index = positions(order, fields[0], fields[1], list(final_op.values()))
        reps = [lane[0][0] for lane in lanes]
        head = lower_collapsed(schedule, costs, collapse, placement, order, fields, reps,
                               b.default_algo, blocking, step)
        last = {(index[op], reps[schedule.stage_rank[op.stage]]): int(head.done[index[op]])
                for op in final_op.values()}
        b = ProgramBuilder(head.size, head.keys)  # the step end follows the op loop's part
    else:
        if steps is not None:  # DeepSpeed's engine runs its steps in turn
            order = deepspeed_order(order, steps)
        index = {op: k for k, op in enumerate(order)}
        loop = OpLoop(b, schedule, costs, placement, collapse, lanes, piecewise,
                      set(final_op.values()), zero3, overlap, cp_or_ep,
                      first_forwards(schedule) if gather_ahead or once else frozenset(),
                      per_microbatch, steps, once, remember=not reference)
        loop.run(order, index)
        last = loop.last
    dpar = DataParallel(b, placement, collapse, int(getattr(costs, "ep", 1)),
                        getattr(costs, "expert_tp", None))
    if servers:
        if collapse is not None or zero_stage or piecewise is not None:
            raise ValueError("parameter servers: ZeRO-0 without buckets, not collapsed")
        push_pull(dpar, schedule, costs, last, final_op, index, servers)
        return _program(b.build(), schedule, costs, placement, servers)
    reduce_tied_gradients(b, schedule, costs, placement, collapse, last, final_op, index,
                          piecewise.dp_last if piecewise is not None else {})
    reduced = piecewise.reduced if piecewise is not None else set()
    waits = reduce_gradients(dpar, schedule, costs, zero_stage, last, final_op, index, reduced)
    if piecewise is not None:
        for g, i in piecewise.dp_last.items():
            waits[g].append(i)
    optimizer_step(dpar, schedule, costs, zero_stage, waits, gathered_ahead=gather_ahead)
    static_of_rank = [costs.static_bytes(stages_of(schedule, r)) for r in range(pp)]
    static = tuple(map(static_of_rank.__getitem__, coordinate_columns(placement)["pp"]))
    simulated = None if collapse is None else tuple(placement.gpu(pp=r) for r in range(pp))
    instructions = b.build() if head is None else joined(head, b.build())
    return Program(placement.num_gpus, instructions, static, schedule, gpu_names(placement),
                   simulated)


@lru_cache(maxsize=PLACEMENT_CACHE)
def gpu_names(placement: Placement) -> tuple[str, ...]:
    """Each GPU's name in a program, ``gpu5 pp0 dp0 tp5``: worked out once per placement."""
    c = coordinate_columns(placement)
    return tuple(f"gpu{g} pp{p} dp{d} tp{t}"
                 for g, (p, d, t) in enumerate(zip(c["pp"], c["dp"], c["tp"], strict=True)))


def _program(instructions: tuple, schedule: Schedule, costs: CostModel, placement: Placement,
             servers: tuple[int, ...]) -> Program:
    """The program of a parameter-server step: the workers' GPUs, then the servers (no
    memory modelled on them), the workers simulated."""
    pp = placement.degree("pp")
    names = gpu_names(placement) + tuple(f"gpu{g} ps{j}" for j, g in enumerate(servers))
    static_of_rank = [costs.static_bytes(stages_of(schedule, r)) for r in range(pp)]
    static = (tuple(map(static_of_rank.__getitem__, coordinate_columns(placement)["pp"]))
              + (0.0,) * len(servers))
    return Program(placement.num_gpus + len(servers), instructions, static, schedule, names,
                   tuple(range(placement.num_gpus)))
