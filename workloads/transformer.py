"""Costs of a dense transformer split into pipeline stages and TP shards. Pure.

Turns one pipeline op into the work its GPUs do, layer by layer, as
:class:`~workloads.costs.ComputeSeg` (GEMM FLOPs and bytes, attention-core
FLOPs, bytes of memory-bound kernels) and TP collectives
(:class:`~workloads.costs.CommSeg`); the device model turns work into time.

Sources:
- GEMM FLOPs: 2 FLOPs per multiply-add, backward = 2x forward (input and
  weight gradients), Narayanan et al. 2021 (SC'21) sec. 5.1.
- Attention core 4·b·s²·h FLOPs forward; causal FlashAttention skips the masked
  half and its backward executes 2.5x its forward (five matmuls against two),
  Dao 2023 (FlashAttention-2) sec. 3.
- Saved activations: Korthikanti et al. 2022 (MLSys'23) sec. 4, eq. 1-4,
  rederived tensor by tensor so that GQA and SwiGLU MLPs are counted (the
  derivation reproduces their 34·sbh + 5·a·s²·b for GPT exactly).
- Model states: mixed-precision Adam, 16 bytes per parameter, ZeRO-1/2/3
  sharding, Rajbhandari et al. 2020 sec. 3.1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from workloads.costs import BF16, CommSeg, ComputeSeg, Segment, fuse_compute
from workloads.models import ModelSpec
from workloads.schedules import BACKWARD, FORWARD, Op

FP32 = 4

# Bytes moved per element by memory-bound kernels (read + write), per forward pass.
NORM_FUSED_BYTES = 4.0
"""Fused RMSNorm/LayerNorm kernel: read x, write y (bf16)."""
NORM_UNFUSED_BYTES = 36.0
"""PyTorch eager RMSNorm: cast to fp32, square, mean, rsqrt-multiply, weight, cast back."""
RESIDUAL_BYTES = 6.0
"""Residual add: read two bf16 tensors, write one."""
ROPE_BYTES = 20.0
"""Eager rotary embedding on q and k: rotate-half (slice, negate, concat), two mults, add."""
SWIGLU_BYTES = 10.0
"""silu(gate) * up: read gate, write silu, read silu and up, write product (per ffn element)."""
GELU_BYTES = 4.0
"""GeLU: read, write (per ffn element)."""
SOFTMAX_PASSES = {"unfused": 8.0, "fused": 2.0}
"""Passes over the b·a·s² score matrix (bf16) of non-flash attention: scale, mask, softmax."""
CROSS_ENTROPY_BYTES = 16.0
"""Vocabulary-parallel cross entropy over fp32 logits: max, exp-sum, gather, gradient."""
BACKWARD_ELEMENTWISE = 2.0
"""Backward of a memory-bound kernel moves about twice its forward bytes."""
FLASH_BACKWARD_FACTOR = 2.5
"""FlashAttention-2 backward FLOPs / forward FLOPs (recomputes QK^T; Dao 2023)."""


@dataclass(frozen=True)
class TransformerCosts:
    """Costs of a dense transformer split into pipeline stages and TP shards."""

    model: ModelSpec
    micro_batch_size: int
    tp: int
    dp: int
    stage_layers: tuple[int, ...]
    """Transformer blocks in each stage (model chunk)."""
    sequence_parallel: bool = False
    zero_stage: int = 1
    recompute: str = "none"
    """``none``, ``selective`` (attention core recomputed) or ``full`` (whole layer)."""
    attention: str = "flash2"
    """``flash2``, ``flash1`` (causal, half the score matrix), ``fused`` or ``unfused``."""
    fused_norm: bool = True
    w_retained_fraction: float = 0.5
    """Share of a micro-batch's activations held from its B until its W (zero-bubble)."""

    # ------------------------------------------------------------- shapes
    @property
    def _tokens(self) -> float:
        return self.micro_batch_size * self.model.seq_length

    @property
    def _bsh(self) -> float:
        return self._tokens * self.model.hidden_size

    @property
    def _flash(self) -> bool:
        return self.attention in ("flash1", "flash2")

    @property
    def _sp_div(self) -> int:
        """Replicated activations are split by t under sequence parallelism."""
        return self.tp if self.sequence_parallel else 1

    # ------------------------------------------------------------- forward work of one layer
    def _gemms(self) -> tuple[ComputeSeg, ComputeSeg]:
        """Forward GEMM work of the attention block and the MLP block on one TP rank."""
        m, t, n = self.model, self.tp, self._tokens
        h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
        qkv_out = h + 2 * kv
        attn_flops = 2 * n * h * (qkv_out + h) / t
        attn_bytes = BF16 * (h * (qkv_out + h) / t + n * (h + 2 * qkv_out / t + h / t + h))
        mlp_flops = 2 * n * h * f * m.mlp_matrices / t
        mid = f * (m.mlp_matrices - 1) / t
        mlp_bytes = BF16 * (h * f * m.mlp_matrices / t + n * (h + 2 * mid + 2 * f / t + h))
        # the TP-sharded dimension (h/t for attention, f/t for the MLP) or the token count
        attn_dim, mlp_dim = min(n, h / t), min(n, f / t)
        return (ComputeSeg("attn", attn_flops, attn_bytes, gemm_dims=((attn_dim, attn_flops),)),
                ComputeSeg("mlp", mlp_flops, mlp_bytes, gemm_dims=((mlp_dim, mlp_flops),)))

    def _core_forward_flops(self) -> float:
        """Attention-core FLOPs the kernel executes forward (causal flash: half of 4·b·s²·h/t)."""
        full = 4 * self.micro_batch_size * self.model.seq_length ** 2 * self.model.hidden_size
        return full / self.tp / (2 if self._flash else 1)

    def _scores_elements(self) -> float:
        m = self.model
        return self.micro_batch_size * m.num_attention_heads * m.seq_length ** 2 / self.tp

    def _elementwise_forward(self) -> tuple[float, float]:
        """Bytes of memory-bound kernels of one layer forward: (attention block, MLP block)."""
        m, t, n = self.model, self.tp, self._tokens
        h = m.hidden_size
        norm = (NORM_FUSED_BYTES if self.fused_norm else NORM_UNFUSED_BYTES) * n * h / self._sp_div
        residual = RESIDUAL_BYTES * n * h / self._sp_div
        rope = ROPE_BYTES * n * (h + m.kv_dim) / t if m.position_embedding == "rope" else 0.0
        softmax = 0.0 if self._flash else (
            SOFTMAX_PASSES[self.attention] * BF16 * self._scores_elements())
        act = (SWIGLU_BYTES if m.ffn_type == "swiglu" else GELU_BYTES) * n * m.ffn_hidden_size / t
        return norm + residual + rope + softmax, norm + residual + act

    # ------------------------------------------------------------- segments
    def _block(self, label: str, compute: ComputeSeg) -> list[Segment]:
        """A TP-sharded block and its collectives (Megatron's f and g operators).

        Without SP: compute, then an all-reduce of the b·s·h output. With SP
        (Korthikanti et al. 2022, sec. 4.2.2): all-gather the sequence-split
        input, compute, reduce-scatter the output; the same bytes on the wire.
        """
        if self.tp == 1:
            return [compute]
        nbytes = BF16 * self._bsh
        if self.sequence_parallel:
            return [CommSeg(f"{label} all-gather", "tp", "all_gather", nbytes), compute,
                    CommSeg(f"{label} reduce-scatter", "tp", "reduce_scatter", nbytes)]
        return [compute, CommSeg(f"{label} all-reduce", "tp", "all_reduce", nbytes)]

    def _layer_forward(self, name: str) -> list[Segment]:
        attn, mlp = self._gemms()
        ew_attn, ew_mlp = self._elementwise_forward()
        attn_seg = replace(attn, label=f"{name} attn", attn_flops=self._core_forward_flops(),
                           elementwise_bytes=ew_attn)
        mlp_seg = replace(mlp, label=f"{name} mlp", elementwise_bytes=ew_mlp)
        return self._block(f"{name} attn", attn_seg) + self._block(f"{name} mlp", mlp_seg)

    def _layer_backward(self, name: str, weight_grad_deferred: bool) -> list[Segment]:
        """Backward of one layer: input gradients, and weight gradients unless deferred to W."""
        attn, mlp = self._gemms()
        ew_attn, ew_mlp = self._elementwise_forward()
        wg = 0.0 if weight_grad_deferred else 1.0
        core = self._core_forward_flops() * (FLASH_BACKWARD_FACTOR if self._flash else 2.0)
        segs: list[Segment] = []
        if self.recompute == "full":
            segs += self._layer_forward(f"recompute {name}")
        elif self.recompute == "selective":
            softmax = 0.0 if self._flash else (
                SOFTMAX_PASSES[self.attention] * BF16 * self._scores_elements())
            segs.append(ComputeSeg(f"recompute {name} core", attn_flops=self._core_forward_flops(),
                                   elementwise_bytes=softmax))
        mlp_seg = _scaled(mlp, f"{name} mlp bwd", 1 + wg,
                          elementwise_bytes=BACKWARD_ELEMENTWISE * ew_mlp)
        attn_seg = _scaled(attn, f"{name} attn bwd", 1 + wg, attn_flops=core,
                           elementwise_bytes=BACKWARD_ELEMENTWISE * ew_attn)
        return segs + self._block(f"{name} mlp bwd", mlp_seg) + self._block(f"{name} attn bwd",
                                                                           attn_seg)

    def _head(self, backward: bool, weight_grad_deferred: bool = False) -> ComputeSeg:
        """Final norm, output projection (vocabulary-parallel) and cross entropy."""
        m, t, n = self.model, self.tp, self._tokens
        flops = 2 * n * m.hidden_size * m.vocab_size / t
        weights = BF16 * m.hidden_size * m.vocab_size / t
        ce = CROSS_ENTROPY_BYTES * n * m.vocab_size / t
        fwd = ComputeSeg("logits+loss", flops, weights, elementwise_bytes=ce,
                         gemm_dims=((min(n, m.hidden_size), flops),))
        if not backward:
            return fwd
        wg = 0.0 if weight_grad_deferred else 1.0
        return _scaled(fwd, "logits bwd", 1 + wg, elementwise_bytes=BACKWARD_ELEMENTWISE * ce)

    def _stage_layers(self, stage: int) -> range:
        start = sum(self.stage_layers[:stage])
        return range(start, start + self.stage_layers[stage])

    def op_segments(self, op: Op, split_backward: bool) -> tuple[Segment, ...]:
        last = op.stage == len(self.stage_layers) - 1
        layers = self._stage_layers(op.stage)
        segs: list[Segment] = []
        if op.kind == FORWARD:
            for layer in layers:
                segs += self._layer_forward(f"L{layer}")
            if last:
                segs.append(self._head(backward=False))
        elif op.kind == BACKWARD:
            if last:
                segs.append(self._head(backward=True, weight_grad_deferred=split_backward))
            for layer in reversed(layers):
                segs += self._layer_backward(f"L{layer}", weight_grad_deferred=split_backward)
        else:
            attn, mlp = self._gemms()
            k = len(layers)
            segs += [_scaled(attn, "weight grads", k), _scaled(mlp, "weight grads", k)]
            if last:
                segs.append(_scaled(self._head(backward=False), "weight grads", 1,
                                    elementwise_bytes=0.0))
        return tuple(fuse_compute(segs, str(op)))

    # ------------------------------------------------------------- memory
    def layer_activation_bytes(self) -> float:
        """Bytes one layer keeps per micro-batch for its backward, on one TP rank.

        In units of s·b·h bytes (bf16): replicated across TP (split by t under
        SP): the two norm inputs (4), the QKV and MLP GEMM inputs (4), dropout
        masks (2, GPT style only). Split by t: Q, K, V (2·(h + 2·kv)/h), the
        attention output (2), the MLP intermediates (GeLU: fc1 output and GeLU
        output, 4·f/h; SwiGLU: gate, silu(gate), up and product, 8·f/h). Score
        matrix 5·a·s/h (Korthikanti's softmax, dropout mask and output) unless
        the attention kernel is flash or attention is recomputed. Full
        recomputation keeps only the layer input (2). For GPT (kv = h, f = 4h)
        this is exactly Korthikanti's s·b·h·(10 + 24/t + 5·a·s/(h·t)).
        """
        m, t = self.model, self.tp
        if self.recompute == "full":
            return BF16 * self._bsh / self._sp_div
        dropout = 2 if m.norm == "layernorm" else 0
        replicated = (8 + dropout) / self._sp_div
        ratio = m.ffn_hidden_size / m.hidden_size
        mlp = (8 if m.ffn_type == "swiglu" else 4) * ratio
        split = (2 * (m.hidden_size + 2 * m.kv_dim) / m.hidden_size + 2 + mlp) / t
        scores = 0.0
        if not self._flash and self.recompute != "selective":
            scores = 5 * m.num_attention_heads * m.seq_length / m.hidden_size / t
        return (replicated + split + scores) * self._bsh

    def transient_bytes(self, op: Op) -> float:
        """Working memory an op holds only while it runs, on one TP rank.

        Backward: the gradients flowing through one layer, about one layer's
        activations, plus with full recomputation the recomputed layer's
        activations. Last stage, forward and backward: the fp32 softmax of the
        vocabulary-parallel cross entropy and its gradient, 8·b·s·V/t bytes.
        """
        layer = replace(self, recompute="none").layer_activation_bytes()
        total = 0.0
        if op.kind == BACKWARD:
            total += layer * (2 if self.recompute == "full" else 1)
        if op.stage == len(self.stage_layers) - 1 and op.kind in (FORWARD, BACKWARD):
            total += 2 * FP32 * self._tokens * self.model.vocab_size / self.tp
        return total

    def activation_bytes_per_mb(self, stage: int) -> float:
        """Activations a stage keeps per in-flight micro-batch (last stage adds the logits).

        The last stage holds bf16 logits and their fp32 copy for the loss,
        6·b·s·V/t bytes, until its backward.
        """
        total = self.stage_layers[stage] * self.layer_activation_bytes()
        if stage == len(self.stage_layers) - 1:
            total += (BF16 + FP32) * self._tokens * self.model.vocab_size / self.tp
        return total

    def p2p_bytes(self) -> float:
        """Activation (or its gradient) between stages, per TP rank.

        Megatron's scatter/gather optimisation sends 1/t of it (Narayanan et al.
        2021, sec. 4.1); with SP it is already split.
        """
        return BF16 * self._bsh / self.tp

    def stage_params(self, stage: int) -> float:
        """Parameters of a stage held by one TP rank."""
        m, t = self.model, self.tp
        n = self.stage_layers[stage] * m.layer_params() / t
        if stage == 0:
            n += m.embedding_params() / t
        if stage == len(self.stage_layers) - 1:
            n += m.head_params() / t
            if m.tied_embeddings and len(self.stage_layers) > 1:
                n += m.vocab_size * m.hidden_size / t
        return n

    def grad_bytes(self, stage: int) -> float:
        """Gradient bytes of a stage reduced across DP (bf16)."""
        return BF16 * self.stage_params(stage)

    def bytes_per_param(self) -> float:
        """Model-state bytes per parameter, mixed-precision Adam under ZeRO (Rajbhandari 2020).

        16 (ZeRO-0), 4 + 12/d (ZeRO-1), 2 + 14/d (ZeRO-2), 16/d (ZeRO-3).
        """
        d = self.dp
        return {0: 16.0, 1: 4 + 12 / d, 2: 2 + 14 / d, 3: 16 / d}[self.zero_stage]

    def static_bytes(self, stages: tuple[int, ...]) -> float:
        return self.bytes_per_param() * sum(self.stage_params(s) for s in stages)

    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None:
        """AdamW update, memory-bound: per parameter it reads the gradient (2 B), the
        fp32 master weight, m and v (12 B), and writes master, m, v and the bf16 weight
        (14 B): 28 bytes.
        """
        n = sum(self.stage_params(s) for s in stages)
        if self.zero_stage >= 1:
            n /= self.dp
        return ComputeSeg("optimizer", elementwise_bytes=28 * n)


def _scaled(seg: ComputeSeg, label: str, factor: float, **fields: float) -> ComputeSeg:
    """``seg``'s GEMM work times ``factor`` under a new label, other fields as given."""
    return replace(seg, label=label, flops=seg.flops * factor, hbm_bytes=seg.hbm_bytes * factor,
                   gemm_dims=tuple((d, f * factor) for d, f in seg.gemm_dims),
                   attn_flops=fields.get("attn_flops", 0.0),
                   elementwise_bytes=fields.get("elementwise_bytes", 0.0))
