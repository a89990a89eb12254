"""Per-rank programs: the lowered form of a training step that the engine executes.

An instruction runs on one stream of one GPU, in program order on that stream,
once every instruction in its ``deps`` has completed. Ids are dense integers
assigned in creation order, so programs are deterministic and cheap to index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import NamedTuple, overload

import numpy as np

from base.collector import gc_paused
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


EQUAL_VOLUMES = (1.0, False)
""":attr:`Collective.skew` of a collective whose ranks move equal volumes."""


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
    skew: tuple[float, bool] = EQUAL_VOLUMES
    """A dropless MoE all-to-all's (routing imbalance, whether the busiest rank sends):
    ``nbytes`` is the busiest rank's volume, the others move less
    (:func:`sim.collectives.routing_loads`); (1, False): equal volumes."""

    @property
    def stream(self) -> str:
        return self.kind


Instruction = Compute | Send | Collective


@dataclass(frozen=True)
class Program:
    """Everything the engine needs to run one step on every GPU."""

    num_gpus: int
    instructions: tuple[Instruction, ...]
    """All instructions; ``instructions[i].id == i``. A collapsed lowering gives a
    :class:`ColumnarInstructions`, which reads and compares as that tuple and builds the
    objects on first use."""
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

    ``instructions`` is the list built so far, ids from ``first_id`` on (a builder that
    continues a program whose first ``first_id`` instructions, with collective keys below
    ``first_key``, are held elsewhere: a collapsed lowering's :class:`Columns`).
    """

    default_algo = "auto"
    """Collective algorithm of :meth:`collective` unless given."""

    def __init__(self, first_id: int = 0, first_key: int = 0) -> None:
        self.instructions: list[Instruction] = []
        self.first_id = first_id
        self._next_key = first_key

    @property
    def next_id(self) -> int:
        return self.first_id + len(self.instructions)

    def new_key(self) -> int:
        """A fresh collective key."""
        key = self._next_key
        self._next_key += 1
        return key

    def compute(self, gpu: int, kind: str, name: str, deps: tuple[int, ...], **kw) -> int:
        i = self.next_id
        self.instructions.append(Compute(i, gpu, kind, name, deps, **kw))
        return i

    @staticmethod
    def work(**kw) -> tuple:
        """A compute op's fields after ``deps`` (keywords as :class:`Compute` takes them), what
        :meth:`compute_each` adds ops of: worked out once for ops added many times."""
        return Compute(0, 0, "", "", (), **kw)[5:]

    def compute_each(self, gpus: Sequence[int], kind: str, name: str,
                     deps: Mapping[int, tuple[int, ...]], work: tuple | None = None,
                     **kw) -> dict[int, int]:
        """The same compute op once on each of ``gpus`` (after ``deps[gpu]`` there), as
        :meth:`compute` would add them one by one; returns {gpu: instruction id}. Its
        fields after ``deps``: ``work`` (:meth:`work`), else the keywords."""
        if work is None:
            work = self.work(**kw)
        new, append = tuple.__new__, self.instructions.append
        ids = {}
        i = self.next_id
        for gpu in gpus:
            ids[gpu] = i
            append(new(Compute, (i, gpu, kind, name, deps[gpu], *work)))
            i += 1
        return ids

    def send(self, gpu: int, dst: int, nbytes: float, kind: str, name: str,
             deps: tuple[int, ...], **kw) -> int:
        i = self.next_id
        self.instructions.append(Send(i, gpu, dst, nbytes, kind, name, deps, **kw))
        return i

    def collective(self, group: tuple[int, ...], deps: dict[int, tuple[int, ...]], *, kind: str,
                   name: str, op: str, nbytes: float, algo: str | None = None,
                   **kw) -> dict[int, int]:
        """Add one collective for all members of ``group``; returns {gpu: instruction id}."""
        key = self.new_key()
        algo = self.default_algo if algo is None else algo
        rest = Collective(0, 0, kind, name, (), op, algo, group, nbytes, key, **kw)[10:]
        new, append, deps_of = tuple.__new__, self.instructions.append, deps.get
        ids = {}
        i = self.next_id
        for gpu in group:
            ids[gpu] = i
            append(new(Collective, (i, gpu, kind, name, deps_of(gpu, ()), op, algo, group,
                                    nbytes, key, *rest)))
            i += 1
        return ids

    def build(self) -> tuple[Instruction, ...]:
        return tuple(self.instructions)


