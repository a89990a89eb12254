"""Compute slowed by the collectives that run beside it: one rule, as data, for every
collective the engine overlaps with compute (``sim/data/contention.toml``).

The engine runs communication and compute on separate streams of one GPU and overlaps them
for free; but a collective's kernels hold SMs (NCCL's one CTA per channel, DeepEP's and
Transformer Engine's userbuffers' fixed SM counts) and HBM bandwidth while they run, so the
compute beside them runs slower than alone. Compute of ``g`` seconds beside a collective of
``c`` seconds (timed alone) loses

    share(mechanism) · min(c, g)

the overlapped compute lasting about as long as the shorter of the two, with the share by
how the collective runs (the data file's ``[collectives]``): ``nccl``, the measured average
slowdown of compute that overlaps communication (Lee et al. 2025, arXiv 2507.03114: 18.9%;
the same size as NCCL's CTAs on an H100's SMs); ``copy_engine``, none (copies on the copy
engines take no SM); ``sm_kernels``, k/S for kernels given k of a GPU's S SMs, which the
module that knows k counts (:mod:`sim.tpoverlap` launches the GEMM on the SMs left to it,
:mod:`sim.a2aoverlap` takes the dispatcher's from its partner): :func:`share` refuses it.

Where each overlapped collective is charged: :mod:`sim.fsdpoverlap` (ZeRO-3's gathers and
reduce-scatters, the per-micro-batch ZeRO-2 reduce-scatters, Megatron's bucketed gradient
reductions and distributed-optimizer parameter gathers), :mod:`sim.tpoverlap` (sequence
parallelism's collectives NCCL runs beside a GEMM; userbuffers' methods), :mod:`sim.cpoverlap`
(the context-parallel ring's passes beside the attention blocks) and :mod:`sim.a2aoverlap`
(MoE all-to-alls under ``parallel.moe_a2a_overlap``).
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

DATA_FILE = Path(__file__).parent / "data" / "contention.toml"
"""The rule's numbers and each overlapped collective's mechanism, with their sources."""

SHARES = {"copy_engine": 0.0}
"""Mechanisms whose share is a constant of the rule (``nccl``'s is the data file's
``compute_slowdown``)."""


@cache
def _data() -> dict:
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)


def compute_slowdown() -> float:
    """Fractional slowdown of compute while NCCL's kernels overlap it (``DATA_FILE``)."""
    return float(_data()["compute_slowdown"])


def mechanism(collective: str) -> str:
    """How overlapped collective ``collective`` (a key of the data file's ``[collectives]``)
    runs: ``nccl``, ``sm_kernels`` or ``copy_engine``."""
    return str(_data()["collectives"][collective])


def share(collective: str) -> float:
    """The share of its speed compute loses while ``collective`` runs beside it (module
    doc); ValueError for an ``sm_kernels`` collective, whose share its own SM count gives."""
    how = mechanism(collective)
    if how == "nccl":
        return compute_slowdown()
    if how in SHARES:
        return SHARES[how]
    raise ValueError(f"{collective}: its kernels' SM count gives its share ({how})")


def charge(collective: str, c: float, g: float) -> float:
    """Seconds compute of ``g`` seconds loses beside ``collective`` of ``c`` seconds alone:
    ``share · min(c, g)``."""
    return share(collective) * min(c, g)
