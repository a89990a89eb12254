"""A program's instruction objects read as columns at C speed: the DAG's and the idle
breakdown's per-instruction passes over a full-fidelity program, on arrays.

A full lowering holds its instructions as named tuples (:mod:`workloads.program`); the
engine's DAG build (:func:`sim.engine._dag_on_arrays`) reads a few fields of each. Here
those fields are taken
from all instructions at once by ``map`` over ``operator`` getters (no Python step per
instruction) and the stream rule (:func:`sim.engine._stream_of`: a GPU's compute stream,
its send stream to each destination, its collective stream of each kind) is applied by
one stable sort: each instruction's stream predecessor is the one before it in its
stream's run of the sorted order. The reference is the loop
(:func:`sim.engine._predecessors`); ``tests/test_streams.py`` compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter, itemgetter
from typing import NamedTuple

import numpy as np

from workloads.packed import PackedInstructions
from workloads.program import CLASS_CODE, COMPUTE

_ID, _GPU, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
"""Fields every instruction class has at the same place: id, GPU; and the third (a compute
op's or collective's kind, a send's destination: what names its stream besides the GPU)."""
_DEPS = attrgetter("deps")


class StreamColumns(NamedTuple):
    """Per instruction (indexed by id): its stream predecessor and its deps (int64 arrays)."""

    before: np.ndarray
    """The instruction before it on its stream; -1: none."""
    ndeps: np.ndarray
    """How many deps."""
    flat: np.ndarray
    """Every instruction's deps in order, one after another."""


def stream_columns(instrs: Sequence) -> StreamColumns | None:
    """The :class:`StreamColumns` of ``instrs``; None where an instruction is of another
    class or its id is not its position (the loop then decides). The temporaries are
    released one at a time (a 4-byte GPU and a code per instruction, the stream keys, their
    order): on a large program their peak is the DAG build's."""
    n = len(instrs)
    if not n:
        return None
    if isinstance(instrs, PackedInstructions):
        return _packed_columns(instrs)
    if not np.array_equal(np.fromiter(map(_ID, instrs), np.int64, n), np.arange(n)):
        return None
    try:
        cls = np.fromiter(map(CLASS_CODE.__getitem__, map(type, instrs)), np.int8, n)
    except KeyError:
        return None
    third = list(map(_THIRD, instrs))
    codes = {value: k for k, value in enumerate(set(third))}  # equal values, equal codes
    key = np.fromiter(map(codes.__getitem__, third), np.int64, n)
    del third
    key[cls == COMPUTE] = 0  # a compute op's stream is its GPU's, whatever its kind
    gpu = np.fromiter(map(_GPU, instrs), np.int32, n)
    key += (gpu.astype(np.int64) * 3 + cls) * len(codes)  # (GPU, class, kind or destination)
    del gpu, cls
    order = np.argsort(key, kind="stable")  # per stream, its instructions in id order
    key = key[order]
    same = np.flatnonzero(key[1:] == key[:-1])  # order[k + 1] follows order[k] on its stream
    del key
    before = np.full(n, -1, dtype=np.int64)
    before[order[same + 1]] = order[same]
    del order, same
    deps = list(map(_DEPS, instrs))
    ndeps = np.fromiter(map(len, deps), np.int64, n)
    flat = np.fromiter(chain.from_iterable(deps), np.int64, int(ndeps.sum()))
    return StreamColumns(before, ndeps, flat)


def _packed_columns(instrs: PackedInstructions) -> StreamColumns:
    """:func:`stream_columns` of a packed program: its stream predecessors
    (:func:`packed_before`), its deps already columns."""
    before = packed_before(instrs).astype(np.int64, copy=False)
    ndeps = np.diff(np.frombuffer(instrs.first, dtype=np.int64))
    flat = np.frombuffer(instrs.deps, dtype=np.int32).astype(np.int64)
    return StreamColumns(before, ndeps, flat)


def packed_before(instrs: PackedInstructions, keep: bool = False) -> np.ndarray:
    """Each instruction's stream predecessor (-1: none) in a packed program, from its class
    and third field per template and its GPU: int32 where the ids and stream keys fit, else
    int64 (:func:`sim.packedpass.dag` reads it as is; :func:`_packed_columns` widens it).
    ``keep``: also held on ``instrs`` (:attr:`PackedInstructions.before`) until a call
    without ``keep``, which takes it instead of working it out again (the engine's DAG build
    keeps it, the idle breakdown's chains take it: 4 bytes an instruction held between them,
    where working it out again took ~4 % of a 4,096-GPU run's CPU). The caller must not
    write to it (a copy where it does)."""
    kept = instrs.before
    if kept is not None:
        if not keep:
            instrs.before = None
        return kept  # type: ignore[return-value]
    before = _packed_before(instrs)
    if keep:
        instrs.before = before
    return before


def _packed_before(instrs: PackedInstructions) -> np.ndarray:
    """:func:`packed_before`, worked out."""
    templates = instrs.templates
    cls_of = instrs.classes()
    third = [head[0] for _, head, _ in templates]  # kind, or a send's destination
    codes = {value: k for k, value in enumerate(set(third))}
    third_of = np.fromiter(map(codes.__getitem__, third), np.int64, len(templates))
    third_of[cls_of == COMPUTE] = 0
    del third
    tpl = np.frombuffer(instrs.tpl, dtype=np.int32)
    gpu = np.frombuffer(instrs.gpu, dtype=np.int32)
    n = len(tpl)
    # the key in 4 bytes where it fits (half the memory traffic of its gathers, the same
    # stable order: a stable sort's order depends only on the values)
    wide = max((int(gpu.max(initial=0)) * 3 + 3) * len(codes), n) >= 2**31
    kind = np.int64 if wide else np.int32
    # (gpu * 3 + class) * codes + third, as gpu * 3 * codes + (class * codes + third): the
    # same integers, the template's part worked out once per template and gathered once
    key = (cls_of.astype(kind) * len(codes) + third_of.astype(kind))[tpl]
    key += gpu.astype(kind) * (3 * len(codes))
    order = np.argsort(key, kind="stable")
    key = key[order]
    # in sorted order, each one's predecessor is the one before it where their keys are
    # equal (the same stream), else none; scattered back to ids by one pass over ``order``
    # (``before[order[k]] = order[k - 1]`` where ``key[k] == key[k - 1]``: every id once)
    prev = np.empty(n, dtype=kind)
    if n:
        prev[0] = -1
        prev[1:] = order[:-1]
        prev[1:][key[1:] != key[:-1]] = -1
    del key
    before = np.empty(n, dtype=kind)
    before[order] = prev
    return before


def edges_of(columns: StreamColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every instruction's predecessors in the order the loop meets them (its stream
    predecessor, then its deps), flat; per instruction how many, and where they begin."""
    before, ndeps, flat = columns.before, columns.ndeps, columns.flat
    has = before >= 0
    edges = has + ndeps
    at = np.cumsum(edges) - edges
    pred = np.empty(int(edges.sum()), dtype=np.int64)
    stream = at[has]
    pred[stream] = before[has]
    is_dep = np.ones(len(pred), dtype=bool)
    is_dep[stream] = False
    pred[is_dep] = flat
    return pred, edges, at
