"""The experiment file: schema, loading and validation (DESIGN.md "User-facing contract").

Types, unknown keys and the rules among the ``cluster:`` keys are checked by
pydantic when the file is parsed (strict: ``"2"`` is not an integer, ``1`` is not
a boolean; the kind of cluster is read off its keys, :mod:`topologies.config`);
rules across sections (``tp·pp·dp·cp`` equals the GPU count, the global batch
divides evenly, ...) are checked when the experiment is built. Every failure is
a :class:`~base.errors.ConfigError` whose message names the key and the offending
value.
"""

# (no `from __future__ import annotations`: pydantic would rebuild every field's type
# from its text, a `compile` of each; ~170 of them a run for this module and
# topologies.config together)
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, Tag, ValidationError, field_validator, model_validator

from base.errors import ConfigError
from base.schema import INVALID, Strict, invalid
from sim.collectives import check as check_collective
from sim.faults_config import FaultsConfig
from sim.swarm_config import SwarmConfig
from topologies.config import ClusterConfig
from topologies.placement import DEFAULT_ORDER
from workloads.registry import SCHEDULES

MAX_SIZES = {
    "seq_length": 1 << 24,
    "num_layers": 1 << 12,
    "hidden_size": 1 << 18,
    "num_attention_heads": 1 << 14,
    "num_kv_heads": 1 << 14,
    "ffn_hidden_size": 1 << 20,
    "vocab_size": 1 << 24,
    "num_experts": 1 << 14,
    "micro_batch_size": 1 << 20,
}
"""Upper bounds of the model's and the batch's sizes: 10 to 100 times the largest published
models (GPT-3 175B: 96 layers, h = 12,288; Megatron-LM's 1T: 128 layers, h = 25,600;
Gemma: 256k vocabulary; Llama 4 Scout: 10M-token context; DeepSeek-V3: 256 experts), so
that a typo such as ``hidden_size: 1e30`` is an error naming the key, not a result (the
costs of such sizes overflow and are no longer meaningful)."""


MAX_BATCH_SIZES = 100
"""Most entries of ``training.global_batch_schedule`` (Lau et al. 2025 grow the batch a
handful of times)."""


MAX_SYNC_EVERY = 1_000_000
"""Largest ``training.sync_every`` (DiLoCo synchronises every 500 steps)."""
MAX_STALENESS = 16
"""Largest ``training.max_staleness``: each step of staleness adds two simulated steps
(:func:`sim.dpmodes.stale_steps`); stale-synchronous runs use a few (Ho et al. 2013)."""
MAX_TOKENS_FACTOR = 100.0
"""Largest ``training.tokens_factor``."""
MAX_EXPONENT = 10.0
"""Largest magnitude of a batch statistic's power-law exponent (the gradient noise scale
grows about as the inverse loss, McCandlish et al. 2018: exponents near 1)."""


def _no_scopes() -> list:
    """An empty list: ``cuda_graph_scope``'s default (not ``default_factory=list``: pydantic
    asks a factory's signature, and a builtin's is parsed from its text by ``tokenize``,
    whose pattern compiled for it was ~2 ms of every start)."""
    return []


def check_sizes(sizes: dict[str, Any], where: str = "model") -> None:
    """ConfigError naming the first of ``sizes`` above its :data:`MAX_SIZES` bound (for a
    model read from a Hugging Face config, where the schema's bounds do not apply)."""
    for key, value in sizes.items():
        bound = MAX_SIZES.get(key)
        if bound is not None and isinstance(value, int) and value > bound:
            sep = " " if where.endswith(":") else "."
            raise ConfigError(f"{where}{sep}{key}={value}: more than the {bound:,} this "
                              "simulator accepts")


class SyntheticModel(Strict):
    """Per-stage, per-micro-batch costs for schedule studies."""

    forward_ms: float = Field(ge=0)
    """Forward pass of one micro-batch through one stage."""
    backward_ms: float = Field(ge=0)
    """Backward pass (input and weight gradients together) of one micro-batch, one stage."""
    weight_grad_ms: float = Field(0.0, ge=0)
    """The weight-gradient part of backward_ms, run separately by zero-bubble schedules."""
    activation_MB: float = Field(0.0, ge=0)
    """Activations a stage keeps per micro-batch from its forward to its backward."""
    p2p_MB: float = Field(0.0, ge=0)
    """Bytes of each pipeline message (activation or gradient), MB = 1e6 B."""
    grad_MB: float = Field(0.0, ge=0)
    """Gradient bytes per stage reduced across DP replicas."""


class MoEConfig(Strict):
    """Mixture-of-experts MLPs (:class:`workloads.models.MoESpec`)."""

    num_experts: int = Field(gt=0, le=MAX_SIZES["num_experts"])
    """Experts per MoE layer."""
    top_k: int = Field(gt=0)
    """Experts each token is routed to."""
    expert_ffn_hidden_size: int | None = Field(None, gt=0, le=MAX_SIZES["ffn_hidden_size"])
    """Default: the model's ffn_hidden_size."""
    capacity_factor: float | None = Field(None, gt=0)
    """None: dropless; c: expert buffers of c·tokens·k/E rows, computed padded."""
    routing_imbalance: float = Field(1.0, ge=1.0)
    """Copies routed to the busiest EP rank over the mean (1: balanced, at most ep); dropless,
    ep > 1."""
    pad_to_capacity: bool = True
    """With capacity_factor: pad expert buffers to capacity (bytes and work scale by c);
    false: drop without padding, the busiest rank keeps min(c, routing_imbalance)."""
    router_num_groups: int | None = Field(None, ge=1)
    """Node-limited routing: groups of consecutive experts (Megatron-core
    ``moe_router_num_groups``, Hugging Face ``n_group``). Default: the imported config's, else 1."""
    router_group_topk: int | None = Field(None, ge=1)
    """Groups a token's top_k experts may come from (``moe_router_group_topk``, ``topk_group``);
    changes the flex dispatcher's bytes. Default: the imported config's, else 1."""


