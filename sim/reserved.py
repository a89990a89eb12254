"""Device memory a training process holds outside the tensors the memory model lists: the
CUDA context and module images, the cuBLAS / cuBLASLt workspaces, and the NCCL buffers of
every communicator a rank takes part in (``sim/data/reserved_memory.toml``, each number with
its source; the framework's choices in ``workloads/frameworks.toml``: ``cuda_module_loading``,
``nccl_groups``, ``nccl_nvls``).

NCCL, per communicator of ``n`` ranks (NVIDIA/nccl ``init.cc``): ``channels x connections x
(LL + LL128 + Simple buffer)``, with one connection a channel when ``n == 2`` and two
otherwise (ring and chain tree, their shared peers connected once), ``channels`` the
generation's intra-server count when the communicator stays in one NVSwitch server, else two a
NIC its local ranks use (at most 32); plus NVLink SHARP's ``16 x 2 x (Simple + 2 MiB)`` per
head where NCCL sets it up (Hopper and later NVSwitch servers, more than two local ranks,
the framework not turning NVLS off).

Which communicators a rank creates (:data:`NCCL_GROUPS`): PyTorch's ProcessGroupNCCL creates a
group's NCCL communicator on the group's first collective, so a rank pays for the groups its
framework runs a collective on: ``world`` (the start-up barrier), ``dp`` (gradients; with
context parallelism the DP x CP group Megatron reduces over), ``tp``, ``cp``, ``pp`` (the
pipeline's sends and receives), ``model_parallel`` (Megatron's gradient-norm and found-inf
all-reduces over TP x PP) and ``embedding`` (the first and last stage's tied-embedding
gradient all-reduce). A group of one rank creates nothing.
"""

from __future__ import annotations

import math
import tomllib
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "reserved_memory.toml"

NCCL_GROUPS = ("world", "dp", "tp", "cp", "pp", "model_parallel", "embedding")
"""The process groups a framework profile's ``nccl_groups`` may name (module docstring)."""

MODULE_LOADINGS = ("eager", "lazy")


@lru_cache(maxsize=1)
def data() -> dict[str, Any]:
    """``reserved_memory.toml``, parsed once."""
    return tomllib.loads(DATA.read_text())


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator as a rank sees it."""

    group: str
    ranks: int
    """Ranks in the communicator."""
    servers: int
    """Servers its ranks are on."""
    local_ranks: int
    """The most of its ranks on one server."""


@dataclass(frozen=True)
class Reserved:
    """One GPU's memory outside the listed tensors, bytes, by component."""

    context: float
    cublas: float
    nccl: float
    nvls: float
    userbuffers: float = 0.0
    communicators: tuple[Communicator, ...] = ()

    @property
    def total(self) -> float:
        return self.context + self.cublas + self.nccl + self.nvls + self.userbuffers

    @property
    def outside_allocator(self) -> float:
        """What PyTorch's caching allocator does not hold (its ``reserved_bytes`` leaves it
        out): all but the cuBLAS and Transformer Engine workspaces, which it allocates."""
        return self.total - self.cublas


def context_bytes(module_loading: str) -> float:
    """The CUDA context with its module images under ``module_loading`` (eager or lazy)."""
    if module_loading not in MODULE_LOADINGS:
        raise ValueError(f"cuda_module_loading={module_loading!r} (one of eager, lazy)")
    return float(data()["context"][f"{module_loading}_bytes"])


def cublas_bytes(generation: str | None) -> float:
    """cuBLAS and cuBLASLt workspaces of the compute stream on a GPU of ``generation``."""
    table = data()["cublas"]
    return float(table.get(f"{generation}_bytes", table["default_bytes"]))


def connection_bytes() -> int:
    """One connection's buffers: one per protocol (LL, LL128, Simple)."""
    n = data()["nccl"]
    return n["ll_bytes"] + n["ll128_bytes"] + n["simple_bytes"]


def channels(comm: Communicator, generation: str | None, nics_per_server: int,
             gpus_per_server: int) -> int:
    """NCCL's channels for ``comm``: the generation's intra-server count within one server,
    else two a NIC its local ranks use (the NICs shared evenly by the server's GPUs), at most
    32."""
    n = data()["nccl"]
    if comm.servers <= 1:
        table = n["intra_node_channels"]
        return int(table.get(generation, table["default"]))
    nics = max(1, min(nics_per_server,
                      math.ceil(comm.local_ranks * nics_per_server / max(gpus_per_server, 1))))
    return min(n["max_channels"], n["channels_per_nic"] * nics)


