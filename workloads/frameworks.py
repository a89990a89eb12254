"""Training frameworks as named profiles (``training.framework``): what each does differently
that changes step time or memory. Pure.

The profiles are data, ``frameworks.toml`` beside this module, every field next to the file
and function of that framework it was read from. Megatron-LM's is the default and is what
:class:`workloads.transformer.TransformerCosts` does without a profile; ``scaling`` is the
framework of Hagemann et al. 2023's sweep, which ``sim validate`` selects.

A profile changes a cost model through :func:`apply_framework` (gradient bytes on the wire and
in memory, the loss over gathered or vocabulary-parallel logits, what is stashed for the
backward, the framework's own copies around ZeRO-3 collectives and the attention kernel)
and the pipeline split through :func:`stage_layers`; the allocator's overhead on dynamic
memory (:func:`fragmentation`: the profile's own, else that of the PyTorch allocator setting it
runs, ``allocators.toml``, else the device profile's fitted one) is read by the statistics, the
search's bounds and ``layers_per_stage: auto``.

A table may start from another with ``inherits = "<name>"``: it takes every field (and source)
of that table and gives only what differs, e.g. Megatron-Bridge's performance scripts, which
run Megatron-core as Megatron-LM does with their own allocator setting.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from base.errors import ConfigError
from base.replaced import fast_replace as replace  # dataclasses.replace, ~20x faster on costs
from workloads.costs import split_layers
from workloads.elementwise import FP8_WEIGHT_CASTS

STAGE_SPLITS = ("even", "uniform-items", "ends-as-layers")
TP_OVERLAPS = ("userbuffers", "symmetric-memory", "none")
"""How a framework overlaps its TP collectives with their GEMMs under
``parallel.tp_comm_overlap`` (:attr:`FrameworkProfile.tp_overlap`, :mod:`sim.tpoverlap`)."""
"""How a framework places transformer layers on pipeline stages (:func:`stage_layers`)."""
SEND_BLOCKING = ("never", "always", "non-interleaved")
"""Where pipeline sends block their sender (:attr:`FrameworkProfile.pp_send_blocking`): on no
schedule, on every schedule, or where a pipeline rank holds one stage (Megatron-LM without a
virtual pipeline, :func:`workloads.lowering.pipeline.sends_block`)."""

FP8_AMAX_REDUCTIONS = ("tp-dp-cp", "tp-cp", "none")
"""Over which ranks FP8 delayed scaling's amaxes are all-reduced, blocking, at each model
chunk's forward and backward end (:attr:`FrameworkProfile.fp8_amax_reduction`): a pipeline
stage's TP x DP x CP ranks, its TP x CP ranks, or not blocking (:mod:`sim.amaxreduce`)."""


