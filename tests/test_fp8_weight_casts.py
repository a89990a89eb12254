"""FP8 weight casts (``fp8_weight_casts``): Transformer Engine casts each FP8 linear's bf16
weight to fp8 with its transpose once a step where the framework passes
``is_first_microbatch`` (Megatron-core, NeMo), in every forward where it does not
(llm-foundry's plain te.Linear calls)."""

from __future__ import annotations

from dataclasses import replace
from importlib.resources import files

import pytest

from sim.api import simulate
from sim.calibration import default_profile
from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import Experiment
from workloads.costs import split_layers
from workloads.elementwise import FP8_AMAX_BYTES
from workloads.frameworks import FRAMEWORKS, apply_framework, load_profiles
from workloads.models import PRESETS
from workloads.schedules import BACKWARD, FORWARD, Op
from workloads.transformer import TransformerCosts


def _gpt3(mode: str, precision: str = "fp8", tp: int = 4, dp: int = 2, **kw
          ) -> TransformerCosts:
    """GPT-3 175B's blocks (hidden 12288, GELU MLP 4h, biases) on 8 layers, 2 stages."""
    model = replace(PRESETS["gpt3-175b"], num_layers=8)
    return TransformerCosts(model, 1, tp, dp, split_layers(8, 2), precision=precision,
                            fp8_weight_casts=mode, **kw)


def test_the_weight_elements_are_the_blocks_linears_on_one_tp_rank() -> None:
    """GPT-3: Q, K, V and output projections 4h² + 4h (their biases), the MLP 8h² + 5h,
    over TP 4; the two norms are not cast."""
    c = _gpt3("step")
    h = 12288
    assert c.fp8_weight_elements() == ((4 * h * h + 4 * h) / 4, (8 * h * h + 5 * h) / 4)
    attn, mlp = c.fp8_weight_elements()
    assert attn + mlp == (c.model.layer_params() - 2 * c.model.norm_params) / 4


def test_each_weight_element_moves_the_cast_and_transpose_bytes() -> None:
    """fp8_cast_transpose_fused: read 2, write 1 + 1 (fp8_cast_bytes 4); current scaling
    reads the weight once more for its amax."""
    c = _gpt3("step")
    attn, mlp = c.fp8_weight_elements()
    assert c.fp8_weight_cast_bytes("step") == (4.0 * attn, 4.0 * mlp)
    assert c.fp8_weight_cast_bytes("microbatch") == (0.0, 0.0)
    current = _gpt3("step", fp8_current_scaling=True)
    assert current.fp8_weight_cast_bytes("step") == ((4.0 + FP8_AMAX_BYTES) * attn,
                                                     (4.0 + FP8_AMAX_BYTES) * mlp)


@pytest.mark.parametrize("precision,mode,cast_bytes", [("bf16", "step", 4.0),
                                                       ("fp8", "none", 4.0),
                                                       ("fp8", "step", 0.0)])
def test_no_weight_cast_without_fp8_a_mode_or_cast_kernels(precision: str, mode: str,
                                                           cast_bytes: float) -> None:
    c = _gpt3(mode, precision=precision, fp8_cast_bytes=cast_bytes)
    assert c.fp8_weight_cast_bytes("step") == c.fp8_weight_cast_bytes("microbatch") == (0, 0)
    assert c.stage_fp8_weight_cast_bytes(0) == 0.0


def test_once_a_step_the_casts_join_the_step_end_work_and_no_op() -> None:
    """``step``: the optimizer segment of a rank's stages gains 4 bytes a weight element of
    their layers (here 4 layers a stage, and ZeRO-1 shards the update but not the casts);
    every forward and backward op is unchanged."""
    step, none = _gpt3("step", zero_stage=1, dp=8), _gpt3("none", zero_stage=1, dp=8)
    attn, mlp = step.fp8_weight_elements()
    for stages in ((0,), (1,), (0, 1)):
        added = (step.optimizer_segment(stages).elementwise_bytes
                 - none.optimizer_segment(stages).elementwise_bytes)
        assert added == pytest.approx(4.0 * (attn + mlp) * 4 * len(stages), rel=1e-12)
    for kind in (FORWARD, BACKWARD):
        assert step.op_segments(Op(1, kind, 0), False) == none.op_segments(Op(1, kind, 0), False)


def _forward_bytes(c: TransformerCosts) -> list[float]:
    return [s.elementwise_bytes for s in c._layer_forward("L") if hasattr(s, "flops")]


