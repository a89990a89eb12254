"""One transformer layer's work in the cost model: GEMMs, attention, TP blocks. Pure.

Sources:
- GEMM FLOPs: 2 FLOPs per multiply-add, backward = 2x forward (input and
  weight gradients), Narayanan et al. 2021 (SC'21) sec. 5.1.
- Attention core 4·b·s²·h FLOPs forward; causal FlashAttention skips the masked
  half and its backward executes 2.5x its forward (five matmuls against two),
  Dao 2023 (FlashAttention-2) sec. 3.
- Context parallelism: ring attention (Liu et al. 2023) as Megatron-LM runs it:
  sequences split into 2·cp chunks (rank i: chunks i and 2cp − 1 − i) so each
  CP rank has 1/cp of the tokens and of the causal attention work; K/V passed
  around the CP ring, dK/dV too in backward (Megatron docs, context_parallel).
- Tensor and sequence parallelism: Megatron's f and g operators around each block,
  Korthikanti et al. 2022 sec. 4.2.2.
"""

from __future__ import annotations

from dataclasses import replace

from workloads.costs import BF16, CommSeg, ComputeSeg, RingAttention, Segment, fuse_compute
from workloads.elementwise import (
    BACKWARD_ELEMENTWISE,
    CROSS_ENTROPY_BYTES,
    FUSED_CROSS_ENTROPY_BYTES,
    GELU_BYTES,
    NORM_FUSED_BYTES,
    NORM_UNFUSED_BYTES,
    RESIDUAL_BYTES,
    SOFTMAX_PASSES,
)
from workloads.kernels import gemm, on_fp8, per_instance, scaled
from workloads.recompute_modules import layer_modules
from workloads.seqchunks import window_attention_share

FLASH_BACKWARD_FACTOR = 2.5
"""FlashAttention-2 backward FLOPs / forward FLOPs (recomputes QK^T; Dao 2023)."""


