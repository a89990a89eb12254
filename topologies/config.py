"""The ``cluster:`` mapping of an experiment file: one model per kind of cluster.

A cluster is one of five kinds, told apart by the keys the file gives (there is no
``kind:`` key; :func:`cluster_kind` reads it off):

- :class:`IdealCluster` (``preset: ideal``): infinitely fast GPUs and links;
- :class:`PresetCluster` (a server ``preset``): DGX-style servers on a scale-out fabric;
- :class:`TopologyCluster` (``topology``, no preset): a named topology of uniform links;
- :class:`PresetNodesCluster` (``nodes`` of ``preset`` groups): servers of several presets;
- :class:`GpuNodesCluster` (``nodes`` of ``gpu`` groups): servers of several GPU types on a
  named topology.

Every rule that involves the keys alone (a key of another kind, a shape key of another
topology, a missing ``dims``, sites that do not divide the GPUs, ...) is checked when
the file is parsed, with a message that names the key and its value;
:func:`topologies.build.build_cluster` turns a valid description into a Cluster.
"""

# (no `from __future__ import annotations`: see sim.config)
import math
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from base.schema import INVALID, Strict, invalid
from topologies.hardware import DEFAULT_GPU, gpu_spec
from topologies.power import capped
from topologies.presets import FABRIC_OF_TOPOLOGY, PRESET_NAMES, SERVERS, TOPOLOGIES
from topologies.variability import PUBLISHED

Topology = Literal["switch", "ring", "full-mesh", "torus2d", "torus3d", "fat-tree",
                   "rail-optimized", "dragonfly"]
"""Named topologies (:data:`topologies.presets.TOPOLOGIES`)."""

CollectiveAlgo = Literal["auto", "ring", "tree", "halving_doubling", "hierarchical", "pairwise",
                         "nvls", "p2p", "nvls_tree"]
"""Collective algorithm names; which op each implements is :mod:`sim.collectives`' to say."""

MAX_GPUS = 1 << 17
"""Most GPUs a cluster may have: 131,072, above the largest training clusters built
(xAI's Colossus, 100,000 H100 in 2024); building the graph of that many takes ~30 s."""

SHAPE_KEYS = {
    "oversubscription": ("fat-tree", "rail-optimized"),
    "gpus_per_leaf": ("fat-tree", "rail-optimized"),
    "tiers": ("fat-tree",),
    "leaves_per_pod": ("fat-tree",),
    "dragonfly": ("dragonfly",),
    "dims": ("torus2d", "torus3d"),
}
"""Topology shape keys and the topologies that use them."""


class CollectivesConfig(Strict):
    """Per-op algorithm overrides (``auto`` = NCCL-like choice by size and group)."""

    all_reduce: CollectiveAlgo | None = None
    """Algorithm of every all-reduce (DP gradients, TP activations)."""
    reduce_scatter: CollectiveAlgo | None = None
    """Algorithm of every reduce-scatter (ZeRO gradients, sequence parallelism)."""
    all_gather: CollectiveAlgo | None = None
    """Algorithm of every all-gather (ZeRO parameters, sequence parallelism)."""
    all_to_all: CollectiveAlgo | None = None
    """Algorithm of every all-to-all (expert parallelism)."""
    broadcast: CollectiveAlgo | None = None
    """Algorithm of every broadcast."""
    reduce: CollectiveAlgo | None = None
    """Algorithm of every reduce."""
    send: CollectiveAlgo | None = None
    """Algorithm of point-to-point sends (pipeline messages)."""


class DragonflyConfig(Strict):
    """Dragonfly shape (Kim et al. 2008): a routers per group, p GPUs per router, h global links."""

    routers_per_group: int = Field(gt=0)
    """a: routers in each group, all-to-all connected inside it."""
    gpus_per_router: int = Field(gt=0)
    """p: GPUs (or NICs) on each router."""
    global_links_per_router: int = Field(gt=0)
    """h: links from each router to other groups."""
    global_bandwidth_GBps: float | None = Field(None, gt=0)
    """Per direction; default: link_bandwidth_GBps (or the preset's NIC rate)."""
    global_latency_us: float | None = Field(None, ge=0)
    """Per global link; default: the fabric's hop latency."""


