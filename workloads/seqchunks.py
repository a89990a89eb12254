"""Where Seq1F1B cuts a micro-batch into sequence chunks of equal FLOPs. Pure.

Seq1F1B (Sun et al. 2024, NAACL'25, sec. 3; reference code thunlp/Seq1F1B)
splits each micro-batch along the sequence into ``k`` chunks and pipelines
the chunks. Chunk ``c`` covers tokens ``[x_c, x_{c+1})`` (fractions of the
sequence) and, attention being causal, its queries attend to keys
``[0, x_{c+1})``. Its work has three parts:

- per-token work (the GEMMs: QKV, output projection, MLP or router and
  experts): proportional to ``x_{c+1} - x_c``;
- causal attention a kernel that skips masked blocks executes (FlashAttention):
  a query at position ``x`` reads the ``x`` prefix, so the chunk costs
  ``x_{c+1}^2 - x_c^2`` of the whole micro-batch's attention;
- attention a kernel that materialises the score matrix executes (``fused``,
  ``unfused``): the chunk's whole ``(x_{c+1} - x_c) x x_{c+1}`` block of
  queries against its prefix (a share ``(x_{c+1} - x_c) x_{c+1}`` of the whole
  ``s x s`` matrix; over the chunks this is less than the whole, as the
  blocks right of each chunk's end are never computed).

The paper places the boundaries so every chunk has the same FLOPs (its
reference code solves the equation symbolically); :func:`equal_cost_bounds`
solves it in closed form (causal only) or by bisection on the per-chunk target.
The shares come from the real model (:func:`layer_work_shares`): the GEMM and
attention FLOPs of one transformer layer's forward and backward as the cost
model's kernels execute them (recomputation included), so they depend on the
sequence length, hidden and FFN sizes, grouped-query K/V width, MoE routing and
the attention kernel.

What a chunk costs is the cost model's own formulas over its window
(:meth:`workloads.transformer.TransformerCosts.seq_chunk`): its tokens size the
GEMMs (whose shapes the device model sees), memory-bound kernels, TP/SP and EP
collectives, pipeline messages, stashed activations and working memory, so the
k chunks add up to the whole micro-batch exactly, except that every chunk's
GEMMs read the weights again. A chunk's stash holds its keys and values; it is
freed at the chunk's own backward, which runs after every later chunk's (they
attended to them).

Whole tokens (:func:`rounded_bounds`), as the reference code places them
(``megatron/core/pipeline_parallel/sequence_split.py``, ``solve_partition``): it
solves the chunks from the last one back, each for the per-chunk target given
where the next one starts, rounds each length down to a multiple of ``mod`` (the
TP degree with sequence parallelism, which shards every chunk's tokens over the
``t`` ranks, else 1) and gives the first chunk the rest of the sequence. Chunks
are then as close to equal FLOPs as the rounding allows, the first one up to
``(k - 1)·mod`` tokens longer.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from base.errors import ConfigError
from workloads.schedules import BACKWARD, FORWARD, Op

if TYPE_CHECKING:
    from workloads.costs import Segment

WHOLE_WINDOW = (0.0, 1.0)
"""The window of a cost model that covers whole sequences (no sequence chunk)."""

_BISECTIONS = 200
"""Halvings of the per-chunk target (far more than float precision needs; it stops early)."""


class _SequenceModel(Protocol):
    seq_length: int


class ChunkedCosts(Protocol):
    """What :func:`layer_work_shares` reads from a cost model."""

    attention: str
    tp: int
    sequence_parallel: bool

    @property
    def model(self) -> _SequenceModel: ...

    def op_segments(self, op: Op, split_backward: bool,
                    markers: bool = False) -> tuple[Segment, ...]: ...


FLASH_KERNELS = ("flash1", "flash2", "flash3", "flash-triton", "cudnn")
"""The FlashAttention kernels (Dao et al. 2022; Dao 2023; Shah et al. 2024; flash-triton, Tri
Dao's Triton version of FlashAttention, flash_attn/flash_attn_triton.py; cudnn, cuDNN's fused
flash attention behind Transformer Engine): tiled, no score matrix in memory, masked blocks
skipped under a causal mask."""


def causal_kernel(attention: str) -> bool:
    """True if the attention kernel skips the masked half (flash), so its work per query
    follows the query's prefix; False if it computes the full score matrix."""
    return attention in FLASH_KERNELS


