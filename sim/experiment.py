"""An experiment: a validated config turned into model costs, cluster, placement and schedule."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import networkx as nx

from base.errors import ConfigError, ScheduleError, TopologyError
from sim.calibration import default_profile
from sim.collectives import check as check_collective
from sim.collectives import estimate, group_profile, resolve_algorithm
from sim.config import (
    ClusterConfig,
    ExperimentConfig,
    ModelConfig,
    MoEConfig,
    ParallelConfig,
    parse_config,
    read_yaml,
    set_dotted,
)
from sim.device import work_timer
from sim.faults import check_fault_targets
from topologies.cluster import Cluster
from topologies.graphs import Fabric, multi_site
from topologies.hardware import GPUS, IDEAL_GPU, GPUSpec, gpu_spec
from topologies.placement import Placement
from topologies.presets import (
    FABRIC_OF_TOPOLOGY,
    PRESET_NAMES,
    SERVERS,
    TOPOLOGIES,
    CollectiveSettings,
    ServerLinks,
    explicit_graph,
    ideal_cluster,
    mixed_server_graph,
    server_graph,
    set_server_links,
)
from workloads import schedules
from workloads.costs import CommSeg, ComputeSeg, RingAttention, SyntheticCosts, split_layers
from workloads.hf_config import load_hf_config
from workloads.lowering import CostModel
from workloads.models import PRESETS, ModelSpec, MoESpec
from workloads.registry import SCHEDULES, ScheduleKind
from workloads.seqchunks import FLASH_KERNELS
from workloads.transformer import TransformerCosts

MB = 1e6
_MODEL_FIELDS = ("seq_length", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                 "ffn_hidden_size", "vocab_size", "ffn_type", "norm", "tied_embeddings",
                 "position_embedding")


def schedule_builders() -> dict[str, ScheduleKind]:
    """The schedule registry (:data:`workloads.registry.SCHEDULES`) as a dict, each entry
    called ``kind(p, m, v)`` or ``kind(p, m, v, k)``: what :mod:`sim.search` reads until it
    reads the registry's properties itself."""
    return dict(SCHEDULES)


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
        spec = load_hf_config(path).with_overrides(**overrides)
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
    if spec.hidden_size % spec.num_attention_heads:
        raise ConfigError(f"model.hidden_size={spec.hidden_size} is not divisible by "
                          f"model.num_attention_heads={spec.num_attention_heads}")
    if spec.num_attention_heads % spec.num_kv_heads:
        raise ConfigError(f"model.num_kv_heads={spec.num_kv_heads} does not divide "
                          f"model.num_attention_heads={spec.num_attention_heads}")
    return spec


def _moe_spec(cfg: MoEConfig, spec: ModelSpec) -> MoESpec:
    if cfg.top_k > cfg.num_experts:
        raise ConfigError(f"model.moe.top_k={cfg.top_k} exceeds model.moe.num_experts="
                          f"{cfg.num_experts}")
    return MoESpec(cfg.num_experts, cfg.top_k,
                   cfg.expert_ffn_hidden_size or spec.ffn_hidden_size, cfg.capacity_factor,
                   cfg.routing_imbalance)


def _check_expert_parallel(par: ParallelConfig, model: ModelSpec | None, dp: int) -> None:
    """EP splits the experts over ep consecutive DP ranks (Megatron carves EP out of DP)."""
    ep = par.ep
    if model is None or model.moe is None:
        raise ConfigError(f"parallel.ep={ep}: expert parallelism needs a mixture-of-experts "
                          "model (model.moe)")
    if dp % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide the data-parallel degree dp={dp} "
                          "(EP groups are carved out of DP)")
    if model.moe.num_experts % ep:
        raise ConfigError(f"parallel.ep={ep} does not divide model.moe.num_experts="
                          f"{model.moe.num_experts}")


_FABRIC_KEYS = {
    "oversubscription": ("fat-tree", "rail-optimized"),
    "gpus_per_leaf": ("fat-tree", "rail-optimized"),
    "tiers": ("fat-tree",),
    "leaves_per_pod": ("fat-tree",),
    "dragonfly": ("dragonfly",),
    "dims": ("torus2d", "torus3d"),
}
"""Shape keys and the topologies that use them."""


