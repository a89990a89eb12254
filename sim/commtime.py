"""Timing collectives in isolation on the real topology, for collapsed simulations.

A collapsed simulation (DESIGN.md, "Large clusters") runs one representative
GPU per pipeline rank. The collectives and pipeline sends it takes part in are
timed here: every group it stands for runs the collective at once on the
flow-level network, so contention between the replicas' collectives on shared
links (NICs, uplinks) is included. The plan is the engine's own
(:func:`sim.selection.collective_plan`: the cluster's per-op algorithm override or
``auto`` choice, its granularity, the routes' latencies, the per-step software
latency), so an isolated collective takes exactly as long here as in a full
simulation. Results are cached per (op, groups, bytes) on the instance, and
reused, bit-identically, for the same groups shifted by whole servers (another
pipeline rank's) where the servers are interchangeable and every route is the
only shortest path (:meth:`CollectiveTimer._translate` proves the condition).
Groups that are exact replicas on disjoint links are timed by simulating one
of them (:func:`replicas_makespan_s`, bit-identical to simulating all).

Exactness: a timing equals the engine's flow simulation of a program holding just
those concurrent collectives (or sends) to 1e-12 relative, on every topology, for every
algorithm and granularity, with or without reuse
(``tests/test_perf_commtime.py::test_timer_equals_the_flow_simulation``). The timer
itself never approximates. What a collapsed simulation approximates is *which* traffic
runs together: each call times one collective (or one pipeline message) with the copies
of the replicas it stands for, so transfers of two different calls that share a link
in the full simulation (a pipeline send and a ZeRO-3 gather over the same NIC, a
rank's forward and backward sends through one port, a DP ring edge and an EP
all-to-all on the same pair link, a TP all-reduce and a send on a ring link) do not
slow each other here. ``tests/test_fidelity.py`` bounds the effect on a step: by the
summed duration of the transfers whose links another call's transfers also use.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence

from base.collector import gc_paused
from sim.collectives import Transfer
from sim.engine import simulate_program
from sim.network import makespan_alone_s, makespan_s
from sim.selection import CollectivePlan, GroupProfile, collective_plan, step_latency_s
from topologies.cluster import Cluster
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe

Flow = tuple[float, tuple[int, ...], float]
"""``(start_s, links, nbytes)`` as :func:`sim.network.makespan_s` takes it."""


def replicas_makespan_s(groups: Sequence[Sequence[Flow]],
                        capacity_Bps: Sequence[float]) -> float:
    """:func:`sim.network.makespan_s` of every group's flows started together, in order.

    When the groups are replicas on disjoint links (a DP ring per TP rank, a
    pipeline send per GPU pair, each over its own NICs) every group evolves
    exactly as the first would alone: the same start times, byte counts and
    capacities, so the same max-min rates (progressive filling freezes each
    group's bottleneck at the same share) and the same end times, hence the
    same event instants and the same floating-point operations on every flow.
    The first group alone then gives the makespan of all, bit for bit. Groups
    are replicas when their flows match after renaming links in order of first
    use (same starts, bytes, link capacities, and which flows share a link)
    and no finite-capacity link is used by two groups; otherwise all flows run
    together.

    Where no finite-capacity link carries two of all the flows (the usual case: rings of
    one GPU per server, sends between distinct pairs), :func:`sim.network.makespan_alone_s`
    gives :func:`sim.network.makespan_s` of all of them, the same float, without the flow
    network or the replicas' comparison (:func:`replicas_makespan_reference_s` is the
    reference, ``tests/test_network_alone.py``).
    """
    fast = makespan_alone_s([flow for group in groups for flow in group], capacity_Bps)
    if fast is not None:
        return fast
    return replicas_makespan_reference_s(groups, capacity_Bps)


def replicas_makespan_reference_s(groups: Sequence[Sequence[Flow]],
                                  capacity_Bps: Sequence[float]) -> float:
    """:func:`replicas_makespan_s` by the flow network alone (its reference)."""
    if len(groups) > 1 and _are_disjoint_replicas(groups, capacity_Bps):
        return makespan_s(groups[0], capacity_Bps)
    return makespan_s([flow for group in groups for flow in group], capacity_Bps)


def _shape(group: Sequence[Flow], capacity_Bps: Sequence[float]) -> tuple:
    """A group's flows with links renamed 0, 1, ... in order of first use, with capacities:
    starts, bytes and link counts, the capacities of the links in order, and the renaming
    (None when no link is used twice, so the renaming is 0, 1, 2, ...)."""
    links = [x for _, path, _ in group for x in path]
    names: dict[int, int] = {}
    renamed = (None if len(set(links)) == len(links) else
               tuple([names.setdefault(x, len(names)) for x in links]))
    return (tuple([(start, nbytes, len(path)) for start, path, nbytes in group]),
            tuple([capacity_Bps[x] for x in links]), renamed)


def _are_disjoint_replicas(groups: Sequence[Sequence[Flow]],
                           capacity_Bps: Sequence[float]) -> bool:
    first = _shape(groups[0], capacity_Bps)
    used: set[int] = set()
    for group in groups:
        if _shape(group, capacity_Bps) != first:
            return False
        finite = {x for _, links, _ in group for x in links if capacity_Bps[x] < math.inf}
        if not used.isdisjoint(finite):
            return False
        used |= finite
    return True


_NONE = object()
"""Not found (a kept shape may be None)."""

BY_ID_CACHE = 4096
"""Timings a :class:`CollectiveTimer` finds by its groups' identity (it starts over past this
many; every timing stays in its cache by value)."""


def _pairs(offsets: tuple[int, ...], a: int, b: int) -> tuple[tuple[int, int], ...]:
    """The pairs ``(a + o, b + o)`` for ``o`` in ``offsets``."""
    return tuple(zip(map(a.__add__, offsets), map(b.__add__, offsets), strict=True))


class CollectiveTimer:
    """``timer(op, groups, nbytes)`` -> seconds for ``op`` run concurrently on all ``groups``.

    ``op == "send"``: ``groups`` are ``(src, dst)`` pairs each sending ``nbytes`` at
    once (the engine's point-to-point transfer: route latency, then a flow).
    Otherwise each group of two or more GPUs runs collective ``op`` with
    ``algo`` (unless the cluster overrides the algorithm for ``op``), and the
    time is the collective launch latency plus the makespan of all their plans.
    """

    def __init__(self, cluster: Cluster, algo: str = "auto",
                 skew: tuple[float, bool] = (1.0, False), *, share_plans: bool = True) -> None:
        self.cluster = cluster
        self.algo = algo
        self.skew = skew
        """(routing imbalance, whether the busiest rank sends) of the all-to-alls it times
        (:func:`sim.collectives.plan`); (1, False): equal volumes."""
        self.share_plans = share_plans
        """Whether a group's plan is that of an earlier group of its class, relabelled
        (:meth:`plans`); False: every group planned by :func:`sim.selection.
        collective_plan` (the reference)."""
        self._class_plans: dict[tuple, tuple[tuple[int, ...], CollectivePlan]] = {}
        """``(op, nbytes, class) -> (group, plan)``: plans another group of the class takes
        relabelled (:meth:`plans`)."""
        self.shared_plans = 0
        """How many plans were another group's, relabelled (:meth:`plans`)."""
        self._classes_seen: tuple[tuple[int, ...], frozenset[int]] | None = None
        """The cluster's server classes and their distinct values (:meth:`_class_set`)."""
        self._cache: dict[tuple, float] = {}
        self._by_id: dict[tuple[str, int, float], tuple[tuple, float]] = {}
        """``(op, id(groups), nbytes) -> (groups, seconds)``: :attr:`_cache`'s timings of the
        groups objects asked for lately, found by identity (:meth:`__call__`)."""
        self._profiles: dict[tuple[int, ...], GroupProfile] = {}
        """Group profiles of ``auto`` selection, by group
        (:func:`sim.selection.collective_plan`)."""
        self.simulations = 0
        """How many collectives needed the event engine (plans with dependent transfers)."""
        self.reused = 0
        """How many timings were those of groups shifted by whole servers (:meth:`_translate`)."""
        self._unique_profiles: dict[tuple[int, ...], bool] = {}
        """Whether every route a cached group profile consulted is a unique shortest path."""
        self._shapes: dict[tuple[str, float], dict[tuple, tuple[int, float]]] = {}
        """Reusable timings: ``(op, nbytes) -> {groups shifted to server 0: (first server,
        seconds)}``."""
        self._by_offsets: dict[tuple, tuple] = {}
        """``(op, id(offsets), a, b, nbytes) -> (offsets, seconds)``: :meth:`offset_pairs_s`'
        timings of the messages asked for lately, found by identity (as :attr:`_by_id`)."""
        self._offset_shapes: dict[tuple, tuple] = {}
        """``(op, nbytes, id(offsets), a - shift, b - shift) -> (offsets, first server,
        seconds, servers)``: the reusable timings :meth:`offset_pairs_s` found by the pairs'
        place on their servers (the shape :meth:`_shape_of` would make), without the pairs."""
        self._shape_by_groups: dict[tuple, tuple | None] = {}
        """``groups -> _shape_of_made(groups)`` of the groups asked for lately
        (:meth:`_shape_of`): a layout's groups asked again with other bytes, or another
        layout's equal groups (a pipeline message of 64 pairs: ~30 us a shift, ~1 us a
        lookup)."""

    @classmethod
    def shared(cls, cluster: Cluster, algo: str = "auto") -> CollectiveTimer:
        """The timer of ``cluster`` and ``algo`` that every simulation on that cluster shares
        (kept in :attr:`~topologies.cluster.Cluster.memo`): its timings depend on the
        cluster alone, so a shared one gives the same floats as a fresh one, and a cluster
        built once per description (:func:`topologies.build.build_cluster`) keeps them for
        the next experiment on it."""
        key = ("collective_timer", algo)
        timer = cluster.memo.get(key)
        if timer is None:
            timer = cluster.memo[key] = cls(cluster, algo)
        assert isinstance(timer, cls)
        return timer

    @property
    def size(self) -> int:
        """Timings cached so far (:meth:`timings_since` counts from it)."""
        return len(self._cache)

    def timings_since(self, start: int) -> tuple[tuple[tuple, float], ...]:
        """The ``(key, seconds)`` timings cached after the first ``start`` (in the order they
        were cached; none is ever dropped), for another process's timer of the same cluster
        (:meth:`adopt`)."""
        return tuple(itertools.islice(self._cache.items(), start, None))

    def adopt(self, timings: Iterable[tuple[tuple, float]]) -> None:
        """Take timings another timer of the same cluster, algorithm and skew computed
        (:meth:`timings_since`): each is a pure function of its key and the cluster, the
        float this timer would compute (with or without reuse, :meth:`_translate`), so
        taking it changes no result, only who times what. Keys cached here are kept."""
        cache = self._cache
        for key, seconds in timings:
            cache.setdefault(key, seconds)

    def __call__(self, op: str, groups: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        # the same groups object asked again (the lowering's groups are kept per placement
        # and rank): found by identity, without hashing and comparing its GPUs (a tuple's hash
        # is not kept: ~0.1 ms for a 2,048-GPU rank's pairs, asked once per ring op)
        by_id = (op, id(groups), nbytes)
        hit = self._by_id.get(by_id)
        if hit is not None and hit[0] is groups:
            return hit[1]
        key = (op, groups, nbytes)
        cached = self._cache.get(key)
        if cached is None:
            # routes, plans, flows (and the servers' signatures) are many small long-lived
            # objects: the cyclic collector's scans of them would cost a fifth of the time
            with gc_paused():
                cached = self._translate(op, groups, nbytes)
                if cached is not None:
                    self.reused += 1
                else:
                    cached = self._timed(op, groups, nbytes)
            self._cache[key] = cached
        if len(self._by_id) >= BY_ID_CACHE:
            self._by_id.clear()
        self._by_id[by_id] = (groups, cached)  # holding groups: its id is not reused meanwhile
        return cached

    def offset_pairs_s(self, op: str, offsets: tuple[int, ...], a: int, b: int,
                       nbytes: float,
                       pairs: Callable[[], tuple[tuple[int, ...], ...]] | None = None) -> float:
        """``self(op, pairs, nbytes)`` of the pairs ``(a + o, b + o)`` for ``o`` in ``offsets``
        (a collapsed pipeline message: every replica's copy, :func:`workloads.lowering.groups.
        replica_pairs`), the pairs neither built nor hashed where a timing kept for reuse
        (:meth:`_translate`) has their shape: the pairs shifted down to server 0 are
        ``offsets`` plus ``a`` and ``b`` less the shift, so equal offsets at equal
        ``(a, b)`` less the shift make the same shape, whose kept timing :meth:`_translate`
        hands out under the same twin-server test (another pipeline rank pair as far apart
        on the same servers: ~0.19 M instructions a message less). Otherwise the pairs are
        built and timed by :meth:`__call__` (the reference), and their shape's kept timing,
        if any, remembered by ``offsets`` (held: its identity is the key). A subclass that
        overrides :meth:`__call__` (a test's recorder of the links each call uses) is called
        on the pairs every time. ``pairs``: where given, makes those pairs (a caller's kept
        tuple: found again by :meth:`__call__` by identity); else they are built here."""
        if not offsets or type(self).__call__ is not CollectiveTimer.__call__:
            return self(op, _pairs(offsets, a, b) if pairs is None else pairs(), nbytes)
        # the same message asked again (a repeated layout's): found by identity
        by_id = (op, id(offsets), a, b, nbytes)
        hit = self._by_offsets.get(by_id)
        if hit is not None and hit[0] is offsets:
            return hit[1]
        seconds = self._by_shape(op, offsets, a, b, nbytes, pairs)
        if len(self._by_offsets) >= BY_ID_CACHE:
            self._by_offsets.clear()
        self._by_offsets[by_id] = (offsets, seconds)  # (holding offsets: its id not reused)
        return seconds

    def _by_shape(self, op: str, offsets: tuple[int, ...], a: int, b: int, nbytes: float,
                  pairs: Callable[[], tuple[tuple[int, ...], ...]] | None) -> float:
        """:meth:`offset_pairs_s` of a message not asked lately: its shape's kept timing where
        it carries over, else the timer on the pairs."""
        gpn = self.cluster.gpus_per_node
        first = (min(a, b) + min(offsets)) // gpn
        shift = first * gpn
        key = (op, nbytes, id(offsets), a - shift, b - shift)
        hit = self._offset_shapes.get(key)
        if hit is not None and hit[0] is offsets:
            _, was, t, servers = hit
            if first == was or self._twins(servers, was, first - was):
                return t
        groups = _pairs(offsets, a, b) if pairs is None else pairs()
        seconds = self(op, groups, nbytes)
        by_shape = self._shapes.get((op, nbytes))
        if not by_shape or self.cluster.host_classes() is None:
            return seconds
        # the pairs shifted down to server 0 (:meth:`_shape_of_made`'s shape, made from the
        # offsets: not the pairs shifted one by one)
        shape = groups if not shift else _pairs(offsets, a - shift, b - shift)
        kept = by_shape.get(shape)
        if kept is not None:
            if len(self._offset_shapes) >= BY_ID_CACHE:
                self._offset_shapes.clear()
            self._offset_shapes[key] = (offsets, kept[0], kept[1],
                                        frozenset(r // gpn for g in shape for r in g))
        return seconds

    def _twins(self, servers: Iterable[int], first: int, d: int) -> bool:
        """Whether each server ``h + first`` of ``servers`` (a kept shape's, shifted down to
        server 0) is a twin of ``h + first + d``: the test of :meth:`_translate` and
        :meth:`offset_pairs_s` (``servers`` read only where the servers are not all twins)."""
        classes = self.cluster.host_classes()
        if classes is None:
            return False
        if len(self._class_set(classes)) == 1:
            return True  # every server a twin of every other
        return all(classes[h + first] == classes[h + first + d] for h in servers)

    def _timed(self, op: str, groups: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        """Time ``op`` on ``groups``; remember it for translated copies where that is sound
        (:meth:`_translate`)."""
        c = self.cluster
        shape = self._shape_of(groups)
        if shape is None:
            return self._time(op, groups, nbytes)
        log: list[tuple[int | str, int | str]] = []
        outer, c.route_log = c.route_log, log
        runs, known = self.simulations, len(self._profiles)
        try:
            t = self._time(op, groups, nbytes)
        finally:
            c.route_log = outer
        if outer is not None:
            outer.extend(log)
        # each route once (the log repeats them: a plan reads a route per step and channel)
        seen = list(dict.fromkeys(log))
        unique = all(map(c.route_is_unique, *zip(*seen, strict=True)) if seen else ())
        # group profiles computed here consulted only logged routes; those cached before
        # were computed by an earlier call, whose routes were checked then, but may have
        # gained plan costs here (sim.selection.plan_cost), from this call's routes
        for group in list(self._profiles)[known:]:
            self._unique_profiles[group] = unique
        if not unique:
            for group in groups:
                if group in self._profiles:
                    self._unique_profiles[group] = False
        by_shape = self._shapes.setdefault((op, nbytes), {})
        if (self.simulations == runs and unique and shape[0] not in by_shape
                and all(self._unique_profiles.get(g, True) for g in groups)):
            by_shape[shape[0]] = (shape[1], t)
        return t

    def _time(self, op: str, groups: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        return (self._send_time(groups, nbytes) if op == "send"
                else self._collective_time(op, groups, nbytes))

    def _shape_of(self, groups: tuple[tuple[int, ...], ...]
                  ) -> tuple[tuple[tuple[int, ...], ...], int] | None:
        """:meth:`_shape_of_made` of ``groups``, kept for equal groups (a pure function of
        the groups and the cluster; it starts over past :data:`BY_ID_CACHE` groups)."""
        kept = self._shape_by_groups
        shape = kept.get(groups, _NONE)
        if shape is not _NONE:
            return shape
        shape = self._shape_of_made(groups)
        if len(kept) >= BY_ID_CACHE:
            kept.clear()
        kept[groups] = shape
        return shape

    def _shape_of_made(self, groups: tuple[tuple[int, ...], ...]
                       ) -> tuple[tuple[tuple[int, ...], ...], int] | None:
        """``(groups shifted down to start at server 0, first server)``, or None where the
        cluster's servers cannot be swapped (:meth:`topologies.cluster.Cluster.host_classes`)."""
        c = self.cluster
        if c.host_classes() is None:
            return None
        gpn = c.gpus_per_node
        low = min(map(min, filter(None, groups)), default=None)
        if low is None:
            return None
        first = low // gpn
        delta = first * gpn
        if not delta:
            return groups, first
        down = (-delta).__add__
        return tuple([tuple(map(down, g)) for g in groups]), first

    def _translate(self, op: str, groups: tuple[tuple[int, ...], ...],
                   nbytes: float) -> float | None:
        """The time of an earlier timing of ``op`` on ``groups`` shifted by whole servers,
        where that is provably the same float; None otherwise (time it).

        Let ``groups = G + d * gpus_per_node`` rank by rank, ``G`` timed before,
        and let every server ``h`` of ``G`` be a twin of ``h + d``
        (:meth:`topologies.cluster.Cluster.host_classes`). Then some automorphism
        ``phi`` of the cluster graph (a permutation of servers within twin classes,
        fabric fixed) maps every rank ``r`` of ``G`` to ``r + d * gpus_per_node``,
        every server's nodes (NICs, NVSwitch) to its image's, and preserves every
        link's bandwidth and latency. Each route the timing of ``G`` consulted was
        the only shortest path between its ends (checked then, and for the group
        profiles it took from the cache when they were computed; else ``G`` is not
        reused); an automorphism maps a unique shortest path onto the unique
        shortest path between the images, so each route of the shifted timing is
        ``phi`` of the original, link by link, with the same latencies summed in
        the same order (whatever the ECMP key, which only breaks ties). So the
        group profiles (route latencies and bottlenecks, servers per group, NVLS
        capability) are equal, the algorithm choice is the same, and the plans are
        the same with ranks shifted (the shift keeps the order of ranks and of
        servers, all a plan compares). The flows are then those of ``G`` with
        links renamed by ``phi``, in the same order, with the same starts, bytes
        and capacities; :func:`sim.network.makespan_s` (and
        :func:`replicas_makespan_s`'s disjointness test) depends on links only
        through equality and capacities, never their indices' order, so the
        makespan is the same float. Timings that ran the event engine (plans with
        dependent transfers) are not reused. Contention between the groups, and
        with links the groups share (an oversubscribed fabric), is carried over
        because ``phi`` maps all the groups at once.
        """
        by_shape = self._shapes.get((op, nbytes))
        if not by_shape:
            return None
        shape = self._shape_of(groups)
        if shape is None:
            return None
        hit = by_shape.get(shape[0])
        if hit is None:
            return None
        first, t = hit
        d = shape[1] - first
        if d == 0:
            return None
        assert self.cluster.host_classes() is not None
        gpn = self.cluster.gpus_per_node
        # (the servers as a generator: read only where the cluster has several classes)
        return t if self._twins((r // gpn for g in shape[0] for r in g), first, d) else None

    def _class_set(self, classes: tuple[int, ...]) -> frozenset[int]:
        """The distinct twin classes of the cluster's servers (kept)."""
        got = self._classes_seen
        if got is None or got[0] is not classes:
            got = self._classes_seen = (classes, frozenset(classes))
        return got[1]

    def _send_time(self, pairs: tuple[tuple[int, ...], ...], nbytes: float) -> float:
        flows: list[list[Flow]] = []
        for src, dst in pairs:
            route = self.cluster.route(src, dst)
            flows.append([(route.latency_s, route.links, nbytes)])
        return replicas_makespan_s(flows, self.cluster.link_bandwidth_Bps)

    def _collective_time(self, op: str, groups: tuple[tuple[int, ...], ...],
                         nbytes: float) -> float:
        """Launch latency + makespan of every group's plan, started together.

        Plans whose transfers do not depend on each other (streamed rings,
        NVLS, ...) are timed by the pure flow loop; others (trees, step
        granularity, hierarchical) by the event engine on a program holding
        just these collectives.
        """
        live = [g for g in groups if len(g) > 1]
        if not live:
            return 0.0
        c = self.cluster
        if self.share_plans:
            parts = self._plan_parts(op, live, nbytes)
            if all(not step.deps for p, _ in parts for step in p.transfers):
                return self._flows_time(parts)
        else:  # the reference (every group planned, its plan's flows built as written)
            plans = self.plans(op, live, nbytes)
            if all(not step.deps for p in plans for step in p.transfers):
                return self._flows_time_reference(plans)
        b = ProgramBuilder()
        for group in live:
            b.collective(group, {}, kind="dp", name=op, op=op, nbytes=nbytes, algo=self.algo,
                         skew=self.skew)
        n = c.num_gpus
        program = Program(n, b.build(), (0.0,) * n, gpipe(1, 1))
        self.simulations += 1
        return simulate_program(program, c, lambda _op: 0.0).end_s

    def _flows_time_reference(self, plans: list[CollectivePlan]) -> float:
        """:meth:`_flows_time` as first written: each plan's transfers, their starts by
        :func:`sim.selection.step_latency_s`."""
        c = self.cluster
        launches = {p.launch_s for p in plans}
        if len(launches) == 1:
            flows = [[(step_latency_s(c, step), c.route(step.src, step.dst).links,
                       step.nbytes) for step in p.transfers] for p in plans]
            return launches.pop() + replicas_makespan_s(flows, c.link_bandwidth_Bps)
        # groups launched after different latencies (protocols): each flow from its own
        flows = [[(p.launch_s + step_latency_s(c, step), c.route(step.src, step.dst).links,
                   step.nbytes) for step in p.transfers] for p in plans]
        return replicas_makespan_s(flows, c.link_bandwidth_Bps)

    def _flows_time(self, parts: list[tuple[CollectivePlan, dict[int, int] | None]]) -> float:
        """The flow-loop branch of :meth:`_collective_time` on :meth:`_plan_parts`'s plans,
        a relabelled plan's transfers read through its map instead of built, each step's
        route looked up once: the same flows, so the same float (the branch's reference is
        the timer with ``share_plans=False``, ``tests/test_network_alone.py``). A flow
        starts at :func:`sim.selection.step_latency_s` (after its group's launch where the
        launches differ), with the same operations in the same order."""
        c = self.cluster
        route, step_s = c.route, c.collective_step_s
        launches = {p.launch_s for p, _ in parts}
        single = len(launches) == 1
        flows = []
        for p, to in parts:
            group: list[Flow] = []
            launch = p.launch_s
            for t in p.transfers:
                r = route(t.src, t.dst) if to is None else route(to[t.src], to[t.dst])  # type: ignore[index]
                hops = t.steps * r.latency_s if t.latency_s is None else t.latency_s
                start = hops + t.steps * step_s
                group.append((start if single else launch + start, r.links, t.nbytes))
            flows.append(group)
        if single:
            return launches.pop() + replicas_makespan_s(flows, c.link_bandwidth_Bps)
        # groups launched after different latencies (protocols): each flow from its own
        return replicas_makespan_s(flows, c.link_bandwidth_Bps)

    def plans(self, op: str, live: list[tuple[int, ...]], nbytes: float
              ) -> list[CollectivePlan]:
        """The plan of ``op`` of ``nbytes`` over each group of ``live``: :meth:`_plan_parts`',
        the relabelled ones built (see there); full fidelity's engine shares them too
        (:meth:`sim.engine._Run._plan_for`)."""
        return [plan if to is None else CollectivePlan(
                    tuple([Transfer(to[t.src], to[t.dst], t.nbytes, t.deps, t.steps,  # type: ignore[index]
                                    t.latency_s) for t in plan.transfers]),
                    plan.launch_s, plan.algo, plan.protocol)
                for plan, to in self._plan_parts(op, live, nbytes)]

    def _plan_parts(self, op: str, live: list[tuple[int, ...]], nbytes: float
                    ) -> list[tuple[CollectivePlan, dict[int, int] | None]]:
        """:func:`sim.selection.collective_plan` of each group, a group of a class planned
        before taking that plan relabelled (where the servers' GPUs are interchangeable).

        Two groups are of one class (:meth:`_class_of`) when their members sit on servers
        in the same pattern: the same positions of the group on one server, on servers of
        the same twin classes (:meth:`topologies.cluster.Cluster.host_classes`), each of
        whose GPUs are interchangeable (:meth:`~topologies.cluster.Cluster.
        locals_interchangeable`). Then the map of the first group onto the second,
        position by position, extends to an automorphism ``phi`` of the cluster graph: a
        permutation of twin servers (the one-to-one map of the first group's servers onto
        the second's, completed within classes) after permutations of GPUs inside
        servers (completing the map of each server's members), the fabric fixed; it
        preserves every link's bandwidth and latency and the node attributes selection
        reads (kind, NVLS, NICs' transport, site). Where every route the first group's
        plan consulted (its profile, the estimates of the candidates, the plan) is the
        only shortest path between its ends, ``phi`` maps each onto the route between
        the images, link by link, with the same latencies summed in the same order, so
        the second group's profile (latencies, bottlenecks, members per server, NVLS
        capability), estimates, choice of algorithm and protocol, and plan are the
        first's with ranks mapped: the plan code reads ranks only through routes, servers
        (equality) and positions in the group. Plans with a switch as an endpoint (NVLS)
        are not shared (the switch's name would need mapping too). ``tests/
        test_commtime_classes.py`` holds the shared plans to ``collective_plan``'s.
        Each plan comes with None, or the map of the class's first group onto the group
        whose plan it is, relabelled by that map (:meth:`plans` builds it).
        """
        c = self.cluster
        if not self.share_plans or c.host_classes() is None:
            return [(collective_plan(c, op, self.algo, g, nbytes, self._profiles, self.skew),
                     None) for g in live]
        out = []
        for g in live:
            key = self._class_of(g)
            hit = self._class_plans.get((op, nbytes, key)) if key is not None else None
            if hit is not None:
                first, plan = hit
                out.append((plan, dict(zip(first, g, strict=True))))
                self.shared_plans += 1
                continue
            if key is None:
                out.append((collective_plan(c, op, self.algo, g, nbytes, self._profiles,
                                            self.skew), None))
                continue
            known = g in self._profiles
            log: list[tuple[int | str, int | str]] = []
            outer, c.route_log = c.route_log, log
            try:
                plan = collective_plan(c, op, self.algo, g, nbytes, self._profiles, self.skew)
            finally:
                c.route_log = outer
            if outer is not None:
                outer.extend(log)
            out.append((plan, None))
            members = set(g)
            seen = list(dict.fromkeys(log))
            if ((not known or self._unique_profiles.get(g) is True)
                    and all(t.src in members and t.dst in members for t in plan.transfers)
                    and all(map(c.route_is_unique, *zip(*seen, strict=True)) if seen else ())):
                self._class_plans[(op, nbytes, key)] = (g, plan)
        return out

    def _class_of(self, group: tuple[int, ...]) -> tuple | None:
        """``(each member's server as numbered in order of first appearance, those servers'
        twin classes)``: equal for groups one cluster automorphism maps onto each other
        position by position (:meth:`plans`); None where a server's GPUs are not
        interchangeable."""
        c = self.cluster
        gpn = c.gpus_per_node
        classes = c.host_classes()
        assert classes is not None
        order: dict[int, int] = {}
        pos = []
        for r in group:
            h = r // gpn
            k = order.get(h)
            if k is None:
                k = order[h] = len(order)
            pos.append(k)
        free = c.locals_interchangeable
        if not all(map(free, order)):
            return None
        return tuple(pos), tuple([classes[h] for h in order])