class SyntheticEncoder(Strict):
    """An encoder's per-rank, per-micro-batch costs, for schedule studies."""

    forward_ms: float = Field(ge=0)
    """The encoder forward one pipeline rank runs for one micro-batch (all its pieces)."""
    backward_ms: float = Field(ge=0)
    """The encoder backward one pipeline rank runs for one micro-batch."""
    activation_MB: float = Field(0.0, ge=0)
    """Activations a rank keeps per micro-batch from its encoder forward to its backward."""
    output_MB: float = Field(0.0, ge=0)
    """Each encoder message (features to the LLM, their gradient back, or between encoder
    stages), MB = 1e6 B."""


class EncoderConfig(Strict):
    """A multimodal model's encoder (a ViT): a preset, explicit sizes or synthetic costs,
    feeding the LLM its features; colocated on the LLM's GPUs (Feng et al. 2024)."""

    preset: str | None = None
    """An encoder preset (:data:`workloads.encoders.ENCODER_PRESETS`), e.g. ``vit-22b``."""
    synthetic: SyntheticEncoder | None = None
    """Per-rank costs instead of a transformer."""
    num_layers: int | None = Field(None, gt=0, le=MAX_SIZES["num_layers"])
    """Encoder transformer layers."""
    hidden_size: int | None = Field(None, gt=0, le=MAX_SIZES["hidden_size"])
    """Encoder width."""
    num_attention_heads: int | None = Field(None, gt=0, le=MAX_SIZES["num_attention_heads"])
    """Encoder attention heads; they divide its hidden_size."""
    ffn_hidden_size: int | None = Field(None, gt=0, le=MAX_SIZES["ffn_hidden_size"])
    """Encoder MLP inner width."""
    tokens_per_sample: int | None = Field(None, gt=0, le=MAX_SIZES["seq_length"])
    """Encoder tokens of one training sample (its image patches); or image_size and
    patch_size."""
    image_size: int | None = Field(None, gt=0)
    """Image side in pixels: tokens_per_sample = (image_size / patch_size)^2."""
    patch_size: int | None = Field(None, gt=0)
    """Patch side in pixels."""


class ModelConfig(Strict):
    """The model: a preset, a Hugging Face config or explicit sizes (a transformer), or
    synthetic per-stage costs; the size keys override a preset's or a config's."""

    preset: str | None = None
    """A model preset (:data:`workloads.models.PRESETS`), e.g. ``llama-13b``."""
    hf_config: str | None = None
    """Path of a Hugging Face config.json (relative to the experiment file)."""
    synthetic: SyntheticModel | None = None
    """Per-stage costs instead of a transformer, for schedule studies."""
    name: str | None = None
    """Shown in outputs; default: the preset's or the config's name (``custom`` otherwise)."""
    seq_length: int | None = Field(None, gt=0, le=MAX_SIZES["seq_length"])
    """Tokens per sequence."""
    num_layers: int | None = Field(None, gt=0, le=MAX_SIZES["num_layers"])
    """Transformer layers."""
    hidden_size: int | None = Field(None, gt=0, le=MAX_SIZES["hidden_size"])
    """Model width h."""
    num_attention_heads: int | None = Field(None, gt=0, le=MAX_SIZES["num_attention_heads"])
    """Query heads; they divide hidden_size."""
    num_kv_heads: int | None = Field(None, gt=0, le=MAX_SIZES["num_kv_heads"])
    """Key/value heads (grouped-query attention); default: num_attention_heads."""
    ffn_hidden_size: int | None = Field(None, gt=0, le=MAX_SIZES["ffn_hidden_size"])
    """MLP inner width."""
    vocab_size: int | None = Field(None, gt=0, le=MAX_SIZES["vocab_size"])
    """Vocabulary entries (embedding and output head rows)."""
    ffn_type: Literal["gelu", "swiglu"] | None = None
    """MLP: two GEMMs with GeLU, or three with SwiGLU."""
    norm: Literal["layernorm", "rmsnorm"] | None = None
    """Normalisation layers."""
    tied_embeddings: bool | None = None
    """The output head shares the input embedding's weights."""
    position_embedding: Literal["learned", "rope", "alibi"] | None = None
    """Learned position embeddings (a table), rotary ones (no weights) or ALiBi (no weights;
    a linear bias on the attention scores, Press et al. 2022: BLOOM, MPT)."""
    moe: MoEConfig | None = None
    """Mixture of experts; overrides a preset's (a dense preset becomes MoE)."""
    parallel_blocks: bool | None = None
    """GPT-J/GPT-NeoX parallel attention and MLP, x + attn(ln1(x)) + mlp(ln2(x)): one TP
    all-reduce per layer instead of two, the layer input kept once for both norms."""
    encoder: EncoderConfig | None = None
    """A multimodal model's encoder feeding this LLM; needs schedule ``encoder-first`` or
    ``optimus``."""


class EncoderParallelConfig(Strict):
    """The encoder's own layout on the LLM's GPUs (Optimus, Feng et al. 2024, sec. 4.1)."""

    tp: int | None = Field(None, ge=1)
    """Encoder tensor parallelism: 1 or the LLM's tp (default)."""
    pp: int = Field(1, ge=1)
    """Encoder pipeline stages; divides the LLM's pp."""
    dp: int | None = Field(None, ge=1)
    """Encoder data parallelism; default the GPUs over tp·pp; if given it must match."""
    pieces: int | None = Field(None, ge=1)
    """Ops each encoder stage's forward (and backward) of a micro-batch is cut into, for
    the schedule to place; default: one per layer of the stage."""


