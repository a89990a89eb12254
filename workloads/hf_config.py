"""Import a Hugging Face ``config.json`` as a ModelSpec. Pure, standard library only.

One reader per ``model_type``, each reading the keys (and the defaults) of its
``transformers`` configuration class; any other ``model_type`` is refused, never read
as a LLaMA. No network access and no ``transformers`` dependency.

- ``llama``, ``mistral``, ``phi3``: SwiGLU, RMSNorm, RoPE, GQA, untied head (Phi-3's fused
  ``qkv_proj`` and ``gate_up_proj`` hold the same weights); ``attention_bias`` adds Q, K, V
  biases (the output projection's h-element bias is not counted).
- ``qwen2``: the same with Q, K and V biases (Qwen2's attention always has them).
- ``mixtral``: ``num_local_experts`` experts of ``intermediate_size``, ``num_experts_per_tok``
  per token.
- ``gemma``, ``gemma2``: GeGLU (a gated MLP, three matrices), explicit ``head_dim``, tied
  embeddings by default. Gemma-2's two extra norms per layer (2·h parameters, 0.003% of
  Gemma-2-9B) are not counted.
- ``deepseek_v3``: multi-head latent attention, ``n_routed_experts`` experts of
  ``moe_intermediate_size`` (``num_experts_per_tok`` per token) and ``n_shared_experts``
  shared ones in every layer past the first ``first_k_dense_replace`` dense layers. The
  multi-token prediction modules (``num_nextn_predict_layers`` = D) are D more MoE
  transformer blocks after the last layer (``ModelSpec.mtp_layers``), whose 2h x h input
  projections, norms and passes through the shared output head and loss the last pipeline
  stage runs beside the main head (2·h·V FLOPs a token each, about 2.5% of DeepSeek-V3's
  model FLOPs, all on that stage).
- ``gpt2``: GeLU, LayerNorm with biases, learned positions (``n_positions`` rows), tied
  head; ``gpt_neox``: the same with rotary positions, an untied head and parallel attention
  and MLP blocks unless ``use_parallel_residual`` is false (transformers' GPTNeoXConfig
  default: true).

Sliding-window attention (Mistral, Phi-3, Gemma-2, Qwen2 with ``use_sliding_window``) is
not simulated: a window of W lets position i attend to positions i − W .. i (Jiang et al.
2023, sec. 2), which is full causal attention for sequences of at most W + 1 tokens, so
longer sequences are refused. The sequence length is never taken from the config:
``max_position_embeddings`` is the longest context a model supports, not the length it is
trained on, so the experiment must give ``model.seq_length``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from workloads.models import MLASpec, ModelSpec, MoESpec
from workloads.moe_dispatch import check_router_groups

_GATED = {"silu": "swiglu", "swish": "swiglu", "swiglu": "swiglu", "gelu": "geglu",
          "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu", "gelu_fast": "geglu"}
"""A gated MLP's activation (``hidden_act``) and the ModelSpec ``ffn_type`` it makes."""


class _Config:
    """The JSON object of one config file and how to name its keys in errors."""

    def __init__(self, cfg: dict, where: str) -> None:
        self.cfg, self.where = cfg, where

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"model.hf_config: {self.where!r}: {message}")

    def _value(self, key: str, default: Any) -> Any:
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                raise self.error(f"required key {key!r} is missing")
            return default
        return value

    def count(self, key: str, default: int | None = None) -> int:
        """A positive integer (a layer, head or width count); ``default`` when absent."""
        value = self._value(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(f"{key}={value!r} is not a positive integer")
        return value

    def optional_count(self, key: str) -> int | None:
        """A positive integer, or None when the key is absent or null."""
        return None if self.cfg.get(key) is None else self.count(key)

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"{key}={value!r} is not true or false")
        return value

    def gated(self, default: str, *keys: str) -> str:
        """The gated MLP type of the first activation key present (``default``, the
        configuration class's, when none is)."""
        for key in keys:
            act = self.cfg.get(key)
            if act is not None:
                if str(act).lower() not in _GATED:
                    raise self.error(f"{key}={act!r} is not a supported gated activation "
                                     f"({', '.join(_GATED)})")
                return _GATED[str(act).lower()]
        return _GATED[default]