class NodeGroupConfig(Strict):
    """Servers of one type in a mixed cluster (``cluster.nodes``), listed in rank order."""

    count: int = Field(gt=0, le=MAX_GPUS)
    """Servers (nodes) of this type."""
    preset: str | None = None
    """A server preset (``dgx-a100-80g``, ``dgx-h100``, ...): its GPU, GPUs per server,
    NVLink, NICs and NVLS."""
    gpu: str | None = None
    """A GPU type (``A100-80GB``, ``H100``, ...) for servers of an explicit topology
    (``cluster.gpus_per_node`` GPUs each, default 1)."""


# ------------------------------------------------------------------------- the kinds


class _Kind(Strict):
    """Keys every kind has; rejects the keys of other kinds by name."""

    USED_WITH: ClassVar[str]
    """How an error names the clusters of this kind that a key is used with."""

    num_gpus: int = Field(gt=0, le=MAX_GPUS)
    """GPUs in the cluster, all sites together (at most :data:`MAX_GPUS`)."""

    @classmethod
    def describe(cls, data: dict) -> str:
        """This kind as an error names it, from the keys of ``data``."""
        return cls.USED_WITH

    @classmethod
    def check_keys(cls, data: dict) -> None:
        """Raise on a key of ``data`` that another kind of cluster uses, naming the kinds."""
        for key, value in data.items():
            if key in cls.model_fields:
                continue
            users = [kind.USED_WITH for kind in KINDS.values() if key in kind.model_fields]
            if len(users) > 2:  # every other kind: naming them says nothing
                raise invalid(f"cluster.{key}={value!r}: not used with {cls.describe(data)}")
            if users:
                raise invalid(f"cluster.{key}={value!r}: only used with {' or '.join(users)}, "
                              f"not with {cls.describe(data)}")

    @model_validator(mode="before")
    @classmethod
    def _keys_of_this_kind(cls, data: Any) -> Any:
        if isinstance(data, dict):
            cls.check_keys(data)
        return data


class IdealCluster(_Kind):
    """Infinitely fast GPUs and links, no latency: only the schedule shapes the timeline."""

    USED_WITH = "cluster.preset='ideal'"

    preset: Literal["ideal"]
    """``ideal``."""