class ParallelConfig(Strict):
    """The layout: degrees of each kind of parallelism and how ranks map to GPUs."""

    tp: int = Field(1, ge=1)
    """Tensor parallelism (Megatron-LM)."""
    pp: int = Field(1, ge=1)
    """Pipeline parallelism: pipeline ranks."""
    dp: int | None = Field(None, ge=1)
    """Data parallelism; default: the GPUs over tp·pp·cp; if given, tp·pp·dp·cp is the GPUs."""
    cp: int = Field(1, ge=1)
    """Context parallelism (ring attention inside a flash kernel); 2·cp divides seq_length."""
    ep: int = Field(1, ge=1)
    """Expert parallelism, carved out of dp (mixture-of-experts models)."""
    vpp: int = Field(1, ge=1)
    """Model chunks per pipeline rank. Left out: the schedule's default
    (:attr:`workloads.registry.ScheduleKind.default_vpp`: 2 under the multi-chunk schedules,
    1 otherwise; :meth:`ExperimentConfig._default_vpp`)."""
    sequence_parallel: bool = False
    """Megatron-LM's sequence parallelism: norms and dropout split over the TP group."""
    zero_stage: int = Field(1, ge=0, le=3)
    """ZeRO stage: 0 none, 1 optimizer states, 2 and gradients, 3 and parameters (FSDP:
    layer-by-layer gathers, prefetched)."""
    placement: str = DEFAULT_ORDER
    """Rank order of the parallel dimensions, innermost first (e.g. ``tp-cp-dp-pp``: TP
    groups inside a server); ``ep`` may appear too."""
    overlap_grad_reduce: bool = False
    """Reduce DP gradient buckets while the last backward runs (Megatron-LM
    ``--overlap-grad-reduce``); False: one collective per stage after it."""
    tp_comm_overlap: bool = False
    """TP communication overlap (Megatron-core ``--tp-comm-overlap``, Transformer Engine's
    userbuffers; NeMo's performance recipes turn it on): each sequence-parallel all-gather
    and reduce-scatter of a layer is cut into chunks pipelined with the GEMM next to it,
    the GEMM on the SMs the communication leaves it (:mod:`sim.tpoverlap`, methods and SM
    counts as data with their source in ``sim/data/tp_overlap.toml``). Needs
    sequence_parallel when tp > 1 (as Megatron-LM); dense attention + MLP layers on one GPU
    type only."""
    grad_bucket_MB: float | None = Field(None, gt=0)
    """Bucket size with overlap_grad_reduce, MB of gradients (1 MB = 1e6 B). Default None:
    the rule of ``training.framework``'s profile (``grad_bucket_params`` in
    workloads/frameworks.toml, :func:`workloads.frameworks.grad_bucket_bytes`): Megatron-LM
    and llama3 as Megatron-core, max(40M, 1M·dp) parameters
    (megatron/core/distributed/distributed_data_parallel.py, ``DistributedDataParallel.__init__``
    at core_r0.8.0) of the profile's gradient bytes, i.e. 80 MB of bf16 up to dp = 40;
    Megatron-Bridge 128 Mi parameters (its ``CommOverlapConfig``); under these three only
    stage 0 is cut into buckets, every later model chunk being one (Megatron-core);
    nemo-launcher apex DistributedFusedAdam's 125 MiB of bf16 gradients (the launcher's
    ``bucket_cap_mb``) on every model chunk; a
    profile without a rule (deepspeed, fsdp, scaling, llm-foundry): PyTorch DDP's
    ``bucket_cap_mb=25``. A value given here overrides the profile."""
    overlap_param_gather: bool = False
    """All-gather the distributed optimizer's updated parameters under the next step's
    first forward instead of after the optimizer step (Megatron-LM
    ``--overlap-param-gather``, which needs ``--overlap-grad-reduce`` and the distributed
    optimizer: overlap_grad_reduce and zero_stage 1 or 2). As Megatron-core r0.8.0: stage 0
    layer by layer as its forward reaches them, every other stage whole (one bucket), each
    rank's gathers one chain dispatched from the step's start."""
    layers_per_stage: list[int] | str | None = None
    """Transformer layers of each pipeline stage (model chunk, pp·vpp of them, in stage
    order), e.g. [15, 16, 16, 15]; default: as even as possible, earlier stages first.
    ``balanced``: the integer split that minimises the slowest pipeline rank's compute
    time per micro-batch on its own GPUs (faster GPUs get more layers; the stage with
    the output head fewer), from the cost and device models. ``auto``: the split (one
    chunk per rank) minimising the slowest stage with its pipeline send/recv over the
    actual links and within each stage's memory, by dynamic programming
    (:func:`sim.partition.auto_layers`)."""
    microbatch_group_size: int | None = Field(None, ge=1)
    """N, consecutive micro-batches each model chunk runs before the next chunk (schedule
    ``interleaved``; Megatron-core's ``microbatch_group_size_per_vp_stage``,
    megatron/core/model_parallel_config.py, the N Llama 3 tunes, Dubey et al. 2024, sec.
    3.3.2): rank r warms up with 2·(pp − r − 1) + (vpp − 1)·N chunk forwards. Megatron's
    rules: pp ≤ N ≤ micro-batches, and the remainder of micro-batches over N 0 or ≥ pp.
    Default: groups of pp (Megatron's default), for micro-batches not a multiple of pp
    groups as even as possible."""
    dp_mode: Literal["allreduce", "parameter_server"] = "allreduce"
    """How DP replicas combine gradients: ``allreduce`` (collectives, the default) or
    ``parameter_server`` (Li et al. 2014; Zou et al. 2017): the parameters are sharded
    over ``ps_servers`` server ranks, the last GPUs of the cluster, and every worker
    pushes each shard's gradients to its server and pulls the updated shard back, as
    flows (:mod:`workloads.lowering.paramserver`)."""
    ps_servers: int = Field(1, ge=1)
    """Parameter servers (``dp_mode: parameter_server``): the last ``ps_servers`` ranks of
    the cluster, each holding 1/ps_servers of every stage's parameters; the layout's
    tp·pp·dp·cp covers the GPUs before them."""
    encoder: EncoderParallelConfig | None = None
    """The layout of ``model.encoder``; default: tp as the LLM's, one stage, the rest DP."""
    swarm: SwarmConfig | None = None
    """SWARM parallelism: a pool of peers per pipeline stage, stochastically wired
    (:mod:`sim.swarm_config`); None: one GPU per stage and replica."""
    moe_dispatcher: Literal["alltoall", "flex"] = "alltoall"
    """How MoE tokens reach their experts (Megatron-core ``moe_token_dispatcher_type``):
    ``alltoall`` sends every routed copy, b·s·k·h per GPU; ``flex`` (DeepEP/HybridEP,
    ``moe_enable_deepep``) sends a token once to each server holding one of its experts and
    forwards it there over NVLink (inside one server: once per GPU), b·s·D·h, D the expected
    distinct servers (GPUs) under model.moe's node-limited routing
    (:mod:`workloads.moe_dispatch`)."""
    moe_a2a_overlap: bool = False
    """Megatron-core's EP communication overlap (``--overlap-moe-expert-parallel-comm``,
    Megatron-Bridge ``moe_a2a_overlap``): the forward of one micro-batch and the backward of
    another run layer by layer together, each one's all-to-alls hidden behind the other's
    attention or expert compute; each is exposed by max(0, its time − its partner's)
    (:mod:`sim.a2aoverlap`). Needs expert parallelism."""
    expert_tp: int | None = Field(None, ge=1)
    """Expert tensor parallelism (Megatron-core ``--expert-tensor-parallel-size``,
    ``ModelParallelConfig.expert_tensor_parallel_size``): the MoE layers' routed experts are
    split over this many GPUs instead of tp; with ep they form each (pp, cp) slice's expert
    grid (expert TP innermost, then EP, then expert data parallelism, as Megatron-core's
    expert ``RankGenerator``), so expert_tp·ep divides tp·dp and the experts' gradients are
    reduced over dp·cp·tp/(expert_tp·ep) GPUs. Default: tp (Megatron's default). With
    expert_tp != tp: a MoE model, sequence_parallel when tp > 1, and expert_tp·ep a multiple
    of tp (:mod:`workloads.transformer` ``TransformerCosts.expert_tp``)."""


