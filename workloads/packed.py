"""A full-fidelity program's instructions held packed: a few bytes of arrays per instruction
and one shared template per op copy, the named tuples rebuilt when read.

A full lowering of GPT-3 175B on 4,096 GPUs makes 6.4 million instructions; as named
tuples (:mod:`workloads.program`) they take ~250 bytes each (a ``Compute`` tuple of 17
fields, its deps tuple, its id), about 1.6 GB. But the DP replicas and TP lanes of an op
share every field except the id, the GPU and the deps: a compute op's fields after its deps
(:meth:`ProgramBuilder.work`) are worked out once per op segment, a collective's fields are
those of all its members. :class:`PackedBuilder` keeps, per instruction, its GPU (4 bytes),
the index of its template (4 bytes) and its deps (CSR: 8 bytes an instruction and 4 a
dependency): ~20 bytes. :class:`PackedInstructions` reads and compares as the tuple the
plain :class:`ProgramBuilder` builds (``tests/test_packed.py``): ``packed[i]`` is that
tuple's ``i``-th instruction, made when read. What reads every instruction on a large
run reads the columns instead (:meth:`PackedInstructions.fields`: the engine's DAG and
loop, the statistics' summaries, the idle breakdown).

A template is ``(class, head, rest)``: the instruction is ``class(id, gpu, *head, deps,
*rest)`` (a compute op's and a collective's head are its kind and name, a send's its
destination, bytes, kind and name).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from operator import itemgetter
from typing import overload

import numpy as np

from workloads.program import (
    CLASS_CODE,
    Collective,
    Compute,
    Instruction,
    ProgramBuilder,
    Send,
)

_new = tuple.__new__


def _rest(cls: type, field: str) -> int:
    """Where ``field`` of an instruction of ``cls`` sits in its template's ``rest`` (the
    fields after its deps)."""
    return cls._fields.index(field) - cls._fields.index("deps") - 1  # type: ignore[attr-defined]


COMPUTE_BLOCKING_S = _rest(Compute, "blocking_comm_s")
COMPUTE_BLOCKING_KIND = _rest(Compute, "blocking_comm_kind")
COMPUTE_ALLOC = _rest(Compute, "alloc_bytes")
COMPUTE_FREE = _rest(Compute, "free_bytes")
COLLECTIVE_GROUP = _rest(Collective, "group")
COLLECTIVE_KEY = _rest(Collective, "key")
COLLECTIVE_OP = _rest(Collective, "op")
COLLECTIVE_ALGO = _rest(Collective, "algo")
COLLECTIVE_NBYTES = _rest(Collective, "nbytes")
COLLECTIVE_SKEW = _rest(Collective, "skew")
COLLECTIVE_DURATION_S = _rest(Collective, "duration_s")
SEND_DURATION_S = _rest(Send, "duration_s")
"""Positions of the fields the passes over a packed program read in a template's ``rest``,
from the named tuples' field order (a template's ``head`` is its fields between the GPU and
the deps: a send's ``(dst, nbytes, kind, name)``, the others' ``(kind, name)``)."""

def template_classes(templates: Sequence[tuple]) -> np.ndarray:
    """Each template's class as :data:`workloads.program.COMPUTE`, ``SEND`` or
    ``COLLECTIVE`` (int8): ``CLASS_CODE[template[0]]`` of each, read by ``map`` (no Python
    step a template: a large run has ~750,000). :meth:`PackedInstructions.classes` keeps it."""
    return np.fromiter(map(CLASS_CODE.__getitem__, map(itemgetter(0), templates)), np.int8,
                       len(templates))


class PackedInstructions(Sequence):
    """Instructions as :class:`PackedBuilder` packs them (see the module); a sequence of the
    named tuples, each made when read (not kept)."""

    __slots__ = ("_classes", "before", "deps", "first", "gpu", "templates", "tpl")

    def __init__(self, gpu: array, tpl: array, first: array, deps: array,
                 templates: list[tuple]) -> None:
        self.gpu = gpu
        """Per instruction its GPU (``array("i")``)."""
        self.tpl = tpl
        """Per instruction the index of its template in :attr:`templates` (``array("i")``)."""
        self.first = first
        """Instruction ``i``'s deps are ``deps[first[i]:first[i + 1]]`` (``array("q")``)."""
        self.deps = deps
        """Every instruction's deps in order (``array("i")``)."""
        self.templates = templates
        """``(class, head, rest)`` per template (see the module)."""
        self.before: object = None
        """Each instruction's stream predecessor, kept by the engine's DAG build for the idle
        breakdown's chains, which take it (:func:`workloads.streams.packed_before`): a
        function of the fields above, worked out once a run instead of twice; None: not
        kept."""
        self._classes: np.ndarray | None = None
        """:meth:`classes`, once worked out."""

    def __len__(self) -> int:
        return len(self.tpl)

    def classes(self) -> np.ndarray:
        """:func:`template_classes` of :attr:`templates` (read-only), worked out once a
        program rather than once per pass over it (the engine's tables, its DAG's streams, the
        statistics' summaries and the idle breakdown's chains read it); again if templates
        were added since."""
        known = self._classes
        if known is None or len(known) != len(self.templates):
            known = self._classes = template_classes(self.templates)
            known.flags.writeable = False
        return known

    def _make(self, i: int) -> Instruction:
        cls, head, rest = self.templates[self.tpl[i]]
        first = self.first
        return _new(cls, (i, self.gpu[i], *head, tuple(self.deps[first[i]:first[i + 1]]),
                          *rest))

    @overload
    def __getitem__(self, i: int) -> Instruction: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Instruction, ...]: ...

    def __getitem__(self, i: int | slice) -> Instruction | tuple[Instruction, ...]:
        if isinstance(i, slice):
            return tuple(map(self._make, range(*i.indices(len(self)))))
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("instruction index out of range")
        return self._make(i)

    def __iter__(self) -> Iterator[Instruction]:
        templates, deps = self.templates, self.deps
        first = iter(self.first)
        start = next(first, 0)
        for i, (g, t, stop) in enumerate(zip(self.gpu, self.tpl, first, strict=True)):
            cls, head, rest = templates[t]
            yield _new(cls, (i, g, *head, tuple(deps[start:stop]), *rest))
            start = stop

    def materialize(self) -> tuple[Instruction, ...]:
        """The instructions as one tuple (made anew: not kept)."""
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedInstructions):
            other = other.materialize()
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.materialize())

    def __add__(self, other: Sequence) -> tuple:
        return self.materialize() + tuple(other)

    def __radd__(self, other: Sequence) -> tuple:
        return tuple(other) + self.materialize()

    def __repr__(self) -> str:
        return repr(self.materialize())

    def __reduce__(self) -> tuple:
        return (tuple, (self.materialize(),))  # pickles as the plain tuple