@lru_cache(maxsize=64)
def version(v: str) -> tuple[int, ...]:
    """``"2.18"`` as (2, 18), for comparing NCCL versions (kept: each communicator of each
    rank asks)."""
    try:
        return tuple(int(p) for p in v.split("."))
    except ValueError:
        raise ValueError(f"nccl_version={v!r} (a version such as 2.18)") from None


def nccl_bytes(comm: Communicator, generation: str | None, nics_per_server: int,
               gpus_per_server: int, nccl_version: str = "2.12") -> float:
    """Ring and tree buffers of one communicator on one of its ranks (module docstring);
    from NCCL 2.22 (runtime connection) the ring's only."""
    if comm.ranks < 2:
        return 0.0
    n = data()["nccl"]
    runtime = version(nccl_version) >= version(n["runtime_connect"]["from_version"])
    conns = (n["connections_two_ranks"] if comm.ranks == 2 or runtime
             else n["connections"])
    return float(channels(comm, generation, nics_per_server, gpus_per_server) * conns
                 * connection_bytes())


def nvls_head_bytes(nccl_version: str) -> float:
    """NVLS buffers of one head under ``nccl_version`` (0 before NVLS, 2.17)."""
    v = data()["nccl"]["nvls"]
    size = 0.0
    for since, b in v["per_head_bytes"]:
        if version(nccl_version) >= version(since):
            size = float(b)
    return size


