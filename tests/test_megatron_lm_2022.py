"""The ``megatron-lm-2022`` profile: Megatron-LM of May 2022 (NVIDIA/Megatron-LM d898a89,
the merge of the sequence_parallel branch behind Korthikanti et al. 2022), which the
Korthikanti et al. corpus rows ran. It is ``[megatron]`` but for what that tree does
differently (workloads/frameworks.toml, each field with its source):

- the sequence-parallel input gradient reduce-scattered beside the weight gradient
  (megatron/mpu/layers.py ``LinearWithGradAccumulationAndAsyncCommunication.backward``);
- pipeline sends that block (megatron/p2p_communication.py ``torch.cuda.synchronize()``);
- Float16OptimizerWithFloat16Params' copies around FusedAdam and the local DDP's in-place
  scaling of the grad buffer before its all-reduce (50 bytes a parameter under bf16, 58 under
  fp16);
- under fp16 no gradient-accumulation fusion (megatron/arguments.py turns it off without
  fp32 accumulation), so each micro-batch's weight gradients are added into the fp16 grad
  buffer by the DDP hook: 6 bytes a parameter (the embedding's too, so its own term keeps only
  the dense gradient's 2).
"""

from __future__ import annotations

from dataclasses import fields, replace

from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import build_experiment
from workloads.costs import ComputeSeg
from workloads.frameworks import FRAMEWORKS, framework
from workloads.schedules import BACKWARD, Op

_OWN = {"name", "summary", "sources", "under_fp16"}


def _differences(a, b) -> dict:
    return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in fields(a)
            if f.name not in _OWN and getattr(a, f.name) != getattr(b, f.name)}


def test_the_2022_tree_differs_from_megatron_only_where_its_code_does() -> None:
    new, old = FRAMEWORKS["megatron-lm-2022"], FRAMEWORKS["megatron"]
    assert _differences(new, old) == {"sp_async_grad_reduce_scatter": (True, False),
                                      "pp_send_blocking": ("always", "non-interleaved"),
                                      "optimizer_bytes": (50.0, 38.0),
                                      "cuda_module_loading": ("eager", "lazy")}
    fp16, old16 = framework("megatron-lm-2022", "fp16"), framework("megatron", "fp16")
    assert _differences(fp16, old16) == {"sp_async_grad_reduce_scatter": (True, False),
                                         "pp_send_blocking": ("always", "non-interleaved"),
                                         "optimizer_bytes": (58.0, 52.0),
                                         "grad_accum_bytes": (6.0, 0.0),
                                         "embedding_grad_bytes": (2.0, 8.0),
                                         "cuda_module_loading": ("eager", "lazy")}
    for name in ("sp_async_grad_reduce_scatter", "pp_send_blocking", "optimizer_bytes"):
        assert "d898a89" in new.source(name) and "d898a89" in fp16.source(name)
    assert "d898a89" in fp16.source("grad_accum_bytes")
    assert "buffer_.data /=" in new.source("optimizer_bytes")
    assert "buffer_.data /=" in fp16.source("optimizer_bytes")
    assert "pytorch#86509" in new.source("cuda_module_loading")


def _experiment(precision: str) -> dict:
    return {"name": "22b", "model": {"name": "gpt-22b", "num_layers": 4, "hidden_size": 6144,
                                     "num_attention_heads": 64, "ffn_hidden_size": 24576,
                                     "ffn_type": "gelu", "norm": "layernorm",
                                     "vocab_size": 51200, "tied_embeddings": True,
                                     "position_embedding": "learned", "seq_length": 2048},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
            "parallel": {"tp": 8, "sequence_parallel": True},
            "training": {"micro_batch_size": 4, "global_batch_size": 8,
                         "recompute": "selective", "attention": "fused",
                         "precision": precision, "framework": "megatron-lm-2022"}}


def test_fp16_adds_each_micro_batchs_weight_gradients_into_the_grad_buffer() -> None:
    """``param.main_grad.add_(param.grad.data)`` (megatron/model/distributed.py at d898a89):
    read 2 and 2, write 2 bytes a parameter of the stage after each backward; under bf16 the
    fused wgrad GEMM accumulates in place (nothing after it)."""
    for precision, per_param in (("fp16", 6.0), ("bf16", 0.0)):
        costs = build_experiment(_experiment(precision)).costs
        assert costs.grad_accum_bytes == per_param
        assert costs.sp_async_grad_reduce_scatter and costs.pp_send_blocking
        fused = replace(costs, grad_accum_bytes=0.0)
        backward = Op(0, BACKWARD, 0)
        extra = _elementwise(costs, backward) - _elementwise(fused, backward)
        assert extra == per_param * costs.stage_params(0)


def _elementwise(costs, op: Op) -> float:
    return sum(s.elementwise_bytes for s in costs.op_segments(op, split_backward=False)
               if isinstance(s, ComputeSeg))

def test_korthikanti_rows_run_the_2022_tree() -> None:
    """Every row of korthikanti2022_megatron.csv names the profile of the code it ran."""
    source = load_source(CORPUS_DIR / "korthikanti2022_megatron.csv")
    assert {r.get("framework") for r in source.rows} == {"megatron-lm-2022"}
    assert {r.experiment()["training"]["framework"] for r in source.rows} == {
        "megatron-lm-2022"}