class Networked(_Kind):
    """Keys of every cluster of real links: fabric shape, collectives, sites."""

    topology: Topology | None = None
    """The network (see the kinds)."""
    oversubscription: float | None = Field(None, ge=1)
    """Fat-tree / rail-optimized leaf down:up port ratio, e.g. 2.0 for 2:1."""
    tiers: Literal[2, 3] | None = None
    """Fat-tree switch tiers: 2 (leaf-spine, the default) or 3 (leaf-aggregation-core)."""
    gpus_per_leaf: int | None = Field(None, gt=0)
    """NIC ports per leaf switch, default 32 (one per GPU on DGX servers; with
    ``nics_per_node``, that many per server); rail-optimized: servers per scalable unit."""
    leaves_per_pod: int | None = Field(None, gt=0)
    """Three-tier fat-tree: leaf switches per pod (default: gpus_per_leaf, as in a k-ary
    fat-tree)."""
    dragonfly: DragonflyConfig | None = None
    """Dragonfly shape; required with ``topology: dragonfly``."""
    ecmp: Literal["dst-mod-k", "hash"] | None = None
    """How flows spread over equal-cost paths (default dst-mod-k)."""
    collective_launch_us: float | None = Field(None, ge=0)
    """Per collective; default: the preset's (NCCL's 8.4 µs), 0 for explicit topologies."""
    collective_step_us: float | None = Field(None, ge=0)
    """Extra software latency per collective step, on top of the route's hop latencies."""
    collective_granularity: Literal["stream", "step"] | None = None
    """``stream`` (default): one flow per ring edge; ``step``: one flow per ring step."""
    collective_protocol: Literal["auto", "simple", "ll128", "ll"] | None = None
    """NCCL protocol of ring and tree collectives: ``auto`` (default: per size, as NCCL's
    tuner picks), or always ``simple``, ``ll128`` or ``ll`` (like ``NCCL_PROTO``)."""
    collectives: CollectivesConfig | None = None
    """Per-op algorithm overrides; default ``auto`` for every op."""
    sites: int | None = Field(None, gt=0)
    """Geo-distributed: this many identical sites of num_gpus/sites GPUs, joined by WAN links."""
    wan_bandwidth_Mbps: float | None = Field(None, gt=0)
    """Per WAN link and direction, 1 Mb = 1e6 bit; required with sites > 1."""
    wan_latency_ms: float | None = Field(None, ge=0)
    """Per WAN link; required with sites > 1."""
    gpu_power_limit_w: float | None = Field(None, gt=0)
    """Board power limit of every GPU, W (``nvidia-smi -pl``), between the GPU's minimum
    limit and its TDP (``topologies/power_limits.toml``; H100 SXM variants: 200-700 W);
    default: the server preset's stated limit (``grand-teton-h100``: 500 W), else the TDP.
    Below the TDP, GEMMs and attention run at the published throughput fraction of that
    limit (:mod:`topologies.power`); memory-bound kernels keep their rate."""
    gpu_speed_spread: float | str | None = None
    """How much the GPUs' compute speed varies from GPU to GPU: the relative standard
    deviation around the median GPU (0 <= spread < 0.5), or ``sinha2022`` for the one
    published figure, 1.48% (Sinha et al. 2022, ``topologies/gpu_variability.toml``). Set,
    every GPU's GEMMs and attention run at the pace of the expected slowest of the
    cluster's N GPUs, 1 + spread · E[max of N standard normals] (a synchronous job waits
    for its slowest GPU; :mod:`topologies.variability`); memory-bound kernels keep their
    rate. Default: none, every GPU at its device profile's speed (the A100 profile was
    fitted on runs of 32-256 GPUs, so it holds their pacing already:
    docs/gpu-variability.md)."""

    @field_validator("gpu_speed_spread")
    @classmethod
    def _spread_range(cls, value: float | str) -> float | str:
        if value == PUBLISHED:
            return value
        if isinstance(value, str) or not 0.0 <= value < 0.5:
            raise invalid(f"cluster.gpu_speed_spread={value!r}: a relative standard "
                             "deviation between 0 and 0.5 (0.0148 is 1.48%), or 'sinha2022'")
        return value

    def check_power_limit(self, gpus: tuple[str, ...]) -> None:
        """Raise unless :attr:`gpu_power_limit_w` is within the range of each GPU of
        ``gpus`` (names, case-insensitive), naming the limit and the range."""
        if self.gpu_power_limit_w is None:
            return
        for name in dict.fromkeys(gpu_spec(g).name for g in gpus):
            try:
                capped(gpu_spec(name), self.gpu_power_limit_w)
            except ValueError as exc:
                raise invalid(f"cluster.gpu_power_limit_w={self.gpu_power_limit_w:g}: "
                              f"{exc}") from None

    @model_validator(mode="after")
    def _shape_and_sites(self) -> Self:
        for key, users in SHAPE_KEYS.items():
            if getattr(self, key, None) is not None and self.topology not in users:
                raise invalid(f"cluster.{key}: only used with cluster.topology "
                              f"{' or '.join(users)}, not with topology={self.topology!r}")
        if self.sites is None or self.sites == 1:
            extra = [k for k in ("wan_bandwidth_Mbps", "wan_latency_ms")
                     if getattr(self, k) is not None]
            if extra:
                raise invalid(f"cluster.{extra[0]}: only used with cluster.sites > 1")
        if self.topology == "dragonfly" and self.dragonfly is None:
            raise invalid("cluster.dragonfly: required with cluster.topology='dragonfly' "
                          "(routers_per_group, gpus_per_router, global_links_per_router)")
        return self

    def check_wan(self) -> None:
        """The WAN keys a multi-site cluster needs."""
        sites = self.sites or 1
        if sites > 1 and (self.wan_bandwidth_Mbps is None or self.wan_latency_ms is None):
            key = "wan_bandwidth_Mbps" if self.wan_bandwidth_Mbps is None else "wan_latency_ms"
            raise invalid(f"cluster.{key}: required with cluster.sites={sites}")


class ServerFabric(Networked):
    """Preset servers, optionally on a chosen scale-out fabric."""

    topology: Topology | None = None
    """The fabric between the servers: ``switch`` (a non-blocking crossbar, the default),
    ``fat-tree``, ``rail-optimized`` or ``dragonfly``."""
    link_bandwidth_GBps: float | None = Field(None, gt=0)
    """With ``topology``: the fabric's link rate per direction, 1 GB = 1e9 B (default: the
    servers' NIC rate)."""
    link_latency_us: float | None = Field(None, ge=0)
    """With ``topology``: the fabric's latency per hop (default: the preset's fabric hop)."""

    @model_validator(mode="after")
    def _fabric_keys(self) -> Self:
        if self.topology is None:
            given = [k for k in ("link_bandwidth_GBps", "link_latency_us")
                     if getattr(self, k) is not None]
            if given:
                raise invalid(f"cluster.{given[0]}: only used with cluster.topology, "
                              f"not with {self.describe(self.model_dump())}")
        elif self.topology not in FABRIC_OF_TOPOLOGY:
            raise invalid(f"cluster.topology={self.topology!r} cannot join servers of "
                          f"{self.describe(self.model_dump())}; choose a fabric: "
                          f"{', '.join(FABRIC_OF_TOPOLOGY)}")
        return self