class PackedBuilder(ProgramBuilder):
    """:class:`ProgramBuilder` that packs what it adds (:class:`PackedInstructions`): the same
    ids, keys and instructions."""

    def __init__(self) -> None:
        super().__init__()
        self._gpu, self._tpl = array("i"), array("i")
        self._first, self._deps = array("q", [0]), array("i")
        self._templates: list[tuple] = []
        self._work: dict[tuple[str, str, int], int] = {}
        """Per compute op's (kind, name, id of its shared fields): its template."""

    @property
    def next_id(self) -> int:
        return len(self._tpl)

    def _template(self, template: tuple) -> int:
        self._templates.append(template)
        return len(self._templates) - 1

    def _shared_template(self, kind: str, name: str, work: tuple) -> int:
        """The one template of a compute op whose copies share ``work`` (the template keeps
        ``work``, so its id stays unique while the builder lives)."""
        key = (kind, name, id(work))
        t = self._work.get(key)
        if t is None:
            t = self._work[key] = self._template((Compute, (kind, name), work))
        return t

    def _add(self, gpu: int, t: int, deps: Sequence[int]) -> int:
        i = len(self._tpl)
        self._gpu.append(gpu)
        self._tpl.append(t)
        if deps:
            self._deps.extend(deps)
        self._first.append(len(self._deps))
        return i

    def _add_each(self, gpus: Sequence[int], t: int, deps: Mapping[int, tuple[int, ...]],
                  missing: tuple[int, ...] | None = None) -> dict[int, int]:
        """One instruction of template ``t`` on each GPU of ``gpus``, in order, after
        ``deps[gpu]`` there (a GPU ``deps`` lacks: an error, or ``missing`` where given);
        returns each GPU's instruction id."""
        gpu, tpl, first, flat = self._gpu, self._tpl, self._first, self._deps
        get = deps.get
        ids = {}
        i = len(tpl)
        for g in gpus:
            ids[g] = i
            gpu.append(g)
            tpl.append(t)
            flat.extend(deps[g] if missing is None else get(g, missing))
            first.append(len(flat))
            i += 1
        return ids

    def compute(self, gpu: int, kind: str, name: str, deps: tuple[int, ...], **kw) -> int:
        return self._add(gpu, self._template((Compute, (kind, name), self.work(**kw))), deps)

    def compute_each(self, gpus: Sequence[int], kind: str, name: str,
                     deps: Mapping[int, tuple[int, ...]], work: tuple | None = None,
                     **kw) -> dict[int, int]:
        t = (self._template((Compute, (kind, name), self.work(**kw))) if work is None
             else self._shared_template(kind, name, work))
        return self._add_each(gpus, t, deps)

    def send(self, gpu: int, dst: int, nbytes: float, kind: str, name: str,
             deps: tuple[int, ...], **kw) -> int:
        rest = Send(0, 0, dst, nbytes, kind, name, (), **kw)[7:]
        return self._add(gpu, self._template((Send, (dst, nbytes, kind, name), rest)), deps)

    def collective(self, group: tuple[int, ...], deps: dict[int, tuple[int, ...]], *, kind: str,
                   name: str, op: str, nbytes: float, algo: str | None = None,
                   **kw) -> dict[int, int]:
        key = self.new_key()
        algo = self.default_algo if algo is None else algo
        rest = Collective(0, 0, kind, name, (), op, algo, group, nbytes, key, **kw)[5:]
        t = self._template((Collective, (kind, name), rest))
        return self._add_each(group, t, deps, missing=())

    @staticmethod
    def collective_step(kind: str, name: str, op: str, nbytes: float, algo: str | None = None,
                        **kw) -> tuple[str, str, None, tuple]:
        """A collective segment of :meth:`chain`, with :meth:`collective`'s keywords: its
        fields after the key worked out once (the same as :class:`Collective` makes them)."""
        tail = Collective(0, 0, kind, name, (), op, "", (), nbytes, 0, **kw)[10:]
        return kind, name, None, (op, algo, nbytes, tail)

    def chain(self, gpus: Sequence[int], deps: Mapping[int, tuple[int, ...]],
              steps: Sequence[tuple[str, str, tuple | None, tuple | None]]) -> int:
        """An op's segments on the TP lanes ``gpus``, one after another (each GPU's copy of a
        segment waits for its copy of the one before; the first for ``deps[gpu]``), as
        :meth:`compute_each` and :meth:`collective` add them segment by segment; ``steps``:
        per segment (kind, name, its shared work (:meth:`ProgramBuilder.work`), None), or a
        collective over ``gpus`` (:meth:`collective_step`). Returns the id of the
        last segment's copy on ``gpus[0]`` (the others' follow it)."""
        gpu, tpl, first, flat = self._gpu, self._tpl, self._first, self._deps
        width, start = len(gpus), len(tpl)
        group = tuple(gpus)
        for kind, name, work, shape in steps:
            if work is None:
                op, algo, nbytes, tail = shape
                rest = (op, self.default_algo if algo is None else algo, group, nbytes,
                        self.new_key(), *tail)
                t = self._template((Collective, (kind, name), rest))
            else:
                t = self._shared_template(kind, name, work)
            tpl.extend([t] * width)
        segments = len(steps)
        gpu.extend(group * segments)
        for g in gpus:
            flat.extend(deps[g])
            first.append(len(flat))
        if segments > 1:  # the k-th copy of a segment waits for the k-th of the one before
            at = len(flat)
            flat.extend(range(start, start + width * (segments - 1)))
            first.extend(range(at + 1, at + 1 + width * (segments - 1)))
        return start + width * (segments - 1)

    def build(self) -> PackedInstructions:  # type: ignore[override]
        self._work.clear()
        return PackedInstructions(self._gpu, self._tpl, self._first, self._deps,
                                  self._templates)
