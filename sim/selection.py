"""Choosing how a collective runs: an algorithm and an NCCL protocol per call, from each
candidate's plan on the actual links, and the plan the engine then runs. Pure (no SimPy).

:func:`group_profile` takes what selection needs to know about a group on a topology;
:func:`plan_cost` estimates an algorithm under a protocol as a function of the size, from
its plan (:func:`sim.collectives.plan`) on the actual routes, level by level (exact for the
closed forms, a lower bound otherwise); :func:`choose` takes the smallest estimate over the
candidates, as NCCL's tuner does (``ncclTopoTuneModel``); :func:`collective_plan` is the
plan the engine runs, with the chosen protocol's launch latency. Estimates of groups that
are the same group shifted onto twin servers are shared (:func:`_twin_costs`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from base.errors import ConfigError
from sim import nvls, transports, treepipe
from sim.channels import TopologyView, ring_channels, ring_order, tree_channels
from sim.collectives import (
    ALGORITHMS_BY_OP,
    AUTO,
    OPS,
    Transfer,
    check,
    plan,
)
from sim.protocols import (
    AUTO_PROTOCOL,
    PROTOCOL_ALGOS,
    PROTOCOLS,
    bandwidth_fraction,
    latency_scale,
    launch_scale,
    net_overhead_us,
)
from topologies.graphs import SITE_ATTR
from topologies.presets import HOST_CPU_ATTR, NVLS_EFFICIENCY_ATTR

if TYPE_CHECKING:

    from topologies.cluster import Cluster


@dataclass(frozen=True)
class GroupProfile:
    """What algorithm selection needs to know about a group on a topology."""

    n: int
    host_of: Mapping[int, int]
    """Rank -> server index."""
    per_host: int
    """Ranks per host, or 0 if hosts hold different numbers of ranks."""
    num_hosts: int
    alpha_s: float
    """Largest route latency between ring neighbours."""
    bandwidth_Bps: float
    """Smallest route bottleneck between ring neighbours."""
    alpha_intra_s: float
    bandwidth_intra_Bps: float
    alpha_inter_s: float
    bandwidth_inter_Bps: float
    nvswitch: str | None
    """The NVLS-capable NVSwitch every rank is attached to, if any."""
    nvls_alpha_s: float = 0.0
    """GPU-NVSwitch hop latency."""
    nvls_bandwidth_Bps: float = math.inf
    """Smallest GPU-NVSwitch link rate."""
    nvls_efficiency: float = 1.0
    """Fraction of ``nvls_bandwidth_Bps`` NVLS transfers reach (the NVSwitch's
    ``nvls_efficiency`` attribute, :data:`topologies.presets.NVLS_EFFICIENCY_ATTR`)."""
    ring_channels: int = 1
    """Rings a ring collective runs in parallel over this group (:func:`ring_channels`)."""
    server_nvswitches: tuple[str, ...] | None = None
    """Per server of a group spanning several, the NVLS-capable NVSwitch all its members are
    attached to; None unless every server has one (what NVLSTree needs)."""
    ranks: tuple[int, ...] = ()
    """The group, in the order given."""
    topo: Cluster | None = field(default=None, compare=False, repr=False)
    """The cluster the profile was taken on (what :func:`plan_cost` builds plans on)."""
    costs: dict[tuple[str, str, str], PlanCost] = field(
        default_factory=dict, compare=False, repr=False)
    """:func:`plan_cost` by (op, algorithm, protocol), filled as selection needs them."""
    num_sites: int = 1
    """Sites (joined by WAN links, :func:`topologies.graphs.multi_site`) the group spans."""


def _worst(topo: TopologyView, pairs: Sequence[tuple[int | str, int | str]]) -> tuple[float, float]:
    alpha, bw = 0.0, math.inf
    for a, b in pairs:
        route = topo.route(a, b)
        alpha = max(alpha, route.latency_s)  # type: ignore[attr-defined]
        bw = min(bw, topo.bottleneck_Bps(route))
    return alpha, bw


def group_profile(topo: TopologyView, ranks: Sequence[int]) -> GroupProfile:
    """Latencies and bandwidths of ``ranks`` on ``topo``, for :func:`select_algorithm`; ring
    neighbours in :func:`ring_order`."""
    n = len(ranks)
    host_of = {r: topo.host_of(r) for r in ranks}
    hosts: dict[int, list[int]] = {}
    for r in ranks:
        hosts.setdefault(host_of[r], []).append(r)
    sizes = {len(m) for m in hosts.values()}
    per_host = sizes.pop() if len(sizes) == 1 else 0
    ring = ring_order(topo, ranks)
    ring_pairs = [(ring[i], ring[(i + 1) % n]) for i in range(n)] if n > 1 else []
    alpha, bw = _worst(topo, ring_pairs)
    members = list(hosts.values())
    intra = [(m[i], m[(i + 1) % len(m)]) for m in members if len(m) > 1 for i in range(len(m))]
    inter = []
    if per_host and len(members) > 1:
        for j in range(per_host):
            col = [m[j] for m in members]
            inter += [(col[i], col[(i + 1) % len(col)]) for i in range(len(col))]
    a1, b1 = _worst(topo, intra)
    a2, b2 = _worst(topo, inter)
    switches = {topo.nvswitch_of(r) for r in ranks}
    sw = switches.pop() if len(switches) == 1 else None
    if sw is not None and not topo.nvls_capable(sw):
        sw = None
    na, nb = _worst(topo, [(r, sw) for r in ranks]) if sw is not None else (0.0, math.inf)
    eff = topo.node_attrs[sw].get(NVLS_EFFICIENCY_ATTR, 1.0) if sw is not None else 1.0
    channels = len(ring_channels(ranks, host_of))
    sites = len({topo.node_attrs[topo.node(r)].get(SITE_ATTR, 0) for r in ranks})
    server_sw = _server_nvswitches(topo, members) if channels > 1 else None
    if server_sw is not None:
        na, nb = _worst(topo, [(r, s) for m, s in zip(members, server_sw, strict=True)
                               for r in m])
        eff = topo.node_attrs[server_sw[0]].get(NVLS_EFFICIENCY_ATTR, 1.0)
    return GroupProfile(n, host_of, per_host, len(hosts), alpha, bw, a1, b1, a2, b2, sw, na, nb,
                        eff, channels, server_sw, tuple(ranks), topo,  # type: ignore[arg-type]
                        num_sites=sites)


def _server_nvswitches(topo: TopologyView, members: Sequence[Sequence[int]]
                       ) -> tuple[str, ...] | None:
    """Each server's NVLS-capable NVSwitch, if every server's members share one."""
    out = []
    for m in members:
        sws = {topo.nvswitch_of(r) for r in m}
        sw = sws.pop() if len(sws) == 1 else None
        if sw is None or not topo.nvls_capable(sw):
            return None
        out.append(sw)
    return tuple(out)


AUTO_EXCLUDED = ("halving_doubling",)
"""Never chosen by ``auto``: NCCL does not implement recursive halving-doubling (MPI
libraries do). It stays available as an explicit choice."""

WAN_ONLY = ("hierarchical",)
"""Chosen by ``auto`` only for a group that spans sites (:attr:`GroupProfile.num_sites`).
Inside one site the frameworks call NCCL, which has no hierarchical (Horovod's three
phases; intra-server first) all-reduce, reduce-scatter, all-gather or all-to-all: it
crosses servers with one ring channel per NIC (:func:`sim.channels.ring_channels`) and
runs all-to-all as pairwise sends. Hierarchical moves fewer bytes through the NICs when a
group has several ranks per server (a ring exports (n-1)/n of the data per server and
channel, hierarchical (m-1)/m with m servers), so taking it there made a run faster than
the NCCL it models (BLOOM-176B's ZeRO reduce-scatters and all-gathers, 8 ranks on 4
servers: sim validate 19.0% -> 20.6% MAPE, both optimistic). Across sites the training
code itself goes hierarchical (NCCL does not span a WAN), so ``auto`` takes it there
where its estimate wins. Explicit ``hierarchical`` runs it anywhere."""


def candidates(op: str, profile: GroupProfile) -> tuple[str, ...]:
    """The algorithms for ``op`` that ``auto`` may choose for this group."""
    out = []
    for algo in ALGORITHMS_BY_OP[op]:
        if algo in AUTO_EXCLUDED:
            continue
        if algo == "nvls" and profile.nvswitch is None:
            continue
        if algo == "nvls_tree" and profile.server_nvswitches is None:
            continue
        if algo == "hierarchical" and not (profile.num_hosts > 1 and profile.per_host > 1):
            continue
        if algo in WAN_ONLY and profile.num_sites < 2:
            continue
        out.append(algo)
    return tuple(out)


def protocol_choices(algo: str, protocol: str) -> tuple[str, ...]:
    """The protocols ``algo`` may run under the cluster's setting ``protocol`` (``auto``:
    every one it implements, :data:`sim.protocols.PROTOCOLS`)."""
    if algo not in PROTOCOL_ALGOS:
        return ("simple",)
    return PROTOCOLS if protocol == AUTO_PROTOCOL else (protocol,)


def _plan_on(cluster: Cluster, op: str, algo: str, group: Sequence[int], nbytes: float,
             nvswitch: str | None, nvls_efficiency: float, protocol: str,
             skew: tuple[float, bool] = (1.0, False),
             nvls_pipeline: bool = True) -> tuple[Transfer, ...]:
    """:func:`plan` of ``algo`` under ``protocol`` on ``cluster``: ring and tree in
    :func:`ring_order`, the actual routes' latencies scaled to the protocol (per route:
    inside a server or between servers; a ring over several servers' routes inside a server
    no shorter than the hosts' network overhead, :func:`ring_net_overhead_s`) and its
    bandwidth fraction as bytes on the wire.
    ``nvls_pipeline``: NVLS's chunk-pipeline fill and the Simple tree's
    (:func:`tree_pipeline`) in the bytes; False: neither (:func:`plan_cost`
    adds them at the size)."""
    host_of = ({r: cluster.host_of(r) for r in group}
               if algo in ("hierarchical", "ring", "tree", "nvls_tree") else None)
    nvswitch_of = nics = None
    if algo == "nvls_tree":
        nvswitch_of = {r: sw if sw is not None and cluster.nvls_capable(sw) else None
                       for r in group for sw in (cluster.nvswitch_of(r),)}
        nics = nics_per_host(cluster, cluster.host_of(group[0]))
    order = ring_order(cluster, group) if algo in ("ring", "tree") else group
    if algo == "tree" and op == "all_reduce" and protocol == "simple" and nvls_pipeline:
        nbytes += treepipe.fill_bytes(nbytes, *tree_pipeline(cluster, order, host_of))

    def latency(a: int | str, b: int | str) -> float:
        return cluster.route(a, b).latency_s

    fraction = 1.0
    if algo in PROTOCOL_ALGOS:
        multi = len({cluster.host_of(r) for r in group}) > 1
        fraction = bandwidth_fraction(algo, protocol, multi)
    inside, between = latency_scale(algo, protocol, False), latency_scale(algo, protocol, True)
    floor = ring_net_overhead_s(cluster, op, algo, group, protocol)
    if (inside, between) != (1.0, 1.0) or floor > 0.0:

        def latency(a: int | str, b: int | str) -> float:
            same = (isinstance(a, str) or isinstance(b, str)
                    or cluster.host_of(a) == cluster.host_of(b))
            if same:
                return max(cluster.route(a, b).latency_s * inside, floor)
            return cluster.route(a, b).latency_s * between

    return plan(op, algo, order, nbytes, host_of=host_of, nvswitch=nvswitch,
                nvls_efficiency=nvls_efficiency, granularity=cluster.collective_granularity,
                latency=latency, wire_fraction=fraction, skew=skew, nvls_pipeline=nvls_pipeline,
                nvswitch_of=nvswitch_of, nics=nics)


def ring_net_overhead_s(cluster: Cluster, op: str, algo: str, group: Sequence[int],
                        protocol: str) -> float:
    """The least latency of a step inside a server of ``algo`` over ``group``, in seconds:
    for a ring all-reduce, all-gather or reduce-scatter over several servers, NCCL's network
    overhead of the servers' host CPU under ``protocol`` (:func:`sim.protocols.net_overhead_us`;
    servers of different CPUs: NCCL's mixed-vendor default); 0 otherwise, and where a
    rank's GPU names no host CPU (explicit topologies, :data:`HOST_CPU_ATTR`)."""
    if algo != "ring" or op in ("broadcast", "reduce") or len(group) < 2:
        return 0.0
    if len({cluster.host_of(r) for r in group}) < 2:
        return 0.0
    cpus = {cluster.node_attrs[cluster.node(r)].get(HOST_CPU_ATTR) for r in group}
    if None in cpus:
        return 0.0
    return net_overhead_us(cpus.pop() if len(cpus) == 1 else None, protocol) * 1e-6