def nvls_bytes(comm: Communicator, generation: str | None, nics_per_server: int,
               gpus_per_server: int, enabled: bool, nccl_version: str = "2.12") -> float:
    """NVLink SHARP buffers of one communicator on one of its ranks: a head's buffers
    (:func:`nvls_head_bytes`) per GPU of the communicator within a server, per NIC its
    local ranks use across servers; 0 where NCCL does not set NVLS up (off, before 2.17,
    not an NVSwitch Hopper or later, two local ranks or fewer)."""
    v = data()["nccl"]["nvls"]
    if (not enabled or generation not in v["generations"]
            or comm.local_ranks < v["min_local_ranks"]):
        return 0.0
    heads = comm.local_ranks if comm.servers <= 1 else max(1, channels(
        comm, generation, nics_per_server, gpus_per_server) // data()["nccl"]["channels_per_nic"])
    return nvls_head_bytes(nccl_version) * heads


def userbuffers_bytes(tokens: int, hidden: int, fp8: bool) -> float:
    """Transformer Engine's userbuffers for TP overlap: a ``tokens x hidden`` buffer per
    overlapped GEMM (one byte an element for the all-gather ones under FP8, two otherwise),
    registered outside PyTorch's allocator."""
    u = data()["userbuffers"]
    return float((len(u["buffers_fp8"]) * (1 if fp8 else 2) + len(u["buffers_other"]) * 2)
                 * tokens * hidden)


def te_workspace_bytes(generation: str | None) -> float:
    """Transformer Engine's cuBLAS workspace repeated for its three userbuffers GEMM
    streams (through PyTorch's allocator)."""
    u = data()["userbuffers"]
    ws = dict(u["te_workspace_bytes"]).get(generation, u["te_workspace_default_bytes"])
    return float(u["streams"] * ws)


def _describe(group: str, gpus, host_of) -> Communicator:
    hosts: dict[int, int] = {}
    for g in gpus:
        h = host_of(g)
        hosts[h] = hosts.get(h, 0) + 1
    return Communicator(group, len(gpus), len(hosts), max(hosts.values()))


def communicators(placement, gpu: int, groups: tuple[str, ...], host_of,
                  tied_embeddings: bool, world: Communicator | None = None
                  ) -> tuple[Communicator, ...]:
    """The communicators of ``groups`` that GPU ``gpu`` takes part in, with two or more
    ranks (module docstring); ``world``: the world's, where already described."""
    c = placement.coords(gpu)
    deg = {d: placement.degree(d) for d in ("tp", "cp", "dp", "pp")}
    out = []
    for group in groups:
        if group not in NCCL_GROUPS:
            raise ValueError(f"nccl_groups: {group!r} is not one of {', '.join(NCCL_GROUPS)}")
        if group == "world":
            n = placement.num_gpus
            if n < 2:
                continue
            if world is not None:
                out.append(world)
                continue
            gpus = tuple(range(n))
        elif group in ("tp", "cp", "pp"):
            if deg[group] < 2:
                continue
            gpus = placement.group(group, gpu)
        elif group == "dp":
            if deg["dp"] * deg["cp"] < 2:
                continue
            gpus = tuple(placement.gpu(**{**c, "dp": d, "cp": k})
                         for k in range(deg["cp"]) for d in range(deg["dp"]))
        elif group == "model_parallel":
            if deg["tp"] * deg["pp"] < 2:
                continue
            gpus = tuple(placement.gpu(**{**c, "tp": t, "pp": p})
                         for p in range(deg["pp"]) for t in range(deg["tp"]))
        else:  # embedding: the first and last stage's tied embeddings
            if not tied_embeddings or deg["pp"] < 2 or c["pp"] not in (0, deg["pp"] - 1):
                continue
            gpus = (placement.gpu(**{**c, "pp": 0}), placement.gpu(**{**c, "pp": deg["pp"] - 1}))
        out.append(_describe(group, gpus, host_of))
    return tuple(out)


def reserved(placement, gpu: int, cluster, framework, tied_embeddings: bool,
             generation: str | None, ub_tokens: int = 0, ub_hidden: int = 0,
             fp8: bool = False, world: Communicator | None = None,
             comms: tuple[Communicator, ...] | None = None) -> Reserved:
    """GPU ``gpu``'s reserved memory, by component, under ``framework``'s choices; with
    ``ub_tokens`` (the tokens of a micro-batch on a CP rank, where TP overlap runs in
    userbuffers) Transformer Engine's userbuffers too; ``comms``: its communicators
    (:func:`communicators`), where already described."""
    if comms is None:
        comms = communicators(placement, gpu, framework.nccl_groups, cluster.host_of,
                              tied_embeddings, world)
    nics = len(cluster.nics_of(cluster.host_of(gpu))) or 1
    per = cluster.gpus_per_node
    return Reserved(
        context=context_bytes(framework.cuda_module_loading),
        cublas=cublas_bytes(generation) + (te_workspace_bytes(generation) if ub_tokens else 0.0),
        nccl=sum(nccl_bytes(cm, generation, nics, per, framework.nccl_version) for cm in comms),
        nvls=sum(nvls_bytes(cm, generation, nics, per, framework.nccl_nvls,
                            framework.nccl_version) for cm in comms),
        userbuffers=userbuffers_bytes(ub_tokens, ub_hidden, fp8) if ub_tokens else 0.0,
        communicators=comms)


def per_stage(exp, generation_of) -> tuple[float, ...]:
    """Reserved bytes of each pipeline stage's first GPU (a stage's GPUs differ only in
    which servers their groups span, the same for a uniform layout), by stage."""
    return tuple(r.total for r in breakdown(exp, generation_of))


def breakdown(exp, generation_of) -> tuple[Reserved, ...]:
    """:func:`per_stage`'s components, by stage: worked out once per (frozen) experiment and
    ``generation_of`` and kept on it, since a run (``sim.api``) and what reads its memory
    afterwards (``sim.validate``, ``sim.corpus``) each ask for them."""
    kept = exp.__dict__.get("_reserved_breakdown")
    if kept is not None and kept[0] is generation_of:
        return kept[1]
    cfg = exp.config
    found = by_rank(exp.placement, exp.cluster, exp.framework, exp.model,
                    cfg.parallel.tp_comm_overlap, cfg.model.seq_length,
                    cfg.training.micro_batch_size, cfg.training.precision == "fp8",
                    generation_of)
    exp.__dict__["_reserved_breakdown"] = (generation_of, found)
    return found


BY_RANK_KEPT = 256
"""Layouts a cluster keeps :func:`by_rank`'s answers for (in :attr:`~topologies.cluster.
Cluster.memo`; the oldest go first): a search meets thousands of layouts, a run or a sweep a
few, and an answer is a tuple of one small record per pipeline rank."""


def by_rank(placement, cluster, framework, model, tp_comm_overlap: bool, seq_length: int,
            micro_batch_size: int, fp8: bool, generation_of) -> tuple[Reserved, ...]:
    """Each pipeline rank's reserved memory (its first GPU's) for a layout: ``placement`` on
    ``cluster`` under ``framework``, ``model`` (None: a synthetic workload, nothing
    reserved), with userbuffers where ``tp_comm_overlap`` runs in them.

    Kept per cluster by what it reads (the placement, the framework's five fields, the tied
    embeddings, the userbuffers' tokens, width and FP8, ``generation_of`` by identity): each
    experiment of a repeated run or a sweep is built anew and asked again (~3 ms at 1,024
    GPUs). Worked out by :func:`_by_rank` (the communicators by :func:`_communicators_fast`),
    :func:`by_rank_plain` the reference."""
    if model is None:
        return (Reserved(0.0, 0.0, 0.0, 0.0),) * placement.degree("pp")
    tokens, hidden = _userbuffers(placement, framework, model, tp_comm_overlap, seq_length,
                                  micro_batch_size)
    key = (placement, framework.nccl_groups, framework.cuda_module_loading,
           framework.nccl_version, framework.nccl_nvls, bool(model.tied_embeddings), tokens,
           hidden, bool(fp8) if hidden else False, generation_of)
    kept = cluster.memo.get("reserved_by_rank")
    if kept is None:
        kept = cluster.memo["reserved_by_rank"] = {}
    found = kept.get(key)
    if found is None:
        found = _by_rank(placement, cluster, framework, model, tokens, hidden, fp8,
                         generation_of, fast=True)
        if len(kept) >= BY_RANK_KEPT:
            del kept[next(iter(kept))]
        kept[key] = found
    return found


def by_rank_plain(placement, cluster, framework, model, tp_comm_overlap: bool,
                  seq_length: int, micro_batch_size: int, fp8: bool, generation_of
                  ) -> tuple[Reserved, ...]:
    """:func:`by_rank` afresh, each communicator described GPU by GPU (:func:`communicators`):
    the reference."""
    if model is None:
        return (Reserved(0.0, 0.0, 0.0, 0.0),) * placement.degree("pp")
    tokens, hidden = _userbuffers(placement, framework, model, tp_comm_overlap, seq_length,
                                  micro_batch_size)
    return _by_rank(placement, cluster, framework, model, tokens, hidden, fp8, generation_of,
                    fast=False)


def _userbuffers(placement, framework, model, tp_comm_overlap: bool, seq_length: int,
                 micro_batch_size: int) -> tuple[int, int]:
    """The tokens of a micro-batch on a CP rank and the model's width where TP overlap runs
    in Transformer Engine's userbuffers (:func:`reserved`'s ``ub_tokens`` and
    ``ub_hidden``), else (0, 0)."""
    if not (tp_comm_overlap and framework.tp_overlap == "userbuffers"
            and placement.degree("tp") > 1):
        return 0, 0
    return seq_length * micro_batch_size // placement.degree("cp"), model.hidden_size


def _by_rank(placement, cluster, framework, model, tokens: int, hidden: int, fp8: bool,
             generation_of, fast: bool) -> tuple[Reserved, ...]:
    tied = bool(model.tied_embeddings)
    n = placement.num_gpus
    world = None
    if "world" in framework.nccl_groups and n > 1:
        world = (_world(cluster, n) if fast
                 else _describe("world", range(n), cluster.host_of))
    hosts = _hosts(cluster, n) if fast else None
    described: dict = {}  # the stages share groups (model_parallel: one for all of them)
    out = []
    for s in range(placement.degree("pp")):
        g = placement.gpu(pp=s)
        comms = (_communicators_fast(placement, g, framework.nccl_groups, hosts, tied, world,
                                     described) if fast else None)
        out.append(reserved(placement, g, cluster, framework, tied,
                            generation_of(cluster.gpu_of(g).name), tokens, hidden, fp8, world,
                            comms))
    return tuple(out)


def _hosts(cluster, n: int) -> tuple[int, ...]:
    """Every GPU's server (:meth:`~topologies.cluster.Cluster.host_of`) of ranks ``0..n-1``,
    kept on the cluster."""
    key = ("reserved_hosts", n)
    hosts = cluster.memo.get(key)
    if hosts is None:
        hosts = cluster.memo[key] = tuple(cluster.host_of(g) for g in range(n))
    return hosts


def _world(cluster, n: int) -> Communicator:
    """The world communicator of ranks ``0..n-1`` (:func:`_describe`), kept on the cluster."""
    key = ("reserved_world", n)
    world = cluster.memo.get(key)
    if world is None:
        world = cluster.memo[key] = _describe_hosts("world", _hosts(cluster, n))
    return world


def _describe_hosts(group: str, hosts) -> Communicator:
    """:func:`_describe` from the group's GPUs' servers (one an element, in any order)."""
    counts = Counter(hosts)
    return Communicator(group, len(hosts), len(counts), max(counts.values()))


def _communicators_fast(placement, gpu: int, groups: tuple[str, ...], hosts: tuple[int, ...],
                        tied_embeddings: bool, world: Communicator | None,
                        described: dict | None = None) -> tuple[Communicator, ...]:
    """:func:`communicators` (the reference) with each group's GPUs by their strides and
    ``hosts`` (every GPU's server, by rank) read by position: the same groups in the same
    order, each with the same ranks, servers and most local ranks. ``described``: the
    groups already described for other GPUs of ``placement`` and ``hosts`` (by name and
    first GPU, which with the strides make its GPUs), filled in here: the pipeline stages
    of one replica share their model-parallel group (Megatron 1T: 64 stages, one group of
    512 GPUs described once, not 64 times, ~4 ms)."""
    c = placement.coords(gpu)
    deg, stride, step = dict(placement.sizes), {}, 1
    for dim, size in placement.sizes:  # innermost first (Placement.gpu's strides)
        stride[dim] = step
        step *= size

    def spread(*dims: str) -> list[int]:
        """The GPUs that differ from ``gpu`` only along ``dims``."""
        base = gpu - sum(c[d] * stride[d] for d in dims)
        gpus = [base]
        for d in dims:
            step = stride[d]
            gpus = [g + i * step for i in range(deg[d]) for g in gpus]
        return gpus

    def describe(group: str, *dims: str) -> Communicator:
        """The communicator of ``group``: the GPUs :func:`spread` along ``dims``."""
        if described is None:
            return _describe_hosts(group, [hosts[g] for g in spread(*dims)])
        key = (group, gpu - sum(c[d] * stride[d] for d in dims))  # (its first GPU)
        found = described.get(key)
        if found is None:
            found = described[key] = _describe_hosts(group, [hosts[g] for g in spread(*dims)])
        return found

    out = []
    for group in groups:
        if group not in NCCL_GROUPS:
            raise ValueError(f"nccl_groups: {group!r} is not one of {', '.join(NCCL_GROUPS)}")
        if group == "world":
            if placement.num_gpus < 2:
                continue
            out.append(world if world is not None
                       else _describe_hosts("world", hosts[:placement.num_gpus]))
            continue
        if group in ("tp", "cp", "pp"):
            if deg[group] < 2:
                continue
            out.append(describe(group, group))
        elif group == "dp":
            if deg["dp"] * deg["cp"] < 2:
                continue
            out.append(describe(group, "dp", "cp"))
        elif group == "model_parallel":
            if deg["tp"] * deg["pp"] < 2:
                continue
            out.append(describe(group, "tp", "pp"))
        else:  # embedding: the first and last stage's tied embeddings
            if not tied_embeddings or deg["pp"] < 2 or c["pp"] not in (0, deg["pp"] - 1):
                continue
            gpus = [gpu - c["pp"] * stride["pp"],
                    gpu + (deg["pp"] - 1 - c["pp"]) * stride["pp"]]
            out.append(_describe_hosts(group, [hosts[g] for g in gpus]))
    return tuple(out)


def floor_bytes(generation: str | None) -> float:
    """The least any run reserves on a GPU of ``generation``: a lazily loaded context and the
    cuBLAS workspaces (a bound for a family of layouts whose communicators are not known)."""
    return context_bytes("lazy") + cublas_bytes(generation)
