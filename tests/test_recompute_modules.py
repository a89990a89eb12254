"""Megatron-core's selective recomputation by module (``training.recompute_modules``): what
each module drops from a layer's stash and reruns in its backward, against hand-computed
bytes and FLOPs, and the errors for modules a model lacks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from base.errors import ConfigError
from sim.api import simulate
from sim.config import TrainingConfig
from sim.experiment import Experiment, build_experiment
from workloads.costs import CommSeg, ComputeSeg
from workloads.models import MLASpec, ModelSpec, MoESpec
from workloads.recompute_modules import RECOMPUTE_MODULES
from workloads.transformer import TransformerCosts

EXAMPLE = (Path(__file__).resolve().parents[1] / "workloads" / "examples"
           / "deepseek-v3-recompute-modules.yaml")

TOKENS = 1024
"""Tokens of a micro-batch (b = 1, s = 1024) in the MLA/MoE model below."""

DENSE = ModelSpec("dense", num_layers=2, hidden_size=1024, num_attention_heads=8,
                  num_kv_heads=8, ffn_hidden_size=4096, vocab_size=32000, seq_length=2048)
"""SwiGLU, RMSNorm (no dropout masks), h = 1024, f = 4h."""

MLA_MOE = ModelSpec(
    "mla-moe", num_layers=3, hidden_size=1024, num_attention_heads=8, num_kv_heads=8,
    ffn_hidden_size=2048, vocab_size=32000, seq_length=TOKENS, first_dense_layers=1,
    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=512, shared_experts=1),
    mla=MLASpec(q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32,
                v_head_dim=64))
"""A small DeepSeek-V3-like model: its first layer dense (f = 2048), then MoE layers of 8
experts (top 2, f_e = 512, one shared), multi-latent attention (q: 8·(64 + 32) = 768 wide,
k: 768, v: 8·64 = 512; latents 256 + 128, rotary key 32)."""


def _costs(model: ModelSpec, modules: tuple[str, ...] = ()) -> TransformerCosts:
    """TP 2 with sequence parallelism, one stage of all layers, bf16, flash attention;
    ``recompute: selective`` of ``modules`` (none: ``recompute: none``)."""
    return TransformerCosts(model, 1, 2, 1, (model.num_layers,), sequence_parallel=True,
                            recompute="selective" if modules else "none",
                            recompute_modules=modules)


def test_the_schema_offers_exactly_the_modules_the_cost_model_knows() -> None:
    literal = TrainingConfig.model_fields["recompute_modules"].annotation
    (listed,) = [a for a in get_args(literal) if a is not type(None)]
    assert set(get_args(get_args(listed)[0])) == set(RECOMPUTE_MODULES)


def test_mlp_recompute_keeps_only_the_mlp_input_of_a_dense_layer() -> None:
    """Per token, in bytes, h = 1024, t = 2 with SP: the two norm inputs and the two GEMM
    inputs 2·(2 + 2 + 2 + 2)·h/2 = 4096, Q, K, V 2·3h/2 = 3072, the attention output
    2·h/2 = 1024, the SwiGLU intermediates 6·f/2 = 12288: 20480. ``mlp`` drops the MLP's
    GEMM input (1024) and its intermediates (12288): 7168."""
    n = DENSE.seq_length
    assert _costs(DENSE).layer_activation_bytes() == 20480 * n
    assert _costs(DENSE, ("mlp",)).layer_activation_bytes() == 7168 * n
    assert _costs(DENSE, ("core_attn",)).layer_activation_bytes() == 20480 * n  # flash


def test_mlp_recompute_reruns_the_mlp_forward_with_its_tp_collectives() -> None:
    """The backward gains the MLP's forward GEMMs, 2·n·h·3f/t = 2·2048·1024·12288/2 FLOPs,
    between a TP all-gather and reduce-scatter of the layer input (2·n·h bytes)."""
    n = DENSE.seq_length
    base = _costs(DENSE).block_segments(backward=True, label="L0")
    rec = _costs(DENSE, ("mlp",)).block_segments(backward=True, label="L0")
    extra = rec[:len(rec) - len(base)]
    assert [type(s) for s in extra] == [CommSeg, ComputeSeg, CommSeg]
    assert [s.op for s in extra if isinstance(s, CommSeg)] == ["all_gather", "reduce_scatter"]
    assert all(s.nbytes == 2 * n * 1024 for s in extra if isinstance(s, CommSeg))
    assert extra[1].flops == 2 * n * 1024 * 3 * 4096 / 2
    assert rec[len(extra):] == base


def _per_token(modules: tuple[str, ...], layer: int) -> float:
    return _costs(MLA_MOE, modules)._layer(layer).layer_activation_bytes() / TOKENS


def test_what_each_module_drops_from_a_mla_moe_layer() -> None:
    """Per token, bytes, h = 1024, t = 2 with SP, a MoE layer without recomputation: norm
    and GEMM inputs 2·4·1024/2 = 4096; the two dispatched copies as the experts' first
    GEMM keeps them, all-gathered over the expert TP group (e = t = 2; Megatron-core
    ``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` gathers the received rows before
    the experts, so each GPU holds e/t of every token's copies, not 1/t),
    2·2·1024·2/2 = 4096; the latents, each kept as the up-projection's input and
    normalised input, (2 + 2)·384/2 = 768; Q, K, V 2·(768 + 768 + 512)/2 = 2048; the
    attention output 2·512/2 = 512; the SwiGLU intermediates of the 2 routed rows and the
    shared expert 6·512·3/2 = 4608. Total 16128."""
    assert _per_token((), 2) == 16128
    assert _per_token(("core_attn",), 2) == 16128  # flash: no score matrix to drop
    # Q, K, V (2048) and the normalised latents; the latents once, the rotary key gathered
    assert _per_token(("mla_up_proj",), 2) == 16128 - 2048 - 768 + (2 * 384 / 2 + 2 * 32)
    # the down-projections' input and the router's input (1024 each)
    assert _per_token(("layernorm",), 2) == 16128 - 2048
    # the gathered dispatched copies (4096) and every expert intermediate; the MoE input
    # stays
    assert _per_token(("moe",), 2) == 16128 - 4096 - 4608
    # the routed rows' activation outputs, 2·512·2/2
    assert _per_token(("moe_act",), 2) == 16128 - 1024
    # the shared expert's intermediates, 6·512/2
    assert _per_token(("shared_experts",), 2) == 16128 - 1536
    assert _per_token(("mla_up_proj", "moe"), 2) == 16128 - 2048 - 768 + 448 - 4096 - 4608


def test_a_fp8_moe_layer_keeps_the_router_input_in_bf16_and_the_dispatched_copies_in_fp8(
) -> None:
    """FP8, per token: norm inputs 4·1024/2 = 2048; the down-projections' input in fp8
    1·1024/2 = 512; the router's input as it is, bf16, 2·1024/2 = 1024; the dispatched
    copies in fp8, gathered over the expert TP group as in the bf16 layer above
    (e = t = 2), 1·2·1024·2/2 = 2048; the latents and their fp8 normalised copy
    (2 + 1)·384/2 = 576; Q, K, V 2048 and the attention output 512 (the attention core
    stays bf16); the intermediates with the down-projections' inputs in fp8,
    (6 - 1)·512·3/2 = 3840. Total 12608."""
    fp8 = replace(_costs(MLA_MOE), precision="fp8")
    assert fp8._layer(2).layer_activation_bytes() == 12608 * TOKENS


def test_dense_and_moe_modules_act_on_their_own_layers_only() -> None:
    """The dense first layer: 4096 + 768 + 2048 + 512 + 6·2048/2 = 13568 bytes a token;
    ``mlp`` drops its MLP input and intermediates (1024 + 6144) and leaves the MoE layers
    alone, ``moe`` the reverse (Megatron's ``recompute_mlp`` is set only on dense layers)."""
    assert _per_token((), 0) == 13568
    assert _per_token(("mlp",), 0) == 13568 - 1024 - 6144
    assert _per_token(("mlp",), 2) == 16128  # the MoE layer's total, as without modules
    assert _per_token(("moe",), 0) == 13568
    assert _per_token(("layernorm",), 0) == 13568 - 1024  # only MLA's input norm is separate


def _rerun(modules: tuple[str, ...]) -> list:
    return _costs(MLA_MOE, modules)._layer(2)._module_recompute("L2")


def test_what_each_module_reruns_in_a_mla_moe_layer() -> None:
    """Forward work added before the layer's backward, n = 1024 tokens, t = 2, h = 1024."""
    n, h = TOKENS, 1024
    (up,) = _rerun(("mla_up_proj",))  # q: 256 -> 768/2, kv: 128 -> 8·(64 + 64)/2
    assert up.flops == 2 * n * (256 * 768 / 2 + 128 * 1024 / 2)
    assert up.elementwise_bytes == 20 * n * (768 + 640) / 2  # unfused RoPE on q and k (MLA)
    (norms,) = _rerun(("layernorm",))  # two fused norms, read and write, s/t tokens
    assert norms.flops == 0 and norms.elementwise_bytes == 2 * 4 * n * h / 2
    (act,) = _rerun(("moe_act",))  # fused SwiGLU (6 B) over the 2·n routed rows, f_e/t wide
    assert act.flops == 0 and act.elementwise_bytes == 6 * 2 * n * 512 / 2
    shared = _rerun(("shared_experts",))  # its all-gather, GEMMs, reduce-scatter
    assert [type(s) for s in shared] == [CommSeg, ComputeSeg, CommSeg]
    assert shared[1].flops == 2 * n * h * 3 * 512 / 2
    # ep = 1, no all-to-all: the shared expert's all-gather of the layer input (2·n·h), the
    # routed copies' all-gather over the expert TP group (e = t: 2·2n·h·e/t), router, routed
    # rows and shared expert, and the two reduce-scatters in reverse (Megatron-core
    # core_v0.19.0: SharedExpertMLP.forward gathers under SP; the dispatcher's
    # dispatch_postprocess / combine_preprocess gather and reduce-scatter over expt_tp
    # even with ep = 1). The router scores the s/t tokens of the GPU's SP shard
    # (MoELayer.forward routes hidden_states before the dispatcher gathers any).
    moe = _rerun(("moe",))
    assert [type(s) for s in moe] == [CommSeg, CommSeg, ComputeSeg, CommSeg, CommSeg]
    assert [s.op for s in moe if isinstance(s, CommSeg)] == [
        "all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    assert [s.nbytes for s in moe if isinstance(s, CommSeg)] == [
        2 * n * h, 2 * (2 * n) * h * 2 / 2, 2 * (2 * n) * h * 2 / 2, 2 * n * h]
    assert moe[2].flops == (2 * (n / 2) * h * 8 + 2 * (2 * n) * h * 3 * 512 / 2
                            + 2 * n * h * 3 * 512 / 2)
    # ep = 2: the all-to-alls outside the expert TP collectives, inside the shared expert's
    ep = replace(_costs(MLA_MOE, ("moe",)), dp=2, ep=2)._layer(2)._module_recompute("L2")
    assert [s.op for s in ep if isinstance(s, CommSeg)] == [
        "all_gather", "all_to_all", "all_gather", "reduce_scatter", "all_to_all",
        "reduce_scatter"]


GPT = ModelSpec("gpt", num_layers=2, hidden_size=1024, num_attention_heads=8, num_kv_heads=8,
                ffn_hidden_size=4096, vocab_size=32000, seq_length=1024, ffn_type="gelu",
                norm="layernorm", position_embedding="learned")
"""A GPT-3-style layer (LayerNorm, GeLU, learned positions): its layers keep dropout masks."""


@pytest.mark.parametrize("dropout", [True, False])
def test_core_attn_rerun_of_a_non_flash_kernel_draws_the_attention_dropout_again(
        dropout: bool) -> None:
    """Megatron-LM's checkpointed ``CoreAttention`` (2022, megatron/model/transformer.py)
    runs QK^T, the fused scale-mask-softmax, the dropout on the probabilities and the
    product with V: its rerun moves the softmax's 2 passes (2 bytes an element each) and the
    dropout's 5 bytes an element (read, write, mask) over the b·a/t·s² scores, as the
    forward does. b = 1, a = 8, t = 2 (SP), s = 1024: 4·1024² score elements."""
    costs = replace(_costs(GPT, ("core_attn",)), attention="fused", dropout=dropout)
    scores = 1 * 8 / 2 * 1024 ** 2
    (core,) = costs._module_recompute("L0")
    assert core.flops == 0
    assert core.attn_flops == 4 * 1 * 1024 ** 2 * 1024 / 2
    assert core.elementwise_bytes == (2 * 2 + (5 if dropout else 0)) * scores
    # the forward's attention block moves the same score bytes beside its norm and residual
    n, h = 1024, 1024
    forward_attn = costs._elementwise_forward()[0]
    assert forward_attn - core.elementwise_bytes == (4 + 6) * n * h / 2
    # FlashAttention drops out inside its kernel: no memory-bound bytes to rerun
    (flash,) = replace(costs, attention="flash2")._module_recompute("L0")
    assert flash.elementwise_bytes == 0


def test_module_recompute_trades_memory_for_time_in_a_simulated_step() -> None:
    """On 8 H100s, recomputing the MoE layers lowers the peak and lengthens the step, and
    less than full recomputation does."""
    def run(recompute: str, modules: list[str] | None = None) -> tuple[float, float]:
        training = {"micro_batch_size": 1, "global_batch_size": 8, "recompute": recompute}
        if modules:
            training["recompute_modules"] = modules
        exp = build_experiment({
            "model": {"hf_config": "tests/fixtures/hf/deepseek-v3.json", "num_layers": 4,
                      "seq_length": 1024},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
            "parallel": {"tp": 2, "pp": 1, "dp": 4, "ep": 4, "sequence_parallel": True},
            "training": training})
        stats = simulate(exp, fidelity="collapsed").stats
        return stats["step_time_s"], stats["peak_memory_gib"]

    none, moe, full = run("none"), run("selective", ["moe"]), run("full")
    assert none[0] < moe[0] < full[0]
    assert none[1] > moe[1] > full[1]


@pytest.mark.parametrize(("model", "modules", "message"), [
    ({"preset": "llama2-7b"}, ["mla_up_proj"], "no multi-latent attention"),
    ({"preset": "llama2-7b"}, ["moe"], "no MoE layers"),
    ({"preset": "llama2-7b"}, ["moe_act"], "no MoE layers"),
    ({"preset": "llama2-7b"}, ["layernorm"], "fused into the next GEMM"),
    ({"preset": "mixtral-8x7b"}, ["mlp"], "every layer's MLP is a MoE layer"),
    ({"preset": "mixtral-8x7b"}, ["shared_experts"], "no shared experts"),
    ({"preset": "llama2-7b"}, ["core_attn", "core_attn"], "given twice"),
])
def test_a_module_the_model_lacks_is_refused(model: dict, modules: list[str],
                                             message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_experiment(_experiment(model, "selective", modules))


def test_modules_need_selective_recompute_and_a_known_name() -> None:
    with pytest.raises(ConfigError, match="needs training.recompute: selective"):
        build_experiment(_experiment({"preset": "llama2-7b"}, "full", ["core_attn"]))
    with pytest.raises(ConfigError, match="recompute_modules"):
        build_experiment(_experiment({"preset": "llama2-7b"}, "selective", ["attention"]))


def test_selective_without_modules_is_megatron_default_core_attn() -> None:
    exp = build_experiment(_experiment({"preset": "llama2-7b"}, "selective", None))
    assert exp.costs.recompute_modules == ("core_attn",)
    assert replace(exp.costs, attention="unfused").layer_activation_bytes() == replace(
        exp.costs, attention="unfused", recompute="none").layer_activation_bytes() - (
        5 * 32 * 4096 / 4096 / 8 * exp.costs._bsh)


def _experiment(model: dict, recompute: str, modules: list[str] | None) -> dict:
    training: dict = {"micro_batch_size": 1, "global_batch_size": 8, "recompute": recompute}
    if modules is not None:
        training["recompute_modules"] = modules
    return {"model": {**model, "seq_length": 4096},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
            "parallel": {"tp": 8, "sequence_parallel": True}, "training": training}


def test_the_example_recomputes_mla_up_projections_and_dense_mlps() -> None:
    """workloads/examples/deepseek-v3-recompute-modules.yaml: its stage of dense layers
    stashes less with the two modules than without them, and more than with full
    recomputation."""
    exp = Experiment.from_yaml(EXAMPLE)
    costs = exp.costs
    assert costs.recompute == "selective"
    assert costs.recompute_modules == ("mla_up_proj", "mlp")
    stashed = [replace(costs, recompute=r).activation_bytes_per_mb(0)
               for r in ("none", "selective", "full")]
    assert stashed[0] > stashed[1] > stashed[2]
