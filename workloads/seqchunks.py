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
attended to them). Not modelled: the reference code rounds chunk lengths to
multiples of the TP degree; here boundaries are real fractions.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from workloads.schedules import BACKWARD, FORWARD, Op

if TYPE_CHECKING:
    from workloads.costs import Segment

WHOLE_WINDOW = (0.0, 1.0)
"""The window of a cost model that covers whole sequences (no sequence chunk)."""

_BISECTIONS = 200
"""Halvings of the per-chunk target (far more than float precision needs; it stops early)."""


class ChunkedCosts(Protocol):
    """What :func:`layer_work_shares` reads from a cost model."""

    attention: str

    def op_segments(self, op: Op, split_backward: bool,
                    markers: bool = False) -> tuple[Segment, ...]: ...


def causal_kernel(attention: str) -> bool:
    """True if the attention kernel skips the masked half (flash), so its work per query
    follows the query's prefix; False if it computes the full score matrix."""
    return attention in ("flash1", "flash2")


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


@lru_cache(maxsize=256)
def bounds_of(costs: ChunkedCosts, k: int) -> tuple[float, ...]:
    """The equal-FLOPs boundaries of ``k`` sequence chunks for a (hashable) cost model."""
    return equal_cost_bounds(k, *layer_work_shares(costs))
