"""An experiment: a validated config turned into model costs, cluster, placement and schedule."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from base.errors import ConfigError, ScheduleError
from sim.a2aoverlap import check as check_a2a_overlap
from sim.batch_policy import load_curve
from sim.budget import check_schedule_ops
from sim.calibration import default_profile
from sim.config import (
    ExperimentConfig,
    ModelConfig,
    MoEConfig,
    ParallelConfig,
    check_sizes,
    parse_config,
    read_yaml,
    set_dotted,
)
from sim.dpmodes import check_dp_modes, ps_layout_gpus
from sim.faults import check_fault_targets
from sim.gpu_profiles import ratios_for
from sim.partition import auto_layers, rank_time_model
from sim.tpoverlap import check as check_tp_overlap
from topologies.build import build_cluster
from topologies.cluster import Cluster
from topologies.hardware import IDEAL_GPU, GPUSpec
from topologies.placement import Placement
from workloads import schedules
from workloads.costs import SyntheticCosts, split_layers
from workloads.frameworks import (
    FrameworkProfile,
    apply_framework,
    framework,
    grad_bucket_bytes,
    stage_layers,
    with_allocator,
)
from workloads.hf_config import load_hf_config
from workloads.lowering import CostModel
from workloads.models import PRESETS, ModelSpec, MoESpec
from workloads.moe_dispatch import check_router_groups, expected_units
from workloads.recompute_modules import check as check_recompute_modules
from workloads.registry import SCHEDULES, built_schedule
from workloads.seqchunks import FLASH_KERNELS
from workloads.transformer import TransformerCosts, interned

MB = 1e6
_MODEL_FIELDS = ("seq_length", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                 "ffn_hidden_size", "vocab_size", "ffn_type", "norm", "tied_embeddings",
                 "position_embedding", "parallel_blocks")


def build_model(cfg: ModelConfig, base_dir: Path | None = None) -> ModelSpec | None:
    """The model spec of a transformer config, or None for a synthetic model."""
    given = [k for k in ("preset", "hf_config", "synthetic") if getattr(cfg, k) is not None]
    if len(given) > 1:
        raise ConfigError(f"model: give one of 'preset', 'hf_config' or 'synthetic', not "
                          f"{' and '.join(repr(k) for k in given)}")
    if cfg.synthetic is not None:
        extra = [f for f in (*_MODEL_FIELDS, "moe") if getattr(cfg, f) is not None]
        if extra:
            raise ConfigError(f"model.{extra[0]}: not used with a synthetic model")
        return None
    overrides = {f: getattr(cfg, f) for f in _MODEL_FIELDS if getattr(cfg, f) is not None}
    if cfg.hf_config is not None:
        path = Path(cfg.hf_config)
        if base_dir is not None and not path.is_absolute() and not path.exists():
            path = base_dir / path
        spec = load_hf_config(path, cfg.seq_length).with_overrides(**overrides)
    elif cfg.preset is not None:
        if cfg.preset not in PRESETS:
            raise ConfigError(f"model.preset: unknown preset {cfg.preset!r}; choose one of "
                              f"{', '.join(PRESETS)}")
        base = PRESETS[cfg.preset]
        spec = base.with_overrides(**overrides)
    else:
        need = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                "vocab_size", "seq_length")
        missing = [f for f in need if f not in overrides]
        if missing:
            raise ConfigError(f"model.{missing[0]}: required without a preset (or give "
                              f"model.preset or model.synthetic)")
        overrides.setdefault("num_kv_heads", overrides["num_attention_heads"])
        spec = ModelSpec(name=cfg.name or "custom", **overrides)
    if cfg.moe is not None:
        spec = spec.with_overrides(moe=_moe_spec(cfg.moe, spec))
    if cfg.name:
        spec = spec.with_overrides(name=cfg.name)
    if spec.first_dense_layers >= spec.num_layers:
        raise ConfigError(f"model.num_layers={spec.num_layers}: the model's first "
                          f"{spec.first_dense_layers} layers are dense; it needs more layers")
    if spec.mtp_layers >= spec.num_layers:
        raise ConfigError(f"model.num_layers={spec.num_layers}: the model's last "
                          f"{spec.mtp_layers} layers are multi-token prediction modules; it "
                          f"needs more layers")
    _check_spec(spec, "model" if cfg.hf_config is None else
                f"model.hf_config={cfg.hf_config!r}:")
    derived_head = spec.kv_channels is None and spec.mla is None  # d = h/a
    if derived_head and spec.hidden_size % spec.num_attention_heads:
        raise ConfigError(f"model.hidden_size={spec.hidden_size} is not divisible by "
                          f"model.num_attention_heads={spec.num_attention_heads}")
    if spec.num_attention_heads % spec.num_kv_heads:
        raise ConfigError(f"model.num_kv_heads={spec.num_kv_heads} does not divide "
                          f"model.num_attention_heads={spec.num_attention_heads}")
    return spec


def _check_spec(spec: Any, where: str) -> None:
    """ConfigError naming the field unless every number of ``spec`` (a model or its MoE
    part, however it was made: a Hugging Face config is not checked by the schema) is
    finite and every size within :data:`sim.config.MAX_SIZES`."""
    for f in fields(spec):
        value = getattr(spec, f.name)
        if is_dataclass(value):
            _check_spec(value, where)
        elif isinstance(value, float) and not math.isfinite(value):
            sep = " " if where.endswith(":") else "."
            raise ConfigError(f"{where}{sep}{f.name}={value}: must be a finite number")
    check_sizes({f.name: getattr(spec, f.name) for f in fields(spec)}, where)


def _moe_spec(cfg: MoEConfig, spec: ModelSpec) -> MoESpec:
    if cfg.top_k > cfg.num_experts:
        raise ConfigError(f"model.moe.top_k={cfg.top_k} exceeds model.moe.num_experts="
                          f"{cfg.num_experts}")
    shared = spec.moe.shared_experts if spec.moe is not None else 0  # an import's (DeepSeek)
    groups = (cfg.router_num_groups or (spec.moe.router_num_groups if spec.moe else 1),
              cfg.router_group_topk or (spec.moe.router_group_topk if spec.moe else 1))
    check_router_groups(cfg.num_experts, cfg.top_k, *groups)
    return MoESpec(cfg.num_experts, cfg.top_k,
                   cfg.expert_ffn_hidden_size or spec.ffn_hidden_size, cfg.capacity_factor,
                   cfg.routing_imbalance, cfg.pad_to_capacity, shared_experts=shared,
                   router_num_groups=groups[0], router_group_topk=groups[1])


def _check_expert_parallel(par: ParallelConfig, model: ModelSpec | None, dp: int,
                           etp: int | None) -> None:
    """EP splits the experts over ep consecutive DP ranks (Megatron carves EP out of DP);
    with an expert TP degree ``etp`` of its own, over the expert grid
    (:func:`_check_expert_tp`)."""
    ep = par.ep
    if model is None or model.moe is None:
        raise ConfigError(f"parallel.ep={ep}: expert parallelism needs a mixture-of-experts "
                          "model (model.moe)")
    if etp is None and dp % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide the data-parallel degree dp={dp} "
                          "(EP groups are carved out of DP)")
    if model.moe.num_experts % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide model.moe.num_experts="
                          f"{model.moe.num_experts}")
    if ep > 1 and model.moe.capacity_factor is None and model.moe.routing_imbalance > ep:
        raise ConfigError(f"model.moe.routing_imbalance={model.moe.routing_imbalance:g} exceeds "
                          f"parallel.ep={ep}: the busiest EP rank gets at most every copy")


def _expert_tp(par: ParallelConfig, tp: int) -> int | None:
    """``parallel.expert_tp`` where it differs from tp; None where the experts are split like
    the attention (left out, or equal: the same experiment)."""
    return None if par.expert_tp in (None, tp) else par.expert_tp


def _check_expert_tp(par: ParallelConfig, model: ModelSpec | None, etp: int, tp: int, dp: int,
                     cp: int, pp: int) -> None:
    """Megatron-core's constraints on an expert TP degree other than tp, each with its source
    (megatron/core at NVIDIA/Megatron-LM d98e8a6), and the simulator's own."""
    if model is None or model.moe is None:
        raise ConfigError(f"parallel.expert_tp={etp}: expert tensor parallelism needs a "
                          "mixture-of-experts model (model.moe)")
    grid = etp * par.ep
    if (tp * dp) % grid:
        # parallel_state.py initialize_model_parallel: "world_size ... is not divisible by
        # expert_tensor_model_pipeline_parallel size" (ETP x EP x PP); EP stays inside a CP
        # rank here, so ETP x EP divides each (pp, cp) slice's tp x dp
        raise ConfigError(f"parallel.expert_tp={etp}: expert_tp*ep = {etp}*{par.ep} does not "
                          f"divide tp*dp = {tp}*{dp} (the expert grid of each pipeline and CP "
                          "rank, Megatron-core's world / (ETP x EP x PP))")
    if grid % tp:
        raise ConfigError(f"parallel.expert_tp={etp}: expert_tp*ep = {etp}*{par.ep} must be a "
                          f"multiple of tp={tp} (an expert-data-parallel group then stays on one "
                          "TP lane; other grids are not modelled)")
    if tp > 1 and not par.sequence_parallel:
        # moe_layer.py MoELayer.forward: "During training, performance may degrade if MoE and
        # tensor parallelism are enabled without also enabling sequence parallelism."
        raise ConfigError(f"parallel.expert_tp={etp}: needs parallel.sequence_parallel with "
                          f"tp={tp} > 1 (Megatron-core's MoE layer refuses TP without SP in "
                          "training)")
    edp = tp * cp * dp // grid
    if pp > 1 and not par.placement.endswith("pp") and edp != dp:
        # parallel_state.py: "When not using pp-last rank ordering, the data parallel size of
        # the attention and moe layers must be the same"
        raise ConfigError(f"parallel.expert_tp={etp}: with parallel.placement="
                          f"{par.placement!r} (pp not outermost) the expert-data-parallel size "
                          f"tp*cp*dp/(expert_tp*ep) = {edp} must equal dp={dp} (Megatron-core)")
    f = model.moe.expert_ffn_hidden_size
    if f % etp:
        # extensions/transformer_engine.py TEGroupedLinear: divide(output_size, tp_size)
        raise ConfigError(f"parallel.expert_tp={etp} does not divide "
                          f"model.moe.expert_ffn_hidden_size={f}")
    if par.dp_mode != "allreduce":
        raise ConfigError(f"parallel.expert_tp={etp}: not with parallel.dp_mode="
                          f"{par.dp_mode!r} (its pushes carry no expert groups)")