class StatisticCurve(Strict):
    """The gradient statistic a batch policy reads, over training steps: a CSV file or an
    analytic power law (one of the two)."""

    csv: str | None = None
    """Path of a CSV file (relative to the experiment file) with a header and rows
    ``step,value``, steps increasing from 0; between rows the value of the last row."""
    initial: float | None = Field(None, gt=0)
    """Power law: the value at step 0."""
    exponent: float = Field(0.0, ge=-MAX_EXPONENT, le=MAX_EXPONENT)
    """Power law: value(step) = initial·(1 + step)^exponent."""

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        """Exactly one of a CSV file and a power law."""
        if (self.csv is None) == (self.initial is None):
            raise invalid("training.batch_policy.statistic: give either csv or initial "
                          f"(and exponent), got csv={self.csv!r}, initial={self.initial!r}")
        return self


class BatchPolicyConfig(Strict):
    """An adaptive global batch (Lau et al. 2025, the norm test of Byrd et al. 2012): every
    ``test_interval`` steps the batch grows to ceil(statistic / eta²) sequences (rounded up
    to a multiple of micro_batch_size·dp, never shrinking, at most max_global_batch_size),
    where the statistic is the per-sequence gradient variance over the squared norm of
    the batch gradient, Var/||g||²."""

    rule: Literal["norm_test", "constant"] = "norm_test"
    """``norm_test`` (Lau et al. 2025) or ``constant`` (the fixed global batch)."""
    eta: float = Field(0.1, gt=0, le=1)
    """η of the norm test: the tolerated ratio of the batch gradient's noise to its norm."""
    statistic: StatisticCurve | None = None
    """Var/||g||² over steps, which a real run would measure; required by norm_test."""
    test_interval: int = Field(1, ge=1)
    """Steps between tests (the batch changes only at multiples of it)."""
    max_global_batch_size: int | None = Field(None, ge=1)
    """Largest global batch; default: unbounded."""
    target_tokens: float | None = Field(None, gt=0)
    """Stop the run once this many tokens are trained (``--steps`` is then an upper
    bound): the time to a target token count, to set against a fixed batch."""


