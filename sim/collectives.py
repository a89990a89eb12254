"""Collectives decomposed into DAGs of point-to-point transfers. Pure (no SimPy).

A plan is a tuple of :class:`Transfer`; each transfer may start once the
transfers it depends on have arrived. The engine runs each transfer as a flow
on the real topology (its route's latency, charged once per algorithm step the
transfer stands for, then its bytes shared max-min fairly with every other
flow), so contention and placement matter.

Operations (nccl-tests conventions: ``nbytes`` = S is the whole buffer: the
all-reduce input, the reduce-scatter input, the all-gather output, each rank's
all-to-all send buffer, the broadcast/reduce buffer, the message of a send):

============== ==================================================================
op             algorithms
============== ==================================================================
all_reduce     ring, tree, halving_doubling, hierarchical, nvls, nvls_tree
reduce_scatter ring, halving_doubling, hierarchical, nvls
all_gather     ring, halving_doubling, hierarchical, nvls
all_to_all     pairwise, hierarchical (intra-server first)
broadcast      ring (pipelined chain from ``ranks[0]``), nvls
reduce         ring (pipelined chain to ``ranks[0]``), nvls
send           p2p (``ranks = (src, dst)``)
============== ==================================================================

Closed forms on a contention-free topology (α = latency of one transfer's
route, B = its bandwidth, S = buffer bytes; REFERENCES.md "Collectives";
Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009), returned by
:func:`alpha_beta_time` and checked exactly against the flow-level engine:

- ring all-reduce 2(n−1)α + 2(n−1)/n·S/B; reduce-scatter, all-gather (n−1)α + (n−1)/n·S/B;
- halving-doubling all-reduce (n = 2^k) 2·log2(n)·α + 2(n−1)/n·S/B;
- hierarchical (n1 per node at α1, B1; n2 nodes at α2, B2 per GPU) all-reduce
  2(n1−1)α1 + 2(n2−1)α2 + 2(n1−1)/n1·S/B1 + 2(n2−1)/n2·S/(n1·B2);
- pairwise all-to-all α + (n−1)/n·S/B (every pair's S/n at once, each port
  shared by its n−1 flows); hierarchical all-to-all (n1 per server, n2 servers)
  α1 + (n1−1)/n1·S/B1 + α2 + (n2−1)/n2·S/B2;
- broadcast / reduce, pipelined chain (n−1)α + S/B; send α + S/B;
- NVLS all-reduce 2α_h + (S + F)/B (α_h = GPU-NVSwitch hop, so 2α_h is one GPU-to-GPU
  step: REFERENCES' α + S/B; F = NCCL's chunk pipeline filling, (stages − 1) loops of
  channels × heads × chunk bytes, :func:`sim.nvls.fill_bytes`);
- NVLSTree all-reduce (k GPUs on each of m servers' NVSwitches, α_h and B their hop and
  NVLS rate, α2 and B2 between servers) max(4α_h + 2Hα2 + S'/B, 2α_h + 2Hα2 +
  L·S'/(2h·B2)) with h = min(NICs, k, 32) heads a server (one per NIC, NCCL's
  ``ncclTopoSearchRecNet``), (H, L) of the servers' double binary tree and S' = S + F its
  chunk pipeline's fill;
- double binary tree 2·H·α + L·(S/2)/B with H the trees' height and L the most
  flows any GPU's port carries (exact when one of the two terms vanishes; the
  two trees share links, so it is never contention-free).

Pipelining. NCCL streams data through its rings and trees in small chunks, so
each link is busy for the whole collective and latency is paid once per step.
Plans model the limit of many chunks ("stream" granularity): a pipelined
phase is one flow per link carrying all its bytes, delayed by the latency of
the hops its data crosses before that link (``Transfer.latency_s``, summed
from the actual routes when ``plan`` gets a latency function, as the engine
passes; else ``steps`` times the transfer's own route latency). A ring
reduce-scatter is then n flows of (n−1)/n·S bytes, each delayed by the
latencies of the n−1 ring edges ending with it ((n−1)α on a uniform ring); a
tree is one flow per tree edge and direction, the reduction towards the root
and the broadcast away from it running concurrently, every one starting when
the pipeline is full (2Hα: the first byte up to the root and down to the
deepest rank, :func:`_stream_tree`); NVLS is n flows up to the NVSwitch and n
down from it (α_h, 2α_h). :mod:`sim.selection` adds the Simple tree's chunk-pipeline fill
to the buffer (:mod:`sim.treepipe`: a step of the buffer a transport fixes, else of NCCL's
default 4 MiB); the closed forms here are the streamed limit.
Under contention a streamed flow is shared max-min over its whole lifetime
(NCCL's flow control would instead throttle a ring to its slowest link).
``granularity="step"`` instead expands ring phases into one transfer per step,
each waiting for the previous step's chunk to arrive (a DAG of n·steps
transfers): identical times on uniform contention-free rings, contention
resolved step by step, and n·steps times more events.

Algorithms outside their range: halving-doubling all-reduce on n ≠ 2^k folds
the r = n − 2^⌊log2 n⌋ excess ranks first (rank 2i sends its buffer to 2i+1
for i < r, which runs the 2^k algorithm and sends the result back: + 2(α +
S/B); Thakur et al. 2005, sec. 4); halving-doubling reduce-scatter and
all-gather need n = 2^k and raise ConfigError otherwise. Hierarchical needs
the same number of ranks on every host. NVLS needs every rank on one
NVSwitch that reduces in-network.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from base.errors import ConfigError
from sim import nvls
from sim.channels import TopologyView as TopologyView  # re-exported: sim.channels is its home
from sim.channels import (
    Tree,
    dtree,
    host_blocks,
    ring_channels,
    tree_channels,
    tree_heights,
    tree_shape,
)
from sim.channels import btree as btree  # re-exported
from sim.channels import ring_order as ring_order  # re-exported
from sim.protocols import (
    PROTOCOL_ALGOS,
    bandwidth_fraction,
    latency_scale,
)

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "send")
ALGORITHMS_BY_OP: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "halving_doubling", "hierarchical", "nvls", "nvls_tree"),
    "reduce_scatter": ("ring", "halving_doubling", "hierarchical", "nvls"),
    "all_gather": ("ring", "halving_doubling", "hierarchical", "nvls"),
    "all_to_all": ("pairwise", "hierarchical"),
    "broadcast": ("ring", "nvls"),
    "reduce": ("ring", "nvls"),
    "send": ("p2p",),
}
"""Algorithms implemented per op; the first is the fallback of :func:`select_algorithm`."""
ALGORITHMS = ("ring", "tree", "halving_doubling", "hierarchical", "pairwise", "nvls", "p2p",
              "nvls_tree")
AUTO = "auto"
GRANULARITIES = ("stream", "step")

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
}
"""nccl-tests bus-bandwidth factor: busbw = algbw × factor(n) (nccl-tests doc/PERFORMANCE.md)."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One point-to-point message inside a collective.

    An endpoint is a GPU rank (int) or, for in-network reduction (NVLS), the
    name of the NVSwitch graph node (str) that reduces or multicasts.
    """

    src: int | str
    """Sending GPU rank, or switch node name."""
    dst: int | str
    """Receiving GPU rank, or switch node name."""
    nbytes: float
    deps: tuple[int, ...]
    """Indices (in the plan) of transfers that must have arrived before this one starts."""
    steps: int = 1
    """Algorithm steps this transfer stands for: the engine charges the cluster's per-step
    latency this many times, and its route latency this many times unless ``latency_s``."""
    latency_s: float | None = None
    """Latency before the first byte arrives, when the plan knew it: the sum of the route
    latencies along the pipeline that feeds this transfer (``plan(latency=...)``)."""


def check(op: str, algo: str) -> None:
    """ConfigError unless ``algo`` implements ``op``."""
    if op not in OPS:
        raise ConfigError(f"collective op {op!r} is not one of {', '.join(OPS)}")
    if algo not in ALGORITHMS_BY_OP[op]:
        raise ConfigError(f"collective algorithm {algo!r} does not implement {op}; choose one of "
                          f"{', '.join(ALGORITHMS_BY_OP[op])} or {AUTO}")


LatencyFn = Callable[[int | str, int | str], float]
"""Route latency in seconds between two endpoints (e.g. ``lambda a, b: cluster.route(a, b)
.latency_s``)."""


class _Plan:
    """Append-only transfer list, with the optional route-latency function."""

    def __init__(self, latency: LatencyFn | None, wire_fraction: float = 1.0) -> None:
        self.transfers: list[Transfer] = []
        self.latency = latency
        self.wire_fraction = wire_fraction

    def add(self, src: int | str, dst: int | str, nbytes: float, deps: Sequence[int] = (),
            steps: int = 1, latency_s: float | None = None) -> int:
        wire = nbytes if self.wire_fraction == 1.0 else nbytes / self.wire_fraction
        self.transfers.append(Transfer(src, dst, wire, tuple(deps), steps, latency_s))
        return len(self.transfers) - 1

    def lat(self, src: int | str, dst: int | str) -> float:
        return self.latency(src, dst) if self.latency else 0.0


def _ring(p: _Plan, ranks: Sequence[int], chunk_bytes: float, steps: int, stream: bool,
          start: Mapping[int, tuple[int, ...]] | None = None) -> dict[int, tuple[int, ...]]:
    """``steps`` rounds in which every rank sends one chunk to its ring successor.

    Step granularity: round k's send from position i waits for round k−1's
    chunk arriving at position i, as in NCCL's ring pipeline. Stream
    granularity: one transfer per ring edge of ``steps`` chunks. Round 0 from
    position i waits for ``start[i]``. Returns, per rank, the transfers whose
    arrival completes the phase there.
    """
    n = len(ranks)
    start = start or {}
    if n <= 1 or steps == 0:
        return {r: start.get(r, ()) for r in ranks}
    if stream:
        lats = _ring_latencies(p, ranks, steps)
        ids = [p.add(ranks[i], ranks[(i + 1) % n], chunk_bytes * steps, start.get(ranks[i], ()),
                     steps, lats[i]) for i in range(n)]
        return {ranks[(i + 1) % n]: (ids[i],) for i in range(n)}
    prev: list[int] = []
    for k in range(steps):
        cur = []
        for i in range(n):
            deps = start.get(ranks[i], ()) if k == 0 else (prev[(i - 1) % n],)
            cur.append(p.add(ranks[i], ranks[(i + 1) % n], chunk_bytes, deps,
                             latency_s=p.lat(ranks[i], ranks[(i + 1) % n]) if p.latency
                             else None))
        prev = cur
    return {ranks[(i + 1) % n]: (prev[i],) for i in range(n)}


def _ring_latencies(p: _Plan, ranks: Sequence[int], steps: int) -> list[float | None]:
    """Per ring edge i, the latency of the ``steps`` consecutive edges ending with it: the
    chain a chunk crosses before the edge's last chunk leaves (None without a latency fn)."""
    n = len(ranks)
    if p.latency is None:
        return [None] * n
    edge = [p.lat(ranks[i], ranks[(i + 1) % n]) for i in range(n)]
    full, rem = divmod(steps, n)
    base = full * sum(edge)
    prefix = [0.0]
    for x in edge + edge:
        prefix.append(prefix[-1] + x)
    return [base + prefix[i + n + 1] - prefix[i + n + 1 - rem] for i in range(n)]


