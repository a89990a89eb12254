"""Hugging Face config.json import (stdlib only): presets it should equal, published parameter
counts (tests/fixtures/hf/README.md names each config's source), refusals."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from base.errors import ConfigError
from sim.api import load_experiment, simulate
from sim.cli.run import summary_table
from sim.experiment import build_experiment
from sim.search import Evaluator, Screener, SearchContext
from sim.search.space import enumerate_layouts
from workloads.costs import ComputeSeg
from workloads.hf_config import SUPPORTED, load_hf_config
from workloads.models import PRESETS
from workloads.schedules import BACKWARD, FORWARD, Op
from workloads.transformer import TransformerCosts

FIX = Path(__file__).parent / "fixtures" / "hf"


def test_llama_config_equals_the_preset() -> None:
    spec = load_hf_config(FIX / "llama2-7b.json", 4096)
    assert spec.with_overrides(name="llama2-7b") == PRESETS["llama2-7b"]


def test_gpt2_config_is_gpt_style() -> None:
    spec = load_hf_config(FIX / "gpt2-xl.json", 1024)
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (48, 1600, 6400)
    assert spec.ffn_type == "gelu" and spec.norm == "layernorm" and spec.tied_embeddings
    assert spec.num_params() / 1e9 == pytest.approx(1.56, rel=0.01)  # GPT-2 XL: 1.5B


def test_mixtral_config_equals_the_preset() -> None:
    """num_local_experts experts of intermediate_size, num_experts_per_tok per token."""
    spec = load_hf_config(FIX / "mixtral-8x7b.json", 32768)
    assert spec.with_overrides(name="mixtral-8x7b") == PRESETS["mixtral-8x7b"]
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.top_k) == (8, 2)


def test_mixture_of_experts_of_other_families_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, '
                    '"vocab_size": 10, "n_positions": 8, "num_experts": 4}')
    with pytest.raises(ConfigError, match="num_experts=4: a mixture-of-experts"):
        load_hf_config(path, 8)


def test_mixtral_experiment_with_expert_parallelism() -> None:
    exp = build_experiment({
        "model": {"hf_config": str(FIX / "mixtral-8x7b.json"), "seq_length": 4096},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 64},
        "parallel": {"tp": 2, "pp": 4, "ep": 8},
        "training": {"global_batch_size": 64},
    })
    assert exp.costs.ep == 8 and exp.costs.stage_expert_params(0) > 0


def test_experiment_with_hf_config_and_override(tmp_path: Path) -> None:
    exp = build_experiment({
        "model": {"hf_config": str(FIX / "llama2-7b.json"), "seq_length": 2048},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
        "parallel": {"tp": 8},
        "training": {"global_batch_size": 8},
    })
    assert exp.model.seq_length == 2048 and exp.model.num_layers == 32


@pytest.mark.parametrize(("text", "needle"), [("{", "not a JSON config"),
                                              ('{"model_type": "t5"}', "'t5' is not supported"),
                                              ('{"model_type": "llama"}', "missing")])
def test_bad_configs(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_hf_config(path, 2048)
    with pytest.raises(ConfigError, match="does not exist"):
        load_hf_config(tmp_path / "missing.json", 2048)


@pytest.mark.parametrize(("fixture", "seq", "total", "active"), [
    ("gemma2-9b", 4096, 9.24, None),      # Gemma Team 2024 (Gemma 2), table 1 / model card
    ("gemma-7b", 8192, 8.54, None),       # Gemma Team 2024 (Gemma), table 1: 7.75B + 0.79B
    ("qwen2-7b", 4096, 7.6, None),        # Qwen2 model card: 7.6B (7.07B non-embedding)
    ("phi3-mini-4k", 2048, 3.8, None),    # Abdin et al. 2024: 3.8B
    ("mistral-7b", 4096, 7.24, None),     # Hugging Face's count of the checkpoint
    ("mixtral-8x7b", 4096, 46.7, 12.9),   # Jiang et al. 2024
    ("gpt2-xl", 1024, 1.56, None),        # Radford et al. 2019: 1.5B
])
def test_published_parameter_counts(fixture: str, seq: int, total: float,
                                    active: float | None) -> None:
    spec = load_hf_config(FIX / f"{fixture}.json", seq)
    assert spec.num_params() / 1e9 == pytest.approx(total, rel=0.03)
    assert spec.active_params() / 1e9 == pytest.approx(active or total, rel=0.03)


def test_deepseek_v3_counts() -> None:
    """671B total and 37B active for the main model (DeepSeek-AI 2024, table 1 and README);
    the MTP module is one more MoE block, 11.5B unique parameters of which about 0.6B
    active (README_WEIGHTS.md: 1.5B activated including the 0.9B shared head)."""
    spec = load_hf_config(FIX / "deepseek-v3.json", 4096)
    assert spec.num_layers == 61 + 1 and spec.first_dense_layers == 3
    mtp = spec.layer_spec(61)
    main_total = spec.num_params() - mtp.layer_params()
    assert main_total / 1e9 == pytest.approx(671, rel=0.01)
    assert mtp.layer_params() / 1e9 == pytest.approx(11.5, rel=0.01)
    moe = mtp.moe
    assert moe is not None and (moe.num_experts, moe.top_k, moe.shared_experts) == (256, 8, 1)
    mtp_active = mtp.layer_params() - (moe.num_experts - moe.top_k) * mtp.expert_params()
    assert (spec.active_params() - mtp_active) / 1e9 == pytest.approx(37, rel=0.03)
    assert mtp_active / 1e9 == pytest.approx(0.6, rel=0.03)
    dense = spec.layer_spec(0)
    assert dense.moe is None and dense.layer_params() < mtp.layer_params() / 10
    with pytest.raises(ValueError, match="layers differ"):
        spec.layer_params()


def test_gemma2_is_a_gated_gelu_with_explicit_heads_and_tied_embeddings() -> None:
    spec = load_hf_config(FIX / "gemma2-9b.json", 4096)
    assert spec.ffn_type == "geglu" and spec.mlp_matrices == 3 and spec.tied_embeddings
    assert (spec.head_dim, spec.q_dim, spec.hidden_size) == (256, 4096, 3584)


def _costs(spec, **kw) -> TransformerCosts:
    return TransformerCosts(spec, micro_batch_size=1, tp=1, dp=1, stage_layers=(spec.num_layers,),
                            **kw)


@pytest.mark.parametrize(("fixture", "seq"), [("gemma2-9b", 4096), ("qwen2-7b", 4096),
                                               ("deepseek-v3", 4096)])
def test_cost_model_flops_follow_the_parameters(fixture: str, seq: int) -> None:
    """Forward GEMM FLOPs of a step are 2 per active weight and token (the head included,
    embedding lookup and norms not), within the biases and norms: explicit head size, GeGLU,
    MLA's projections, shared experts and dense first layers all reach the cost model; each
    multi-token prediction module passes the head once more, after its 2h x h projection."""
    spec = load_hf_config(FIX / f"{fixture}.json", seq)
    fwd = _costs(spec).op_segments(Op(0, FORWARD, 0), split_backward=False)
    gemm = sum(seg.flops for seg in fwd)
    v, h = spec.vocab_size, spec.hidden_size
    weights = spec.active_params() - v * h + v * h * spec.tied_embeddings \
        + spec.mtp_layers * (v * h + 2 * h * h)
    assert gemm / (2 * seq) == pytest.approx(weights, rel=2e-3)
    core = sum(seg.attn_flops for seg in fwd)
    assert core == pytest.approx(spec.num_layers * 4 * seq ** 2 * spec.core_width / 2)


def test_dense_first_layers_are_costed_as_dense() -> None:
    """DeepSeek-V3 on pipeline stages: a stage of its first (dense) layers holds far fewer
    parameters, keeps dense-MLP activations and sends no all-to-all."""
    spec = load_hf_config(FIX / "deepseek-v3.json", 4096)
    costs = TransformerCosts(spec, micro_batch_size=1, tp=1, dp=8, ep=8,
                             stage_layers=(3, 3, 28, 28))
    dense, moe = spec.layer_spec(0), spec.layer_spec(3)
    assert costs.stage_params(0) == pytest.approx(3 * dense.layer_params()
                                                  + spec.embedding_params())
    experts = moe.layer_expert_params()
    assert costs.stage_params(1) == pytest.approx(3 * (moe.layer_params() - experts * 7 / 8))
    assert costs.stage_dense_layers(0) == 3 and costs.stage_dense_layers(1) == 0
    kinds = [[getattr(seg, "kind", None) for seg in costs.op_segments(Op(s, FORWARD, 0), False)]
             for s in (0, 1)]
    assert "ep" not in kinds[0] and "ep" in kinds[1]
    uniform = replace(costs, model=moe)
    assert costs.activation_bytes_per_mb(1) == uniform.activation_bytes_per_mb(1)
    assert costs.activation_bytes_per_mb(0) == pytest.approx(
        3 * replace(costs, model=dense).layer_activation_bytes())
    for stage in range(4):  # the backward costs every layer too
        assert costs.op_segments(Op(stage, BACKWARD, 0), False)


@pytest.mark.parametrize(("key", "value"), [("num_hidden_layers", "32"),
                                            ("num_hidden_layers", 0),
                                            ("num_attention_heads", 32.0),
                                            ("num_key_value_heads", True),
                                            ("hidden_size", -4096)])
def test_counts_must_be_positive_integers(tmp_path: Path, key: str, value: object) -> None:
    cfg = json.loads((FIX / "llama2-7b.json").read_text())
    cfg[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=f"{key}={value!r} is not a positive integer"):
        load_hf_config(path, 2048)


def test_unknown_model_type_names_it_and_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "falcon", "hidden_size": 4544, "intermediate_size": 1}')
    with pytest.raises(ConfigError) as err:
        load_hf_config(path, 2048)
    assert "'falcon'" in str(err.value) and all(k in str(err.value) for k in SUPPORTED)


def test_sequence_length_is_never_taken_from_the_config() -> None:
    with pytest.raises(ConfigError, match="model.seq_length: required.*131072"):
        build_experiment({"model": {"hf_config": str(FIX / "qwen2-7b.json")},
                          "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
                          "training": {"global_batch_size": 8}})


def test_sliding_window_beyond_full_attention_is_refused() -> None:
    load_hf_config(FIX / "mistral-7b.json", 4097)  # window 4096: i attends to i-4096 .. i
    with pytest.raises(ConfigError, match="sliding_window=4096.*at most 4097"):
        load_hf_config(FIX / "mistral-7b.json", 8192)


def test_deepseek_v3_simulates_with_expert_parallelism() -> None:
    exp = build_experiment({
        "model": {"hf_config": str(FIX / "deepseek-v3.json"), "seq_length": 4096},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "parallel": {"tp": 1, "pp": 8, "ep": 8, "zero_stage": 1},
        "training": {"global_batch_size": 64},
    })
    assert exp.costs.stage_dense_layers(0) == 3
    assert exp.model_flops_per_step == pytest.approx(
        64 * 4096 * (6 * exp.model.active_params() + 12 * 62 * 128 * 160 * 4096))


TINY_DEEPSEEK = {
    "model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 4096,
    "moe_intermediate_size": 128, "num_hidden_layers": 3, "first_k_dense_replace": 2,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 1000,
    "num_nextn_predict_layers": 1, "hidden_act": "silu", "max_position_embeddings": 4096,
}
"""A DeepSeek-V3-shaped model small enough to simulate and search in a test: four layers
(the MTP block last), the first two dense and far costlier than the MoE ones, so that on
four stages two stages of one layer each differ only by their kind."""


def _tiny(tmp_path: Path) -> dict:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_DEEPSEEK))
    return {"name": "tiny", "model": {"hf_config": str(path), "seq_length": 512},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
            "training": {"global_batch_size": 16}}


@pytest.mark.parametrize("parallel", [
    {"pp": 2, "ep": 2, "zero_stage": 3},
    {"pp": 4, "ep": 2, "overlap_grad_reduce": True},
    {"pp": 2, "vpp": 2, "tp": 2, "ep": 2, "sequence_parallel": True},
])
def test_dense_first_layers_fast_paths_and_fidelities_agree(tmp_path: Path,
                                                            parallel: dict) -> None:
    """With dense first layers the fast path equals the reference, and collapsed fidelity
    (one GPU per pipeline rank) gives full fidelity's memory per stage, and its step time up
    to the contention between collectives that only the flow simulation sees (bounded in
    tests/test_fidelity.py); stages differ, so a per-stage mistake would show. The stats
    state the parameter counts."""
    data = {**_tiny(tmp_path), "parallel": parallel,
            "schedule": "interleaved" if parallel.get("vpp") else "1f1b"}
    exp = build_experiment(data)
    full = simulate(exp, fidelity="full").stats
    ref = simulate(exp, fidelity="full", reference=True).stats
    collapsed = simulate(exp, fidelity="collapsed").stats
    assert full["step_time_s"] == pytest.approx(ref["step_time_s"], rel=1e-9)
    assert collapsed["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-2)
    for other in (ref, collapsed):
        assert other["peak_memory_per_stage_gib"] == pytest.approx(
            full["peak_memory_per_stage_gib"], rel=1e-9)
    assert full["num_params"] == exp.model.num_params() > full["num_active_params"]


def test_search_bounds_hold_with_dense_first_layers(tmp_path: Path) -> None:
    """The search's memory and step-time bounds stay below the simulation on every layout of
    a model whose stages differ by their dense layers (its op caches are keyed by them)."""
    data = _tiny(tmp_path)
    ctx = SearchContext.build(data)
    pins = {"micro_batch_size": (1,), "recompute": ("none",), "zero_stage": (1, 3),
            "schedule": ("1f1b",), "cp": (1,), "sequence_parallel": (False,)}
    layouts = list(enumerate_layouts(ctx, pins))
    assert any(lay.pp > 1 and lay.ep > 1 for lay in layouts)
    screener = Screener(ctx, comm=True, collapsed_only=True)
    evaluate = Evaluator(ctx.data, ctx.global_batch_size, "collapsed", screener.profile)
    for layout in layouts:
        ev = evaluate(layout)
        if ev.status == "invalid":
            continue
        screened = screener.screen(layout)
        judged = screener.judge(screened, threshold=1e-300)
        assert screened.memory_bound_gib <= ev.stats["peak_memory_gib"] * (1 + 1e-9)
        assert judged.memory_bound_gib <= ev.stats["peak_memory_gib"] * (1 + 1e-9)
        step_bound = ctx.global_batch_size * ctx.model.seq_length / judged.tokens_bound
        assert step_bound <= ev.stats["step_time_s"] * (1 + 1e-9), layout.key


def test_an_activation_that_is_not_gated_is_refused(tmp_path: Path) -> None:
    cfg = json.loads((FIX / "llama2-7b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "hidden_act": "relu"}))
    with pytest.raises(ConfigError, match="hidden_act='relu' is not a supported gated"):
        load_hf_config(path, 2048)


def test_summary_states_total_and_active_parameters(tmp_path: Path) -> None:
    exp = build_experiment({**_tiny(tmp_path), "parallel": {"ep": 2}})
    stats = simulate(exp, fidelity="collapsed").stats
    line = next(r for r in summary_table(stats).splitlines() if r.startswith("parameters"))
    assert line.split()[1:] == [f"{exp.model.num_params() / 1e9:.2f}", "B,",
                                f"{exp.model.active_params() / 1e9:.2f}", "B", "active",
                                "per", "token"]


def test_multi_token_prediction_runs_on_the_last_stage() -> None:
    """DeepSeek-V3's MTP module (its last block): the last pipeline stage runs the output head
    and the loss once more, and its 2h x h input projection, in FP8 with the layers; it keeps
    the second loss's logits and a copy of the input embedding (Megatron-core builds one on
    the MTP stage). No other stage changes."""
    spec = load_hf_config(FIX / "deepseek-v3.json", 4096)
    assert spec.mtp_layers == 1
    costs = TransformerCosts(spec, micro_batch_size=1, tp=2, dp=8, ep=8,
                             stage_layers=(31, 31), precision="fp8", fp8_speedup=2.0)
    plain = replace(costs, model=replace(spec, mtp_layers=0))
    v, h, n = spec.vocab_size, spec.hidden_size, 4096

    def work(c: TransformerCosts, stage: int, kind: str) -> tuple[float, float]:
        segs = [s for s in c.op_segments(Op(stage, kind, 0), False) if isinstance(s, ComputeSeg)]
        return sum(s.flops for s in segs), sum(s.elementwise_bytes for s in segs)

    head = 2 * n * h * v / 2  # bf16, vocabulary-parallel over t = 2
    proj = 2 * n * 2 * h * h / 2 / 2.0  # FP8 at twice the rate
    assert work(costs, 1, FORWARD)[0] - work(plain, 1, FORWARD)[0] == pytest.approx(head + proj)
    assert work(costs, 1, BACKWARD)[0] - work(plain, 1, BACKWARD)[0] == pytest.approx(
        2 * (head + proj))
    assert work(costs, 1, FORWARD)[1] > work(plain, 1, FORWARD)[1]  # its loss and norms
    for kind in (FORWARD, BACKWARD):
        assert work(costs, 0, kind) == work(plain, 0, kind)
    assert costs.stage_params(1) - plain.stage_params(1) == pytest.approx(v * h / 2)
    assert costs.stage_params(0) == plain.stage_params(0)
    assert costs.activation_bytes_per_mb(1) - plain.activation_bytes_per_mb(1) == \
        pytest.approx((2 + 4) * n * v / 2)
    one_stage = replace(costs, stage_layers=(62,))  # the embedding itself, no copy
    assert one_stage.stage_params(0) == replace(plain, stage_layers=(62,)).stage_params(0)


def test_overrides_keep_the_import_honest(tmp_path: Path) -> None:
    """model.moe over an import keeps its shared experts; cutting the layers below the dense
    ones is refused."""
    data = _tiny(tmp_path)
    data["model"]["moe"] = {"num_experts": 8, "top_k": 2, "capacity_factor": 1.25}
    moe = build_experiment(data).model.moe
    assert moe is not None and moe.shared_experts == 1 and moe.capacity_factor == 1.25
    data["model"]["num_layers"] = 2
    with pytest.raises(ConfigError, match="model.num_layers=2: the model's first 2 layers"):
        build_experiment(data)
    (tmp_path / "config.json").write_text(json.dumps({**TINY_DEEPSEEK,
                                                      "first_k_dense_replace": 0}))
    data["model"]["num_layers"] = 1
    with pytest.raises(ConfigError, match="model.num_layers=1: the model's last 1 layers are "
                                          "multi-token prediction modules"):
        build_experiment(data)


def test_the_documented_example_loads_from_the_repository_root(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """docs/experiment.md "Hugging Face configs": its YAML block, written anywhere, loads with
    the path taken from the current directory (the repository root), and a path that exists
    only beside the experiment file is taken from there."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "experiment.md").read_text(encoding="utf-8")
    section = text[text.index("## Hugging Face configs"):text.index("## Custom schedule files")]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    (tmp_path / "exp.yaml").write_text(block.group(1), encoding="utf-8")
    monkeypatch.chdir(root)
    exp = load_experiment(tmp_path / "exp.yaml")
    assert exp.model.num_layers == 32 and exp.model.seq_length == 4096
    data = yaml.safe_load(block.group(1))
    data["model"]["hf_config"] = "cfg.json"  # beside the experiment file only
    (tmp_path / "cfg.json").write_text((FIX / "llama2-7b.json").read_text(), encoding="utf-8")
    (tmp_path / "exp2.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_experiment(tmp_path / "exp2.yaml").model.num_layers == 32