class TrainingConfig(Strict):
    """One optimizer step: batch sizes, recomputation, kernels."""

    micro_batch_size: int = Field(1, ge=1, le=MAX_SIZES["micro_batch_size"])
    """Sequences per micro-batch."""
    global_batch_size: int | None = Field(None, ge=1)
    """Sequences per optimizer step over all DP replicas; a multiple of
    micro_batch_size·dp."""
    num_microbatches: int | None = Field(None, ge=1)
    """Alternative to global_batch_size: micro-batches per step per pipeline."""
    recompute: Literal["none", "selective", "selective-op", "full"] = "none"
    """Activation recomputation: none, selective (attention core, Korthikanti et al. 2022),
    selective-op (torchtitan's op-level selective checkpointing: the attention output and
    every other matmul's output kept, the rest recomputed) or full (each layer's forward
    rerun in its backward)."""
    attention: Literal["flash2", "flash1", "flash3", "flash-triton", "cudnn", "fused",
                       "unfused"] = "flash2"
    """Attention kernel: FlashAttention-2/-1/-3 (3 on Hopper GPUs only), flash-triton
    (FlashAttention in Triton, MPT's ``attn_impl: triton``: timed as FlashAttention-1,
    :meth:`sim.device.DeviceProfile.attention_efficiency`), cudnn (cuDNN's fused flash
    attention, Transformer Engine's DotProductAttention on Hopper; timed as FlashAttention-2
    on GPUs without a measurement of it, where TE runs flash-attn), fused or unfused."""
    fused_norm: bool = True
    """Fused normalisation kernels (one memory pass instead of several)."""
    vocab_parallel_loss: bool | None = None
    """Megatron-LM's vocabulary-parallel cross entropy (each TP rank keeps V/t logits);
    false: the output head gathers all V logits on every TP rank and the loss runs
    unsplit there (t times the loss's memory and memory-bound work). Default: the
    framework's (:mod:`workloads.frameworks`)."""
    seq_chunks: int = Field(4, ge=1)
    """k, sequence chunks per micro-batch for schedule ``seq1f1b`` (Sun et al. 2024); others
    ignore it."""
    framework: Literal["megatron", "deepspeed", "fsdp", "fsdp-compile", "scaling", "llm-foundry",
                       "megatron-bridge", "llama3", "bigscience",
                       "megatron-core-r0.8", "nemo-launcher",
                       "nemo-launcher-2022", "nemo1-te-layer",
                       "megatron-lm-2021", "megatron-lm-2022"] = "megatron"
    """The training framework whose behaviour is simulated (:mod:`workloads.frameworks`,
    each field with its source): gradient reduction dtype, gradient buffer, loss over
    gathered or vocabulary-parallel logits, pipeline split, what is stashed for the
    backward, allocator fragmentation. megatron: Megatron-LM (and NeMo); deepspeed:
    Megatron-DeepSpeed with DeepSpeed's bf16 ZeRO-1; fsdp: PyTorch FSDP2 as torchtitan runs
    it; fsdp-compile: the same with every transformer block under torch.compile (torchtitan's
    ``--training.compile``: Inductor's fused SwiGLU, residual-and-norm and Float8 casts, and
    the backward's stash its partitioner chooses; ``fused_norm: false`` is refused with it);
    scaling: Aleph Alpha's, the framework of Hagemann et al.'s sweep; llm-foundry:
    MosaicML's MPT on Composer's FSDP1 (fused bf16 loss, fp32 gradient casts, packed
    attention inputs); megatron-bridge: Megatron-core as Megatron-Bridge's performance
    scripts launch it (Megatron-LM's behaviour, expandable allocator segments); llama3: Meta's
    stack for Llama 3 405B as Dubey et al. 2024, sec. 3.3.2 describe it (embedding and head
    each in a layer's place on the end stages, fp32 gradient accumulation and reduction);
    bigscience: deepspeed's, with BLOOM-176B's pipeline split (``--pp-partition-method
    'type:transformer|embedding'``: the embedding and the head each in a layer's place);
    megatron-core-r0.8: Megatron-core r0.8.0 on Transformer Engine 1.x (Megatron-LM's
    behaviour, TP-overlap GEMMs on every SM: no userbuffers SM margin); nemo-launcher: NeMo 1
    as NeMo-Framework-Launcher's H100 performance examples run it (Megatron-LM's behaviour,
    gradients synchronised as bf16: ``grad_sync_dtype=bf16``); nemo-launcher-2022: NeMo 1.11
    with apex's DistributedFusedAdam of August 2022, as the NeMo Megatron 22.08 launcher's
    GPT-3 configs run it (fp32 gradient sync in apex's 100 MiB buckets on every model chunk,
    the sequence-parallel reduce-scatter beside the weight gradient); nemo1-te-layer: NeMo 1's own
    GPT model on Transformer Engine's TransformerLayer, as the MLPerf Training v3.0/v3.1 GPT-3
    submissions ran it (nemo-launcher's, with TE's LayerNormMLP: the GeLU writes fp8);
    megatron-lm-2021: Megatron-LM of 2021 as Narayanan et al. ran it (Megatron-LM's
    behaviour, pipeline sends blocking on the interleaved schedule too);
    megatron-lm-2022: Megatron-LM of May 2022 (d898a89, Korthikanti et al.'s sequence
    parallelism) without a distributed optimizer: the sequence-parallel reduce-scatter beside
    the weight gradient, pipeline sends that block, Float16OptimizerWithFloat16Params' copies,
    and under fp16 the weight gradients added into the grad buffer after each backward."""
    allocator: Literal["caching", "expandable-segments"] | None = None
    """The PyTorch CUDA allocator setting the run uses, which sets the overhead on dynamic
    memory (``workloads/allocators.toml``): caching (PyTorch's default: the device profile's
    fitted fragmentation) or expandable-segments (``PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True``: 10%). Default: the framework's (and its own figure, where its
    profile sets one)."""
    cuda_graph_scope: list[Literal["attn", "moe_router", "moe_preprocess"]] = Field(
        default_factory=_no_scopes)
    """Parts of each MoE layer captured in CUDA graphs and replayed without the CPU issuing
    their kernels (Megatron-core ``--cuda-graph-impl transformer_engine --cuda-graph-scope``):
    attn (attention), moe_router (the router, and the shared experts), moe_preprocess (the
    dispatch's metadata; with moe_router). Read where the framework synchronises the host per
    MoE layer (``moe_host_sync``, :mod:`sim.hostwait`): the attention part counts as captured
    with all three, the shared experts with moe_router; the routed experts never (dropless).
    Default: none."""
    precision: Literal["bf16", "fp16", "fp8", "fp8-current"] = "bf16"
    """Training precision: bf16 or fp16 (same tensor-core rate and bytes), or fp8 (the
    layers' GEMMs on FP8 tensor cores, Hopper or newer, and their saved inputs in fp8) with
    delayed scaling (each tensor's scale from its amax history, Transformer Engine's
    ``DelayedScaling``); ``fp8-current``: the same with per-tensor current scaling (TE's
    ``Float8CurrentScaling``, Megatron-core ``--fp8-recipe tensorwise``, Megatron-Bridge's
    ``fp8_cs``), whose casts first read their input for its amax."""
    fp8_param_gather: bool = False
    """With ``precision: fp8`` (or ``fp8-current``) and ``parallel.zero_stage: 3``: the
    parameter all-gathers move the layers' linear weights cast to fp8 (1 byte a parameter,
    not bf16's 2; norms, embedding and output head stay bf16), and the layers use them as
    gathered instead of casting their weights at every forward (torchtitan's
    ``--float8.enable_fsdp_float8_all_gather`` with
    ``--float8.precompute_float8_dynamic_scale_for_fsdp``, torchao's
    ``WeightWithDynamicFloat8CastTensor``); a dense transformer only. Default: bf16 gathers."""
    fp8_amax_reduction: Literal["tp-dp-cp", "tp-cp", "none"] | None = None
    """With ``precision: fp8`` (delayed scaling): the blocking all-reduce of the amaxes
    Transformer Engine issues at each model chunk's forward end and backward end
    (:mod:`sim.amaxreduce`), over ``tp-dp-cp`` (a pipeline stage's TP x DP x CP ranks,
    Megatron-core's default amax reduction group), ``tp-cp`` (``tp_only_amax_red``, or
    Megatron-core r0.8.0's group), or ``none`` (not blocking: Transformer Engine before 1.6
    with ``NVTE_ASYNC_AMAX_REDUCTION=1``). Default: the framework profile's."""
    recompute_num_layers: int | None = Field(None, ge=0)
    """Partial recomputation: ``recompute`` applies to the first this-many layers of each
    pipeline stage (model chunk), the rest stash everything (Megatron-LM's
    ``--recompute-method block --recompute-num-layers``). Default: every layer; nothing is
    recomputed with ``recompute: none``."""
    recompute_every_k_layers: int | None = Field(None, ge=1)
    """Selective layer recomputation: ``recompute`` applies to every k-th layer of the model
    (layers k, 2k, ..., counted from 1), the rest stash everything (torchtitan's
    ``selective_ac_option: "k"``). Not with recompute_num_layers."""
    recompute_modules: list[Literal["core_attn", "mla_up_proj", "layernorm", "mlp", "moe",
                                    "moe_act", "shared_experts"]] | None = None
    """With ``recompute: selective``, the modules recomputed (Megatron-core's
    ``--recompute-modules``; :data:`workloads.recompute_modules.RECOMPUTE_MODULES` says
    what each drops and reruns): core_attn (the attention core), mla_up_proj (MLA's
    up-projections and RoPE), layernorm (the norms not fused into a GEMM: MLA's input norm,
    a MoE layer's pre-MLP norm), mlp (dense layers' MLPs), moe (MoE layers whole), moe_act
    (the routed experts' activation), shared_experts. Default: [core_attn]. Each must
    exist in the model."""
    global_batch_schedule: list[list[int]] | None = Field(None, max_length=MAX_BATCH_SIZES)
    """``[[step, global_batch_size], ...]`` for ``sim run --steps N``: from each step on, that
    global batch (adaptive batch schedules, Lau et al. 2025); see :mod:`sim.faults`. At most
    :data:`MAX_BATCH_SIZES` entries (each batch size is simulated once)."""
    sync_every: int = Field(1, ge=1, le=MAX_SYNC_EVERY)
    """H, local SGD / DiLoCo (Douillard et al. 2023): replicas take H - 1 local steps
    without DP communication, then a synchronising step that all-reduces the outer
    gradients (the parameter deltas, as many bytes as the gradients) before the outer
    optimizer; 1: synchronous data parallelism. Needs ``parallel.zero_stage: 0`` (every
    replica keeps its own optimizer state)."""
    max_staleness: int = Field(0, ge=0, le=MAX_STALENESS)
    """S, asynchronous data parallelism with bounded staleness (Ho et al. 2013): no barrier
    between steps; a step's optimizer applies the DP communication of S steps before, so
    a worker waits only when it would run more than S steps ahead of the slowest; 0:
    synchronous. Needs ``parallel.zero_stage: 0``."""
    tokens_factor: float = Field(1.0, gt=0, le=MAX_TOKENS_FACTOR)
    """Statistical efficiency, set by the user: tokens this training needs to reach the
    loss of synchronous training, relative to it (1: as efficient; 1.25: 25% more).
    ``sim run --steps N`` then runs ceil(N·tokens_factor) steps, so that times to train
    compare fairly across ``sync_every``, ``max_staleness`` and ``dp_mode``."""
    batch_policy: BatchPolicyConfig | None = None
    """An adaptive global batch over ``sim run --steps N`` (Lau et al. 2025), instead of a
    fixed ``global_batch_schedule`` (:mod:`sim.batch_policy`)."""

    @field_validator("cuda_graph_scope")
    @classmethod
    def _graph_scope(cls, scope: list[str]) -> list[str]:
        """Each part once; moe_preprocess only with moe_router (Megatron-core's rule)."""
        if len(set(scope)) != len(scope):
            raise invalid(f"training.cuda_graph_scope={scope!r}: a part named twice")
        if "moe_preprocess" in scope and "moe_router" not in scope:
            raise invalid(f"training.cuda_graph_scope={scope!r}: moe_preprocess must be used "
                          "with moe_router (Megatron-core captures the EP preprocess with the "
                          "router)")
        return scope