@dataclass(frozen=True)
class FrameworkProfile:
    """One framework's behaviour; every field's source is in :attr:`sources`."""

    name: str
    """The key of ``training.framework``."""
    summary: str
    """Which framework, which version and configuration."""
    dp_wire_bytes: float
    """Bytes per parameter each of the two step-end DP collectives moves under ZeRO 0-2
    (gradient reduce-scatter before the optimizer, parameter all-gather after it):
    :attr:`workloads.transformer.TransformerCosts.dp_wire_bytes`."""
    grad_reduce_bytes: float
    """Bytes per gradient element in the reductions that run during the backward (buckets of
    ``overlap_grad_reduce``, ZeRO-3's per-layer reduce-scatters): 2 bf16, 4 fp32."""
    grad_buffer_bytes: float
    """Bytes per parameter of the gradient buffer the framework keeps (ZeRO 0-1: whole; ZeRO
    2-3: sharded), :func:`workloads.memory.model_state_bytes_per_param`."""
    vocab_parallel_loss: bool
    """Loss over vocabulary-parallel logits (True) or over logits gathered on every TP rank."""
    stage_split: str
    """``even`` (transformer layers as even as possible, embedding and head on top),
    ``uniform-items`` (embedding, layers, norm and head as items split uniformly) or
    ``ends-as-layers`` (the embedding and the head each in a transformer layer's place)."""
    sp_saves_gathered_input: bool
    """Under SP the column-parallel GEMMs save their all-gathered input (4·s·b·h a layer)."""
    kept_stage_outputs: int
    """Earlier micro-batches' bf16 logits the last stage still holds (pipeline buffers)."""
    allocator: str
    """The PyTorch CUDA allocator setting its runs use (:data:`ALLOCATORS`): ``caching`` (the
    default) or ``expandable-segments``."""
    fragmentation: float | None
    """The allocator's overhead on dynamic memory where the profile sets its own (bounded by its
    runs); None: the :attr:`allocator`'s (:func:`fragmentation`)."""
    fused_cross_entropy: bool
    """The loss is one fused kernel over the bf16 logits (no fp32 copy of them):
    :attr:`workloads.transformer.TransformerCosts.fused_cross_entropy`."""
    zero3_gather_copy_bytes: float
    """HBM bytes per parameter the framework's kernels move around each ZeRO-3 all-gather
    (a copy-out of the gathered buffer): ``TransformerCosts.zero3_gather_copy_bytes``."""
    zero3_reduce_copy_bytes: float
    """HBM bytes per parameter the framework's kernels move before each ZeRO-3
    reduce-scatter (cast to the reduction dtype, pre-division):
    ``TransformerCosts.zero3_reduce_copy_bytes``."""
    attention_copy_bytes: float
    """HBM bytes per element of Q, K, V and the attention output that copies around the
    attention kernel move forward: ``TransformerCosts.attention_copy_bytes``."""
    dropout: bool
    """Whether the framework's GPT-style (LayerNorm) models train with dropout and keep its
    masks: ``TransformerCosts.dropout``."""
    fp8_cast_bytes: float
    """HBM bytes per element of each FP8 GEMM's bf16 input that the framework's scaling and
    casting kernels move forward (``precision: fp8``): ``TransformerCosts.fp8_cast_bytes``."""
    fp8_norm_cast_fused: bool
    """With ``precision: fp8``: TransformerEngine's casts as Megatron-core's layer spec runs
    them (the QKV and first MLP GEMMs' inputs leave the norm kernel in fp8, the backward casts
    each GEMM's output gradient): ``TransformerCosts.fp8_norm_cast_fused``."""
    rope_bytes: float
    """HBM bytes per element of q and k that the framework's rotary embedding moves forward:
    ``TransformerCosts.rope_bytes``."""
    swiglu_bytes: float
    """HBM bytes per ffn element that the framework's silu(gate)·up moves forward:
    ``TransformerCosts.swiglu_bytes``."""
    swiglu_stash_bytes: float
    """Bytes per ffn element a gated MLP keeps for the backward, from silu(gate)·up to the down
    projection's input: ``TransformerCosts.swiglu_stash_bytes``."""
    zero3_unsharded_under_pp: bool
    """ZeRO-3 under PP keeps each stage's parameters and accumulated gradients unsharded
    through the step: ``TransformerCosts.zero3_unsharded_under_pp``."""
    vocab_parallel_loss_buffers: float
    """fp32 logit-sized buffers the vocabulary-parallel loss's forward holds beside the
    stashed logits (t > 1): ``TransformerCosts.vocab_parallel_loss_buffers``."""
    grad_accum_bytes: float
    """HBM bytes per parameter of a stage that the framework's gradient accumulation moves
    after every micro-batch's backward, outside the GEMMs (casting the bf16 gradients into
    an fp32 accumulation buffer): ``TransformerCosts.grad_accum_bytes``."""
    tied_grad_reduce_bytes: float
    """Bytes per element of the tied embedding's gradient all-reduced between the first and
    last pipeline stage after the last backward (0: not emitted):
    ``TransformerCosts.tied_grad_reduce_bytes``."""
    zero2_reduce_every_microbatch: bool
    """Under ZeRO-2 the gradients of every micro-batch are reduce-scattered unit by unit as its
    backward produces them and only the local shard is accumulated (True), instead of being
    accumulated whole and reduced once after the step's last backward (False):
    ``TransformerCosts.zero2_reduce_every_microbatch``."""
    cp_kv_all_gather: bool
    """Context parallelism all-gathers the whole sequence's K and V before each attention core,
    exposed (True), instead of Megatron-LM's ring of overlapped passes (False):
    ``TransformerCosts.cp_kv_all_gather``."""
    grad_bucket_params: float | None
    """Parameters per DP gradient bucket under ``overlap_grad_reduce`` at least (None: the
    framework's buckets are not modelled by a rule of its own; :func:`grad_bucket_bytes`)."""
    grad_bucket_params_per_dp: float | None
    """Parameters per bucket for each DP rank, where that exceeds :attr:`grad_bucket_params`
    (Megatron-core grows its buckets with the DP size); None or 0: a fixed bucket (0 lets a
    table undo what it inherits)."""
    grad_buckets_stage0_only: bool
    """Under ``overlap_grad_reduce`` only stage 0 (pipeline rank 0's first model chunk) is cut
    into buckets; every other stage's gradients are one bucket (Megatron-core); a table may
    leave it out (False: every stage bucketed, as PyTorch DDP):
    ``TransformerCosts.grad_buckets_stage0_only``."""
    optimizer_bytes: float | None
    """HBM bytes per parameter (of the GPU's shard) that the step-end optimizer and what the
    framework runs beside it move: ``TransformerCosts.optimizer_bytes`` (None: the cost
    model's fused AdamW, 28; a table may leave it out)."""
    pp_send_blocking: str
    """On which schedules each pipeline send blocks the sender's compute stream until it has
    arrived (:data:`SEND_BLOCKING`): ``always`` (DeepSpeed's ``p2p.send`` in its instruction
    stream, Megatron-LM 2021-22's ``torch.cuda.synchronize()`` after every exchange),
    ``non-interleaved`` (Megatron-core's 1F1B, and any schedule with one stage a rank; not
    its interleaved schedule under ``overlap_p2p_comm``), ``never``; a table may leave it
    out (``never``: sends beside the compute): ``TransformerCosts.pp_send_blocking``."""
    pp_partition_gathers: bool
    """Pipeline messages travel as 1/t partitions that each TP rank all-gathers before use
    (DeepSpeed's ``PartitionedTensor``); a table may leave it out (False: not counted):
    ``TransformerCosts.pp_partition_gathers``."""
    tp_overlap_sm_margin: bool
    """Under ``parallel.tp_comm_overlap`` Transformer Engine launches the pipelined and bulk
    overlaps' GEMMs on the SMs their communication kernels leave (``set_sm_margin``, TE
    2.x's default; the methods' ``sm_margin`` in ``sim/data/tp_overlap.toml``); False: every
    GEMM on all SMs (TE 1.x's default, ``set_sm_margin`` 0): :mod:`sim.tpoverlap`. A table
    may leave it out (True)."""
    tp_overlap: str
    """What ``parallel.tp_comm_overlap`` runs (:data:`TP_OVERLAPS`): ``userbuffers``,
    Transformer Engine's chunked GEMM + collective overlap; ``symmetric-memory``, PyTorch's
    async TP (Inductor's ``_micro_pipeline_tp`` pass: the all-gather / reduce-scatter
    matmul patterns it matches become per-rank chunk GEMMs beside copy-engine p2p copies
    through symmetric memory, the rest stay NCCL collectives); ``none``, the framework
    cannot overlap them (a ConfigError). A table may leave it out (``userbuffers``):
    :mod:`sim.tpoverlap`."""
    tp_all_gather_fp8: bool
    """Under ``precision: fp8`` its TP all-gathers move the fp8 cast of the gathered tensor
    (``TransformerCosts.tp_all_gather_fp8``); a table may leave it out (False: bf16)."""
    embedding_grad_bytes: float | None
    """HBM bytes per input-embedding parameter (of a TP rank's shard) its first stage's
    backward moves each micro-batch outside the GEMMs: PyTorch's dense embedding gradient and
    its accumulation into the gradient buffer (``TransformerCosts.embedding_grad_bytes``); a
    table may leave it out (None: not counted)."""
    bias_grad_bytes: float | None
    """HBM bytes per element of each biased linear layer's output that the backward's bias
    gradient moves outside the GEMMs (a reduction of the output gradient over the tokens):
    ``TransformerCosts.bias_grad_bytes``; a table may leave it out (None: not counted)."""
    qkv_split_grad_bytes: float | None
    """HBM bytes per element of the fused QKV projection's output that the backward of its
    split into Q, K and V moves (the three gradients concatenated into one):
    ``TransformerCosts.qkv_split_grad_bytes``; a table may leave it out (None: not counted)."""
    kept_grad_copy_bytes: float | None
    """Bytes per parameter (of the optimizer's shard) of a copy of the gradients that the
    optimizer step makes and nothing frees before the next step's forward and backward, so
    that it is held at their peak as model state is (Megatron-LM before 4fd6432, 2021-07,
    under --fp16: the fp32 ``main_param.grad``): ``TransformerCosts.kept_grad_copy_bytes``; a
    table may leave it out (None: 0, a copy freed before the forward or none)."""
    cp_ring_merge: bool
    """Its context parallelism is Transformer Engine's ring attention (``cp_comm_type``
    p2p), whose copies and merges around the attention kernels move HBM bytes a layer
    (``TransformerCosts.cp_ring_merge``); a table may leave it out (False: not counted)."""
    moe_host_sync: bool
    """Its dropless MoE layers synchronise the host with the GPU once per layer and run
    eagerly outside the parts ``training.cuda_graph_scope`` captures, so a layer waits for the
    CPU to issue its kernels wherever that takes longer than the GPU runs them
    (:mod:`sim.hostwait`); a table may leave it out (False: the CPU is taken to keep ahead):
    ``TransformerCosts.moe_host_wait_s``."""
    sp_async_grad_reduce_scatter: bool
    """Under sequence parallelism without userbuffers the backward reduce-scatters each
    column-parallel GEMM's input gradient beside its weight-gradient GEMM
    (``TransformerCosts.sp_async_grad_reduce_scatter``); a table may leave it out (False: it
    blocks)."""
    tp_async_grad_all_reduce: bool
    """Under tensor parallelism without sequence parallelism the backward all-reduces each
    column-parallel GEMM's input gradient beside its weight-gradient GEMM
    (``TransformerCosts.tp_async_grad_all_reduce``); a table may leave it out (False: it
    blocks)."""
    sp_regather_input: bool
    """Under sequence parallelism the backward of each column-parallel GEMM all-gathers its
    saved s/t input shard again for the weight gradient, beside the input-gradient GEMM
    (``TransformerCosts.sp_regather_input``); a table may leave it out (False: not timed)."""
    fp8_casts_compiled: bool
    """With ``precision: fp8``: the FP8 scaling casts as torch.compile's Inductor generates
    them for torchao's dynamic scaling: each tensor's amax fused into the kernel that
    produces it, each GEMM input cast once forward into its row- and column-major fp8
    copies (the latter for the weight gradient), the backward casting each GEMM's output
    gradient only (``TransformerCosts.fp8_casts_compiled``); a table may leave it out
    (False)."""
    fp8_act_cast_fused: bool
    """With ``precision: fp8``: the dense GeLU MLP is Transformer Engine's ``LayerNormMLP``,
    its activation writing fp8 and its backward one fused kernel
    (``TransformerCosts.fp8_act_cast_fused``); a table may leave it out (False)."""
    fp8_weight_casts: str
    """With ``precision: fp8``: how often the FP8 linears' bf16 weights are cast to fp8 with
    their transposes (:data:`workloads.elementwise.FP8_WEIGHT_CASTS`): ``step``, once a step
    at each model chunk's first micro-batch (Transformer Engine's ``is_first_microbatch``);
    ``microbatch``, in every forward; ``float8-linear``, as torchao's Float8Linear casts its
    weight itself at every forward and transposes the fp8 weight for the backward's
    input-gradient GEMM, or, with ``training.fp8_param_gather``, receives it already in fp8 from
    the parameter all-gather and only transposes it; ``none``, not counted
    (``TransformerCosts.fp8_weight_casts``); a table may leave it out (none)."""
    fp8_amax_reduction: str
    """With ``precision: fp8`` (delayed scaling): the group of Transformer Engine's blocking
    amax all-reduce at each model chunk's forward end and backward end
    (:data:`FP8_AMAX_REDUCTIONS`, :mod:`sim.amaxreduce`); ``training.fp8_amax_reduction``
    overrides it; a table may leave it out (none)."""
    grad_accum_first_stolen: bool
    """The first micro-batch of a step moves no :attr:`grad_accum_bytes`: autograd's
    ``.grad`` accumulation, whose first gradient is kept as it is and later ones added into
    it (:func:`apply_framework` charges ``grad_accum_bytes`` x (m - 1) / m a micro-batch over
    a step of m); a table may leave it out (False: every micro-batch)."""
    swiglu_saves_product: bool
    """The down projection keeps its input, silu(gate)·up, for its weight gradient (in fp8
    under ``precision: fp8``), as :attr:`swiglu_stash_bytes` counts it; False: the compiled
    graph recomputes it from the gate and up projections the backward keeps anyway
    (``TransformerCosts.swiglu_saves_product``); a table may leave it out (True)."""
    residual_norm_fused: bool
    """The attention block's residual add is fused with the MLP block's norm into one kernel
    (the sum is written once and not read back): ``TransformerCosts.residual_norm_fused``;
    a table may leave it out (False)."""
    torch_compile: bool
    """The framework runs each transformer block under ``torch.compile`` (torchtitan's
    ``--training.compile``), whose fusions the profile's byte fields count; its norm is one
    fused Inductor kernel, so ``training.fused_norm: false`` is refused with it. A table may
    leave it out (False: eager, or the framework's own kernels)."""
    cuda_module_loading: str
    """``eager`` or ``lazy``: how the CUDA runtime of the framework's runs loads module images
    into the context (:mod:`sim.reserved`); a table may leave it out (lazy: PyTorch 1.13 and
    later set CUDA_MODULE_LOADING=LAZY when unset)."""
    nccl_groups: tuple[str, ...]
    """The process groups a rank runs NCCL collectives on, each one communicator whose buffers
    the GPU holds (:data:`sim.reserved.NCCL_GROUPS`); a table may leave it out (Megatron-LM's:
    world, dp, tp, cp, pp, model_parallel, embedding)."""
    nccl_nvls: bool
    """Whether NCCL sets NVLink SHARP up where the hardware has it (NCCL_NVLS_ENABLE left at
    its default); a table may leave it out (True)."""
    nccl_version: str
    """The NCCL release the framework's runs used, as ``"2.18"``: which buffers a communicator
    sets up and how large NVLS's are (:mod:`sim.reserved`); a table may leave it out (2.12:
    rings and trees connected at creation, no NVLS, as every NCCL before 2.17)."""
    sources: tuple[tuple[str, str], ...]
    """(field, where in the framework's source it comes from), one per field above."""
    under_fp16: FrameworkProfile | None = None
    """The same framework under ``training.precision: fp16`` where that changes a field (the
    table's ``[<name>.fp16]`` sub-table: Megatron-LM reduces fp32 gradients under --bf16 but
    fp16 ones under --fp16); None: the same under every precision (:func:`framework`)."""

    def source(self, field: str) -> str:
        """Where ``field``'s value comes from."""
        return dict(self.sources)[field]


