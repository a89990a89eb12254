"""The experiment file: schema, loading and validation (DESIGN.md "User-facing contract").

Types and unknown keys are checked by pydantic (strict: ``"2"`` is not an
integer, ``1`` is not a boolean); cross-field rules (``tp·pp·dp·cp`` equals the
GPU count, the global batch divides evenly, ...) are checked when the
experiment is built. Every failure is a :class:`~base.errors.ConfigError` whose
message names the key and the offending value.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from base.errors import ConfigError
from sim.faults_config import FaultsConfig
from topologies.placement import DEFAULT_ORDER
from workloads.registry import SCHEDULES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SyntheticModel(_Strict):
    """Per-stage, per-micro-batch costs for schedule studies."""

    forward_ms: float = Field(ge=0)
    backward_ms: float = Field(ge=0)
    weight_grad_ms: float = Field(0.0, ge=0)
    activation_MB: float = Field(0.0, ge=0)
    p2p_MB: float = Field(0.0, ge=0)
    """Bytes of each pipeline message (activation or gradient), MB = 1e6 B."""
    grad_MB: float = Field(0.0, ge=0)
    """Gradient bytes per stage reduced across DP replicas."""


class MoEConfig(_Strict):
    """Mixture-of-experts MLPs (:class:`workloads.models.MoESpec`)."""

    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_ffn_hidden_size: int | None = Field(None, gt=0)
    """Default: the model's ffn_hidden_size."""
    capacity_factor: float | None = Field(None, gt=0)
    """None: dropless; c: expert buffers of c·tokens·k/E rows, computed padded."""
    routing_imbalance: float = Field(1.0, ge=1.0)
    """Copies routed to the busiest EP rank over the mean (1: balanced); dropless, ep > 1."""


class ModelConfig(_Strict):
    preset: str | None = None
    hf_config: str | None = None
    """Path of a Hugging Face config.json (relative to the experiment file)."""
    synthetic: SyntheticModel | None = None
    name: str | None = None
    seq_length: int | None = Field(None, gt=0)
    num_layers: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    num_attention_heads: int | None = Field(None, gt=0)
    num_kv_heads: int | None = Field(None, gt=0)
    ffn_hidden_size: int | None = Field(None, gt=0)
    vocab_size: int | None = Field(None, gt=0)
    ffn_type: Literal["gelu", "swiglu"] | None = None
    norm: Literal["layernorm", "rmsnorm"] | None = None
    tied_embeddings: bool | None = None
    position_embedding: Literal["learned", "rope"] | None = None
    moe: MoEConfig | None = None
    """Mixture of experts; overrides a preset's (a dense preset becomes MoE)."""


CollectiveAlgo = Literal["auto", "ring", "tree", "halving_doubling", "hierarchical", "pairwise",
                         "nvls", "p2p"]


class CollectivesConfig(_Strict):
    """Per-op algorithm overrides (``auto`` = NCCL-like choice by size and group)."""

    all_reduce: CollectiveAlgo | None = None
    reduce_scatter: CollectiveAlgo | None = None
    all_gather: CollectiveAlgo | None = None
    all_to_all: CollectiveAlgo | None = None
    broadcast: CollectiveAlgo | None = None
    reduce: CollectiveAlgo | None = None
    send: CollectiveAlgo | None = None


class DragonflyConfig(_Strict):
    """Dragonfly shape (Kim et al. 2008): a routers per group, p GPUs per router, h global links."""

    routers_per_group: int = Field(gt=0)
    gpus_per_router: int = Field(gt=0)
    global_links_per_router: int = Field(gt=0)
    global_bandwidth_GBps: float | None = Field(None, gt=0)
    """Per direction; default: link_bandwidth_GBps (or the preset's NIC rate)."""
    global_latency_us: float | None = Field(None, ge=0)


class NodeGroupConfig(_Strict):
    """Servers of one type in a mixed cluster (``cluster.nodes``), listed in rank order."""

    count: int = Field(gt=0)
    """Servers (nodes) of this type."""
    preset: str | None = None
    """A server preset (``dgx-a100-80g``, ``dgx-h100``, ...): its GPU, GPUs per server,
    NVLink, NICs and NVLS."""
    gpu: str | None = None
    """A GPU type (``A100-80GB``, ``H100``, ...) for servers of an explicit topology
    (``cluster.gpus_per_node`` GPUs each, default 1)."""