def window_tokens_share(window: tuple[float, float]) -> float:
    """Share of a micro-batch's tokens (and per-token work) in ``window = (lo, hi)``."""
    lo, hi = window
    return hi - lo


def window_attention_share(window: tuple[float, float], causal: bool) -> float:
    """Share of the whole micro-batch's attention-kernel work that ``window``'s queries do
    against their prefix ``[0, hi)``: ``hi^2 - lo^2`` for a causal (flash) kernel, the
    block ``(hi - lo) hi`` of the score matrix otherwise (module docstring)."""
    lo, hi = window
    return hi * hi - lo * lo if causal else (hi - lo) * hi


def layer_work_shares(costs: ChunkedCosts) -> tuple[float, float]:
    """(causal share, score-block share) of one layer's FLOPs, forward plus backward.

    Read from the cost model's own segments for the first pipeline stage (its
    transformer layers, no output head; the cut is one for all stages): GEMM
    FLOPs are per-token work, attention-core FLOPs are causal work for a flash
    kernel and score-block work otherwise. The per-token share is the rest.
    """
    from workloads.costs import ComputeSeg  # not at the top: workloads.costs imports this module

    gemm = attn = 0.0
    for kind in (FORWARD, BACKWARD):
        for seg in costs.op_segments(Op(0, kind, 0), False):
            if isinstance(seg, ComputeSeg):
                gemm += seg.flops
                attn += seg.attn_flops
    total = gemm + attn
    if total <= 0:
        return 0.0, 0.0
    share = attn / total
    return (share, 0.0) if causal_kernel(costs.attention) else (0.0, share)


@lru_cache(maxsize=256)
def equal_cost_bounds(k: int, causal: float, rectangle: float = 0.0) -> tuple[float, ...]:
    """Boundaries ``0 = x_0 < ... < x_k = 1`` of ``k`` chunks of equal cost.

    The whole micro-batch costs 1: a share ``causal`` of causal attention, a
    share ``rectangle`` of score-matrix attention and ``1 - causal - rectangle``
    per-token work; chunk ``[lo, hi)`` costs
    ``(1 - causal - rectangle)(hi - lo) + causal (hi^2 - lo^2) + rectangle (hi - lo) hi``.
    Causal only, the cost of ``[0, x)`` is ``G(x) = (1 - a) x + a x^2`` and
    chunk ``c`` ends where ``G(x) = (c + 1)/k`` (closed form). With score-block
    work the chunks' costs do not add up to 1, so the common per-chunk cost
    ``T`` is found by bisection such that the ``k``-th chunk ends at 1.
    """
    if k < 1:
        raise ValueError(f"sequence chunks k={k} must be >= 1")
    if not (0.0 <= causal and 0.0 <= rectangle and causal + rectangle <= 1.0):
        raise ValueError(f"work shares causal={causal}, rectangle={rectangle} must be "
                         "non-negative and sum to at most 1")
    per_token = 1 - causal - rectangle
    if rectangle == 0.0:
        bounds = [0.0]
        for c in range(1, k):
            y = c / k
            # root of causal x^2 + per_token x - y = 0, written to stay exact at causal = 0
            bounds.append(2 * y / (per_token + (per_token ** 2 + 4 * causal * y) ** 0.5))
        bounds.append(1.0)
        return tuple(bounds)

    def next_bound(lo: float, target: float) -> float:
        # (causal + rectangle) hi^2 + (per_token - rectangle lo) hi - (per_token lo
        #   + causal lo^2 + target) = 0, positive root in its cancellation-free form
        q = causal + rectangle
        b = per_token - rectangle * lo
        c0 = per_token * lo + causal * lo * lo + target
        return 2 * c0 / (b + (b * b + 4 * q * c0) ** 0.5)

    def walk(target: float) -> list[float]:
        xs = [0.0]
        for _ in range(k):
            xs.append(next_bound(xs[-1], target))
        return xs

    low, high = 0.0, 1.0  # one chunk costs 1 at most (the whole sequence)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if walk(mid)[-1] < 1.0:
            low = mid
        else:
            high = mid
    xs = walk(high)[:-1]
    return (*xs, 1.0)