class ExperimentConfig(Strict):
    """An experiment file: what trains (model, parallel, training, schedule), where
    (cluster) and what goes wrong (faults)."""

    name: str = "experiment"
    """Shown in outputs."""
    model: ModelConfig
    """The model."""
    cluster: ClusterConfig
    """The cluster: one of the kinds of :mod:`topologies.config`."""
    parallel: ParallelConfig = ParallelConfig()
    """The layout."""
    training: TrainingConfig = TrainingConfig()
    """Batch sizes, recomputation, kernels."""
    schedule: str = "1f1b"
    """A pipeline schedule by name (:data:`workloads.registry.SCHEDULES`) or the path of
    a schedule file."""
    faults: FaultsConfig | None = None
    """Stragglers, failures, link faults (:mod:`sim.faults_config`)."""

    @field_validator("cluster")
    @classmethod
    def _collective_algorithms(cls, cluster: Any) -> Any:
        """Every algorithm ``cluster.collectives`` names implements its op."""
        algos = getattr(cluster, "collectives", None)
        for op, algo in (algos.model_dump() if algos else {}).items():
            if algo not in (None, "auto"):
                try:
                    check_collective(op, algo)
                except ConfigError as exc:
                    raise invalid(f"cluster.collectives.{op}={algo!r}: {exc}") from None
        return cluster

    @model_validator(mode="after")
    def _default_vpp(self) -> Self:
        """A multi-chunk schedule without ``parallel.vpp`` gets two chunks per rank: the V
        schedules run exactly two, and one chunk would make ``interleaved`` plain 1F1B
        without a word. A ``vpp`` the file gives is kept (and checked by the schedule)."""
        kind = SCHEDULES.get(self.schedule)
        given = "vpp" in self.parallel.model_fields_set
        if kind is not None and kind.default_vpp != 1 and not given:
            return self.model_copy(update={"parallel": self.parallel.model_copy(
                update={"vpp": kind.default_vpp})})
        return self