_FIELDS = ("dp_wire_bytes", "grad_reduce_bytes", "grad_buffer_bytes", "vocab_parallel_loss",
           "stage_split", "sp_saves_gathered_input", "kept_stage_outputs", "allocator",
           "fragmentation",
           "fused_cross_entropy", "zero3_gather_copy_bytes", "zero3_reduce_copy_bytes",
           "attention_copy_bytes", "dropout", "fp8_cast_bytes", "zero3_unsharded_under_pp",
           "vocab_parallel_loss_buffers", "grad_accum_bytes", "tied_grad_reduce_bytes",
           "grad_bucket_params", "grad_bucket_params_per_dp", "fp8_norm_cast_fused",
           "rope_bytes", "swiglu_bytes", "grad_buckets_stage0_only",
           "zero2_reduce_every_microbatch", "cp_kv_all_gather", "swiglu_stash_bytes",
           "optimizer_bytes", "pp_send_blocking", "pp_partition_gathers",
           "tp_overlap_sm_margin", "moe_host_sync", "cp_ring_merge", "embedding_grad_bytes",
           "bias_grad_bytes", "qkv_split_grad_bytes", "sp_regather_input",
           "fp8_casts_compiled", "swiglu_saves_product", "residual_norm_fused",
           "torch_compile", "grad_accum_first_stolen", "sp_async_grad_reduce_scatter",
           "tp_overlap", "tp_all_gather_fp8",
           "tp_async_grad_all_reduce", "fp8_weight_casts", "fp8_act_cast_fused",
           "fp8_amax_reduction", "cuda_module_loading", "nccl_groups", "nccl_nvls",
           "nccl_version", "kept_grad_copy_bytes")