def _collective_settings(c: ClusterConfig) -> CollectiveSettings:
    algos = {}
    for op, algo in (c.collectives.model_dump() if c.collectives else {}).items():
        if algo is None:
            continue
        if algo != "auto":
            try:
                check_collective(op, algo)
            except ConfigError as exc:
                raise ConfigError(f"cluster.collectives.{op}={algo!r}: {exc}") from None
        algos[op] = algo
    return CollectiveSettings(
        launch_s=None if c.collective_launch_us is None else c.collective_launch_us * 1e-6,
        step_s=(c.collective_step_us or 0.0) * 1e-6, algos=algos,
        granularity=c.collective_granularity or "stream", ecmp=c.ecmp or "dst-mod-k")


def _fabric(c: ClusterConfig, kind: str) -> Fabric | None:
    """The fabric shape from the config (bandwidth and latency filled in by the builder)."""
    if kind not in ("fat-tree", "rail-optimized", "dragonfly"):
        return None
    df = c.dragonfly
    if kind == "dragonfly" and df is None:
        raise ConfigError("cluster.dragonfly: required with cluster.topology='dragonfly' "
                          "(routers_per_group, gpus_per_router, global_links_per_router)")
    base = Fabric()
    return Fabric(
        kind={"fat-tree": "fat-tree", "rail-optimized": "rail-optimized"}.get(kind, "dragonfly"),
        tiers=c.tiers or 2, gpus_per_leaf=c.gpus_per_leaf or base.gpus_per_leaf,
        oversubscription=c.oversubscription or 1.0, leaves_per_pod=c.leaves_per_pod,
        routers_per_group=df.routers_per_group if df else base.routers_per_group,
        gpus_per_router=df.gpus_per_router if df else base.gpus_per_router,
        global_links_per_router=df.global_links_per_router if df
        else base.global_links_per_router,
        global_bandwidth_Bps=df.global_bandwidth_GBps * 1e9 if df and df.global_bandwidth_GBps
        else None,
        global_latency_s=df.global_latency_us * 1e-6 if df and df.global_latency_us is not None
        else None)


def _check_shape_keys(c: ClusterConfig) -> None:
    for key, users in _FABRIC_KEYS.items():
        if getattr(c, key) is not None and c.topology not in users:
            raise ConfigError(f"cluster.{key}: only used with cluster.topology "
                              f"{' or '.join(users)}, not with topology={c.topology!r}")
    if c.sites is None or c.sites == 1:
        extra = [k for k in ("wan_bandwidth_Mbps", "wan_latency_ms") if getattr(c, k) is not None]
        if extra:
            raise ConfigError(f"cluster.{extra[0]}: only used with cluster.sites > 1")


def _server_fabric(c: ClusterConfig, what: str) -> Fabric | None:
    """The fabric joining preset servers (``what`` names them in errors), keys checked."""
    explicit = [k for k in ("gpu", "gpus_per_node", "nvlink_bandwidth_GBps",
                            "nvlink_latency_us", "nvls") if getattr(c, k) is not None]
    if c.topology is None:
        explicit += [k for k in ("link_bandwidth_GBps", "link_latency_us")
                     if getattr(c, k) is not None]
    if explicit:
        raise ConfigError(f"cluster.{explicit[0]}: only used with cluster.topology, "
                          f"not with {what}")
    if c.topology is not None and c.topology not in FABRIC_OF_TOPOLOGY:
        raise ConfigError(f"cluster.topology={c.topology!r} cannot join servers of "
                          f"{what}; choose a fabric: {', '.join(FABRIC_OF_TOPOLOGY)}")
    fabric = _fabric(c, c.topology) if c.topology else None
    if c.topology is not None:
        fabric = replace(fabric or Fabric(), kind=FABRIC_OF_TOPOLOGY[c.topology],
                         bandwidth_Bps=None if c.link_bandwidth_GBps is None
                         else c.link_bandwidth_GBps * 1e9,
                         latency_s=None if c.link_latency_us is None
                         else c.link_latency_us * 1e-6)
    return fabric


def _preset_graph(c: ClusterConfig, num_gpus: int) -> tuple[nx.DiGraph, int]:
    fabric = _server_fabric(c, f"cluster.preset={c.preset!r}")
    if c.preset not in SERVERS:
        raise ConfigError(f"cluster.preset: unknown preset {c.preset!r}; choose one of "
                          f"{', '.join(PRESET_NAMES)}")
    graph = server_graph(c.preset, num_gpus, fabric, c.nics_per_node)
    return graph, min(SERVERS[c.preset].gpus_per_node, num_gpus)