class LayerWork:
    """One layer's work under a :class:`~workloads.transformer.TransformerCosts` (a mixin of
    it): the attention and MLP blocks' GEMMs (MLA's too), the attention core (with CP, ring
    attention), the TP collectives around each block, the forward, the backward with its
    recomputation, and the output head with its loss (and MTP's inputs)."""

    @per_instance
    def _gemms(self) -> tuple[ComputeSeg, ComputeSeg]:
        """Forward GEMM work of the attention block and the MLP block on one TP rank."""
        m, t, n = self.model, self.tp, self._tokens
        m.require_uniform()
        h, kv, f, o = m.hidden_size, m.kv_dim, m.ffn_hidden_size, m.attn_out_dim
        if m.mla is not None:
            attn = self._mla_gemms()
        else:
            qkv_out = m.q_dim + 2 * kv
            qkv, proj = gemm(n, h, qkv_out / t), gemm(n, o / t, h)  # column-, row-parallel
            attn_flops = qkv[1] + proj[1]  # 2·n·h·(a·d + 2·kv + a·d)/t
            attn_bytes = BF16 * ((h * qkv_out + o * h) / t
                                 + n * (h + 2 * qkv_out / t + o / t + h))
            attn = ComputeSeg("attn", attn_flops, attn_bytes, gemm_dims=(qkv, proj))
        if m.moe is not None:
            mlp = self._expert_gemms()
        else:
            mid = f * (m.mlp_matrices - 1) / t  # fc1 outputs: f/t (GeLU), gate and up 2·f/t
            fc1, fc2 = gemm(n, h, mid), gemm(n, f / t, h)
            mlp_flops = fc1[1] + fc2[1]  # 2·n·h·f·(2 or 3)/t
            mlp_bytes = BF16 * (h * f * m.mlp_matrices / t + n * (h + 2 * mid + 2 * f / t + h))
            mlp = ComputeSeg("mlp", mlp_flops, mlp_bytes, gemm_dims=(fc1, fc2))
        if self.precision == "fp8":
            return on_fp8(attn, self.fp8_speedup), on_fp8(mlp, self.fp8_speedup)
        return attn, mlp

    def _mla_gemms(self) -> ComputeSeg:
        """Forward GEMMs of multi-head latent attention on one TP rank (DeepSeek-AI 2024,
        sec. 2.1; Megatron-LM's MLA): the down-projections to the latents (and the shared
        rotary key) are replicated on every TP rank, the query and key/value up-projections
        column-parallel, the output projection row-parallel."""
        m, t, n = self.model, self.tp, self._tokens
        mla, h, a = m.mla, m.hidden_size, m.num_attention_heads
        assert mla is not None
        q_in = mla.q_lora_rank or h
        down_out = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim
        up = [gemm(n, q_in, m.q_dim / t),
              gemm(n, mla.kv_lora_rank, a * (mla.qk_nope_head_dim + mla.v_head_dim) / t)]
        dims = (gemm(n, h, down_out), *up, gemm(n, m.attn_out_dim / t, h))
        weights = (h * down_out + q_in * m.q_dim / t + mla.kv_lora_rank * a
                   * (mla.qk_nope_head_dim + mla.v_head_dim) / t + m.attn_out_dim * h / t)
        acts = n * (h + 2 * down_out + 2 * (m.q_dim + 2 * m.kv_dim) / t
                    + m.attn_out_dim / t + h)
        return ComputeSeg("attn", sum(d[1] for d in dims), BF16 * (weights + acts),
                          gemm_dims=dims)

    def _mla_up_gemms(self, label: str) -> ComputeSeg:
        """MLA's query and key/value up-projections and RoPE forward on one TP rank (what
        ``mla_up_proj`` recomputation reruns, Megatron-LM's ``qkv_up_proj_and_rope_apply``):
        column-parallel GEMMs from the latents to the per-head Q, K and V, and the rotary
        kernel over the queries and keys."""
        m, t, n = self.model, self.tp, self._tokens
        mla, a = m.mla, m.num_attention_heads
        assert mla is not None
        q_in = mla.q_lora_rank or m.hidden_size
        kv_out = a * (mla.qk_nope_head_dim + mla.v_head_dim) / t
        dims = (gemm(n, q_in, m.q_dim / t), gemm(n, mla.kv_lora_rank, kv_out))
        nbytes = BF16 * (q_in * m.q_dim / t + mla.kv_lora_rank * kv_out
                         + n * (q_in + mla.kv_lora_rank + m.q_dim / t + kv_out))
        rope = (self._rope_bytes * n * (m.q_dim + m.kv_dim) / t
                if m.position_embedding == "rope" else 0.0)
        seg = ComputeSeg(f"{label} mla up", sum(d[1] for d in dims), nbytes,
                         elementwise_bytes=rope, gemm_dims=dims)
        return on_fp8(seg, self.fp8_speedup) if self.precision == "fp8" else seg

    @per_instance
    def _core_forward_flops(self) -> float:
        """Attention-core FLOPs the kernel executes forward (causal flash: half of 4·b·s²·h/t),
        divided by cp: the load-balanced split gives every CP rank the same causal share. A
        sequence chunk does its queries' share against their prefix (:mod:`workloads.seqchunks`)."""
        full = 4 * self.micro_batch_size * self.model.seq_length ** 2 * self.model.core_width
        return (full / self.tp / (2 if self._flash else 1) / self.cp
                * window_attention_share(self.seq_window, self._flash))

    def _scores_elements(self) -> float:
        m = self.model
        return (self.micro_batch_size * m.num_attention_heads * m.seq_length ** 2 / self.tp
                / self.cp * window_attention_share(self.seq_window, False))

    def _kv_pass_bytes(self) -> float:
        """K and V of one CP chunk on one TP rank, bf16: 2·2·(b·s/cp)·kv_dim/t bytes."""
        return 2 * BF16 * self._tokens * self.model.kv_dim / self.tp

    def _attention_parts(self, seg: ComputeSeg, core_flops: float, name: str,
                         backward: bool) -> list[Segment]:
        """The attention block with CP: QKV GEMMs, ring attention core, output projection
        (reversed in backward, where dK/dV travel with K/V: twice the bytes per pass); with
        :attr:`cp_kv_all_gather` the core's K and V are gathered whole instead.

        The block's GEMM work is split by FLOPs, (h + 2·kv)/(2h + 2·kv) to the QKV
        projection; its memory-bound kernels go with the QKV part (norm, RoPE)."""
        m = self.model
        qkv_share = (m.q_dim + 2 * m.kv_dim) / (m.q_dim + 2 * m.kv_dim + m.attn_out_dim)
        qkv = scaled(seg, f"{name} qkv", qkv_share, elementwise_bytes=seg.elementwise_bytes)
        proj = scaled(seg, f"{name} proj", 1 - qkv_share)
        block = ComputeSeg(f"{name} core", attn_flops=core_flops / self.cp)
        if self.cp_kv_all_gather:
            ring = RingAttention(f"{name} cp", block, self.cp, self._kv_pass_bytes() * self.cp,
                                 gathered=True, scatter_grads=backward)
            return [proj, ring, qkv] if backward else [qkv, ring, proj]
        merge = self.cp_ring_merge_bytes(backward)
        if merge:
            block = replace(block, elementwise_bytes=merge / self.cp)
        ring = RingAttention(f"{name} ring", block, self.cp,
                             self._kv_pass_bytes() * (2 if backward else 1))
        contention = self.cp_overlap_s[1 if backward else 0]
        core: list[Segment] = [ring]
        if contention:  # the passes' kernels beside the blocks (sim.cpoverlap)
            core.append(ComputeSeg(f"{name} cp overlap", duration_s=contention))
        return [proj, *core, qkv] if backward else [qkv, *core, proj]

    def tp_overlap_gemms(self) -> dict[str, ComputeSeg]:
        """The forward GEMMs of a layer on one TP rank that TP communication overlap pipelines
        a collective with (:data:`TP_OVERLAP_GEMMS`): ``qkv``, ``proj``, ``fc1``, ``fc2``
        (a backward's input- or weight-gradient GEMM does the same work)."""
        m, t, n = self.model, self.tp, self._tokens
        mid = m.ffn_hidden_size * (m.mlp_matrices - 1) / t
        shapes = {"qkv": gemm(n, m.hidden_size, (m.q_dim + 2 * m.kv_dim) / t),
                  "proj": gemm(n, m.attn_out_dim / t, m.hidden_size),
                  "fc1": gemm(n, m.hidden_size, mid),
                  "fc2": gemm(n, m.ffn_hidden_size / t, m.hidden_size)}
        out = {name: ComputeSeg(name, dims[1], gemm_dims=(dims,)) for name, dims in shapes.items()}
        if self.precision == "fp8":
            return {name: on_fp8(seg, self.fp8_speedup) for name, seg in out.items()}
        return out

    def _block(self, label: str, compute: ComputeSeg | list[Segment],
               block: str = "") -> list[Segment]:
        """A TP-sharded block and its collectives (Megatron's f and g operators).

        Without SP: compute, then an all-reduce of the b·s·h output (a backward block's
        found in :attr:`tp_comm_exposed_s`, run beside the weight gradient under
        :attr:`tp_async_grad_all_reduce`, gets its exposed time). With SP
        (Korthikanti et al. 2022, sec. 4.2.2): all-gather the sequence-split
        input, compute, reduce-scatter the output; the same bytes on the wire, but the
        all-gathers move 1 byte an element under :attr:`tp_all_gather_fp8` (the input's
        second all-gather 1 byte under ``precision: fp8``, Transformer Engine's saved fp8
        ``ln_out``, as :func:`sim.tpoverlap.regather_exposed_s` times it). ``block``
        (``attn``, ``mlp bwd``, ...) names the collectives in :attr:`tp_comm_exposed_s`;
        one found there gets its fixed exposed time, and a backward block found there with
        an ``input all-gather`` (:data:`SP_REGATHER_GEMMS`) also its input's second
        all-gather, with that entry's time.
        """
        body = compute if isinstance(compute, list) else [compute]
        if self.tp == 1:
            return body
        nbytes = BF16 * self._bsh
        if self.sequence_parallel:
            exposed = dict(self.tp_comm_exposed_s)
            ag, rs = f"{block} all-gather", f"{block} reduce-scatter"
            regather = f"{block} input all-gather"
            saved = (1.0 if self.precision == "fp8" else BF16) * self._bsh  # TE's fp8 ln_out
            again = ([CommSeg(f"{label} input all-gather", "tp", "all_gather", saved,
                              duration_s=exposed[regather])] if regather in exposed else [])
            return [CommSeg(f"{label} all-gather", "tp", "all_gather",
                            self._tp_gather_bytes * self._bsh, duration_s=exposed.get(ag)),
                    *body, *again,
                    CommSeg(f"{label} reduce-scatter", "tp", "reduce_scatter", nbytes,
                            duration_s=exposed.get(rs))]
        return [*body, CommSeg(f"{label} all-reduce", "tp", "all_reduce", nbytes,
                               duration_s=dict(self.tp_comm_exposed_s).get(f"{block} all-reduce"))]

    def _layer_forward(self, name: str) -> list[Segment]:
        """Forward of one layer (also a recomputed one): its blocks' GEMMs, memory-bound
        kernels (FP8 weight casts of a forward included, :meth:`_elementwise_forward`) and TP
        collectives."""
        attn, mlp = self._gemms()
        ew_attn, ew_mlp = self._elementwise_forward()
        mlp_seg: ComputeSeg | list[Segment] = replace(mlp, label=f"{name} mlp",
                                                      elementwise_bytes=ew_mlp)
        if self.model.moe is not None:
            mlp_seg = self._moe_body(mlp_seg, f"{name} mlp", backward=False)
        if self.cp > 1:
            attn_body: ComputeSeg | list[Segment] = self._attention_parts(
                replace(attn, elementwise_bytes=ew_attn), self._core_forward_flops(), name,
                backward=False)
        else:
            attn_body = replace(attn, label=f"{name} attn", attn_flops=self._core_forward_flops(),
                                elementwise_bytes=ew_attn)
        return self._blocks(name, attn_body, mlp_seg, backward=False)

    def _blocks(self, name: str, attn: ComputeSeg | list[Segment],
                mlp: ComputeSeg | list[Segment], backward: bool) -> list[Segment]:
        """A layer's attention and MLP blocks with their TP collectives (backward: MLP
        first). With :attr:`ModelSpec.parallel_blocks` both read the same input and their
        outputs are summed before one all-reduce (GPT-NeoX, megatron/model/transformer.py
        ``ParallelTransformerLayer``: ``parallel_output`` on both row-parallel outputs and
        ``output = residual + self.reduce(output)``), so the layer has one TP block."""
        suffix = " bwd" if backward else ""
        first, second = (mlp, attn) if backward else (attn, mlp)
        if self.model.parallel_blocks:
            body = [*(first if isinstance(first, list) else [first]),
                    *(second if isinstance(second, list) else [second])]
            return self._block(f"{name} layer{suffix}", body)
        a, b = ("mlp", "attn") if backward else ("attn", "mlp")
        block = {"attn": self._block, "mlp": self._mlp_block}
        return (block[a](f"{name} {a}{suffix}", first, f"{a}{suffix}")
                + block[b](f"{name} {b}{suffix}", second, f"{b}{suffix}"))

    def _mlp_block(self, label: str, compute: ComputeSeg | list[Segment],
                   block: str = "") -> list[Segment]:
        """A layer's MLP block with its TP collectives: a dense MLP's (:meth:`_block`); a MoE
        layer's under :attr:`_moe_sp` has none of its own (its experts' are inside,
        :meth:`_expert_tp_gather`) unless it has shared experts, whose TP-split MLP
        all-gathers the s/t tokens' input over the attention TP group and reduce-scatters
        its output (core_v0.19.0 megatron/core/transformer/moe/shared_experts.py
        ``SharedExpertMLP.forward``: ``gather_from_sequence_parallel_region`` and
        ``reduce_scatter_to_sequence_parallel_region`` under ``sequence_parallel``), b·s·h
        bf16 each as a dense MLP's."""
        moe = self.model.moe
        if self._moe_sp and moe is not None and not moe.shared_experts:
            return compute if isinstance(compute, list) else [compute]
        return self._block(label, compute, block)

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
            segs += self._module_recompute(name)
        elif self.recompute == "selective-op":
            attn_share, mlp_share, _ = self._op_checkpoint_shares()
            softmax = 0.0 if self._flash else (
                SOFTMAX_PASSES[self.attention] * BF16 * self._scores_elements())
            rec = fuse_compute([scaled(attn, "r", attn_share), scaled(mlp, "r", mlp_share)],
                               f"recompute {name} mm")
            segs += [replace(seg, elementwise_bytes=ew_attn + ew_mlp + softmax) for seg in rec]
        ew_attn, ew_mlp = self._elementwise_backward()
        mlp_seg: ComputeSeg | list[Segment] = scaled(
            mlp, f"{name} mlp bwd", 1 + wg, elementwise_bytes=ew_mlp)
        if self.model.moe is not None:
            mlp_seg = self._moe_body(mlp_seg, f"{name} mlp bwd", backward=True)
        attn_seg = scaled(attn, f"{name} attn bwd", 1 + wg, attn_flops=core,
                           elementwise_bytes=ew_attn)
        attn_body: ComputeSeg | list[Segment] = attn_seg
        if self.cp > 1:
            attn_body = self._attention_parts(replace(attn_seg, attn_flops=0.0), core,
                                              f"{name} bwd", backward=True)
        return segs + self._blocks(name, attn_body, mlp_seg, backward=True)

    @property
    def _recomputed_modules(self) -> frozenset[str]:
        """The :attr:`recompute_modules` that act on this (uniform) layer
        (:func:`workloads.recompute_modules.layer_modules`); none unless ``recompute`` is
        ``selective``."""
        if self.recompute != "selective":
            return frozenset()
        return layer_modules(self.model, self.recompute_modules)

    def _module_recompute(self, name: str) -> list[Segment]:
        """What ``recompute: selective`` reruns before one layer's backward, module by module
        (:attr:`recompute_modules`), MLP side first as the backward meets them.

        ``moe``: the MoE layer's forward (router, dispatch and combine all-to-alls, experts,
        shared experts) with its TP collectives; ``mlp``: a dense layer's MLP forward (its
        norm, GEMMs and activation, not the residual add) with its TP collectives;
        ``shared_experts``: the shared experts' GEMMs and activation, with the TP all-gather
        and reduce-scatter Megatron's ``SharedExpertMLP`` (a TP-split MLP) runs around them;
        ``moe_act``: the routed experts' activation over their rows (memory-bound);
        ``layernorm``: the norms that are modules of their own (MLA's input norm, a MoE
        layer's pre-MLP norm), memory-bound; ``mla_up_proj``: the query and key/value
        up-projection GEMMs and RoPE; ``core_attn``: the attention core's forward (and, for a
        non-flash kernel, the softmax passes and the dropout on the probabilities).

        The checkpointed attention core is Megatron-LM's ``CoreAttention`` (2022,
        megatron/model/transformer.py at 9dc3c42, ``_checkpointed_attention_forward``;
        megatron-core's ``DotProductAttention`` since): QK^T, the fused scale-mask-softmax,
        ``self.attention_dropout(attention_probs)`` and the product with V, so its rerun
        draws the dropout again (:meth:`_attention_dropout_bytes`, as its forward). Korthikanti
        et al. 2022 table 4 measure that rerun at 1.3 ms a layer of their 22B model (13.2 ms
        backward with selective recomputation against 11.9 ms without).
        """
        mods = self._recomputed_modules
        m, t, n = self.model, self.tp, self._tokens
        label = f"recompute {name}"
        attn, mlp = self._gemms()
        ew_mlp = self._elementwise_forward()[1]
        residual = RESIDUAL_BYTES * n * m.hidden_size / self._sp_div
        act_bytes = self.swiglu_bytes if m.gated_mlp else GELU_BYTES
        segs: list[Segment] = []
        if "moe" in mods:
            body = replace(mlp, label=f"{label} mlp", elementwise_bytes=ew_mlp - residual)
            segs += self._mlp_block(f"{label} mlp",
                                    self._moe_body(body, f"{label} mlp", False), "mlp")
        elif "mlp" in mods:
            segs += self._block(f"{label} mlp", replace(mlp, label=f"{label} mlp",
                                                        elementwise_bytes=ew_mlp - residual),
                                "mlp")
        else:
            moe = m.moe
            if "shared_experts" in mods and moe is not None:
                shared = self._shared_expert_gemms()
                if self.precision == "fp8":
                    shared = on_fp8(shared, self.fp8_speedup)
                elementwise = act_bytes * n * moe.shared_experts * moe.expert_ffn_hidden_size / t
                segs += self._block(f"{label} shared experts",
                                    replace(shared, label=f"{label} shared experts",
                                            elementwise_bytes=elementwise), "shared experts")
            if "moe_act" in mods and moe is not None:
                segs.append(ComputeSeg(f"{label} moe act", elementwise_bytes=act_bytes
                                       * self._expert_rows * moe.expert_ffn_hidden_size
                                       / self._etp))
        if "layernorm" in mods:
            norms = (m.mla is not None) + (m.moe is not None)
            norm = NORM_FUSED_BYTES if self.fused_norm else NORM_UNFUSED_BYTES
            segs.append(ComputeSeg(f"{label} norms", elementwise_bytes=norms * norm * n
                                   * m.hidden_size / self._sp_div))
        if "mla_up_proj" in mods:
            segs.append(self._mla_up_gemms(label))
        if "core_attn" in mods:
            softmax = 0.0 if self._flash else (
                SOFTMAX_PASSES[self.attention] * BF16 * self._scores_elements()
                + self._attention_dropout_bytes())
            segs.append(ComputeSeg(f"{label} core", attn_flops=self._core_forward_flops(),
                                   elementwise_bytes=softmax))
        return segs

    def block_segments(self, backward: bool, label: str) -> list[Segment]:
        """One transformer block's forward, or its whole backward (input and weight
        gradients), on one TP rank, without embedding or head: a layer of a multimodal
        model's encoder (:mod:`workloads.encoders`)."""
        if backward:
            return self._layer_backward(label, weight_grad_deferred=False)
        return self._layer_forward(label)

    def _head(self, backward: bool, weight_grad_deferred: bool = False) -> ComputeSeg:
        """Final norm, output projection (vocabulary-parallel) and cross entropy; with D
        multi-token prediction modules (:attr:`workloads.models.ModelSpec.mtp_layers`) the
        projection and the loss run 1 + D times, beside the modules' input work
        (:meth:`_mtp_inputs`)."""
        m, t, n = self.model, self.tp, self._tokens
        passes = 1 + m.mtp_layers
        logits = gemm(n, m.hidden_size, m.vocab_size / t, count=passes)  # vocabulary-parallel
        weights = passes * BF16 * m.hidden_size * m.vocab_size / t
        ce = passes * ((FUSED_CROSS_ENTROPY_BYTES if self.fused_cross_entropy
                        else CROSS_ENTROPY_BYTES) * n * m.vocab_size / self._vocab_div)
        fwd = ComputeSeg("logits+loss", logits[1], weights, elementwise_bytes=ce,
                         gemm_dims=(logits,))
        if m.mtp_layers:
            fwd = fuse_compute([fwd, self._mtp_inputs()], "logits+loss")[0]
        if not backward:
            return fwd
        wg = 0.0 if weight_grad_deferred else 1.0
        return scaled(fwd, "logits bwd", 1 + wg,
                       elementwise_bytes=BACKWARD_ELEMENTWISE * fwd.elementwise_bytes)

    def head_gemm(self) -> ComputeSeg:
        """One pass of the output projection on one TP rank (b·s/cp x h by h x V/t, bf16: the
        output layer is not under FP8): the GEMM the head's backward TP collectives run beside
        (:func:`sim.tpoverlap.head_exposed_s`); its input- and weight-gradient GEMMs do the
        same work."""
        dims = gemm(self._tokens, self.model.hidden_size, self.model.vocab_size / self.tp)
        return ComputeSeg("head", dims[1], gemm_dims=(dims,))

    def _embedding_tp(self, backward: bool) -> list[Segment]:
        """The TP collectives of the vocabulary-parallel input embedding on stage 0 (t > 1),
        b·s·h bf16 elements each. Forward: the partial lookups summed over the TP group, an
        all-reduce (``reduce_from_tensor_model_parallel_region``); under sequence parallelism
        with rotary (not learned) positions a reduce-scatter straight to the s/t shard
        (Megatron-core ``reduce_scatter_embeddings``), else the all-reduce and a local split
        (``scatter_to_sequence_parallel_region``). Backward: nothing without SP (the
        all-reduce's backward is the identity); under SP the gradient's all-gather (the
        backward of either). NVIDIA/Megatron-LM f2e5db4
        megatron/core/tensor_parallel/layers.py ``VocabParallelEmbedding.forward`` and
        megatron/core/models/common/embeddings/language_model_embedding.py; the legacy
        trees (d898a89, 50a4b5f megatron/mpu/layers.py) all-reduce and split."""
        if self.tp == 1:
            return []
        nbytes = BF16 * self._bsh
        if backward:
            return ([CommSeg("embedding bwd all-gather", "tp", "all_gather", nbytes)]
                    if self.sequence_parallel else [])
        if self.sequence_parallel and self.model.position_embedding != "learned":
            return [CommSeg("embedding reduce-scatter", "tp", "reduce_scatter", nbytes)]
        return [CommSeg("embedding all-reduce", "tp", "all_reduce", nbytes)]

    def _head_tp(self, backward: bool, weight_grad_deferred: bool = False
                 ) -> tuple[list[Segment], list[Segment]]:
        """The TP collectives of the vocabulary-parallel output layer on the last stage
        (t > 1), before and after :meth:`_head`'s compute, once per pass of the head
        (1 + :attr:`~workloads.models.ModelSpec.mtp_layers`), b·s·h bf16 elements each.

        The output layer is a column-parallel linear (NVIDIA/Megatron-LM f2e5db4
        megatron/core/tensor_parallel/layers.py ``ColumnParallelLinear.forward`` and
        ``LinearWithGradAccumulationAndAsyncCommunication``; legacy ``parallel_lm_logits``,
        d898a89 megatron/model/language_model.py). Without SP: nothing forward
        (``copy_to_tensor_model_parallel_region``), the input gradient all-reduced in the
        backward. Under SP: the s/t input all-gathered forward; backward, the saved shard
        all-gathered again for the weight gradient (:attr:`sp_regather_input`) and the
        input gradient reduce-scattered. As a layer's QKV / FC1 GEMM, whose autograd
        function it shares: each backward collective found in :attr:`tp_comm_exposed_s`
        (``head bwd all-reduce``, ``head bwd input all-gather``, ``head bwd
        reduce-scatter``, run beside the head's GEMMs) gets its exposed time, none with
        the weight gradient deferred to W. Without :attr:`vocab_parallel_loss` the logits
        are also all-gathered whole (b·s·V bf16) before the loss (its backward a local
        split)."""
        if self.tp == 1:
            return [], []
        passes = 1 + self.model.mtp_layers
        nbytes = BF16 * self._bsh
        sp = self.sequence_parallel
        if not backward:
            before = ([CommSeg("head all-gather", "tp", "all_gather", nbytes)] if sp else [])
            after = ([] if self.vocab_parallel_loss else
                     [CommSeg("logits all-gather", "tp", "all_gather",
                              BF16 * self._tokens * self.model.vocab_size)])
            return before * passes, after * passes
        exposed = {} if weight_grad_deferred else dict(self.tp_comm_exposed_s)
        before, after = [], []
        if sp and self.sp_regather_input:
            before.append(CommSeg("head bwd input all-gather", "tp", "all_gather", nbytes,
                                  duration_s=exposed.get("head bwd input all-gather")))
        if sp:
            after.append(CommSeg("head bwd reduce-scatter", "tp", "reduce_scatter", nbytes,
                                 duration_s=exposed.get("head bwd reduce-scatter")))
        else:
            after.append(CommSeg("head bwd all-reduce", "tp", "all_reduce", nbytes,
                                 duration_s=exposed.get("head bwd all-reduce")))
        return before * passes, after * passes

    def _mtp_inputs(self) -> ComputeSeg:
        """Forward work of the D multi-token prediction modules beyond their transformer
        blocks on one TP rank, as Megatron-core runs each (core_v0.14.0,
        megatron/core/transformer/multi_token_prediction.py ``MultiTokenPredictionLayer``:
        ``enorm`` of the shifted tokens' embeddings and ``hnorm`` of the hidden states, their
        concatenation through ``eh_proj``, a column-parallel 2h x h linear under the same FP8
        context as the layers, and ``final_layernorm`` before the shared head,
        megatron/core/models/gpt/gpt_model.py ``_postprocess``, which runs ``output_layer`` and
        the loss again for each module: :meth:`_head`). The embedding lookup and eh_proj's
        TP gathers (b·s·2h and b·s·h bf16) are not timed."""
        m, t, n = self.model, self.tp, self._tokens
        h, d = m.hidden_size, m.mtp_layers
        proj = gemm(n, 2 * h, h / t, count=d)
        norm = (NORM_FUSED_BYTES if self.fused_norm else NORM_UNFUSED_BYTES) * n * h
        seg = ComputeSeg("mtp inputs", proj[1], BF16 * d * (2 * h * h / t + n * (2 * h + h / t)),
                         elementwise_bytes=3 * d * norm / self._sp_div,
                         gemm_dims=(proj,))
        return on_fp8(seg, self.fp8_speedup) if self.precision == "fp8" else seg


