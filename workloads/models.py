"""Dense transformer model specs (GPT and LLaMA styles), presets, parameter and FLOP counts."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer."""

    name: str
    num_layers: int
    """l, transformer blocks."""
    hidden_size: int
    """h."""
    num_attention_heads: int
    """a, query heads."""
    num_kv_heads: int
    """Key/value heads (= a without grouped-query attention)."""
    ffn_hidden_size: int
    """MLP inner size (4h for GPT; about 8h/3 rounded for LLaMA's SwiGLU)."""
    vocab_size: int
    """V."""
    seq_length: int
    """s, tokens per sequence."""
    ffn_type: str = "swiglu"
    """``gelu`` (2 matrices) or ``swiglu`` (3 matrices)."""
    norm: str = "rmsnorm"
    """``layernorm`` (weight and bias) or ``rmsnorm`` (weight only)."""
    tied_embeddings: bool = False
    """Output projection shares the input embedding matrix."""
    position_embedding: str = "rope"
    """``learned`` (s·h parameters) or ``rope`` (none)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: kv_heads · head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.ffn_type == "swiglu" else 2

    def attention_params(self) -> int:
        """Q, K, V and output projections (biases for GPT style)."""
        h = self.hidden_size
        weights = 2 * h * h + 2 * h * self.kv_dim
        biases = (2 * h + 2 * self.kv_dim) if self.norm == "layernorm" else 0
        return weights + biases

    def mlp_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        biases = (f * (self.mlp_matrices - 1) + h) if self.norm == "layernorm" else 0
        return self.mlp_matrices * h * f + biases

    def layer_params(self) -> int:
        """Parameters of one transformer block, two norms included."""
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params

    def embedding_params(self) -> int:
        """Input embedding (and learned positions)."""
        pos = self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Final norm and output projection (0 extra weights when tied)."""
        out = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.norm_params + out

    def num_params(self) -> int:
        """N, all parameters."""
        return self.num_layers * self.layer_params() + self.embedding_params() + self.head_params()

    def model_flops_per_token(self) -> float:
        """6N + 12·l·h·s: PaLM's model FLOPs per token (Chowdhery et al. 2022, app. B)."""
        return 6 * self.num_params() + 12 * self.num_layers * self.hidden_size * self.seq_length

    def with_overrides(self, **fields) -> ModelSpec:
        return replace(self, **fields)


def _llama(name: str, l: int, h: int, a: int, f: int, s: int = 2048, kv: int | None = None,
           vocab: int = 32000) -> ModelSpec:
    return ModelSpec(name, l, h, a, kv or a, f, vocab, s)


def _gpt(name: str, l: int, h: int, a: int, s: int = 2048, vocab: int = 50257) -> ModelSpec:
    return ModelSpec(name, l, h, a, a, 4 * h, vocab, s, ffn_type="gelu", norm="layernorm",
                     tied_embeddings=True, position_embedding="learned")


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # LLaMA (Touvron et al. 2023a, table 2); vocabulary 32k.
        _llama("llama-7b", 32, 4096, 32, 11008),
        _llama("llama-13b", 40, 5120, 40, 13824),
        _llama("llama-30b", 60, 6656, 52, 17920),
        _llama("llama-65b", 80, 8192, 64, 22016),
        # Llama 2 (Touvron et al. 2023b): 4k context, GQA with 8 KV heads for 70B.
        _llama("llama2-7b", 32, 4096, 32, 11008, s=4096),
        _llama("llama2-13b", 40, 5120, 40, 13824, s=4096),
        _llama("llama2-70b", 80, 8192, 64, 28672, s=4096, kv=8),
        # Llama 3 (Meta 2024, table 3): 128,256 vocabulary, GQA 8 KV heads.
        _llama("llama3-8b", 32, 4096, 32, 14336, s=8192, kv=8, vocab=128256),
        _llama("llama3-70b", 80, 8192, 64, 28672, s=8192, kv=8, vocab=128256),
        _llama("llama3-405b", 126, 16384, 128, 53248, s=8192, kv=8, vocab=128256),
        # GPT-3 family (Brown et al. 2020, table 2.1): learned positions, tied embeddings.
        _gpt("gpt3-1.3b", 24, 2048, 16),
        _gpt("gpt3-2.7b", 32, 2560, 32),
        _gpt("gpt3-6.7b", 32, 4096, 32),
        _gpt("gpt3-175b", 96, 12288, 96),
    )
}
"""Model presets by name."""