def _explicit_graph(c: ClusterConfig, num_gpus: int) -> tuple[nx.DiGraph, int]:
    if c.link_bandwidth_GBps is None:
        raise ConfigError(f"cluster.link_bandwidth_GBps: required with "
                          f"cluster.topology={c.topology!r}")
    per_node = c.gpus_per_node or 1
    if per_node > 1 and c.topology not in FABRIC_OF_TOPOLOGY:
        raise ConfigError(f"cluster.gpus_per_node={per_node}: NVSwitch servers need a switched "
                          f"topology ({', '.join(FABRIC_OF_TOPOLOGY)}), not {c.topology!r}")
    if c.topology in ("torus2d", "torus3d") and c.dims is None:
        raise ConfigError(f"cluster.dims: required with cluster.topology={c.topology!r}, "
                          f"e.g. dims: {[4, 4] if c.topology == 'torus2d' else [4, 4, 4]}")
    if c.dims is not None:
        want = 2 if c.topology == "torus2d" else 3
        if len(c.dims) != want or any(k < 1 for k in c.dims):
            raise ConfigError(f"cluster.dims={c.dims}: {c.topology} needs {want} positive sizes")
        if math.prod(c.dims) != num_gpus:
            raise ConfigError(f"cluster.dims={c.dims} hold {math.prod(c.dims)} GPUs, not "
                              f"cluster.num_gpus/sites = {num_gpus}")
    gpu = _gpu(c)
    nvlink = (c.nvlink_bandwidth_GBps * 1e9 if c.nvlink_bandwidth_GBps
              else gpu.nvlink_bandwidth_Bps)
    graph = explicit_graph(
        c.topology, num_gpus, c.link_bandwidth_GBps * 1e9, (c.link_latency_us or 0.0) * 1e-6,
        gpus_per_node=per_node, nvlink_bandwidth_Bps=nvlink,
        nvlink_latency_s=(1.7 if c.nvlink_latency_us is None else c.nvlink_latency_us) * 1e-6,
        nvls=bool(c.nvls), dims=tuple(c.dims or ()), fabric=_fabric(c, c.topology))
    return graph, min(per_node, num_gpus)


def _gpu(c: ClusterConfig) -> GPUSpec:
    try:
        return gpu_spec(c.gpu or "A100-80GB")
    except KeyError as exc:
        raise ConfigError(f"cluster.gpu: {exc.args[0]}") from None


@dataclass(frozen=True)
class _Hosts:
    """The servers of a mixed cluster (``cluster.nodes``), one entry per server."""

    types: tuple[str, ...]
    """Server preset (preset groups) or GPU name (GPU groups) of each server."""
    gpus: tuple[GPUSpec, ...]
    """GPU spec of each rank."""
    per_node: int
    presets: bool
    """Whether the groups are server presets (else GPU types on cluster.topology)."""


def _node_hosts(c: ClusterConfig) -> _Hosts:
    """``cluster.nodes`` checked: one kind of group, known types, counts that add up."""
    assert c.nodes is not None
    both = [k for k in ("preset", "gpu") if getattr(c, k) is not None]
    if both:
        raise ConfigError(f"cluster.{both[0]}: give the GPU types in cluster.nodes, not also "
                          f"cluster.{both[0]}={getattr(c, both[0])!r}")
    if not c.nodes:
        raise ConfigError("cluster.nodes: empty; list groups such as "
                          "[{preset: dgx-a100-80g, count: 2}, {preset: dgx-h100, count: 2}]")
    presets = c.nodes[0].preset is not None
    specs: list[tuple[str, GPUSpec, int]] = []
    for k, group in enumerate(c.nodes):
        kinds = [key for key in ("preset", "gpu") if getattr(group, key) is not None]
        if len(kinds) != 1:
            raise ConfigError(f"cluster.nodes[{k}]: give one of 'preset' (a server preset) or "
                              f"'gpu' (a GPU type), got {' and '.join(kinds) or 'neither'}")
        if (kinds[0] == "preset") != presets:
            raise ConfigError(f"cluster.nodes[{k}].{kinds[0]}: groups mix 'preset' and 'gpu'; "
                              "give every group a server preset, or every group a GPU type "
                              "(with cluster.topology)")
        if presets:
            if group.preset not in SERVERS:
                raise ConfigError(f"cluster.nodes[{k}].preset: unknown server preset "
                                  f"{group.preset!r}; choose one of {', '.join(SERVERS)}")
            specs.append((group.preset, GPUS[SERVERS[group.preset].gpu], group.count))
        else:
            try:
                spec = gpu_spec(group.gpu)
            except KeyError as exc:
                raise ConfigError(f"cluster.nodes[{k}].gpu: {exc.args[0]}") from None
            specs.append((spec.name, spec, group.count))
    if presets:
        sizes = {SERVERS[name].gpus_per_node for name, _, _ in specs}
        if len(sizes) > 1:
            shown = ", ".join(f"{name}: {SERVERS[name].gpus_per_node}" for name, _, _ in specs)
            raise ConfigError(f"cluster.nodes: server presets of one cluster need the same "
                              f"GPUs per server, got {shown}")
        per_node = sizes.pop()
    else:
        if c.topology is None:
            raise ConfigError(f"cluster.nodes[0].gpu={c.nodes[0].gpu!r}: GPU groups need "
                              "cluster.topology (servers of cluster.gpus_per_node GPUs on it); "
                              "or give each group a server preset")
        per_node = c.gpus_per_node or 1
    total = per_node * sum(n for _, _, n in specs)
    if total != c.num_gpus:
        terms = " + ".join(f"{n}x {name}" for name, _, n in specs)
        raise ConfigError(f"cluster.nodes: {terms} servers of {per_node} GPUs = {total} GPUs "
                          f"!= cluster.num_gpus = {c.num_gpus}")
    types = tuple(name for name, _, n in specs for _ in range(n))
    gpus = tuple(spec for _, spec, n in specs for _ in range(n * per_node))
    return _Hosts(types, gpus, per_node, presets)


