"""Memory-bound kernels of the transformer cost model: HBM bytes per element. Pure.

The bytes each memory-bound kernel of a layer moves (read + write) per element, per forward
pass (the constants below), and what one layer's kernels move on one TP rank, the
framework's FP8 casts included (:class:`ElementwiseWork`).
"""

from __future__ import annotations

from workloads.costs import BF16
from workloads.kernels import per_instance

# Bytes moved per element by memory-bound kernels (read + write), per forward pass.
NORM_FUSED_BYTES = 4.0
"""Fused RMSNorm/LayerNorm kernel: read x, write y (bf16)."""
NORM_UNFUSED_BYTES = 36.0
"""PyTorch eager RMSNorm: cast to fp32, square, mean, rsqrt-multiply, weight, cast back."""
RESIDUAL_BYTES = 6.0
"""Residual add: read two bf16 tensors, write one."""
ROPE_BYTES = 20.0
"""Eager rotary embedding on q and k: rotate-half (slice, negate, concat), two mults, add."""
ALIBI_PASSES = 2.0
"""Passes over the b·a·s² score matrix (bf16) that adding ALiBi's bias costs non-flash
attention (read and write; FlashAttention-2 adds it inside the kernel, ``alibi_slopes``)."""
SWIGLU_BYTES = 10.0
"""silu(gate) * up: read gate, write silu, read silu and up, write product (per ffn element)."""
GELU_BYTES = 4.0
"""GeLU: read, write (per ffn element)."""
SOFTMAX_PASSES = {"unfused": 8.0, "fused": 2.0}
"""Passes over the b·a·s² score matrix (bf16) of non-flash attention: scale, mask, softmax."""
ATTENTION_DROPOUT_BYTES = 5.0
"""Non-flash attention's dropout on the b·a·s² probabilities, bytes an element forward:
Megatron-LM's ParallelAttention (megatron/model/transformer.py, 2021; CoreAttention later, and
Megatron-DeepSpeed's copy) runs ``attention_probs = self.attention_dropout(attention_probs)``
after its fused scale-mask-softmax, which does not drop out itself, with --attention-dropout
0.1 by default (megatron/arguments.py); PyTorch's CUDA dropout (``_fused_dropout``, PyTorch
1.8-1.11) reads the bf16 probabilities (2), writes them (2) and a bool mask (1). FlashAttention
drops out inside its kernel."""
ATTENTION_DROPOUT_BACKWARD_BYTES = 5.0
"""Its backward (``_masked_scale``): reads the gradient (2) and the mask (1), writes (2)."""
CROSS_ENTROPY_BYTES = 16.0
"""Vocabulary-parallel cross entropy over fp32 logits: max, exp-sum, gather, gradient."""
FUSED_CROSS_ENTROPY_BYTES = 2.0
"""A fused cross-entropy kernel over the bf16 logits
(:attr:`workloads.transformer.TransformerCosts.fused_cross_entropy`): it reads each logit once
forward (its fp32 math stays in registers); backward reads it again and writes its bf16
gradient (``BACKWARD_ELEMENTWISE`` times this)."""
FP8_AMAX_BYTES = 2.0
"""Per-tensor current scaling's amax pass before each cast (Transformer Engine 2.x
``Float8CurrentScalingQuantizer::quantize``, transformer_engine/pytorch/csrc/quantizer.cpp:
``nvte_compute_amax`` over the bf16 input, then the scale, then ``nvte_quantize_v2``): one more
read of the bf16 element, 2 bytes."""
FP8_NORM_QUANTIZE_BYTES = 3.0
"""Current scaling after a norm: Transformer Engine 2.x's ``layernorm_fwd`` / ``rmsnorm_fwd``
(transformer_engine/pytorch/csrc/extensions/normalization.cpp, v2.8) cannot scale inside the
norm kernel without the amax, so it writes the bf16 output with its amax
(``FUSED_NORM_AMAX_FP8``) and ``quantize_with_amax`` casts it: read 2, write 1 an element
beyond the norm's own bytes."""
FP8_TRANSPOSE_BYTES = 2.0
"""An fp8 transpose (TransformerEngine's ``fp8_transpose``): read 1 byte, write 1, per element."""
FP8_GELU_CAST_BYTES = 3.0
"""GeLU writing its output in fp8 for the next GEMM (Transformer Engine's ``LayerNormMLP``
forward, ``fp8_gelu`` in v0.8's module.py, ``tex.gelu`` with the fp8 scaling meta at 09ba842):
read the first GEMM's bf16 output (2), write fp8 (1), per ffn element."""
FP8_DGELU_CAST_BYTES = 6.0
"""Its backward, ``fp8_cast_transpose_bgrad_dgelu_fused``: read the output gradient of the
activation and the saved bf16 input (2 + 2), write the fp8 input gradient and its transpose
(1 + 1), the bias gradient reduced in the same pass, per ffn element."""
FP8_WEIGHT_CASTS = ("step", "microbatch", "float8-linear", "none")
"""How a framework casts each FP8 linear's bf16 weight to fp8
(:attr:`workloads.transformer.TransformerCosts.fp8_weight_casts`): with its transpose once a
step (Transformer Engine's ``is_first_microbatch`` cache), with its transpose in every forward
(a TE module called without it), as torchao's ``Float8Linear`` does (its amax and cast in every
forward, an fp8 transpose backward, or only that transpose when FSDP gathered it in fp8),
or not counted: the per-forward ones are ``ElementwiseWork._fp8_weight_cast_pair``'s."""
BACKWARD_ELEMENTWISE = 2.0
"""Backward of a memory-bound kernel moves about twice its forward bytes."""
CP_RING_COPY_BYTES = 4.0
"""A bf16 copy inside Transformer Engine's ring attention (``torch.cat``, ``.contiguous()``,
``copy_``): read 2 bytes, write 2, per element."""
CP_RING_ADD_BYTES = 6.0
"""A bf16 accumulation inside it (``out.add_(out_per_step * exp(lse_step - lse))``,
``dq.add_(dq_)``, ``dkv.add_(dkv_)``; jit-fused): read both operands, write one, per element."""
CP_RING_CAUSAL_SHARE = 0.75
"""Share of a rank's local queries (or of the received K/V chunk) a ring step after the first
touches, the mean over the ranks of the load-balanced causal split: a step either runs all
the rank's queries against the first half of the received chunk (``i <= rank`` forward) or
the second half of its queries against the whole chunk (``i > rank``), one of each kind on
average over the ranks, and the step's merge covers the whole output in the first case and
its second half in the other."""


