"""Costs of a transformer split into pipeline stages, TP shards and CP/EP groups. Pure.

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
  sharding, Rajbhandari et al. 2020 sec. 3.1; ZeRO-3's gathered working set,
  sec. 5.3.
- Context parallelism: ring attention (Liu et al. 2023) as Megatron-LM runs it:
  sequences split into 2·cp chunks (rank i: chunks i and 2cp − 1 − i) so each
  CP rank has 1/cp of the tokens and of the causal attention work; K/V passed
  around the CP ring, dK/dV too in backward (Megatron docs, context_parallel).
- Mixture of experts: router + top-k experts per token, all-to-all dispatch and
  combine over the EP group (Fedus et al. 2021; Megatron-LM MoE).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from workloads.activation_memory import ActivationMemory
from workloads.costs import (
    BF16,
    CommSeg,
    ComputeSeg,
    RingAttention,
    Segment,
    fuse_compute,
)
from workloads.elementwise import (
    BACKWARD_ELEMENTWISE,
    CROSS_ENTROPY_BYTES,
    FUSED_CROSS_ENTROPY_BYTES,
    GELU_BYTES,
    NORM_FUSED_BYTES,
    NORM_UNFUSED_BYTES,
    RESIDUAL_BYTES,
    ROPE_BYTES,
    SOFTMAX_PASSES,
    ElementwiseWork,
)
from workloads.kernels import gemm, on_fp8, per_instance, scaled
from workloads.model_state import ModelState
from workloads.models import ModelSpec
from workloads.moe_work import MoEWork
from workloads.recompute_modules import DEFAULT_RECOMPUTE_MODULES, layer_modules
from workloads.seqchunks import (
    FLASH_KERNELS,
    WHOLE_WINDOW,
    window_attention_share,
    window_tokens_share,
)
from workloads.stage_ops import StageOps

FLASH_BACKWARD_FACTOR = 2.5
"""FlashAttention-2 backward FLOPs / forward FLOPs (recomputes QK^T; Dao 2023)."""


@dataclass(frozen=True)
class TransformerCosts(StageOps, ElementwiseWork, MoEWork, ActivationMemory, ModelState):
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
    """``flash2``, ``flash1``, ``flash3`` (Hopper only), ``flash-triton`` (the flash kernels skip
    the causal mask's half of the score matrix and never store it), ``fused`` or ``unfused``."""
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
    zero3_unsharded_under_pp: bool = False
    """ZeRO-3 (dp·cp > 1) under pipeline parallelism: the framework gathers each stage's
    parameters once and keeps them unsharded (bf16) through the step, and accumulates the
    micro-batches' gradients unsharded in the reduction dtype (:attr:`grad_reduce_bytes`)
    until the last backward (torchtitan: ``reshard_after_forward=False`` with PP, and
    torch.distributed.pipelining's ``backward_maybe_with_nosync``): (2 + grad_reduce_bytes)
    bytes a parameter of the rank's stages held on top of the sharded state
    (:meth:`static_bytes`), none gathered per op (:meth:`zero3_working_bytes`). Memory
    only: the lowering still gathers and reduce-scatters per micro-batch."""
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
    optimizer_bytes: float = 28.0
    """HBM bytes per parameter of the GPU's shard that the step-end optimizer moves
    (:meth:`optimizer_segment`): 28 for a fused AdamW; a framework's eager optimizer and
    what it runs beside it (gradient clipping) move more (:mod:`workloads.frameworks`)."""
    tied_grad_reduce_bytes: float = 0.0
    """Bytes per element of the tied embedding's gradient in the all-reduce between the
    first and the last pipeline stage that hold its two copies (:meth:`tied_grad_bytes`,
    :mod:`workloads.lowering.tied`): 4 for DeepSpeed's fp32 copy under its bf16 optimizer.
    0: not emitted (:mod:`workloads.frameworks`)."""
    pp_send_blocking: bool = False
    """Each pipeline send blocks its sender's compute stream until the message has arrived
    (:mod:`workloads.lowering.pipeline`): DeepSpeed's pipeline engine sends with
    ``dist.send`` in its instruction stream, which the next instruction waits on. False:
    sends run on their own stream beside the compute (Megatron-LM's batched ``isend``)
    (:mod:`workloads.frameworks`)."""
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
    :data:`TP_OVERLAP_GEMMS`), set by :func:`sim.tpoverlap.with_overlap` from the device and
    collective timers; such a collective is emitted with that fixed time. Empty: every TP
    collective blocks and is timed on the network."""
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
    expert_tp: int | None = None
    """Expert tensor parallelism e (Megatron-core ``expert_tensor_parallel_size``); None: the
    attention's tp. The routed experts' weights are split over e GPUs, not tp: each GPU
    computes n·k·e rows (n = b·s/(cp·tp) its sequence-parallel tokens, gathered over the
    expert TP group after the all-to-all, ``MoEAlltoAllTokenDispatcher.dispatch_postprocess``)
    of width f_e/e, and holds E/ep experts' 1/e, their state sharded over the
    dp·cp·tp/(e·ep) GPUs holding the same shards. The all-to-all volume (n·k·h a GPU) and the
    activations (n·k·e rows of f_e/e) do not depend on e."""
    cp_kv_all_gather: bool = False
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

    # ------------------------------------------------------------- forward work of one layer
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
        ring = RingAttention(f"{name} ring", block, self.cp,
                             self._kv_pass_bytes() * (2 if backward else 1))
        return [proj, ring, qkv] if backward else [qkv, ring, proj]

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

    # ------------------------------------------------------------- segments
    def _block(self, label: str, compute: ComputeSeg | list[Segment],
               block: str = "") -> list[Segment]:
        """A TP-sharded block and its collectives (Megatron's f and g operators).

        Without SP: compute, then an all-reduce of the b·s·h output. With SP
        (Korthikanti et al. 2022, sec. 4.2.2): all-gather the sequence-split
        input, compute, reduce-scatter the output; the same bytes on the wire.
        ``block`` (``attn``, ``mlp bwd``, ...) names the collectives in
        :attr:`tp_comm_exposed_s`; one found there gets its fixed exposed time.
        """
        body = compute if isinstance(compute, list) else [compute]
        if self.tp == 1:
            return body
        nbytes = BF16 * self._bsh
        if self.sequence_parallel:
            exposed = dict(self.tp_comm_exposed_s)
            ag, rs = f"{block} all-gather", f"{block} reduce-scatter"
            return [CommSeg(f"{label} all-gather", "tp", "all_gather", nbytes,
                            duration_s=exposed.get(ag)), *body,
                    CommSeg(f"{label} reduce-scatter", "tp", "reduce_scatter", nbytes,
                            duration_s=exposed.get(rs))]
        return [*body, CommSeg(f"{label} all-reduce", "tp", "all_reduce", nbytes)]

    def _layer_forward(self, name: str) -> list[Segment]:
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
        ew_attn, ew_mlp = self._backward_elementwise(ew_attn, ew_mlp)
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
        up-projection GEMMs and RoPE; ``core_attn``: the attention core's forward (and the
        softmax passes of a non-flash kernel).
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
                SOFTMAX_PASSES[self.attention] * BF16 * self._scores_elements())
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