def _halving_doubling(p: _Plan, op: str, ranks: Sequence[int], nbytes: float) -> None:
    """Recursive halving (reduce-scatter) and/or doubling (all-gather), Rabenseifner's algorithm.

    Step s of the halving exchanges S/2^(s+1) with the partner at distance
    2^k/2^(s+1); the doubling retraces the distances in reverse.
    """
    n = len(ranks)
    k = n.bit_length() - 1
    pw = 1 << k
    if pw != n and op != "all_reduce":
        raise ConfigError(f"halving_doubling {op} needs a power-of-two group, got {n} ranks "
                          f"{tuple(ranks)}; use ring")
    excess = n - pw
    arrived: dict[int, tuple[int, ...]] = {}
    for i in range(excess):
        arrived[ranks[2 * i + 1]] = (p.add(ranks[2 * i], ranks[2 * i + 1], nbytes),)
    active = [ranks[2 * i + 1] for i in range(excess)] + list(ranks[2 * excess:])
    dists = [pw >> (s + 1) for s in range(k)]
    if op in ("all_reduce", "reduce_scatter"):
        for s, dist in enumerate(dists):
            arrived = _exchange(p, active, dist, nbytes / 2 ** (s + 1), arrived)
    if op in ("all_reduce", "all_gather"):
        for s, dist in reversed(list(enumerate(dists))):
            arrived = _exchange(p, active, dist, nbytes / 2 ** (s + 1), arrived)
    for i in range(excess):
        p.add(ranks[2 * i + 1], ranks[2 * i], nbytes, arrived.get(ranks[2 * i + 1], ()))


