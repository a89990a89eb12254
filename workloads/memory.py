"""The memory model: what a GPU holds during a step, and whether it fits. Pure.

One home for the rules that the lowering (which allocations an op makes), the
statistics (the peak a GPU reports), the OOM verdict and the layout search's
memory bounds all follow:

- **Model state** (weights, gradients, optimizer state) is held for the whole
  step: mixed-precision Adam keeps 16 bytes per parameter, which ZeRO shards
  over the data-parallel replicas (:func:`model_state_bytes_per_param`,
  Rajbhandari et al. 2020, sec. 3.1).
- **Stashed activations**: a forward stashes its micro-batch's activations when it
  starts; its backward frees them when it ends, or, when the schedule splits the
  weight gradient off, all but the share ``w`` that the ``W`` op still needs, which
  the ``W`` frees (:func:`stash_fractions`). A Seq1F1B sequence chunk stashes its
  share of the micro-batch's (:func:`stash_bytes`).
- **Working memory** (``transient_bytes`` of the cost model: recomputation,
  gradient buffers, ZeRO-3's gathered parameters) is held only while its op runs
  (:func:`op_alloc_free`).
- **The allocator**: the dynamic part above the static state (activations and
  working memory, carved and freed every step) carries the caching allocator's
  fragmentation overhead; the static state, allocated once in a few large blocks,
  does not; reserved memory (CUDA context, workspaces) comes on top
  (:func:`device_bytes`).
- **OOM**: a GPU is out of memory when that peak exceeds its capacity (:func:`oom`).

The byte counts of each tensor (how large a layer's activations are) belong to the
cost model (:mod:`workloads.transformer`, :mod:`workloads.costs`); this module
turns them into allocations and peaks. It depends on the schedule's op kinds only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from workloads.schedules import (
    BACKWARD,
    ENCODER_BACKWARD,
    ENCODER_FORWARD,
    FORWARD,
    WEIGHT_GRAD,
    Op,
)


def model_state_bytes_per_param(zero_stage: int, shards: int, grad_bytes: float = 2.0) -> float:
    """Model-state bytes per parameter under ZeRO stage ``zero_stage`` over ``shards`` replicas.

    Mixed-precision Adam keeps a bf16 weight (2 bytes) and a gradient of ``grad_bytes`` g (2
    in bf16; DeepSpeed's bf16 optimizer accumulates in fp32, 4) and an fp32 master weight,
    momentum and variance (12): 2 + g + 12 (ZeRO-0), 2 + g + 12/d (ZeRO-1: optimizer state
    sharded), 2 + (g + 12)/d (ZeRO-2: and the gradients), (2 + g + 12)/d (ZeRO-3: and the
    weights), with d = ``shards``; with g = 2: 16, 4 + 12/d, 2 + 14/d, 16/d (Rajbhandari et
    al. 2020, sec. 3.1 and fig. 1).
    """
    d, g = shards, grad_bytes
    return {0: 2 + g + 12.0, 1: 2 + g + 12 / d, 2: 2 + (g + 12) / d,
            3: (2 + g + 12) / d}[zero_stage]


class StashModel(Protocol):
    """What the memory model reads from a cost model (see :mod:`workloads.costs`)."""

    w_retained_fraction: float

    def activation_bytes_per_mb(self, stage: int) -> float: ...


def stash_fractions(kind: str, split_backward: bool, w: float) -> tuple[float, float]:
    """(Share of its stash an op of ``kind`` allocates at its start, share it frees at its
    end): a forward allocates the whole, a backward frees the whole (``1 - w`` when the
    weight gradient is split off), a ``W`` frees the retained share ``w``
    (:attr:`TransformerCosts.w_retained_fraction`); an encoder piece's forward (``E``)
    allocates its stash and its backward (``G``) frees it."""
    if kind in (FORWARD, ENCODER_FORWARD):
        return 1.0, 0.0
    if kind == ENCODER_BACKWARD:
        return 0.0, 1.0
    if kind == BACKWARD:
        return 0.0, (1 - w) if split_backward else 1.0
    if kind == WEIGHT_GRAD:
        return 0.0, w
    return 0.0, 0.0


def stash_bytes(costs: StashModel, op: Op) -> float:
    """Activation bytes ``op``'s forward stashes and its backward (and W) frees.

    A Seq1F1B sequence chunk (``op.seq >= 0``) stashes its share of the
    micro-batch's activations, given by the cost model's ``seq_chunk_share``; an
    encoder piece (``E`` or ``G``) the piece's, given by its ``encoder_stash_bytes``.
    """
    if op.kind in (ENCODER_FORWARD, ENCODER_BACKWARD):
        return costs.encoder_stash_bytes(op)  # type: ignore[attr-defined]
    whole = costs.activation_bytes_per_mb(op.stage)
    if op.seq < 0:
        return whole
    share = getattr(costs, "seq_chunk_share", None)
    if share is None:
        raise ValueError(f"op {op} is a sequence chunk but {type(costs).__name__} has none")
    return whole * share(op)


def op_alloc_free(costs: StashModel, op: Op, split_backward: bool) -> tuple[float, float]:
    """Bytes ``op`` allocates at its start and frees at its end, on one GPU of its stage:
    its stash (:func:`stash_fractions` of :func:`stash_bytes`) plus the working memory it
    holds while it runs (the cost model's ``transient_bytes``, if it has one)."""
    act = stash_bytes(costs, op)
    share_alloc, share_free = stash_fractions(op.kind, split_backward,
                                              costs.w_retained_fraction)
    alloc, free = act * share_alloc, act * share_free
    transient = getattr(costs, "transient_bytes", None)
    if transient is not None:
        extra = transient(op)
        alloc, free = alloc + extra, free + extra
    return alloc, free


def in_flight(ops: Sequence[Op], stages: tuple[int, ...], split_backward: bool, w: float
              ) -> np.ndarray:
    """A rank's program order walked as the engine allocates: one row per distinct moment
    an op starts, holding the micro-batches in flight of each local stage (columns follow
    ``stages``) and, last column, the op's slot ``3·stage + kind`` (F, B, W: for the
    working memory it holds while it runs).

    Independent of the cost model: the stash of stage ``s`` at a row is its count times
    ``activation_bytes_per_mb(s)``, by :func:`stash_fractions`. Ops on a rank run one at
    a time, so memory peaks at some op's start.
    """
    slot = {FORWARD: 0, BACKWARD: 1, WEIGHT_GRAD: 2}
    shares = {kind: stash_fractions(kind, split_backward, w) for kind in slot}
    local = {s: i for i, s in enumerate(stages)}
    live = [0.0] * len(stages)
    points = []
    for op in ops:
        j = local[op.stage]
        alloc, free = shares[op.kind]
        if alloc:
            live[j] += alloc
        points.append((*live, 3.0 * op.stage + slot[op.kind]))
        if free:
            live[j] -= free
    if not points:
        return np.zeros((1, len(stages) + 1))
    return np.unique(np.array(points, dtype=float), axis=0)


def stash_at_rows(rows: np.ndarray, act: Sequence[float]) -> np.ndarray:
    """Each row's stashed activation bytes: the in-flight counts of :func:`in_flight`'s
    stage columns times ``act`` (``activation_bytes_per_mb`` of each local stage, in the
    columns' order), summed column by column from the left.

    Elementwise products and sums, not a matrix-vector product: BLAS picks its kernel (and
    with it the order and fusing of the additions) by CPU, so ``rows[:, :-1] @ act`` can
    differ in the last bit between machines, and a layout within a rounding error of the
    capacity would then screen differently. These are the same bits everywhere.
    """
    if len(act) != rows.shape[1] - 1:
        raise ValueError(f"{rows.shape[1] - 1} stage columns but {len(act)} stash sizes")
    total = np.zeros(rows.shape[0])
    for j, a in enumerate(act):
        total += rows[:, j] * a
    return total


def device_bytes(static_bytes: float, dynamic_bytes: float, fragmentation: float,
                 reserved_bytes: float = 0.0) -> float:
    """Bytes a GPU holds at a moment: the static state as is, the dynamic memory above it
    with the allocator's ``fragmentation`` overhead, plus ``reserved_bytes``."""
    return static_bytes + dynamic_bytes * (1 + fragmentation) + reserved_bytes


def oom(peak: float, capacity: float, slack: float = 0.0) -> bool:
    """Whether a peak of ``peak`` overflows ``capacity`` (same unit), allowing a relative
    ``slack`` (a bound this close to the capacity, summed in another order, is not OOM)."""
    return peak > capacity * (1 + slack)
