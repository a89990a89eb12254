"""One transformer layer of Korthikanti et al. 2022's 22B model (h 6144, 64 heads, TP 8,
micro-batch 4, s 2048, fp16, Megatron's fused softmax attention with dropout) in the five
settings of their table 4, against what the table measured on Selene's A100s: the
recomputation and sequence-parallel overheads relative to one layer without either.

Table 4 (ms, forward / backward): no recompute 7.7 / 11.9; sequence parallelism 7.2 / 11.8;
full recompute 7.7 / 19.5 (the rerun 7.6); selective recompute 7.7 / 13.2 (the rerun 1.3);
selective + sequence parallelism 7.2 / 13.1: overheads -3%, 39%, 7% and 4% of 19.6 ms.
The text of sec. 6.2 puts full recomputation at 39% rather than 33% because the
backward overlaps its all-reduces with the weight gradients while the rerun forward cannot.
"""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.experiment import build_experiment
from workloads.costs import CommSeg, ComputeSeg

MODES = {"base": ("none", False), "sp": ("none", True), "full": ("full", False),
         "selective": ("selective", False), "selective-sp": ("selective", True)}
"""Table 4's rows: (training.recompute, parallel.sequence_parallel)."""

MICRO_BATCHES = 8
"""Micro-batches a step, so that one layer's share of the optimizer step (its parameters'
update, the same in every mode) is 1/8 of a layer's in the difference below."""


def _experiment(mode: str, layers: int) -> dict:
    recompute, sp = MODES[mode]
    return {"name": f"22b-{mode}",
            "model": {"name": "gpt-22b", "num_layers": layers, "hidden_size": 6144,
                      "num_attention_heads": 64, "ffn_hidden_size": 24576, "ffn_type": "gelu",
                      "norm": "layernorm", "vocab_size": 51200, "tied_embeddings": True,
                      "position_embedding": "learned", "seq_length": 2048},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
            "parallel": {"tp": 8, "sequence_parallel": sp},
            "training": {"micro_batch_size": 4, "global_batch_size": 4 * MICRO_BATCHES,
                         "recompute": recompute, "attention": "fused", "precision": "fp16"}}


@pytest.fixture(scope="module")
def layer_s() -> dict[str, float]:
    """One layer's forward, backward and rerun in each mode (s): the step of three layers
    less the step of two, per micro-batch."""
    out = {}
    for mode in MODES:
        steps = [simulate(build_experiment(_experiment(mode, n)), fidelity="collapsed")
                 .stats["step_time_s"] for n in (2, 3)]
        out[mode] = (steps[1] - steps[0]) / MICRO_BATCHES
    return out


def test_full_recompute_reruns_each_layer_forward_with_its_all_reduces() -> None:
    """Megatron-LM 2022 (megatron/model/transformer.py at 9dc3c42,
    ``ParallelTransformer._checkpointed_forward``, uniform method, one layer a chunk):
    ``mpu.checkpoint(custom(l, l + 1), ...)`` reruns the layer's whole forward, its two
    tensor-parallel all-reduces included, before the layer's backward, and nothing else."""
    costs = build_experiment(_experiment("full", 2)).costs
    forward = costs._layer_forward("L0")
    backward = costs._layer_backward("L0", weight_grad_deferred=False)
    rerun = backward[:len(forward)]
    assert [s.label for s in rerun] == [f"recompute {s.label}" for s in forward]
    for again, once in zip(rerun, forward, strict=True):
        assert type(again) is type(once)
        if isinstance(once, ComputeSeg):
            assert (again.flops, again.attn_flops, again.elementwise_bytes) == (
                once.flops, once.attn_flops, once.elementwise_bytes)
    assert [s.op for s in rerun if isinstance(s, CommSeg)] == ["all_reduce", "all_reduce"]
    assert not any("recompute" in s.label for s in backward[len(forward):])


def test_table_4_full_recompute_costs_39_percent_of_a_layer(layer_s: dict) -> None:
    assert layer_s["full"] / layer_s["base"] - 1 == pytest.approx(7.6 / 19.6, abs=0.03)


def test_table_4_selective_rerun_against_the_full_one(layer_s: dict) -> None:
    """The attention core's rerun (QK^T, softmax, dropout, PV) against the whole layer's
    forward: 1.3 / 7.6 ms in table 4."""
    selective = layer_s["selective"] - layer_s["base"]
    full = layer_s["full"] - layer_s["base"]
    assert selective / full == pytest.approx(1.3 / 7.6, abs=0.03)


@pytest.mark.parametrize(("mode", "published"), [("sp", 19.0), ("selective", 20.9),
                                                 ("selective-sp", 20.3)])
def test_table_4_overheads_of_sequence_parallelism_and_selective_recompute(
        layer_s: dict, mode: str, published: float) -> None:
    assert layer_s[mode] / layer_s["base"] - 1 == pytest.approx(published / 19.6 - 1, abs=0.03)