def _models_in(annotation: Any) -> dict[str | None, type[BaseModel]]:
    """The models a field's annotation holds, by discriminator tag (None: untagged)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {None: annotation}
    out: dict[str | None, type[BaseModel]] = {}
    if get_origin(annotation) is Annotated:
        inner, *meta = get_args(annotation)
        tags = [m.tag for m in meta if isinstance(m, Tag)]
        for tag, model in _models_in(inner).items():
            out[tags[0] if tags else tag] = model
        return out
    for arg in get_args(annotation):
        out.update(_models_in(arg))
    return out


def _walk(root: type[BaseModel], loc: tuple) -> tuple[tuple, type[BaseModel] | None]:
    """An error's location without the tags of discriminated unions (the YAML has none),
    and the model that holds its last key."""
    clean: list = []
    model: type[BaseModel] | None = root
    holder: type[BaseModel] | None = None
    members: dict[str | None, type[BaseModel]] | None = None
    for part in loc:
        if members is not None:  # the tag of the kind a union chose
            model, members = members.get(part), None
            continue
        clean.append(part)
        if isinstance(part, int):
            continue
        holder = model
        field = model.model_fields.get(part) if model is not None else None
        found = _models_in(field.annotation) if field is not None else {}
        if any(tag is not None for tag in found):
            model, members = None, found
        else:
            model = found.get(None)
    return tuple(clean), holder


MAX_SHOWN = 80
"""Characters of an offending value an error line shows (a list of 10,000 entries is
named, not printed)."""


def _sections_with(root: type[BaseModel], name: str, holder: type[BaseModel] | None
                   ) -> list[str]:
    """The sections of ``root`` (``parallel``, ``training``, ...) other than ``holder`` with a
    key ``name``: where a key given in the wrong place (``tp`` at the top level) belongs."""
    found = []
    for section, field in root.model_fields.items():
        models = [m for m in _models_in(field.annotation).values() if m is not holder]
        if any(name in m.model_fields for m in models):
            found.append(section)
    return found


def _format_validation_error(exc: ValidationError, root: type[BaseModel]) -> str:
    err = exc.errors()[0]
    if err["type"] == INVALID:
        return err["msg"]
    loc, holder = _walk(root, tuple(p for p in err["loc"] if not str(p).startswith("function-")))
    key = ".".join(str(p) for p in loc) or "<top level>"
    if err["type"] == "extra_forbidden":
        known = list(holder.model_fields) if holder is not None else []
        import difflib  # (an error's hint only: not imported by a run)

        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        elsewhere = _sections_with(root, str(loc[-1]), holder)
        hint = f" (did you mean {close[0]!r}?)" if close else (
            f" (it belongs in the {' or '.join(f'{s}:' for s in elsewhere)} section, as "
            f"{' or '.join(f'{s}.{loc[-1]}' for s in elsewhere)})" if elsewhere else
            f" (known keys: {', '.join(known)})" if known else "")
        return f"unknown key {key!r}{hint}"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    if err["type"] == "model_type":  # a section given as something other than a mapping
        given = err.get("input")
        empty = " (an empty section: leave it out for its defaults)" if given is None else ""
        return f"{key}: input should be a mapping of keys, got {_value_text(given)}{empty}"
    msg = err["msg"][0].lower() + err["msg"][1:]
    return f"{key}: {msg}, got {_value_text(err.get('input'))}"


def _value_text(value: Any) -> str:
    """``value`` as an error line shows it: its repr, cut at :data:`MAX_SHOWN`."""
    shown = repr(value)
    if len(shown) > MAX_SHOWN:
        shown = shown[:MAX_SHOWN - 3] + "..."
    return shown


M = TypeVar("M", bound=BaseModel)


def validated(root: type[M], data: Any) -> M:
    """``data`` (a parsed file) validated as ``root``; ConfigError naming key and value."""
    if data is None:
        raise ConfigError("the experiment is empty; it needs at least 'model:' and 'cluster:' "
                          "(README.md, 'The experiment file')")
    if not isinstance(data, dict):
        raise ConfigError(f"the experiment must be a mapping of keys, got a "
                          f"{type(data).__name__}: {_value_text(data)}")
    try:
        return root.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, root)) from None


def parse_config(data: Any) -> ExperimentConfig:
    """Validate a parsed experiment mapping; raise ConfigError naming key and value."""
    return validated(ExperimentConfig, data)


MAX_YAML_DEPTH = 64
"""Deepest nesting of mappings and lists an input file may have (the experiment schema
needs 5; the YAML composer recurses once per level)."""
MAX_YAML_VALUES = 100_000
"""Most values (mappings, lists, scalars) a file may hold, counting every use of an
alias as a copy of what it names: a "billion laughs" file of a few lines would expand to
billions (the largest bundled example holds under 100)."""


class _InputLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what no input file needs: nesting deeper than
    :data:`MAX_YAML_DEPTH`, aliases that expand to more than :data:`MAX_YAML_VALUES`
    values, and a key given twice in one mapping (YAML forbids it; PyYAML keeps the
    last silently)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        if self.depth > MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise ConfigError(f"nesting deeper than {MAX_YAML_DEPTH} levels at line "
                              f"{mark.line + 1}")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _key_text(node: yaml.Node) -> str:
    return str(node.value) if isinstance(node, yaml.ScalarNode) else f"<{node.id} key>"


def _check_nodes(node: yaml.Node, path: str, sizes: dict[int, int]) -> int:
    """The values ``node`` expands to (aliases counted as copies, each node once thanks to
    ``sizes``); ConfigError on a duplicate key, naming its path, line and both values."""
    if id(node) in sizes:
        return sizes[id(node)]
    size = 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Node] = {}
        for key, value in node.value:
            name = _key_text(key)
            dotted = f"{path}.{name}" if path else name
            if name in seen and name != "<<":
                first = seen[name]
                raise ConfigError(f"duplicate key {dotted!r} at line {key.start_mark.line + 1} "
                                  f"(value {_shown(value)}; first given at line "
                                  f"{first.start_mark.line + 1} as {_shown(first)})")
            seen[name] = value
            size += _check_nodes(key, dotted, sizes) + _check_nodes(value, dotted, sizes)
    elif isinstance(node, yaml.SequenceNode):
        for k, item in enumerate(node.value):
            size += _check_nodes(item, f"{path}[{k}]", sizes)
    sizes[id(node)] = size
    if size > MAX_YAML_VALUES:
        raise ConfigError(f"{path or 'the document'} expands to more than {MAX_YAML_VALUES:,} "
                          "values (aliases count as copies)")
    return size


def _shown(node: yaml.Node) -> str:
    """A node as an error shows it: a scalar's text, or what kind of collection it is."""
    if isinstance(node, yaml.ScalarNode):
        text = repr(node.value)
        return text if len(text) <= 60 else text[:57] + "..."
    return "a mapping" if isinstance(node, yaml.MappingNode) else "a list"