def tree_pipeline(cluster: Cluster, order: Sequence[int],
                  host_of: Mapping[int, int] | None) -> tuple[int, int]:
    """(NCCL's tree depth, bytes of one loop: a chunk on every tree of
    :func:`tree_channels`) of a tree all-reduce under Simple over ``order``: the chunk is a
    step of the ``NCCL_BUFFSIZE`` the servers' transport fixes (:mod:`sim.transports`), else
    of NCCL's default buffer (InfiniBand, RoCE, NVLink; :func:`sim.treepipe.buffsize`)."""
    hosts = {cluster.host_of(r) for r in order}
    name = transports.transport_of(cluster, hosts)
    trees = sum(len(c) for c in tree_channels(order, host_of))
    buff = treepipe.buffsize() if name is None else transports.buffsize(name)
    return (treepipe.depth(len(order) // len(hosts), len(hosts)),
            trees * treepipe.chunk_bytes(buff))


def nics_per_host(cluster: Cluster, host: int) -> int | None:
    """NICs of server ``host`` (NVLSTree's heads, :func:`sim.nvls.heads`), None if it has
    none in the graph."""
    return len(cluster.nics_of(host)) or None


Line = tuple[float, float]
"""(seconds, seconds per byte): a lower bound a + S·b on a level's time for S bytes."""


@dataclass(frozen=True)
class PlanCost:
    """An algorithm's estimated time under a protocol: launch + Σ over levels of the largest
    of the level's lines at S bytes (:func:`plan_cost`)."""

    launch_s: float
    levels: tuple[tuple[Line, ...], ...]
    pipeline: tuple[str, int, int, int | None] | None = None
    """(algorithm, GPUs per server, servers, NICs per server) of an NVLS chunk pipeline, or
    ("tree", depth, loop bytes, None) of a tree's (:func:`tree_pipeline`), whose fill the
    lines leave out as it is not linear in the size: they are read at the size plus the fill
    (:func:`sim.nvls.fill_bytes`, :func:`sim.treepipe.fill_bytes`), the bytes every flow of
    the plan carries on top."""

    def time_s(self, nbytes: float) -> float:
        """The estimate for ``nbytes``."""
        if self.pipeline is not None:
            algo, members, servers, nics = self.pipeline
            nbytes += (treepipe.fill_bytes(nbytes, members, servers) if algo == "tree"
                       else nvls.fill_bytes(algo, nbytes, members, servers, nics))
        return self.launch_s + sum(max(a + nbytes * b for a, b in lines)
                                   for lines in self.levels)


def _envelope(lines: Sequence[Line]) -> tuple[Line, ...]:
    """The lines of ``lines`` that are the largest somewhere on S >= 0 (upper envelope)."""
    hull: list[Line] = []
    for a, b in sorted(set(lines), key=lambda x: (x[1], x[0])):
        if hull and hull[-1][1] == b:
            hull.pop()  # same slope, smaller intercept
        while len(hull) >= 2:
            (a1, b1), (a2, b2) = hull[-2], hull[-1]
            if (a1 - a) * (b2 - b1) <= (a1 - a2) * (b - b1):
                hull.pop()  # the middle line is never the largest
            else:
                break
        hull.append((a, b))
    while len(hull) >= 2 and hull[0][0] <= hull[1][0]:
        hull.pop(0)  # below a steeper line from S = 0 on
    return tuple(hull)


def _level_lines(flows: Sequence[tuple[float, tuple[int, ...], float]],
                 cap: Sequence[float]) -> tuple[Line, ...]:
    """Lower bounds on when flows ``(start, links, bytes per byte of S)`` that run together
    end: the latest start, and per link, for each flow, its start plus the bytes of the
    flows starting no earlier over the link's bandwidth (the link must carry them after)."""
    lines: list[Line] = [(max(start for start, _, _ in flows), 0.0)]
    on_link: dict[int, list[tuple[float, float]]] = {}
    for start, links, nbytes in flows:
        for x in links:
            if cap[x] < math.inf:
                on_link.setdefault(x, []).append((start, nbytes))
    for x, users in on_link.items():
        users.sort(key=lambda u: -u[0])
        total = 0.0
        for start, nbytes in users:
            total += nbytes
            lines.append((start, total / cap[x]))
    return _envelope(lines)


def plan_cost(op: str, algo: str, protocol: str, profile: GroupProfile) -> PlanCost:
    """The estimated time of ``algo`` under ``protocol`` on the profile's cluster, a function
    of the size (:class:`PlanCost`), from its plan on the actual links.

    The plan's transfers are cut into levels by their dependencies (a transfer waiting
    for others is one level past the deepest of them: the phases of hierarchical, the
    steps of step granularity); the levels add up. A level ends no earlier than its
    latest start (:func:`step_latency_s`), nor, on each link, than any of its transfers'
    start plus the bytes of those starting no later over the link's bandwidth (the
    bottleneck links of the transfers that run together). Exact for the closed forms (a
    ring, or a level's equal transfers starting together), a lower bound otherwise.
    """
    key = (op, algo, protocol)
    got = profile.costs.get(key)
    if got is not None:
        return got
    cluster = profile.topo
    if cluster is None:
        raise ConfigError("plan_cost needs a group profile taken on a cluster")
    twins = _twin_costs(cluster, profile.ranks)
    if twins is not None and key in twins:
        got = profile.costs[key] = twins[key]
        return got
    transfers = _plan_on(cluster, op, algo, profile.ranks, 1.0, profile.nvswitch,
                         profile.nvls_efficiency, protocol, nvls_pipeline=False)
    levels: list[int] = []
    flows: dict[int, list[tuple[float, tuple[int, ...], float]]] = {}
    for t in transfers:
        level = 1 + max(levels[d] for d in t.deps) if t.deps else 0
        levels.append(level)
        flows.setdefault(level, []).append((step_latency_s(cluster, t),
                                            cluster.route(t.src, t.dst).links, t.nbytes))
    pipeline = None
    if op == "all_reduce" and algo in ("nvls", "nvls_tree"):
        members = profile.n if algo == "nvls" else profile.per_host
        nics = (None if algo == "nvls"
                else nics_per_host(cluster, cluster.host_of(profile.ranks[0])))
        pipeline = (algo, members, profile.num_hosts, nics)
    if op == "all_reduce" and algo == "tree" and protocol == "simple":
        host_of = {r: cluster.host_of(r) for r in profile.ranks}
        pipeline = ("tree", *tree_pipeline(cluster, ring_order(cluster, profile.ranks),
                                           host_of), None)
    got = profile.costs[key] = PlanCost(
        cluster.collective_launch_s * launch_scale(algo, protocol),
        tuple(_level_lines(flows[k], cluster.link_bandwidth_Bps) for k in sorted(flows)),
        pipeline)
    if twins is not None and all(cluster.route_is_unique(t.src, t.dst) for t in transfers):
        twins[key] = got
    return got


def _twin_costs(cluster: Cluster, ranks: tuple[int, ...]) -> dict | None:
    """The plan costs shared by the groups that are ``ranks`` shifted by whole servers onto
    twin servers (:meth:`~topologies.cluster.Cluster.host_classes`), or None where servers
    cannot be swapped.

    Shifting a group by whole servers whose servers are pairwise twins is an automorphism
    of the graph (the argument of :meth:`sim.commtime.CollectiveTimer._translate`); a plan
    whose every route is the only shortest path between its ends maps onto the shifted
    group's plan, route onto route, with the same latencies, bandwidths and shared links,
    so the estimate is the same float. :func:`plan_cost` stores an estimate here only when
    every route of its plan is unique, and the key holds the group's shape (ranks relative
    to its first server) and its servers' twin classes.
    """
    classes = cluster.host_classes()
    if classes is None or not ranks:
        return None
    gpn = cluster.gpus_per_node
    base = min(ranks) // gpn * gpn
    shape = tuple(r - base for r in ranks)
    servers = sorted({r // gpn for r in ranks})
    key = ("plan costs", shape, tuple(classes[h] for h in servers))
    shared = cluster.memo.get(key)
    if shared is None:
        shared = cluster.memo[key] = {}
    return shared  # type: ignore[return-value]


def choose(op: str, algo: str, nbytes: float, profile: GroupProfile) -> tuple[str, str, float]:
    """(algorithm, protocol, estimated seconds) with the smallest :func:`plan_cost` estimate:
    over :func:`candidates` for ``auto``, else ``algo``'s own protocols.

    NCCL's tuner does the same (``ncclTopoTuneModel`` predicts latency + size /
    bandwidth per algorithm and protocol and takes the fastest), which gives LL and tree
    for small messages, ring (or NVLS) with Simple for large ones. Ties go to the
    earlier algorithm of :data:`ALGORITHMS_BY_OP` and the earlier protocol of
    :data:`sim.protocols.PROTOCOLS`, so an ideal (zero-cost) network gets ring, Simple.
    """
    protocol = getattr(profile.topo, "collective_protocol", AUTO_PROTOCOL)
    if algo == AUTO:
        options = candidates(op, profile)
        if profile.n <= 2:
            options = options[:1]
        tuned = _tuner_choice(op, nbytes, profile)
        if tuned in options:
            options = (tuned,)
    else:
        options = (algo,)
    best: tuple[str, str, float] | None = None
    for a in options:
        for proto in protocol_choices(a, protocol):
            t = plan_cost(op, a, proto, profile).time_s(nbytes)
            if best is None or t < best[2]:
                best = (a, proto, t)
    assert best is not None
    return best


def _tuner_choice(op: str, nbytes: float, profile: GroupProfile) -> str | None:
    """The algorithm the tuner plugin of the group's transport takes, if one of its rules
    matches (:func:`sim.transports.tuner_algorithm`): NCCL then skips its cost model."""
    if profile.topo is None or not profile.per_host:
        return None
    name = transports.transport_of(profile.topo, set(profile.host_of.values()))
    if name is None:
        return None
    return transports.tuner_algorithm(name, op, profile.num_hosts, profile.per_host, nbytes)


def estimate(op: str, algo: str, nbytes: float, profile: GroupProfile) -> float:
    """Estimated time of ``algo`` (launch included) under its best protocol (:func:`choose`)."""
    return choose(op, algo, nbytes, profile)[2]


def select_algorithm(op: str, nbytes: float, profile: GroupProfile) -> str:
    """NCCL-like default: the applicable algorithm with the smallest estimate (:func:`choose`)."""
    if op not in OPS:
        raise ConfigError(f"collective op {op!r} is not one of {', '.join(OPS)}")
    options = candidates(op, profile)
    if len(options) == 1:
        return options[0]
    return choose(op, AUTO, nbytes, profile)[0]


def resolve_algorithm(op: str, algo: str, nbytes: float,
                      profile: GroupProfile | None = None) -> str:
    """``algo`` itself, validated, or for ``auto`` the :func:`select_algorithm` choice."""
    if algo == AUTO:
        if profile is None:
            raise ConfigError("collective algorithm 'auto' needs a group profile")
        return select_algorithm(op, nbytes, profile)
    check(op, algo)
    return algo


@dataclass(frozen=True)
class CollectivePlan:
    """A collective as the engine runs it: after ``launch_s``, its transfers."""

    transfers: tuple[Transfer, ...]
    launch_s: float
    """Per-collective latency: the cluster's (Simple's) scaled to the protocol."""
    algo: str
    protocol: str


def collective_plan(cluster: Cluster, op: str, algo: str, group: tuple[int, ...],
                    nbytes: float, profiles: dict[tuple[int, ...], GroupProfile] | None = None,
                    skew: tuple[float, bool] = (1.0, False)) -> CollectivePlan:
    """Collective ``op`` over ``group`` as the engine runs it: the choice of algorithm and
    protocol, made here so that the engine only runs plans.

    The cluster's per-op override wins over ``algo``; ``auto`` picks the algorithm, and
    the cluster's ``collective_protocol`` (``auto``: per size) the protocol, from the
    group's profile (:func:`choose`); transfers carry the actual route latencies
    (:func:`plan`). ``profiles``: a cache of group profiles on ``cluster``, by group
    (filled here). ``skew``: a pairwise all-to-all's unequal volumes (:func:`plan`).
    """
    algo = cluster.collective_algos.get(op, algo)
    live = len(group) > 1 and nbytes > 0
    profile = None
    if algo in (AUTO, "nvls", "nvls_tree") or (
            live and len(protocol_choices(algo, cluster.collective_protocol)) > 1):
        profile = profiles.get(group) if profiles is not None else None
        if profile is None:
            profile = group_profile(cluster, group)
            if profiles is not None:
                profiles[group] = profile
    algo = resolve_algorithm(op, algo, nbytes, profile)
    protocols = protocol_choices(algo, cluster.collective_protocol)
    protocol = protocols[0]
    if live and len(protocols) > 1:
        assert profile is not None
        protocol = choose(op, algo, nbytes, profile)[1]
    transfers = _plan_on(cluster, op, algo, group, nbytes,
                         profile.nvswitch if profile else None,
                         profile.nvls_efficiency if profile else 1.0, protocol, skew)
    return CollectivePlan(transfers, cluster.collective_launch_s * launch_scale(algo, protocol),
                          algo, protocol)


def step_latency_s(cluster: Cluster, step: Transfer) -> float:
    """Delay before ``step``'s flow starts: the plan's latency (else ``steps`` x the route's)
    plus ``steps`` x the cluster's per-step software latency."""
    hops = (step.steps * cluster.route(step.src, step.dst).latency_s if step.latency_s is None
            else step.latency_s)
    return hops + step.steps * cluster.collective_step_s