def _check_window(c: _Config, window: int | None, seq_length: int) -> None:
    if window is not None and seq_length > window + 1:
        raise c.error(f"sliding-window attention (sliding_window={window}) is not simulated; "
                      f"model.seq_length={seq_length} must be at most {window + 1}, where it "
                      "equals full causal attention")


def _llama_family(c: _Config, kind: str, name: str, seq_length: int) -> ModelSpec:
    """LLaMA, Mistral, Mixtral, Qwen2, Phi-3, Gemma and Gemma-2."""
    heads = c.count("num_attention_heads")
    gemma = kind in ("gemma", "gemma2")
    window = None
    if kind in ("mistral", "mixtral", "phi3", "gemma2") or (
            kind == "qwen2" and c.flag("use_sliding_window", False)):
        window = c.optional_count("sliding_window")
    _check_window(c, window, seq_length)
    moe = None
    if kind == "mixtral":
        experts, top_k = c.count("num_local_experts"), c.count("num_experts_per_tok")
        if top_k > experts:
            raise c.error(f"num_experts_per_tok={top_k} exceeds num_local_experts={experts}")
        moe = MoESpec(num_experts=experts, top_k=top_k,
                      expert_ffn_hidden_size=c.count("intermediate_size"))
    return ModelSpec(
        name=name,
        num_layers=c.count("num_hidden_layers"),
        hidden_size=c.count("hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=c.count("num_key_value_heads", default=heads),
        ffn_hidden_size=c.count("intermediate_size"),
        vocab_size=c.count("vocab_size"),
        seq_length=seq_length,
        ffn_type=(c.gated("gelu_pytorch_tanh", "hidden_activation", "hidden_act") if gemma
                  else c.gated("silu", "hidden_act")),
        norm="rmsnorm",
        tied_embeddings=c.flag("tie_word_embeddings", gemma),
        position_embedding="rope",
        moe=moe,
        kv_channels=c.optional_count("head_dim") if not gemma else c.count("head_dim", 256),
        qkv_bias=kind == "qwen2" or c.flag("attention_bias", False),
    )


def _deepseek_v3(c: _Config, name: str, seq_length: int) -> ModelSpec:
    """DeepSeek-V3 (DeepSeek-AI 2024): MLA, shared and routed experts, dense first layers,
    multi-token prediction modules as extra MoE blocks with their heads (module docstring)."""
    if c.cfg.get("moe_layer_freq", 1) != 1:
        raise c.error(f"moe_layer_freq={c.cfg['moe_layer_freq']!r}: only MoE in every layer "
                      "past first_k_dense_replace (1) is read")
    layers = c.count("num_hidden_layers")
    dense = c.cfg.get("first_k_dense_replace", 0)
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense < layers:
        raise c.error(f"first_k_dense_replace={dense!r} is not an integer in [0, "
                      f"num_hidden_layers={layers})")
    mtp = c.cfg.get("num_nextn_predict_layers", 0)
    if isinstance(mtp, bool) or not isinstance(mtp, int) or mtp < 0:
        raise c.error(f"num_nextn_predict_layers={mtp!r} is not a non-negative integer")
    experts, top_k = c.count("n_routed_experts"), c.count("num_experts_per_tok")
    if top_k > experts:
        raise c.error(f"num_experts_per_tok={top_k} exceeds n_routed_experts={experts}")
    shared = c.cfg.get("n_shared_experts", 0)
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise c.error(f"n_shared_experts={shared!r} is not a non-negative integer")
    groups = (c.optional_count("n_group") or 1, c.optional_count("topk_group") or 1)
    try:
        check_router_groups(experts, top_k, *groups)
    except ConfigError as e:
        raise c.error(f"n_group={groups[0]}, topk_group={groups[1]}: {e}") from None
    heads = c.count("num_attention_heads")
    return ModelSpec(
        name=name,
        num_layers=layers + mtp,
        hidden_size=c.count("hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=c.count("intermediate_size"),
        vocab_size=c.count("vocab_size"),
        seq_length=seq_length,
        ffn_type=c.gated("silu", "hidden_act"),
        norm="rmsnorm",
        tied_embeddings=c.flag("tie_word_embeddings", False),
        position_embedding="rope",
        moe=MoESpec(num_experts=experts, top_k=top_k,
                    expert_ffn_hidden_size=c.count("moe_intermediate_size"),
                    shared_experts=shared, router_num_groups=groups[0],
                    router_group_topk=groups[1]),
        mla=MLASpec(q_lora_rank=c.optional_count("q_lora_rank"),
                    kv_lora_rank=c.count("kv_lora_rank"),
                    qk_nope_head_dim=c.count("qk_nope_head_dim"),
                    qk_rope_head_dim=c.count("qk_rope_head_dim"),
                    v_head_dim=c.count("v_head_dim")),
        first_dense_layers=dense,
        mtp_layers=mtp,
    )


def _gpt2(c: _Config, name: str, seq_length: int) -> ModelSpec:
    h, positions = c.count("n_embd"), c.count("n_positions")
    if seq_length > positions:
        raise c.error(f"model.seq_length={seq_length} exceeds the learned position table "
                      f"(n_positions={positions})")
    return ModelSpec(name=name, num_layers=c.count("n_layer"), hidden_size=h,
                     num_attention_heads=c.count("n_head"), num_kv_heads=c.count("n_head"),
                     ffn_hidden_size=c.count("n_inner", default=4 * h),
                     vocab_size=c.count("vocab_size"), seq_length=seq_length,
                     ffn_type="gelu", norm="layernorm", tied_embeddings=True,
                     position_embedding="learned", position_table=positions)


def _gpt_neox(c: _Config, name: str, seq_length: int) -> ModelSpec:
    heads = c.count("num_attention_heads")
    return ModelSpec(name=name, num_layers=c.count("num_hidden_layers"),
                     hidden_size=c.count("hidden_size"), num_attention_heads=heads,
                     num_kv_heads=heads, ffn_hidden_size=c.count("intermediate_size"),
                     vocab_size=c.count("vocab_size"), seq_length=seq_length,
                     ffn_type="gelu", norm="layernorm",
                     tied_embeddings=c.flag("tie_word_embeddings", False),
                     position_embedding="rope",
                     parallel_blocks=c.flag("use_parallel_residual", True))


_LLAMA_FAMILY = ("llama", "mistral", "mixtral", "qwen2", "phi3", "gemma", "gemma2")
SUPPORTED = (*_LLAMA_FAMILY, "deepseek_v3", "gpt2", "gpt_neox")
"""The ``model_type`` values read."""


def load_hf_config(path: str | Path, seq_length: int | None) -> ModelSpec:
    """The model spec of a Hugging Face config file trained on ``seq_length``-token sequences;
    ConfigError names the key (or the missing ``model.seq_length``) otherwise."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"model.hf_config: file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(f"model.hf_config: {str(p)!r} is not a JSON config: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model.hf_config: {str(p)!r} is not a JSON object")
    c = _Config(cfg, str(p))
    kind = cfg.get("model_type")
    if kind not in SUPPORTED:
        raise c.error(f"model_type {kind!r} is not supported; supported: {', '.join(SUPPORTED)}")
    if seq_length is None:
        longest = cfg.get("max_position_embeddings", cfg.get("n_positions"))
        raise ConfigError(f"model.seq_length: required with model.hf_config (the config's "
                          f"max_position_embeddings={longest!r} is the longest context the "
                          "model supports, not a training sequence length)")
    experts = [k for k in ("num_local_experts", "num_experts", "n_routed_experts")
               if cfg.get(k) not in (None, 0)]
    if experts and kind not in ("mixtral", "deepseek_v3"):
        raise c.error(f"{experts[0]}={cfg[experts[0]]!r}: a mixture-of-experts model of "
                      f"model_type {kind!r}; only mixtral and deepseek_v3 experts are read")
    name = cfg.get("_name_or_path") or (p.stem if p.stem != "config" else p.parent.name) or kind
    if kind in _LLAMA_FAMILY:
        return _llama_family(c, kind, str(name), seq_length)
    if kind == "deepseek_v3":
        return _deepseek_v3(c, str(name), seq_length)
    if kind == "gpt2":
        return _gpt2(c, str(name), seq_length)
    return _gpt_neox(c, str(name), seq_length)
