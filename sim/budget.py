"""How much work a run would create, estimated before it is built, and the bounds on it.

A run's cost is set by how many schedule ops and lowered instructions it creates, not
by any one key: ``num_microbatches: 1e8``, ``grad_bucket_MB: 1e-9`` or full fidelity at
16,384 GPUs each create more than a machine holds, and would run for hours before a
MemoryError. Each is estimated from the keys alone (before a schedule is built or a
program lowered) and refused with the estimate and the key that drives it:

* :data:`MAX_SCHEDULE_OPS` bounds the ops of one step's pipeline schedule
  (:func:`check_schedule_ops`, when the experiment is built);
* :data:`MAX_PROGRAM_BYTES` bounds the lowered program, estimated as instructions
  (:func:`estimate`) times the bytes per instruction of the representation the run will
  hold them in (:meth:`Estimate.charge`: packed or named tuples, ZeRO-3 apart; measured,
  ``sim/data/budget.toml``; :meth:`Estimate.check`, before lowering); ``fidelity: auto``
  falls back to ``collapsed`` where full would not fit.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from workloads.costs import RingAttention
from workloads.lowering.groups import replica_coords
from workloads.schedules import Op

MAX_SCHEDULE_OPS = 2_000_000
"""Most ops one step's schedule may hold (all pipeline ranks): about a minute of
building and lowering, 100 times the largest bundled example (pp·vpp·m·kinds·k)."""

DATA_FILE = Path(__file__).parent / "data" / "budget.toml"
"""The bytes charged per instruction of each representation, with the runs that measured
them and the command (``benchmarks/budget.py``)."""

REPRESENTATIONS = ("packed", "tuples")
"""How a lowered program is held through the simulation: ``packed``, one full-fidelity
step (:class:`workloads.packed.PackedBuilder`'s columns); ``tuples``, the program as named
tuples (several steps copied by :func:`workloads.multistep.repeat_program`, local SGD's
step without DP, the reference path, the merged jobs of :mod:`sim.jobs`, a collapsed
program)."""


with DATA_FILE.open("rb") as _fh:
    _DATA = tomllib.load(_fh)  # (parsed once for both tables below)


def _charges(key: str) -> dict[str, int]:
    return {rep: int(_DATA[rep][key]) for rep in REPRESENTATIONS}


BYTES_PER_INSTRUCTION: dict[str, int] = _charges("bytes_per_instruction")
"""Memory per estimated instruction through a full-fidelity simulation (the instruction, the
engine's times, DAG and flows, the statistics' intervals and the idle breakdown's chain
sums; the timeline's records are made only when read), per representation: peak RSS above
the RSS before the simulation over estimated instructions, the largest measured, rounded up
(``sim/data/budget.toml``, which lists the runs)."""

ZERO3_BYTES_PER_INSTRUCTION: dict[str, int] = _charges("zero3_bytes_per_instruction")
"""The same for ZeRO-3 across replicas, measured apart: its per-layer gathers and
reduce-scatters take about twice the memory per estimated instruction."""

MAX_PROGRAM_BYTES = 8e9
"""Memory a lowered program may need (instructions times :data:`BYTES_PER_INSTRUCTION`):
8 GB, what a laptop can give."""

KINDS_PER_OP = 3
"""Schedule ops per stage and micro-batch at most: F, B and W (zero-bubble splits)."""


def check_schedule_ops(stages: int, microbatches: int, seq_chunks: int, key: str,
                       value: Any) -> None:
    """ConfigError naming ``key`` (the key that set the micro-batches) unless a schedule of
    ``stages`` stages, ``microbatches`` micro-batches and ``seq_chunks`` sequence chunks
    stays within :data:`MAX_SCHEDULE_OPS`."""
    ops = stages * microbatches * KINDS_PER_OP * seq_chunks
    if ops > MAX_SCHEDULE_OPS:
        raise ConfigError(f"{key}={value}: the step's schedule would hold about {ops:,} ops "
                          f"(pp*vpp = {stages} stages x {microbatches:,} micro-batches x "
                          f"{KINDS_PER_OP} kinds x {seq_chunks} sequence chunks), more than "
                          f"the {MAX_SCHEDULE_OPS:,} a run may have")


def _op_instructions(exp: Any) -> float:
    """Instructions per simulated GPU summed over the schedule's ops: each op's segments
    (compute kernels, TP collectives, ZeRO-3 gathers, ring attention's blocks: one
    instruction each at full fidelity, an upper bound when collapsed fuses some) plus its
    pipeline send."""
    sched, costs = exp.schedule, exp.costs
    # the segments as counted: a transformer's with its layers unnamed (one layer's per cost
    # model, not one per layer: the same segments but for their labels, which counting
    # never reads; tests/test_search_op_work.py), else the cost model's own
    segments = getattr(costs, "op_work", None) or costs.op_segments
    # ops per (stage, kind, sequence field), in order of first appearance; the counts are
    # integers, so their sum is the same float in any order
    total = 0.0
    for (stage, kind, seq), ops in sched.op_counts.items():
        segs = segments(Op(stage, kind, 0, seq), sched.split_backward, markers=True)
        # ring attention: a block and a send per step; the op's send, and a receive or
        # optimizer share
        total += ops * (sum(2 * seg.steps if isinstance(seg, RingAttention) else 1
                            for seg in segs) + 2)
    return total


def _bucket_instructions(exp: Any) -> tuple[float, float]:
    """DP collectives the gradient buckets of ``overlap_grad_reduce`` add per simulated GPU
    (one per bucket of every stage), and the bucket bytes."""
    par, costs = exp.config.parallel, exp.costs
    if not par.overlap_grad_reduce or not hasattr(costs, "grad_bytes"):
        return 0.0, 0.0
    bucket = float(getattr(costs, "grad_bucket_bytes", 25e6))  # as the lowering reads it
    stages = len(exp.schedule.stage_rank)
    expert = getattr(costs, "expert_grad_bytes", None)  # MoE transformers only
    grads = sum(costs.grad_bytes(s) + (expert(s) if expert else 0.0) for s in range(stages))
    return grads / bucket + stages, bucket


@dataclass(frozen=True)
class Estimate:
    """The instructions a run of ``steps`` steps would create, worked out once from the
    experiment (:func:`estimate`) and asked of either fidelity."""

    per_rank: float
    """Op instructions per pipeline rank and step (:func:`_op_instructions` / pp)."""
    buckets: float
    """DP bucket collectives per step, all stages (:func:`_bucket_instructions`)."""
    bucket_bytes: float
    pp: int
    num_gpus: int
    num_microbatches: int
    steps: int
    zero3: bool = False
    """ZeRO-3 across more than one replica (:data:`ZERO3_BYTES_PER_INSTRUCTION`)."""
    copies: bool = False
    """The run also simulates a copy of its program as named tuples: local SGD's step
    without DP communication (:func:`workloads.multistep.without_dp`), beside the step
    with it."""

    def instructions(self, fidelity: str) -> tuple[float, str]:
        """About how many instructions lowering at ``fidelity`` (``full`` or ``collapsed``)
        creates, and the key that drives the estimate most."""
        gpus = self.num_gpus if fidelity == "full" else self.pp
        total = (self.per_rank + self.buckets / self.pp) * gpus * self.steps
        if self.buckets > self.per_rank:
            key = f"parallel.grad_bucket_MB={self.bucket_bytes / 1e6:g}"
        elif fidelity == "full" and gpus > self.pp:
            key = f"fidelity 'full' at cluster.num_gpus={gpus}"
        else:
            key = f"training micro-batches={self.num_microbatches}"
        return total, key

    def representation(self, fidelity: str, packs: bool = True) -> str:
        """How the run holds its program (:data:`REPRESENTATIONS`): packed for one step
        lowered in full where the caller ``packs`` (not the reference lowering, not
        :mod:`sim.jobs`' merged program), named tuples otherwise."""
        return "packed" if fidelity == "full" and self.steps == 1 and packs else "tuples"

    def charge(self, fidelity: str, packs: bool = True) -> int:
        """Bytes per estimated instruction: those of the run's representation
        (:data:`BYTES_PER_INSTRUCTION`, :data:`ZERO3_BYTES_PER_INSTRUCTION`), and those of
        named tuples again where the run also simulates a copy (:attr:`copies`)."""
        table = ZERO3_BYTES_PER_INSTRUCTION if self.zero3 else BYTES_PER_INSTRUCTION
        copy = table["tuples"] if self.copies else 0
        return table[self.representation(fidelity, packs)] + copy

    def bytes(self, fidelity: str, packs: bool = True) -> tuple[float, float, str]:
        """Instructions at ``fidelity``, the memory they take through the run
        (:meth:`charge` each) and the key that drives them (:meth:`instructions`)."""
        n, key = self.instructions(fidelity)
        return n, n * self.charge(fidelity, packs), key

    def fits(self, fidelity: str, packs: bool = True) -> bool:
        """Whether the lowered program stays within :data:`MAX_PROGRAM_BYTES`."""
        return self.bytes(fidelity, packs)[1] <= MAX_PROGRAM_BYTES

    def check(self, fidelity: str, packs: bool = True) -> None:
        """ConfigError naming the key that drives the estimate unless the lowered program
        stays within :data:`MAX_PROGRAM_BYTES`."""
        n, need, key = self.bytes(fidelity, packs)
        if need > MAX_PROGRAM_BYTES:
            hint = "; use fidelity collapsed" if fidelity == "full" else ""
            raise ConfigError(f"{key}: the simulation would create about {n:,.0f} instructions "
                              f"(~{need / 1e9:,.1f} GB at {self.charge(fidelity, packs)} B "
                              f"each), more than the {MAX_PROGRAM_BYTES / 1e9:g} GB a run may "
                              f"use{hint}")


def estimate(exp: Any, steps: int = 1) -> Estimate:
    """The :class:`Estimate` of ``steps`` steps of ``exp`` (one pass over its schedule)."""
    pp = exp.placement.degree("pp")
    buckets, bucket = _bucket_instructions(exp)
    replicas = len(replica_coords(exp.placement))
    zero3 = exp.config.parallel.zero_stage == 3 and replicas > 1
    local_sgd = exp.config.training.sync_every > 1 and replicas > 1
    return Estimate(_op_instructions(exp) / pp, buckets, bucket, pp, exp.cluster.num_gpus,
                    exp.num_microbatches, steps, zero3, local_sgd)