COMPUTE, SEND, COLLECTIVE = 0, 1, 2
"""Instruction classes, as :attr:`Columns.cls` codes them."""
CLASS_CODE = {Compute: COMPUTE, Send: SEND, Collective: COLLECTIVE}
"""Each instruction class's code."""
_ITEM1, _ITEM2, _ITEM4, _ITEM6, _ITEM7, _ITEM9, _ITEM11, _ITEM12, _ITEM13, _ITEM14 = map(
    itemgetter, (1, 2, 4, 6, 7, 9, 11, 12, 13, 14))


@dataclass(frozen=True, eq=False)
class Columns:
    """A program's instructions as arrays indexed by id: what the queue-free engine pass
    (:mod:`sim.columnar`) and the idle breakdown (:mod:`sim.idle`) read, without the
    instruction objects.

    Only for programs whose every send and collective has a fixed ``duration_s`` and
    every collective one member (collapsed lowerings, :func:`columns_of`).
    """

    names: tuple[str, ...]
    """The strings that :attr:`kind` and :attr:`comm` code (their indices)."""
    cls: np.ndarray
    """:data:`COMPUTE`, :data:`SEND` or :data:`COLLECTIVE` (int8)."""
    gpu: np.ndarray
    kind: np.ndarray
    """Code of the instruction's ``kind``."""
    dst: np.ndarray
    """A send's destination GPU; -1 for others."""
    deps: np.ndarray
    """Shape ``(n, width)``: each instruction's ``deps`` in order, padded with -1."""
    fixed_s: np.ndarray
    """A send's or collective's ``duration_s``; NaN for compute ops (timed by the engine)."""
    blocking_s: np.ndarray
    """A compute op's ``blocking_comm_s``; 0 for others."""
    comm: np.ndarray
    """Code of a compute op's ``blocking_comm_kind``; -1 for others."""
    alloc_bytes: np.ndarray
    free_bytes: np.ndarray
    signature: np.ndarray
    """A compute op's index into :attr:`signatures`; -1 for others."""
    signatures: tuple[Compute, ...]
    """One compute op per signature: the compute ops of a signature equal it in every field
    but ``id``, ``name``, ``deps`` and ``mb`` (what a compute timer reads is the same)."""

    def __len__(self) -> int:
        return len(self.cls)


