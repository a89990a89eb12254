"""The rings and trees NCCL runs a group's collectives over: shapes over ranks, no bytes or
times. Pure (no SimPy).

Which member sends to which: the channels of a ring collective (:func:`ring_channels`, one
ring per NIC, each hop between servers on one rail), the order a ring visits a torus
(:func:`ring_order`), NCCL's binary and double binary trees (:func:`btree`, :func:`dtree`,
their height and load :func:`tree_shape`) and the trees of a tree all-reduce per channel
(:func:`tree_channels`). :mod:`sim.collectives` turns them into transfers;
:mod:`sim.selection` reads them to pick an algorithm. Sources: NCCL ``src/graph/search.cc``
(rings), ``src/graph/trees.cc`` (trees), ``src/graph/connect.cc`` (channels).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Protocol


def ring_channels(ranks: Sequence[int], host_of: Mapping[int, int] | None) -> list[list[int]]:
    """The rings a ring collective runs over ``ranks``, each carrying an equal share of the data.

    NCCL runs several rings ("channels") at once and routes each through
    different GPUs at the server boundaries, so that every NIC of a server
    carries traffic, and keeps each inter-server hop on one rail: a ring
    leaves a server through NIC j and enters the next through its NIC j (NCCL's
    ring graph search, ``src/graph/search.cc``; the NCCL 2.x performance
    notes). When the group spans several hosts with the same number k > 1 of
    members on each, and each host's members are contiguous in ``ranks``, this
    returns k rings. Ring c walks the even-numbered hosts' members upward from
    member c (leaving from member c − 1) and the odd-numbered hosts' downward
    from member c − 1 (leaving from member c), so every hop between hosts joins
    members of the same index: on a rail-optimized fabric it stays on its rail's
    switch. Each member's NIC sends for exactly one ring and receives for exactly
    one. With an odd number of hosts the wrap-around hop from the last host to
    the first crosses rails. Otherwise (one host, one member per host, uneven
    or interleaved groups, or no ``host_of``) it returns the single ring ``ranks``.
    """
    blocks = host_blocks(ranks, host_of)
    if blocks is None:
        return [list(ranks)]
    k = len(blocks[0])
    return [[b[(c + i) % k] if h % 2 == 0 else b[(c - 1 - i) % k]
             for h, b in enumerate(blocks) for i in range(k)] for c in range(k)]


@functools.lru_cache(maxsize=64)
def _snake(dims: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every coordinate of a ``dims`` box in reflected mixed-radix Gray-code order (a
    boustrophedon): consecutive coordinates differ by one in one axis, and when the last
    axis has an even size the last coordinate is (0, ..., 0, k−1), a wrap-around link from
    the first on a torus."""
    if len(dims) == 1:
        return tuple((i,) for i in range(dims[0]))
    inner = _snake(dims[:-1])
    return tuple(c + (j,) for j in range(dims[-1]) for c in (inner if j % 2 == 0 else inner[::-1]))


def ring_order(topo: TopologyView, ranks: Sequence[int]) -> tuple[int, ...]:
    """The order a ring (or tree) visits ``ranks``: on a torus (GPU nodes carrying ``coord``,
    :func:`topologies.graphs.torus`) a Hamiltonian cycle of one-link hops through the
    group's box, dimension by dimension with an even-sized axis outermost (the
    dimension-ordered rings of TPU pods); elsewhere ``ranks`` as given. The order starts at
    ``ranks[0]`` (the root of broadcast and reduce). A group that is not the whole box
    keeps the box's order among its members."""
    nodes = topo.node_attrs
    coords = [nodes[topo.node(r)].get("coord") for r in ranks]
    if len(ranks) < 3 or any(c is None for c in coords):
        return tuple(ranks)
    dims = [max(c[i] for c in coords) + 1 for i in range(len(coords[0]))]
    axes = list(range(len(dims)))
    even = [a for a in axes if dims[a] % 2 == 0 and dims[a] > 1]
    if even:
        axes.remove(even[-1])
        axes.append(even[-1])
    at = {tuple(c[a] for a in axes): r for c, r in zip(coords, ranks, strict=True)}
    order = [at[c] for c in _snake(tuple(dims[a] for a in axes)) if c in at]
    start = order.index(ranks[0])
    return tuple(order[start:] + order[:start])


def btree(n: int, rank: int) -> tuple[int, tuple[int, ...]]:
    """(parent, children) of ``rank`` in NCCL's binary tree over 0..n−1 (parent −1 at the root).

    NCCL ``ncclGetBtree`` (src/graph/trees.cc): the parent flips the lowest set
    bit and sets the next one; the root 0 has the single child 2^⌈log2 n⌉/2.
    """
    bit = 1
    while bit < n:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, ((bit >> 1,) if n > 1 else ())
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    children = []
    if low:
        children.append(rank - low)
        down1 = rank + low
        while down1 >= n:
            down1 = rank + low if low else -1
            low >>= 1
        if down1 >= 0:
            children.append(down1)
    return up, tuple(sorted(set(children)))


def dtree(n: int) -> tuple[dict[int, tuple[int, tuple[int, ...]]], ...]:
    """NCCL's double binary tree (``ncclGetDtree``, src/graph/trees.cc): the btree and, for
    even n, its mirror image (rank r -> n−1−r), for odd n the btree shifted by one rank
    (r -> r+1 mod n). Maps position -> (parent, children)."""
    first = {r: btree(n, r) for r in range(n)}

    def relabel(r: int) -> int:
        return -1 if r < 0 else (n - 1 - r if n % 2 == 0 else (r + 1) % n)

    second = {}
    for r in range(n):
        parent, children = first[r]
        second[relabel(r)] = (relabel(parent), tuple(sorted(relabel(c) for c in children)))
    return first, second


