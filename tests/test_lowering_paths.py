"""Lowering's and the schedule tables' fast paths equal their references on random
experiments (issue 18).

A collapsed lowering of plain ops (no ZeRO-3, buckets, CP or EP pieces, no fused groups)
lays its op loop out on arrays (:mod:`workloads.lowering.columnar`); ``lower(...,
reference=True)`` builds the same program with the reference op loop
(:mod:`workloads.lowering.ops`). Over random experiments (:mod:`tests.strategies`): the
same instructions in the same order, every field equal (types and reprs too, so ``-0.0``
or NaN would show), the same static memory and names; and the columns the engine and the
idle analysis read equal the columns of the reference's instructions. The list schedule
of a schedule without fused groups runs on producer columns
(:func:`workloads.schedules.producer_positions`); ``list_schedule(..., reference=True)``
runs the general loop; the lowering order is the unit-duration run's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sim.commtime import CollectiveTimer
from sim.experiment import build_experiment
from tests.strategies import collapsible_experiments, experiments
from workloads.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS
from workloads.lowering import Collapse, lower, topological_ops
from workloads.program import ColumnarInstructions, columns_of
from workloads.schedules import Op, list_schedule, unit_times

EXAMPLES = 300
"""Random experiments per run (each lowers in milliseconds)."""


def _compute_s(seg) -> float:  # type: ignore[no-untyped-def]
    return seg.flops * 1e-15 + seg.hbm_bytes * 1e-12 + seg.elementwise_bytes * 1e-13


def _collapse(exp) -> Collapse:  # type: ignore[no-untyped-def]
    # one compute timer for all examples and the cluster's shared collective timer, as
    # sim.api hands them out: the fast path's remembered folds (folded_use) are shared by
    # the examples on equal segments and groups
    return Collapse(compute_s=_compute_s, collective_s=CollectiveTimer.shared(exp.cluster))


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collapsible_experiments(), st.sampled_from((False, True, "non-interleaved")))
def test_fast_lowering_equals_the_reference(data: dict, blocking: bool | str) -> None:
    """Pipeline sends beside the compute, blocking their sender on every schedule (a
    rendezvous of sender and receiver on a 1F1B order, DeepSpeed's steps; else the
    sender's wait) or on Megatron-LM's non-interleaved schedule only
    (:func:`~workloads.lowering.pipeline.sends_block`): the same program both ways."""
    _fast_equals_reference(data, blocking)


@settings(max_examples=EXAMPLES // 2, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(experiments(collapsible=True, schedule="1f1b"), st.sampled_from((True,
                                                                         "non-interleaved")))
def test_fast_rendezvous_lowering_equals_the_reference(data: dict, blocking: bool | str
                                                       ) -> None:
    """Megatron-LM's 1F1B (and DeepSpeed's) blocking sends, each message a rendezvous of
    its two GPUs in DeepSpeed's step order (:func:`~workloads.lowering.columnar._rendezvous`
    against :func:`~workloads.lowering.pipeline.emit_rendezvous`): the same program."""
    _fast_equals_reference(data, blocking)


def _fast_path_case(data: dict, blocking: bool | str):  # type: ignore[no-untyped-def]
    """``data`` narrowed to what the columnar fast path lowers, built, and its costs with
    ``pp_send_blocking`` set to ``blocking``: (experiment, costs, ZeRO stage)."""
    parallel = data["parallel"]
    assume(parallel["cp"] == 1 and parallel["ep"] == 1)  # CP and EP ops are pieces
    # ZeRO-3, gradient buckets and a ZeRO-2 that reduces every micro-batch cut ops into
    # pieces: the reference loop only
    parallel["zero_stage"] = min(parallel["zero_stage"], 2)
    framework = FRAMEWORKS[data["training"].get("framework", DEFAULT_FRAMEWORK)]
    if framework.zero2_reduce_every_microbatch:
        parallel["zero_stage"] = min(parallel["zero_stage"], 1)
    parallel["overlap_grad_reduce"] = False
    parallel.pop("grad_bucket_MB", None)
    parallel.pop("overlap_param_gather", None)
    exp = build_experiment(data)
    # fused groups and a multimodal schedule's encoder ops take the op loop (the latter
    # tested in tests/test_multimodal.py)
    assume(not exp.schedule.fused and exp.schedule.encoder is None)
    costs = replace(exp.costs, pp_send_blocking=blocking) \
        if hasattr(exp.costs, "pp_send_blocking") else exp.costs
    return exp, costs, parallel["zero_stage"]


def _fast_equals_reference(data: dict, blocking: bool | str) -> None:
    """The fast path's program and columns equal the reference op loop's on ``data`` with
    ``pp_send_blocking`` set to ``blocking``."""
    exp, costs, zero_stage = _fast_path_case(data, blocking)
    args = (exp.schedule, costs, exp.placement, zero_stage, _collapse(exp))
    first = lower(*args)  # its folds remembered (or read, where earlier examples left them)
    fast, ref = lower(*args), lower(*args, reference=True)  # the fast path's read
    assert first == fast
    assert isinstance(fast.instructions, ColumnarInstructions)  # the fast path ran
    assert not isinstance(ref.instructions, ColumnarInstructions)
    cols = fast.instructions.columns
    plain = columns_of(ref.instructions)
    assert plain is not None
    for field in ("cls", "gpu", "dst", "fixed_s", "blocking_s", "alloc_bytes", "free_bytes"):
        assert np.array_equal(getattr(cols, field), getattr(plain, field), equal_nan=True)
    for field in ("kind", "comm"):
        names, ref_names = np.array((*cols.names, "")), np.array((*plain.names, ""))
        assert list(names[getattr(cols, field)]) == list(ref_names[getattr(plain, field)])
    width = max(cols.deps.shape[1], plain.deps.shape[1])
    deps = np.full((len(cols), width), -1)
    deps[:, :cols.deps.shape[1]] = cols.deps
    ref_deps = np.full((len(plain), width), -1)
    ref_deps[:, :plain.deps.shape[1]] = plain.deps
    assert np.array_equal(deps, ref_deps)
    assert [type(i) for i in fast.instructions] == [type(i) for i in ref.instructions]
    assert repr(fast.instructions) == repr(ref.instructions)
    assert fast == ref


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(experiments(), st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=3,
                               max_size=3))
def test_schedule_tables_equal_the_reference(data: dict, costs: list[float]) -> None:
    """The list schedule on producer columns equals the general loop (op durations by
    kind, encoder pieces included); the lowering order equals the unit-duration run sorted
    by (end, rank, start)."""
    schedule = build_experiment(data).schedule
    by_kind = dict(zip("FBW", costs, strict=True))
    by_kind.update(E=costs[0] / 2, G=costs[1] / 2)  # a multimodal schedule's encoder pieces

    def duration(op: Op) -> float:
        return by_kind[op.kind] * (1 + 0.1 * op.stage)

    assert list_schedule(schedule, duration) == list_schedule(schedule, duration,
                                                              reference=True)
    unit = list_schedule(schedule, lambda op: 1.0, reference=True)
    assert dict(unit_times(schedule)) == unit
    rank = schedule.stage_rank
    assert topological_ops(schedule) == sorted(
        unit, key=lambda op: (unit[op][1], rank[op.stage], unit[op][0]))


@settings(max_examples=EXAMPLES // 2, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collapsible_experiments())
def test_remembered_pieces_equal_the_reference(data: dict) -> None:
    """A collapsed lowering of ops in pieces (CP, EP, ZeRO-3, gradient buckets, parameter
    gathers) remembers per op shape its split and pending collectives
    (:func:`~workloads.lowering.collapse.folded_plan`) and its instructions, replayed for the
    next op of that shape (:meth:`~workloads.lowering.pieces.PieceLowering._replay`); the
    reference emits every op afresh: the same program, every field equal."""
    exp = build_experiment(data)
    args = (exp.schedule, exp.costs, exp.placement, data["parallel"]["zero_stage"],
            _collapse(exp))
    fast, ref = lower(*args), lower(*args, reference=True)
    assert [type(i) for i in fast.instructions] == [type(i) for i in ref.instructions]
    assert repr(fast.instructions) == repr(ref.instructions)
    assert fast == ref
