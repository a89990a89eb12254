"""The flow network's fast path: :class:`FastFlowNetwork`, the same rates, end times and bytes
as :class:`sim.network.FlowNetwork` (its reference) with less Python work per flow.

A full-fidelity step starts hundreds of thousands of flows, most of them in batches at one
instant (the same step of the collectives of every replica) and most of them alone on their
links (a TP collective's flows inside a server). For such a batch the reference walks the
links of every flow to find the component to re-rate, checks every route for a link crossed
twice and looks up every link's capacity; here:

- a start notes whether the flow joined a link another flow already crosses; while no flow
  joined one and no ended flow left others behind on a link, the component to re-rate is
  exactly the flows started (each alone on its links: re-rated as :func:`_alone` does), and
  the walk is skipped;
- per route (its finite links), whether it crosses a link twice and its smallest capacity,
  worked out once (again after a change of capacity);
- a flow is made without the dataclass's ``__init__`` call, attached inline.

Everything else (the component walk where flows share links, :func:`_filled`, the heap of
end times, finishing, capacity changes, reroutes) is the reference's code. The engine runs
this one on its own heap and the reference on SimPy's queue;
``tests/test_fastnet.py`` drives both with the same random starts, ends, capacity changes
and reroutes and asserts the same rates, end times and bytes, bit for bit.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from sim.network import _REL_EPS, FlowNetwork, _filled, _shares

_new_flow = object.__new__


class FastFlowNetwork(FlowNetwork):
    """:class:`FlowNetwork` with a faster start, component and re-rating of lone flows (see
    the module)."""

    def __init__(self, capacity_Bps: tuple[float, ...] | list[float]) -> None:
        super().__init__(capacity_Bps)
        self._joined = False
        """Whether a flow started since the last re-rating joined a link other flows cross."""
        self._carried_links: list[tuple[int, ...]] = []
        self._carried_bytes: list[float] = []
        """The finished flows' links and bytes, in the order they finished (a bundle's flows'
        links in turn, one entry): the additions to :attr:`bytes_on_link` not yet made."""
        self.bytes_on_link = defaultdict(float)
        self._least: dict[tuple[int, ...], float | None] = {}
        """Per route's finite links, its smallest capacity; None: it crosses a link twice."""
        self._shapes: dict[int, tuple] = {}
        """Per bundle's routes (by the tuple's id, the tuple kept beside: an id is not reused
        while it lives), the routes and what :meth:`start_bundle` reads (:meth:`_shape`)."""
        self._bundles: dict[int, _Bundle] = {}
        """Active bundles (:meth:`start_bundle`) by their first flow's id."""
        self._held: set[int] = set()
        """The finite links the active bundles cross, each by one bundle alone: held here, not
        in ``_on_link``, until a flow joins one of them (then every bundle becomes its flows,
        :meth:`_split`, which lists them there)."""
        self.on_split: Callable[[int], None] | None = None
        """Called with a bundle's first flow id when it becomes its flows (:meth:`_split`)."""
        self._finished_sizes: dict[int, int] = {}
        """The bundles the last :meth:`finish_due_items` finished: first id -> flows."""

    @property
    def bytes_on_link(self) -> dict[int, float]:
        """:attr:`FlowNetwork.bytes_on_link`: the additions the finished flows logged
        (:meth:`finish_due_items`) made when it is read (:meth:`_add_carried`)."""
        if self._carried_links:
            self._add_carried()
        return self._carried

    @bytes_on_link.setter
    def bytes_on_link(self, value: dict[int, float]) -> None:
        self._carried = value

    def _add_carried(self) -> None:
        """Add the logged flows' bytes to each link they crossed, as finishing them added them
        one link at a time: per link, the same additions in the same order from the same
        value (``np.add.at`` adds in the order of its indices), the links new to the dict
        added to it in the order of their first addition (a link's first addition is in the
        first entry crossing it: the first of the distinct routes, in the order they first
        finished, that crosses it). One pass on arrays instead of a dictionary addition per
        link and flow (millions at 4,096 GPUs, each a cache miss and a float made)."""
        links, sizes, carried = self._carried_links, self._carried_bytes, self._carried
        distinct = {id(route): route for route in links}  # in the order they first appear
        order = dict.fromkeys(link for route in distinct.values() for link in route)
        if not order:  # no link crossed
            links.clear()
            sizes.clear()
            return
        arrays = {key: np.asarray(route, dtype=np.int64) for key, route in distinct.items()}
        index = np.concatenate([arrays[id(route)] for route in links])
        lengths = np.fromiter(map(len, links), dtype=np.int64, count=len(links))
        added = np.repeat(np.asarray(sizes, dtype=np.float64), lengths)
        total = np.zeros(max(order) + 1)
        for link in order:
            value = carried.get(link)
            if value is not None:
                total[link] = value
        np.add.at(total, index, added)
        for link in order:  # a link in the dict keeps its place, a new one goes last
            carried[link] = float(total[link])
        links.clear()
        sizes.clear()

    def settle(self) -> None:
        """Make the logged additions to :attr:`bytes_on_link` now (the engine, at the end of
        its loop: the log's memory freed before the statistics' summaries)."""
        if self._carried_links:
            self._add_carried()

    @property
    def active(self) -> int:
        return len(self._flows) + sum([len(b.routes) - 1 for b in self._bundles.values()])

    def start(self, now: float, flow_id: int, links: tuple[int, ...], nbytes: float) -> None:
        self._now = now
        least_of = self._least
        finite = self._finite.get(links)
        if finite is None:
            cap = self.capacity_Bps
            finite = self._finite[links] = tuple([link for link in links if cap[link] < math.inf])
        if self._held and not self._held.isdisjoint(finite):
            self._split()  # it joins a bundle's link: the flows, as the re-rating would make
        least = least_of.get(finite, -1.0)
        if least == -1.0:
            least = least_of[finite] = _least(finite, self.capacity_Bps)
        nbytes = float(nbytes)
        flow = _new_flow(_FastFlow)
        flow.links = links
        flow.remaining_bytes = nbytes
        flow.finite = finite
        flow.rate_Bps = 0.0
        flow.end_s = math.inf
        flow.nbytes = nbytes
        flow.since_s = now
        flow.least = least
        self._flows[flow_id] = flow
        on_link = self._on_link
        for link in finite:  # _attach, inline
            users = on_link.get(link)
            if users is None:
                on_link[link] = {flow_id: None}
            else:
                users[flow_id] = None
                self._joined = True
        self._touched.append(flow_id)
        self._dirty = True

    def start_bundle(self, now: float, first_id: int, routes: tuple[tuple[int, ...], ...],
                     nbytes: float) -> bool:
        """Flows ``first_id``, ``first_id + 1``, ... of ``nbytes`` each over ``routes`` begin
        at ``now``, as one record, if their timing is provably that of one flow: each alone
        on its links (no finite link shared among them or with a flow in flight) with the
        same smallest capacity, so that each is re-rated to the same share from the same
        bytes, at the same instants, and ends at the same time. False (nothing started):
        they are not; start them one by one (:meth:`start`).

        The bundle stays one record while no other flow joins one of its links; before any
        re-rating that walks shared links, a capacity change, a reroute or a look at the
        flows crossing links, it becomes its flows (:meth:`_split`), each with the bundle's
        state: what starting them one by one would have made."""
        shape = self._shapes.get(id(routes))  # by the tuple's identity: no nested hashing
        if shape is None or shape[0] is not routes:
            shape = self._shapes[id(routes)] = (routes, self._shape(routes))
        if shape[1] is None:
            return False
        finites, used, flat, least = shape[1]
        held = self._held
        if not (self._on_link.keys().isdisjoint(used) and held.isdisjoint(used)):
            return False
        self._now = now
        nbytes = float(nbytes)
        flow = _new_flow(_Bundle)
        flow.links = routes[0]
        flow.remaining_bytes = nbytes
        flow.finite = finites[0]
        flow.rate_Bps = 0.0
        flow.end_s = math.inf
        flow.nbytes = nbytes
        flow.since_s = now
        flow.least = least
        flow.routes = routes
        flow.finites = finites
        flow.flat = flat
        flow.used = used
        self._flows[first_id] = self._bundles[first_id] = flow
        held.update(used)
        self._touched.append(first_id)
        self._dirty = True
        return True

    def _shape(self, routes: tuple[tuple[int, ...], ...]) -> tuple | None:
        """What :meth:`start_bundle` needs of ``routes``, worked out once per routes (again
        after a change of capacity): each one's finite links, all of them, all links in
        order, and their smallest capacity; None where no bundle can take them (a link
        shared among them, routes of different smallest capacities)."""
        cap, finite_of, least_of = self.capacity_Bps, self._finite, self._least
        finites = []
        used: list[int] = []
        least = -1.0
        for links in routes:
            finite = finite_of.get(links)
            if finite is None:
                finite = finite_of[links] = tuple([link for link in links if cap[link] < math.inf])
            share = least_of.get(finite, -1.0)
            if share == -1.0:
                share = least_of[finite] = _least(finite, cap)
            if share is None or (least != -1.0 and share != least):
                return None
            least = share
            used.extend(finite)
            finites.append(finite)
        if len(set(used)) < len(used):
            return None
        return tuple(finites), tuple(used), tuple(link for links in routes for link in links), least

    def _split(self) -> None:
        """Every bundle becomes its flows, each in the bundle's state, where starting them one
        by one would have put them (the flows, each link's users, the touched list and the
        heap of ends)."""
        bundles, flows, on_link, touched = self._bundles, self._flows, self._on_link, \
            self._touched
        for first_id, bundle in bundles.items():
            ids = list(range(first_id, first_id + len(bundle.routes)))
            for k, fid in enumerate(ids):
                flow = _new_flow(_FastFlow)
                flow.links = bundle.routes[k]
                flow.finite = finite = bundle.finites[k]
                flow.remaining_bytes = bundle.remaining_bytes
                flow.rate_Bps = bundle.rate_Bps
                flow.end_s = bundle.end_s
                flow.nbytes = bundle.nbytes
                flow.since_s = bundle.since_s
                flow.least = bundle.least
                flows[fid] = flow
                for link in finite:
                    on_link[link] = {fid: None}
            if bundle.end_s < math.inf:
                heapq.heappush(self._ends, (bundle.end_s, first_id, ids))
            if first_id in touched:
                at = touched.index(first_id)
                touched[at:at + 1] = ids
            if self.on_split is not None:
                self.on_split(first_id)
        bundles.clear()
        self._held.clear()

    def crossing(self, links: Iterable[int]) -> list[int]:
        self._split()
        return super().crossing(links)

    def _attach(self, fid: int, finite: tuple[int, ...]) -> None:
        self._joined = True  # a reroute: the walk finds its component
        super()._attach(fid, finite)

    def set_capacity(self, now: float, capacity_Bps: Mapping[int, float]) -> None:
        self._split()
        self._least.clear()
        self._shapes.clear()
        self._joined = True
        super().set_capacity(now, capacity_Bps)

    def reroute(self, now: float, new_links: Mapping[int, tuple[int, ...]]) -> None:
        self._split()
        super().reroute(now, new_links)
        for fid in new_links:
            flow = self._flows[fid]
            flow.least = _least(flow.finite, self.capacity_Bps)

    def _rerate(self, now: float) -> None:
        touched = self._touched
        if self._joined or self._touched_links or len(set(touched)) < len(touched):
            self._joined = False
            self._split()
            super()._rerate(now)
            return
        flows = self._flows
        comp = [(fid, flow) for fid in touched if (flow := flows.get(fid)) is not None]
        touched.clear()
        self._shared = False
        self.recomputations += 1
        self.rerated_flows += len(comp)
        if self._bundles:  # a bundle counts as its flows
            self.rerated_flows += sum([len(flow.routes) - 1 for _, flow in comp
                                       if type(flow) is _Bundle])
        self._now = now
        if not comp:
            return
        values = {flow.least for _, flow in comp}
        if None in values:  # a route crossing a link twice: it shares
            rates = _filled({fid: flow.finite for fid, flow in comp}, self.capacity_Bps)
            share_of = None
        elif len(values) == 1:  # every flow's smallest capacity the same: its share
            least = values.pop()
            share_of = {least: least}
        else:
            share_of = _shares(values)
        ends, push, inf = self._ends, heapq.heappush, math.inf
        group: list[int] = []
        at = None  # the end of the flows in group, the latest entry
        for fid, flow in comp:  # the reference's loop (FlowNetwork._rerate)
            rate = share_of[flow.least] if share_of is not None else rates[fid]
            old = flow.rate_Bps
            if rate == old:
                continue
            left = flow.remaining_bytes
            if old == inf:
                left = 0.0
            elif old > 0:
                left = left - min(left, old * (now - flow.since_s))
            flow.remaining_bytes = left
            flow.since_s = now
            flow.rate_Bps = rate
            if left <= 0 or rate == inf:
                end = flow.end_s = now
            else:
                end = flow.end_s = now + left / rate
            if end == at:
                group.append(fid)
            else:
                group, at = [fid], end
                push(ends, (end, fid, group))

    def finish_due(self, now: float) -> list[int]:
        """:meth:`FlowNetwork.finish_due`: the same flows (a bundle's all of them), bytes and
        re-rating (:meth:`finish_due_items`)."""
        done = self.finish_due_items(now)
        sizes = self._finished_sizes
        if not sizes:
            return done
        return [fid + k for fid in done for k in range(sizes.get(fid, 1))]

    def finish_due_items(self, now: float) -> list[int]:
        """:meth:`finish_due` with a bundle (:meth:`start_bundle`) as its first flow alone
        (the engine calls its one completion); the bytes each link carried logged, added in
        the same order when :attr:`bytes_on_link` is read (:meth:`_add_carried`)."""
        limit = now + abs(now) * _REL_EPS
        ends, flows = self._ends, self._flows
        due: set[int] = set()
        while ends and ends[0][0] <= limit:
            end, _, group = heapq.heappop(ends)
            for fid in group:
                flow = flows.get(fid)
                if flow is not None and flow.end_s == end:
                    due.add(fid)
        done = sorted(due)
        on_link, touched = self._on_link, self._touched_links
        log_links, log_bytes = self._carried_links.append, self._carried_bytes.append
        pop, bundles = flows.pop, self._bundles
        sizes: dict[int, int] = {}
        for fid in done:
            flow = pop(fid)
            nbytes = flow.nbytes
            if bundles and fid in bundles:  # its flows in turn, as finished one by one
                del bundles[fid]
                sizes[fid] = len(flow.routes)
                log_links(flow.flat)  # each flow's links in turn
                log_bytes(nbytes)
                self._held.difference_update(flow.used)  # none shares them (else split)
                continue
            log_links(flow.links)
            log_bytes(nbytes)
            for link in flow.finite:
                users = on_link.get(link)
                if users is None or fid not in users:
                    continue  # a link the route crosses twice: left at its first crossing
                del users[fid]
                if users:
                    touched.append(link)
                else:
                    del on_link[link]
        self._finished_sizes = sizes
        if done or self._dirty:
            self._rerate(now)
            self._dirty = False
        else:
            self._now = now
        return done

    def flows_by_id(self) -> dict[int, _FastFlow]:
        """The flows in flight by id, a bundle's each on its own (as :meth:`_split` makes
        them; the network is left as it is): what the reference holds."""
        saved = (dict(self._flows), {link: dict(users) for link, users in self._on_link.items()},
                 list(self._touched), list(self._ends), dict(self._bundles), set(self._held))
        self._split()
        flows = dict(self._flows)
        on_link = {link: list(users) for link, users in self._on_link.items()}
        self._flows, self._on_link, self._touched, self._ends, self._bundles, self._held = (
            saved[0], saved[1], saved[2], saved[3], saved[4], saved[5])
        heapq.heapify(self._ends)
        return flows, on_link  # type: ignore[return-value]


class _FastFlow:
    """A flow of :class:`FastFlowNetwork`: :class:`sim.network._Flow`'s fields, and the
    smallest capacity of its route (:func:`_least`)."""

    __slots__ = ("end_s", "finite", "least", "links", "nbytes", "rate_Bps", "remaining_bytes",
                 "since_s")


class _Bundle(_FastFlow):
    """Flows started as one (:meth:`FastFlowNetwork.start_bundle`): the state they share, and
    each one's links (``routes``) and finite links (``finites``), in id order."""

    __slots__ = ("finites", "flat", "routes", "used")


def _least(finite: tuple[int, ...], capacity_Bps: tuple[float, ...]) -> float | None:
    """The smallest capacity of a route's finite links (inf: none); None where it crosses a
    link twice (its flow shares that link with itself: :func:`sim.network._alone`)."""
    if len(finite) > 1 and len(set(finite)) < len(finite):
        return None
    least = math.inf
    for link in finite:
        c = float(capacity_Bps[link])
        if c < least:
            least = c
    return least
