"""Pure generators of cluster graphs.

A cluster graph is a :class:`networkx.DiGraph`. Nodes carry ``kind`` (``gpu``,
``nvswitch``, ``nic``, ``switch``); GPU nodes also carry ``rank`` (global GPU
index) and ``host`` (server index). Every physical link appears as two directed
edges, each with its own ``bandwidth_Bps`` (per direction) and ``latency_s``
(per hop). Paths add the latency of every hop they cross.

Switch nodes carry ``tier`` (1 = leaf / top-of-rack / router, 2 = spine or
aggregation, 3 = core); :func:`multi_site` attaches a site's gateway to the
switches of its highest tier. NVSwitch nodes carry ``nvls`` (True when the
switch can reduce in the network, NVLink SHARP, Hopper and later).

Generators and the counts they produce (E = GPUs or NICs attached to the
fabric; links are undirected; the counting tests check every formula):

- ``switch``: 1 switch, E links; GPU-GPU 2 hops.
- ``ring``: E links (1 for E = 2); diameter floor(E/2).
- ``full_mesh``: E(E−1)/2 links; diameter 1.
- ``torus``: prod(k) GPUs of degree sum_d (2 if k_d > 2, 1 if k_d = 2, 0 if
  k_d = 1), diameter sum_d floor(k_d/2) (Dally & Towles, *Principles and
  Practices of Interconnection Networks*, 2004, ch. 5).
- ``fat-tree``, 2 tiers: L = ceil(E/d) leaves with d endpoint ports and
  u = d/o uplinks (o = oversubscription), u spines, E + L·u links, GPU-GPU
  diameter 4.
- ``fat-tree``, 3 tiers: pods of P leaves; u aggregation switches per pod,
  every leaf linked to each; u·P cores in u planes of P, aggregation switch j
  linked to every core of plane j; E + L·u + pods·u·P links, diameter 6. With
  d = P = k/2 and o = 1 this is Al-Fares et al.'s k-ary fat-tree (SIGCOMM
  2008): k pods, (k/2)^2 cores, k^3/4 hosts, every switch k ports.
- ``rail-optimized``: per scalable unit of h servers, rail r's leaf links NIC
  r of each server (NVIDIA DGX SuperPOD reference architecture); u = h/o
  spines linked to every leaf; diameter 6.
- ``dragonfly``: G groups of a routers with p endpoints each, all-to-all inside
  a group, one global link between every pair of groups, at most h per router
  (Kim, Dally, Scott & Abts, ISCA 2008, "absolute" arrangement); needs
  G − 1 <= a·h; GPU-GPU diameter 5.

Node names (how users name links, e.g. ``["host0/nic3", "fabric"]`` in a
``faults:`` section; :meth:`topologies.cluster.Cluster.resolve_link`):

- GPUs ``gpu{rank}`` (:func:`gpu_node`); servers' NVSwitch ``host{h}/nvswitch``
  (:func:`nvswitch_node`) and NICs ``host{h}/nic{i}`` (:func:`nic_node`), with their
  PCIe ports ``host{h}/pcie{i}`` where GPUs share NICs (:func:`pcie_node`);
- the one switch of ``switch`` ``switch``; a crossbar fabric ``fabric``;
- fat-trees ``leaf{i}``, ``spine{j}`` (2 tiers), ``pod{q}/agg{j}`` and
  ``core{j}.{c}`` (3 tiers); rail-optimized ``su{s}/rail{r}`` and ``spine{j}``;
  dragonfly ``group{q}/router{i}``;
- :func:`multi_site` keeps ``gpu{rank}`` (renumbered) and prefixes every other
  node with ``site{i}/``; its gateways are ``site{i}/gateway``.

A link is named by its two end nodes, ``[from, to]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from base.errors import TopologyError
from topologies.digraph import Graph, new_graph

if TYPE_CHECKING:
    import networkx as nx

FABRICS = ("crossbar", "fat-tree", "rail-optimized", "dragonfly")
"""Scale-out fabrics that :func:`attach_fabric` can build."""

SITE_ATTR = "site"
"""Node attribute :func:`multi_site` sets: the index of the node's site (absent: one site)."""