class ExplicitLinks(Networked):
    """A named topology of uniform links, optionally with NVSwitch servers."""

    topology: Topology
    """``switch``, ``fat-tree``, ``rail-optimized`` and ``dragonfly`` are fabrics (with
    gpus_per_node > 1, NVSwitch servers with one NIC per GPU on them); ``ring``,
    ``full-mesh``, ``torus2d`` and ``torus3d`` link GPUs directly."""
    link_bandwidth_GBps: float = Field(gt=0)
    """Every link's rate per direction, 1 GB = 1e9 B."""
    link_latency_us: float | None = Field(None, ge=0)
    """Per hop (default 0)."""
    gpus_per_node: int | None = Field(None, gt=0)
    """Switched topologies: GPUs per NVSwitch server (default 1: no NVLink)."""
    nvlink_bandwidth_GBps: float | None = Field(None, gt=0)
    """Per direction; default: the GPU's."""
    nvlink_latency_us: float | None = Field(None, ge=0)
    """Per NVLink hop (default 1.7 µs; GPU-NVSwitch-GPU is two hops)."""
    nvls: bool | None = None
    """NVSwitch reduces in-network (NVLink SHARP); default false."""
    dims: list[int] | None = None
    """Torus sizes per axis; their product is the GPUs of a site."""

    @model_validator(mode="after")
    def _explicit_keys(self) -> Self:
        per_node, t = self.gpus_per_node or 1, self.topology
        if per_node > 1 and t not in FABRIC_OF_TOPOLOGY:
            raise invalid(f"cluster.gpus_per_node={per_node}: NVSwitch servers need a switched "
                          f"topology ({', '.join(FABRIC_OF_TOPOLOGY)}), not {t!r}")
        if t in ("torus2d", "torus3d") and self.dims is None:
            raise invalid(f"cluster.dims: required with cluster.topology={t!r}, "
                          f"e.g. dims: {[4, 4] if t == 'torus2d' else [4, 4, 4]}")
        if self.dims is not None:
            want = 2 if t == "torus2d" else 3
            if len(self.dims) != want or any(k < 1 for k in self.dims):
                raise invalid(f"cluster.dims={self.dims}: {t} needs {want} positive sizes")
        return self

    def check_dims(self, site_gpus: int) -> None:
        """The torus sizes against the GPUs of one site."""
        if self.dims is not None and math.prod(self.dims) != site_gpus:
            raise invalid(f"cluster.dims={self.dims} hold {math.prod(self.dims)} GPUs, not "
                          f"cluster.num_gpus/sites = {site_gpus}")


class PresetCluster(ServerFabric):
    """Servers of one preset (GPU, NVSwitch, NICs, latencies) on a scale-out fabric."""

    USED_WITH = "a server cluster.preset"

    preset: str
    """A server preset: dgx-a100-80g, dgx-a100-40g, jean-zay-a100 (Omni-Path), dgx-h100,
    dgx-h200, hgx-h800, grand-teton-h100, a3-mega (Google Cloud, GPUDirect-TCPXO), dgx-b200,
    gb200-nvl72 (:data:`topologies.presets.SERVERS`)."""
    nics_per_node: int | None = Field(None, gt=0)
    """The servers' scale-out NICs (default: the preset's, one per GPU), each shared by
    gpus_per_node / nics_per_node GPUs, e.g. 2 for servers with two HDR ports instead of
    a DGX's eight; it must divide the GPUs per server."""
    nic_Gbps: float | None = Field(None, gt=0)
    """Line rate of each of the servers' scale-out NICs, Gb/s per direction (default: the
    preset's, e.g. 200 for a DGX A100's HDR ports, 400 for NDR), e.g. 100 for servers on
    EDR InfiniBand or 800 on XDR."""

    @classmethod
    def describe(cls, data: dict) -> str:
        return f"cluster.preset={data.get('preset')!r}"

    @model_validator(mode="after")
    def _preset_keys(self) -> Self:
        if self.preset not in SERVERS:
            raise invalid(f"cluster.preset: unknown preset {self.preset!r}; choose one of "
                          f"{', '.join(PRESET_NAMES)}")
        sites = self.sites or 1
        if self.num_gpus % sites:
            raise invalid(f"cluster.sites={sites} does not divide "
                          f"cluster.num_gpus={self.num_gpus}")
        self.check_wan()
        self.check_power_limit((SERVERS[self.preset].gpu,))
        return self