def test_in_every_forward_the_casts_join_each_blocks_memory_bound_work() -> None:
    """``microbatch``: each layer's attention and MLP block forward gain their weights'
    cast bytes; the backward (which uses the transposes cast forward) and the step-end work
    do not; a fully recomputed forward casts again."""
    every, none = _gpt3("microbatch"), _gpt3("none")
    attn, mlp = every.fp8_weight_elements()
    (a1, m1), (a0, m0) = _forward_bytes(every), _forward_bytes(none)
    assert (a1 - a0, m1 - m0) == pytest.approx((4.0 * attn, 4.0 * mlp), rel=1e-12)
    assert every._layer_backward("L", False) == none._layer_backward("L", False)
    assert every.optimizer_segment((0,)) == none.optimizer_segment((0,))
    full, full0 = _gpt3("microbatch", recompute="full"), _gpt3("none", recompute="full")
    extra = (sum(s.elementwise_bytes for s in full._layer_backward("L", False)
                 if hasattr(s, "flops"))
             - sum(s.elementwise_bytes for s in full0._layer_backward("L", False)
                   if hasattr(s, "flops")))
    assert extra == pytest.approx(4.0 * (attn + mlp), rel=1e-12)


def test_a_recomputed_forward_casts_again_whichever_recomputation_reruns_it() -> None:
    """One rule for the per-forward casts (``microbatch`` as ``float8-linear``): they are
    the forward's memory-bound bytes, so a ``selective-op`` recomputation, which reruns the
    layer's memory-bound kernels, casts again; the backward carries none of them."""
    every, none = _gpt3("microbatch", recompute="selective-op"), _gpt3("none",
                                                                       recompute="selective-op")
    attn, mlp = every.fp8_weight_elements()
    assert every._fp8_weight_cast_pair() == ((4.0 * attn, 4.0 * mlp), (0.0, 0.0))
    assert every._elementwise_backward() == none._elementwise_backward()
    rec = [s.elementwise_bytes for s in every._layer_backward("L", False)
           if s.label.startswith("recompute")]
    rec0 = [s.elementwise_bytes for s in none._layer_backward("L", False)
            if s.label.startswith("recompute")]
    assert rec and len(rec) == len(rec0)
    assert [a - b for a, b in zip(rec, rec0, strict=True)] == pytest.approx(
        [4.0 * (attn + mlp)] * len(rec), rel=1e-12)


def test_the_profiles_say_how_their_frameworks_cast() -> None:
    for name in ("megatron", "nemo-launcher", "megatron-bridge", "llama3", "megatron-core-r0.8"):
        assert FRAMEWORKS[name].fp8_weight_casts == "step"
    assert "is_first_microbatch" in FRAMEWORKS["nemo-launcher"].source("fp8_weight_casts")
    assert "bd0b818" in FRAMEWORKS["megatron"].source("fp8_weight_casts")
    assert FRAMEWORKS["llm-foundry"].fp8_weight_casts == "microbatch"
    assert "v0.10" in FRAMEWORKS["llm-foundry"].source("fp8_weight_casts")
    for name in ("fsdp", "fsdp-compile"):
        assert FRAMEWORKS[name].fp8_weight_casts == "float8-linear"
    for name in ("deepspeed", "scaling"):
        assert FRAMEWORKS[name].fp8_weight_casts == "none"
    costs = apply_framework(_gpt3("none"), FRAMEWORKS["nemo-launcher"], 8)
    assert costs.fp8_weight_casts == "step"


def test_a_bad_mode_is_refused_naming_the_profile_and_the_choices() -> None:
    text = files("workloads").joinpath("frameworks.toml").read_text(encoding="utf-8")
    bad = text.replace('fp8_weight_casts = "microbatch"', 'fp8_weight_casts = "layer"', 1)
    with pytest.raises(ValueError, match=r"\[llm-foundry\].*fp8_weight_casts='layer'.*step"):
        load_profiles(bad)


def _exp(framework: str) -> Experiment:
    return Experiment.from_dict({
        "name": "w", "model": {"preset": "gpt3-175b", "num_layers": 8},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
        "parallel": {"tp": 4, "pp": 2, "dp": 2, "zero_stage": 1},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "precision": "fp8",
                     "framework": framework}})


def test_a_step_is_longer_by_the_casts_at_the_hbm_rate() -> None:
    """The same run with the casts once a step and without them: the step grows by the
    casts' bytes at the elementwise HBM rate (the step-end work runs on every rank at once,
    after the last backward of each)."""
    exp = _exp("nemo-launcher")
    without = replace(exp, costs=replace(exp.costs, fp8_weight_casts="none"))
    profile = default_profile("H100")
    t1 = simulate(exp, profile, fidelity="collapsed").stats["step_time_s"]
    t0 = simulate(without, profile, fidelity="collapsed").stats["step_time_s"]
    cast = exp.costs.stage_fp8_weight_cast_bytes(0)
    assert cast == exp.costs.stage_fp8_weight_cast_bytes(1) > 0
    gpu = exp.cluster.gpu
    assert t1 - t0 == pytest.approx(cast / (gpu.hbm_bandwidth_Bps
                                            * profile.elementwise_efficiency), rel=1e-6)


# ------------------------------------------------ Transformer Engine's LayerNormMLP (fused GeLU)
def _mlp_bytes(c: TransformerCosts) -> tuple[float, float]:
    """The MLP block's memory-bound bytes of one layer, (forward, backward)."""
    fwd = c._elementwise_forward()[1]
    return fwd, c._elementwise_backward()[1]


