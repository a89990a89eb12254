"""Hugging Face config.json import (stdlib only) against the presets it should equal."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.errors import ConfigError
from sim.experiment import build_experiment
from workloads.hf_config import load_hf_config
from workloads.models import PRESETS

FIX = Path(__file__).parent / "fixtures" / "hf"


def test_llama_config_equals_the_preset() -> None:
    spec = load_hf_config(FIX / "llama2-7b.json")
    assert spec.with_overrides(name="llama2-7b") == PRESETS["llama2-7b"]


def test_gpt2_config_is_gpt_style() -> None:
    spec = load_hf_config(FIX / "gpt2-xl.json")
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (48, 1600, 6400)
    assert spec.ffn_type == "gelu" and spec.norm == "layernorm" and spec.tied_embeddings
    assert spec.num_params() / 1e9 == pytest.approx(1.56, rel=0.01)  # GPT-2 XL: 1.5B


def test_mixtral_config_equals_the_preset() -> None:
    """num_local_experts experts of intermediate_size, num_experts_per_tok per token."""
    spec = load_hf_config(FIX / "mixtral-8x7b.json")
    assert spec.with_overrides(name="mixtral-8x7b") == PRESETS["mixtral-8x7b"]
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.top_k) == (8, 2)


def test_mixture_of_experts_of_other_families_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, '
                    '"vocab_size": 10, "n_positions": 8, "num_experts": 4}')
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        load_hf_config(path)


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
                                              ('{"model_type": "t5"}', "not supported"),
                                              ('{"model_type": "llama"}', "none of the keys")])
def test_bad_configs(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_hf_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_hf_config(tmp_path / "missing.json")