MEGATRON_NCCL_GROUPS = ("world", "dp", "tp", "cp", "pp", "model_parallel", "embedding")
"""Megatron-LM's process groups that run NCCL collectives (megatron/core/parallel_state.py
initialize_model_parallel; :mod:`sim.reserved`), the default ``nccl_groups``."""

_BYTES = ("dp_wire_bytes", "grad_reduce_bytes", "grad_buffer_bytes", "zero3_gather_copy_bytes",
          "zero3_reduce_copy_bytes", "attention_copy_bytes", "fp8_cast_bytes", "grad_accum_bytes",
          "tied_grad_reduce_bytes", "rope_bytes", "swiglu_bytes",
          "swiglu_stash_bytes")
"""Fields that are bytes: finite numbers, not negative."""
_FLAGS = ("vocab_parallel_loss", "sp_saves_gathered_input", "fused_cross_entropy", "dropout",
          "zero3_unsharded_under_pp", "fp8_norm_cast_fused", "zero2_reduce_every_microbatch",
          "cp_kv_all_gather")
"""Fields that are true or false."""


_OPTIONAL = ("fragmentation", "grad_bucket_params", "grad_bucket_params_per_dp",
             "grad_buckets_stage0_only", "optimizer_bytes", "pp_send_blocking",
             "pp_partition_gathers", "tp_overlap_sm_margin", "moe_host_sync", "cp_ring_merge",
             "embedding_grad_bytes", "bias_grad_bytes", "qkv_split_grad_bytes",
             "sp_regather_input", "fp8_casts_compiled", "swiglu_saves_product",
             "residual_norm_fused", "torch_compile", "sp_async_grad_reduce_scatter",
             "tp_overlap", "tp_all_gather_fp8", "tp_async_grad_all_reduce",
             "fp8_weight_casts", "fp8_act_cast_fused", "fp8_amax_reduction",
             "cuda_module_loading", "nccl_groups", "nccl_nvls", "nccl_version",
             "kept_grad_copy_bytes", "grad_accum_first_stolen")