def chunk_cost(lo: float, hi: float, causal: float, rectangle: float = 0.0) -> float:
    """Cost of chunk ``[lo, hi)`` as a share of the whole micro-batch (the cost model of
    :func:`equal_cost_bounds`)."""
    per_token = 1 - causal - rectangle
    return (per_token * (hi - lo) + causal * (hi * hi - lo * lo)
            + rectangle * (hi - lo) * hi)


def chunk_start(hi: float, target: float, causal: float, rectangle: float = 0.0) -> float:
    """Where a chunk ending at ``hi`` must start to cost ``target`` (0 if even ``[0, hi)``
    costs less): the root in ``lo`` of ``chunk_cost(lo, hi) = target``, a quadratic
    ``causal lo^2 + B lo - C = 0`` with ``B = 1 - causal - rectangle + rectangle hi`` and
    ``C = B hi + causal hi^2 - target``, in its cancellation-free form."""
    b = 1 - causal - rectangle + rectangle * hi
    c0 = b * hi + causal * hi * hi - target
    if c0 <= 0.0:
        return 0.0
    return 2 * c0 / (b + (b * b + 4 * causal * c0) ** 0.5)


def rounded_bounds(bounds: tuple[float, ...], seq_length: int, mod: int, causal: float,
                   rectangle: float = 0.0) -> tuple[float, ...]:
    """``bounds`` (equal-cost fractions) moved to whole multiples of ``mod`` tokens, as the
    reference code's ``solve_partition`` does (module docstring).

    From the last chunk back: chunk ``c`` ends where chunk ``c + 1`` starts, its ideal
    start costs it the common per-chunk target (:func:`chunk_start`), and its length
    ``floor(ideal / mod)·mod`` tokens; the first chunk holds the remaining tokens. A
    :class:`~base.errors.ConfigError` if a chunk would be left without tokens.
    """
    k = len(bounds) - 1
    if k == 1:
        return bounds
    target = chunk_cost(bounds[0], bounds[1], causal, rectangle)
    end = seq_length
    lengths: list[int] = []
    for c in range(k - 1, 0, -1):
        ideal = (end / seq_length - chunk_start(end / seq_length, target, causal, rectangle)
                 ) * seq_length
        # a hair of slack so a length that is a multiple of mod up to float error stays one
        length = int((ideal + 1e-9 * seq_length) // mod) * mod
        if length <= 0:
            raise ConfigError(
                f"training.seq_chunks={k}: sequence chunk {c} would hold {ideal:.1f} tokens, "
                f"fewer than one multiple of {mod} (chunk lengths are rounded down to "
                f"multiples of parallel.tp with sequence_parallel); use fewer chunks")
        lengths.insert(0, length)
        end -= length
    if end <= 0:
        raise ConfigError(f"training.seq_chunks={k}: the first sequence chunk would hold "
                          f"{end} tokens of model.seq_length={seq_length}; use fewer chunks")
    xs = [0.0]
    pos = end
    for length in lengths:
        xs.append(pos / seq_length)
        pos += length
    return (*xs, 1.0)


@lru_cache(maxsize=256)
def bounds_of(costs: ChunkedCosts, k: int) -> tuple[float, ...]:
    """The boundaries of ``k`` sequence chunks for a (hashable) cost model: equal FLOPs
    (:func:`equal_cost_bounds`) moved to whole tokens, multiples of the TP degree with
    sequence parallelism (:func:`rounded_bounds`)."""
    shares = layer_work_shares(costs)
    mod = costs.tp if costs.sequence_parallel and costs.tp > 1 else 1
    return rounded_bounds(equal_cost_bounds(k, *shares), costs.model.seq_length, mod, *shares)
