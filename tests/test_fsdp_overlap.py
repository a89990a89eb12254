"""ZeRO-3 collectives slow the compute they overlap (:mod:`sim.fsdpoverlap`): the per-layer
loss, where it applies, and what it adds to a step end to end."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest
from conftest import segment_timer

from sim import api
from sim.commtime import CollectiveTimer
from sim.contention import DATA_FILE, compute_slowdown
from sim.fsdpoverlap import lowering_costs, with_contention
from workloads.costs import ComputeSeg
from workloads.lowering.groups import dp_groups
from workloads.program import Compute

EXAMPLE = "workloads/examples/llama3-8b-fsdp-torchtitan.yaml"



def test_data_has_its_source() -> None:
    data = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))
    assert 0 < data["compute_slowdown"] < 1
    assert "2507.03114" in data["compute_slowdown_source"]
    assert compute_slowdown() == data["compute_slowdown"]


def test_loss_is_the_slowdown_times_the_shorter_of_collective_and_compute() -> None:
    """Forward: s·min(c_ag, g_fwd); backward: s·min(c_ag + c_rs, g_bwd); a collective longer
    than the compute slows only the compute's length."""
    exp = api.load_experiment(EXAMPLE)
    compute_s = segment_timer(exp)
    s = compute_slowdown()
    forward, backward, gather, reduce = exp.costs.zero3_layer_work()
    g_f = sum(compute_s(x) for x in forward if isinstance(x, ComputeSeg))
    g_b = sum(compute_s(x) for x in backward if isinstance(x, ComputeSeg))
    for c in (1e-4, 10.0):
        out = with_contention(exp.costs, compute_s, lambda op, nbytes, c=c: c)
        assert out.zero3_overlap_s == pytest.approx((s * min(c, g_f), s * min(2 * c, g_b)))
    timer = CollectiveTimer(exp.cluster)
    groups = dp_groups(exp.placement, 0)
    real = lowering_costs(exp, exp.costs, compute_s, timer).zero3_overlap_s
    ag, rs = timer("all_gather", groups, gather), timer("reduce_scatter", groups, reduce)
    assert reduce == 2 * gather  # fp32 reduction (the fsdp profile) of bf16 parameters
    assert real == pytest.approx((s * min(ag, g_f), s * min(ag + rs, g_b)))
    assert 0 < real[0] < real[1]


def test_only_zero3_over_several_shards() -> None:
    exp = api.load_experiment(EXAMPLE)
    compute_s = segment_timer(exp)
    for costs in (replace(exp.costs, zero_stage=1), replace(exp.costs, dp=1)):
        assert with_contention(costs, compute_s, lambda op, n: 1.0) is costs


def test_step_gains_the_loss_of_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each layer's forward and backward carry one fixed-time segment of the loss; the step
    is longer by their sum (the collectives stay hidden behind the compute)."""
    exp = api.load_experiment(EXAMPLE)
    fwd, bwd = lowering_costs(exp, exp.costs, segment_timer(exp),
                              CollectiveTimer(exp.cluster)).zero3_overlap_s
    result = api.simulate(exp, fidelity="full")
    ops = [i for i in result.program.instructions
           if isinstance(i, Compute) and i.gpu == 0 and i.name.endswith("zero3 overlap")]
    layers = exp.costs.model.num_layers
    micro_batches = result.stats["num_microbatches"]
    assert len(ops) == 2 * layers * micro_batches
    assert sorted({round(op.duration_s, 15) for op in ops}) == sorted(
        {round(fwd, 15), round(bwd, 15)})
    monkeypatch.setattr(api, "fsdp_lowering_costs", lambda exp, costs, compute_s, timer: costs)
    without = api.simulate(exp, fidelity="full")
    added = micro_batches * layers * (fwd + bwd)
    assert result.stats["step_time_s"] - without.stats["step_time_s"] == pytest.approx(
        added, rel=0.05)


def test_zero2_reducing_every_microbatch_loses_the_reduce_scatter_in_the_backward() -> None:
    """A ZeRO-2 that reduce-scatters every micro-batch's gradients (llama3's FSDP) runs one
    reduce-scatter beside each layer's backward and gathers nothing during the step: backward
    s·min(c_rs, g_bwd), forward nothing; each layer's backward carries it as a segment."""
    from sim.experiment import build_experiment
    from workloads.schedules import BACKWARD, FORWARD, Op

    exp = build_experiment({
        "name": "z2", "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 4},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
        "parallel": {"tp": 8, "pp": 1, "dp": 2, "zero_stage": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "framework": "llama3"}})
    assert exp.costs.reduces_every_microbatch
    compute_s = segment_timer(exp)
    _, backward, _, reduce = exp.costs.zero3_layer_work()
    g_b = sum(compute_s(x) for x in backward if isinstance(x, ComputeSeg))
    for c in (1e-4, 10.0):
        out = with_contention(exp.costs, compute_s, lambda op, nbytes, c=c: c)
        assert out.zero3_overlap_s == pytest.approx((0.0, compute_slowdown() * min(c, g_b)))
    out = with_contention(exp.costs, compute_s, lambda op, nbytes: 1e-3)
    labels = [x.label for x in out.op_segments(Op(0, BACKWARD, 0), False)]
    assert sum(label.endswith("dp overlap") for label in labels) == 4
    assert not any("overlap" in x.label for x in out.op_segments(Op(0, FORWARD, 0), False))
    megatron = replace(exp.costs, zero2_reduce_every_microbatch=False)
    assert with_contention(megatron, compute_s, lambda op, n: 1.0) is megatron
