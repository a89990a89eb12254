"""Pass 1, the schedule: the order ops are lowered in and each op's producers.

Ops are taken in a topological order, that of a unit-duration symbolic run
(:func:`~workloads.schedules.unit_spans`), so that every producer is lowered
before its consumers; the producers follow from the schedule's one dependency
rule (:func:`~workloads.schedules.op_deps`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain
from operator import itemgetter
from types import MappingProxyType

import numpy as np

from workloads.schedules import (
    _KIND_CODE,
    BACKWARD,
    ENCODER_BACKWARD,
    FORWARD,
    WEIGHT_GRAD,
    Op,
    Schedule,
    op_deps,
    unit_order,
    unit_spans,
)


def topological_ops(schedule: Schedule) -> list[Op]:
    """All ops in an order where every op comes after its producers and its rank predecessors."""
    return list(topological(schedule)[0])


KINDS = {FORWARD: 0, BACKWARD: 1, WEIGHT_GRAD: 2}
"""Op kinds as :func:`topological` codes them."""


def topological(schedule: Schedule, fields: bool = False
                ) -> tuple[tuple[Op, ...], tuple[np.ndarray | None, ...] | None]:
    """:func:`topological_ops`; with ``fields``, also the ops' stages, kind codes
    (:data:`KINDS`), sequence fields and rank-order positions (:func:`unit_order`; None
    where it has none) in that order, as arrays. Worked out once per schedule and kept on
    it (a schedule is immutable and shared, :func:`workloads.registry.built_schedule`):
    a tuple and read-only arrays."""
    key = "_topological_fields" if fields else "_topological"
    found = schedule.__dict__.get(key)
    if found is None:
        order, arrays = _topological(schedule, fields)
        for a in arrays or ():
            if a is not None:
                a.flags.writeable = False
        found = schedule.__dict__[key] = (order, arrays)  # as cached_property
    return found


def _topological(schedule: Schedule, fields: bool
                 ) -> tuple[tuple[Op, ...], tuple[np.ndarray | None, ...] | None]:
    """:func:`topological`, worked out."""
    ops, start, end = unit_spans(schedule)
    n = len(ops)
    if not n:
        return (), (*(np.zeros(0, np.int64),) * 3, None) if fields else None
    # sorted by (end, rank, start), ties in the symbolic run's order: a stable sort on keys
    # read into arrays (the ranks through the stages) instead of a key tuple per op
    coded = unit_order(schedule) if fields else None
    at = kinds = None
    if coded is not None:  # worked out by the symbolic run (the same codes as kind_codes)
        at, stage, kinds, seq = coded
    elif fields:
        ints = np.fromiter(chain.from_iterable(map(itemgetter(0, 3), ops)), np.int64, 2 * n)
        stage, seq = ints[0::2], ints[1::2]
    else:
        stage = np.fromiter(map(itemgetter(0), ops), np.int64, n)
    ranks = np.asarray(schedule.stage_rank, dtype=np.int64)[stage]
    perm = unit_sort(start, ranks, end, schedule.num_ranks)
    if n > 1 and perm[0] == 0 and np.array_equal(perm, np.arange(n)):
        # the run's own order (its time-step sweep's, workloads.schedules._unit_sweep):
        # its ops as they are (Megatron 1T: ~8 ms for 131,072 ops gathered again)
        order = ops
        if not fields:
            return order, None
        if kinds is None:
            kinds = kind_codes(ops)
        return order, (stage, kinds, seq, at)
    # the ops in that order, gathered in C (an itemgetter of the positions; one op alone
    # is its own result)
    order = itemgetter(*perm.tolist())(ops) if n > 1 else (ops[0],)
    if not fields:
        return order, None
    if kinds is None:
        kinds = kind_codes(ops)
    return order, (stage[perm], kinds[perm], seq[perm], None if at is None else at[perm])


def unit_sort(start: np.ndarray, ranks: np.ndarray, end: np.ndarray, num_ranks: int
              ) -> np.ndarray:
    """The stable sort of the symbolic run's ops by (end, rank, start):
    ``np.lexsort((start, ranks, end))`` (the reference), as one stable sort of one integer
    key where the times are whole numbers (a unit-duration run's are) small enough for the
    key to be exact; the same permutation (``tests/test_single_run.py``). Megatron 1T's
    131,072 ops: 5.5 -> 1.6 ms."""
    if len(start):
        high = float(max(end.max(), start.max()))
        lows = min(end.min(), start.min())
        if (lows >= 0 and high < 1 << 20 and num_ranks < 1 << 20
                and ranks.min() >= 0 and ranks.max() < num_ranks
                and np.array_equal(start, np.floor(start))
                and np.array_equal(end, np.floor(end))):
            width = int(high) + 1  # start < width, rank < num_ranks, both 2**20 at most
            key = (end.astype(np.int64) * num_ranks + ranks) * width + start.astype(np.int64)
            return np.argsort(key, kind="stable")
    return np.lexsort((start, ranks, end))


def kind_codes(ops: Sequence[Op]) -> np.ndarray:
    """The ops' kinds as :data:`KINDS` codes (-1 for another kind)."""
    letters = "".join(map(itemgetter(1), ops))
    if len(letters) == len(ops) and letters.isascii():  # one character each: as bytes
        table = np.full(256, -1, dtype=np.int64)
        for name, code in KINDS.items():
            table[ord(name)] = code
        return table[np.frombuffer(letters.encode(), dtype=np.uint8)]
    return np.fromiter((KINDS.get(op.kind, -1) for op in ops), np.int64, len(ops))


def positions(order: Sequence[Op], stage: np.ndarray, kind: np.ndarray,
              ops: Sequence[Op]) -> dict[Op, int]:
    """The position in ``order`` of each of ``ops``, the last op of its stage and kind in
    ``order`` (a final op: the last backward or W of its stage in its rank's order, which
    ``order`` keeps); looked up op by op where one is not."""
    key = stage * 3 + kind
    last = np.full(int(key.max(initial=0)) + 1, -1, dtype=np.int64)
    np.maximum.at(last, key, np.arange(len(order)))
    out = {}
    for op in ops:
        code = op.stage * 3 + KINDS.get(op.kind, -1)
        k = int(last[code]) if 0 <= code < len(last) else -1
        if k < 0 or order[k] != op:
            wanted = set(ops)
            return {op: k for k, op in enumerate(order) if op in wanted}
        out[op] = k
    return out


def producers_by_op(schedule: Schedule, order: Sequence[Op], index: Mapping[Op, int]
                    ) -> tuple[list[int], list[int], list[int]]:
    """:func:`~workloads.schedules.producer_positions` op by op (:func:`op_deps`), for ops
    it declines; a producer missing from ``order`` raises KeyError, as lowering did."""
    cols: tuple[list[int], list[int], list[int]] = ([], [], [])
    S, split, chunks = schedule.num_stages, schedule.split_backward, schedule.seq_chunks
    for op in order:
        found = [index[d] for d in op_deps(op, S, split, chunks, schedule.encoder)]
        found += [-1] * (3 - len(found))
        for col, x in zip(cols, found, strict=True):
            col.append(x)
    return cols


def final_ops(schedule: Schedule) -> Mapping[int, Op]:
    """Per stage, its final op: the last backward (or W, where the backward is split) in
    its rank's program order; the stage's gradients are complete after it. With a
    multimodal schedule's encoder, an encoder backward piece (``G``, whose stage field is
    its rank) later in the rank's order is the final op instead: the rank's encoder
    gradients are then complete too, and are reduced with the stage's. Worked out once per
    schedule and kept on it, read-only (as :func:`topological`; Megatron 1T's 64 ranks of
    2,048 ops: 3.5 ms a lowering). On the arrays validation keeps of a validated schedule's
    ops where it has them (:func:`_final_ops_coded`), else op by op (:func:`_final_ops`)."""
    found = schedule.__dict__.get("_final_ops")
    if found is None:
        coded = schedule.__dict__.get("_rank_coded") if schedule.encoder is None else None
        found = schedule.__dict__["_final_ops"] = MappingProxyType(
            _final_ops(schedule) if coded is None else _final_ops_coded(schedule, coded))
    return found


def _final_ops_coded(schedule: Schedule, coded: tuple[np.ndarray, ...]) -> dict[int, Op]:
    """:func:`_final_ops` of a schedule without an encoder, on its ops' stage and kind codes
    in rank order (:func:`workloads.schedules._rank_coded`: validation keeps them): the ops
    of the final kind, each stage's last one, the stages in order of their first one (the
    rank by rank scan's dict, whose later ranks update a stage they share in place). A
    few array passes over the ops, not a loop over them (Megatron 1T: ~60 M instructions
    of a run, 131,072 ops, most of them read for the set of each rank's stages)."""
    stage, kind = coded[0], coded[1]
    code = _KIND_CODE[WEIGHT_GRAD if schedule.split_backward else BACKWARD]
    at = np.flatnonzero(kind == code)
    if not len(at):
        return {}
    # the matches by stage, each stage's in rank order (a stable sort): a stage's first and
    # last match begin and end its run
    by_stage = at[np.argsort(stage[at], kind="stable")]
    cut = np.flatnonzero(np.diff(stage[by_stage])) + 1
    firsts = by_stage[np.concatenate(([0], cut))]
    lasts = by_stage[np.concatenate((cut, [len(by_stage)])) - 1]
    chosen = lasts[np.argsort(firsts)]  # (firsts are distinct positions)
    starts = np.cumsum([0] + [len(ops) for ops in schedule.rank_ops])
    if int(starts[-1]) != len(stage):  # (not the codes of these ops: never, as kept)
        return _final_ops(schedule)
    ranks = starts.searchsorted(chosen, "right") - 1
    rank_ops = schedule.rank_ops
    out: dict[int, Op] = {}
    for r, i in zip(ranks.tolist(), (chosen - starts[ranks]).tolist(), strict=True):
        op = rank_ops[r][i]
        out[op.stage] = op
    return out


def _final_ops(schedule: Schedule) -> dict[int, Op]:
    """:func:`final_ops`, worked out op by op (the reference of :func:`_final_ops_coded`)."""
    last_kind = WEIGHT_GRAD if schedule.split_backward else BACKWARD
    kinds = {last_kind} if schedule.encoder is None else {last_kind, ENCODER_BACKWARD}
    out: dict[int, Op] = {}
    if schedule.encoder is not None:
        for ops in schedule.rank_ops:
            for op in ops:
                if op.kind in kinds:
                    out[op.stage] = op
        return out
    for ops in schedule.rank_ops:
        # as the loop above: stages in order of their first such op, each its last one; both
        # found by scanning from either end until every stage on the rank is seen
        stages = len(set(map(itemgetter(0), ops)))
        first: dict[int, Op] = {}
        for op in ops:
            if op.kind in kinds and op.stage not in first:
                first[op.stage] = op
                if len(first) == stages:
                    break
        last: dict[int, Op] = {}
        for op in reversed(ops):
            if op.kind in kinds and op.stage not in last:
                last[op.stage] = op
                if len(last) == len(first):
                    break
        out.update((s, last[s]) for s in first)
    return out


def first_forwards(schedule: Schedule) -> frozenset[Op]:
    """Per stage, its first forward in its rank's program order: the op that gathers the
    stage's parameters under ``overlap_param_gather`` (the rest of the step reuses them)."""
    out: dict[int, Op] = {}
    for ops in schedule.rank_ops:
        for op in ops:
            if op.kind == FORWARD and op.stage not in out:
                out[op.stage] = op
    return frozenset(out.values())


def gather_chain(schedule: Schedule) -> dict[Op, Op]:
    """Per rank, each stage's first forward mapped to the next one in the rank's program
    order: under ``overlap_param_gather`` a rank's model chunks are one chain of
    all-gathers, the next chunk's dispatched as the forward reaches the last bucket of the
    chunk before (Megatron-core r0.8.0 megatron/core/optimizer/distrib_optimizer.py: the
    all-gather handles are the model chunks' buckets in chunk order,
    ``_finish_param_sync_helper`` dispatches handle i + 1 as it waits for handle i)."""
    firsts = first_forwards(schedule)
    out: dict[Op, Op] = {}
    for ops in schedule.rank_ops:
        mine = [op for op in ops if op in firsts]
        out.update(zip(mine, mine[1:], strict=False))
    return out

