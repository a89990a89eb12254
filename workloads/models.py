"""Transformer model specs (GPT and LLaMA styles, dense or mixture-of-experts, multi-head or
multi-head latent attention), presets, parameter and FLOP counts."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLP: every layer's MLP is ``num_experts`` experts and a router
    sending each token to ``top_k`` of them (Shazeer et al. 2017; Mixtral, Jiang et al.
    2024)."""

    num_experts: int
    """E, experts per layer."""
    top_k: int
    """k, experts each token is routed to."""
    expert_ffn_hidden_size: int
    """Inner size of one expert's MLP (same activation as the dense MLP)."""
    capacity_factor: float | None = None
    """None: dropless (Megatron's default; each expert computes the rows routed to it).
    c: every expert takes at most c·tokens·k/E rows from each rank (Megatron-core's
    ``get_capacity``, ``megatron/core/transformer/moe/moe_utils.py``); copies beyond it
    are dropped (Fedus et al. 2021, sec. 2.2). See :attr:`pad_to_capacity`."""
    routing_imbalance: float = 1.0
    """Token copies routed to the busiest EP rank over the mean, >= 1 (1: balanced routing).
    Dropless with ep > 1, that rank computes and receives this many times the mean rows,
    and every rank waits for it at the combine all-to-all, so the step is timed (and
    memory sized) on the busiest rank; in the all-to-alls each rank moves its own share
    (one seeded draw of per-rank loads with this maximum, :func:`sim.collectives.routing_loads`),
    as unequal flows the max-min network shares: on per-GPU ports the busiest receiver's
    time, less where ranks share links (NICs). It must not exceed ep. It changes
    nothing with ep = 1 (every expert is local: a GPU computes all its own copies however
    they split) or with a padded capacity factor (buffers hold c whatever the routing;
    the overflow is dropped); unpadded, the busiest rank keeps min(c, imbalance).
    Take it from the router's load statistics; for reference, uniform random routing of
    N copies per GPU gives about 1 + sqrt(2·ln(ep)·(1 - 1/ep)/N) (the largest of ep
    near-Gaussian loads), a lower bound for real routers."""

    pad_to_capacity: bool = True
    """With a capacity factor: every expert's buffer is padded to its capacity and computed
    whole (GShard/Switch; Megatron-core's ``moe_pad_expert_input_to_capacity``, whose
    dispatcher then sends capacity·E rows per rank): expert work and all-to-all bytes
    scale by c. False: only the kept copies are sent and computed, min(c, imbalance) on
    the busiest EP rank (Megatron-core's default, which drops without padding)."""

    shared_experts: int = 0
    """Experts every token passes besides its top-k routed ones (DeepSeekMoE's shared
    experts, Dai et al. 2024, sec. 3.2), each of ``expert_ffn_hidden_size``: dense weights,
    replicated across EP like the attention's."""

    router_num_groups: int = 1
    """G, groups of E/G consecutive experts for node-limited routing (DeepSeek-V3's
    ``n_group``; Megatron-core ``moe_router_num_groups``); 1: no groups."""
    router_group_topk: int = 1
    """M, groups a token's experts may come from (DeepSeek-V3's ``topk_group``; Megatron-core
    ``moe_router_group_topk``). Only the flex dispatcher's volume depends on G and M
    (:mod:`workloads.moe_dispatch`)."""

    def load_factor(self, ep: int) -> float:
        """Expert rows a GPU computes (and receives) per token copy it routes, on EP groups
        of ``ep`` GPUs: dropless, the routing imbalance when the experts are spread (ep > 1),
        else 1; with a capacity factor c, c padded, else the kept share min(c, that)."""
        routed = self.routing_imbalance if ep > 1 else 1.0
        if self.capacity_factor is None:
            return routed
        if self.pad_to_capacity:
            return self.capacity_factor
        return min(self.capacity_factor, routed)


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024, sec. 2.1): queries and
    keys/values pass through low-rank latents; each head's query and key are a ``nope`` part
    from the latent and a rotary ``rope`` part (the key's shared by all heads)."""

    q_lora_rank: int | None
    """d_c', the query latent (None: queries projected from h directly)."""
    kv_lora_rank: int
    """d_c, the key/value latent (the KV cache of inference)."""
    qk_nope_head_dim: int
    """d_h, per-head query/key dimension without position encoding."""
    qk_rope_head_dim: int
    """d_h^R, per-head rotary query/key dimension (one rotary key shared by all heads)."""
    v_head_dim: int
    """Per-head value dimension."""

    @property
    def qk_head_dim(self) -> int:
        """Query/key width of one head: d_h + d_h^R."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
    """``gelu`` (2 matrices), or the gated ``swiglu`` and ``geglu`` (3 matrices: gate, up,
    down; Shazeer 2020)."""
    norm: str = "rmsnorm"
    """``layernorm`` (weight and bias) or ``rmsnorm`` (weight only)."""
    tied_embeddings: bool = False
    """Output projection shares the input embedding matrix."""
    position_embedding: str = "rope"
    """``learned`` (s·h parameters), ``rope`` (none; rotary kernels on q and k) or ``alibi``
    (none; a per-head linear bias added to the attention scores, Press et al. 2022)."""
    moe: MoESpec | None = None
    """Mixture-of-experts MLPs (in every layer past :attr:`first_dense_layers`); None = dense."""
    kv_channels: int | None = None
    """d, the head size, where it is not h/a (Megatron-LM's ``--kv-channels``; Gemma's
    ``head_dim``); None: h/a."""
    qkv_bias: bool = False
    """Biases on the Q, K and V projections only (Qwen2); LayerNorm models have all biases."""
    mla: MLASpec | None = None
    """Multi-head latent attention instead of (grouped-query) multi-head attention."""
    position_table: int | None = None
    """Rows of a learned position table (GPT-2's ``n_positions``); None: s."""
    parallel_blocks: bool = False
    """GPT-J / GPT-NeoX parallel attention and MLP: x + attn(ln1(x)) + mlp(ln2(x)) instead
    of two residual blocks in sequence (Wang & Komatsuzaki 2021; Black et al. 2022,
    sec. 2.1); :class:`workloads.transformer.TransformerCosts` counts what it changes."""
    first_dense_layers: int = 0
    """A MoE model's first layers whose MLP is dense, of ``ffn_hidden_size`` (DeepSeek-V3's
    ``first_k_dense_replace``); the per-layer methods take :meth:`layer_spec`."""
    mtp_layers: int = 0
    """D, multi-token prediction modules (DeepSeek-AI 2024, sec. 2.2; DeepSeek-V3's
    ``num_nextn_predict_layers``): the last D of :attr:`num_layers`, each a transformer block
    with, on the last pipeline stage, its own input projection and pass through the shared
    output head and loss (:meth:`workloads.transformer.TransformerCosts._head`)."""

    def layer_spec(self, layer: int) -> ModelSpec:
        """The uniform spec of transformer block ``layer`` (0-based): dense for the first
        :attr:`first_dense_layers` of a MoE model, the model itself otherwise."""
        if not self.first_dense_layers:
            return self
        return replace(self, first_dense_layers=0,
                       moe=None if layer < self.first_dense_layers else self.moe)

    def require_uniform(self) -> None:
        """ValueError unless every layer is alike (per-layer quantities need :meth:`layer_spec`)."""
        if self.first_dense_layers:
            raise ValueError(f"{self.name}: layers differ (first {self.first_dense_layers} "
                             "dense); take layer_spec(i)'s")

    @property
    def head_dim(self) -> int:
        """d, the query/key/value width of one head (h/a unless :attr:`kv_channels`)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection: a·d (MLA: a·(d_h + d_h^R))."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.qk_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: kv_heads · head_dim. MLA: the mean
        of the materialised keys' and values' widths, a·(d_h + d_h^R + d_v)/2 (what flash
        attention reads and ring attention passes)."""
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_head_dim + self.mla.v_head_dim) // 2
        return self.num_kv_heads * self.head_dim

    @property
    def attn_out_dim(self) -> int:
        """Input width of the output projection: a·d (MLA: a·d_v)."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.v_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def core_width(self) -> int:
        """Half the summed query/key and value widths the attention core multiplies, a·d
        (= h without :attr:`kv_channels`; MLA a·(d_h + d_h^R + d_v)/2): the core's forward
        is 4·b·s²·core_width FLOPs (QK^T and softmax·V, 2·b·s²·a·d each)."""
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_head_dim + self.mla.v_head_dim) // 2
        return self.num_attention_heads * self.head_dim

    @property
    def latent_dim(self) -> int:
        """MLA: the latents and the shared rotary key each token stores for the
        up-projections, d_c' + d_c + d_h^R (0 without MLA)."""
        if self.mla is None:
            return 0
        return (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank + self.mla.qk_rope_head_dim

    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @property
    def gated_mlp(self) -> bool:
        """A gated MLP (SwiGLU, GeGLU): three matrices, act(gate)·up."""
        return self.ffn_type in ("swiglu", "geglu")

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def attention_params(self) -> int:
        """Q, K, V and output projections (biases for GPT style, QKV biases for
        :attr:`qkv_bias`); MLA: down-projections, latent norms, up-projections and output."""
        h = self.hidden_size
        if self.mla is not None:
            mla, a = self.mla, self.num_attention_heads
            q_lora = mla.q_lora_rank
            q = (h * q_lora + q_lora + q_lora * a * mla.qk_head_dim if q_lora
                 else h * a * mla.qk_head_dim)
            kv = (h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
                  + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim))
            return q + kv + a * mla.v_head_dim * h
        qkv = self.q_dim + 2 * self.kv_dim
        weights = h * qkv + self.attn_out_dim * h
        if self.norm == "layernorm":
            return weights + qkv + h
        return weights + (qkv if self.qkv_bias else 0)

    def _ffn_params(self, f: int) -> int:
        h = self.hidden_size
        biases = (f * (self.mlp_matrices - 1) + h) if self.norm == "layernorm" else 0
        return self.mlp_matrices * h * f + biases

    def expert_params(self) -> int:
        """One expert's MLP (0 for a dense model)."""
        return 0 if self.moe is None else self._ffn_params(self.moe.expert_ffn_hidden_size)

    def router_params(self) -> int:
        """The router's h x E gate (0 for a dense model)."""
        return 0 if self.moe is None else self.hidden_size * self.moe.num_experts

    def mlp_params(self) -> int:
        """The MLP: dense, or all experts (routed and shared) and the router."""
        if self.moe is not None:
            experts = self.moe.num_experts + self.moe.shared_experts
            return experts * self.expert_params() + self.router_params()
        return self._ffn_params(self.ffn_hidden_size)

    def layer_params(self) -> int:
        """Parameters of one transformer block, two norms included (a uniform model's, or
        one :meth:`layer_spec`'s). Kept on the instance (a frozen spec never changes; an
        integer, the same whenever it is asked: a new layout's cost model asks ~100 times,
        per layer's gradient bytes), outside the fields equality, hashing and ``replace``
        read; :meth:`_layer_params`, the reference, works it out."""
        found = self.__dict__.get("_memo_layer_params")
        if found is None:
            found = self.__dict__["_memo_layer_params"] = self._layer_params()
        return found

    def _layer_params(self) -> int:
        """:meth:`layer_params` worked out."""
        self.require_uniform()
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params

    def layer_expert_params(self) -> int:
        """The routed experts' share of :meth:`layer_params` (sharded by expert parallelism)."""
        self.require_uniform()
        return 0 if self.moe is None else self.moe.num_experts * self.expert_params()

    def _moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.first_dense_layers

    def embedding_params(self) -> int:
        """Input embedding (and learned positions)."""
        rows = self.position_table or self.seq_length
        pos = rows * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    def head_params(self) -> int:
        """Final norm and output projection (0 extra weights when tied)."""
        out = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.norm_params + out

    def num_params(self) -> int:
        """N, all parameters."""
        k = self.first_dense_layers
        if k:
            layers = (k * self.layer_spec(0).layer_params()
                      + (self.num_layers - k) * self.layer_spec(k).layer_params())
        else:
            layers = self.num_layers * self.layer_params()
        return layers + self.embedding_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters a token passes through: N less the routed experts it is not sent to,
        N − l_MoE·(E − k)·expert_params (= N for a dense model)."""
        if self.moe is None:
            return self.num_params()
        idle = self.moe.num_experts - self.moe.top_k
        return self.num_params() - self._moe_layers() * idle * self.expert_params()

    def model_flops_per_token(self) -> float:
        """6·N + 12·l·a·d·s: PaLM's model FLOPs per token (Chowdhery et al. 2022, app. B;
        a·d = h unless the head size is explicit, MLA's :attr:`core_width`).

        For a mixture of experts N is the active parameter count (:meth:`active_params`):
        only the top-k experts' weights touch a token, so 6·N_active + 12·l·a·d·s (capacity
        padding is hardware work, not model FLOPs)."""
        return (6 * self.active_params()
                + 12 * self.num_layers * self.core_width * self.seq_length)

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
        # Mixtral 8x7B (Jiang et al. 2024, table 1): 8 experts, top-2, 32k context,
        # 46.7B parameters, 12.9B active.
        replace(_llama("mixtral-8x7b", 32, 4096, 32, 14336, s=32768, kv=8),
                moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336)),
    )
}
"""Model presets by name."""
