"""The ``megatron-lm-2021`` profile: Megatron-LM as Narayanan et al. (2021) ran it
(NVIDIA/Megatron-LM 50a4b5f, 2021-04-08; the same code at v2.5, the merge of the paper's
examples/sc21 scripts, and 6985e58), which the Narayanan et al. corpus rows name. It is
``[megatron]`` but for what that tree does differently (workloads/frameworks.toml, each field
with its file, lines and commit):

- the input gradient of a column-parallel GEMM all-reduced in the autograd order, blocking
  (megatron/mpu/mappings.py ``_CopyToModelParallelRegion.backward``); the asynchronous one
  came with 16c9044 (2021-09);
- no gradient-accumulation fusion (83b1e42, 2022-02): each micro-batch's weight gradients are
  added after the GEMMs, into the fp32 buffer under bf16 (10 bytes a parameter), into the fp16
  ``.grad`` by autograd under fp16 (6);
- Float16OptimizerWithFloat16Params' passes around FusedAdam: 52 bytes a parameter under fp16
  (no buffer to zero), 50 under bf16 (the fp32 buffer zeroed and scaled before the all-reduce);
- pipeline sends that block on both schedules, and eager CUDA module loading.
"""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from sim import api
from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import Experiment, build_experiment
from workloads.costs import ComputeSeg
from workloads.frameworks import FRAMEWORKS, framework
from workloads.schedules import BACKWARD, Op

_OWN = {"name", "summary", "sources", "under_fp16"}


def _differences(a, b) -> dict:
    return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in fields(a)
            if f.name not in _OWN and getattr(a, f.name) != getattr(b, f.name)}


def test_the_2021_tree_differs_from_megatron_only_where_its_code_does() -> None:
    new, old = FRAMEWORKS["megatron-lm-2021"], FRAMEWORKS["megatron"]
    assert _differences(new, old) == {"pp_send_blocking": ("always", "non-interleaved"),
                                      "cuda_module_loading": ("eager", "lazy"),
                                      "tp_async_grad_all_reduce": (False, True),
                                      "grad_accum_bytes": (10.0, 0.0),
                                      "embedding_grad_bytes": (2.0, 12.0),
                                      "optimizer_bytes": (50.0, 38.0)}
    fp16, old16 = framework("megatron-lm-2021", "fp16"), framework("megatron", "fp16")
    assert _differences(fp16, old16) == {"pp_send_blocking": ("always", "non-interleaved"),
                                         "cuda_module_loading": ("eager", "lazy"),
                                         "tp_async_grad_all_reduce": (False, True),
                                         "grad_accum_bytes": (6.0, 0.0),
                                         "grad_accum_first_stolen": (True, False),
                                         "embedding_grad_bytes": (2.0, 8.0),
                                         "kept_grad_copy_bytes": (4.0, None)}
    assert fp16.optimizer_bytes == old16.optimizer_bytes == 52.0
    for name in ("tp_async_grad_all_reduce", "grad_accum_bytes", "optimizer_bytes"):
        assert "50a4b5f" in new.source(name) and "50a4b5f" in fp16.source(name)
    assert "16c9044" in new.source("tp_async_grad_all_reduce")
    assert "83b1e42" in new.source("grad_accum_bytes")
    assert "accumulate_grad.h" in fp16.source("grad_accum_bytes")
    assert "accumulate_grad.h" in fp16.source("grad_accum_first_stolen")
    assert "d98e8a6" in old16.source("optimizer_bytes")
    assert "4fd6432" in fp16.source("kept_grad_copy_bytes")


def _experiment(precision: str) -> dict:
    return {"name": "18b", "model": {"name": "gpt-18b", "num_layers": 4, "hidden_size": 6144,
                                     "num_attention_heads": 48, "ffn_hidden_size": 24576,
                                     "ffn_type": "gelu", "norm": "layernorm",
                                     "vocab_size": 51200, "tied_embeddings": True,
                                     "position_embedding": "learned", "seq_length": 2048},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
            "parallel": {"tp": 8},
            "training": {"micro_batch_size": 2, "global_batch_size": 8, "recompute": "full",
                         "attention": "fused", "precision": precision,
                         "framework": "megatron-lm-2021"}}