"""Fields a table may leave out (None, as ``optimizer_bytes``: the cost model's default; the
flags: their value in :data:`_OPTIONAL_FLAGS`), and then their source too."""


_OPTIONAL_FLAGS = {"grad_buckets_stage0_only": False,
                   "pp_partition_gathers": False, "tp_overlap_sm_margin": True,
                   "moe_host_sync": False, "cp_ring_merge": False, "sp_regather_input": False,
                   "fp8_casts_compiled": False, "swiglu_saves_product": True,
                   "residual_norm_fused": False, "torch_compile": False,
                   "sp_async_grad_reduce_scatter": False, "tp_all_gather_fp8": False,
                   "tp_async_grad_all_reduce": False, "fp8_act_cast_fused": False,
                   "nccl_nvls": True, "grad_accum_first_stolen": False}
"""The flags among :data:`_OPTIONAL`, each with the value a table that leaves it out takes."""

_CHOICES = {"tp_overlap": ("userbuffers", TP_OVERLAPS),
            "fp8_weight_casts": ("none", FP8_WEIGHT_CASTS),
            "pp_send_blocking": ("never", SEND_BLOCKING),
            "fp8_amax_reduction": ("none", FP8_AMAX_REDUCTIONS),
            "cuda_module_loading": ("lazy", ("eager", "lazy"))}
"""The fields among :data:`_OPTIONAL` that take one of a few names: (the value a table that
leaves it out takes, the names)."""


def _profile(name: str, table: dict[str, Any]) -> FrameworkProfile:
    """A profile from its TOML table (a missing ``fragmentation`` is None); ValueError naming
    the profile and field for a value of the wrong kind (a missing field, bytes that are not
    a non-negative number, a flag that is not true or false, an unknown stage split or
    allocator setting)."""
    missing = [f for f in _FIELDS if f not in _OPTIONAL and f not in table]
    missing += [f"{f}_source" for f in _FIELDS if f"{f}_source" not in table
                and (f not in _OPTIONAL or f in table)]
    if missing:
        raise ValueError(f"frameworks.toml [{name}]: no {', '.join(missing)}")
    values = {f: table.get(f) for f in _FIELDS}
    for field, (default, _) in _CHOICES.items():
        values[field] = table.get(field, default)
    values["nccl_groups"] = tuple(table.get("nccl_groups", MEGATRON_NCCL_GROUPS))
    values["nccl_version"] = table.get("nccl_version", "2.12")
    for flag, default in _OPTIONAL_FLAGS.items():
        values[flag] = table.get(flag, default)
    bad = [f for f in (*_BYTES, "vocab_parallel_loss_buffers") if isinstance(values[f], bool)
           or not isinstance(values[f], int | float) or not 0 <= values[f] < float("inf")]
    bad += [f for f in (*_FLAGS, *_OPTIONAL_FLAGS) if not isinstance(values[f], bool)]
    if bad:
        raise ValueError(f"frameworks.toml [{name}]: "
                         + ", ".join(f"{f}={values[f]!r}" for f in bad)
                         + " (bytes: a number >= 0; flags: true or false)")
    if values["stage_split"] not in STAGE_SPLITS:
        raise ValueError(f"frameworks.toml [{name}]: stage_split={values['stage_split']!r}")
    for field, (_, choices) in _CHOICES.items():
        if values[field] not in choices:
            raise ValueError(f"frameworks.toml [{name}]: {field}={values[field]!r} (one of "
                             f"{', '.join(choices)})")
    if not (isinstance(values["nccl_version"], str)
            and re.fullmatch(r"2\.\d+", values["nccl_version"])):
        raise ValueError(f"frameworks.toml [{name}]: nccl_version={values['nccl_version']!r} "
                         f"(a release as \"2.18\")")
    bad = [g for g in values["nccl_groups"] if g not in MEGATRON_NCCL_GROUPS]
    if bad:
        raise ValueError(f"frameworks.toml [{name}]: nccl_groups has {', '.join(map(repr, bad))} "
                         f"(each one of {', '.join(MEGATRON_NCCL_GROUPS)})")
    if values["allocator"] not in ALLOCATORS:
        raise ValueError(f"frameworks.toml [{name}]: allocator={values['allocator']!r} (one of "
                         f"{', '.join(ALLOCATORS)})")
    bad = [f for f in ("grad_bucket_params", "grad_bucket_params_per_dp")
           if values[f] is not None and (isinstance(values[f], bool)
                                         or not isinstance(values[f], int | float)
                                         or not (values[f] >= 0 if f.endswith("_per_dp")
                                                 else values[f] > 0)
                                         or values[f] == float("inf"))]
    if bad:
        raise ValueError(f"frameworks.toml [{name}]: "
                         + ", ".join(f"{f}={values[f]!r}" for f in bad)
                         + " (grad_bucket_params a number > 0, grad_bucket_params_per_dp >= 0)")
    frag = values["fragmentation"]
    if frag is not None and (isinstance(frag, bool) or not isinstance(frag, int | float)
                             or not 0 <= frag < float("inf")):
        raise ValueError(f"frameworks.toml [{name}]: fragmentation={frag!r} (a number >= 0)")
    for f in ("embedding_grad_bytes", "bias_grad_bytes", "qkv_split_grad_bytes",
              "kept_grad_copy_bytes"):
        v = values[f]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                              or not 0 <= v < float("inf")):
            raise ValueError(f"frameworks.toml [{name}]: {f}={v!r} (a number >= 0)")
    opt = values["optimizer_bytes"]
    if opt is not None and (isinstance(opt, bool) or not isinstance(opt, int | float)
                            or not 0 < opt < float("inf")):
        raise ValueError(f"frameworks.toml [{name}]: optimizer_bytes={opt!r} (a number > 0)")
    return FrameworkProfile(name=name, summary=table["summary"],
                            sources=tuple((f, table[f"{f}_source"]) for f in _FIELDS
                                          if f"{f}_source" in table),
                            **values)


