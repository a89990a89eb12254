"""Aleph Alpha's scaling adds each micro-batch's bf16 weight gradients into ``.grad`` through
autograd (no fused accumulation): 6 bytes a parameter of the stage, every micro-batch of a
step but the first, whose gradient autograd keeps as it is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim import api
from sim.experiment import Experiment
from workloads.costs import ComputeSeg, split_layers
from workloads.frameworks import FRAMEWORKS, apply_framework
from workloads.models import PRESETS
from workloads.schedules import BACKWARD, FORWARD, Op
from workloads.transformer import TransformerCosts


def _costs() -> TransformerCosts:
    return TransformerCosts(replace(PRESETS["llama3-8b"], num_layers=8, seq_length=2048),
                            micro_batch_size=1, tp=2, dp=2, stage_layers=split_layers(8, 2))


def _accumulation(costs: TransformerCosts, op: Op) -> list[ComputeSeg]:
    return [s for s in costs.op_segments(op, False)
            if isinstance(s, ComputeSeg) and s.label == "grad accumulation"]


@pytest.mark.parametrize("micro_batches", [1, 2, 8, 64])
def test_scaling_adds_every_micro_batchs_gradients_but_the_firsts(micro_batches: int) -> None:
    plain = _costs()
    profile = FRAMEWORKS["scaling"]
    assert profile.grad_accum_bytes == 6.0 and profile.grad_accum_first_stolen
    costs = apply_framework(plain, profile, micro_batches)
    per_step = 6.0 * (micro_batches - 1)
    assert costs.grad_accum_bytes * micro_batches == pytest.approx(per_step)
    for stage in (0, 1):
        segs = _accumulation(costs, Op(stage, BACKWARD, 0))
        if micro_batches == 1:
            assert segs == []
            continue
        (seg,) = segs
        assert seg.flops == 0.0
        assert seg.elementwise_bytes == pytest.approx(
            6.0 * (micro_batches - 1) / micro_batches * plain.stage_params(stage))
        assert _accumulation(costs, Op(stage, FORWARD, 0)) == []


def test_fused_accumulation_profiles_are_unchanged() -> None:
    """Megatron-LM's fused wgrad accumulation moves nothing; DeepSpeed's update_hp_grads
    runs after every micro-batch, the first too."""
    plain = _costs()
    assert apply_framework(plain, FRAMEWORKS["megatron"], 8).grad_accum_bytes == 0.0
    assert not FRAMEWORKS["deepspeed"].grad_accum_first_stolen
    assert apply_framework(plain, FRAMEWORKS["deepspeed"], 8).grad_accum_bytes == 18.0


def test_a_scaling_step_of_several_micro_batches_is_slower_for_it() -> None:
    run = {"name": "scaling", "model": {"preset": "llama3-8b", "seq_length": 2048,
                                        "num_layers": 4},
           "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
           "parallel": {"tp": 2, "pp": 1, "dp": 4},
           "training": {"micro_batch_size": 1, "global_batch_size": 16,
                        "framework": "scaling"}}
    exp = Experiment.from_dict(run)
    assert exp.costs.grad_accum_bytes == pytest.approx(6.0 * 3 / 4)
    fused = replace(exp, costs=replace(exp.costs, grad_accum_bytes=0.0))
    assert api.simulate(exp).stats["step_time_s"] > api.simulate(fused).stats["step_time_s"]