def gpu_node(rank: int) -> str:
    """Graph node name of GPU ``rank``."""
    return f"gpu{rank}"


def nvswitch_node(host: int) -> str:
    """Graph node name of server ``host``'s NVSwitch."""
    return f"host{host}/nvswitch"


def nic_node(host: int, local: int) -> str:
    """Graph node name of NIC ``local`` of server ``host`` (with one NIC per GPU, the NIC of
    local GPU ``local``)."""
    return f"host{host}/nic{local}"


def pcie_node(host: int, local: int) -> str:
    """Graph node name of local GPU ``local``'s PCIe port to its NIC, on servers whose GPUs
    share NICs (``nics_per_node`` of :func:`nvswitch_cluster`)."""
    return f"host{host}/pcie{local}"


def _check_link(u: str, v: str, bandwidth_Bps: float, latency_s: float) -> None:
    if not bandwidth_Bps > 0:
        raise TopologyError(f"link {u}-{v}: bandwidth {bandwidth_Bps} B/s must be > 0")
    if latency_s < 0:
        raise TopologyError(f"link {u}-{v}: latency {latency_s} s must be >= 0")


def _link(g: nx.DiGraph, u: str, v: str, bandwidth_Bps: float, latency_s: float) -> None:
    _check_link(u, v, bandwidth_Bps, latency_s)
    if isinstance(g, Graph):  # (both directions in one call: ~1/3 of a 1T graph's time)
        g.add_link(u, v, {"bandwidth_Bps": bandwidth_Bps, "latency_s": latency_s})
        return
    g.add_edge(u, v, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s)
    g.add_edge(v, u, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s)