def _exchange(p: _Plan, active: Sequence[int], dist: int, nbytes: float,
              arrived: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """One exchange round: each active rank sends ``nbytes`` to its partner at ``dist``.

    A send waits until both sides finished the previous round (MPI_Sendrecv's
    rendezvous), so a folded rank's partner does not send into a busy link.
    """
    out = {}
    for j, r in enumerate(active):
        partner = active[j ^ dist]
        deps = arrived.get(r, ()) + arrived.get(partner, ())
        out[partner] = (p.add(r, partner, nbytes, deps),)
    return out


def _hosts(ranks: Sequence[int], host_of: Mapping[int, int] | None) -> list[list[int]]:
    """Group members by host, hosts in order of first appearance, members in group order."""
    if host_of is None:
        raise ConfigError("hierarchical collectives need to know each rank's host (host_of)")
    groups: dict[int, list[int]] = {}
    for r in ranks:
        groups.setdefault(host_of[r], []).append(r)
    hosts = list(groups.values())
    if len({len(h) for h in hosts}) > 1:
        counts = {h: len(m) for h, m in groups.items()}
        raise ConfigError(f"hierarchical collective needs the same number of ranks on every host; "
                          f"group {tuple(ranks)} has ranks per host {counts}")
    return hosts


def _hierarchical(p: _Plan, op: str, ranks: Sequence[int], nbytes: float,
                  host_of: Mapping[int, int] | None, stream: bool) -> None:
    """Intra-node reduce-scatter, inter-node collective per local rank, intra-node all-gather."""
    hosts = _hosts(ranks, host_of)
    n1, n2 = len(hosts[0]), len(hosts)
    intra_chunk, inter_chunk = nbytes / n1, nbytes / (n1 * n2)
    done: dict[int, tuple[int, ...]] = {}
    if op in ("all_reduce", "reduce_scatter"):
        for members in hosts:
            done.update(_ring(p, members, intra_chunk, n1 - 1, stream))
    inter_steps = {"all_reduce": 2 * (n2 - 1)}.get(op, n2 - 1)
    for j in range(n1):
        done.update(_ring(p, [h[j] for h in hosts], inter_chunk, inter_steps, stream, done))
    if op in ("all_reduce", "all_gather"):
        for members in hosts:
            done.update(_ring(p, members, intra_chunk, n1 - 1, stream, done))


ROUTING_SEED = 20
"""Seed of :func:`routing_loads`' draws (fixed: the same loads in every run)."""


@functools.lru_cache(maxsize=256)
def routing_loads(n: int, imbalance: float) -> tuple[float, ...]:
    """Token copies routed to each of ``n`` EP ranks over the mean: mean 1, largest
    exactly ``imbalance`` (the busiest rank's, ``model.moe.routing_imbalance``), none
    below 0; all 1 for ``imbalance`` = 1.

    The shape is drawn, seeded (:data:`ROUTING_SEED`): n standard normal draws (a rank's
    load under random routing is near-Gaussian, docs/collectives.md's note on the imbalance)
    centred and scaled so that the largest is ``imbalance``; where that would leave a
    rank below zero (large imbalances), mixed with the two-level loads (the busiest at
    ``imbalance``, the others sharing the rest equally) just enough to keep every load
    at or above zero. ConfigError if ``imbalance`` > n (the busiest rank cannot receive
    more than every copy).
    """
    if not 1.0 <= imbalance <= n:
        raise ConfigError(f"routing_imbalance={imbalance:g} must lie between 1 and the EP "
                          f"group's size {n}: the busiest rank gets at most every copy")
    if imbalance == 1.0 or n == 1:
        return (1.0,) * n
    rng = random.Random(ROUTING_SEED)
    draws = [rng.gauss(0.0, 1.0) for _ in range(n)]
    mean = sum(draws) / n
    top = max(draws)
    busiest = draws.index(top)
    shaped = [1.0 + (imbalance - 1.0) * (x - mean) / (top - mean) for x in draws]
    rest = (n - imbalance) / (n - 1)
    flat = [imbalance if i == busiest else rest for i in range(n)]
    low = min(shaped)
    theta = 1.0 if low >= 0.0 else rest / (rest - low)
    return tuple(max(0.0, theta * a + (1.0 - theta) * b)
                 for a, b in zip(shaped, flat, strict=True))


def _pairwise(p: _Plan, ranks: Sequence[int], nbytes: float,
              skew: tuple[float, bool] = (1.0, False)) -> None:
    """Every rank sends S/n to every other rank, all at once: NCCL's all-to-all, one
    ``ncclSend``/``ncclRecv`` per peer inside one group call, whose flows the network
    shares max-min (not lock-step rounds bound by each round's slowest link).

    ``skew`` = (imbalance, busiest_sends): dropless MoE routing, S the busiest EP rank's
    bytes. Rank j's share of the copies is L_j = :func:`routing_loads` (n, imbalance)
    over the busiest's; each pair moves S/n·L_j/imbalance, towards j (dispatch, and the
    combine's gradient) or, ``busiest_sends``, from j (combine, the dispatch's
    gradient). Imbalance 1: every pair S/n, the uniform plan.
    """
    n = len(ranks)
    imbalance, from_loaded = skew
    loads = routing_loads(n, imbalance)
    for i, src in enumerate(ranks):
        for j, dst in enumerate(ranks):
            share = loads[i if from_loaded else j] / imbalance
            if src != dst and share > 0.0:
                p.add(src, dst, nbytes / n if share == 1.0 else nbytes / n * share)


def _hierarchical_all_to_all(p: _Plan, ranks: Sequence[int], nbytes: float,
                             host_of: Mapping[int, int] | None) -> None:
    """All-to-all inside each server first, then between servers on one rail.

    Member i of a server sends member j of it the S/n blocks of every GPU of index j
    (n2 of them, its own server's included); once a GPU holds its server's blocks for
    the GPUs of its index, it sends each other server's GPU of its index the n1 blocks
    bound for it (the two-level all-to-all of DeepSpeed-MoE's hierarchical all-to-all,
    Rajbhandari et al. 2022, sec. 5.2, and of Tutel). Every byte between servers crosses
    once, between GPUs of the same index, in n2 − 1 large messages per GPU instead of
    n − n1 small ones.
    """
    hosts = _hosts(ranks, host_of)
    n1, n2 = len(hosts[0]), len(hosts)
    block = nbytes / (n1 * n2)
    arrived: dict[int, list[int]] = {r: [] for r in ranks}
    for members in hosts:
        for src in members:
            for dst in members:
                if src != dst:
                    arrived[dst].append(p.add(src, dst, block * n2))
    for j in range(n1):
        column = [h[j] for h in hosts]
        for src in column:
            for dst in column:
                if src != dst:
                    p.add(src, dst, block * n1, arrived[src])


def _chain(p: _Plan, op: str, ranks: Sequence[int], nbytes: float) -> None:
    """Pipelined chain from (broadcast) or to (reduce) ``ranks[0]``, streamed: the hop i
    flow starts when the first bytes have crossed the hops before it."""
    n = len(ranks)
    pairs = ([(ranks[i], ranks[i + 1]) for i in range(n - 1)] if op == "broadcast" else
             [(ranks[i], ranks[i - 1]) for i in range(n - 1, 0, -1)])
    total = 0.0
    for k, (src, dst) in enumerate(pairs):
        total += p.lat(src, dst)
        p.add(src, dst, nbytes, (), steps=k + 1, latency_s=total if p.latency else None)


def _tree(p: _Plan, ranks: Sequence[int], nbytes: float,
          host_of: Mapping[int, int] | None = None) -> None:
    """Streamed tree all-reduce over every channel of :func:`tree_channels`: each of a
    channel's trees (two binary trees, or one chain) reduces and broadcasts its share."""
    channels = tree_channels(ranks, host_of)
    for trees in channels:
        for tree in trees:
            _stream_tree(p, tree, nbytes / (len(trees) * len(channels)))


def _stream_tree(p: _Plan, tree: Tree, nbytes: float, offset_s: float = 0.0,
                 offset_steps: int = 0) -> float:
    """One tree's reduction towards the root and broadcast away from it, concurrently, as
    one pipeline: every edge carries ``nbytes`` each way once the pipeline is full, the
    first byte having crossed the tree up to the root and down to the deepest rank
    (2H hop latencies, the actual routes' where known).

    That is when the last edge starts, so the tree ends at fill + its bytes' time, the
    closed form of a pipelined tree. Starting the edges nearer the leaves earlier (a rank
    of subtree height h after (h + 1) latencies) ends a lone tree at the same time, but
    where several trees share links (the k chains of one server, the channels over NICs)
    their staggered starts let one tree's bytes use a link while another fills, which
    hid the fill: a chain of 8 A100 ran a 48 MiB all-reduce faster than the ring although
    NCCL's model gives the chain the ring's bytes, 92% of its bandwidth and the same
    2(k−1) steps (``ncclTopoTuneModel``, src/graph/tuning.cc, :func:`sim.protocols.source`).

    ``offset_s`` (``offset_steps``): when the tree's first byte is ready at its ranks (NVLSTree:
    once reduced through the NVSwitch); the tree starts that much later. Returns the fill.
    """
    depth, height = tree_heights(tree)
    top = max(height.values())
    known = p.latency is not None
    up: dict[int, float] = {}  # first reduced byte of r's subtree reaches r's parent
    down: dict[int, float] = {}  # first broadcast byte reaches r (the root: leaves it)
    for r in sorted(tree, key=lambda r: height[r]):
        parent, children = tree[r]
        ready = max((up[c] for c in children), default=0.0)
        if parent < 0:
            down[r] = ready
        else:
            up[r] = ready + p.lat(r, parent)
    for r in sorted(tree, key=lambda r: depth[r]):
        parent = tree[r][0]
        if parent >= 0:
            down[r] = down[parent] + p.lat(parent, r)
    fill = max(down.values())
    steps = top + max(depth.values())
    for r, (parent, _children) in tree.items():
        if parent < 0:
            continue
        p.add(r, parent, nbytes, (), steps=steps + offset_steps,
              latency_s=offset_s + fill if known else None)
        p.add(parent, r, nbytes, (), steps=steps + offset_steps,
              latency_s=offset_s + fill if known else None)
    return fill


def _nvls(p: _Plan, op: str, ranks: Sequence[int], nbytes: float, nvswitch: str | None,
          efficiency: float = 1.0, pipeline: bool = True) -> None:
    """In-switch reduction (NVLink SHARP): members stream up to the NVSwitch, it streams back.

    All-reduce: each GPU sends its whole buffer up and receives the whole
    reduced buffer (the switch reduces and multicasts); reduce-scatter: S up,
    S/n down; all-gather: S/n up, S down (multicast); broadcast: the root sends
    S up, every other member receives S; reduce: every member sends S up, the
    root receives S. Up flows pay one hop latency, down flows two. Each flow
    carries its bytes / ``efficiency``: NVLS runs at that fraction of the NVLink
    rate the links model (the switch's protocol overhead, as bytes on the wire).
    All-reduce with ``pipeline``: every flow also carries NCCL's chunk pipeline filling
    and draining (:func:`sim.nvls.fill_bytes`); without it the plan is the streamed limit.
    """
    if nvswitch is None:
        raise ConfigError(f"nvls needs every rank of the group {tuple(ranks)} on one NVSwitch "
                          "with in-network reduction (NVLink SHARP: DGX H100 and later)")
    n = len(ranks)
    root = ranks[0]
    known = p.latency is not None
    first = max(p.lat(r, nvswitch) for r in ranks)  # first reduced byte at the switch
    if op == "all_reduce" and pipeline:
        nbytes += nvls.fill_bytes("nvls", nbytes, n)
    for r in ranks:
        up = {"all_reduce": nbytes, "reduce_scatter": nbytes, "all_gather": nbytes / n,
              "broadcast": nbytes if r == root else 0.0, "reduce": nbytes}[op]
        down = {"all_reduce": nbytes, "reduce_scatter": nbytes / n, "all_gather": nbytes,
                "broadcast": 0.0 if r == root else nbytes,
                "reduce": nbytes if r == root else 0.0}[op]
        up, down = up / efficiency, down / efficiency
        if up > 0:
            p.add(r, nvswitch, up, (), 1, p.lat(r, nvswitch) if known else None)
        if down > 0:
            p.add(nvswitch, r, down, (), 2, first + p.lat(nvswitch, r) if known else None)


def _nvls_tree(p: _Plan, ranks: Sequence[int], nbytes: float,
               host_of: Mapping[int, int] | None, nvswitch_of: Mapping[int, str | None] | None,
               efficiency: float = 1.0, pipeline: bool = True, nics: int | None = None) -> None:
    """NCCL's NVLSTree all-reduce: NVLS inside each server, trees between servers.

    Every member of a server streams its buffer up to the server's NVSwitch, which reduces
    it (``multimem.ld_reduce``) for the server's h heads, one per NIC (``nics``, default one
    per member; :func:`sim.nvls.heads`), head c being the first member its NIC serves: it
    holds the server's sum of the c-th of h shares. Head c of every server then all-reduces
    its share, S/h, over NCCL's double binary tree of the servers (each of the two trees S/2h,
    through head c's own NIC: the NVLSTree channels of ``src/device/all_reduce.h``), and
    the heads multicast the result through the NVSwitch to every member (``multimem.st``),
    each member receiving S. Streamed as one pipeline: the up flows after one GPU-NVSwitch
    hop; a tree once its heads hold the first reduced byte (up and back down to the head);
    the multicast once the first byte has crossed the tree, back up to the NVSwitch and
    down. With ``pipeline`` every flow also carries NCCL's chunk pipeline filling
    (:func:`sim.nvls.fill_bytes`). NVLS flows carry their bytes / ``efficiency``, as
    :func:`_nvls`.
    """
    blocks = host_blocks(ranks, host_of)
    if blocks is None:
        raise ConfigError(f"nvls_tree needs two or more servers with the same number (> 1) of "
                          f"contiguous ranks each; group {tuple(ranks)} is not")
    switch: dict[int, str] = {}
    for b, members in enumerate(blocks):
        sws = {nvswitch_of.get(r) if nvswitch_of else None for r in members}
        sw = sws.pop() if len(sws) == 1 else None
        if sw is None:
            raise ConfigError(f"nvls_tree needs every server's ranks on one NVSwitch with "
                              f"in-network reduction; ranks {tuple(members)} are not")
        switch[b] = sw
    k, m = len(blocks[0]), len(blocks)
    known = p.latency is not None
    h = nvls.heads("nvls_tree", k, nics)
    head_of = [c * (k // h) for c in range(h)]
    if pipeline:
        nbytes += nvls.fill_bytes("nvls_tree", nbytes, k, m, nics)
    wire = nbytes / efficiency
    first = {b: max(p.lat(r, switch[b]) for r in members) for b, members in enumerate(blocks)}
    at_head = max(first[b] + p.lat(switch[b], members[c]) for b, members in enumerate(blocks)
                  for c in head_of)
    tree_fill = 0.0
    for c in head_of:
        for host_tree in dtree(m):
            tree = {blocks[x][c]: (blocks[up][c] if up >= 0 else -1,
                                   tuple(blocks[d][c] for d in down))
                    for x, (up, down) in host_tree.items()}
            tree_fill = max(tree_fill, _stream_tree(p, tree, nbytes / (2 * h), at_head, 2))
    height = 2 * tree_shape(m)[0]
    back = max(p.lat(members[c], switch[b]) for b, members in enumerate(blocks)
               for c in head_of)
    for b, members in enumerate(blocks):
        for r in members:
            p.add(r, switch[b], wire, (), 1, p.lat(r, switch[b]) if known else None)
            p.add(switch[b], r, wire, (), 4 + height,
                  at_head + tree_fill + back + p.lat(switch[b], r) if known else None)


def plan(op: str, algo: str, ranks: Sequence[int], nbytes: float, *,
         host_of: Mapping[int, int] | None = None, nvswitch: str | None = None,
         nvls_efficiency: float = 1.0, granularity: str = "step",
         latency: LatencyFn | None = None, wire_fraction: float = 1.0,
         skew: tuple[float, bool] = (1.0, False),
         nvls_pipeline: bool = True,
         nvswitch_of: Mapping[int, str | None] | None = None,
         nics: int | None = None) -> tuple[Transfer, ...]:
    """Decompose collective ``op`` over ``ranks`` (ring order) of an ``nbytes`` buffer.

    ``host_of`` maps each rank to its server (hierarchical needs it; a ring
    over several servers uses it to run NCCL-like channels, :func:`ring_channels`);
    ``nvswitch`` names the NVSwitch node all ranks share (NVLS needs it) and
    ``nvls_efficiency`` the fraction of its links' rate NVLS reaches;
    ``granularity`` is ``step`` (ring phases as one transfer per step, the
    default here) or ``stream`` (one transfer per ring edge; module docstring);
    ``latency`` gives route latencies, so that a streamed transfer waits for
    the latencies of the actual hops in front of it (on a ring whose edges
    differ, e.g. NVLink and network, the sum over the preceding edges rather
    than ``steps`` times its own); without it the engine charges ``steps``
    times the transfer's own route latency, which is the same on uniform rings.
    ``wire_fraction``: the fraction of the links' rate the protocol reaches
    (:func:`sim.protocols.bandwidth_fraction`); every transfer carries its bytes / it.
    ``skew``: (routing imbalance, whether the busiest rank sends) of a pairwise
    all-to-all whose ranks move unequal volumes (:func:`_pairwise`); other algorithms
    move the busiest rank's volume from every rank.
    ``nvls_pipeline``: NVLS and NVLSTree all-reduces carry their chunk pipeline's fill
    (:mod:`sim.nvls`); False: the streamed limit.
    ``nvswitch_of``: each rank's NVSwitch with in-network reduction, or None (NVLSTree
    needs one per server); ``nics``: NICs per server, NVLSTree's heads (None: one per GPU).
    """
    n = len(ranks)
    check(op, algo)
    if granularity not in GRANULARITIES:
        raise ConfigError(f"collective granularity {granularity!r} is not one of "
                          f"{', '.join(GRANULARITIES)}")
    if len(set(ranks)) != n:
        raise ConfigError(f"collective group {tuple(ranks)} repeats a rank")
    if op == "send" and n != 2:
        raise ConfigError(f"send needs a group of exactly (src, dst), got {tuple(ranks)}")
    if n <= 1 or nbytes <= 0:
        return ()
    p = _Plan(latency, wire_fraction)
    stream = granularity == "stream"
    if algo == "ring" and op in ("broadcast", "reduce"):
        _chain(p, op, ranks, nbytes)
    elif algo == "ring":
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        channels = ring_channels(ranks, host_of)
        for order in channels:
            _ring(p, order, nbytes / (n * len(channels)), steps, stream)
    elif algo == "halving_doubling":
        _halving_doubling(p, op, ranks, nbytes)
    elif algo == "hierarchical" and op == "all_to_all":
        _hierarchical_all_to_all(p, ranks, nbytes, host_of)
    elif algo == "hierarchical":
        _hierarchical(p, op, ranks, nbytes, host_of, stream)
    elif algo == "pairwise":
        _pairwise(p, ranks, nbytes, skew)
    elif algo == "tree":
        _tree(p, ranks, nbytes, host_of)
    elif algo == "nvls":
        _nvls(p, op, ranks, nbytes, nvswitch, nvls_efficiency, nvls_pipeline)
    elif algo == "nvls_tree":
        _nvls_tree(p, ranks, nbytes, host_of, nvswitch_of, nvls_efficiency, nvls_pipeline, nics)
    else:
        p.add(ranks[0], ranks[1], nbytes)
    return tuple(p.transfers)


def alpha_beta_time(op: str, algo: str, n: int, nbytes: float, alpha: float, bandwidth: float,
                    *, gpus_per_node: int = 1, alpha_inter: float | None = None,
                    bandwidth_inter: float | None = None, protocol: str = "simple",
                    inter_node: bool = False, nics_per_node: int | None = None) -> float:
    """Time of a collective in the α-β model without contention (module docstring).

    ``alpha`` is the latency of one transfer (GPU to GPU; for NVLS, GPU to
    NVSwitch) and ``bandwidth`` its bytes/s. Hierarchical: ``alpha`` and
    ``bandwidth`` are intra-node, ``alpha_inter`` and ``bandwidth_inter``
    inter-node per GPU, ``gpus_per_node`` = n1. Ring with ``gpus_per_node`` =
    k > 1 and ``bandwidth_inter``: the k channels of :func:`ring_channels`,
    steps·α_max + steps/n·S·max((k−1)/(k·B1), 1/(k·B2)) (stream granularity,
    exact without latency). Tree likewise: the k channels of :func:`tree_channels`
    over m = n/k hosts, 2((k−1)α1 + H(m)α2) + max(2(k−1)/k·S/B1, L(m)·S/(2k·B2))
    with (H, L) = :func:`tree_shape` (m) (exact when either term vanishes).
    ``protocol`` (ring and tree; :mod:`sim.protocols`): latencies scale by its ratio to
    Simple (``alpha`` as a route inside a server unless ``inter_node``, ``alpha_inter``
    as one between servers) and bandwidths by its fraction (across servers with
    ``inter_node`` or channels). NVLSTree: ``bandwidth_inter`` per NIC, one tree head per
    NIC (``nics_per_node``, default one per GPU; :func:`sim.nvls.heads`). Launch latency is
    not included.
    """
    check(op, algo)
    S, a, B = nbytes, alpha, bandwidth
    if n <= 1 or S <= 0:
        return 0.0
    k = gpus_per_node
    channels = k > 1 and bandwidth_inter is not None and n > k
    if algo in PROTOCOL_ALGOS:
        fraction = bandwidth_fraction(algo, protocol, inter_node or channels)
        B = B * fraction
        if bandwidth_inter is not None:
            bandwidth_inter = bandwidth_inter * fraction
        a = a * latency_scale(algo, protocol, inter_node)
        if alpha_inter is not None:
            alpha_inter = alpha_inter * latency_scale(algo, protocol, True)
    if algo == "ring" and op in ("broadcast", "reduce"):
        return (n - 1) * a + S / B
    if algo == "ring":
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        if channels:
            # k channels (ring_channels): per GPU, k - 1 rings leave over NVLink, one over the NIC
            a2 = a if alpha_inter is None else alpha_inter
            per_byte = max((k - 1) / (k * B), 1 / (k * bandwidth_inter))
            return steps * max(a, a2) + steps / n * S * per_byte
        return steps * (a + S / (n * B))
    if algo == "halving_doubling":
        pw = 1 << (n.bit_length() - 1)
        e = pw.bit_length() - 1
        phases = 2 if op == "all_reduce" else 1
        fold = 2 * (a + S / B) if pw != n else 0.0
        if pw != n and op != "all_reduce":
            raise ConfigError(f"halving_doubling {op} needs a power-of-two group, got {n}")
        return phases * (e * a + (pw - 1) / pw * S / B) + fold
    if algo == "hierarchical" and op != "all_to_all":
        n1 = gpus_per_node
        if n % n1:
            raise ConfigError(f"hierarchical: gpus_per_node={n1} does not divide n={n}")
        n2 = n // n1
        a2 = a if alpha_inter is None else alpha_inter
        B2 = B if bandwidth_inter is None else bandwidth_inter
        intra = (n1 - 1) * a + (n1 - 1) / n1 * S / B
        if op == "all_reduce":
            return 2 * intra + 2 * (n2 - 1) * a2 + 2 * (n2 - 1) / n2 * S / (n1 * B2)
        return intra + (n2 - 1) * a2 + (n2 - 1) / n2 * S / (n1 * B2)
    if algo == "pairwise":
        return a + (n - 1) / n * S / B
    if algo == "hierarchical" and op == "all_to_all":
        n1 = gpus_per_node
        n2 = n // n1
        a2 = a if alpha_inter is None else alpha_inter
        B2 = B if bandwidth_inter is None else bandwidth_inter
        return ((a + (n1 - 1) / n1 * S / B if n1 > 1 else 0.0)
                + (a2 + (n2 - 1) / n2 * S / B2 if n2 > 1 else 0.0))
    if algo == "nvls_tree":
        if k < 2 or n % k or n // k < 2:
            raise ConfigError(f"nvls_tree needs two or more servers of gpus_per_node > 1 GPUs; "
                              f"got n={n}, gpus_per_node={k}")
        m = n // k
        height, load = tree_shape(m)
        tree = 2 * height * (a if alpha_inter is None else alpha_inter)
        B2 = B if bandwidth_inter is None else bandwidth_inter
        h = nvls.heads("nvls_tree", k, nics_per_node)
        S = S + nvls.fill_bytes("nvls_tree", S, k, m, nics_per_node)
        return max(4 * a + tree + S / B, 2 * a + tree + load * S / (2 * h * B2))
    if algo == "tree" and channels:
        m = n // k
        height, load = tree_shape(m)
        a2 = a if alpha_inter is None else alpha_inter
        return (2 * ((k - 1) * a + height * a2)
                + max(2 * (k - 1) / k * S / B, load * S / (2 * k * bandwidth_inter)))
    if algo == "tree":
        height, load = tree_shape(n)
        return 2 * height * a + load * (S / 2) / B
    if algo == "nvls":
        up = {"all_gather": S / n}.get(op, S)
        down = {"reduce_scatter": S / n}.get(op, S)
        fill = nvls.fill_bytes("nvls", S, n) if op == "all_reduce" else 0.0
        return max(a + (up + fill) / B, 2 * a + (down + fill) / B)
    return a + S / B


def bus_bandwidth(op: str, n: int, nbytes: float, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s, nccl-tests style: algbw = S/t, busbw = algbw × factor(n)."""
    algbw = nbytes / time_s if time_s > 0 else math.inf
    return algbw, algbw * BUS_FACTOR[op](n)
