"""torchtitan's torch.compile as the ``fsdp-compile`` framework profile: exactly the
memory-bound terms Inductor's fusions change (SwiGLU, the residual add fused into the next
norm, torchao's Float8 casts) and what its partitioner keeps for the backward."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import frameworks_toml_variants

from base.errors import ConfigError
from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import Experiment, build_experiment
from workloads.costs import split_layers
from workloads.frameworks import FRAMEWORKS, apply_framework, framework, load_profiles
from workloads.models import PRESETS
from workloads.transformer import TransformerCosts

COMPILED = ("swiglu_bytes", "swiglu_stash_bytes", "swiglu_saves_product",
            "residual_norm_fused", "fp8_casts_compiled", "torch_compile", "tp_overlap")
"""The fields ``[fsdp-compile]`` changes from ``[fsdp]`` (``tp_overlap``: async TP needs
torch.compile, tests/test_async_tp.py)."""


def _costs(tp: int = 1, **kw) -> TransformerCosts:
    model = replace(PRESETS["llama3-8b"], num_layers=8, seq_length=2048)
    return TransformerCosts(model, 1, tp, 2, split_layers(8, 1), **kw)


def _pair(tp: int = 1, **kw) -> tuple[TransformerCosts, TransformerCosts]:
    """(eager, compiled) torchtitan cost models of the same layout."""
    base = _costs(tp, **kw)
    return (apply_framework(base, FRAMEWORKS["fsdp"], 1),
            apply_framework(base, FRAMEWORKS["fsdp-compile"], 1))


def test_fsdp_compile_is_fsdp_but_for_the_fused_terms() -> None:
    eager, compiled = FRAMEWORKS["fsdp"], FRAMEWORKS["fsdp-compile"]
    changed = [f for f in eager.__dataclass_fields__ if f not in ("name", "summary", "sources")
               and getattr(eager, f) != getattr(compiled, f)]
    assert sorted(changed) == sorted(COMPILED)
    assert (compiled.swiglu_bytes, compiled.swiglu_stash_bytes) == (6.0, 4.0)
    assert compiled.rope_bytes == eager.rope_bytes == 20.0  # Inductor's complex fallback
    assert compiled.fp8_cast_bytes == eager.fp8_cast_bytes == 5.0
    assert "eab345c" in compiled.source("fp8_casts_compiled")
    assert "roofline" in compiled.source("fp8_cast_bytes")
    assert "complex" in compiled.source("rope_bytes")
    assert framework("fsdp") is eager and not eager.torch_compile


@pytest.mark.parametrize("tp", [1, 2])
def test_compile_fuses_swiglu_and_the_residual_into_the_next_norm(tp: int) -> None:
    """bf16: the forward saves 4 bytes an ffn element (silu·mul one kernel, 10 -> 6) and one
    read of the attention block's sum (2 bytes a token's h, split by t under SP); the
    attention block is unchanged; the backward is twice the forward as before."""
    eager, compiled = _pair(tp, sequence_parallel=tp > 1)
    m, n = eager.model, eager._tokens
    (ea, em), (ca, cm) = eager._elementwise_forward(), compiled._elementwise_forward()
    assert ca == ea
    assert em - cm == pytest.approx(4 * n * m.ffn_hidden_size / tp + 2 * n * m.hidden_size / tp)
    assert compiled._elementwise_backward() == pytest.approx((2 * ca, 2 * cm))


def test_compiled_fp8_casts_cast_each_input_once_and_only_output_gradients_backward() -> None:
    """torchao's roofline under compile: forward as eager (5 bytes an element of each GEMM's
    input), backward 5 bytes an element of each GEMM's output gradient instead of twice the
    forward's casts; nothing changes without FP8."""
    eager, compiled = _pair(precision="fp8", fp8_speedup=2.0)
    m, n, c = eager.model, eager._tokens, 5.0
    h, f, q, kv = m.hidden_size, m.ffn_hidden_size, m.q_dim, m.kv_dim
    assert compiled._fp8_cast_pair()[0] == eager._fp8_cast_pair()[0] == pytest.approx(
        (c * n * (h + m.attn_out_dim), c * n * (h + f)))
    assert compiled._fp8_cast_pair()[1] == pytest.approx(
        (c * n * (q + 2 * kv + h), c * n * (2 * f + h)))
    assert eager._fp8_cast_pair()[1] == pytest.approx(
        tuple(2 * x for x in eager._fp8_cast_pair()[0]))
    plain = replace(compiled, fp8_cast_bytes=0.0)
    back = plain._elementwise_backward()
    got = compiled._elementwise_backward()
    assert got[0] - back[0] == pytest.approx(compiled._fp8_cast_pair()[1][0])
    assert got[1] - back[1] == pytest.approx(compiled._fp8_cast_pair()[1][1])
    bf16 = _pair()[1]
    assert bf16._fp8_cast_pair() == ((0.0, 0.0), (0.0, 0.0))


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_compiled_swiglu_keeps_gate_and_up_only(precision: str) -> None:
    """Without recomputation the MLP keeps 8 bytes an ffn element eager (gate, silu(gate),
    up, product; the product in fp8 under FP8: 7) and 4 compiled (gate and up, the product
    recomputed), under either precision."""
    speed = 2.0 if precision == "fp8" else 1.0
    eager, compiled = _pair(precision=precision, fp8_speedup=speed)
    m = eager.model
    per_ffn = (eager.layer_activation_bytes() - compiled.layer_activation_bytes()) / (
        eager._tokens * m.ffn_hidden_size)
    assert per_ffn == pytest.approx(4.0 if precision == "bf16" else 3.0)