def test_a_layernorm_mlp_gelu_writes_fp8_and_its_backward_is_one_fused_kernel() -> None:
    """Per ffn element of a token on one TP rank: forward GeLU 4 + the second GEMM's input
    cast 4 = 8 bytes become 3 (read bf16, write fp8); backward GeLU 2·4 + the gradient's
    cast 4 = 12 become the fp8 activation's transpose 2 + the fused dgelu cast 6 = 8. The
    attention block and every other MLP term are unchanged."""
    te, mcore = (_gpt3("none", fp8_act_cast_fused=True, sequence_parallel=True),
                 _gpt3("none", sequence_parallel=True))
    f = te._tokens * te.model.ffn_hidden_size / te.tp
    (tf, tb), (mf, mb) = _mlp_bytes(te), _mlp_bytes(mcore)
    assert mf - tf == pytest.approx(5 * f, rel=1e-12)
    assert mb - tb == pytest.approx(4 * f, rel=1e-12)
    assert te._elementwise_forward()[0] == mcore._elementwise_forward()[0]
    assert (te._elementwise_backward()[0]
            == mcore._elementwise_backward()[0])


@pytest.mark.parametrize("change", [{"precision": "bf16"}, {"fp8_norm_cast_fused": False},
                                    {"fp8_cast_bytes": 0.0}])
def test_the_fused_gelu_needs_te_fp8_casts(change: dict) -> None:
    on = _gpt3("none", fp8_act_cast_fused=True, **change)
    off = _gpt3("none", **change)
    assert not on._fp8_act_fused
    assert _mlp_bytes(on) == _mlp_bytes(off)


def test_a_gated_or_moe_mlp_is_not_a_layernorm_mlp_gelu() -> None:
    model = replace(PRESETS["llama3-8b"], num_layers=8)
    c = TransformerCosts(model, 1, 1, 2, split_layers(8, 2), precision="fp8",
                         fp8_act_cast_fused=True)
    assert not c._fp8_act_fused
    assert _mlp_bytes(c) == _mlp_bytes(replace(c, fp8_act_cast_fused=False))


def test_the_mlperf_gpt3_rows_run_nemo1_on_te_transformer_layers() -> None:
    """The v3.0 and v3.1 submissions' NeMo has no Megatron-core model: NeMo 1's own GPT
    model on TE's TransformerLayer (profile nemo1-te-layer, nemo-launcher's otherwise)."""
    p, base = FRAMEWORKS["nemo1-te-layer"], FRAMEWORKS["nemo-launcher"]
    assert p.fp8_act_cast_fused and not base.fp8_act_cast_fused
    differ = [f for f in p.__dataclass_fields__
              if f not in ("name", "summary", "sources", "under_fp16")
              and getattr(p, f) != getattr(base, f)]
    # v3.1's async amax reduction; TE's FlashAttention QKV repack (below); both configs'
    # dropout 0 (tests/test_frameworks.py)
    assert differ == ["attention_copy_bytes", "dropout", "fp8_act_cast_fused",
                      "fp8_amax_reduction"]
    assert "09ba842" in p.source("fp8_act_cast_fused")
    for name in ("mlperf_training_v30_gpt3.csv", "mlperf_training_v31_gpt3.csv"):
        rows = load_source(CORPUS_DIR / name).rows
        assert rows and all(r.experiment()["training"]["framework"] == "nemo1-te-layer"
                            for r in rows)


def test_te_flash_attention_repacks_the_interleaved_qkv_24_bytes_a_token_and_head_dim() -> None:
    """TE 0.8 / 09ba842's _PrepareQKVForFA: fa_prepare_fwd reads the interleaved QKV and
    writes q, k, v contiguous (4 bytes an element of q, k, v), fa_prepare_bwd the reverse
    (4): 24 bytes a token and head dimension of the TP rank's heads a layer and micro-batch,
    forward and backward together; the MLP block and every other profile unchanged."""
    p = FRAMEWORKS["nemo1-te-layer"]
    assert p.attention_copy_bytes == 2.0
    assert FRAMEWORKS["nemo-launcher"].attention_copy_bytes == 0.0
    assert "_PrepareQKVForFA" in p.source("attention_copy_bytes")
    base = _gpt3("step", attention="flash2")
    with_copy = replace(base, attention_copy_bytes=p.attention_copy_bytes)
    h, t, n = 12288, 4, 2048
    added = [w - b for w, b in zip(_attn_bytes(with_copy), _attn_bytes(base), strict=True)]
    assert sum(added) == pytest.approx(24 * n * h / t)
    assert _mlp_bytes(with_copy) == _mlp_bytes(base)


def _attn_bytes(c: TransformerCosts) -> tuple[float, float]:
    """The attention block's memory-bound bytes of one layer, (forward, backward)."""
    return c._elementwise_forward()[0], c._elementwise_backward()[0]