def _inherited(name: str, tables: Mapping[str, dict[str, Any]], seen: tuple[str, ...] = ()
               ) -> dict[str, Any]:
    """Table ``name`` with what it inherits (``inherits = "<other>"``) filled in: the other
    table's fields and sources, overridden by its own; ValueError for an unknown or circular
    parent."""
    table = dict(tables[name])
    parent = table.pop("inherits", None)
    if parent is None:
        return table
    if parent not in tables or parent in seen:
        raise ValueError(f"frameworks.toml [{name}]: inherits={parent!r} is not another table")
    return {**_inherited(parent, tables, (*seen, name)), **table}


def _with_fp16(name: str, table: dict[str, Any]) -> FrameworkProfile:
    """The profile of ``table`` and, where it has an ``fp16`` sub-table (its fields and their
    sources under ``training.precision: fp16``), the one with those fields replaced."""
    sub = table.pop("fp16", None)
    profile = _profile(name, table)
    if sub is None:
        return profile
    if not isinstance(sub, dict) or any(k.removesuffix("_source") not in _FIELDS for k in sub):
        raise ValueError(f"frameworks.toml [{name}.fp16]: only fields of a profile and their "
                         f"sources")
    return replace(profile, under_fp16=_profile(name, {**table, **sub}))


def load_profiles(text: str) -> dict[str, FrameworkProfile]:
    """The profiles of a ``frameworks.toml`` text, by name (ValueError for a bad one)."""
    tables = tomllib.loads(text)
    return {name: _with_fp16(name, _inherited(name, tables)) for name in tables}


@dataclass(frozen=True)
class AllocatorSetting:
    """A PyTorch CUDA allocator setting (``allocators.toml``) and its overhead on dynamic
    memory."""

    name: str
    summary: str
    fragmentation: float | None
    """Overhead on dynamic memory; None: the device profile's fitted value."""
    source: str
    """Where :attr:`fragmentation` comes from."""


def load_allocators(text: str) -> dict[str, AllocatorSetting]:
    """The allocator settings of an ``allocators.toml`` text, by name (ValueError for a bad
    fragmentation or a missing source)."""
    out = {}
    for name, table in tomllib.loads(text).items():
        frag = table.get("fragmentation")
        if frag is not None and (isinstance(frag, bool) or not isinstance(frag, int | float)
                                 or not 0 <= frag < float("inf")):
            raise ValueError(f"allocators.toml [{name}]: fragmentation={frag!r}")
        if "fragmentation_source" not in table or "summary" not in table:
            raise ValueError(f"allocators.toml [{name}]: no summary or fragmentation_source")
        out[name] = AllocatorSetting(name, table["summary"], frag, table["fragmentation_source"])
    return out


ALLOCATORS: dict[str, AllocatorSetting] = load_allocators(
    files(__package__).joinpath("allocators.toml").read_text(encoding="utf-8"))
"""PyTorch CUDA allocator settings by name: caching (PyTorch's default), expandable-segments."""


_KEY = r'(?:"[^"\n]*"|[A-Za-z0-9_-]+)'
_HEADER = re.compile(rf"^\[ *({_KEY}) *(?:\. *{_KEY} *)*\] *$", re.MULTILINE)
"""A line that is a table's header and nothing else: ``[name]``, ``["name"]``,
``[name.fp16]`` (its first key is the profile's name)."""


def table_texts(text: str) -> dict[str, str]:
    """A ``frameworks.toml`` text cut into its profiles' tables, by name, in the file's
    order: each the lines from a header whose first key is that name (its table and its
    sub-tables) to the next header. Each parses (``tomllib``) as the file does for that
    name: a lone ``[name]`` line inside a multi-line string would break that, which
    ``tests/test_frameworks.py`` checks of the bundled file (every profile equal to
    :func:`load_profiles` of the whole text)."""
    marks = list(_HEADER.finditer(text))
    out: dict[str, str] = {}
    for k, mark in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        name = mark[1].strip('"')
        out[name] = out.get(name, "") + text[mark.start():end]
    return out