def _run(framework_name: str, **training) -> dict:
    return {"name": "c", "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 4},
            "cluster": {"preset": "grand-teton-h100", "num_gpus": 8},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 3},
            "training": {"micro_batch_size": 1, "global_batch_size": 8,
                         "framework": framework_name, **training}}


def test_the_compiled_framework_reaches_the_experiment() -> None:
    exp = Experiment.from_dict(_run("fsdp-compile", precision="fp8"))
    assert exp.framework.name == "fsdp-compile"
    assert exp.costs.fp8_casts_compiled and exp.costs.residual_norm_fused
    assert not exp.costs.swiglu_saves_product and exp.costs.swiglu_bytes == 6.0
    eager = Experiment.from_dict(_run("fsdp", precision="fp8")).costs
    assert not (eager.fp8_casts_compiled or eager.residual_norm_fused)


def test_an_unfused_norm_under_torch_compile_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"fused_norm=false.*'fsdp-compile'"):
        build_experiment(_run("fsdp-compile", fused_norm=False))
    build_experiment(_run("fsdp", fused_norm=False))  # eager torchtitan: fine


@pytest.mark.parametrize("field,value,shown", [("fp8_casts_compiled", "1", "1"),
                                               ("swiglu_saves_product", '"no"', "'no'"),
                                               ("residual_norm_fused", "0.5", "0.5"),
                                               ("torch_compile", '"yes"', "'yes'")])
def test_a_bad_compile_flag_is_refused_naming_the_profile_and_the_field(
        field: str, value: str, shown: str) -> None:
    bad, no_source = frameworks_toml_variants("fsdp-compile", field, value)
    with pytest.raises(ValueError, match=rf"\[fsdp-compile\].*{field}={shown}.*true or false"):
        load_profiles(bad)
    with pytest.raises(ValueError, match=f"no {field}_source"):
        load_profiles(no_source)


def test_torchtitans_compiled_rows_run_the_compiled_profile() -> None:
    """The benchmark's torch.compile rows (every one but the two eager FSDP rows) name
    fsdp-compile, and each says so in its assumptions."""
    source = load_source(CORPUS_DIR / "torchtitan_llama31.csv")
    for row in source.rows:
        compiled = row.get("framework") == "fsdp-compile"
        assert compiled == (row.run not in ("llama3.1-8b-8gpu-fsdp", "llama3.1-8b-128gpu-fsdp"))
        assert ("fsdp-compile" in row.get("assumed")) == compiled
        assert "torch.compile and async TP fusion not modelled" not in row.get("assumed")