@dataclass(frozen=True, eq=False)
class Experiment:
    """A validated experiment, ready to lower and simulate."""

    config: ExperimentConfig
    data: dict
    """The input mapping it was built from (for :meth:`with_changes`)."""
    model: ModelSpec | None
    """None for a synthetic model."""
    cluster: Cluster
    placement: Placement
    schedule: schedules.Schedule
    costs: CostModel
    global_batch_size: int
    """Sequences per optimizer step (all DP replicas)."""
    base_dir: Path | None = None
    """The directory of the experiment file: relative paths in it (schedule, model and
    batch statistic files) are read from there, also by :meth:`with_changes`."""
    framework: FrameworkProfile = framework("megatron")
    """The training framework (``training.framework``, :mod:`workloads.frameworks`)."""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def num_microbatches(self) -> int:
        return self.schedule.num_microbatches

    @property
    def tokens_per_step(self) -> int | None:
        return None if self.model is None else self.global_batch_size * self.model.seq_length

    @property
    def model_flops_per_step(self) -> float | None:
        if self.model is None:
            return None
        return self.tokens_per_step * self.model.model_flops_per_token()

    @classmethod
    def from_dict(cls, data: Any) -> Experiment:
        return build_experiment(data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Experiment:
        return build_experiment(read_yaml(path), base_dir=Path(path).parent)

    def with_changes(self, changes: dict[str, Any]) -> Experiment:
        """A new experiment with dotted keys changed, e.g. ``{"parallel.pp": 2}``.

        A value of None removes the key (so a derived default applies again).
        """
        data = self.data
        for key, value in changes.items():
            data = set_dotted(data, key, value)
        return build_experiment(data, self.base_dir)


def _resolve_layout(cfg: ExperimentConfig, num_gpus: int) -> tuple[int, int, int, int]:
    """(tp, pp, dp, cp) over ``num_gpus`` GPUs (all of the cluster's but parameter servers)."""
    p = cfg.parallel
    model_par = p.tp * p.pp * p.cp
    if p.dp is None:
        if num_gpus % model_par:
            raise ConfigError(f"parallel: tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {model_par} does not "
                              f"divide cluster.num_gpus = {num_gpus}")
        dp = num_gpus // model_par
    else:
        dp = p.dp
        if model_par * dp != num_gpus:
            raise ConfigError(f"parallel: tp*pp*dp*cp = {p.tp}*{p.pp}*{dp}*{p.cp} = "
                              f"{model_par * dp} != cluster.num_gpus = {num_gpus}")
    return p.tp, p.pp, dp, p.cp


def _swarm_layout(cfg: ExperimentConfig, num_gpus: int) -> tuple[int, int, int, int]:
    """The layout of ``parallel.swarm``'s template pipeline: pp stages, one GPU each (the
    pools' peers take its ops, :mod:`sim.swarm`); ConfigError naming the key otherwise."""
    p = cfg.parallel
    pools = p.swarm.pools
    if len(pools) != p.pp:
        raise ConfigError(f"parallel.swarm.pools={pools}: {len(pools)} pools, but "
                          f"parallel.pp={p.pp} stages; give one pool size per stage")
    if min(pools) < 1:
        raise ConfigError(f"parallel.swarm.pools={pools}: every stage needs at least one peer")
    if sum(pools) != num_gpus:
        raise ConfigError(f"parallel.swarm.pools={pools} add up to {sum(pools)} peers, not "
                          f"cluster.num_gpus = {num_gpus}")
    for key in ("tp", "cp", "ep", "vpp"):
        if getattr(p, key) != 1:
            raise ConfigError(f"parallel.{key}={getattr(p, key)}: parallel.swarm runs one GPU "
                              f"per peer and one model chunk per stage; use {key}: 1")
    if p.dp not in (None, 1):
        raise ConfigError(f"parallel.dp={p.dp}: parallel.swarm has no data-parallel replicas "
                          "(the pools share the micro-batches); leave dp out")
    if cfg.schedule in SCHEDULES and SCHEDULES[cfg.schedule].steady_period:
        raise ConfigError(f"schedule={cfg.schedule!r}: its steps overlap; parallel.swarm "
                          "needs a schedule with a step barrier (e.g. 1f1b, gpipe)")
    spread = getattr(cfg.cluster, "gpu_speed_spread", None)
    if spread is not None:
        raise ConfigError(f"cluster.gpu_speed_spread={spread!r}: not with parallel.swarm, whose "
                          "pools rebalance around slow peers rather than wait for the slowest "
                          "GPU (give slow peers as faults.stragglers)")
    return 1, p.pp, 1, 1


def _num_microbatches(cfg: ExperimentConfig, dp: int) -> tuple[int, int]:
    t = cfg.training
    per_step = t.micro_batch_size * dp
    if t.global_batch_size is None and t.num_microbatches is None:
        raise ConfigError("training.global_batch_size: required key is missing "
                          "(or give training.num_microbatches)")
    if t.global_batch_size is not None:
        if t.global_batch_size % per_step:
            raise ConfigError(f"training.global_batch_size={t.global_batch_size} is not divisible "
                              f"by micro_batch_size*dp = {t.micro_batch_size}*{dp} = {per_step}")
        m = t.global_batch_size // per_step
        if t.num_microbatches is not None and t.num_microbatches != m:
            raise ConfigError(f"training.num_microbatches={t.num_microbatches} != "
                              f"global_batch_size/(micro_batch_size*dp) = {m}")
        return m, t.global_batch_size
    return t.num_microbatches, t.num_microbatches * per_step


def _unknown_schedule(name: str, path: Path) -> str:
    """The error for a ``schedule`` that is neither a built-in name nor a file: a name with a
    path separator or a suffix is taken for a missing file (and where it was looked for is
    said), anything else for a misspelled schedule (with the closest built-in one)."""
    names = ", ".join(SCHEDULES)
    if "/" in name or "\\" in name or Path(name).suffix:
        where = f"{name!r}" if path == Path(name) else f"{name!r} or {str(path)!r}"
        return (f"schedule: schedule file {name!r} does not exist (looked for {where}); "
                f"give an existing file or one of {names}")
    import difflib  # (an error's hint only: not imported by a run)

    close = difflib.get_close_matches(name, list(SCHEDULES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"schedule: unknown schedule {name!r}{hint}; choose one of {names} or give a " \
        "schedule file path"


def _build_schedule(cfg: ExperimentConfig, pp: int, m: int, base_dir: Path | None
                    ) -> schedules.Schedule:
    name, v = cfg.schedule, cfg.parallel.vpp
    try:
        if name in SCHEDULES:
            k = cfg.training.seq_chunks if SCHEDULES[name].seq_chunks else 1
            t = cfg.training
            key, value = max((("parallel.vpp", v), ("training.seq_chunks", k),
                              ("training.global_batch_size", t.global_batch_size)
                              if t.global_batch_size is not None else
                              ("training.num_microbatches", m)), key=lambda kv: kv[1])
            check_schedule_ops(pp * v, m, k, key, value)
            n = cfg.parallel.microbatch_group_size
            if n is not None and SCHEDULES[name].grouped is None:
                raise ConfigError(f"parallel.microbatch_group_size={n}: schedule {name!r} has "
                                  "no micro-batch groups; use schedule interleaved or leave "
                                  "it out")
            sched = built_schedule(name, pp, m, v, k, n)
            if v > 1 and sched.chunks_per_rank == 1:
                raise ConfigError(f"parallel.vpp={v}: schedule {name!r} has one chunk per rank; "
                                  "use an interleaved or V schedule")
            return sched
        if cfg.parallel.microbatch_group_size is not None:
            raise ConfigError(f"parallel.microbatch_group_size="
                              f"{cfg.parallel.microbatch_group_size}: a schedule file gives its "
                              "own order; leave it out")
        path = Path(name)
        if base_dir is not None and not path.is_absolute() and not path.exists():
            path = base_dir / path
        if not path.is_file():
            raise ConfigError(_unknown_schedule(name, path))
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"schedule={name!r}: cannot read the schedule file: {exc}"
                              ) from None
        sched = schedules.from_text(text, m, name=str(name))
        if sched.num_ranks != pp:
            raise ConfigError(f"schedule: file {name!r} has {sched.num_ranks} ranks but "
                              f"parallel.pp={pp}")
        return sched
    except ScheduleError as exc:
        raise ConfigError(f"schedule={name!r}: {exc}") from None


def check_attention_kernel(attention: str, cluster: Cluster) -> None:
    """ConfigError unless every GPU of ``cluster`` runs the ``attention`` kernel:
    FlashAttention-3 runs on Hopper GPUs only (wgmma and TMA, Shah et al. 2024); the ideal
    GPU (infinitely fast, and the search's stand-in cluster) runs any kernel."""
    if attention != "flash3":
        return
    others = [g.name for g in cluster.gpu_types
              if g.name != IDEAL_GPU.name and default_profile(g.name).flash3_efficiency is None]
    if others:
        raise ConfigError(f"training.attention='flash3': FlashAttention-3 runs on Hopper GPUs "
                          f"(H100, H200) only, not on {', '.join(others)}; use flash2")


def fp8_speedup(cluster: Cluster) -> float:
    """FP8 over BF16 GEMM rate of the cluster's GPUs: dense FP8 over dense BF16 peak times
    the FP8 GEMMs' fraction of peak over the BF16 GEMMs' (:attr:`KernelRatios.fp8_gemm
    <sim.gpu_profiles.KernelRatios.fp8_gemm>`, 0.952 on Hopper). The slowest on a mixed
    cluster; the ideal GPU counts as 2, the peak ratio of every FP8 GPU's datasheet."""
    ratios = [gpu_fp8_speedup(g) for g in cluster.gpu_types
              if g.name != IDEAL_GPU.name and g.peak_fp8_flops]
    return min(ratios, default=2.0)


def gpu_fp8_speedup(gpu: GPUSpec) -> float:
    """One GPU type's FP8 over BF16 GEMM rate (:func:`fp8_speedup`): its dense FP8 over dense
    BF16 peak times its FP8 GEMM fraction of peak over its BF16 one (1 without ratios)."""
    ratios = ratios_for(gpu.name)
    return gpu.peak_fp8_flops / gpu.peak_bf16_flops * (1.0 if ratios is None
                                                        else ratios.fp8_gemm)


def check_precision(precision: str, cluster: Cluster) -> None:
    """ConfigError unless every GPU of ``cluster`` has FP8 tensor cores when ``precision``
    is fp8 (Hopper and newer, MI300X; not the A100)."""
    if not precision.startswith("fp8"):
        return
    others = [g.name for g in cluster.gpu_types if g.name != IDEAL_GPU.name
              and not g.peak_fp8_flops]
    if others:
        raise ConfigError(f"training.precision={precision!r}: FP8 tensor cores are on Hopper GPUs "
                          f"(H100, H200) and newer, not on {', '.join(others)}; use bf16")


def _check_context_parallel(cfg: ExperimentConfig, model: ModelSpec | None, cp: int) -> None:
    """CP needs a transformer, a flash attention kernel (ring attention runs inside it, as
    in TransformerEngine) and 2·cp equal sequence chunks (Megatron's load-balanced split)."""
    if model is None:
        raise ConfigError(f"parallel.cp={cp}: context parallelism needs a transformer model "
                          "(it splits sequences), not a synthetic one")
    if cfg.training.attention not in FLASH_KERNELS:
        raise ConfigError(f"parallel.cp={cp}: context parallelism needs a flash attention "
                          f"kernel ({', '.join(FLASH_KERNELS)}), not training.attention="
                          f"{cfg.training.attention!r}")
    if model.seq_length % (2 * cp):
        raise ConfigError(f"parallel.cp={cp}: model.seq_length={model.seq_length} must divide "
                          f"into 2*cp = {2 * cp} equal chunks (load-balanced causal split)")
    if cfg.schedule in SCHEDULES and SCHEDULES[cfg.schedule].seq_chunks:
        raise ConfigError(f"parallel.cp={cp}: not supported with schedule {cfg.schedule!r} "
                          "(context parallelism's causal split and Seq1F1B's sequence chunks "
                          "do not compose); use cp: 1 or another schedule")


def _grad_bucket_bytes(par: Any, profile: FrameworkProfile, dp: int) -> float:
    """Gradient bytes per ``overlap_grad_reduce`` bucket: ``parallel.grad_bucket_MB`` where
    given, else the framework profile's rule (:func:`grad_bucket_bytes`), else PyTorch DDP's
    default (:attr:`TransformerCosts.grad_bucket_bytes`)."""
    if par.grad_bucket_MB is not None:
        return par.grad_bucket_MB * MB
    rule = grad_bucket_bytes(profile, dp)
    return TransformerCosts.grad_bucket_bytes if rule is None else rule


def _stage_layers(par: ParallelConfig, model: ModelSpec, num_stages: int,
                  profile: FrameworkProfile) -> tuple[int, ...]:
    """``parallel.layers_per_stage`` checked against the stages and layers, or the framework's
    split (:func:`workloads.frameworks.stage_layers`; Megatron-LM's is the even split).

    Uneven splits as Llama 3 used them (first and last stages one layer fewer, for the
    embedding and the output head; Meta 2024, sec. 3.3.2: "the first model chunk on the first
    stage has only the embedding, and the last model chunk on the last stage has only output
    projection and loss calculation", so those two stages may hold no transformer layer)."""
    given = par.layers_per_stage
    if given is None or given in ("balanced", "auto"):  # see balanced_layers, auto_layers
        split = stage_layers(profile, model.num_layers, num_stages)
        if split[0] == 0 and (par.zero_stage == 3 or par.overlap_grad_reduce):
            raise ConfigError(f"training.framework={profile.name!r} splits {model.num_layers} "
                              f"layers over {num_stages} stages as {list(split)}: a first "
                              "stage without layers is not supported with zero_stage 3 or "
                              "overlap_grad_reduce (their per-layer gradient units carry the "
                              "embedding with layer 0)")
        return split
    if isinstance(given, str):
        raise ConfigError(f"parallel.layers_per_stage={given!r}: give a list of layers per "
                          "stage, e.g. [15, 16, 16, 15], 'balanced' or 'auto'")
    if len(given) != num_stages:
        raise ConfigError(f"parallel.layers_per_stage={given}: {len(given)} entries, but the "
                          f"pipeline has pp*vpp = {num_stages} stages")
    if any(n < 1 for n in given[1:-1]) or any(n < 0 for n in given):
        raise ConfigError(f"parallel.layers_per_stage={given}: every stage needs at least "
                          "one layer, but the first (embedding) and the last (output head) "
                          "may have none")
    if given[0] == 0 and (par.zero_stage == 3 or par.overlap_grad_reduce):
        raise ConfigError(f"parallel.layers_per_stage={given}: a first stage without layers "
                          "is not supported with zero_stage 3 or overlap_grad_reduce (their "
                          "per-layer gradient units carry the embedding with layer 0)")
    if sum(given) != model.num_layers:
        raise ConfigError(f"parallel.layers_per_stage={given} sums to {sum(given)}, not "
                          f"model.num_layers = {model.num_layers}")
    return tuple(given)


def balanced_layers(costs: TransformerCosts, schedule: schedules.Schedule,
                    placement: Placement, cluster: Cluster) -> tuple[int, ...]:
    """Layers per stage that minimise the slowest pipeline rank's time per micro-batch
    (``parallel.layers_per_stage: balanced``).

    A rank's cost is the time of one micro-batch's F, B (and W) of all its stages: their
    compute on the rank's GPUs by the device model, with each GPU type's calibrated
    profile (the slowest type where a rank mixes them; ring attention's blocks counted,
    its passes not), plus their TP collectives by the α-β estimate of
    :mod:`sim.collectives` on the rank's TP group (uncontended, NCCL-like algorithm
    choice). A rank's layers are split as evenly as possible over its stages, earlier
    ones first. Pipeline, DP and EP traffic, memory and the optimizer step are not
    counted. The integer split is exact: layers are handed out one at a time, each to
    the rank whose cost then grows least; costs only grow with layers, so the
    handed-out costs are the smallest ones possible, and the largest of them (the
    slowest rank) is the least any split can reach.
    """
    S, L = schedule.num_stages, costs.model.num_layers
    pp = placement.degree("pp")
    stages_of = [[s for s in range(S) if schedule.stage_rank[s] == r] for r in range(pp)]
    cost = rank_time_model(costs, schedule, placement, cluster)

    count = [len(stages_of[r]) for r in range(pp)]
    heap = [(cost(r, count[r] + 1), r) for r in range(pp)]
    heapq.heapify(heap)
    for _ in range(L - sum(count)):
        _, r = heapq.heappop(heap)
        count[r] += 1
        heapq.heappush(heap, (cost(r, count[r] + 1), r))
    out = [0] * S
    for r in range(pp):
        for s, k in zip(stages_of[r], split_layers(count[r], len(stages_of[r])), strict=True):
            out[s] = k
    return tuple(out)


def build_experiment(data: Any, base_dir: Path | None = None,
                     cluster: Cluster | None = None) -> Experiment:
    """Validate ``data`` (a parsed experiment file) and build everything derived from it.

    ``cluster``: the cluster to run on instead of the one ``data`` describes (a job's
    share of a multi-job file's cluster, :mod:`sim.jobs`)."""
    if isinstance(data, dict) and "jobs" in data:
        raise ConfigError("jobs: a file of several jobs is simulated by 'sim run' (sim.jobs), "
                          "not as one experiment")
    cfg = parse_config(data)
    model = build_model(cfg.model, base_dir)
    cluster = build_cluster(cfg.cluster) if cluster is None else cluster
    par = cfg.parallel
    tp, pp, dp, cp = ((_swarm_layout if par.swarm else _resolve_layout)
                      (cfg, ps_layout_gpus(cfg, cluster.num_gpus)))
    check_dp_modes(cfg, dp)
    etp = _expert_tp(par, tp)
    if par.ep > 1:
        _check_expert_parallel(par, model, dp, etp)
    if etp is not None:
        _check_expert_tp(par, model, etp, tp, dp, cp, pp)
    if cp > 1:
        _check_context_parallel(cfg, model, cp)
    check_attention_kernel(cfg.training.attention, cluster)
    check_fault_targets(cfg.faults, cluster)
    faults = cfg.faults
    if faults is not None and faults.preemption_rate_per_hour is not None and par.swarm is None:
        raise ConfigError(f"faults.preemption_rate_per_hour={faults.preemption_rate_per_hour:g}: "
                          "drawn preemptions strike the peers of parallel.swarm; without a "
                          "swarm, list faults.preemptions")
    if faults is not None and faults.preemptions and par.swarm is not None:
        raise ConfigError("faults.preemptions: not used with parallel.swarm (its peers are "
                          "preempted at faults.preemption_rate_per_hour)")
    if par.layers_per_stage is not None and model is None:
        raise ConfigError("parallel.layers_per_stage: needs a transformer model (the synthetic "
                          "model has no layers)")
    if par.zero_stage == 3 and model is None:
        raise ConfigError("parallel.zero_stage=3: ZeRO-3/FSDP needs a transformer model "
                          "(it gathers parameters layer by layer); the synthetic model has none")
    if par.overlap_param_gather and (model is None or not par.overlap_grad_reduce
                                     or par.zero_stage not in (1, 2)):
        raise ConfigError("parallel.overlap_param_gather: Megatron-LM overlaps the distributed "
                          "optimizer's parameter all-gather only with --overlap-grad-reduce: "
                          "needs a transformer model, parallel.overlap_grad_reduce: true and "
                          f"zero_stage 1 or 2 (got {par.zero_stage})")
    m, gbs = _num_microbatches(cfg, dp)
    profile = with_allocator(framework(cfg.training.framework, cfg.training.precision),
                             cfg.training.allocator)
    if profile.torch_compile and not cfg.training.fused_norm:
        raise ConfigError(f"training.fused_norm=false with training.framework="
                          f"{profile.name!r}: its blocks run under torch.compile, whose norm is "
                          "one fused Inductor kernel; leave fused_norm true (its default) or "
                          "take the eager framework ('fsdp')")
    sched = _build_schedule(cfg, pp, m, base_dir)
    placement = Placement.from_order(par.placement, tp=tp, cp=cp, dp=dp, pp=pp)
    costs: CostModel
    if model is None:
        syn = cfg.model.synthetic
        if syn.weight_grad_ms > syn.backward_ms:
            raise ConfigError(f"model.synthetic.weight_grad_ms={syn.weight_grad_ms} exceeds "
                              f"backward_ms={syn.backward_ms} (it is a part of the backward)")
        costs = SyntheticCosts(syn.forward_ms * 1e-3, syn.backward_ms * 1e-3,
                               syn.weight_grad_ms * 1e-3, syn.activation_MB * MB,
                               syn.p2p_MB * MB, syn.grad_MB * MB, sched.chunks_per_rank,
                               seq_chunks=sched.seq_chunks)
    else:
        if sched.seq_chunks > 1 and cp > 1:
            raise ConfigError(f"parallel.cp={cp}: not supported with sequence chunks "
                              f"(schedule={cfg.schedule!r} has k={sched.seq_chunks})")
        if sched.seq_chunks > model.seq_length:
            raise ConfigError(f"training.seq_chunks={sched.seq_chunks} exceeds "
                              f"model.seq_length={model.seq_length} (a chunk needs a token)")
        # the end stages may hold no layer where the split is given or puts the embedding and
        # the head each in a layer's place
        ends = (isinstance(par.layers_per_stage, list)
                or profile.stage_split == "ends-as-layers")
        if sched.num_stages > model.num_layers + 2 * ends:
            raise ConfigError(f"parallel.pp*vpp = {pp}*{par.vpp} = {sched.num_stages} exceeds "
                              f"model.num_layers = {model.num_layers}")
        if model.num_attention_heads % tp:
            raise ConfigError(f"parallel.tp={tp} does not divide "
                              f"model.num_attention_heads={model.num_attention_heads}")
        if par.sequence_parallel and model.seq_length % tp:
            raise ConfigError(f"parallel.tp={tp} does not divide model.seq_length="
                              f"{model.seq_length} (needed by sequence_parallel)")
        t = cfg.training
        check_precision(t.precision, cluster)
        if t.recompute_num_layers is not None and t.recompute_every_k_layers is not None:
            raise ConfigError(f"training.recompute_every_k_layers={t.recompute_every_k_layers}: "
                              "give it or training.recompute_num_layers="
                              f"{t.recompute_num_layers}, not both")
        modules = check_recompute_modules(t.recompute, t.recompute_modules, model)
        if t.fp8_param_gather and (not t.precision.startswith("fp8") or par.zero_stage != 3
                                   or model.moe is not None or model.mla is not None):
            raise ConfigError("training.fp8_param_gather: gathers a dense model's sharded linear "
                              "weights in fp8; needs training.precision fp8 or fp8-current "
                              f"(got {t.precision!r}), parallel.zero_stage 3 (got "
                              f"{par.zero_stage}) and a model without MoE or MLA layers")
        costs = TransformerCosts(model, t.micro_batch_size, tp, dp,
                                 _stage_layers(par, model, sched.num_stages, profile),
                                 par.sequence_parallel and tp > 1,  # a no-op without TP
                                 par.zero_stage, t.recompute, t.attention,
                                 t.fused_norm, overlap_grad_reduce=par.overlap_grad_reduce,
                                 grad_bucket_bytes=_grad_bucket_bytes(par, profile, dp),
                                 overlap_param_gather=par.overlap_param_gather, cp=cp, ep=par.ep,
                                 expert_tp=etp,
                                 seq_chunks=sched.seq_chunks,
                                 recompute_num_layers=t.recompute_num_layers,
                                 recompute_every_k_layers=t.recompute_every_k_layers,
                                 recompute_modules=modules,
                                 precision="fp8" if t.precision.startswith("fp8")
                                 else t.precision,
                                 fp8_current_scaling=t.precision == "fp8-current",
                                 fp8_param_gather=t.fp8_param_gather,
                                 fp8_speedup=fp8_speedup(cluster)
                                 if t.precision.startswith("fp8") else 1.0)
        if par.moe_dispatcher != "alltoall" and par.ep > 1:
            servers = _ep_servers(cluster, placement, par.ep, etp)
            moe = model.moe
            assert moe is not None
            expected_units(moe.num_experts, moe.top_k, servers if servers > 1 else par.ep,
                           moe.router_num_groups, moe.router_group_topk)  # ConfigError early
            costs = replace(costs, moe_dispatcher=par.moe_dispatcher, ep_servers=servers)
        costs = apply_framework(costs, profile, m, t.vocab_parallel_loss)
        if par.layers_per_stage == "balanced":
            costs = replace(costs, stage_layers=balanced_layers(costs, sched, placement,
                                                                cluster))
        elif par.layers_per_stage == "auto":
            costs = replace(costs, stage_layers=auto_layers(costs, sched, placement, cluster,
                                                            profile))
        costs = interned(costs)  # an equal one's memos: its segments, worked out once
    if par.moe_a2a_overlap:
        check_a2a_overlap(par.ep, model is not None and model.moe is not None)
    if par.tp_comm_overlap:
        if profile.tp_overlap == "none":
            raise ConfigError(f"parallel.tp_comm_overlap: training.framework={profile.name!r} "
                              "cannot overlap its TP collectives (torchtitan: 'Async TP requires "
                              "--training.compile'); use training.framework: fsdp-compile")
        check_tp_overlap(cluster.gpu.name, tp, par.sequence_parallel, _no_tp_overlap(
            model, cluster, sched.seq_chunks, cfg.model.encoder is not None))
    if cfg.model.encoder is not None:
        # (the encoders' presets, costs and schedules: imported by a multimodal run only)
        from sim.multimodal import attach_encoder

        costs, sched = attach_encoder(cfg, costs, cluster, placement, m)
    elif par.encoder is not None:
        raise ConfigError("parallel.encoder: the model has no encoder (model.encoder)")
    _check_batch_policy(cfg, model, base_dir)
    return Experiment(cfg, dict(data), model, cluster, placement, sched, costs, gbs, base_dir,
                      profile)


def _ep_servers(cluster: Cluster, placement: Placement, ep: int, etp: int | None) -> int:
    """Servers the EP group of GPU 0 spans (every group alike under a regular placement)."""
    return len({cluster.host_of(g) for g in placement.ep_group(0, ep, etp)})


def _no_tp_overlap(model: ModelSpec | None, cluster: Cluster, seq_chunks: int,
                   encoder: bool) -> str | None:
    """What keeps ``parallel.tp_comm_overlap`` from being modelled (None: nothing): its
    exposed times are those of one dense attention + MLP layer on one GPU type, whole
    sequences (:mod:`sim.tpoverlap`)."""
    for reason, applies in (
            ("the synthetic model", model is None),
            ("mixture-of-experts layers", model is not None and model.moe is not None),
            ("multi-head latent attention", model is not None and model.mla is not None),
            ("parallel attention + MLP blocks", model is not None and model.parallel_blocks),
            ("sequence chunks (seq1f1b)", seq_chunks > 1),
            ("a multimodal model's encoder", encoder),
            ("a cluster of several GPU types", cluster.heterogeneous)):
        if applies:
            return reason
    return None


def _check_batch_policy(cfg: ExperimentConfig, model: ModelSpec | None,
                        base_dir: Path | None) -> None:
    """ConfigError for a ``training.batch_policy`` that cannot run (its statistic file is
    read here, so that a bad one fails before anything is simulated)."""
    policy = cfg.training.batch_policy
    if policy is None:
        return
    if cfg.training.global_batch_schedule is not None:
        raise ConfigError("training.batch_policy: not with training.global_batch_schedule "
                          "(the policy makes the schedule)")
    if policy.rule == "norm_test" and policy.statistic is None:
        raise ConfigError("training.batch_policy.statistic: required by rule 'norm_test' "
                          "(a csv file or a power law)")
    if policy.target_tokens is not None and model is None:
        raise ConfigError("training.batch_policy.target_tokens: needs a transformer model "
                          "(the synthetic model has no tokens)")
    if policy.statistic is not None:
        load_curve(policy.statistic, base_dir)