TP_OVERLAP_GEMMS: dict[str, tuple[str, str]] = {
    "attn all-gather": ("qkv", "qkv_fprop"),
    "attn reduce-scatter": ("proj", "proj_fprop"),
    "mlp all-gather": ("fc1", "fc1_fprop"),
    "mlp reduce-scatter": ("fc2", "fc2_fprop"),
    "mlp bwd all-gather": ("fc2", "fc2_dgrad"),
    "mlp bwd reduce-scatter": ("fc1", "fc1_wgrad"),
    "attn bwd all-gather": ("proj", "proj_dgrad"),
    "attn bwd reduce-scatter": ("qkv", "qkv_wgrad"),
}
"""Each sequence-parallel collective of a layer, the GEMM it is pipelined with under TP
communication overlap (:meth:`TransformerCosts.tp_overlap_gemms`) and Transformer Engine's
name for that overlap (``transformer_engine/pytorch/module/base.py`` ``initialize_ub``): the
forward all-gathers feed the QKV and FC1 GEMMs, the reduce-scatters drain proj and FC2; in
the backward the gathered output gradient feeds the FC2 / proj input-gradient GEMM and the
FC1 / QKV input gradient is reduce-scattered behind that layer's weight-gradient GEMM."""

SP_REGATHER_GEMMS: dict[str, tuple[str, str]] = {
    "attn bwd input all-gather": ("qkv", "qkv_dgrad"),
    "mlp bwd input all-gather": ("fc1", "fc1_dgrad"),
}
"""The backward's second all-gather in each block of a dense layer under sequence
parallelism (:attr:`TransformerCosts.sp_regather_input`): the QKV and FC1 GEMMs saved their
s/t input shard (the norm's output), and their weight gradients need it whole again. It runs
beside that GEMM's input-gradient GEMM, Transformer Engine's ``qkv_dgrad`` / ``fc1_dgrad``
(transformer_engine/pytorch/module/layernorm_linear.py and layernorm_mlp.py: ``ub_bulk_dgrad``
under userbuffers, else ``gather_along_first_dim(ln_out, ..., async_op=True)`` before the
dgrad GEMM and its ``wait()`` after)."""
