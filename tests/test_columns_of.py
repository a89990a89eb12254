"""``columns_of`` (a program's instructions as arrays, read field by field in C loops) against
``columns_of_reference`` (the loop, instruction by instruction): the same arrays, dtypes,
names and signatures, or None for both."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_perf_columns import IDS, LAYOUTS, _experiment, _lowered
from workloads.program import (
    Collective,
    Columns,
    Compute,
    Send,
    columns_of,
    columns_of_reference,
)

KINDS = ("forward", "backward", "tp", "dp", "pp", "cp", "ep", "optimizer")


def assert_same(fast: Columns | None, ref: Columns | None) -> None:
    assert (fast is None) == (ref is None)
    if fast is None or ref is None:
        return
    for f in dataclasses.fields(Columns):
        a, b = getattr(fast, f.name), getattr(ref, f.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f.name
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f.name
        else:
            assert type(a) is type(b) and a == b, f.name


@st.composite
def instructions(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(0, 40))
    kind = st.sampled_from(KINDS)
    dur = st.one_of(st.floats(0, 1e-2, allow_nan=False), st.sampled_from([0.0, 1e-3]))
    out = []
    for i in range(n):
        deps = tuple(draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=4))) if i else ()
        gpu = draw(st.integers(0, 7))
        which = draw(st.sampled_from(("compute", "compute", "send", "collective")))
        if which == "compute":
            out.append(Compute(i, gpu, draw(kind), f"c{i}", deps,
                               flops=draw(st.floats(0, 1e12)),
                               duration_s=draw(st.one_of(st.none(), dur)),
                               blocking_comm_s=draw(st.sampled_from([0.0, 1e-4, 2.5e-3])),
                               blocking_comm_kind=draw(kind),
                               alloc_bytes=draw(st.sampled_from([0.0, 1.0, 3e9])),
                               free_bytes=draw(st.sampled_from([0.0, 2.0, 1e9])),
                               stage=draw(st.integers(-1, 3)), mb=draw(st.integers(-1, 3))))
        elif which == "send":
            out.append(Send(i, gpu, draw(st.integers(0, 7)), 1e6, draw(kind), f"s{i}", deps,
                            duration_s=draw(st.one_of(dur, dur, dur, st.none()))))
        else:
            group = (gpu,) if draw(st.integers(0, 9)) else (gpu, gpu + 1)
            out.append(Collective(i, gpu, draw(kind), f"k{i}", deps, "all_reduce", "ring",
                                  group, 1e6, i, duration_s=draw(st.one_of(dur, dur, dur,
                                                                           st.none()))))
    return tuple(out)


@settings(max_examples=300, deadline=None)
@given(instructions())
def test_columns_of_equals_the_loop(instrs: tuple) -> None:
    assert_same(columns_of(instrs), columns_of_reference(instrs))
    assert_same(columns_of(list(instrs)), columns_of_reference(list(instrs)))


def test_columns_of_an_empty_program() -> None:
    assert_same(columns_of(()), columns_of_reference(()))
    assert columns_of(()) is not None and len(columns_of(())) == 0


def test_another_instruction_class_takes_the_loop() -> None:
    class Other(Collective):  # not one of the three classes: read by attribute, as the loop
        pass

    instrs = (Compute(0, 0, "forward", "f", ()),
              Other(1, 0, "dp", "d", (0,), "all_reduce", "ring", (0,), 1.0, 0,
                    duration_s=1e-3))
    assert_same(columns_of(instrs), columns_of_reference(instrs))


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_columns_of_lowered_programs_equal_the_loop(layout: tuple) -> None:
    """Collapsed programs of the general op loop (the ones the engine converts)."""
    instrs = tuple(_lowered(_experiment(*layout), fast=False).instructions)
    cols = columns_of(instrs)
    assert cols is not None
    assert_same(cols, columns_of_reference(instrs))