def tree_heights(tree: Mapping[int, tuple[int, tuple[int, ...]]]) -> tuple[dict[int, int],
                                                                       dict[int, int]]:
    root = next(r for r, (parent, _) in tree.items() if parent < 0)
    depth = {root: 0}
    order = [root]
    for r in order:
        for c in tree[r][1]:
            depth[c] = depth[r] + 1
            order.append(c)
    height = {}
    for r in reversed(order):
        height[r] = max((height[c] + 1 for c in tree[r][1]), default=0)
    return depth, height


def tree_shape(n: int) -> tuple[int, int]:
    """(H, L) of the double binary tree on n ranks: the height of the taller tree and the
    most flows (reduce to a parent + broadcast to children, over both trees) one rank sends."""
    trees = dtree(n)
    height = max(tree_heights(t)[1][next(r for r, (p, _) in t.items() if p < 0)] for t in trees)
    load = [sum((t[r][0] >= 0) + len(t[r][1]) for t in trees) for r in range(n)]
    return height, max(load)


Tree = Mapping[int, tuple[int, tuple[int, ...]]]
"""A tree over ranks: rank -> (parent rank, or -1 at the root; children ranks)."""


def tree_channels(ranks: Sequence[int], host_of: Mapping[int, int] | None) -> list[list[Tree]]:
    """The trees a tree all-reduce runs over ``ranks``: per channel, NCCL's two binary trees.

    NCCL builds its double binary tree between servers and a chain inside each
    server, one channel per NIC (``ncclTopoPreset``/``connectTrees``, src/graph/connect.cc;
    Sanders, Speck & Träff 2009). When the group spans several hosts with the same
    number k > 1 of members on each, contiguous in ``ranks``, this returns k
    channels: channel c's trees join the hosts by :func:`dtree` over hosts, each
    host's head being its member c (so every edge between hosts joins members of the
    same index, on one rail, through member c's NIC), and inside each host a chain
    from the head through members c+1, c+2, ... Each channel carries S/k, half on
    each tree. A group inside one host runs NCCL's intra-node tree, a chain: k channels,
    channel c's chain rooted at member c (NCCL's tuning model charges it 2(k−1) steps).
    Otherwise one channel: :func:`dtree` over the ranks in order.
    """
    blocks = host_blocks(ranks, host_of)
    if blocks is None and host_of is not None and len(ranks) > 1 and len(
            {host_of[r] for r in ranks}) == 1:
        k = len(ranks)
        chains = [[ranks[(c + i) % k] for i in range(k)] for c in range(k)]
        return [[{chain[i]: (chain[i - 1] if i else -1, (chain[i + 1],) if i + 1 < k else ())
                  for i in range(k)}] for chain in chains]
    if blocks is None:
        n = len(ranks)

        def rank(i: int) -> int:
            return -1 if i < 0 else ranks[i]

        return [[{ranks[i]: (rank(par), tuple(rank(c) for c in ch))
                  for i, (par, ch) in sorted(t.items())} for t in dtree(n)]]
    k = len(blocks[0])
    channels = []
    for c in range(k):
        chains = [[b[(c + i) % k] for i in range(k)] for b in blocks]
        trees = []
        for host_tree in dtree(len(blocks)):
            tree: dict[int, tuple[int, tuple[int, ...]]] = {}
            for h, chain in enumerate(chains):
                up, down = host_tree[h]
                tree[chain[0]] = (chains[up][0] if up >= 0 else -1,
                                  (chain[1],) + tuple(chains[d][0] for d in down))
                for i in range(1, k):
                    tree[chain[i]] = (chain[i - 1], (chain[i + 1],) if i + 1 < k else ())
            trees.append(tree)
        channels.append(trees)
    return channels


def host_blocks(ranks: Sequence[int], host_of: Mapping[int, int] | None
                 ) -> list[list[int]] | None:
    """``ranks`` cut into hosts' contiguous blocks of k > 1 members each, over two or more
    hosts; None for any other group (one host, one member per host, uneven or interleaved)."""
    if host_of is None:
        return None
    blocks: list[list[int]] = []
    for r in ranks:
        if blocks and host_of[r] == host_of[blocks[-1][0]]:
            blocks[-1].append(r)
        else:
            blocks.append([r])
    k = len(blocks[0])
    hosts = {host_of[b[0]] for b in blocks}
    if k == 1 or len(blocks) == 1 or len(hosts) != len(blocks) or any(len(b) != k for b in blocks):
        return None
    return blocks


class TopologyView(Protocol):
    """What :func:`ring_order` and :func:`sim.selection.group_profile` need from a cluster
    (a :class:`topologies.cluster.Cluster`)."""

    def route(self, src: int | str, dst: int | str) -> object: ...
    def host_of(self, rank: int) -> int: ...
    def nvswitch_of(self, rank: int) -> str | None: ...
    def nvls_capable(self, node: str) -> bool: ...
    def node(self, endpoint: int | str) -> str: ...
    def bottleneck_Bps(self, route: object) -> float: ...
    @property
    def node_attrs(self) -> Mapping[str, Mapping[str, object]]: ...
