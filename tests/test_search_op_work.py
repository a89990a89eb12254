"""The search bounds' op work (:meth:`StageOps.op_work`, one layer's segments per cost model)
is :meth:`StageOps.op_segments` (layer by layer) but for the labels; and the bounds' op-time
key (:func:`sim.search.bounds._op_key`) shares a forward's entry across split backwards and,
without partitioned pipeline gathers, between the first stage and the others: the segments
it stands for are the same there."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.search import Layout, SearchContext
from sim.search.bounds import _op_key
from workloads.costs import ComputeSeg
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op

PRESETS = ["gpt3-1.3b", "llama2-70b", "mixtral-8x7b"]


def _unnamed(seg: object) -> object:
    """A segment with empty labels, its parts' too (every other field as it is)."""
    if not is_dataclass(seg):
        return seg
    changes = {f.name: _unnamed(getattr(seg, f.name)) for f in fields(seg)
               if is_dataclass(getattr(seg, f.name))}
    if any(f.name == "label" for f in fields(seg)):
        changes["label"] = ""
    return replace(seg, **changes)


def _work(segs: tuple) -> tuple:
    """What the bounds read of an op's segments: every field but the labels, and the
    first segment's label aside (the op's name)."""
    return tuple(_unnamed(s) for s in segs)


@st.composite
def _costs(draw: st.DrawFn) -> tuple:
    preset = draw(st.sampled_from(PRESETS))
    layers = draw(st.sampled_from([2, 4, 6]))
    data = {"name": "work", "model": {"preset": preset, "num_layers": layers,
                                      "seq_length": 2048},
            "cluster": {"preset": draw(st.sampled_from(["dgx-a100-80g", "dgx-h100"])),
                        "num_gpus": 16},
            "training": {"global_batch_size": 32,
                         "recompute_num_layers": draw(st.sampled_from([None, None, 1]))}}
    if data["training"]["recompute_num_layers"] is None:
        del data["training"]["recompute_num_layers"]
    try:
        ctx = SearchContext.build(data)
    except Exception:  # noqa: BLE001  a preset this build cannot search: nothing to check
        return None
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2]))
    cp = draw(st.sampled_from([1, 2])) if "cp=2" not in ctx.unsupported else 1
    ep = draw(st.sampled_from([1, 2])) if "ep=2" not in ctx.unsupported else 1
    dp = 16 // (tp * pp * cp)
    layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep if dp * cp % ep == 0 else 1,
                    micro_batch_size=draw(st.sampled_from([1, 2])),
                    sequence_parallel=draw(st.booleans()) and tp > 1,
                    zero_stage=draw(st.sampled_from([0, 1, 3])),
                    recompute=draw(st.sampled_from(["none", "selective", "full"])))
    stages = pp * draw(st.sampled_from([1, 2]))
    if stages > layers:
        stages = pp
    try:
        costs = ctx.costs_for(layout, stages)
    except Exception:  # noqa: BLE001  a layout the cost model refuses: nothing to check
        return None
    if draw(st.booleans()):
        costs = replace(costs, pp_partition_gathers=draw(st.booleans()))
    return costs


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(costs=_costs())
def test_op_work_is_op_segments_but_for_labels(costs: object) -> None:
    if costs is None:
        return
    n = len(costs.stage_layers)
    for stage in range(n):
        for kind in (FORWARD, BACKWARD, WEIGHT_GRAD):
            for split in (False, True):
                for markers in (False, True):  # with markers: what the budget counts
                    op = Op(stage, kind, 0)
                    work = costs.op_work(op, split, markers)
                    assert _work(work) == _work(costs.op_segments(op, split, markers))
                    assert costs.op_work(op, split, markers) is work  # kept


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(costs=_costs())
def test_op_key_holds_what_a_forward_reads(costs: object) -> None:
    """Two ops with the same key have the same segments but for their labels."""
    if costs is None:
        return
    seen: dict[tuple, tuple] = {}
    for stage in range(len(costs.stage_layers)):
        for kind in (FORWARD, BACKWARD, WEIGHT_GRAD):
            for split in (False, True):
                segs = _work(costs.op_segments(Op(stage, kind, 0), split))
                key = _op_key(costs, stage, kind, split)
                assert seen.setdefault(key, segs) == segs


def test_a_forward_shares_its_key_where_it_reads_the_same() -> None:
    """The key does share: a forward's split and, without TP, its first stage (else the
    normalisation would be vacuous); with TP the first stage's forward runs the input
    embedding's collective."""
    ctx = SearchContext.build({"name": "k", "model": {"preset": "gpt3-1.3b", "num_layers": 4},
                               "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
                               "training": {"global_batch_size": 32}})
    costs = ctx.costs_for(Layout(tp=2, pp=4, dp=2), 4)
    assert _op_key(costs, 0, FORWARD, True) == _op_key(costs, 0, FORWARD, False)
    assert _op_key(costs, 0, FORWARD, False) != _op_key(costs, 1, FORWARD, False)
    assert _op_key(costs, 0, BACKWARD, False) != _op_key(costs, 1, BACKWARD, False)
    one = ctx.costs_for(Layout(tp=1, pp=4, dp=4), 4)
    assert _op_key(one, 0, FORWARD, True) == _op_key(one, 1, FORWARD, False)
    gathers = replace(costs, pp_partition_gathers=True)
    assert _op_key(gathers, 0, FORWARD, False) != _op_key(gathers, 1, FORWARD, False)
    assert isinstance(costs.op_work(Op(1, FORWARD, 0), False)[0], ComputeSeg)
