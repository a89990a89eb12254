"""Activation memory of the transformer cost model: stashed and working bytes. Pure.

Sources:
- Saved activations: Korthikanti et al. 2022 (MLSys'23) sec. 4, eq. 1-4,
  rederived tensor by tensor so that GQA and SwiGLU MLPs are counted (the
  derivation reproduces their 34·sbh + 5·a·s²·b for GPT exactly).
"""

from __future__ import annotations

from dataclasses import replace

from workloads.costs import BF16
from workloads.kernels import per_instance, per_instance_by
from workloads.schedules import BACKWARD, FORWARD, Op

FP32 = 4


class ActivationMemory:
    """Activation memory of a :class:`~workloads.transformer.TransformerCosts` (a mixin of
    it): what a layer stashes per micro-batch for its backward under each recomputation,
    what a stage keeps per in-flight micro-batch (the logits on the last), and the working
    memory an op holds only while it runs."""

    @per_instance
    def layer_activation_bytes(self) -> float:
        """Bytes one layer keeps per micro-batch for its backward, on one TP rank.

        In units of s·b·h bytes (bf16): replicated across TP (split by t under
        SP): the two norm inputs (4), the QKV and MLP GEMM inputs (4), dropout
        masks (2, GPT style only, unless :attr:`dropout` is off); an eager (unfused)
        RMSNorm keeps, instead of
        its bf16 input, the fp32 copy of it that ``pow`` and the multiply save
        (4) and the normalised bf16 tensor that the weight multiply saves (2),
        8 more for the two norms (PyTorch autograd's saved tensors of the LLaMA
        reference RMSNorm, ``x.float()``, ``x.pow(2).mean()``, ``x * rsqrt``,
        ``weight * y.to(bf16)``; a fused kernel saves its input and the per-token
        rstd only). Split by t: Q, K, V (2·(h + 2·kv)/h), the
        attention output (2), the MLP intermediates (GeLU: fc1 output and GeLU
        output, 4·f/h; SwiGLU: the gate and up projections' outputs and their
        product silu(gate)·up, the input of the down projection, 6·f/h: the
        backward of silu(g)·u needs g and u only, silu(g) is recomputed from g
        inside the fused kernel, as Megatron-LM's swiglu saves just its input;
        :attr:`swiglu_stash_bytes`·f/h in all, 8·f/h eager, which keeps silu(g) too; 4·f/h
        compiled, gate and up, from which the backward recomputes the product:
        :attr:`swiglu_saves_product`). Score
        matrix 5·a·s/h (Korthikanti's softmax, dropout mask and output) unless
        the attention kernel is flash or attention is recomputed. Full
        recomputation keeps only the layer input (2). For GPT (kv = h, f = 4h)
        this is exactly Korthikanti's s·b·h·(10 + 24/t + 5·a·s/(h·t)). MoE: the MLP
        intermediates are per routed row (k·max(c, 1) rows a token, expert inner size),
        plus the copies of the MLP input the experts' first GEMM keeps, gathered over the
        expert TP group after the dispatch (2·k·max(c, 1)·e/t); shared experts keep
        their intermediates for every token. Q, K, V and the attention output are a·d wide
        where the head size d is explicit; under MLA they are the materialised per-head
        queries, keys and values, and the latents are kept too (:meth:`_latent_bytes`).
        With CP, s·b·h is
        the GPU's s/cp tokens. With :attr:`sp_saves_gathered_input`, SP splits only the
        norm inputs (4, and the eager norm's 8): the two GEMM inputs (4) stay whole.
        Parallel attention and MLP (:attr:`ModelSpec.parallel_blocks`): both norms read the
        layer input, which is kept once (2 instead of 4). FP8 (:attr:`precision`): the QKV
        and first MLP GEMMs keep their inputs in fp8 (TransformerEngine's LayerNormLinear and
        LayerNormMLP save ``ln_out`` cast to fp8), 2 instead of 4, and the down projection
        its input (the GeLU output or silu(gate)·up, 2·f/h) in fp8, half of it (none where it
        is recomputed, :attr:`swiglu_saves_product`); the
        attention output stays bf16 (the flash kernel keeps it for its own backward). A MoE
        layer under FP8 keeps its MLP input in bf16 (the router saves it as it is,
        megatron/core/transformer/moe/moe_utils.py ``RouterGatingLinearFunction``, and the
        shared experts' first GEMM is set to save that same tensor, shared_experts.py
        ``set_save_original_input``) and the dispatched copies in fp8 (the grouped GEMM
        saves its quantised input), 1 instead of 2.

        ``recompute: selective`` drops what its :attr:`recompute_modules` recompute:
        ``core_attn`` the score matrix; ``mla_up_proj`` Q, K and V (and the latents' second,
        normalised copy); ``layernorm`` the outputs of the separate norms (MLA's input norm:
        the down-projections' input; a MoE layer's pre-MLP norm: the router's input);
        ``mlp`` a dense layer's MLP input and intermediates; ``moe`` the dispatched copies and
        every expert intermediate; ``moe_act`` the routed rows' activation output (the
        experts' second GEMM is set to save its bf16 input, which the checkpoint frees, so
        nothing is left in fp8 either); ``shared_experts`` the shared experts' intermediates.
        """
        m, t = self.model, self.tp
        m.require_uniform()
        if self.recompute == "full":
            return BF16 * self._bsh / self._sp_div
        if self.recompute == "selective-op":
            return self._op_checkpoint_shares()[2]
        dropout = 2 if m.norm == "layernorm" and self.dropout else 0
        eager_norm = 8 if m.norm == "rmsnorm" and not self.fused_norm else 0
        fp8 = self.precision == "fp8"
        mods = self._recomputed_modules
        gemm_input = 1.0 if fp8 else 2.0
        attn_input = 0.0 if "layernorm" in mods and m.mla is not None else gemm_input
        mlp_input = gemm_input
        if m.moe is not None and fp8:  # the router saves the norm output as it is, bf16
            mlp_input = 2.0
        if "mlp" in mods or ("layernorm" in mods and m.moe is not None):
            mlp_input = 0.0
        gemm_inputs = attn_input + mlp_input  # the QKV and first MLP GEMMs' inputs
        norm_inputs = 2.0 if m.parallel_blocks else 4.0
        replicated = (norm_inputs + gemm_inputs + dropout + eager_norm) / self._sp_div
        if self.sequence_parallel and self.sp_saves_gathered_input:
            # the two GEMM inputs are kept gathered, not as s/t shards
            replicated += gemm_inputs * (1 - 1 / self._sp_div)
        ratio = 0.0 if "mlp" in mods else m.ffn_hidden_size / m.hidden_size
        act_out = 0.0
        if m.moe is not None:  # per routed row (and shared expert), and the dispatched copies
            whole = "moe" in mods
            rows = 0.0 if whole else m.moe.top_k * m.moe.load_factor(self.ep)
            shared = 0.0 if whole or "shared_experts" in mods else m.moe.shared_experts
            ratio = m.moe.expert_ffn_hidden_size / m.hidden_size * (rows + shared)
            # the experts' first GEMM keeps its input, the copies gathered over expert TP
            replicated += (1 if fp8 else 2) * rows * self._etp / self.tp
            if "moe_act" in mods:  # the routed rows' activation output
                act_out = (1 if fp8 else 2) * m.moe.expert_ffn_hidden_size / m.hidden_size * rows
        if m.mla is not None:
            replicated += self._latent_bytes(mods) / m.hidden_size
        mlp = (self.swiglu_stash_bytes if m.gated_mlp else 4) * ratio - act_out
        if fp8 and (self.swiglu_saves_product or not m.gated_mlp):
            mlp -= ratio  # the down projection's input (2 of the 6 or 4) in fp8
        qkv = 0.0 if "mla_up_proj" in mods else 2 * (m.q_dim + 2 * m.kv_dim) / m.hidden_size
        split = (qkv + 2 * m.attn_out_dim / m.hidden_size + mlp) / t
        scores = 0.0
        if not self._flash and "core_attn" not in mods:
            keys = m.seq_length * self.seq_window[1]  # a sequence chunk's prefix
            scores = 5 * m.num_attention_heads * keys / m.hidden_size / t
        return (replicated + split + scores) * self._bsh

    def _latent_bytes(self, mods: frozenset[str]) -> float:
        """MLA's stash of the latents per token (bytes), on one TP rank.

        The down-projections are replicated and, under SP, run on the s/t local tokens
        (Megatron-LM multi_latent_attention.py: ``q_compressed``, ``kv_compressed``
        ``[s / TP, b, ...]``), so the latents are split like the layer input. Each up-
        projection is a Transformer Engine LayerNormLinear (the latent norms fused in,
        gpt_layer_specs.py with ``qk_layernorm``), which saves its input and its normalised
        input: 2 + 2 bytes per latent element (the normalised one in fp8, 1, under FP8).
        With ``mla_up_proj`` the up-projections run under CheckpointWithoutOutput, which
        saves only its inputs: the latents once (2) and the rotary key, gathered over
        TP under SP (2·d_h^R, not split).
        """
        m = self.model
        mla = m.mla
        assert mla is not None
        latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank
        if "mla_up_proj" in mods:
            return 2 * latents / self._sp_div + 2 * mla.qk_rope_head_dim
        normed = 1.0 if self.precision == "fp8" else 2.0
        return (2 + normed) * latents / self._sp_div

    def _op_checkpoint_shares(self) -> tuple[float, float, float]:
        """torchtitan's op-level selective activation checkpointing (``mode = "selective"``,
        ``selective_ac_option = "op"``; torchtitan/distributed/activation_checkpoint.py,
        ``_get_custom_policy``): of a layer's ops it saves the outputs of the attention kernel
        and of every other matmul, counted in call order (the 1st, 3rd, ...: wq, wv, w1, w2 of
        a SwiGLU Llama layer; wq, wv, fc1 of a GeLU one), and recomputes the rest in the
        backward. Returns (share of the attention block's GEMM FLOPs recomputed: wk and wo,
        (kv + o)/(q + 2·kv + o); share of the MLP's: w3 of three matrices, or fc2 of two;
        bytes a layer keeps per micro-batch: the layer input, 2·h, the attention output,
        2·o/t, and the saved matmul outputs, bf16). The h-wide outputs (wo, w2) are kept at
        the layer input's split (÷t under SP). MoE MLP widths are per routed row; MLA is
        counted as its query and key/value widths.
        """
        m, t, sp = self.model, self.tp, self._sp_div
        h, q, kv, o = m.hidden_size, m.q_dim, m.kv_dim, m.attn_out_dim
        f = m.ffn_hidden_size
        rows = 1.0
        if m.moe is not None:
            f = m.moe.expert_ffn_hidden_size
            rows = m.moe.top_k * m.moe.load_factor(self.ep) + m.moe.shared_experts
        # matmul output widths per token, in call order (the MLP's per routed row)
        widths = [q / t, kv / t, kv / t, h / sp]
        widths += ([rows * f / t, rows * f / t, h / sp] if m.gated_mlp
                   else [rows * f / t, h / sp])
        saved = sum(widths[0::2]) + h / sp + o / t
        attn_share = (kv + o) / (q + 2 * kv + o)
        mlp_share = 1 / m.mlp_matrices
        return attn_share, mlp_share, BF16 * saved * self._tokens

    @per_instance
    def _unrecomputed_layer_bytes(self) -> float:
        """One layer's activation bytes without recomputation (:meth:`transient_bytes`: the
        gradients flowing through a layer), kept on the instance (a cost model made by
        ``replace`` per call took ~40 us of every op's memory)."""
        return replace(self, recompute="none").layer_activation_bytes()

    def transient_bytes(self, op: Op) -> float:
        """Working memory an op holds only while it runs, on one TP rank.

        Backward: the gradients flowing through one layer, about one layer's
        activations, plus with full recomputation the recomputed layer's
        activations. Last stage, forward and backward: one fp32 b·s·V/t buffer of
        the vocabulary-parallel cross entropy (forward: its exponentials, or
        :attr:`vocab_parallel_loss_buffers` of them with t > 1;
        backward: the logits' gradient), 4·b·s·V/t bytes; the fp32 logits
        themselves are stashed activations (:meth:`activation_bytes_per_mb`) and
        are not counted again here. Without the vocabulary-parallel loss the
        backward holds two such fp32 buffers over the gathered logits, 8·b·s·V
        bytes: PyTorch's ``cross_entropy`` backward materialises the dense
        gradient of its ``nll_loss`` and then writes the ``log_softmax`` gradient
        beside it (Megatron's fused vocabulary-parallel loss computes the gradient
        in place of its saved softmax).
        ZeRO-3: the gathered parameters and unreduced gradients
        (:meth:`zero3_working_bytes`). Meta's all-gather CP: the gathered K and V
        (:meth:`cp_gathered_bytes`). A sequence chunk's are its chunk's (:meth:`seq_chunk`).

        The last stage's backward runs in two phases: the loss's backward (its buffers
        above, beside the stashed logits) and then the layers' (their working memory,
        once the loss's backward has freed the logits); its transient memory is the
        larger of the two, not their sum. A :attr:`fused_cross_entropy` holds no fp32 buffer:
        nothing more forward, its bf16 gradient (2·b·s·V/t) backward. With
        :attr:`kept_stage_outputs` the last stage
        also holds that many earlier micro-batches' bf16 logits (2·b·s·V/t bytes each)
        in both its forward and backward; with :attr:`stage_output_buffered` the loss's
        backward frees only the fp32 logits, the bf16 ones stay for the layers' phase.
        """
        if op.seq >= 0 and self.seq_chunks > 1:
            return self.seq_chunk(op.seq).transient_bytes(op)
        runs = self._runs(op.stage)
        layer = max(c._unrecomputed_layer_bytes() for c, _ in runs)
        total = (self.zero3_working_bytes(op) + self.unreduced_grad_bytes(op)
                 + self.cp_gathered_bytes(op))
        full = any(c.recompute in ("full", "selective-op") for c, _ in runs)
        layers = layer * (2 if full else 1) if op.kind == BACKWARD else 0.0
        if op.stage != len(self.stage_layers) - 1 or op.kind not in (FORWARD, BACKWARD):
            return total + layers
        logits = self._tokens * self.model.vocab_size / self._vocab_div
        total += self.kept_stage_outputs * BF16 * logits
        if self.fused_cross_entropy:  # no fp32 buffer forward; a bf16 gradient backward
            if op.kind == FORWARD:
                return total
            return total + max(BF16 * logits, layers - BF16 * logits)
        if op.kind == FORWARD:
            buffers = self.vocab_parallel_loss_buffers if self._vocab_div > 1 else 1.0
            return total + buffers * FP32 * logits
        loss = (1 if self.vocab_parallel_loss else 2) * FP32 * logits
        # the loss's backward runs first and frees the stashed logits (bf16 and fp32,
        # :meth:`activation_bytes_per_mb`) before the layers' backward needs its memory;
        # bf16 ones left in the framework's pipeline buffer stay
        freed = FP32 if self.stage_output_buffered else BF16 + FP32
        return total + max(loss, layers - freed * logits)

    def cp_gathered_bytes(self, op: Op) -> float:
        """With :attr:`cp_kv_all_gather` (cp > 1): the whole sequence's K and V that one
        layer's attention holds while it runs, on one TP rank, bf16: cp times a pass
        (:meth:`_kv_pass_bytes`) in a forward, twice that in a backward, which gathers K and
        V again and accumulates dK and dV over the whole sequence before reduce-scattering
        them. Transformer Engine's implementation of Dubey et al. 2024's CP
        (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
        ``AttnFuncWithCPAndKVAllGather``, which cites their sec. 3.3.2) saves only the local
        K and V for the backward (``ctx.save_for_backward(q, k, v, ...)``) and gathers them
        again there (``k_ag, _ = gather_along_first_dim(k, ctx.cp_group)``) into full-length
        ``dk``, ``dv`` buffers: working memory of one layer at a time, no stash. 0 for a
        stage without layers, a ``W`` op, or Megatron-LM's ring."""
        if (not self.cp_kv_all_gather or self.cp == 1 or op.kind not in (FORWARD, BACKWARD)
                or not self._stage_layers(op.stage)):
            return 0.0
        return self.cp * self._kv_pass_bytes() * (2 if op.kind == BACKWARD else 1)

    @per_instance_by
    def activation_bytes_per_mb(self, stage: int) -> float:
        """Activations a stage keeps per in-flight micro-batch (last stage adds the logits).

        The last stage holds bf16 logits and their fp32 copy for the loss,
        6·b·s·V/t bytes, until its backward (6·b·s·V without the vocabulary-parallel
        loss: the gathered logits); with :attr:`fused_cross_entropy` only the bf16 logits,
        2·b·s·V/t; the same again for each multi-token prediction module's loss
        (:attr:`workloads.models.ModelSpec.mtp_layers`). Kept on the instance per stage
        (:func:`~workloads.kernels.per_instance_by`: each op of the stage asks, and the
        memory statistics).
        """
        total = sum(n * c.layer_activation_bytes() for c, n in self._runs(stage))
        if stage == len(self.stage_layers) - 1:
            kept = BF16 if self.fused_cross_entropy else BF16 + FP32
            passes = 1 + self.model.mtp_layers  # each multi-token prediction loss keeps its own
            total += passes * kept * self._tokens * self.model.vocab_size / self._vocab_div
        return total