def _runs(types: tuple[str, ...]) -> list[tuple[str, int]]:
    """``types`` as (type, consecutive count) runs."""
    out: list[tuple[str, int]] = []
    for t in types:
        if out and out[-1][0] == t:
            out[-1] = (t, out[-1][1] + 1)
        else:
            out.append((t, 1))
    return out


def _mixed_graph(c: ClusterConfig, hosts: _Hosts, site: int, sites: int
                 ) -> tuple[nx.DiGraph, int]:
    """The graph of site ``site`` (of ``sites``) of a mixed cluster."""
    per_site = len(hosts.types) // sites
    types = hosts.types[site * per_site:(site + 1) * per_site]
    n = per_site * hosts.per_node
    if hosts.presets:
        fabric = _server_fabric(c, "cluster.nodes")
        return mixed_server_graph(_runs(types), fabric), min(hosts.per_node, n)
    graph, per_node = _explicit_graph(c, n)
    if per_node > 1 and c.nvlink_bandwidth_GBps is None:  # each server's NVLink is its GPU's
        set_server_links(graph, [ServerLinks(nvlink_Bps=gpu_spec(t).nvlink_bandwidth_Bps)
                                 for t in types], nic_fabric_links=False)
    return graph, per_node


def build_cluster(cfg: ExperimentConfig) -> Cluster:
    """The Cluster of the experiment's ``cluster:`` mapping (see :class:`ClusterConfig`)."""
    c = cfg.cluster
    if c.nics_per_node is not None and (c.preset is None or c.nodes is not None):
        raise ConfigError(f"cluster.nics_per_node={c.nics_per_node}: only used with a server "
                          "cluster.preset, not with cluster.topology or cluster.nodes")
    if c.nodes is not None:
        return _build_mixed_cluster(c)
    if c.preset is None and c.topology is None:
        raise ConfigError("cluster: give 'preset' "
                          f"({', '.join(PRESET_NAMES)}) or 'topology' ({', '.join(TOPOLOGIES)})")
    _check_shape_keys(c)
    settings = _collective_settings(c)
    sites = c.sites or 1
    if c.num_gpus % sites:
        raise ConfigError(f"cluster.sites={sites} does not divide cluster.num_gpus={c.num_gpus}")
    try:
        if c.preset == "ideal":
            extra = [k for k in ClusterConfig.model_fields
                     if k not in ("num_gpus", "preset") and getattr(c, k) is not None]
            if extra:
                raise ConfigError(f"cluster.{extra[0]}: not used with cluster.preset='ideal'")
            return ideal_cluster(c.num_gpus)
        build = _preset_graph if c.preset is not None else _explicit_graph
        graph, per_node = build(c, c.num_gpus // sites)
        name = c.preset or f"{c.topology}{c.num_gpus}"
        if c.preset is not None and c.topology is not None:
            name = f"{c.preset}/{c.topology}"
        if sites > 1:
            if c.wan_bandwidth_Mbps is None or c.wan_latency_ms is None:
                key = "wan_bandwidth_Mbps" if c.wan_bandwidth_Mbps is None else "wan_latency_ms"
                raise ConfigError(f"cluster.{key}: required with cluster.sites={sites}")
            graph = multi_site([graph] + [build(c, c.num_gpus // sites)[0]
                                          for _ in range(sites - 1)],
                               c.wan_bandwidth_Mbps * 1e6 / 8, c.wan_latency_ms * 1e-3)
            name = f"{name}x{sites}sites"
        gpu = GPUS[SERVERS[c.preset].gpu] if c.preset is not None else _gpu(c)
        default_launch = SERVERS[c.preset].collective_launch_s if c.preset is not None else 0.0
        return Cluster(name, graph, gpu, per_node, **settings.cluster_kwargs(default_launch))
    except TopologyError as exc:
        raise ConfigError(f"cluster: {exc}") from None


def _build_mixed_cluster(c: ClusterConfig) -> Cluster:
    """A heterogeneous cluster from ``cluster.nodes`` (servers of several types)."""
    _check_shape_keys(c)
    settings = _collective_settings(c)
    hosts = _node_hosts(c)
    sites = c.sites or 1
    if len(hosts.types) % sites:
        raise ConfigError(f"cluster.sites={sites} does not divide the {len(hosts.types)} "
                          "servers of cluster.nodes")
    try:
        graphs = [_mixed_graph(c, hosts, i, sites) for i in range(sites)]
        graph, per_node = graphs[0]
        if hosts.presets:
            name = "+".join(f"{n}x{t}" for t, n in _runs(hosts.types))
            if c.topology is not None:
                name = f"{name}/{c.topology}"
            launch = SERVERS[hosts.types[0]].collective_launch_s
        else:
            name, launch = f"{c.topology}{c.num_gpus}", 0.0
        if sites > 1:
            if c.wan_bandwidth_Mbps is None or c.wan_latency_ms is None:
                key = "wan_bandwidth_Mbps" if c.wan_bandwidth_Mbps is None else "wan_latency_ms"
                raise ConfigError(f"cluster.{key}: required with cluster.sites={sites}")
            graph = multi_site([g for g, _ in graphs], c.wan_bandwidth_Mbps * 1e6 / 8,
                               c.wan_latency_ms * 1e-3)
            name = f"{name}x{sites}sites"
        return Cluster(name, graph, hosts.gpus[0], per_node, **settings.cluster_kwargs(launch),
                       gpus=hosts.gpus)
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
    try:
        if name in SCHEDULES:
            sched = SCHEDULES[name](pp, m, v, cfg.training.seq_chunks)
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
                              f"{', '.join(SCHEDULES)} or give a schedule file path")
        sched = schedules.from_text(path.read_text(encoding="utf-8"), m, name=str(name))
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


def _stage_layers(par: ParallelConfig, model: ModelSpec, num_stages: int) -> tuple[int, ...]:
    """``parallel.layers_per_stage`` checked against the stages and layers, or the even split.

    Uneven splits as Llama 3 used them (first and last stages one layer fewer, for the
    embedding and the output head; Meta 2024, sec. 3.3.2)."""
    given = par.layers_per_stage
    if given is None or given == "balanced":  # balanced: see balanced_layers
        return split_layers(model.num_layers, num_stages)
    if isinstance(given, str):
        raise ConfigError(f"parallel.layers_per_stage={given!r}: give a list of layers per "
                          "stage, e.g. [15, 16, 16, 15], or 'balanced'")
    if len(given) != num_stages:
        raise ConfigError(f"parallel.layers_per_stage={given}: {len(given)} entries, but the "
                          f"pipeline has pp*vpp = {num_stages} stages")
    if any(n < 1 for n in given):
        raise ConfigError(f"parallel.layers_per_stage={given}: every stage needs at least "
                          "one layer")
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
    split = schedule.split_backward
    kinds = (schedules.FORWARD, schedules.BACKWARD) + ((schedules.WEIGHT_GRAD,) if split else ())
    stages_of = [[s for s in range(S) if schedule.stage_rank[s] == r] for r in range(pp)]
    types = [dict.fromkeys(cluster.gpu_of(g) for g in range(placement.num_gpus)
                           if placement.coords(g)["pp"] == r) for r in range(pp)]
    timers = {spec: work_timer(spec, default_profile(spec.name), costs.attention)
              for spec in dict.fromkeys(cluster.gpus)}
    groups = [group_profile(cluster, placement.group("tp", placement.gpu(pp=r)))
              for r in range(pp)]
    comm_cache: dict[tuple[int, str, float], float] = {}

    def comm_s(r: int, seg: CommSeg) -> float:
        key = (r, seg.op, seg.nbytes)
        if key not in comm_cache:
            prof = groups[r]
            algo = resolve_algorithm(seg.op, cluster.collective_algos.get(seg.op, "auto"),
                                     seg.nbytes, prof)
            comm_cache[key] = (0.0 if prof.n <= 1 or seg.group != "tp" else
                               cluster.collective_launch_s + estimate(seg.op, algo, seg.nbytes,
                                                                      prof))
        return comm_cache[key]

    def stage_layers(r: int, n: int) -> dict[int, int]:
        return dict(zip(stages_of[r], split_layers(n, len(stages_of[r])), strict=True))

    def cost(r: int, n: int) -> float:
        probe = [1] * S
        for s, k in stage_layers(r, n).items():
            probe[s] = k
        c = replace(costs, stage_layers=tuple(probe))
        segs = [seg for s in stages_of[r] for kind in kinds
                for seg in c.op_segments(schedules.Op(s, kind, 0), split)]
        work = [(seg, 1) for seg in segs if isinstance(seg, ComputeSeg)]
        work += [(seg.block, seg.steps) for seg in segs if isinstance(seg, RingAttention)]
        comm = sum(comm_s(r, seg) for seg in segs if isinstance(seg, CommSeg))
        return max(sum(k * timers[spec](seg) for seg, k in work) for spec in types[r]) + comm

    count = [len(stages_of[r]) for r in range(pp)]
    heap = [(cost(r, count[r] + 1), r) for r in range(pp)]
    heapq.heapify(heap)
    for _ in range(L - sum(count)):
        _, r = heapq.heappop(heap)
        count[r] += 1
        heapq.heappush(heap, (cost(r, count[r] + 1), r))
    out = [0] * S
    for r in range(pp):
        for s, k in stage_layers(r, count[r]).items():
            out[s] = k
    return tuple(out)


def build_experiment(data: Any, base_dir: Path | None = None) -> Experiment:
    """Validate ``data`` (a parsed experiment file) and build everything derived from it."""
    cfg = parse_config(data)
    model = build_model(cfg.model, base_dir)
    cluster = build_cluster(cfg)
    tp, pp, dp, cp = _resolve_layout(cfg, cluster.num_gpus)
    par = cfg.parallel
    if par.ep > 1:
        _check_expert_parallel(par, model, dp)
    if cp > 1:
        _check_context_parallel(cfg, model, cp)
    check_attention_kernel(cfg.training.attention, cluster)
    check_fault_targets(cfg.faults, cluster)
    if par.layers_per_stage is not None and model is None:
        raise ConfigError("parallel.layers_per_stage: needs a transformer model (the synthetic "
                          "model has no layers)")
    if par.zero_stage == 3 and model is None:
        raise ConfigError("parallel.zero_stage=3: ZeRO-3/FSDP needs a transformer model "
                          "(it gathers parameters layer by layer); the synthetic model has none")
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
                               syn.p2p_MB * MB, syn.grad_MB * MB, sched.chunks_per_rank,
                               seq_chunks=sched.seq_chunks)
    else:
        if sched.seq_chunks > 1 and cp > 1:
            raise ConfigError(f"parallel.cp={cp}: not supported with sequence chunks "
                              f"(schedule={cfg.schedule!r} has k={sched.seq_chunks})")
        if sched.seq_chunks > model.seq_length:
            raise ConfigError(f"training.seq_chunks={sched.seq_chunks} exceeds "
                              f"model.seq_length={model.seq_length} (a chunk needs a token)")
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
                                 _stage_layers(par, model, sched.num_stages),
                                 par.sequence_parallel and tp > 1,  # a no-op without TP
                                 par.zero_stage, t.recompute, t.attention,
                                 t.fused_norm, overlap_grad_reduce=par.overlap_grad_reduce,
                                 grad_bucket_bytes=par.grad_bucket_MB * MB, cp=cp, ep=par.ep,
                                 seq_chunks=sched.seq_chunks,
                                 vocab_parallel_loss=t.vocab_parallel_loss)
        if par.layers_per_stage == "balanced":
            costs = replace(costs, stage_layers=balanced_layers(costs, sched, placement,
                                                                cluster))
    return Experiment(cfg, dict(data), model, cluster, placement, sched, costs, gbs)
