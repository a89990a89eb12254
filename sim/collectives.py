"""Collectives decomposed into DAGs of point-to-point transfers. Pure (no SimPy).

A plan is a tuple of :class:`Transfer`; each transfer may start once the
transfers it depends on have arrived. The engine runs each transfer as a flow
on the real topology, so contention and placement matter.

Closed forms on a contention-free ring (α = per-hop latency, B = per-direction
link bandwidth, S = buffer bytes), see REFERENCES.md "Collectives":
ring all-reduce 2(n-1)α + 2(n-1)/n·S/B; ring reduce-scatter / all-gather
(n-1)α + (n-1)/n·S/B (Patarasuk & Yuan 2009; Thakur et al. 2005).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.errors import ConfigError

OPS = ("all_reduce", "reduce_scatter", "all_gather")
ALGORITHMS = ("ring",)

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
}
"""nccl-tests bus-bandwidth factor: busbw = algbw × factor(n)."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One point-to-point message inside a collective."""

    src: int
    """Sending GPU rank."""
    dst: int
    """Receiving GPU rank."""
    nbytes: float
    deps: tuple[int, ...]
    """Indices (in the plan) of transfers that must have arrived before this one starts."""


def _ring_steps(ranks: Sequence[int], chunk_bytes: float, steps: int) -> tuple[Transfer, ...]:
    """``steps`` rounds in which every rank sends one chunk to its ring successor.

    Round k's send from position i waits for round k-1's chunk arriving at
    position i (from its predecessor), as in NCCL's ring pipeline.
    """
    n = len(ranks)
    plan: list[Transfer] = []
    for k in range(steps):
        for i in range(n):
            deps = () if k == 0 else ((k - 1) * n + (i - 1) % n,)
            plan.append(Transfer(ranks[i], ranks[(i + 1) % n], chunk_bytes, deps))
    return tuple(plan)


def plan(op: str, algo: str, ranks: Sequence[int], nbytes: float) -> tuple[Transfer, ...]:
    """Decompose collective ``op`` over ``ranks`` (ring order) of an ``nbytes`` buffer.

    ``nbytes`` is the whole buffer: the all-reduce input, the reduce-scatter
    input, the all-gather output (as in nccl-tests).
    """
    n = len(ranks)
    if op not in OPS:
        raise ConfigError(f"collective op {op!r} is not one of {', '.join(OPS)}")
    if algo not in ALGORITHMS:
        raise ConfigError(f"collective algorithm {algo!r} is not one of {', '.join(ALGORITHMS)}")
    if len(set(ranks)) != n:
        raise ConfigError(f"collective group {tuple(ranks)} repeats a rank")
    if n <= 1 or nbytes <= 0:
        return ()
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    return _ring_steps(ranks, nbytes / n, steps)