class TopologyCluster(ExplicitLinks):
    """A named topology with uniform links and GPUs of one type."""

    USED_WITH = "cluster.topology (no preset)"

    gpu: str | None = None
    """The GPU type (``A100-80GB``, ``H100``, ... :data:`topologies.hardware.GPUS`);
    default A100-80GB."""

    @classmethod
    def describe(cls, data: dict) -> str:
        return f"cluster.topology={data.get('topology')!r}"

    @model_validator(mode="after")
    def _topology_keys(self) -> Self:
        sites = self.sites or 1
        if self.num_gpus % sites:
            raise invalid(f"cluster.sites={sites} does not divide "
                          f"cluster.num_gpus={self.num_gpus}")
        self.check_dims(self.num_gpus // sites)
        if self.gpu is not None:
            try:
                gpu_spec(self.gpu)
            except KeyError as exc:
                raise invalid(f"cluster.gpu: {exc.args[0]}") from None
        self.check_wan()
        self.check_power_limit((self.gpu or DEFAULT_GPU,))
        return self


class _Nodes(Networked):
    """Servers of several types, listed in rank order."""

    nodes: list[NodeGroupConfig]
    """Groups of servers, each a ``preset`` or a ``gpu`` type and a ``count`` of servers,
    ranks numbered group after group, e.g.
    ``[{preset: dgx-a100-80g, count: 2}, {preset: dgx-h100, count: 2}]``."""

    GROUP_KEY: ClassVar[str]
    """The key every group gives: ``preset`` or ``gpu``."""

    @classmethod
    def check_keys(cls, data: dict) -> None:
        for key in ("preset", "gpu"):
            if data.get(key) is not None:
                raise invalid(f"cluster.{key}: give the GPU types in cluster.nodes, not also "
                              f"cluster.{key}={data[key]!r}")
        super().check_keys(data)

    @model_validator(mode="after")
    def _groups(self) -> Self:
        if not self.nodes:
            raise invalid("cluster.nodes: empty; list groups such as "
                          "[{preset: dgx-a100-80g, count: 2}, {preset: dgx-h100, count: 2}]")
        for k, group in enumerate(self.nodes):
            kinds = [key for key in ("preset", "gpu") if getattr(group, key) is not None]
            if len(kinds) != 1:
                raise invalid(f"cluster.nodes[{k}]: give one of 'preset' (a server preset) or "
                              f"'gpu' (a GPU type), got {' and '.join(kinds) or 'neither'}")
            if kinds[0] != self.GROUP_KEY:
                raise invalid(f"cluster.nodes[{k}].{kinds[0]}: groups mix 'preset' and 'gpu'; "
                              "give every group a server preset, or every group a GPU type "
                              "(with cluster.topology)")
            self.check_group(k, group)
        per_node = self.server_size()
        servers = sum(g.count for g in self.nodes)
        total = per_node * servers
        if total != self.num_gpus:
            terms = " + ".join(f"{g.count}x {self.group_type(g)}" for g in self.nodes)
            raise invalid(f"cluster.nodes: {terms} servers of {per_node} GPUs = {total} GPUs "
                          f"!= cluster.num_gpus = {self.num_gpus}")
        sites = self.sites or 1
        if servers % sites:
            raise invalid(f"cluster.sites={sites} does not divide the {servers} servers of "
                          "cluster.nodes")
        self.check_wan()
        self.check_power_limit(tuple(self.group_gpu(g) for g in self.nodes))
        return self

    def group_gpu(self, group: NodeGroupConfig) -> str:
        """The GPU type of ``group``'s servers."""
        return SERVERS[group.preset].gpu if group.preset else str(group.gpu)

    def check_group(self, k: int, group: NodeGroupConfig) -> None:
        """Raise unless group ``k``'s type is known."""
        raise NotImplementedError

    def group_type(self, group: NodeGroupConfig) -> str:
        """The server preset or GPU name of ``group``."""
        raise NotImplementedError

    def server_size(self) -> int:
        """GPUs per server."""
        raise NotImplementedError

    def server_types(self) -> tuple[str, ...]:
        """Each server's type (:meth:`group_type`), in rank order."""
        return tuple(self.group_type(g) for g in self.nodes for _ in range(g.count))


class PresetNodesCluster(_Nodes, ServerFabric):
    """Servers of several presets (same GPUs per server) on one scale-out fabric."""

    USED_WITH = "cluster.nodes of server presets"
    GROUP_KEY = "preset"

    def check_group(self, k: int, group: NodeGroupConfig) -> None:
        if group.preset not in SERVERS:
            raise invalid(f"cluster.nodes[{k}].preset: unknown server preset "
                          f"{group.preset!r}; choose one of {', '.join(SERVERS)}")

    def group_type(self, group: NodeGroupConfig) -> str:
        return str(group.preset)

    def server_size(self) -> int:
        sizes = {SERVERS[g.preset].gpus_per_node for g in self.nodes if g.preset}
        if len(sizes) > 1:
            shown = ", ".join(f"{g.preset}: {SERVERS[g.preset].gpus_per_node}"
                              for g in self.nodes if g.preset)
            raise invalid(f"cluster.nodes: server presets of one cluster need the same "
                          f"GPUs per server, got {shown}")
        return sizes.pop()


class GpuNodesCluster(_Nodes, ExplicitLinks):
    """Servers of several GPU types (``gpus_per_node`` each) on a named topology."""

    USED_WITH = "cluster.nodes of GPU types"
    GROUP_KEY = "gpu"

    @classmethod
    def check_keys(cls, data: dict) -> None:
        super().check_keys(data)
        if data.get("topology") is None:
            group = data["nodes"][0]  # cluster_kind chose this kind by its gpu
            first = group.get("gpu") if isinstance(group, dict) else group.gpu
            raise invalid(f"cluster.nodes[0].gpu={first!r}: GPU groups need cluster.topology "
                          "(servers of cluster.gpus_per_node GPUs on it); or give each group a "
                          "server preset")

    @model_validator(mode="after")
    def _site_dims(self) -> Self:
        self.check_dims(self.num_gpus // (self.sites or 1))
        return self

    def check_group(self, k: int, group: NodeGroupConfig) -> None:
        try:
            gpu_spec(str(group.gpu))
        except KeyError as exc:
            raise invalid(f"cluster.nodes[{k}].gpu: {exc.args[0]}") from None

    def group_type(self, group: NodeGroupConfig) -> str:
        return gpu_spec(str(group.gpu)).name

    def server_size(self) -> int:
        return self.gpus_per_node or 1


KINDS: dict[str, type[_Kind]] = {
    "ideal": IdealCluster, "preset": PresetCluster, "topology": TopologyCluster,
    "preset-nodes": PresetNodesCluster, "gpu-nodes": GpuNodesCluster,
}
"""The kinds of cluster by tag."""


def cluster_kind(data: Any) -> str | None:
    """The kind of the ``cluster:`` mapping ``data`` (a tag of :data:`KINDS`), from the keys
    it gives: ``nodes`` (of server presets, or of GPU types), ``preset: ideal``, another
    ``preset``, or ``topology``; None when it gives none of them."""
    if not isinstance(data, dict):
        return next((tag for tag, kind in KINDS.items() if isinstance(data, kind)), None)
    nodes = data.get("nodes")
    if nodes is not None:
        first = nodes[0] if isinstance(nodes, list) and nodes else None
        gpus = isinstance(first, dict) and "gpu" in first and "preset" not in first
        return "gpu-nodes" if gpus else "preset-nodes"
    if data.get("preset") == "ideal":
        return "ideal"
    if data.get("preset") is not None:
        return "preset"
    if data.get("topology") is not None:
        return "topology"
    return None


ClusterConfig = Annotated[
    Annotated[IdealCluster, Tag("ideal")] | Annotated[PresetCluster, Tag("preset")]
    | Annotated[TopologyCluster, Tag("topology")]
    | Annotated[PresetNodesCluster, Tag("preset-nodes")]
    | Annotated[GpuNodesCluster, Tag("gpu-nodes")],
    Discriminator(cluster_kind, custom_error_type=INVALID,
                  custom_error_message=f"cluster: give 'preset' ({', '.join(PRESET_NAMES)}), "
                                       f"'topology' ({', '.join(TOPOLOGIES)}) or 'nodes'")]
"""The ``cluster:`` mapping: one of the kinds, chosen by :func:`cluster_kind`."""
