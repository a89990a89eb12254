"""Advanced pipeline schedules: interleaved 1F1B, the Zero Bubble family, DualPipe-V, Seq1F1B.

Pure builders like those of :mod:`workloads.schedules`: each returns the order
of ops on every pipeline rank and nothing else; bubbles emerge when the ops run
with real durations (:func:`workloads.schedules.list_schedule` is the exact
oracle without communication).

Conventions (REFERENCES.md, "Pipeline schedules"): ``F`` and ``B`` are
whole-rank costs of one micro-batch; with ``v`` chunks per rank each chunk
costs ``F/v`` and ``B/v``. ``B`` is the whole backward; split-backward
schedules run it as a ``B`` op (input gradient, ``B - W``) and a ``W`` op
(weight gradient, ``W``).

Sources: Narayanan et al. 2021 (SC'21, sec. 2.2, interleaved 1F1B); Megatron-LM
``get_schedule_table`` / ``microbatch_group_size_per_vp_stage`` and Llama 3
(Dubey et al. 2024, sec. 3.3.2) for micro-batch counts that are not a multiple
of ``p``; Qi et al. 2024 (ICLR, "Zero Bubble Pipeline Parallelism", sec. 2 and
6) for ZB-H1, ZB-H2 and ZB-V, ordered like the reference code
(sail-sg/zero-bubble-pipeline-parallelism); DeepSeek-AI 2024 ("DeepSeek-V3
Technical Report", sec. 3.2.1) and the DualPipeV ("cut-in-half") order of the
reference code (deepseek-ai/DualPipe) for DualPipe-V; Sun et al. 2024
("Seq1F1B: Efficient Sequence-Level Pipeline Parallelism for Large Language
Model Training", sec. 3) and its reference code (thunlp/Seq1F1B)
for Seq1F1B.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from base.errors import ScheduleError
from workloads.memory import stash_fractions
from workloads.schedules import (
    BACKWARD,
    FORWARD,
    WEIGHT_GRAD,
    WHOLE,
    Op,
    Schedule,
    list_schedule,
    one_f_one_b,
    with_coded,
)

if TYPE_CHECKING:
    from fractions import Fraction

__all__ = [
    "dualpipe_v",
    "interleaved",
    "makespan",
    "megatron_groups",
    "microbatch_groups",
    "peak_activation",
    "repeat_steps",
    "seq1f1b",
    "steady_state_period",
    "uniform_duration",
    "v_stage_rank",
    "zb_h1",
    "zb_h2",
    "zb_v",
]


# ----------------------------------------------------------------------------- argument checks


def _check_args(name: str, p: int, m: int, v: int = 1) -> None:
    for key, value in (("p", p), ("m", m), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScheduleError(f"schedule {name}: {key}={value!r} must be an integer")
    if p < 1:
        raise ScheduleError(f"schedule {name}: pipeline size p={p} must be >= 1")
    if m < 1:
        raise ScheduleError(f"schedule {name}: micro-batches m={m} must be >= 1")
    if v < 1:
        raise ScheduleError(f"schedule {name}: chunks per rank v={v} must be >= 1")


def _check_v(name: str, v: int, allowed: int) -> None:
    if v != allowed:
        raise ScheduleError(
            f"schedule {name}: chunks per rank v={v} is not supported; {name} uses v={allowed}"
        )


# ----------------------------------------------------------------------------- interleaved 1F1B


def microbatch_groups(p: int, m: int) -> tuple[int, ...]:
    """Sizes of the groups of consecutive micro-batches that interleaved 1F1B walks chunk by chunk.

    Megatron-LM runs groups of ``microbatch_group_size_per_vp_stage`` (default
    ``p``) micro-batches through chunk 0, then the same group through chunk 1,
    and so on. When ``m`` is a multiple of ``p`` this returns ``m/p`` groups of
    ``p`` (Megatron exactly). Otherwise, like Llama 3's flexible ``N``
    (Dubey et al. 2024, sec. 3.3.2), it returns ``q = m // p`` groups whose
    sizes differ by at most one, larger groups first, so every group holds at
    least ``p`` micro-batches and none is larger than the first (the warm-up is
    sized by the first). For ``m < p`` it is one group of ``m``.

    Megatron's own choice for a remainder, a smaller last group, is refused by
    Megatron when it is below ``p`` ("dependency bubbles"); in an exact
    list-schedule run it also deadlocks for some (p, m, v), e.g. (4, 5, 3), and
    a larger last group deadlocks for others, e.g. (2, 5, 2).
    """
    if m < p:
        return (m,)
    q = m // p
    base, extra = divmod(m, q)
    return (base + 1,) * extra + (base,) * (q - extra)


def megatron_groups(p: int, m: int, n: int) -> tuple[int, ...]:
    """Megatron-core's micro-batch groups for ``microbatch_group_size_per_vp_stage = n``.

    ``megatron/core/pipeline_parallel/schedules.py`` ``get_schedule_table``: groups of ``n``
    consecutive micro-batches, the last one the remainder ``m mod n`` where it is not 0.
    Megatron's checks (``forward_backward_pipelining_with_interleaving``) as ScheduleError:
    ``p <= n <= m`` (ValueError there) and a remainder of 0 or at least ``p`` (RuntimeError
    there: a smaller last group "introduces dependency bubbles").
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise ScheduleError(f"schedule interleaved: micro-batch group size N={n!r} must be "
                            "an integer")
    if not p <= n <= m:
        raise ScheduleError(f"schedule interleaved: the number of contiguous micro-batches in a "
                            f"virtual pipeline stage N={n} should range in [PP={p}, M={m}]")
    rest = m % n
    if 0 < rest < p:
        raise ScheduleError(f"schedule interleaved: the remainder of M={m} divided by N={n} "
                            f"should be 0, or larger than or equal to the pipeline-parallel "
                            f"size {p}, but it is {rest} (dependency bubbles)")
    return (n,) * (m // n) + ((rest,) if rest else ())


def interleaved(p: int, m: int, v: int = 1, group_size: int | None = None) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, SC'21, sec. 2.2; Megatron-LM's virtual pipeline).

    Rank ``r`` holds the ``v`` chunks (stages) ``r, r + p, ..., r + (v-1)p``, so
    ``stage_rank[s] = s % p``. Forwards walk the groups of
    :func:`microbatch_groups`: group ``g`` through chunk 0, then chunk 1, ...,
    chunk ``v-1``; backwards walk the same order with chunks reversed. Rank
    ``r`` warms up with ``min(2(p - r - 1) + (v - 1)N, m v)`` chunk forwards
    (``N`` = size of the first group, Megatron's rule), alternates one chunk
    forward and one chunk backward, then drains the backwards.

    Closed form (REFERENCES.md), uniform stages, ``F``, ``B`` whole-rank costs
    and each chunk costing ``F/v``, ``B/v``::

        step = m (F + B) + (p - 1)(F + B) / v

    exact for every ``m >= p`` with the grouping above (Megatron and the
    Narayanan paper state it for ``m`` a multiple of ``p``; the tests check the
    other ``m`` too). Peak in-flight on rank 0: ``2(p - 1) + (v - 1)N + 1``
    chunk activations of ``1/v`` rank each; for ``N = p`` that is
    ``p (1 + (p - 1)/(p v))`` rank units, 1F1B's ``p`` times the factor of
    Korthikanti et al. 2022. Pipeline messages: ``v`` times 1F1B's.

    ``group_size`` is Megatron-core's ``microbatch_group_size_per_vp_stage``
    (``ModelParallelConfig``, ``--microbatch-group-size-per-virtual-pipeline-stage``;
    the ``N`` Llama 3 tunes, Dubey et al. 2024, sec. 3.3.2): groups of ``N`` as
    :func:`megatron_groups` cuts them, with Megatron's checks, and a warm-up of
    ``2(p - r - 1) + (v - 1)N``. None: the groups of :func:`microbatch_groups`
    (for ``m`` a multiple of ``p`` the same as ``N = p``, Megatron's default). The
    closed form above holds for every ``N`` the checks accept; the peak grows
    with ``N``, so ``N = p`` holds the fewest.

    Arguments: ``p >= 1``, ``m >= 1``, ``v >= 1``. Megatron requires
    ``p <= m`` (and ``m`` a multiple of ``p`` before its tunable group size);
    here ``m < p`` is allowed and runs one group of ``m`` (each rank then does
    all its forwards before its backwards, as GPipe; the closed form does not
    hold). ``v = 1`` is plain 1F1B (Megatron's non-interleaved warm-up
    ``p - r - 1``, not ``2(p - r - 1)``; a ``group_size`` is checked and has no
    effect, as in Megatron). ``p = 1`` with ``v > 1`` is allowed: all chunks on
    one rank, no bubble.
    """
    _check_args("interleaved", p, m, v)
    groups = microbatch_groups(p, m) if group_size is None else megatron_groups(p, m,
                                                                                 group_size)
    if v == 1:
        return replace(one_f_one_b(p, m), name="interleaved", notes="v=1: plain 1F1B")
    forward_order: list[tuple[int, int]] = []  # (micro-batch, chunk)
    first = 0
    for size in groups:
        for chunk in range(v):
            forward_order.extend((mb, chunk) for mb in range(first, first + size))
        first += size
    total = m * v
    mbs = [mb for mb, _ in forward_order]
    fwd_base = [chunk * p for _, chunk in forward_order]  # stage of rank 0's chunk
    bwd_base = [(v - 1 - chunk) * p for _, chunk in forward_order]
    ranks = []
    # the same ops as arrays (workloads.schedules.with_coded): each rank's ops as positions
    # in its forwards then backwards (``at``), their stages less the rank, micro-batches
    # and kinds
    both_base = np.array(fwd_base + bwd_base, dtype=np.int64)
    fwd_stage, bwd_stage = both_base[:total], both_base[total:]
    both_mb = np.array(mbs + mbs, dtype=np.int64)
    at = np.empty(2 * total, dtype=np.int64)
    stage, mb, kind = [], [], []
    for r in range(p):
        warmup = min(2 * (p - r - 1) + (v - 1) * groups[0], total)
        # Op(stage, kind, mb) built without the named tuple's Python-level __new__ (map
        # calling tuple.__new__(Op, fields) itself: ~15 % less than through partial's call)
        # (the rank's stages as ints from the arrays' sums: no Python loop over the ops)
        fwd = list(map(tuple.__new__, repeat(Op), zip((fwd_stage + r).tolist(),
                                                      repeat(FORWARD), mbs, repeat(WHOLE))))
        bwd = list(map(tuple.__new__, repeat(Op), zip((bwd_stage + r).tolist(),
                                                      repeat(BACKWARD), mbs, repeat(WHOLE))))
        steady = total - warmup  # one forward, then one backward, this many times
        ops: list[Op] = [fwd[0]] * (2 * total)
        ops[:warmup] = fwd[:warmup]
        ops[warmup:warmup + 2 * steady:2] = fwd[warmup:]
        ops[warmup + 1:warmup + 2 * steady:2] = bwd[:steady]
        ops[warmup + 2 * steady:] = bwd[steady:]
        ranks.append(tuple(ops))
        at[:warmup] = np.arange(warmup)
        at[warmup:warmup + 2 * steady:2] = np.arange(warmup, total)
        at[warmup + 1:warmup + 2 * steady:2] = np.arange(total, total + steady)
        at[warmup + 2 * steady:] = np.arange(total + steady, 2 * total)
        stage.append(both_base[at] + r)
        mb.append(both_mb[at])
        kind.append(at >= total)
    return with_coded(Schedule(
        "interleaved",
        m,
        tuple(s % p for s in range(p * v)),
        tuple(ranks),
        notes=f"Narayanan et al. 2021; v={v}; micro-batch groups {list(groups)}",
    ), np.concatenate(stage), np.concatenate(kind).astype(np.int64), np.concatenate(mb),
        np.full(2 * total * p, WHOLE, dtype=np.int64))


# ----------------------------------------------------------------------------- Zero Bubble


def _deferred_w_rank(r: int, m: int, warmup: int, deferred: int,
                     forward_first: bool) -> tuple[Op, ...]:
    """One rank of a ZB-H1/ZB-H2-style schedule, with split backward.

    ``warmup`` forwards; then ``deferred`` pairs of a forward and an input
    backward whose W is held back (``F B`` if ``forward_first`` else ``B F``);
    then ``F B W`` (or ``B W F``) triples while forwards remain; then ``B W``;
    then the held-back W's.
    """
    ops: list[Op] = []
    f = b = w = 0
    for _ in range(min(warmup, m)):
        ops.append(Op(r, FORWARD, f))
        f += 1
    for _ in range(deferred):
        if f == m:
            break
        pair = [Op(r, FORWARD, f), Op(r, BACKWARD, b)]
        ops += pair if forward_first else pair[::-1]
        f, b = f + 1, b + 1
    while f < m:
        if forward_first:
            ops += [Op(r, FORWARD, f), Op(r, BACKWARD, b), Op(r, WEIGHT_GRAD, w)]
        else:
            ops += [Op(r, BACKWARD, b), Op(r, WEIGHT_GRAD, w), Op(r, FORWARD, f)]
        f, b, w = f + 1, b + 1, w + 1
    while b < m:
        ops += [Op(r, BACKWARD, b), Op(r, WEIGHT_GRAD, w)]
        b, w = b + 1, w + 1
    ops += [Op(r, WEIGHT_GRAD, mb) for mb in range(w, m)]
    return tuple(ops)


def zb_h1(p: int, m: int, v: int = 1) -> Schedule:
    """ZB-H1, Zero Bubble's memory-efficient handcrafted schedule (Qi et al. 2024, ICLR, sec. 2.1).

    The backward is split into ``B`` (input gradient) and ``W`` (weight
    gradient). Rank ``r`` runs 1F1B's order (warm-up ``p - r - 1`` forwards,
    then forward/backward pairs) but defers its first ``r`` ``W`` ops: the
    first ``r`` pairs are ``F B``, the following ones ``F B W`` (``W`` of the
    oldest micro-batch still owing one), the cool-down ``B W``, and the ``r``
    deferred ``W`` fill the tail that 1F1B leaves idle. This is the order of
    the reference code's ZB-H1 (sail-sg/zero-bubble-pipeline-parallelism, the
    DeepSpeed port with exact semantics). Every rank holds at most ``p``
    micro-batches between ``F`` and ``W``: 1F1B's peak.

    Closed form, uniform stages, ``B`` the whole backward (the ``B`` op costs
    ``B - W``, the ``W`` op ``W``)::

        step = m (F + B) + (p - 1)(F + B - 2W)

    i.e. a bubble of ``(p - 1)(F + B_input - W)``, one third of 1F1B's when
    ``F = B_input = W``. Exact (list-schedule run) when ``W <= F`` and
    ``W <= B_input``, and ``m >= p``; the tests check a grid of such values.

    Arguments: ``p >= 1``, ``m >= 1`` (``m < p`` runs, but the closed form
    does not hold), ``v = 1`` only.
    """
    _check_args("zb-h1", p, m, v)
    _check_v("zb-h1", v, 1)
    ranks = [_deferred_w_rank(r, m, warmup=p - r - 1, deferred=r, forward_first=True)
             for r in range(p)]
    return Schedule(
        "zb-h1",
        m,
        tuple(range(p)),
        tuple(ranks),
        split_backward=True,
        notes="Qi et al. 2024, ZB-H1",
    )


def zb_h2(p: int, m: int, v: int = 1) -> Schedule:
    """ZB-H2, Zero Bubble's zero-bubble handcrafted schedule (Qi et al. 2024, ICLR, sec. 2.2).

    More warm-up forwards fill the bubble before the first ``B``, and deferred
    ``W`` fill the tail, turning 1F1B's trapezoid into a parallelogram. Rank
    ``r``: ``2(p - r) - 1`` warm-up forwards (as many as fit before its first
    ``B`` can arrive when ``F = B_input = W``); then ``2r`` pairs ``B F``
    (``W`` deferred); then ``B W F`` while forwards remain; then ``B W``; then
    the ``2r`` deferred ``W``. Every rank holds at most ``2p - 1`` micro-batches
    between ``F`` and ``W`` (1F1B: ``p``), the paper's ``(2p - 1) M_B``.

    Closed form with ``F = B_input = W`` and ``m >= 2p - 1`` (checked exactly
    by the tests): every rank ``r`` is busy without a gap from ``r F`` to
    ``r F + m (F + B)``, so the bubble is 0 and back-to-back steps repeat with
    period ``m (F + B)`` (:func:`steady_state_period`); that needs the paper's
    optimizer post-validation instead of a step barrier. One isolated step
    still lasts ``m (F + B) + (p - 1) F`` (the last rank cannot start earlier),
    the same as ZB-H1 (REFERENCES.md). With other costs ZB-H2 is not bubble
    free but its isolated step is never longer than ZB-H1's in the tests.

    Arguments: ``p >= 1``, ``m >= 1`` (for ``m < 2p - 1`` the warm-up is
    capped by ``m``; the order stays valid), ``v = 1`` only.
    """
    _check_args("zb-h2", p, m, v)
    _check_v("zb-h2", v, 1)
    ranks = [_deferred_w_rank(r, m, warmup=2 * (p - r) - 1, deferred=2 * r, forward_first=False)
             for r in range(p)]
    return Schedule(
        "zb-h2",
        m,
        tuple(range(p)),
        tuple(ranks),
        split_backward=True,
        notes="Qi et al. 2024, ZB-H2",
    )


def v_stage_rank(p: int) -> tuple[int, ...]:
    """V placement of ``2p`` stages: rank ``r`` holds stages ``r`` and ``2p - 1 - r``."""
    return tuple(s if s < p else 2 * p - 1 - s for s in range(2 * p))


def zb_v(p: int, m: int, v: int = 2) -> Schedule:
    """ZB-V (Qi et al. 2024, ICLR, sec. 6; "ZBV" in the reference code): two chunks in a V.

    Rank ``r`` holds chunk 0 = stage ``r`` and chunk 1 = stage ``2p - 1 - r``
    (:func:`v_stage_rank`), so rank 0 runs both the first and the last stage
    and a micro-batch's forward goes down the ranks and back up. Split
    backward. The order is the reference code's handcrafted ZB-V
    (``get_zb_v_schedule``), built for ``n = max(m, 2p - 1)`` micro-batches and
    then stripped of the micro-batches ``>= m`` (dropping ops keeps the order
    acyclic). Rank ``r``, with c0/c1 its chunks:

    1. ``2(p - r) - 1`` forwards of c0;
    2. ``r`` times: F c1, F c0;
    3. ``p - r`` times: F c1, B c1, W c1;
    4. while forwards remain: F c0 (if any left), B c0, W c0, F c1, B c1, W c1;
    5. ``r`` times: B c0, B c1 (their W deferred); ``p - r`` times: B c0 and
       the oldest deferred W c0; then the deferred W c1, then the W c0.

    Closed form with ``F = B_input = W`` (whole-rank costs, each chunk half of
    them) and ``m >= 2p - 1``, checked exactly by the tests: back-to-back steps
    repeat with period ``m (F + B)`` (bubble 0) and one isolated step lasts
    ``m (F + B) + (p - 1) F / 2``: chunks are half as long, so the start-up
    halves. Peak in-flight activation is ``2p`` chunk activations of half a
    rank each, ``p`` rank units: 1F1B's (:func:`peak_activation`). Pipeline
    messages double (two chunk boundaries per rank).

    Arguments: ``p >= 1``, ``m >= 1``, ``v = 2`` only (the experiment's
    ``vpp`` must be 2; chunk costs are half the rank's).
    """
    _check_args("zb-v", p, m, v)
    _check_v("zb-v", v, 2)
    n = max(m, 2 * p - 1)
    ranks = []
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r
        ops: list[Op] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (p - r) - 1):
            ops.append(Op(c0, FORWARD, f0))
            f0 += 1
        for _ in range(r):
            ops += [Op(c1, FORWARD, f1), Op(c0, FORWARD, f0)]
            f0, f1 = f0 + 1, f1 + 1
        for _ in range(p - r):
            ops += [Op(c1, FORWARD, f1), Op(c1, BACKWARD, b1), Op(c1, WEIGHT_GRAD, b1)]
            f1, b1 = f1 + 1, b1 + 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                ops.append(Op(c0, FORWARD, f0))
                f0 += 1
            ops += [Op(c0, BACKWARD, b0), Op(c0, WEIGHT_GRAD, b0)]
            ops += [Op(c1, FORWARD, f1), Op(c1, BACKWARD, b1), Op(c1, WEIGHT_GRAD, b1)]
            f1, b0, b1 = f1 + 1, b0 + 1, b1 + 1
        w0, w1 = b0, b1
        for _ in range(r):
            ops += [Op(c0, BACKWARD, b0), Op(c1, BACKWARD, b1)]
            b0, b1 = b0 + 1, b1 + 1
        for _ in range(p - r):
            ops += [Op(c0, BACKWARD, b0), Op(c0, WEIGHT_GRAD, w0)]
            b0, w0 = b0 + 1, w0 + 1
        ops += [Op(c1, WEIGHT_GRAD, mb) for mb in range(w1, b1)]
        ops += [Op(c0, WEIGHT_GRAD, mb) for mb in range(w0, b0)]
        if not (f0 == f1 == b0 == b1 == n):  # pragma: no cover - structural invariant
            raise ScheduleError(f"zb-v: internal count mismatch on rank {r} for p={p}, m={m}")
        ranks.append(tuple(op for op in ops if op.mb < m))
    return Schedule(
        "zb-v", m, v_stage_rank(p), tuple(ranks), split_backward=True, notes="Qi et al. 2024, ZB-V"
    )


# ----------------------------------------------------------------------------- DualPipe-V


def dualpipe_v(p: int, m: int, v: int = 2) -> Schedule:
    """DualPipe-V: DeepSeek's DualPipe "cut in half" onto a V placement (DeepSeek-AI 2024).

    DualPipe (DeepSeek-V3 Technical Report, sec. 3.2.1, fig. 4-5, table 2) overlaps the
    forward of one micro-batch with the backward of another on each rank so
    that the expert-parallel all-to-alls of one hide behind the compute of the
    other. DualPipe-V (the reference code's ``DualPipeV``) keeps that order on
    ``p`` ranks with the V placement of ZB-V (:func:`v_stage_rank`): rank ``r``
    holds chunk 0 = stage ``r`` and chunk 1 = stage ``2p - 1 - r``. Rank ``r``,
    with F0/F1, B0/B1 the forwards and backwards of its two chunks, micro-batches
    taken in order per chunk:

    1. ``2(p - r - 1)`` times F0;
    2. ``r + 1`` times F0, F1;
    3. ``p - r - 1`` times B1 (input gradient), W1 (its weight gradient), F1;
    4. ``m - 2p + r + 1`` times the overlapped pairs F0&B1, F1&B0 (on the last
       rank the first F0 and B1 run separately, as the reference does to shorten
       the bubble);
    5. ``p - r - 1`` times B1, F1&B0;
    6. ``r + 1`` times B1, B0 -- from the middle iteration on their weight
       gradients are deferred (zero-bubble style, the reference's
       ``enable_zb``);
    7. ``p - r - 1`` times the oldest deferred W, then B0 with W deferred;
    8. ``r + 1`` times the oldest deferred W.

    Representation: the schedule splits the backward (``B`` input gradient,
    ``W`` weight gradient). A full backward that does not defer its weight
    gradient is the fused group ``B&W``; an overlapped pair is the fused group
    ``F&B&W`` (text form ``0F5&7B2&7W2``). A fused group starts when all its
    members' inputs have arrived, runs as one compute op of the members' summed
    cost and sends its outputs at its end, as the reference's
    ``_forward_backward_chunk`` does (receive both, compute, send both). With
    no expert-parallel communication the overlap saves nothing: an F&B pair
    costs F + B of compute. The reference's extra synchronisation (it commits
    pending receives before a W) is not modelled.

    Closed form (the DualPipe README's table, ``PP = 2p`` stages, F, B, W per
    chunk, F&B = F + B here): bubble ``(p - 1)(F&B + B - 3W)``, i.e. one step
    lasts ``2m(F + B) + (p - 1)(F + 2B - 3W)`` per-chunk units. The list-schedule
    run reproduces it exactly when ``F = B - W`` (forward = input gradient, the
    paper's setting) and ``W <= F``, for ``m >= 2p`` (tests); with other costs
    the step differs from the table in both directions.

    Memory: the peak on rank 0 is ``2p + 1`` chunk activations (the README's
    ``PP + 1``), ``p + 1/2`` rank units. Parameters: each rank holds two of the
    ``2p`` stages, the same share of the model as 1F1B on ``p`` ranks -- the
    README's "2x" is relative to a ``2p``-stage split. Only the bidirectional
    DualPipe, not built here, keeps two copies of every stage's parameters.

    Arguments: ``p >= 1``, ``m >= 1``, ``v = 2`` only. The reference requires
    ``m >= 2p``; for smaller ``m`` the order is built for ``2p`` micro-batches
    and the ops of the micro-batches ``>= m`` are dropped (as :func:`zb_v` does;
    dropping ops keeps the order acyclic).
    """
    _check_args("dualpipe-v", p, m, v)
    _check_v("dualpipe-v", v, 2)
    n = max(m, 2 * p)
    ranks: list[tuple[Op, ...]] = []
    fused: set[Op] = set()
    for r in range(p):
        groups = _dualpipe_v_rank(p, r, n)
        kept = [tuple(op for op in g if op.mb < m) for g in groups]
        kept = [g for g in kept if g]
        ranks.append(tuple(op for g in kept for op in g))
        fused.update(op for g in kept for op in g[:-1])
    return Schedule(
        "dualpipe-v",
        m,
        v_stage_rank(p),
        tuple(ranks),
        split_backward=True,
        notes="DeepSeek-AI 2024, DualPipeV (cut-in-half DualPipe)",
        fused=frozenset(fused),
    )


def _dualpipe_v_rank(p: int, r: int, n: int) -> list[list[Op]]:
    """Rank ``r``'s program for ``n >= 2p`` micro-batches as a list of fused groups."""
    chunk = (r, 2 * p - 1 - r)
    nf, nb = [0, 0], [0, 0]
    deferred: deque[Op] = deque()
    groups: list[list[Op]] = []

    def fwd(phase: int) -> list[Op]:
        nf[phase] += 1
        return [Op(chunk[phase], FORWARD, nf[phase] - 1)]

    def bwd(phase: int, defer_w: bool) -> list[Op]:
        nb[phase] += 1
        b = Op(chunk[phase], BACKWARD, nb[phase] - 1)
        w = Op(chunk[phase], WEIGHT_GRAD, nb[phase] - 1)
        if defer_w:
            deferred.append(w)
            return [b]
        return [b, w]  # a full backward: input and weight gradient in one go

    def w_oldest() -> list[Op]:
        return [deferred.popleft()]

    for _ in range(2 * (p - r - 1)):
        groups.append(fwd(0))
    for _ in range(r + 1):
        groups += [fwd(0), fwd(1)]
    for _ in range(p - r - 1):
        groups += [bwd(1, True), w_oldest(), fwd(1)]
    for i in range(n - 2 * p + r + 1):
        if i == 0 and r == p - 1:
            groups += [fwd(0), bwd(1, False)]
        else:
            groups.append(fwd(0) + bwd(1, False))
        groups.append(fwd(1) + bwd(0, False))
    for _ in range(p - r - 1):
        groups += [bwd(1, False), fwd(1) + bwd(0, False)]
    defer = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            defer = True
        groups.append(bwd(1, defer))
        if i == (r + 1) // 2 and r % 2 == 0:
            defer = True
        groups.append(bwd(0, defer))
    for _ in range(p - r - 1):
        groups += [w_oldest(), bwd(0, True)]
    for _ in range(r + 1):
        groups.append(w_oldest())
    if deferred or nf != [n, n] or nb != [n, n]:  # pragma: no cover - structural invariant
        raise ScheduleError(f"dualpipe-v: internal count mismatch on rank {r} for p={p}, n={n}")
    return groups


# ----------------------------------------------------------------------------- Seq1F1B


def seq1f1b(p: int, m: int, v: int = 1, k: int = 4) -> Schedule:
    """Seq1F1B (Sun et al. 2024, sec. 3; reference code thunlp/Seq1F1B): 1F1B over sequence chunks.

    Each micro-batch is split along the sequence into ``k`` chunks of equal
    FLOPs (the cost model places the boundaries: later chunks are shorter since
    causal attention covers a longer prefix). The units of 1F1B become
    (micro-batch, chunk) pairs: forwards run chunk ``0, 1, ..., k-1`` of each
    micro-batch, backwards chunk ``k-1, ..., 0`` (a chunk's keys and values get
    gradients from every later chunk; :func:`~workloads.schedules.op_deps`).
    Rank ``r`` warms up with ``min(p - r - 1 + k - 1, m k)`` chunk forwards
    (the reference's ``p - r + k - 2``: the first backward, of the last chunk,
    needs all ``k`` forwards of its micro-batch on the last stage), alternates
    one chunk forward and one chunk backward, then drains the backwards.

    With uniform stages and each chunk costing ``(F + B)/k``, one step lasts
    about ``m (F + B) + (p - 1)(F + B)/k``: the start-up and drain shrink with
    the chunks, so the bubble is about ``1/k`` of 1F1B's (the paper's
    ``(p - 1)/(k m)`` of ideal, REFERENCES.md). Rank ``r`` holds at most
    ``p - r + k - 1`` chunks of activations (1F1B: ``p - r`` whole
    micro-batches), earlier chunks' keys and values included: they stay until
    the chunk's own backward, which runs after every later chunk's.

    Arguments: ``p >= 1``, ``m >= 1``, ``v = 1`` only, ``k >= 1`` (``k = 1``
    is plain 1F1B).
    """
    _check_args("seq1f1b", p, m, v)
    _check_v("seq1f1b", v, 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ScheduleError(f"schedule seq1f1b: sequence chunks k={k!r} must be an integer >= 1")
    notes = f"Sun et al. 2024, Seq1F1B; k={k}"
    if k == 1:
        return replace(one_f_one_b(p, m), name="seq1f1b", notes=notes)
    forward = [(mb, c) for mb in range(m) for c in range(k)]
    backward = [(mb, k - 1 - c) for mb in range(m) for c in range(k)]
    total = m * k
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1 + k - 1, total)
        fwd = [Op(r, FORWARD, mb, c) for mb, c in forward]
        bwd = [Op(r, BACKWARD, mb, c) for mb, c in backward]
        ops = fwd[:warmup]
        for i in range(total - warmup):
            ops += [fwd[warmup + i], bwd[i]]
        ops += bwd[total - warmup :]
        ranks.append(tuple(ops))
    return Schedule("seq1f1b", m, tuple(range(p)), tuple(ranks), notes=notes, seq_chunks=k)


# ----------------------------------------------------------------------------- analysis helpers


def uniform_duration(
    schedule: Schedule, forward: float, backward: float, weight_grad: float = 0.0
) -> Callable[[Op], float]:
    """Op durations for uniform stages (REFERENCES.md convention).

    ``forward`` and ``backward`` are whole-rank costs of one micro-batch
    (``backward`` the whole backward); with ``v`` chunks per rank each chunk
    costs ``1/v`` of them, and with ``k`` sequence chunks (Seq1F1B, equal
    FLOPs by construction) each sequence chunk ``1/k`` of that. If the schedule
    splits the backward, its ``B`` op costs ``backward - weight_grad`` and its
    ``W`` op ``weight_grad`` (per rank, before the ``1/v``); otherwise
    ``weight_grad`` is ignored.
    """
    share = schedule.chunks_per_rank * schedule.seq_chunks
    if schedule.split_backward:
        costs = {FORWARD: forward, BACKWARD: backward - weight_grad, WEIGHT_GRAD: weight_grad}
    else:
        costs = {FORWARD: forward, BACKWARD: backward}
    per_chunk = {kind: cost / share for kind, cost in costs.items()}
    return lambda op: per_chunk[op.kind]


def makespan(schedule: Schedule, duration: Callable[[Op], float]) -> float:
    """Length of one isolated step: the end of the last op in :func:`list_schedule`."""
    return max(end for _, end in list_schedule(schedule, duration).values())


def repeat_steps(schedule: Schedule, steps: int) -> Schedule:
    """``steps`` back-to-back training steps as one schedule, with no barrier between them.

    Each rank runs its program ``steps`` times; micro-batch ``mb`` of step
    ``i`` becomes ``mb + i m``. This is what ZB-H2 and ZB-V need to show their
    zero bubble: the Zero Bubble paper's optimizer post-validation removes the
    step barrier, so consecutive steps overlap.
    """
    if steps < 1:
        raise ScheduleError(f"repeat_steps: steps={steps} must be >= 1")
    m = schedule.num_microbatches
    ranks = tuple(
        tuple(op.renumbered(op.mb + i * m) for i in range(steps) for op in ops)
        for ops in schedule.rank_ops
    )
    fused = frozenset(op.renumbered(op.mb + i * m) for i in range(steps) for op in schedule.fused)
    return replace(schedule, num_microbatches=m * steps, rank_ops=ranks, fused=fused)


def steady_state_period(
    schedule: Schedule, duration: Callable[[Op], float], steps: int = 4
) -> float:
    """Period of back-to-back steps: makespan of ``steps`` steps minus that of ``steps - 1``.

    Exact once the start-up transient is over; for the schedules here it is
    over after one step. ``duration`` sees the renumbered micro-batches of
    :func:`repeat_steps`.
    """
    if steps < 2:
        raise ScheduleError(f"steady_state_period: steps={steps} must be >= 2")
    return makespan(repeat_steps(schedule, steps), duration) - makespan(
        repeat_steps(schedule, steps - 1), duration
    )


def peak_activation(schedule: Schedule) -> tuple[Fraction, ...]:
    """Peak stashed activations per rank, in units of one rank's activations of one micro-batch.

    Walks each rank's program order: a forward of a chunk adds ``1/v`` (the
    chunk holds ``1/v`` of the rank's layers; a Seq1F1B sequence chunk
    ``1/(v k)``, taking chunks as equal); it is freed by the chunk's ``W`` if
    the schedule splits the backward (the weight gradient still needs the
    stashed inputs), else by its ``B``. 1F1B's rank 0 peaks at ``p``. Ops of
    a fused group count in program order (the group's forward allocates before
    its backward frees, as in the engine).
    """
    from fractions import Fraction  # (only here: ~4 M instructions of every run's imports)

    unit = Fraction(1, schedule.chunks_per_rank * schedule.seq_chunks)
    peaks = []
    for ops in schedule.rank_ops:
        live = peak = Fraction(0)
        for op in ops:  # the memory model's stash rule, all of it held until the W (w = 1)
            alloc, free = stash_fractions(op.kind, schedule.split_backward, 1.0)
            if alloc:
                live += unit * Fraction(alloc)
                peak = max(peak, live)
            live -= unit * Fraction(free)
        peaks.append(peak)
    return tuple(peaks)