def columns_of(instructions: Sequence[Instruction]) -> Columns | None:
    """The :class:`Columns` of ``instructions`` (ids their positions, or consecutive from the
    first one's), each compute op its own signature; None where a send or collective has
    no fixed duration or a collective more than one member.

    Each field is read for every instruction of a class at once (C loops: ``map``,
    ``np.fromiter``, a list's ``index``), not appended instruction by instruction: a
    collapsed op-loop program of a few hundred thousand instructions took ~70 ms in the loop,
    a sixth of a ``sim validate`` corpus row's simulation. :func:`columns_of_reference` is
    that loop; ``tests/test_columns_of.py`` holds the two to the same arrays."""
    if type(instructions) not in (tuple, list):  # a lazy sequence (a packed full program)
        return columns_of_reference(instructions)  # builds no object past the first offender
    for ins in instructions:  # a full program: its first send or collective answers, early
        t = type(ins)
        if t is Compute:
            continue
        if ins.duration_s is None or (t is Collective and len(ins.group) != 1):
            return None
        break
    n = len(instructions)
    codes = CLASS_CODE
    types = list(map(type, instructions))
    if not all(map(codes.__contains__, dict.fromkeys(types))):
        return columns_of_reference(instructions)  # another class: the loop's attributes
    cls = np.fromiter(map(codes.__getitem__, types), dtype=np.int8, count=n)
    where = [np.flatnonzero(cls == c) for c in (COMPUTE, SEND, COLLECTIVE)]
    comp_at, send_at, coll_at = where
    comps = [instructions[i] for i in comp_at.tolist()]
    sends = [instructions[i] for i in send_at.tolist()]
    colls = [instructions[i] for i in coll_at.tolist()]
    send_s = list(map(_ITEM9, sends))  # Send.duration_s
    coll_s = list(map(_ITEM12, colls))  # Collective.duration_s
    if None in send_s or None in coll_s or (colls and set(map(len, map(_ITEM7, colls))) != {1}):
        return None
    kinds = list(map(_ITEM2, instructions))  # Compute.kind, Collective.kind
    deps = list(map(_ITEM4, instructions))  # Compute.deps, Collective.deps
    if sends:  # Send.kind, Send.deps
        for i, k, d in zip(send_at.tolist(), map(_ITEM4, sends), map(_ITEM6, sends),
                           strict=True):
            kinds[i], deps[i] = k, d
    comm_kinds = list(map(_ITEM12, comps))  # Compute.blocking_comm_kind
    # the strings in the order the loop meets them: an instruction's kind, then (a compute
    # op) its blocking_comm_kind
    first = {k: 2 * kinds.index(k) for k in dict.fromkeys(kinds)}
    comp_list = comp_at.tolist()
    for k in dict.fromkeys(comm_kinds):
        at = 2 * comp_list[comm_kinds.index(k)] + 1
        if at < first.get(k, at + 1):
            first[k] = at
    names = {k: code for code, k in enumerate(sorted(first, key=first.__getitem__))}
    code_of = names.__getitem__
    gpu = np.fromiter(map(_ITEM1, instructions), dtype=np.int64, count=n)
    kind = np.fromiter(map(code_of, kinds), dtype=np.int64, count=n)
    m = len(comps)
    dst = np.full(n, -1, dtype=np.int64)
    fixed = np.full(n, np.nan, dtype=float)
    blocking, alloc, free = np.zeros(n), np.zeros(n), np.zeros(n)
    comm = np.full(n, -1, dtype=np.int64)
    signature = np.full(n, -1, dtype=np.int64)
    if sends:
        dst[send_at] = np.fromiter(map(_ITEM2, sends), dtype=np.int64, count=len(sends))
        fixed[send_at] = np.fromiter(send_s, dtype=float, count=len(sends))
    if colls:
        fixed[coll_at] = np.fromiter(coll_s, dtype=float, count=len(colls))
    if comps:
        blocking[comp_at] = np.fromiter(map(_ITEM11, comps), dtype=float, count=m)
        alloc[comp_at] = np.fromiter(map(_ITEM13, comps), dtype=float, count=m)
        free[comp_at] = np.fromiter(map(_ITEM14, comps), dtype=float, count=m)
        comm[comp_at] = np.fromiter(map(code_of, comm_kinds), dtype=np.int64, count=m)
        signature[comp_at] = np.arange(m, dtype=np.int64)
    lengths = np.fromiter(map(len, deps), dtype=np.int64, count=n)
    width = int(lengths.max()) if n else 0
    total = int(lengths.sum())
    table = np.full((n, width), -1, dtype=np.int64)
    if total:
        flat = np.fromiter(chain.from_iterable(deps), dtype=np.int64, count=total)
        starts = np.cumsum(lengths) - lengths
        table[np.repeat(np.arange(n), lengths),
              np.arange(total) - np.repeat(starts, lengths)] = flat
    return Columns(tuple(names), cls, gpu, kind, dst, table, fixed, blocking, comm, alloc,
                   free, signature, tuple(comps))