def _add_gpus(g: nx.DiGraph, n: int, gpus_per_host: int) -> None:
    if isinstance(g, Graph):  # (the same nodes in one call)
        g.add_nodes([(gpu_node(r), {"kind": "gpu", "rank": r, "host": r // gpus_per_host})
                     for r in range(n)])
        return
    for r in range(n):
        g.add_node(gpu_node(r), kind="gpu", rank=r, host=r // gpus_per_host)


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    if value < minimum:
        raise TopologyError(f"{name} must be >= {minimum}, got {value}")


def switch(n: int, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """n GPUs on one non-blocking switch; a GPU-to-GPU path has 2 hops."""
    if n < 1:
        raise TopologyError(f"switch topology needs num_gpus >= 1, got {n}")
    g = new_graph(f"switch{n}")
    _add_gpus(g, n, gpus_per_host=1)
    g.add_node("switch", kind="switch", tier=1)
    for r in range(n):
        _link(g, gpu_node(r), "switch", bandwidth_Bps, latency_s)
    return g


def ring(n: int, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """n GPUs in a bidirectional ring: GPU i linked to GPU (i + 1) mod n."""
    if n < 2:
        raise TopologyError(f"ring topology needs num_gpus >= 2, got {n}")
    g = new_graph(f"ring{n}")
    _add_gpus(g, n, gpus_per_host=1)
    for r in range(n):
        nxt = (r + 1) % n
        if not g.has_edge(gpu_node(r), gpu_node(nxt)):
            _link(g, gpu_node(r), gpu_node(nxt), bandwidth_Bps, latency_s)
    return g


def full_mesh(n: int, bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """n GPUs, each pair joined by its own link (e.g. 8 MI300X on Infinity Fabric).

    Every GPU pair has a private link in each direction, so any plan in which no
    two concurrent transfers join the same ordered pair is contention-free.
    """
    _check_count("full-mesh num_gpus", n)
    g = new_graph(f"mesh{n}")
    _add_gpus(g, n, gpus_per_host=1)
    for a in range(n):
        for b in range(a + 1, n):
            _link(g, gpu_node(a), gpu_node(b), bandwidth_Bps, latency_s)
    return g


def torus(dims: Sequence[int], bandwidth_Bps: float, latency_s: float) -> nx.DiGraph:
    """A k_1 x k_2 x ... torus of GPUs (direct network, as TPU pods): wrap-around links per axis.

    GPU rank = mixed-radix coordinate, first axis fastest. Along an axis of size
    2 the two neighbours coincide (one link); an axis of size 1 adds no link.
    """
    dims = tuple(int(k) for k in dims)
    if not dims or any(k < 1 for k in dims):
        raise TopologyError(f"torus dims must be positive integers, got {list(dims)}")
    n = math.prod(dims)
    g = new_graph("torus" + "x".join(map(str, dims)))
    _add_gpus(g, n, gpus_per_host=1)
    for r in range(n):
        coord, rest = [], r
        for k in dims:
            coord.append(rest % k)
            rest //= k
        g.nodes[gpu_node(r)]["coord"] = tuple(coord)
        stride = 1
        for axis, k in enumerate(dims):
            if k > 1:
                nxt = r + (((coord[axis] + 1) % k) - coord[axis]) * stride
                if not g.has_edge(gpu_node(r), gpu_node(nxt)):
                    _link(g, gpu_node(r), gpu_node(nxt), bandwidth_Bps, latency_s)
            stride *= k
    return g


@dataclass(frozen=True)
class Fabric:
    """The scale-out network between GPUs (or their NICs): its kind and parameters.

    Every fabric link has the same ``bandwidth_Bps`` per direction and
    ``latency_s`` per hop (dragonfly global links may differ). Oversubscription
    is built from port counts, so it is exact: a leaf with d endpoint ports has
    d / oversubscription uplinks.
    """

    kind: str = "crossbar"
    """``crossbar`` (one non-blocking switch), ``fat-tree``, ``rail-optimized``, ``dragonfly``."""
    bandwidth_Bps: float | None = None
    """Per fabric link, per direction, bytes/s; None: the NIC rate of the servers."""
    latency_s: float | None = None
    """Per fabric hop, seconds; None: the servers' default fabric hop latency (0 without)."""
    tiers: int = 2
    """Fat-tree: 2 (leaf-spine) or 3 (leaf-aggregation-core)."""
    gpus_per_leaf: int = 32
    """Endpoint (GPU or NIC) ports per leaf; rail-optimized: servers per scalable unit."""
    oversubscription: float = 1.0
    """Leaf down ports : up ports, e.g. 2.0 for 2:1."""
    leaves_per_pod: int | None = None
    """3-tier fat-tree: leaves per pod (default: gpus_per_leaf, as in a k-ary fat-tree)."""
    routers_per_group: int = 4
    """Dragonfly a."""
    gpus_per_router: int = 2
    """Dragonfly p: endpoints per router."""
    global_links_per_router: int = 2
    """Dragonfly h."""
    global_bandwidth_Bps: float | None = None
    """Dragonfly global (inter-group) links; None: ``bandwidth_Bps``."""
    global_latency_s: float | None = None
    """Dragonfly global link latency; None: ``latency_s``."""

    def __post_init__(self) -> None:
        if self.kind not in FABRICS:
            raise TopologyError(f"fabric {self.kind!r} is not one of {', '.join(FABRICS)}")
        if self.tiers not in (2, 3):
            raise TopologyError(f"fat-tree tiers must be 2 or 3, got {self.tiers}")
        if not self.oversubscription >= 1:
            raise TopologyError(f"oversubscription must be >= 1, got {self.oversubscription}")
        for name in ("gpus_per_leaf", "routers_per_group", "gpus_per_router",
                     "global_links_per_router"):
            _check_count(name, getattr(self, name))
        if self.leaves_per_pod is not None:
            _check_count("leaves_per_pod", self.leaves_per_pod)

    def uplinks_per_leaf(self, down_ports: int) -> int:
        """d / oversubscription, which must be a whole number of ports."""
        u = down_ports / self.oversubscription
        if u < 1 or abs(u - round(u)) > 1e-9:
            raise TopologyError(
                f"oversubscription {self.oversubscription:g} with {down_ports} endpoint ports per "
                f"leaf gives {u:g} uplinks; it must be a whole number >= 1 "
                f"(choose gpus_per_leaf divisible by the ratio)")
        return round(u)


def _switch_node(g: nx.DiGraph, name: str, tier: int, **attrs: object) -> str:
    g.add_node(name, kind="switch", tier=tier, **attrs)
    return name


def _attach_crossbar(g: nx.DiGraph, endpoints: Sequence[str], f: Fabric) -> None:
    _switch_node(g, "fabric", 1)
    if isinstance(g, Graph) and endpoints:  # (one check, the links added at once)
        _check_link(endpoints[0], "fabric", f.bandwidth_Bps, f.latency_s)
        attr = {"bandwidth_Bps": f.bandwidth_Bps, "latency_s": f.latency_s}
        g.add_links([(ep, "fabric", attr) for ep in endpoints])
        return
    for ep in endpoints:
        _link(g, ep, "fabric", f.bandwidth_Bps, f.latency_s)


def _attach_fat_tree(g: nx.DiGraph, endpoints: Sequence[str], f: Fabric) -> None:
    d = min(f.gpus_per_leaf, len(endpoints))
    num_leaves = math.ceil(len(endpoints) / d)
    pod_leaves = f.leaves_per_pod or f.gpus_per_leaf
    leaves = [_switch_node(g, f"leaf{i}", 1, pod=i // pod_leaves) for i in range(num_leaves)]
    for e, ep in enumerate(endpoints):
        _link(g, ep, leaves[e // d], f.bandwidth_Bps, f.latency_s)
    if num_leaves == 1:
        return
    u = f.uplinks_per_leaf(d)
    if f.tiers == 2:
        spines = [_switch_node(g, f"spine{j}", 2) for j in range(u)]
        for leaf in leaves:
            for spine in spines:
                _link(g, leaf, spine, f.bandwidth_Bps, f.latency_s)
        return
    pods = math.ceil(num_leaves / pod_leaves)
    for q in range(pods):
        aggs = [_switch_node(g, f"pod{q}/agg{j}", 2, pod=q) for j in range(u)]
        for leaf in leaves[q * pod_leaves:(q + 1) * pod_leaves]:
            for agg in aggs:
                _link(g, leaf, agg, f.bandwidth_Bps, f.latency_s)
        if pods > 1:
            for j, agg in enumerate(aggs):
                for c in range(pod_leaves):
                    core = f"core{j}.{c}"
                    if core not in g:
                        _switch_node(g, core, 3)
                    _link(g, agg, core, f.bandwidth_Bps, f.latency_s)


def _attach_rail_optimized(g: nx.DiGraph, hosts: Sequence[Sequence[str]], f: Fabric) -> None:
    rails = len(hosts[0])
    h = min(f.gpus_per_leaf, len(hosts))
    units = math.ceil(len(hosts) / h)
    leaves = []
    for s in range(units):
        for r in range(rails):
            leaf = _switch_node(g, f"su{s}/rail{r}", 1, rail=r)
            leaves.append(leaf)
            for host in hosts[s * h:(s + 1) * h]:
                _link(g, host[r], leaf, f.bandwidth_Bps, f.latency_s)
    if len(leaves) == 1:
        return
    spines = [_switch_node(g, f"spine{j}", 2) for j in range(f.uplinks_per_leaf(h))]
    for leaf in leaves:
        for spine in spines:
            _link(g, leaf, spine, f.bandwidth_Bps, f.latency_s)


def _attach_dragonfly(g: nx.DiGraph, endpoints: Sequence[str], f: Fabric) -> None:
    a, p, h = f.routers_per_group, f.gpus_per_router, f.global_links_per_router
    groups = math.ceil(len(endpoints) / (a * p))
    if groups - 1 > a * h:
        raise TopologyError(
            f"dragonfly with {groups} groups needs groups - 1 <= routers_per_group * "
            f"global_links_per_router = {a}*{h} = {a * h}")
    routers = [[_switch_node(g, f"group{q}/router{i}", 1, group=q) for i in range(a)]
               for q in range(groups)]
    for e, ep in enumerate(endpoints):
        _link(g, ep, routers[e // (a * p)][(e // p) % a], f.bandwidth_Bps, f.latency_s)
    for q in range(groups):
        for i in range(a):
            for j in range(i + 1, a):
                _link(g, routers[q][i], routers[q][j], f.bandwidth_Bps, f.latency_s)
    gb = f.global_bandwidth_Bps or f.bandwidth_Bps
    gl = f.latency_s if f.global_latency_s is None else f.global_latency_s
    for q1 in range(groups):
        for q2 in range(q1 + 1, groups):
            r1 = ((q2 - q1 - 1) % groups) // h
            r2 = ((q1 - q2 - 1) % groups) // h
            _link(g, routers[q1][r1], routers[q2][r2], gb, gl)


def attach_fabric(g: nx.DiGraph, hosts: Sequence[Sequence[str]], fabric: Fabric) -> None:
    """Add ``fabric``'s switches to ``g`` and link the endpoints of ``hosts`` to it.

    ``hosts[h]`` lists server h's fabric endpoints (its NICs, or the GPU itself)
    by local index; rail-optimized fabrics put local index r on rail r.
    """
    if fabric.bandwidth_Bps is None or fabric.latency_s is None:
        raise TopologyError(f"{fabric.kind} fabric needs a link bandwidth and latency")
    flat = [ep for host in hosts for ep in host]
    if fabric.kind == "crossbar":
        _attach_crossbar(g, flat, fabric)
    elif fabric.kind == "fat-tree":
        _attach_fat_tree(g, flat, fabric)
    elif fabric.kind == "rail-optimized":
        _attach_rail_optimized(g, hosts, fabric)
    else:
        _attach_dragonfly(g, flat, fabric)


def gpu_fabric(n: int, fabric: Fabric) -> nx.DiGraph:
    """n GPUs attached directly to ``fabric`` (one GPU per host, no NVLink)."""
    _check_count(f"{fabric.kind} num_gpus", n)
    g = new_graph(f"{fabric.kind}{n}")
    _add_gpus(g, n, gpus_per_host=1)
    attach_fabric(g, [[gpu_node(r)] for r in range(n)], fabric)
    return g


def fat_tree(n: int, bandwidth_Bps: float, latency_s: float, *, gpus_per_leaf: int = 32,
             oversubscription: float = 1.0, tiers: int = 2,
             leaves_per_pod: int | None = None) -> nx.DiGraph:
    """n GPUs on a two- or three-tier fat-tree (folded Clos) with uniform links."""
    return gpu_fabric(n, Fabric("fat-tree", bandwidth_Bps, latency_s, tiers, gpus_per_leaf,
                                oversubscription, leaves_per_pod))


def dragonfly(n: int, bandwidth_Bps: float, latency_s: float, *, routers_per_group: int,
              gpus_per_router: int, global_links_per_router: int,
              global_bandwidth_Bps: float | None = None,
              global_latency_s: float | None = None) -> nx.DiGraph:
    """n GPUs on a dragonfly (Kim, Dally, Scott & Abts, ISCA 2008)."""
    return gpu_fabric(n, Fabric("dragonfly", bandwidth_Bps, latency_s,
                                routers_per_group=routers_per_group,
                                gpus_per_router=gpus_per_router,
                                global_links_per_router=global_links_per_router,
                                global_bandwidth_Bps=global_bandwidth_Bps,
                                global_latency_s=global_latency_s))


def nvswitch_cluster(
    num_gpus: int,
    gpus_per_node: int,
    nvlink_Bps: float,
    nvlink_latency_s: float,
    nic_Bps: float,
    nic_latency_s: float,
    fabric_latency_s: float,
    *,
    nvls: bool = False,
    fabric: Fabric | None = None,
    nics_per_node: int | None = None,
) -> nx.DiGraph:
    """DGX-style servers: GPUs on one NVSwitch per server, NICs, a scale-out fabric.

    Intra-server path: gpu -> nvswitch -> gpu (2 NVLink hops). Inter-server path:
    gpu -> nic -> fabric ... -> nic -> gpu (GPU-NIC hops are PCIe, modelled at the
    NIC rate). The default fabric is one ideal crossbar (full bisection bandwidth,
    as a non-blocking fat-tree) whose links run at the NIC rate with
    ``fabric_latency_s`` per hop; ``fabric`` replaces it (its unset bandwidth and
    latency take these defaults). An NVL72 rack is one such "server" of 72 GPUs:
    its 18 NVSwitch chips form one non-blocking NVLink domain, modelled as one
    NVSwitch node. ``nvls`` marks the NVSwitches as able to reduce in-network.
    """
    if num_gpus < 1:
        raise TopologyError(f"num_gpus must be >= 1, got {num_gpus}")
    _check_count("gpus_per_node", gpus_per_node)
    per_node = min(gpus_per_node, num_gpus)
    if num_gpus % per_node:
        raise TopologyError(
            f"num_gpus={num_gpus} is not a multiple of gpus_per_node={gpus_per_node}"
        )
    nics = per_node if nics_per_node is None else nics_per_node
    if not 1 <= nics <= per_node or per_node % nics:
        raise TopologyError(f"nics_per_node={nics} must divide the {per_node} GPUs per node")
    share = per_node // nics
    hosts = num_gpus // per_node
    g = new_graph(f"nvswitch{hosts}x{per_node}")
    _add_gpus(g, num_gpus, per_node)
    endpoints: list[list[str]] = []
    if isinstance(g, Graph):
        _servers_at_once(g, hosts, per_node, share, nvls, endpoints, nvlink_Bps,
                         nvlink_latency_s, nic_Bps, nic_latency_s)
    else:  # (the reference: a networkx graph, one call a node or link)
        for h in range(hosts):
            sw = nvswitch_node(h)
            g.add_node(sw, kind="nvswitch", host=h, nvls=nvls)
            endpoints.append([])
            for local in range(per_node):
                r = h * per_node + local
                _link(g, gpu_node(r), sw, nvlink_Bps, nvlink_latency_s)
                if hosts > 1:
                    nic = nic_node(h, local // share)
                    if local % share == 0:
                        g.add_node(nic, kind="nic", host=h)
                        endpoints[-1].append(nic)
                    if share == 1:
                        _link(g, gpu_node(r), nic, nic_Bps, nic_latency_s)
                    else:  # via the GPU's PCIe port, so no GPU-NIC-GPU path rivals NVLink
                        port = pcie_node(h, local)
                        g.add_node(port, kind="pcie", host=h)
                        _link(g, gpu_node(r), port, nic_Bps, nic_latency_s)
                        _link(g, port, nic, nic_Bps, 0.0)
    if hosts > 1:
        f = fabric or Fabric()
        attach_fabric(g, endpoints, replace(
            f, bandwidth_Bps=nic_Bps if f.bandwidth_Bps is None else f.bandwidth_Bps,
            latency_s=fabric_latency_s if f.latency_s is None else f.latency_s))
    return g


def _servers_at_once(g: Graph, hosts: int, per_node: int, share: int, nvls: bool,
                     endpoints: list[list[str]], nvlink_Bps: float, nvlink_latency_s: float,
                     nic_Bps: float, nic_latency_s: float) -> None:
    """:func:`nvswitch_cluster`'s servers on a :class:`~topologies.digraph.Graph`: the same
    nodes added in the same order, the same links checked as the first of each kind is and
    added in the same order, after the nodes (:meth:`~topologies.digraph.Graph.add_links`;
    every link's ends exist by then, so each node's and each adjacency dict's order is the
    one of :func:`nvswitch_cluster`'s loop on a networkx graph, the reference)."""
    _check_link(gpu_node(0), nvswitch_node(0), nvlink_Bps, nvlink_latency_s)
    nvlink = {"bandwidth_Bps": nvlink_Bps, "latency_s": nvlink_latency_s}
    if hosts > 1:
        _check_link(gpu_node(0), nic_node(0, 0) if share == 1 else pcie_node(0, 0), nic_Bps,
                    nic_latency_s)
        if share > 1:
            _check_link(pcie_node(0, 0), nic_node(0, 0), nic_Bps, 0.0)
    nic = {"bandwidth_Bps": nic_Bps, "latency_s": nic_latency_s}
    port = {"bandwidth_Bps": nic_Bps, "latency_s": 0.0}
    links: list[tuple[str, str, dict[str, object]]] = []
    add = links.append
    for h in range(hosts):
        sw = nvswitch_node(h)
        g.add_node(sw, kind="nvswitch", host=h, nvls=nvls)
        ends: list[str] = []
        endpoints.append(ends)
        for local in range(per_node):
            gpu = gpu_node(h * per_node + local)
            add((gpu, sw, nvlink))
            if hosts > 1:
                nic_name = nic_node(h, local // share)
                if local % share == 0:
                    g.add_node(nic_name, kind="nic", host=h)
                    ends.append(nic_name)
                if share == 1:
                    add((gpu, nic_name, nic))
                else:
                    pcie = pcie_node(h, local)
                    g.add_node(pcie, kind="pcie", host=h)
                    add((gpu, pcie, nic))
                    add((pcie, nic_name, port))
    g.add_links(links)


def multi_site(sites: Sequence[nx.DiGraph], wan_Bps: float, wan_latency_s: float) -> nx.DiGraph:
    """Join site graphs by wide-area links: geo-distributed training.

    Each site gets a gateway router linked to every switch of the site's highest
    tier (at the fastest link rate of the site, zero latency); gateways are
    joined pairwise by WAN links of ``wan_Bps`` per direction and
    ``wan_latency_s`` (e.g. 10 Gb/s = 1.25e9 B/s, 30 ms). GPU ranks and host
    indices are renumbered site after site; other nodes get a ``site{i}/`` prefix.
    """
    if len(sites) < 1:
        raise TopologyError("multi-site topology needs at least one site")
    g = new_graph("sites" + "+".join(str(s.graph.get("name", "")) for s in sites))
    rank_off = host_off = 0
    gateways = []
    for i, site in enumerate(sites):
        names: dict[str, str] = {}
        hosts = 0
        for v, d in site.nodes(data=True):
            attrs = dict(d, **{SITE_ATTR: i})
            if d.get("kind") == "gpu":
                names[v] = gpu_node(d["rank"] + rank_off)
                attrs["rank"] = d["rank"] + rank_off
            else:
                names[v] = f"site{i}/{v}"
            if "host" in d:
                attrs["host"] = d["host"] + host_off
                hosts = max(hosts, d["host"] + 1)
            g.add_node(names[v], **attrs)
        for u, v, d in site.edges(data=True):
            g.add_edge(names[u], names[v], **d)
        switches = [(d["tier"], v) for v, d in site.nodes(data=True)
                    if d.get("kind") == "switch"]
        if not switches:
            raise TopologyError(f"site {i} ({site.graph.get('name')}) has no switch to attach a "
                                "wide-area gateway to; use a switched topology per site")
        top = max(t for t, _ in switches)
        fastest = max(d["bandwidth_Bps"] for _, _, d in site.edges(data=True))
        gw = f"site{i}/gateway"
        g.add_node(gw, kind="switch", tier=top + 1, **{SITE_ATTR: i})
        for t, v in sorted(switches):
            if t == top:
                _link(g, names[v], gw, fastest, 0.0)
        gateways.append(gw)
        rank_off += sum(1 for _, d in site.nodes(data=True) if d.get("kind") == "gpu")
        host_off += hosts
    for a in range(len(gateways)):
        for b in range(a + 1, len(gateways)):
            _link(g, gateways[a], gateways[b], wan_Bps, wan_latency_s)
    return g


def ideal(n: int) -> nx.DiGraph:
    """Infinitely fast, latency-free switch (for schedule studies)."""
    return switch(n, math.inf, 0.0)