class _Tables(Mapping[str, dict[str, Any]]):
    """The TOML tables of :func:`table_texts`, each parsed when first read."""

    def __init__(self, texts: dict[str, str]) -> None:
        self._texts = texts
        self._parsed: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self._parsed:
            self._parsed[name] = tomllib.loads(self._texts[name])[name]
        return self._parsed[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)


class Profiles(MutableMapping[str, FrameworkProfile]):
    """:func:`load_profiles` of a ``frameworks.toml`` text, each profile built when first
    read (with the tables it inherits from): a run reads one, where Megatron 1T's ``sim run``
    parsed the whole 125 kB file, 15 profiles, at every start (~17 ms of CPU; its ``megatron``
    table ~3 ms). The names, in the file's order, are known at once. A dict otherwise (a
    test may replace a profile)."""

    def __init__(self, text: str) -> None:
        self._tables = _Tables(table_texts(text))
        self._names = dict.fromkeys(self._tables)
        self._built: dict[str, FrameworkProfile] = {}

    def __getitem__(self, name: str) -> FrameworkProfile:
        profile = self._built.get(name)
        if profile is None:
            if name not in self._names:
                raise KeyError(name)
            profile = self._built[name] = _with_fp16(name, _inherited(name, self._tables))
        return profile

    def __setitem__(self, name: str, profile: FrameworkProfile) -> None:
        self._names[name] = None
        self._built[name] = profile

    def __delitem__(self, name: str) -> None:
        del self._names[name]
        self._built.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _load() -> Profiles:
    return Profiles(files(__package__).joinpath("frameworks.toml").read_text(encoding="utf-8"))


FRAMEWORKS: Profiles = _load()
"""Profiles by name: megatron (the default), deepspeed, fsdp, fsdp-compile, scaling,
llm-foundry, megatron-bridge, llama3, bigscience, megatron-core-r0.8, nemo-launcher,
nemo-launcher-2022, nemo1-te-layer, megatron-lm-2021, megatron-lm-2022."""

DEFAULT_FRAMEWORK = "megatron"


def framework(name: str, precision: str | None = None) -> FrameworkProfile:
    """The profile called ``name`` (as it runs under ``precision`` where its table has an
    ``fp16`` sub-table and ``precision`` is fp16, :attr:`FrameworkProfile.under_fp16`);
    ConfigError listing the choices otherwise."""
    if name not in FRAMEWORKS:
        raise ConfigError(f"training.framework={name!r}: unknown framework; choose one of "
                          f"{', '.join(FRAMEWORKS)}")
    profile = FRAMEWORKS[name]
    if precision == "fp16" and profile.under_fp16 is not None:
        return profile.under_fp16
    return profile


def apply_framework(costs: Any, profile: FrameworkProfile, micro_batches: int,
                    vocab_parallel_loss: bool | None = None) -> Any:
    """``costs`` (a :class:`workloads.transformer.TransformerCosts`) as ``profile`` runs it,
    for a step of ``micro_batches`` micro-batches per pipeline: no earlier logits are kept in
    a step of one (a profile that keeps earlier stage outputs keeps the current one through
    its backward, ``stage_output_buffered``, whatever the count). ``vocab_parallel_loss``
    (the experiment's ``training.vocab_parallel_loss``) overrides the profile's when given."""
    loss = profile.vocab_parallel_loss if vocab_parallel_loss is None else vocab_parallel_loss
    return replace(costs, dp_wire_bytes=profile.dp_wire_bytes,
                   grad_reduce_bytes=profile.grad_reduce_bytes,
                   grad_buffer_bytes=profile.grad_buffer_bytes,
                   vocab_parallel_loss=loss,
                   sp_saves_gathered_input=profile.sp_saves_gathered_input,
                   fused_cross_entropy=profile.fused_cross_entropy,
                   zero3_gather_copy_bytes=profile.zero3_gather_copy_bytes,
                   zero3_reduce_copy_bytes=profile.zero3_reduce_copy_bytes,
                   attention_copy_bytes=profile.attention_copy_bytes,
                   dropout=profile.dropout,
                   fp8_cast_bytes=profile.fp8_cast_bytes,
                   fp8_norm_cast_fused=profile.fp8_norm_cast_fused,
                   rope_bytes=profile.rope_bytes, swiglu_bytes=profile.swiglu_bytes,
                   swiglu_stash_bytes=profile.swiglu_stash_bytes,
                   zero3_unsharded_under_pp=profile.zero3_unsharded_under_pp,
                   vocab_parallel_loss_buffers=profile.vocab_parallel_loss_buffers,
                   grad_accum_bytes=(profile.grad_accum_bytes * (micro_batches - 1)
                                     / max(micro_batches, 1)
                                     if profile.grad_accum_first_stolen
                                     else profile.grad_accum_bytes),
                   tied_grad_reduce_bytes=profile.tied_grad_reduce_bytes,
                   grad_buckets_stage0_only=profile.grad_buckets_stage0_only,
                   zero2_reduce_every_microbatch=profile.zero2_reduce_every_microbatch,
                   cp_kv_all_gather=profile.cp_kv_all_gather,
                   cp_ring_merge=profile.cp_ring_merge,
                   sp_regather_input=profile.sp_regather_input,
                   fp8_casts_compiled=profile.fp8_casts_compiled,
                   fp8_weight_casts=profile.fp8_weight_casts,
                   fp8_act_cast_fused=profile.fp8_act_cast_fused,
                   swiglu_saves_product=profile.swiglu_saves_product,
                   residual_norm_fused=profile.residual_norm_fused,
                   sp_async_grad_reduce_scatter=profile.sp_async_grad_reduce_scatter,
                   tp_all_gather_fp8=profile.tp_all_gather_fp8,
                   tp_async_grad_all_reduce=profile.tp_async_grad_all_reduce,
                   embedding_grad_bytes=profile.embedding_grad_bytes or 0.0,
                   bias_grad_bytes=profile.bias_grad_bytes or 0.0,
                   qkv_split_grad_bytes=profile.qkv_split_grad_bytes or 0.0,
                   kept_grad_copy_bytes=profile.kept_grad_copy_bytes or 0.0,
                   optimizer_bytes=(type(costs).__dataclass_fields__["optimizer_bytes"].default
                                    if profile.optimizer_bytes is None
                                    else profile.optimizer_bytes),
                   pp_send_blocking=profile.pp_send_blocking,
                   pp_partition_gathers=profile.pp_partition_gathers,
                   kept_stage_outputs=profile.kept_stage_outputs if micro_batches >= 2 else 0,
                   stage_output_buffered=profile.kept_stage_outputs > 0)