def _elementwise(costs, op: Op) -> float:
    return sum(s.elementwise_bytes for s in costs.op_segments(op, split_backward=False)
               if isinstance(s, ComputeSeg))


def test_each_micro_batchs_weight_gradients_are_added_after_the_gemms() -> None:
    """No fused wgrad accumulation in 2021: every backward moves grad_accum_bytes a
    parameter of the stage (the embedding's included), and the embedding's own term only
    the dense gradient it writes; under fp16 autograd's AccumulateGrad keeps the first of the
    step's four micro-batches' gradients as it is (grad_accum_first_stolen): 6 x 3/4."""
    for precision, per_param in (("fp16", 6.0 * 3 / 4), ("bf16", 10.0)):
        costs = build_experiment(_experiment(precision)).costs
        assert costs.grad_accum_bytes == per_param and costs.embedding_grad_bytes == 2.0
        fused = replace(costs, grad_accum_bytes=0.0)
        backward = Op(0, BACKWARD, 0)
        extra = _elementwise(costs, backward) - _elementwise(fused, backward)
        assert extra == per_param * costs.stage_params(0)


def test_the_tp_all_reduce_of_the_input_gradient_blocks() -> None:
    """Without sequence parallelism the 2021 backward all-reduces each column-parallel input
    gradient before autograd goes on: slower than the same step with it beside the wgrad
    GEMM, which the 2022 tree (and [megatron]) runs."""
    exp = Experiment.from_dict(_experiment("fp16"))
    assert not exp.costs.tp_async_grad_all_reduce
    beside = replace(exp, costs=replace(exp.costs, tp_async_grad_all_reduce=True))
    blocking = api.simulate(exp, fidelity="collapsed").stats["step_time_s"]
    assert blocking > api.simulate(beside, fidelity="collapsed").stats["step_time_s"]


def test_narayanan_rows_run_the_2021_tree_in_fp16() -> None:
    """Every row of narayanan2021_megatron.csv names the profile of the code it ran, in the
    scripts' precision (examples/sc21/CONFIG.sh: --fp16 --loss-scale 8192)."""
    source = load_source(CORPUS_DIR / "narayanan2021_megatron.csv")
    assert {r.get("framework") for r in source.rows} == {"megatron-lm-2021"}
    assert {r.experiment()["training"]["precision"] for r in source.rows} == {"fp16"}


def test_the_fp32_gradient_copies_stay_allocated_under_fp16() -> None:
    """At 50a4b5f Float16OptimizerWithFloat16Params gives each fp32 main parameter a new fp32
    .grad under --fp16 and its zero_grad does not free them: 4 bytes a parameter of model
    state beside the 16, on every stage; under --bf16 .grad is the fp32 main_grad itself, no
    copy. Without ZeRO the copy covers every parameter of the stage, under ZeRO-1 its shard."""
    for precision, kept in (("fp16", 4.0), ("bf16", 0.0)):
        costs = build_experiment(_experiment(precision)).costs
        assert costs.kept_grad_copy_bytes == kept
        plain = replace(costs, kept_grad_copy_bytes=0.0)
        assert costs.static_bytes((0,)) - plain.static_bytes((0,)) == pytest.approx(
            kept * costs.stage_params(0))
    costs = build_experiment(_experiment("fp16")).costs
    sharded = replace(costs, zero_stage=1, dp=4)
    assert (sharded.static_bytes((0,)) - replace(sharded, kept_grad_copy_bytes=0.0)
            .static_bytes((0,))) == pytest.approx(4.0 * costs.stage_params(0) / 4)
