"""An experiment: a validated config turned into model costs, cluster, placement and schedule."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config import (
    ExperimentConfig,
    ModelConfig,
    parse_config,
    read_yaml,
    set_dotted,
)
from sim.errors import ConfigError, ScheduleError, TopologyError
from topologies.cluster import Cluster
from topologies.hardware import gpu_spec
from topologies.placement import Placement
from topologies.presets import (
    PRESET_NAMES,
    SERVERS,
    explicit_cluster,
    ideal_cluster,
    server_cluster,
)
from workloads import schedules
from workloads.costs import SyntheticCosts, TransformerCosts, split_layers
from workloads.lowering import CostModel
from workloads.models import PRESETS, ModelSpec
from workloads.schedules_advanced import ADVANCED_BUILDERS

MB = 1e6
_MODEL_FIELDS = ("seq_length", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                 "ffn_hidden_size", "vocab_size", "ffn_type", "norm", "tied_embeddings",
                 "position_embedding")


def schedule_builders() -> dict[str, Any]:
    """Schedule builders by name, each ``builder(p, m, v) -> Schedule``."""
    out: dict[str, Any] = {name: (lambda b: lambda p, m, v: b(p, m))(fn)
                           for name, fn in schedules.BUILDERS.items()}
    out.update(ADVANCED_BUILDERS)
    return out


def build_model(cfg: ModelConfig) -> ModelSpec | None:
    """The model spec of a transformer config, or None for a synthetic model."""
    given = [k for k in ("preset", "synthetic") if getattr(cfg, k) is not None]
    if len(given) > 1:
        raise ConfigError("model: give either 'preset' or 'synthetic', not both")
    if cfg.synthetic is not None:
        extra = [f for f in _MODEL_FIELDS if getattr(cfg, f) is not None]
        if extra:
            raise ConfigError(f"model.{extra[0]}: not used with a synthetic model")
        return None
    overrides = {f: getattr(cfg, f) for f in _MODEL_FIELDS if getattr(cfg, f) is not None}
    if cfg.preset is not None:
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
    if cfg.name:
        spec = spec.with_overrides(name=cfg.name)
    if spec.hidden_size % spec.num_attention_heads:
        raise ConfigError(f"model.hidden_size={spec.hidden_size} is not divisible by "
                          f"model.num_attention_heads={spec.num_attention_heads}")
    if spec.num_attention_heads % spec.num_kv_heads:
        raise ConfigError(f"model.num_kv_heads={spec.num_kv_heads} does not divide "
                          f"model.num_attention_heads={spec.num_attention_heads}")
    return spec


def build_cluster(cfg: ExperimentConfig) -> Cluster:
    c = cfg.cluster
    if (c.preset is None) == (c.topology is None):
        raise ConfigError("cluster: give exactly one of 'preset' "
                          f"({', '.join(PRESET_NAMES)}) or 'topology' (switch, ring)")
    try:
        if c.preset is not None:
            explicit = [k for k in ("gpu", "link_bandwidth_GBps", "link_latency_us")
                        if getattr(c, k) is not None]
            if explicit:
                raise ConfigError(f"cluster.{explicit[0]}: only used with cluster.topology, "
                                  f"not with cluster.preset={c.preset!r}")
            if c.preset == "ideal":
                return ideal_cluster(c.num_gpus)
            if c.preset not in SERVERS:
                raise ConfigError(f"cluster.preset: unknown preset {c.preset!r}; choose one of "
                                  f"{', '.join(PRESET_NAMES)}")
            return server_cluster(c.preset, c.num_gpus)
        if c.link_bandwidth_GBps is None:
            raise ConfigError(f"cluster.link_bandwidth_GBps: required with "
                              f"cluster.topology={c.topology!r}")
        try:
            gpu = gpu_spec(c.gpu or "A100-80GB")
        except KeyError as exc:
            raise ConfigError(f"cluster.gpu: {exc.args[0]}") from None
        launch = (c.collective_launch_us or 0.0) * 1e-6
        return explicit_cluster(c.topology, c.num_gpus, gpu, c.link_bandwidth_GBps * 1e9,
                                (c.link_latency_us or 0.0) * 1e-6, launch)
    except TopologyError as exc:
        raise ConfigError(f"cluster: {exc}") from None


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
        return build_experiment(data)


def _resolve_layout(cfg: ExperimentConfig, num_gpus: int) -> tuple[int, int, int, int]:
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


def _build_schedule(cfg: ExperimentConfig, pp: int, m: int, base_dir: Path | None
                    ) -> schedules.Schedule:
    name, v = cfg.schedule, cfg.parallel.vpp
    builders = schedule_builders()
    try:
        if name in builders:
            sched = builders[name](pp, m, v)
            if v > 1 and sched.chunks_per_rank == 1:
                raise ConfigError(f"parallel.vpp={v}: schedule {name!r} has one chunk per rank; "
                                  "use an interleaved or V schedule")
            schedules.validate(sched)
            return sched
        path = Path(name)
        if base_dir is not None and not path.is_absolute() and not path.exists():
            path = base_dir / path
        if not path.is_file():
            raise ConfigError(f"schedule: unknown schedule {name!r}; choose one of "
                              f"{', '.join(builders)} or give a schedule file path")
        sched = schedules.from_text(path.read_text(encoding="utf-8"), m, name=str(name))
        if sched.num_ranks != pp:
            raise ConfigError(f"schedule: file {name!r} has {sched.num_ranks} ranks but "
                              f"parallel.pp={pp}")
        return sched
    except ScheduleError as exc:
        raise ConfigError(f"schedule={name!r}: {exc}") from None


def build_experiment(data: Any, base_dir: Path | None = None) -> Experiment:
    """Validate ``data`` (a parsed experiment file) and build everything derived from it."""
    cfg = parse_config(data)
    model = build_model(cfg.model)
    cluster = build_cluster(cfg)
    tp, pp, dp, cp = _resolve_layout(cfg, cluster.num_gpus)
    par = cfg.parallel
    if cp > 1 or par.ep > 1:
        key = "cp" if cp > 1 else "ep"
        raise ConfigError(f"parallel.{key}={getattr(par, key)}: context and expert parallelism "
                          "are not supported yet")
    if par.zero_stage == 3:
        raise ConfigError("parallel.zero_stage=3: ZeRO-3/FSDP is not supported yet; use 0, 1 or 2")
    if par.sequence_parallel and tp == 1:
        raise ConfigError("parallel.sequence_parallel=true needs parallel.tp > 1")
    m, gbs = _num_microbatches(cfg, dp)
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
                               syn.p2p_MB * MB, syn.grad_MB * MB, sched.chunks_per_rank)
    else:
        if sched.num_stages > model.num_layers:
            raise ConfigError(f"parallel.pp*vpp = {pp}*{par.vpp} = {sched.num_stages} exceeds "
                              f"model.num_layers = {model.num_layers}")
        if model.num_attention_heads % tp:
            raise ConfigError(f"parallel.tp={tp} does not divide "
                              f"model.num_attention_heads={model.num_attention_heads}")
        if par.sequence_parallel and model.seq_length % tp:
            raise ConfigError(f"parallel.tp={tp} does not divide model.seq_length="
                              f"{model.seq_length} (needed by sequence_parallel)")
        t = cfg.training
        costs = TransformerCosts(model, t.micro_batch_size, tp, dp,
                                 split_layers(model.num_layers, sched.num_stages),
                                 par.sequence_parallel, par.zero_stage, t.recompute, t.attention)
    return Experiment(cfg, dict(data), model, cluster, placement, sched, costs, gbs)
