"""Costs of a transformer split into pipeline stages, TP shards and CP/EP groups. Pure.

Turns one pipeline op into the work its GPUs do, layer by layer, as
:class:`~workloads.costs.ComputeSeg` (GEMM FLOPs and bytes, attention-core
FLOPs, bytes of memory-bound kernels) and TP collectives
(:class:`~workloads.costs.CommSeg`); the device model turns work into time.

:class:`TransformerCosts` holds the model, its parallelism and how the framework runs it
(its fields), and the shapes every part reads; each concern is a mixin of its own module:

- :mod:`workloads.layer_work`: one layer's GEMMs, attention core, TP blocks, forward,
  backward with recomputation, and the output head;
- :mod:`workloads.elementwise`: the layer's memory-bound kernels, FP8 casts included;
- :mod:`workloads.moe_work`: the mixture-of-experts MLP, its all-to-alls and expert TP;
- :mod:`workloads.stage_ops`: a pipeline op's segments, stage by stage, and Seq1F1B chunks;
- :mod:`workloads.activation_memory`: stashed activations and working memory;
- :mod:`workloads.model_state`: parameters, gradients, ZeRO and the optimizer step;

with the helpers they share in :mod:`workloads.kernels`. The sources of each model are
in its module.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from workloads.activation_memory import ActivationMemory
from workloads.costs import BF16
from workloads.elementwise import ROPE_BYTES, ElementwiseWork
from workloads.layer_work import LayerWork
from workloads.model_state import ModelState
from workloads.models import ModelSpec
from workloads.moe_work import MoEWork
from workloads.recompute_modules import DEFAULT_RECOMPUTE_MODULES
from workloads.seqchunks import FLASH_KERNELS, WHOLE_WINDOW, window_tokens_share
from workloads.stage_ops import StageOps


@dataclass(frozen=True)
class TransformerCosts(LayerWork, ElementwiseWork, MoEWork, StageOps, ActivationMemory,
                       ModelState):
    """Costs of a transformer (dense or MoE) split into pipeline stages, TP shards, CP and EP."""

    model: ModelSpec
    micro_batch_size: int
    tp: int
    dp: int
    stage_layers: tuple[int, ...]
    """Transformer blocks in each stage (model chunk)."""
    sequence_parallel: bool = False
    zero_stage: int = 1
    recompute: str = "none"
    """``none``, ``selective`` (the :attr:`recompute_modules` recomputed), ``selective-op``
    (torchtitan's op-level checkpointing: every other matmul recomputed,
    :meth:`_op_checkpoint_shares`) or ``full`` (whole layer)."""
    attention: str = "flash2"
    """``flash2``, ``flash1``, ``flash3`` (Hopper only), ``flash-triton``, ``cudnn`` (the flash
    kernels skip the causal mask's half of the score matrix and never store it), ``fused`` or
    ``unfused``."""
    fused_norm: bool = True
    w_retained_fraction: float = 0.5
    """Share of a micro-batch's activations held from its B until its W (zero-bubble)."""
    overlap_grad_reduce: bool = False
    """Reduce DP gradient buckets while the final backward runs (Megatron-LM
    ``--overlap-grad-reduce``); False: one collective per stage after it."""
    grad_bucket_bytes: float = 25e6
    """Gradient bytes per bucket with ``overlap_grad_reduce`` (PyTorch DDP's
    ``bucket_cap_mb=25`` default)."""
    grad_buckets_stage0_only: bool = True
    """With ``overlap_grad_reduce``: only stage 0 (pipeline rank 0's first model chunk) fills
    buckets of :attr:`grad_bucket_bytes`; every other stage's gradients are one bucket,
    reduced once its last backward has produced them all (Megatron-core's DDP, the default,
    :attr:`workloads.frameworks.FrameworkProfile.grad_buckets_stage0_only`). False: every
    stage is bucketed alike (PyTorch DDP)."""
    overlap_param_gather: bool = False
    """ZeRO-1/2's parameter all-gather issued layer by layer before each layer of the
    step's first forward of a stage (Megatron-LM ``--overlap-param-gather``), not after
    the optimizer step; :meth:`op_segments` marks those gathers."""
    cp: int = 1
    """Context parallelism: each GPU holds s/cp tokens of every sequence (Megatron's
    load-balanced split into 2·cp chunks, rank i holding chunks i and 2cp − 1 − i, so
    causal attention work is even) and runs ring attention over the CP group."""
    ep: int = 1
    """Expert parallelism (MoE): the experts are split over EP groups of ep consecutive DP
    ranks (Megatron carves EP out of DP); tokens travel by all-to-all to their experts."""
    vocab_parallel_loss: bool = True
    """Megatron-LM's vocabulary-parallel cross entropy: each TP rank keeps its V/t logits.
    False: the LM head all-gathers the logits and every TP rank runs an unsplit
    cross entropy over all V of them (a column-parallel head with gathered output,
    as in Aleph Alpha's ``scaling`` library, whose ``ColumnParallelLinear`` gathers
    by default and whose loss is ``torch.nn.functional.cross_entropy`` on the fp32
    logits): the loss's memory and memory-bound work are t times larger (the logits'
    all-gather itself is not timed)."""
    dp_wire_bytes: float = BF16
    """Bytes per parameter each of the step-end DP collectives moves (the gradients'
    reduce-scatter before the optimizer, the parameters' all-gather after it, ZeRO 1/2;
    :meth:`grad_bytes`): 2, bf16 gradients and parameters (Megatron's distributed
    optimizer). The sweep's framework casts the bf16 gradients to fp32 and all-reduces
    them (Aleph Alpha's ``scaling``, ``allreduce_tensor_in_float32``; a ring all-reduce
    is a reduce-scatter and an all-gather, 4 + 4 bytes), then all-gathers the updated
    bf16 parameters (2): 10 bytes over the step, so 5 in each of the two collectives
    (the same time on rings, whose reduce-scatter and all-gather cost alike)."""
    sp_saves_gathered_input: bool = False
    """Sequence parallelism as a plain ``F.linear`` on the all-gathered input: the QKV and
    first MLP GEMMs save the whole gathered b·s·h input for their weight gradient (Aleph
    Alpha's ``scaling`` library: its ``ColumnParallelLinear`` calls
    ``torch.nn.functional.linear`` on the gathered tensor), 4·s·b·h bytes a layer that are
    not split by t. False: Megatron-LM's SP (Korthikanti et al. 2022, sec. 4.2.2) saves
    the local s/t shard and all-gathers it again in the backward."""
    sp_regather_input: bool = True
    """With sequence parallelism, the backward's all-gather of each column-parallel GEMM's
    saved s/t input shard (the QKV and first MLP GEMMs of a dense layer) for its weight
    gradient is timed: launched beside the input-gradient GEMM (Transformer Engine's
    ``LayerNormLinear`` / ``LayerNormMLP`` backward, ``gather_along_first_dim(ln_out,
    async_op=True)``; its userbuffers ``qkv_dgrad`` / ``fc1_dgrad`` bulk overlap under TP
    communication overlap), each adds what it runs beyond that GEMM
    (:func:`sim.tpoverlap.with_overlap`, ``attn bwd input all-gather`` and ``mlp bwd input
    all-gather`` in :attr:`tp_comm_exposed_s`). False: not counted (a framework that saves
    the gathered input, :attr:`sp_saves_gathered_input`, has no second gather;
    :mod:`workloads.frameworks`)."""
    tp_all_gather_fp8: bool = False
    """Under ``precision: fp8``, the TP all-gathers of a layer (the sequence-parallel input
    before the QKV and first MLP GEMMs, and the backward's all-gather of the output gradient
    before the output projection's and second MLP GEMM's) move the fp8 cast, 1 byte an
    element, not bf16: torchao's Float8 tensor parallelism casts before it gathers
    (:mod:`workloads.frameworks`). The reduce-scatters stay bf16."""
    sp_async_grad_reduce_scatter: bool = False
    """With sequence parallelism and without TP communication overlap, the backward's
    reduce-scatter of the QKV and first MLP GEMMs' input gradient runs beside their weight
    gradient GEMM (Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication.backward``
    and Transformer Engine's ``LayerNormLinear`` backward: ``reduce_scatter(..., async_op=
    True)`` after the dgrad GEMM, waited on after the wgrad GEMM), and adds only what it runs
    beyond it, slowed by NCCL's kernels (:func:`sim.tpoverlap.async_reduce_exposed_s`).
    False (the default and every shipped profile's but ``nemo-launcher-2022``, apex's 2022
    backward; measured against the corpus and not shipped for the others,
    docs/contention.md): it blocks (:mod:`workloads.frameworks`)."""
    tp_async_grad_all_reduce: bool = False
    """With tensor parallelism and without sequence parallelism, the backward all-reduces
    the QKV and first MLP GEMMs' input gradient beside their weight-gradient GEMM
    (Megatron-LM's ``ColumnParallelLinearWithAsyncAllreduce`` (2022) and
    ``LinearWithGradAccumulationAndAsyncCommunication`` with ``allreduce_dgrad`` later:
    ``all_reduce(grad_input, async_op=True)`` after the dgrad GEMM, waited on after the
    wgrad GEMM), and adds only what it runs beyond it, slowed by NCCL's kernels
    (:func:`sim.tpoverlap.async_all_reduce_exposed_s`); False: it blocks
    (:mod:`workloads.frameworks`)."""
    kept_stage_outputs: int = 0
    """Earlier micro-batches' bf16 logits the framework still holds on the last stage
    (:meth:`transient_bytes`). 0: Megatron-LM frees a stage's output once its backward has
    run. Aleph Alpha's ``scaling`` writes each forward's output into one of
    ``required_buffer_count`` = max(2, ...) pipeline buffers, cycled by micro-batch, and
    on the last stage nothing takes it out of the buffer (only receiving the next stage's
    gradient does, and the last stage receives none): the logits of micro-batch k stay
    until micro-batch k + 2's forward overwrites them, so while micro-batch k runs, k - 1's
    are held too (1; 0 if the step has a single micro-batch)."""
    stage_output_buffered: bool = False
    """The last stage's own bf16 logits stay in the framework's pipeline buffer through the
    micro-batch's whole backward, so the layers' phase of that backward still holds them
    (:meth:`transient_bytes`). False: Megatron-LM's loss backward frees them. True for
    Aleph Alpha's ``scaling``, by the same rule as :attr:`kept_stage_outputs`:
    ``ParallelModule._execute_backward_pass`` (src/scaling/core/nn/parallel_module/
    parallel_module.py) runs ``optimizer.backward(loss)`` and leaves
    ``BufferType.PIPELINE_STAGE_OUTPUT`` in place; only ``_execute_receive_gradients`` takes
    it out, and ``PipelineScheduleTrain.instructions`` (pipeline_schedule/train.py) issues
    that on stages with a next pipe rank only; the loss keeps no reference to the bf16 tensor
    (it saves its fp32 ``log_softmax`` output), so only the buffer holds it."""
    grad_reduce_bytes: float = BF16
    """Bytes per gradient element in the reductions that run during the backward (buckets of
    ``overlap_grad_reduce``, ZeRO-3's per-layer reduce-scatters, and the unreduced gradient a
    ZeRO-3 unit holds): 2, bf16 (Megatron-LM's default); 4 where the framework reduces in
    fp32 (:mod:`workloads.frameworks`)."""
    grad_buffer_bytes: float = BF16
    """Bytes per parameter of the gradient buffer
    (:func:`workloads.memory.model_state_bytes_per_param`): 2, Megatron-LM's bf16 buffer; 4,
    DeepSpeed's fp32 gradient accumulation (:mod:`workloads.frameworks`)."""
    recompute_num_layers: int | None = None
    """Partial recomputation: ``recompute`` applies to the first this-many transformer layers
    of each stage (model chunk), the others stash everything (Megatron-LM's
    ``--recompute-method block --recompute-num-layers``,
    megatron/core/transformer/transformer_block.py ``_checkpointed_forward``). None: all
    layers; 0: none."""
    recompute_every_k_layers: int | None = None
    """Every k-th transformer layer of the model recomputed (layers k, 2k, ... counted from
    1), the others stash everything: torchtitan's selective layer checkpointing
    (``selective_ac_option = "k"``, torchtitan/distributed/activation_checkpoint.py
    ``_apply_layer_sac``: a running count of blocks, checkpointed when it is a multiple of
    k). None: all layers (or :attr:`recompute_num_layers`)."""
    precision: str = "bf16"
    """``bf16`` or ``fp16`` (the same tensor-core rate and bytes on every GPU here), or ``fp8``:
    the transformer layers' linear GEMMs run on FP8 tensor cores (TransformerEngine's
    ``fp8_autocast``, torchao's float8 training) at :attr:`fp8_speedup` times the bf16 rate
    and save their inputs for the backward in fp8 (:meth:`layer_activation_bytes`); the
    attention core, the output head and the loss stay in bf16, as both keep them."""
    fp8_speedup: float = 1.0
    """Dense FP8 over dense BF16 tensor-core peak of the GPUs (2 on every FP8 GPU of
    :mod:`topologies.hardware`), with ``precision: fp8``: GEMM FLOPs reach the device model
    in bf16-equivalent units, divided by it."""
    fp8_current_scaling: bool = False
    """With ``precision: fp8``: per-tensor current scaling (``training.precision:
    fp8-current``, Transformer Engine 2.x's ``Float8CurrentScaling``): every cast reads its
    bf16 input once more for its amax first (``FP8_AMAX_BYTES``), and under
    :attr:`fp8_norm_cast_fused` the norm writes bf16 and its amax, which one more pass
    quantizes (``FP8_NORM_QUANTIZE_BYTES``, :mod:`workloads.elementwise`). False: delayed
    scaling (each scale from the tensor's amax history)."""
    seq_chunks: int = 1
    """k, sequence chunks per micro-batch (Seq1F1B); ops with ``op.seq >= 0`` cost one chunk
    (:meth:`seq_chunk`, boundaries from :mod:`workloads.seqchunks`)."""
    seq_window: tuple[float, float] = WHOLE_WINDOW
    """Tokens ``[lo, hi)`` of each sequence (fractions) these costs cover, their queries
    attending to keys ``[0, hi)``: one Seq1F1B chunk; ``(0, 1)``: whole sequences."""
    fused_cross_entropy: bool = False
    """The loss is one fused kernel over the bf16 logits (flash-attn's ``CrossEntropyLoss``,
    llm-foundry's default ``loss_fn``, :mod:`workloads.frameworks`): it keeps the bf16
    logits for its backward (2·b·s·V/t bytes, no fp32 copy), needs no fp32 buffer forward,
    writes a bf16 gradient backward, and moves :data:`FUSED_CROSS_ENTROPY_BYTES` a logit
    forward. False: the fp32 loss of Megatron-LM / ``torch.nn.functional.cross_entropy``
    (:meth:`transient_bytes`, :data:`CROSS_ENTROPY_BYTES`)."""
    zero3_gather_copy_bytes: float = 0.0
    """ZeRO-3 (dp·cp > 1): HBM bytes per gathered layer parameter that the framework's own
    kernels move around each all-gather (forward, and again before the backward), beside
    the collective: 0 where the all-gather writes the parameters in place (FSDP1's flat
    parameter), 4 where a copy-out splits the gathered bf16 buffer into the parameters
    (FSDP2, read 2 + write 2). Timed as memory-bound work of the layer's op."""
    zero3_reduce_copy_bytes: float = 0.0
    """ZeRO-3 (dp·cp > 1): HBM bytes per layer parameter that the framework's kernels move
    before each gradient reduce-scatter, in the layer's backward: the cast of the bf16
    gradient to the reduction dtype and any pre-division (FSDP1: cast 2 + 4, pre-divide
    4 + 4; FSDP2: a cast copy-in, 2 + 4). Timed as memory-bound work of the backward."""
    fp8_cast_bytes: float = 4.0
    """With ``precision: fp8``: HBM bytes per element of each FP8 GEMM's bf16 activation
    input that the framework's scaling and casting kernels move forward (the inputs of the
    QKV, output, first and second MLP GEMMs on one TP rank); the backward casts the output
    gradients and the inputs again, counted as twice that (:data:`BACKWARD_ELEMENTWISE`).
    0: no cast kernels; torchao's dynamic scaling computes each tensor's amax and then
    casts it, 2 + 3 bytes (:mod:`workloads.frameworks`). With :attr:`fp8_norm_cast_fused`
    (Megatron-LM's default) only the output projection's and second MLP GEMM's inputs are
    cast so, TransformerEngine's cast and transpose, 2 + 1 + 1 bytes."""
    fp8_norm_cast_fused: bool = True
    """With ``precision: fp8``: TransformerEngine's casts as Megatron-core's layer spec runs
    them (:mod:`workloads.frameworks`): the QKV and first MLP GEMMs' inputs leave the fused
    norm kernel in fp8 (no cast forward; their transposes for the weight gradients,
    :data:`FP8_TRANSPOSE_BYTES` an element, in the backward), the output projection's and
    second MLP GEMM's bf16 inputs are cast and transposed forward (:attr:`fp8_cast_bytes` an
    element), and the backward casts and transposes every FP8 GEMM's output gradient
    (:attr:`fp8_cast_bytes` an element of the QKV, output, first and second MLP GEMMs'
    outputs) instead of repeating the forward's casts twice. False: every input cast alike,
    the backward twice the forward."""
    rope_bytes: float = 4.0
    """HBM bytes per element of q and k that the rotary embedding moves forward (RoPE models;
    the backward twice that): 4 for one fused kernel that reads and writes each element once
    (Megatron-LM's default ``apply_rope_fusion``, :mod:`workloads.frameworks`),
    :data:`ROPE_BYTES` eager."""
    swiglu_bytes: float = 6.0
    """HBM bytes per ffn element that silu(gate)·up moves forward (gated MLPs; the backward
    twice that): 6 for one fused kernel that reads gate and up and writes the product
    (Megatron-LM's default ``bias_swiglu_fusion``), :data:`SWIGLU_BYTES` eager."""
    swiglu_stash_bytes: float = 6.0
    """Bytes per ffn element a gated MLP (SwiGLU, GeGLU) keeps for its backward between its
    first and its down projection, the down projection's input included
    (:meth:`layer_activation_bytes`): 6 for a fused kernel that saves only its input, gate and
    up (Megatron-LM's ``bias_swiglu_fusion``), and the product (2 + 2 + 2); 8 eager
    ``silu(gate) * up``, whose autograd also saves silu(gate), the multiply's operand."""
    swiglu_saves_product: bool = True
    """The down projection keeps its input, silu(gate)·up, for its weight gradient, as part of
    :attr:`swiglu_stash_bytes` (in fp8 under ``precision: fp8``,
    :meth:`layer_activation_bytes`). False: a compiled graph's partitioner recomputes it in
    the backward from the gate and up projections, which it keeps anyway
    (:mod:`workloads.frameworks`, ``[fsdp-compile]``): :attr:`swiglu_stash_bytes` is then
    gate and up alone, under every precision."""
    residual_norm_fused: bool = False
    """The attention block's residual add and the MLP block's norm run as one kernel that
    writes the sum and the normalised tensor without reading the sum back
    (:meth:`_elementwise_forward`: :data:`workloads.costs.BF16` a token's h elements less in
    the MLP block), as Inductor fuses them inside one compiled transformer block
    (:mod:`workloads.frameworks`). False: two kernels (Megatron-LM's fused norm reads the
    residual's output)."""
    fp8_casts_compiled: bool = False
    """With ``precision: fp8`` (and not :attr:`fp8_norm_cast_fused`): torchao's dynamic
    scaling as torch.compile's Inductor generates it (:meth:`_fp8_cast_pair`): each tensor's
    amax is fused into the kernel that produces the tensor, and one cast kernel of
    :attr:`fp8_cast_bytes` an element writes its row- and column-major fp8 copies; forward,
    every FP8 GEMM's input is cast once, backward every FP8 GEMM's output gradient (the
    inputs' column-major copies for the weight gradients were written forward). False: the
    eager casts, the backward twice the forward."""
    fp8_act_cast_fused: bool = False
    """With ``precision: fp8``, :attr:`fp8_norm_cast_fused` and a dense GeLU MLP: the MLP runs
    as Transformer Engine's ``LayerNormMLP`` (NeMo 1's TE ``TransformerLayer``), whose GeLU
    writes the second GEMM's input in fp8 and whose backward fuses the activation's gradient
    with its cast and transpose (:mod:`workloads.elementwise`, ``FP8_GELU_CAST_BYTES``,
    ``FP8_DGELU_CAST_BYTES``). False: Megatron-core's layer spec, two TE linears around
    Megatron's own bf16 activation, the second linear casting its input."""
    fp8_weight_casts: str = "step"
    """With ``precision: fp8``: how often each FP8 linear's bf16 weight is cast to fp8 with
    its transpose (:data:`FP8_WEIGHT_CASTS`; :attr:`_fp8_cast_element_bytes` an element of
    the GPU's transformer-block weights, :meth:`fp8_weight_elements`). ``step``: once a
    step, at the first micro-batch of each model chunk, kept for the later ones
    (Transformer Engine's ``is_first_microbatch``, which Megatron-core and NeMo set; timed
    with the step-end work, :meth:`optimizer_segment`); ``microbatch``: in every forward,
    recomputed forwards included (a TE module called without ``is_first_microbatch``);
    ``float8-linear``: the FP8 linears cast their own weights, as torchao's
    ``Float8Linear`` does at every forward (its weight's amax and a cast to fp8) with a
    transpose of the fp8 weight in the backward for the input-gradient GEMM; with
    :attr:`fp8_param_gather` the forward's cast is the all-gather's instead (not on the
    layer's stream) and only the backward's transpose remains; ``none``: not counted
    (:mod:`workloads.frameworks`). The casts inside a forward or backward (``microbatch``,
    ``float8-linear``) are :meth:`_fp8_weight_cast_pair`'s."""
    fp8_param_gather: bool = False
    """With ``precision: fp8`` and ZeRO-3: the parameter all-gathers move the layers' linear
    weights already cast to fp8, 1 byte a parameter, not bf16's 2 (the norms, embedding and
    output head stay bf16), and the gathered copies and the framework's copy-out of them are
    fp8 (torchtitan's ``--float8.enable_fsdp_float8_all_gather``: ``training.fp8_param_gather``)."""
    zero3_unsharded_under_pp: bool = False
    """ZeRO-3 (dp·cp > 1) under pipeline parallelism: the framework gathers each stage's
    parameters once and keeps them unsharded (bf16) through the step, and accumulates the
    micro-batches' gradients unsharded in the reduction dtype (:attr:`grad_reduce_bytes`)
    until the last backward (torchtitan: ``reshard_after_forward=False`` with PP, and
    torch.distributed.pipelining's ``backward_maybe_with_nosync``): (2 + grad_reduce_bytes)
    bytes a parameter of the rank's stages held on top of the sharded state
    (:meth:`static_bytes`), none gathered per op (:meth:`zero3_working_bytes`). The lowering
    follows it (:attr:`zero3_once_per_step`): each stage all-gathers its units in its first
    forward of the step (with their copy-out) and reduce-scatters them after its final
    backward's compute (torch.distributed.pipelining runs FSDP2's post-backward by hand
    after the last backward), and every backward accumulates the unsharded gradient
    (:attr:`unsharded_grad_accum_bytes`)."""
    dropout: bool = True
    """The layers apply dropout and keep its masks for the backward (2·s·b·h bytes a layer
    for a LayerNorm, GPT-style model: :meth:`layer_activation_bytes`). False: trained with
    dropout probability 0, where PyTorch's dropout returns its input and keeps no mask
    (aten/src/ATen/native/Dropout.cpp), as MPT's configurations do (:mod:`workloads.frameworks`)."""
    attention_copy_bytes: float = 0.0
    """HBM bytes per element of Q, K, V and the attention output (per token, their widths
    q + 2·kv + o over t) that copies around the attention kernel move forward, the backward
    twice that (:data:`BACKWARD_ELEMENTWISE`): 0 where the kernel reads the GEMM outputs as
    they are; llm-foundry's ``flash_attn_fn`` gathers Q, K and V into a packed (unpadded)
    layout for ``flash_attn_varlen_func`` and scatters the output back
    (:mod:`workloads.frameworks`). Not applied to ``flash-triton``, whose kernel reads the
    padded layout (llm-foundry's ``triton_flash_attn_fn`` calls it on the projections)."""
    vocab_parallel_loss_buffers: float = 1.0
    """fp32 b·s·V/t buffers the vocabulary-parallel loss's forward holds at once beside the
    logits it stashes (:meth:`transient_bytes`), with the logits split over t > 1 TP ranks:
    1 in Megatron-LM's ``vocab_parallel_cross_entropy`` (the exponentials, computed in place);
    2 in PyTorch's DTensor ``loss_parallel`` (torch/distributed/tensor/parallel/loss.py
    ``_log_softmax``: ``shifted = x - x_max`` and ``torch.exp(shifted)`` beside the fp32
    input). Without the split the loss is one kernel and holds 1."""
    grad_accum_bytes: float = 0.0
    """HBM bytes per parameter of the stage (one TP rank) that the framework's gradient
    accumulation moves after each micro-batch's backward, beside the GEMMs: one memory-bound
    segment at the end of the op that completes the weight gradients (B, or W when the
    backward is split). 0: the weight-gradient GEMMs accumulate in place (Megatron-LM's
    gradient-accumulation fusion into ``main_grad``); DeepSpeed's BF16_Optimizer casts each
    bf16 gradient to fp32 and adds it into its fp32 buffer, 2 + 4 + 4 + 4 + 4
    (:mod:`workloads.frameworks`)."""
    embedding_grad_bytes: float = 0.0
    """HBM bytes per parameter of the input embedding (one TP rank's shard) that each
    micro-batch's backward on the first stage moves outside the GEMMs: PyTorch's dense
    embedding backward and the framework's accumulation of it (one memory-bound segment
    beside the grad accumulation's). 0: not counted; Megatron-LM's 12 with its fp32
    ``main_grad`` (:mod:`workloads.frameworks`)."""
    bias_grad_bytes: float = 0.0
    """HBM bytes per element of each biased linear layer's output (a layer's QKV and output
    projections and its MLP's linears, where the model has their biases: all of them in a
    LayerNorm model, the QKV projection's under ``qkv_bias``) that the backward's bias gradient
    moves outside the GEMMs, in the backward of the layer's block (:meth:`_elementwise_backward`).
    0: not counted (fused into the GEMMs' epilogue or the activation's backward); eager
    PyTorch's ``nn.Linear`` reduces the full output gradient over the tokens, 2 (a read of the
    bf16 gradient) (:mod:`workloads.frameworks`)."""
    qkv_split_grad_bytes: float = 0.0
    """HBM bytes per element of the fused QKV projection's output (q + 2·kv over t, a token)
    that the backward of splitting it into Q, K and V moves: 0 where the attention kernel's
    gradients are written into one buffer; PyTorch's ``split`` backward concatenates the
    three separate gradients into a new tensor, 4 (read and write bf16)
    (:mod:`workloads.frameworks`)."""
    optimizer_bytes: float = 28.0
    """HBM bytes per parameter of the GPU's shard that the step-end optimizer moves
    (:meth:`optimizer_segment`): 28 for a fused AdamW; a framework's eager optimizer and
    what it runs beside it (gradient clipping) move more (:mod:`workloads.frameworks`)."""
    kept_grad_copy_bytes: float = 0.0
    """Bytes per parameter of the optimizer's shard (every parameter without ZeRO) of a
    gradient copy the optimizer step makes and keeps through the next step's forward and
    backward, held as model state (:meth:`static_bytes`): 0 where the copy is a view of the
    gradient buffer or is freed before the forward; 4 for Megatron-LM's fp32
    ``main_param.grad`` under --fp16 before it was freed in ``zero_grad``
    (:mod:`workloads.frameworks`)."""
    tied_grad_reduce_bytes: float = 0.0
    """Bytes per element of the tied embedding's gradient in the all-reduce between the
    first and the last pipeline stage that hold its two copies (:meth:`tied_grad_bytes`,
    :mod:`workloads.lowering.tied`): 4 for DeepSpeed's fp32 copy under its bf16 optimizer.
    0: not emitted (:mod:`workloads.frameworks`)."""
    pp_send_blocking: bool | str = False
    """Each pipeline send blocks its sender's compute stream until the message has arrived
    (:mod:`workloads.lowering.pipeline`): DeepSpeed's pipeline engine sends with
    ``dist.send`` in its instruction stream, which the next instruction waits on; Megatron-LM
    waits on each batched exchange. True or ``always``: on every schedule;
    ``non-interleaved``: where a pipeline rank holds one stage (Megatron-LM's 1F1B)
    (:func:`~workloads.lowering.pipeline.sends_block`); False or ``never``: sends run on
    their own stream beside the compute (:mod:`workloads.frameworks`)."""
    pp_partition_gathers: bool = False
    """Each TP rank sends and receives 1/t of a stage's activation or gradient and
    all-gathers it over its TP group before use (:meth:`_partition_gathers`): a
    non-first stage's forward gathers its input, a non-last stage's backward gathers the
    gradient it received and its own output again (DeepSpeed's ``PartitionedTensor.full()``
    in ``_exec_forward_pass`` and ``_exec_backward_pass``). False: not counted
    (:mod:`workloads.frameworks`)."""
    tp_comm_exposed_s: tuple[tuple[str, float], ...] = ()
    """TP communication overlap (``parallel.tp_comm_overlap``): the time each sequence-
    parallel collective of a layer adds beside its block's compute once pipelined with the
    GEMM next to it, by collective (``attn all-gather``, ``mlp bwd reduce-scatter``, ...,
    :data:`workloads.layer_work.TP_OVERLAP_GEMMS`), set by :func:`sim.tpoverlap.with_overlap`
    from the device and collective timers; such a collective is emitted with that fixed time.
    Empty: every TP collective blocks and is timed on the network."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """With ``recompute: selective``, Megatron-core's ``recompute_modules``
    (:data:`workloads.recompute_modules.RECOMPUTE_MODULES`): what each drops from a layer's
    stash is in :meth:`layer_activation_bytes`, what it reruns before the layer's backward
    in :meth:`_module_recompute`. Default ``core_attn``, the attention core (Korthikanti
    et al. 2022's selective recomputation)."""
    moe_dispatcher: str = "alltoall"
    """Megatron-core's MoE token dispatcher (:data:`workloads.moe_dispatch.DISPATCHERS`):
    ``alltoall`` sends each token's k routed copies, ``flex`` one per destination unit."""
    ep_servers: int = 1
    """Servers one EP group spans: the flex dispatcher's destination units are these
    servers when more than one, else the group's ep GPUs."""
    ep_comm_exposed_s: tuple[tuple[str, float], ...] = ()
    """MoE all-to-all overlap (``parallel.moe_a2a_overlap``): the fixed exposed time of each
    of a layer's all-to-alls by name (``dispatch``, ``combine``, ``combine grad``,
    ``dispatch grad``; :mod:`sim.a2aoverlap`); empty: each blocks for its network time."""
    moe_host_wait_s: tuple[float, float] = (0.0, 0.0)
    """Seconds each MoE layer's forward and backward wait for the CPU to issue their kernels
    (:mod:`sim.hostwait`: a framework that synchronises the host once per MoE layer, the
    parts of the layer not captured in CUDA graphs); run as a fixed ``host wait`` segment
    after the layer's dispatch (forward) or before its expert body (backward). (0, 0): none."""
    expert_tp: int | None = None
    """Expert tensor parallelism e (Megatron-core ``expert_tensor_parallel_size``); None: the
    attention's tp. The routed experts' weights are split over e GPUs, not tp: each GPU
    computes n·k·e rows (n = b·s/(cp·tp) its sequence-parallel tokens, gathered over the
    expert TP group after the all-to-all, ``MoEAlltoAllTokenDispatcher.dispatch_postprocess``)
    of width f_e/e, and holds E/ep experts' 1/e, their state sharded over the
    dp·cp·tp/(e·ep) GPUs holding the same shards. The all-to-all volume (n·k·h a GPU) and the
    activations (n·k·e rows of f_e/e) do not depend on e."""
    cp_kv_all_gather: bool = False
    cp_ring_merge: bool = True
    """With cp > 1 and the ring (not :attr:`cp_kv_all_gather`): the copies and merges
    Transformer Engine's ring attention runs around its attention kernels (concatenating K
    and V, the halves of the causal split made contiguous, each step's output merged by its
    softmax statistics, dQ and dK/dV accumulated over the steps), their HBM bytes on each
    step's attention block (:meth:`cp_ring_merge_bytes`; Megatron-LM's CP, the default).
    False: none counted (a framework whose CP is not TE's ring, :mod:`workloads.frameworks`)."""
    """Context parallelism as an all-gather of the whole sequence's K and V over the CP group
    before each attention core (and, backward, the same gather and a reduce-scatter of dK
    and dV after it), exposed (Meta's, Dubey et al. 2024, sec. 3.3.2:
    :attr:`workloads.costs.RingAttention.gathered`). False: Megatron-LM's ring of
    point-to-point passes, each overlapping the previous block. The gathered K and V (cp
    times a pass, 64 MiB a layer for Llama 3 405B at CP 16) are working memory of the
    attention, not stashed (:meth:`cp_gathered_bytes`)."""
    zero2_reduce_every_microbatch: bool = False
    """ZeRO-2 (dp·cp > 1) as PyTorch FSDP and DeepSpeed run it: every micro-batch's backward
    reduce-scatters each layer's gradients (:attr:`grad_reduce_bytes` an element) as soon as
    the layer's weight gradients are done, and only the local shard is accumulated (the
    sharded gradient of :meth:`bytes_per_param`); the backward holds one layer's unreduced
    gradient until its reduce-scatter (:meth:`transient_bytes`). False: the gradients are
    reduced once, after the step's last backward (Megatron-LM; :mod:`workloads.frameworks`)."""
    zero3_overlap_s: tuple[float, float] = (0.0, 0.0)
    """ZeRO-3 (FSDP) collectives beside the compute: the seconds a layer's forward and its
    backward lose to the SMs that the layer's all-gather (and, backward, reduce-scatter)
    kernels hold while they overlap it (under a ZeRO-2 that reduces every micro-batch, the
    backward's reduce-scatter only), set by :func:`sim.fsdpoverlap.with_contention` from
    the device and collective timers; emitted after the layer as a fixed-time compute
    segment. (0, 0): not modelled."""
    cp_overlap_s: tuple[float, float] = (0.0, 0.0)
    """Ring context parallelism's passes beside the attention blocks: the seconds a layer's
    ring attention loses, forward and backward, to the NCCL point-to-point kernels of its
    ``cp − 1`` passes, set by :func:`sim.cpoverlap.lowering_costs`; emitted after the ring
    as a fixed-time compute segment. (0, 0): not modelled."""
    fp8_amax_reduce_s: tuple[tuple[float, float], ...] = ()
    """FP8 delayed scaling's blocking amax all-reduce (:mod:`sim.amaxreduce`): per pipeline
    stage (model chunk), the seconds of the one all-reduce Transformer Engine issues at the
    end of the chunk's forward and the one at the end of its backward, set by
    :func:`sim.amaxreduce.lowering_costs` from the collective timer; emitted as a fixed-time
    collective the op's end waits on. Empty: not charged."""
    dp_overlap_s: tuple[float, float] = (0.0, 0.0)
    """Megatron's overlapped DP collectives beside the compute (ZeRO < 3): the seconds a
    layer's forward loses to its ``overlap_param_gather`` all-gather in the step's first
    forward of a stage, and a layer's backward to its gradients' bucketed reduction
    (``overlap_grad_reduce``) in the step's last backward, on the stages cut into buckets
    layer by layer (:attr:`grad_buckets_stage0_only`); set by
    :func:`sim.fsdpoverlap.with_contention`, emitted after the layer in those (marked) ops
    as a fixed-time compute segment. (0, 0): not modelled."""

    # ------------------------------------------------------------- shapes
    @property
    def _tokens(self) -> float:
        """Tokens of a micro-batch on one GPU: b·s/cp."""
        return (self.micro_batch_size * self.model.seq_length / self.cp
                * window_tokens_share(self.seq_window))

    @property
    def _shards(self) -> int:
        """GPUs over which ZeRO shards model state: the DP group times the CP group
        (Megatron reduces gradients and shards the distributed optimizer over dp·cp)."""
        return self.dp * self.cp

    @property
    def reduces_every_microbatch(self) -> bool:
        """Whether each micro-batch's backward reduce-scatters its gradients layer by layer
        (:attr:`zero2_reduce_every_microbatch` under ZeRO-2 over more than one shard)."""
        return self.zero2_reduce_every_microbatch and self.zero_stage == 2 and self._shards > 1

    @property
    def _etp(self) -> int:
        """The experts' TP degree: :attr:`expert_tp`, or tp."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def _experts_apart(self) -> bool:
        """Whether the experts' state is held and reduced apart from the dense state: with
        ep > 1, or split over an expert TP degree other than tp."""
        return self.ep > 1 or self._etp != self.tp

    @property
    def _expert_shards(self) -> int:
        """GPUs over which ZeRO shards the experts' state: the expert-data-parallel group,
        dp·cp/ep (dp·cp·tp/(e·ep) with an expert TP degree e of its own)."""
        if self.expert_tp is None:
            return self._shards // self.ep
        return self._shards * self.tp // (self.expert_tp * self.ep)

    @property
    def _tp_gather_bytes(self) -> float:
        """Bytes an element of a layer's TP all-gathers: 1 under ``precision: fp8`` with
        :attr:`tp_all_gather_fp8`, else bf16's 2."""
        return 1.0 if self.tp_all_gather_fp8 and self.precision == "fp8" else BF16

    @property
    def _bsh(self) -> float:
        return self._tokens * self.model.hidden_size

    @property
    def _rope_bytes(self) -> float:
        """HBM bytes per q and k element of the rotary embedding forward: :attr:`rope_bytes`,
        but the eager :data:`ROPE_BYTES` under multi-head latent attention, whose RoPE is
        never fused (NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/utils/fusions.py
        ``validate_rope_fusion_compatibility``: apply_rope_fusion "not compatible with
        multi_latent_attention")."""
        return ROPE_BYTES if self.model.mla is not None else self.rope_bytes

    @property
    def _flash(self) -> bool:
        return self.attention in FLASH_KERNELS

    @property
    def _vocab_div(self) -> int:
        """TP ranks the loss's vocabulary-sized tensors are split over."""
        return self.tp if self.vocab_parallel_loss else 1

    @property
    def _sp_div(self) -> int:
        """Replicated activations are split by t under sequence parallelism."""
        return self.tp if self.sequence_parallel else 1


COSTS_CACHE = 32
"""Cost models :func:`interned` keeps (the least recently used go first)."""


@lru_cache(maxsize=COSTS_CACHE)
def interned(costs: TransformerCosts) -> TransformerCosts:
    """The first cost model equal to ``costs`` still kept (else ``costs``, kept from now on):
    what its instance memos hold (:func:`workloads.kernels.per_instance`,
    :meth:`TransformerCosts.op_segments`) then serves every experiment with the same costs,
    as the cluster and the schedule do (:func:`topologies.build.build_cluster`,
    :func:`workloads.registry.built_schedule`).
    Equal cost models give the same answers: every method reads the fields alone."""
    return costs