class ElementwiseWork:
    """The memory-bound kernels of a :class:`~workloads.transformer.TransformerCosts`'s layer
    (a mixin of it): norms, residual adds, rotary embedding, a non-flash attention's softmax
    passes, the MLP activation, MoE permutes, attention layout copies and the FP8 scaling and
    casting kernels, forward and backward."""

    @per_instance
    def _elementwise_forward(self) -> tuple[float, float]:
        """Bytes of memory-bound kernels of one layer forward, a recomputed one too:
        (attention block, MLP block), the forward's FP8 weight casts included
        (:meth:`_fp8_weight_cast_pair`)."""
        kern_attn, kern_mlp = self._elementwise_kernels()
        weight_attn, weight_mlp = self._fp8_weight_cast_pair()[0]
        return kern_attn + weight_attn, kern_mlp + weight_mlp

    @per_instance
    def _elementwise_kernels(self) -> tuple[float, float]:
        """Bytes of the memory-bound kernels of one layer forward other than the FP8 weight
        casts, (attention block, MLP block): what :meth:`_elementwise_forward` and
        :meth:`_elementwise_backward` build on."""
        m, t, n = self.model, self.tp, self._tokens
        h = m.hidden_size
        norm = (NORM_FUSED_BYTES if self.fused_norm else NORM_UNFUSED_BYTES) * n * h / self._sp_div
        residual = RESIDUAL_BYTES * n * h / self._sp_div
        # the attention block's sum not read back by the MLP block's norm, fused with it
        fused_read = (BF16 * n * h / self._sp_div
                      if self.residual_norm_fused and not m.parallel_blocks else 0.0)
        rope = (self._rope_bytes * n * (m.q_dim + m.kv_dim) / t if m.position_embedding == "rope"
                else 0.0)
        softmax = 0.0 if self._flash else (
            (SOFTMAX_PASSES[self.attention] + (ALIBI_PASSES if m.position_embedding == "alibi"
                                               else 0.0)) * BF16 * self._scores_elements()
            + self._attention_dropout_bytes())
        act_bytes = (FP8_GELU_CAST_BYTES if self._fp8_act_fused
                     else self.swiglu_bytes if m.gated_mlp else GELU_BYTES)
        if m.moe is not None:  # activation on the routed rows (and every token's shared
            # experts), plus permute and unpermute; the rows' f_e/e wide activations are
            # routed_rows·f_e/t whatever the expert TP degree e
            rows = self._expert_rows
            act = (act_bytes * (self._routed_rows + n * m.moe.shared_experts)
                   * m.moe.expert_ffn_hidden_size / t + 2 * 2 * BF16 * rows * m.hidden_size)
        else:
            act = act_bytes * n * m.ffn_hidden_size / t
        # the Triton kernel reads the padded (b, s, h, d) layout as it is: no packing copies
        copies = (self.attention_copy_bytes * n * (m.q_dim + 2 * m.kv_dim + m.attn_out_dim) / t
                  if self.attention_copy_bytes and self.attention != "flash-triton" else 0.0)
        cast_attn, cast_mlp = self._fp8_cast_pair()[0]
        return (norm + residual + rope + softmax + copies + cast_attn,
                norm - fused_read + residual + act + cast_mlp)

    @per_instance
    def _fp8_weight_cast_pair(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """HBM bytes of the kernels that prepare one layer's fp8 weights on one GPU inside its
        forward and its backward, ((attention block, MLP block) forward, (the same)
        backward), as :attr:`fp8_weight_casts` says under ``precision: fp8`` with cast
        kernels (:attr:`fp8_cast_bytes`; none otherwise). The one place the per-forward
        casts enter a layer: :meth:`_elementwise_forward` adds the forward's (a recomputed
        forward casts again, it is the forward's bytes), :meth:`_elementwise_backward` the
        backward's.

        ``step`` and ``none``: nothing here (``step``'s casts are step-end work,
        :meth:`stage_fp8_weight_cast_bytes`). ``microbatch``: forward, Transformer Engine's
        cast and transpose of every weight (:meth:`fp8_weight_cast_bytes`); nothing
        backward, which uses the transposes cast forward. ``float8-linear`` (torchao's
        ``Float8Linear``; a dense layer without MLA only), each its linear weights (the
        block's parameters on the rank, :meth:`fp8_weight_elements`) times:

        - the weights gathered in fp8 (:attr:`_fp8_gathered`): nothing forward (the
          all-gather brought them cast, torchao float8_linear.py ``Float8Linear.forward``:
          ``tensor_already_casted_to_fp8(weight)`` skips the amax and the cast) and, backward,
          the input-gradient GEMM's column-major copy of the row-major fp8 weight,
          :data:`FP8_TRANSPOSE_BYTES` (float8_ops.py ``preprocess_addmm``:
          ``b_data.t().contiguous().t()``);
        - compiled (:attr:`fp8_casts_compiled`): forward, the weight's amax, which no
          producer in the block can absorb (:data:`FP8_AMAX_BYTES`), and the cast writing
          the row- and column-major copies (:attr:`fp8_cast_bytes`); nothing backward, as
          torchao's roofline counts it (roofline_utils.py ``get_float8_mem_sympy``:
          ``fwd_fp8_weight_mem`` with ``fuse_with_prev=False``, ``gi_fp8_weight_mem = 0``);
        - eager: forward the cast with its amax (:attr:`fp8_cast_bytes`), backward the
          transpose (:data:`FP8_TRANSPOSE_BYTES`)."""
        m = self.model
        if self.fp8_weight_casts == "microbatch":
            return self.fp8_weight_cast_bytes("microbatch"), (0.0, 0.0)
        if (self.precision != "fp8" or self.fp8_weight_casts != "float8-linear"
                or not self.fp8_cast_bytes
                or m.moe is not None or m.mla is not None):
            return (0.0, 0.0), (0.0, 0.0)
        if self._fp8_gathered:
            fwd, bwd = 0.0, FP8_TRANSPOSE_BYTES
        elif self.fp8_casts_compiled:
            fwd, bwd = self.fp8_cast_bytes + FP8_AMAX_BYTES, 0.0
        else:
            fwd, bwd = self.fp8_cast_bytes, FP8_TRANSPOSE_BYTES
        attn, mlp = self.fp8_weight_elements()
        return (fwd * attn, fwd * mlp), (bwd * attn, bwd * mlp)

    @per_instance
    def _fp8_cast_pair(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """HBM bytes of the FP8 scaling and casting kernels of one dense layer on one TP rank,
        ((attention block, MLP block) forward, (the same) backward): none without
        ``precision: fp8``, :attr:`fp8_cast_bytes` or a dense layer.

        Every input cast (:attr:`fp8_norm_cast_fused` False): each of the four GEMMs' inputs
        forward, the backward twice the forward (:data:`BACKWARD_ELEMENTWISE`).
        TransformerEngine as Megatron-core's layer spec runs it (True): forward, the output
        projection's input (o/t an element of a token) and the second MLP GEMM's (f/t), and
        under :attr:`fp8_current_scaling` the two norm outputs' quantize pass
        (:data:`FP8_NORM_QUANTIZE_BYTES`, on the norm's s/t tokens under SP);
        backward, every GEMM's output gradient cast and transposed (QKV (q + 2·kv)/t, output
        h, first MLP f·(matrices − 1)/t, second MLP h) and the two norm outputs transposed
        for the weight gradients (h each, :data:`FP8_TRANSPOSE_BYTES`).

        Compiled (:attr:`fp8_casts_compiled`, the norm not fused with the casts): forward,
        each GEMM's input once (QKV h, output o/t, first MLP h, second MLP f/t: the QKV and
        first MLP GEMMs' shared inputs cast once, Inductor's common-subexpression
        elimination); backward, every GEMM's output gradient (as Transformer Engine's, without
        the transposes, whose column-major copies the forward casts wrote).

        Each cast moves :attr:`_fp8_cast_element_bytes` an element. A MoE layer's attention
        block is a dense layer's; its MLP block is :meth:`_moe_fp8_casts`."""
        m, t, n = self.model, self.tp, self._tokens
        if self.precision != "fp8" or not self.fp8_cast_bytes:
            return (0.0, 0.0), (0.0, 0.0)
        c, h = self._fp8_cast_element_bytes, m.hidden_size
        if not self.fp8_norm_cast_fused:
            fwd = (c * n * (h + m.attn_out_dim / t), c * n * (h + m.ffn_hidden_size / t))
            bwd = (BACKWARD_ELEMENTWISE * fwd[0], BACKWARD_ELEMENTWISE * fwd[1])
            if self.fp8_casts_compiled:
                mid = m.ffn_hidden_size * (m.mlp_matrices - 1) / t
                bwd = (c * n * ((m.q_dim + 2 * m.kv_dim) / t + h), c * n * (mid + h))
        else:
            mid = m.ffn_hidden_size * (m.mlp_matrices - 1) / t
            normed = (FP8_NORM_QUANTIZE_BYTES * n * h / self._sp_div
                      if self.fp8_current_scaling else 0.0)
            f = n * m.ffn_hidden_size / t
            fused = self._fp8_act_fused
            fwd = (c * n * m.attn_out_dim / t + normed, (0.0 if fused else c * f) + normed)
            act_grad = ((FP8_DGELU_CAST_BYTES + FP8_TRANSPOSE_BYTES) * f if fused
                        else c * n * mid)
            bwd = (c * n * ((m.q_dim + 2 * m.kv_dim) / t + h) + FP8_TRANSPOSE_BYTES * n * h,
                   act_grad + c * n * h + FP8_TRANSPOSE_BYTES * n * h)
        if m.moe is None:
            return fwd, bwd
        moe_fwd, moe_bwd = self._moe_fp8_casts()
        return (fwd[0], moe_fwd), (bwd[0], moe_bwd)

    @property
    def _fp8_act_fused(self) -> bool:
        """Whether the MLP's GeLU writes the second GEMM's fp8 input itself
        (:attr:`fp8_act_cast_fused`, under ``precision: fp8`` with TE's fused norm casts, for
        a dense GeLU MLP): forward :data:`FP8_GELU_CAST_BYTES` an ffn element and no cast of
        that input; backward the fp8 activation's transpose for the weight gradient
        (:data:`FP8_TRANSPOSE_BYTES`) and one fused kernel for the activation's gradient, its
        cast and transpose (:data:`FP8_DGELU_CAST_BYTES`), instead of the activation's
        backward and the gradient's cast (:meth:`_fp8_cast_pair`)."""
        m = self.model
        return (self.fp8_act_cast_fused and self.precision == "fp8" and self.fp8_norm_cast_fused
                and bool(self.fp8_cast_bytes) and m.moe is None and not m.gated_mlp)

    @property
    def _fp8_cast_element_bytes(self) -> float:
        """HBM bytes of one standalone FP8 cast an element: :attr:`fp8_cast_bytes`, plus
        current scaling's amax pass (:data:`FP8_AMAX_BYTES`) under
        :attr:`fp8_current_scaling`."""
        return self.fp8_cast_bytes + (FP8_AMAX_BYTES if self.fp8_current_scaling else 0.0)

    @per_instance
    def fp8_weight_elements(self) -> tuple[float, float]:
        """Weight elements of one transformer block on one GPU that its FP8 linears cast,
        (attention block, MLP block): the attention projections over the TP degree; the MLP
        over it, a MoE layer's routed experts as the GPU holds them (E/ep experts over the
        expert TP degree, as :meth:`stage_expert_params` counts them). The linears' biases,
        a MoE router and MLA's latent norms (O(h) or h·E elements, not cast) are counted
        with them; the two block norms are not."""
        m, t = self.model, self.tp
        experts = m.layer_expert_params()
        return (m.attention_params() / t,
                (m.mlp_params() - experts) / t + experts / self._etp / self.ep)

    def fp8_weight_cast_bytes(self, per: str) -> tuple[float, float]:
        """HBM bytes of one layer's FP8 weight casts on one GPU, (attention block, MLP
        block), each cast and transposed at :attr:`_fp8_cast_element_bytes` an element
        (Transformer Engine's ``fp8_cast_transpose_fused``: read 2, write 1 + 1), when
        :attr:`fp8_weight_casts` is ``per`` (``step`` or ``microbatch``); (0, 0) otherwise,
        without ``precision: fp8`` or without cast kernels (:attr:`fp8_cast_bytes` 0)."""
        if self.precision != "fp8" or not self.fp8_cast_bytes or self.fp8_weight_casts != per:
            return 0.0, 0.0
        c = self._fp8_cast_element_bytes
        attn, mlp = self.fp8_weight_elements()
        return c * attn, c * mlp

    def _moe_fp8_casts(self) -> tuple[float, float]:
        """HBM bytes of the FP8 casts of one MoE layer's MLP block on one GPU, (forward,
        backward), :attr:`fp8_cast_bytes` an element whether or not
        :attr:`fp8_norm_cast_fused`: no GEMM input of the block leaves a fused norm kernel.
        Megatron-core's MoE layer spec gives the block a standalone ``pre_mlp_layernorm``
        (megatron/core/models/gpt/gpt_layer_specs.py, ``pre_mlp_layernorm=
        backend.layer_norm() if num_experts else IdentityOp``), the router and the token
        dispatch run between it and the experts, whose ``TEGroupedMLP``
        (megatron/core/transformer/moe/experts.py) runs TransformerEngine's ``GroupedLinear``
        on the permuted bf16 rows, and the shared experts are ``TEColumnParallelLinear`` /
        ``TERowParallelLinear`` on the gathered tokens (shared_experts.py): forward, every
        GEMM's input is cast and transposed (the routed rows' h and f_e/t, :attr:`_expert_rows`
        and :attr:`_routed_rows` as :meth:`_elementwise_forward` counts them; every token's
        h and f_s/t); backward, every GEMM's output gradient (h and f·(matrices − 1)/t)."""
        m, t, n = self.model, self.tp, self._tokens
        moe = m.moe
        assert moe is not None
        c, h, f = self._fp8_cast_element_bytes, m.hidden_size, moe.expert_ffn_hidden_size
        rows, routed, glu = self._expert_rows, self._routed_rows, m.mlp_matrices - 1
        fs = moe.shared_experts * f
        fwd = c * (rows * h + routed * f / t + n * (h + fs / t) * (fs > 0))
        bwd = c * (routed * f * glu / t + rows * h + n * (fs * glu / t + h) * (fs > 0))
        return fwd, bwd

    def cp_ring_merge_bytes(self, backward: bool) -> float:
        """HBM bytes of the memory-bound kernels Transformer Engine's ring attention runs
        around its attention kernels on one GPU for one layer (all ``cp`` steps together),
        with :attr:`cp_ring_merge` and ``cp > 1`` (0 otherwise).

        Read from ``AttnFuncWithCP`` in transformer_engine/pytorch/attention.py (TE v1.8) and
        ``AttnFuncWithCPAndKVP2P`` in
        transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
        (v2.7), ``sbhd``/``bshd`` layouts with the causal load-balanced split, Q the rank's
        local query elements (n·q/t), O its output elements (n·o/t), K its key and value
        elements (2·n·kv/t), c = cp. Forward: K and V concatenated into the first pass's
        buffer (``torch.cat``, 4 bytes a K element); every later step copies the half it
        uses contiguous (the received chunk's first K/V half or the second query half:
        K + Q bytes a step on average, :data:`CP_RING_CAUSAL_SHARE`'s mean); the outputs
        merged by their softmax statistics after the steps (``flash_attn_fwd_out_correction``;
        v2.7's ``_init`` writes the first step's 4 bytes an O element, then 6 a step over
        0.75 of O; v1.8 zero-fills and adds the first step too, 4 bytes an element more,
        not counted). Backward: K and V copied into the pass buffer (4K); every later step
        copies its K/V half or its query, output and output-gradient halves (K + Q + 2·O);
        the dQ of every step copied (first) or added into the rank's dQ (4Q + 4.5Q a later
        step), its dK and dV concatenated (``torch.cat((dk_, dv_))``, 4K + 3K a later step)
        and added into the travelling dK/dV (4K + 4.5K a later step). The softmax
        statistics' corrections (a 1/d-sized fp32 tensor) are left out. The attention
        kernels themselves (and their reads of Q, K, V, O, dO) are in ``attn_flops``."""
        if not self.cp_ring_merge or self.cp == 1:
            return 0.0
        m, t, n, c = self.model, self.tp, self._tokens, self.cp
        q, o, k = n * m.q_dim / t, n * m.attn_out_dim / t, 2 * n * m.kv_dim / t
        copy, add, share = CP_RING_COPY_BYTES, CP_RING_ADD_BYTES, CP_RING_CAUSAL_SHARE
        later = c - 1
        if not backward:
            return copy * k + copy * o + later * ((k + q) * copy / 4 + share * add * o)
        halves = (k + q + 2 * o) * copy / 4  # half of one half-tensor copy each
        dq = copy * q + later * share * add * q
        dkv = copy * k + later * share * copy * k + copy * k + later * share * add * k
        return copy * k + later * halves + dq + dkv

    def _attention_dropout_bytes(self) -> float:
        """HBM bytes of non-flash attention's dropout on one layer's probabilities forward
        (:data:`ATTENTION_DROPOUT_BYTES`): where the layers apply dropout (:attr:`dropout`,
        counted for GPT-style LayerNorm models, as their masks are), 0 under FlashAttention."""
        if self._flash or not self.dropout or self.model.norm != "layernorm":
            return 0.0
        return ATTENTION_DROPOUT_BYTES * self._scores_elements()

    @per_instance
    def _linear_grad_bytes(self) -> tuple[float, float]:
        """HBM bytes of one layer's backward, (attention block, MLP block), that its linear
        layers' bias gradients (:attr:`bias_grad_bytes` an output element of each biased
        linear) and the QKV split's backward (:attr:`qkv_split_grad_bytes` an element of the
        fused QKV output) move beside the GEMMs; (0, 0) for a MoE layer (not read for
        one). The row-parallel outputs' biases are whole on every TP rank (h a token). Under
        ``precision: fp8`` no bias gradient is counted: the FP8 linears are Transformer
        Engine's, whose backward reduces the bias inside its cast-and-transpose kernel of the
        output gradient (``fp8_cast_transpose_bgrad_fused``), counted in :attr:`fp8_cast_bytes`."""
        m, t, n = self.model, self.tp, self._tokens
        bias = 0.0 if self.precision == "fp8" else self.bias_grad_bytes
        if m.moe is not None or not (bias or self.qkv_split_grad_bytes):
            return 0.0, 0.0
        qkv = n * (m.q_dim + 2 * m.kv_dim) / t
        attn = self.qkv_split_grad_bytes * qkv
        if m.norm == "layernorm":  # GPT style: every linear has its bias
            attn += bias * (qkv + n * m.hidden_size)
            return attn, bias * n * (m.ffn_hidden_size * (m.mlp_matrices - 1) / t + m.hidden_size)
        return attn + (bias * qkv if m.qkv_bias else 0.0), 0.0

    @per_instance
    def _elementwise_backward(self) -> tuple[float, float]:
        """Memory-bound bytes of one layer's backward, (attention block, MLP block), from its
        forward's kernels (:meth:`_elementwise_kernels`): :data:`BACKWARD_ELEMENTWISE` times
        them, the FP8 casts of :attr:`fp8_norm_cast_fused` or :attr:`fp8_casts_compiled`
        replaced by the backward's own (:meth:`_fp8_cast_pair`) and the attention dropout's
        by its own (:data:`ATTENTION_DROPOUT_BACKWARD_BYTES`), plus the backward-only bytes
        of the linear layers (:meth:`_linear_grad_bytes`) and of the fp8 weights
        (:meth:`_fp8_weight_cast_pair`)."""
        ew_attn, ew_mlp = self._elementwise_kernels()
        drop = self._attention_dropout_bytes()
        grad_attn, grad_mlp = self._linear_grad_bytes()
        back_w_attn, back_w_mlp = self._fp8_weight_cast_pair()[1]
        grad_attn, grad_mlp = grad_attn + back_w_attn, grad_mlp + back_w_mlp
        ew_attn = (BACKWARD_ELEMENTWISE * (ew_attn - drop)
                   + drop * ATTENTION_DROPOUT_BACKWARD_BYTES / ATTENTION_DROPOUT_BYTES)
        if not (self.fp8_norm_cast_fused or self.fp8_casts_compiled):
            return ew_attn + grad_attn, BACKWARD_ELEMENTWISE * ew_mlp + grad_mlp
        (cast_attn, cast_mlp), (back_attn, back_mlp) = self._fp8_cast_pair()
        # a fused fp8 GeLU's backward is its own kernels (in back_mlp), not twice its forward
        act = (FP8_GELU_CAST_BYTES * self._tokens * self.model.ffn_hidden_size / self.tp
               if self._fp8_act_fused else 0.0)
        return (ew_attn - BACKWARD_ELEMENTWISE * cast_attn + back_attn + grad_attn,
                BACKWARD_ELEMENTWISE * (ew_mlp - cast_mlp - act) + back_mlp + grad_mlp)