def load_yaml_text(text: str) -> Any:
    """Parse YAML input text with :class:`_InputLoader`'s limits (ConfigError naming the
    key and line when one is broken, ``yaml.YAMLError`` on invalid syntax)."""
    loader = _InputLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_nodes(root, "", {})
        try:
            return loader.construct_document(root)
        except (ValueError, OverflowError) as exc:  # e.g. an integer of 5,000 digits
            raise ConfigError(f"a value cannot be read: {exc}") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file; ConfigError (not OSError or a YAML traceback) on any failure,
    including the limits of :func:`load_yaml_text`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"file {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"file {str(p)!r} is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file {str(p)!r}: {exc}") from None
    try:
        return load_yaml_text(text)
    except ConfigError as exc:
        raise ConfigError(f"file {str(p)!r}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid syntax"
        raise ConfigError(f"file {str(p)!r} is not valid YAML{where}: {problem}") from None


def is_jobs_file(data: Any) -> bool:
    """Whether a parsed input file is a multi-job file (it has a top-level ``jobs:``,
    :mod:`sim.jobs`)."""
    return isinstance(data, dict) and "jobs" in data


def set_dotted(data: dict, dotted: str, value: Any) -> dict:
    """Return a copy of nested ``data`` with ``a.b.c`` set to ``value`` (None removes it)."""
    out = dict(data)
    head, _, rest = dotted.partition(".")
    if rest:
        child = out.get(head) or {}
        if not isinstance(child, dict):
            raise ConfigError(f"{head}: is not a mapping, cannot set {dotted!r}")
        out[head] = set_dotted(child, rest, value)
    elif value is None:
        out.pop(head, None)
    else:
        out[head] = value
    return out
