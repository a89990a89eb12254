"""Per-rank programs: the lowered form of a training step that the engine executes.

An instruction runs on one stream of one GPU, in program order on that stream,
once every instruction in its ``deps`` has completed. Ids are dense integers
assigned in creation order, so programs are deterministic and cheap to index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from workloads.schedules import Schedule


class Compute(NamedTuple):
    """A kernel (or fused group of kernels) on the compute stream.

    Instructions are typed named tuples rather than frozen dataclasses: a large
    collapsed program holds hundreds of thousands of them, and a tuple is built
    several times faster (immutable and compared by value either way; change
    one with ``_replace``).
    """

    id: int
    gpu: int
    kind: str
    """``F``, ``B``, ``W`` or ``opt``."""
    name: str
    deps: tuple[int, ...]
    flops: float = 0.0
    """Floating-point operations the hardware executes."""
    hbm_bytes: float = 0.0
    """Bytes moved to and from HBM."""
    duration_s: float | None = None
    """Fixed duration overriding the device model (synthetic workloads, collapsed ops)."""
    attn_flops: float = 0.0
    """Attention-core FLOPs."""
    gemm_dims: tuple[tuple[float, float], ...] = ()
    """(smallest GEMM dimension, FLOPs) pairs, see :class:`workloads.costs.ComputeSeg`."""
    elementwise_bytes: float = 0.0
    """HBM bytes of memory-bound kernels."""
    blocking_comm_s: float = 0.0
    """Blocking communication folded into this op (collapsed simulation), run after the compute."""
    blocking_comm_kind: str = "tp"
    alloc_bytes: float = 0.0
    """Memory allocated when the op starts (e.g. stashed activations)."""
    free_bytes: float = 0.0
    """Memory released when the op ends."""
    stage: int = -1
    mb: int = -1

    @property
    def stream(self) -> str:
        return "compute"


class Send(NamedTuple):
    """A point-to-point message from ``gpu`` to ``dst`` on the sender's ``send>dst`` stream."""

    id: int
    gpu: int
    dst: int
    nbytes: float
    kind: str
    """Communication kind for statistics, e.g. ``pp``."""
    name: str
    deps: tuple[int, ...]
    stage: int = -1
    mb: int = -1
    duration_s: float | None = None
    """Precomputed time (collapsed simulation): no flow is simulated for it."""

    @property
    def stream(self) -> str:
        return f"send>{self.dst}"


class Collective(NamedTuple):
    """This GPU's part in a collective; all members share ``key`` and start together."""

    id: int
    gpu: int
    kind: str
    """Communication kind: ``tp``, ``dp``, ``cp``, ``ep``."""
    name: str
    deps: tuple[int, ...]
    op: str
    """``all_reduce``, ``reduce_scatter`` or ``all_gather``."""
    algo: str
    group: tuple[int, ...]
    """Member GPUs in ring order."""
    nbytes: float
    """Whole buffer size (nccl-tests convention)."""
    key: int
    """Identifies the collective instance across its members."""
    stage: int = -1
    mb: int = -1
    duration_s: float | None = None
    """Precomputed time (collapsed simulation): no flows are simulated for it."""

    @property
    def stream(self) -> str:
        return self.kind


Instruction = Compute | Send | Collective


@dataclass(frozen=True)
class Program:
    """Everything the engine needs to run one step on every GPU."""

    num_gpus: int
    instructions: tuple[Instruction, ...]
    """All instructions; ``instructions[i].id == i``."""
    static_bytes: tuple[float, ...]
    """Per-GPU memory held for the whole step (weights, gradients, optimizer state, buffers)."""
    schedule: Schedule
    gpu_names: tuple[str, ...] = ()
    simulated_gpus: tuple[int, ...] | None = None
    """GPUs that have instructions; None = all (a collapsed program simulates a subset)."""
    meta: dict = field(default_factory=dict, compare=False)
    """Free-form facts about the lowering (layers per stage, bytes per message...)."""


class ProgramBuilder:
    """Append-only helper that hands out dense ids.

    ``instructions`` is the list built so far; a hot loop may append instructions it
    builds itself, each with ``id`` its position and collective keys from :meth:`new_key`
    (see ``workloads.lowering._lower_collapsed``).
    """

    default_algo = "auto"
    """Collective algorithm of :meth:`collective` unless given."""

    def __init__(self) -> None:
        self.instructions: list[Instruction] = []
        self._next_key = 0

    @property
    def next_id(self) -> int:
        return len(self.instructions)

    def new_key(self) -> int:
        """A fresh collective key."""
        key = self._next_key
        self._next_key += 1
        return key

    def compute(self, gpu: int, kind: str, name: str, deps: tuple[int, ...], **kw) -> int:
        i = len(self.instructions)
        self.instructions.append(Compute(i, gpu, kind, name, deps, **kw))
        return i

    def send(self, gpu: int, dst: int, nbytes: float, kind: str, name: str,
             deps: tuple[int, ...], **kw) -> int:
        i = len(self.instructions)
        self.instructions.append(Send(i, gpu, dst, nbytes, kind, name, deps, **kw))
        return i

    def collective(self, group: tuple[int, ...], deps: dict[int, tuple[int, ...]], *, kind: str,
                   name: str, op: str, nbytes: float, algo: str | None = None,
                   **kw) -> dict[int, int]:
        """Add one collective for all members of ``group``; returns {gpu: instruction id}."""
        key = self.new_key()
        algo = self.default_algo if algo is None else algo
        instrs = self.instructions
        ids = {}
        for gpu in group:
            ids[gpu] = i = len(instrs)
            instrs.append(Collective(i, gpu, kind, name, deps.get(gpu, ()), op, algo, group,
                                     nbytes, key, **kw))
        return ids

    def build(self) -> tuple[Instruction, ...]:
        return tuple(self.instructions)