class ClusterConfig(_Strict):
    """The cluster: a server preset on a fabric, or an explicit topology (units in the key names).

    With ``preset`` the servers (GPU, NVSwitch, NICs, latencies) come from the
    preset and ``topology`` may choose the fabric between them (switch =
    non-blocking crossbar, the default; fat-tree; rail-optimized; dragonfly).
    Without a preset, ``topology`` builds uniform links of ``link_bandwidth_GBps``.
    ``nodes`` replaces ``preset`` (or ``gpu``) for a heterogeneous cluster: groups of
    servers of different presets (or GPU types on ``topology``), in rank order.
    """

    num_gpus: int = Field(gt=0)
    preset: str | None = None
    topology: Literal["switch", "ring", "full-mesh", "torus2d", "torus3d", "fat-tree",
                      "rail-optimized", "dragonfly"] | None = None
    gpu: str | None = None
    nodes: list[NodeGroupConfig] | None = None
    """A heterogeneous cluster instead of ``preset``/``gpu``: groups of servers, each a
    ``preset`` or a ``gpu`` type and a ``count`` of servers, ranks numbered group after
    group, e.g. ``[{preset: dgx-a100-80g, count: 2}, {preset: dgx-h100, count: 2}]``."""
    nics_per_node: int | None = Field(None, gt=0)
    """With ``preset``: the servers' scale-out NICs (default: the preset's, one per GPU),
    each shared by gpus_per_node / nics_per_node GPUs, e.g. 2 for servers with two
    HDR ports instead of a DGX's eight; it must divide the GPUs per server."""
    link_bandwidth_GBps: float | None = Field(None, gt=0)
    """Per direction, 1 GB = 1e9 B."""
    link_latency_us: float | None = Field(None, ge=0)
    """Per hop."""
    collective_launch_us: float | None = Field(None, ge=0)
    """Per collective; default: the preset's (NCCL's 8.4 µs), 0 for explicit topologies."""
    collective_step_us: float | None = Field(None, ge=0)
    """Extra software latency per collective step, on top of the route's hop latencies."""
    collective_granularity: Literal["stream", "step"] | None = None
    """``stream`` (default): one flow per ring edge; ``step``: one flow per ring step."""
    collectives: CollectivesConfig | None = None
    gpus_per_node: int | None = Field(None, gt=0)
    """Explicit switched topologies: GPUs per NVSwitch server (default 1: no NVLink)."""
    nvlink_bandwidth_GBps: float | None = Field(None, gt=0)
    """Per direction; default: the GPU's."""
    nvlink_latency_us: float | None = Field(None, ge=0)
    nvls: bool | None = None
    """Explicit servers: NVSwitch reduces in-network (NVLink SHARP)."""
    dims: list[int] | None = None
    """Torus sizes per axis; their product is num_gpus."""
    oversubscription: float | None = Field(None, ge=1)
    """Fat-tree / rail-optimized leaf down:up port ratio, e.g. 2.0 for 2:1."""
    tiers: Literal[2, 3] | None = None
    gpus_per_leaf: int | None = Field(None, gt=0)
    """NIC ports per leaf switch (one per GPU on DGX servers; with ``nics_per_node``,
    that many per server); rail-optimized: servers per scalable unit."""
    leaves_per_pod: int | None = Field(None, gt=0)
    dragonfly: DragonflyConfig | None = None
    ecmp: Literal["dst-mod-k", "hash"] | None = None
    """How flows spread over equal-cost paths (default dst-mod-k)."""
    sites: int | None = Field(None, gt=0)
    """Geo-distributed: this many identical sites of num_gpus/sites GPUs, joined by WAN links."""
    wan_bandwidth_Mbps: float | None = Field(None, gt=0)
    """Per WAN link and direction, 1 Mb = 1e6 bit."""
    wan_latency_ms: float | None = Field(None, ge=0)