def columns_of_reference(instructions: Sequence[Instruction]) -> Columns | None:
    """:func:`columns_of`, instruction by instruction: the reference it is tested equal to."""
    names: dict[str, int] = {}
    cls, gpu, kind, dst, fixed, blocking, comm, alloc, free, signature = ([] for _ in range(10))
    deps: list[tuple[int, ...]] = []
    signatures: list[Compute] = []
    for ins in instructions:
        t = type(ins)
        gpu.append(ins.gpu)
        kind.append(names.setdefault(ins.kind, len(names)))
        deps.append(ins.deps)
        if t is Compute:
            cls.append(COMPUTE)
            dst.append(-1)
            fixed.append(np.nan)
            blocking.append(ins.blocking_comm_s)
            comm.append(names.setdefault(ins.blocking_comm_kind, len(names)))
            alloc.append(ins.alloc_bytes)
            free.append(ins.free_bytes)
            signature.append(len(signatures))
            signatures.append(ins)
            continue
        if ins.duration_s is None or (t is Collective and len(ins.group) != 1):
            return None
        cls.append(SEND if t is Send else COLLECTIVE)
        dst.append(ins.dst if t is Send else -1)
        fixed.append(ins.duration_s)
        blocking.append(0.0)
        comm.append(-1)
        alloc.append(0.0)
        free.append(0.0)
        signature.append(-1)
    width = max(map(len, deps), default=0)
    table = np.full((len(deps), width), -1, dtype=np.int64)
    for k, d in enumerate(deps):
        table[k, :len(d)] = d
    return Columns(tuple(names), np.array(cls, dtype=np.int8), np.array(gpu, dtype=np.int64),
                   np.array(kind, dtype=np.int64), np.array(dst, dtype=np.int64), table,
                   np.array(fixed, dtype=float), np.array(blocking, dtype=float),
                   np.array(comm, dtype=np.int64), np.array(alloc, dtype=float),
                   np.array(free, dtype=float), np.array(signature, dtype=np.int64),
                   tuple(signatures))


class ColumnarInstructions(Sequence):
    """A program's instructions held as :class:`Columns`, built as objects on first use.

    A collapsed lowering produces hundreds of thousands of instructions that the engine's
    queue-free pass and the statistics read as arrays; the instruction objects (names,
    dependency tuples, ...) are built only when something reads them (a trace, a
    comparison, a multi-step program), by ``build``, and are then exactly the tuple the
    general lowering builds (``tests/test_perf_columns.py``). It compares, hashes and
    prints as that tuple.
    """

    __slots__ = ("_build", "_items", "columns")

    def __init__(self, columns: Columns, build: Callable[[], tuple[Instruction, ...]]) -> None:
        self.columns = columns
        self._build: Callable[[], tuple[Instruction, ...]] | None = build
        self._items: tuple[Instruction, ...] | None = None

    def materialize(self) -> tuple[Instruction, ...]:
        """The instructions as objects (built once)."""
        if self._items is None:
            assert self._build is not None
            with gc_paused():  # many long-lived tuples, no cycles (see lowering.lower)
                items = self._build()
            if len(items) != len(self.columns):
                raise AssertionError(f"built {len(items)} instructions for "
                                     f"{len(self.columns)} columns")
            self._items, self._build = items, None
        return self._items

    @property
    def built(self) -> bool:
        """Whether the instruction objects exist yet."""
        return self._items is not None

    def __len__(self) -> int:
        return len(self.columns)

    @overload
    def __getitem__(self, i: int) -> Instruction: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Instruction, ...]: ...

    def __getitem__(self, i: int | slice) -> Instruction | tuple[Instruction, ...]:
        return self.materialize()[i]

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.materialize())

    def __reversed__(self) -> Iterator[Instruction]:
        return reversed(self.materialize())

    def __contains__(self, item: object) -> bool:
        return item in self.materialize()

    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:
        return self.materialize().index(value, start, len(self) if stop is None else stop)

    def count(self, value: object) -> int:
        return self.materialize().count(value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ColumnarInstructions):
            other = other.materialize()
        if isinstance(other, tuple):
            return self.materialize() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.materialize())

    def __add__(self, other: tuple) -> tuple:
        return self.materialize() + tuple(other)

    def __radd__(self, other: tuple) -> tuple:
        return tuple(other) + self.materialize()

    def __repr__(self) -> str:
        return repr(self.materialize())

    def __reduce__(self) -> tuple:
        return (tuple, (self.materialize(),))  # pickles as the plain tuple
