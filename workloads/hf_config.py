"""Import a Hugging Face ``config.json`` as a ModelSpec. Pure, standard library only.

Reads the keys the ``transformers`` configuration classes define for the
LLaMA family (``llama``, ``mistral``, ``qwen2``: SwiGLU, RMSNorm, RoPE, GQA;
``mixtral``: its MLPs are ``num_local_experts`` experts of ``intermediate_size``,
``num_experts_per_tok`` per token) and
GPT-2 style models (``gpt2``, ``gpt_neox``, ``opt``-like: GeLU, LayerNorm).
No network access and no ``transformers`` dependency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from workloads.models import ModelSpec, MoESpec

LLAMA_LIKE = ("llama", "mistral", "qwen2", "gemma", "mixtral")
GPT_LIKE = ("gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt")


def _get(cfg: dict, path: str, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    if default is not None:
        return default
    raise ConfigError(f"model.hf_config: {path!r} has none of the keys {', '.join(keys)}")


def load_hf_config(path: str | Path) -> ModelSpec:
    """The model spec of a Hugging Face config file; ConfigError names what is missing."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"model.hf_config: file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model.hf_config: {str(p)!r} is not a JSON config: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model.hf_config: {str(p)!r} is not a JSON object")
    kind = str(cfg.get("model_type", "")).lower()
    where = str(p)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts and kind not in LLAMA_LIKE:
        raise ConfigError(f"model.hf_config: {where!r} is a mixture-of-experts model of "
                          f"model_type {kind!r}; only LLaMA-like MoE configs (mixtral) are read")
    if kind in GPT_LIKE:
        h = _get(cfg, where, "n_embd", "hidden_size")
        return ModelSpec(
            name=cfg.get("_name_or_path") or p.parent.name or kind,
            num_layers=_get(cfg, where, "n_layer", "num_hidden_layers"),
            hidden_size=h,
            num_attention_heads=_get(cfg, where, "n_head", "num_attention_heads"),
            num_kv_heads=_get(cfg, where, "n_head", "num_attention_heads"),
            ffn_hidden_size=_get(cfg, where, "n_inner", "intermediate_size", default=4 * h),
            vocab_size=_get(cfg, where, "vocab_size"),
            seq_length=_get(cfg, where, "n_positions", "max_position_embeddings"),
            ffn_type="gelu", norm="layernorm",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            position_embedding="rope" if kind in ("gpt_neox", "gptj") else "learned",
        )
    if kind in LLAMA_LIKE or "intermediate_size" in cfg:
        heads = _get(cfg, where, "num_attention_heads")
        act = str(cfg.get("hidden_act", "silu")).lower()
        moe = None
        if experts:
            moe = MoESpec(num_experts=int(experts),
                          top_k=int(_get(cfg, where, "num_experts_per_tok",
                                         "num_experts_per_token")),
                          expert_ffn_hidden_size=_get(cfg, where, "intermediate_size"))
        return ModelSpec(
            moe=moe,
            name=cfg.get("_name_or_path") or p.parent.name or kind or "hf-model",
            num_layers=_get(cfg, where, "num_hidden_layers"),
            hidden_size=_get(cfg, where, "hidden_size"),
            num_attention_heads=heads,
            num_kv_heads=_get(cfg, where, "num_key_value_heads", default=heads),
            ffn_hidden_size=_get(cfg, where, "intermediate_size"),
            vocab_size=_get(cfg, where, "vocab_size"),
            seq_length=_get(cfg, where, "max_position_embeddings"),
            ffn_type="swiglu" if act in ("silu", "swish", "swiglu") else "gelu",
            norm="rmsnorm",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            position_embedding="rope",
        )
    raise ConfigError(f"model.hf_config: model_type {kind!r} of {where!r} is not supported; "
                      f"known: {', '.join(LLAMA_LIKE + GPT_LIKE)}")