class ParallelConfig(_Strict):
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int | None = Field(None, ge=1)
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    vpp: int = Field(1, ge=1)
    """Model chunks per pipeline rank. Left out: the schedule's default
    (:attr:`workloads.registry.ScheduleKind.default_vpp`: 2 under the multi-chunk schedules,
    1 otherwise; :meth:`ExperimentConfig._default_vpp`)."""
    sequence_parallel: bool = False
    zero_stage: int = Field(1, ge=0, le=3)
    placement: str = DEFAULT_ORDER
    overlap_grad_reduce: bool = False
    """Reduce DP gradient buckets while the last backward runs (Megatron-LM
    ``--overlap-grad-reduce``); False: one collective per stage after it."""
    grad_bucket_MB: float = Field(25.0, gt=0)
    """Bucket size with overlap_grad_reduce, MB of bf16 gradients (1 MB = 1e6 B). Default:
    PyTorch DDP's ``bucket_cap_mb=25``; Megatron-core's is max(40M, 1M·dp) parameters
    (``DistributedDataParallelConfig.bucket_size``), i.e. 80 MB up to dp = 40."""
    layers_per_stage: list[int] | str | None = None
    """Transformer layers of each pipeline stage (model chunk, pp·vpp of them, in stage
    order), e.g. [15, 16, 16, 15]; default: as even as possible, earlier stages first.
    ``balanced``: the integer split that minimises the slowest pipeline rank's compute
    time per micro-batch on its own GPUs (faster GPUs get more layers; the stage with
    the output head fewer), from the cost and device models."""


class TrainingConfig(_Strict):
    micro_batch_size: int = Field(1, ge=1)
    global_batch_size: int | None = Field(None, ge=1)
    num_microbatches: int | None = Field(None, ge=1)
    """Alternative to global_batch_size: micro-batches per step per pipeline."""
    recompute: Literal["none", "selective", "full"] = "none"
    attention: Literal["flash2", "flash1", "flash3", "fused", "unfused"] = "flash2"
    fused_norm: bool = True
    vocab_parallel_loss: bool = True
    """Megatron-LM's vocabulary-parallel cross entropy (each TP rank keeps V/t logits);
    false: the output head gathers all V logits on every TP rank and the loss runs
    unsplit there (t times the loss's memory and memory-bound work)."""
    seq_chunks: int = Field(4, ge=1)
    """k, sequence chunks per micro-batch for schedule ``seq1f1b`` (Sun et al. 2024); others
    ignore it."""
    global_batch_schedule: list[list[int]] | None = None
    """``[[step, global_batch_size], ...]`` for ``sim run --steps N``: from each step on, that
    global batch (adaptive batch schedules, Lau et al. 2025); see :mod:`sim.faults`."""


class ExperimentConfig(_Strict):
    name: str = "experiment"
    model: ModelConfig
    cluster: ClusterConfig
    parallel: ParallelConfig = ParallelConfig()
    training: TrainingConfig = TrainingConfig()
    schedule: str = "1f1b"
    faults: FaultsConfig | None = None
    """Stragglers, failures, link faults (:mod:`sim.faults_config`)."""

    @model_validator(mode="after")
    def _default_vpp(self) -> ExperimentConfig:
        """A multi-chunk schedule without ``parallel.vpp`` gets two chunks per rank: the V
        schedules run exactly two, and one chunk would make ``interleaved`` plain 1F1B
        without a word. A ``vpp`` the file gives is kept (and checked by the schedule)."""
        kind = SCHEDULES.get(self.schedule)
        given = "vpp" in self.parallel.model_fields_set
        if kind is not None and kind.default_vpp != 1 and not given:
            return self.model_copy(update={"parallel": self.parallel.model_copy(
                update={"vpp": kind.default_vpp})})
        return self


def _known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        candidates = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type)]
        sub = [a for a in candidates if issubclass(a, BaseModel)]
        if not sub:
            return []
        model = sub[0]
    return list(model.model_fields)


def _format_validation_error(exc: ValidationError, root: type[BaseModel]) -> str:
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
    key = ".".join(str(p) for p in loc) or "<top level>"
    if err["type"] == "extra_forbidden":
        known = _known_keys(root, loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else (
            f" (known keys: {', '.join(known)})" if known else "")
        return f"unknown key {key!r}{hint}"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    msg = err["msg"][0].lower() + err["msg"][1:]
    return f"{key}: {msg}, got {err.get('input')!r}"


def parse_config(data: Any) -> ExperimentConfig:
    """Validate a parsed experiment mapping; raise ConfigError naming key and value."""
    if not isinstance(data, dict):
        raise ConfigError(f"the experiment must be a mapping of keys, got {type(data).__name__}")
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, ExperimentConfig)) from None


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file; ConfigError (not OSError or a YAML traceback) on any failure."""
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
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid syntax"
        raise ConfigError(f"file {str(p)!r} is not valid YAML{where}: {problem}") from None


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
