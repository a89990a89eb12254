"""A full program held packed (:mod:`workloads.packed`) against the same program as named
tuples (the reference lowering's): the same instructions, and, simulated on the engine's own
heap, byte-identical statistics, timeline and idle breakdown (the packed loops of
:mod:`sim.packedpass`, the engine's packed reads and :func:`workloads.streams.stream_columns`
on the columns against the loops over the objects), on random experiments.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import SCHEDULES, experiments, link_changes

import workloads.lowering as lowering
from sim import api, engine, idle, packedpass, timeline
from sim.api import simulate
from sim.experiment import build_experiment
from workloads.packed import PackedBuilder, PackedInstructions
from workloads.program import CLASS_CODE, ProgramBuilder
from workloads.streams import stream_columns

CASES = 8
"""Generated experiments per schedule."""


def _both(exp: object, changes: list) -> tuple[api.Result, api.Result]:
    """``exp`` simulated at full fidelity with its program packed, and with it as tuples."""
    packed = simulate(exp, fidelity="full", link_changes=changes)
    lowering.PackedBuilder = ProgramBuilder  # type: ignore[misc]
    try:
        plain = simulate(exp, fidelity="full", link_changes=changes)
    finally:
        lowering.PackedBuilder = PackedBuilder  # type: ignore[misc]
    return packed, plain


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_packed_program_runs_as_the_tuples(schedule: str) -> None:
    """Per schedule, 8 generated experiments (derandomized): the packed program equals the
    tuples instruction for instruction, its stream columns theirs, and the run's statistics
    (as ``stats.json`` writes them), spans, flows, memory samples and collectives are
    identical."""

    @settings(max_examples=CASES, derandomize=True, deadline=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(experiments(schedule=schedule))
    def agree(data: dict) -> None:
        exp = build_experiment(data)
        packed, plain = _both(exp, link_changes(exp))
        ours, theirs = packed.program.instructions, plain.program.instructions
        if packed.steps == 1:
            assert isinstance(ours, PackedInstructions)
        assert isinstance(theirs, tuple)
        assert len(ours) == len(theirs)
        assert tuple(ours) == theirs and ours == theirs
        assert [ours[i] for i in range(len(ours))] == list(theirs)
        a, b = stream_columns(ours), stream_columns(theirs)
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            for x, y in zip(a, b, strict=True):
                assert x.tolist() == y.tolist()
        if isinstance(ours, PackedInstructions):  # the DAG with its smaller temporaries
            assert packedpass.dag(ours) == engine._dag_on_arrays(theirs)
        # the idle breakdown's chains on arrays against the loop, on made-up times with ties
        n = len(theirs)
        ready = [float((i * 31) % 11) for i in range(n)]
        end = [r + float((i * 7919) % 13) for i, r in enumerate(ready)]
        if packed.steps == 1:
            plain_program = dataclasses.replace(packed.program, instructions=theirs)
            assert ours.before is not None  # the DAG build above kept its predecessors
            ours_chains = idle._chains(packed.program, ready, end)  # ... and these take them
            assert ours.before is None
            theirs_chains = idle._chains(plain_program, ready, end)
            assert ours_chains[2].keys() == theirs_chains[2].keys()
            assert {g: ops.tolist() for g, ops in ours_chains[2].items()} == theirs_chains[2]
            assert (ours_chains[:2] + ours_chains[3:]) == (theirs_chains[:2] + theirs_chains[3:])
            mid = [r + float((i * 17) % 5) for i, r in enumerate(ready)]
            # the classes kept per program (read by the passes) against each template's own
            assert ours.classes().tolist() == [CLASS_CODE[c] for c, _, _ in ours.templates]
            # the arrays' path itself, not the loop it may fall back to (None)
            assert packedpass.summaries(packed.program, ready, mid, end) is not None
            ours_sum = timeline.summaries_of(packed.program, ready, mid, end)
            theirs_sum = timeline.summaries_of(plain_program, ready, mid, end)
            assert list(ours_sum.intervals.items()) == list(theirs_sum.intervals.items())
            assert ours_sum == theirs_sum
        assert api.stats_json(packed.stats) == api.stats_json(plain.stats)
        for what in ("spans", "flows", "memory", "collectives", "peak_memory_by_gpu"):
            assert getattr(packed.timeline, what) == getattr(plain.timeline, what), what

    agree()


def test_packed_reads_as_a_sequence() -> None:
    """Indexing (negative, slices, out of range), equality and pickling as the tuple."""
    import pickle

    b, p = PackedBuilder(), ProgramBuilder()
    for builder in (b, p):
        work = builder.work(flops=1e9, stage=0, mb=1, alloc_bytes=5.0)
        first = builder.compute_each((0, 1), "F", "op", {0: (), 1: ()}, work)
        again = builder.compute_each((0, 1), "F", "op", {0: (first[0],), 1: (first[1],)}, work)
        ids = builder.collective((0, 1), {0: (again[0],), 1: (again[1], first[1])}, kind="tp",
                                 name="ar", op="all_reduce", nbytes=64.0, stage=0, mb=1)
        builder.send(1, 0, 8.0, "pp", "send", (ids[1],), stage=0, mb=1)
        builder.compute(0, "opt", "opt", (ids[0],), duration_s=1.0)
    ours, theirs = b.build(), p.build()
    assert ours == theirs and tuple(ours) == theirs
    assert ours[-1] == theirs[-1] and ours[2:5] == theirs[2:5]
    assert pickle.loads(pickle.dumps(ours)) == theirs
    assert len(ours.templates) == 4  # the two copies of the op share one template
    with pytest.raises(IndexError):
        ours[len(theirs)]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_summaries_in_chunks_equal_the_loop(schedule: str, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """:func:`sim.packedpass.summaries` works a chunk of ids, of whole collective groups and
    of sorted records at a time (``_CHUNK``; a large run has several): with chunks of 1, 2, 5
    and 64 (every group, record and lane cut across chunks somewhere) the summaries equal the
    loop's over the tuples, the dict's order included, on made-up times with ties."""

    @settings(max_examples=4, derandomize=True, deadline=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(experiments(schedule=schedule))
    def agree(data: dict) -> None:
        exp = build_experiment(data)
        packed = simulate(exp, fidelity="full")
        if packed.steps != 1:
            return
        ours = packed.program.instructions
        assert isinstance(ours, PackedInstructions)
        plain_program = dataclasses.replace(packed.program, instructions=tuple(ours))
        n = len(ours)
        ready = [float((i * 31) % 11) for i in range(n)]
        end = [r + float((i * 7919) % 13) for i, r in enumerate(ready)]
        mid = [r + float((i * 17) % 5) for i, r in enumerate(ready)]
        theirs = timeline.summaries_of(plain_program, ready, mid, end)
        for chunk in (1, 2, 5, 64):
            monkeypatch.setattr(packedpass, "_CHUNK", chunk)
            got = packedpass.summaries(packed.program, ready, mid, end)
            assert got is not None
            assert list(got.intervals.items()) == list(theirs.intervals.items())
            assert got == theirs

    agree()