def grad_bucket_bytes(profile: FrameworkProfile, dp: int) -> float | None:
    """Gradient bytes per DP bucket of ``overlap_grad_reduce`` that ``profile`` uses at data
    parallel size ``dp``: max(:attr:`~FrameworkProfile.grad_bucket_params`,
    :attr:`~FrameworkProfile.grad_bucket_params_per_dp` x dp) parameters of
    :attr:`~FrameworkProfile.grad_reduce_bytes` each (Megatron-core:
    max(40,000,000, 1,000,000 x dp), i.e. 160 MB of fp32 gradients up to dp = 40); None
    where the profile has no rule of its own."""
    if profile.grad_bucket_params is None:
        return None
    params = max(profile.grad_bucket_params, (profile.grad_bucket_params_per_dp or 0.0) * dp)
    return params * profile.grad_reduce_bytes


def stage_layers(profile: FrameworkProfile, num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Transformer layers per pipeline stage (model chunk) as ``profile`` splits the model.

    ``even``: :func:`workloads.costs.split_layers`. ``uniform-items`` (Aleph Alpha's
    ``scaling``, ``pipe_partition_uniform``): the ``num_layers + 3`` items (embedding, layers,
    final norm, head) split uniformly over the stages, the first ``(num_layers + 3) mod
    stages`` taking one more; the first stage then holds one transformer layer fewer than its
    share and the last two fewer, e.g. 60 layers on 4 stages: 15, 16, 16, 13. ConfigError if
    a stage would hold no transformer layer. ``ends-as-layers`` (Llama 3's, Dubey et al. 2024,
    sec. 3.3.2: one transformer layer fewer on the first and on the last stage, for the
    embedding and for the output head and loss): the ``num_layers + 2`` places split as
    evenly as possible (earlier stages first), less one layer at each end, e.g. 126 layers
    on 128 stages: 0, 1, ..., 1, 0 (the first stage only the embedding, the last only the
    head), on 32 stages: 3, 4, ..., 4, 3. ConfigError if a stage between the ends would
    hold no transformer layer (the end stages may).
    """
    if profile.stage_split == "even" or num_stages == 1:
        return split_layers(num_layers, num_stages)
    if profile.stage_split == "ends-as-layers":
        places = list(split_layers(num_layers + 2, num_stages))
        places[0] -= 1
        places[-1] -= 1
        if min(places[1:-1], default=1) < 1 or min(places) < 0:
            raise ConfigError(f"{num_layers} layers on {num_stages} pipeline stages: framework "
                              f"{profile.name!r} puts the embedding and the output head each in "
                              "a layer's place, which leaves a stage between them without a "
                              f"transformer layer ({places})")
        return tuple(places)
    base, extra = divmod(num_layers + 3, num_stages)
    items = [base + (1 if s < extra else 0) for s in range(num_stages)]
    layers = [n - (1 if s == 0 else 0) - (2 if s == num_stages - 1 else 0)
              for s, n in enumerate(items)]
    if min(layers) < 1:
        raise ConfigError(f"{num_layers} layers on {num_stages} pipeline stages: framework "
                          f"{profile.name!r} splits them uniformly with the embedding, norm "
                          f"and head as {items}, which leaves a stage without a transformer "
                          "layer")
    return tuple(layers)


def with_allocator(profile: FrameworkProfile, allocator: str | None) -> FrameworkProfile:
    """``profile`` run with the allocator setting ``allocator`` (``training.allocator``): that
    setting's overhead replaces the profile's (its own figure too); None keeps the profile."""
    if allocator is None or allocator == profile.allocator and profile.fragmentation is None:
        return profile
    if allocator not in ALLOCATORS:
        raise ConfigError(f"training.allocator={allocator!r}: choose one of "
                          f"{', '.join(ALLOCATORS)}")
    sources = tuple((f, src) for f, src in profile.sources if f not in ("allocator",
                                                                         "fragmentation"))
    return replace(profile, allocator=allocator, fragmentation=None, sources=(
        *sources, ("allocator", "training.allocator of the experiment: "
                   + ALLOCATORS[allocator].summary)))


def fragmentation(profile: FrameworkProfile, device_fragmentation: float) -> float:
    """The allocator overhead a run of ``profile`` carries on dynamic memory: the profile's
    own where it sets one, else its allocator setting's (:data:`ALLOCATORS`), else the device
    profile's fitted ``device_fragmentation``."""
    if profile.fragmentation is not None:
        return profile.fragmentation
    own = ALLOCATORS[profile.allocator].fragmentation
    return device_fragmentation if own is None else own


