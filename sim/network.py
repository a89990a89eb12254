"""Flow-level network state: max-min fair sharing of link bandwidth. Pure (no SimPy).

The engine owns time; it tells this object when flows start and asks when the
next one ends. Each flow crosses a set of links; concurrent flows share each
link's bandwidth max-min fairly (progressive filling, Bertsekas & Gallager,
*Data Networks*, 2nd ed., sec. 6.5.2), and rates are recomputed whenever a flow
starts or ends, a link's bandwidth changes (:meth:`FlowNetwork.set_capacity`), or
flows move to other links (:meth:`FlowNetwork.reroute`, around a failed link).
Latency is not modelled here: the engine delays a flow's start by its route
latency.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

_REL_EPS = 1e-12


@dataclass(slots=True)
class _Flow:
    links: tuple[int, ...]
    remaining_bytes: float
    """Bytes left at :attr:`since_s` (the flow moves at :attr:`rate_Bps` from then on)."""
    finite: tuple[int, ...] = ()
    """The links of finite capacity (the only ones that constrain or couple flows)."""
    rate_Bps: float = 0.0
    end_s: float = math.inf
    nbytes: float = 0.0
    """Bytes its links are credited with when it ends (all of them, or, after a
    :meth:`FlowNetwork.reroute`, those left then)."""
    since_s: float = 0.0
    """When the flow last changed rate (or started)."""


def _bytes_left(flow: _Flow, now: float) -> float:
    """Bytes ``flow`` has left at ``now``, moving at its rate since it last changed."""
    rate = flow.rate_Bps
    if rate == math.inf:
        return 0.0
    if rate > 0:
        return flow.remaining_bytes - min(flow.remaining_bytes, rate * (now - flow.since_s))
    return flow.remaining_bytes


def max_min_rates(
    flows: dict[int, tuple[int, ...]], capacity_Bps: Sequence[float]
) -> dict[int, float]:
    """Max-min fair rates for flows given by the links they cross.

    Progressive filling: repeatedly find the link whose remaining capacity split
    equally among its unfrozen flows is smallest, freeze those flows at that
    share, and remove their share from every link they cross. Flows that cross
    only infinite-capacity links (or none) get an infinite rate.
    """
    return _filled({fid: tuple([link for link in links if math.isfinite(capacity_Bps[link])])
                    for fid, links in flows.items()}, capacity_Bps)


def _filled(flows: dict[int, tuple[int, ...]], capacity_Bps: Sequence[float]
            ) -> dict[int, float]:
    """:func:`max_min_rates` of flows given by the finite-capacity links they cross."""
    rates: dict[int, float] = {}
    users: dict[int, list[int]] = {}
    for fid, links in flows.items():
        for link in links:
            on = users.get(link)
            if on is None:
                users[link] = [fid]
            else:
                on.append(fid)
    if not users:
        return dict.fromkeys(flows, math.inf)
    # the first round of filling, on its own: it often freezes every flow (all bottlenecked
    # at one share), and then the rates are its share, as the full loop below would give
    ratio = {link: float(capacity_Bps[link]) / len(fids) for link, fids in users.items()}
    share = min(ratio.values())
    within = share * (1 + _REL_EPS)
    first: dict[int, float] = {}
    for link, r in ratio.items():
        if r <= within:
            for fid in users[link]:
                first[fid] = share
    if len(first) == len(flows) or (len(first) < len(flows) and all(
            fid in first or not flows[fid] for fid in flows)):  # no finite link: not in users
        for fid in flows:
            first.setdefault(fid, math.inf)
        return first
    remaining = {link: float(capacity_Bps[link]) for link in users}
    count = {link: len(fids) for link, fids in users.items()}
    while count:
        ratio = {link: remaining[link] / n for link, n in count.items()}
        share = min(ratio.values())
        within = share * (1 + _REL_EPS)
        bottlenecks = [link for link, r in ratio.items() if r <= within]
        for link in bottlenecks:
            for fid in users[link]:
                if fid in rates:
                    continue
                rates[fid] = share
                for other in flows[fid]:
                    if other in count:
                        remaining[other] = max(0.0, remaining[other] - share)
                        count[other] -= 1
                        if count[other] == 0:
                            del count[other]
    for fid in flows:
        rates.setdefault(fid, math.inf)
    return rates


def _alone(flows: dict[int, tuple[int, ...]], capacity_Bps: Sequence[float]
           ) -> dict[int, float]:
    """:func:`_filled` of flows that share no link (each finite link crosses one of them):
    the same rates, without the per-link tables. Alone on its links, a flow's
    bottleneck ratio is its smallest capacity, and the filling's rounds take those in
    increasing order: a round's share is the smallest left, and every flow whose smallest
    lies within the tie tolerance of it freezes at it."""
    smallest: dict[int, float] = {}
    for fid, links in flows.items():
        if len(links) > 1 and len(set(links)) < len(links):  # a link twice: it shares
            return _filled(flows, capacity_Bps)
        least = math.inf
        for link in links:
            c = float(capacity_Bps[link])
            if c < least:
                least = c
        smallest[fid] = least
    share_of = _shares(smallest.values())
    return {fid: share_of[least] for fid, least in smallest.items()}


class FlowNetwork:
    """Active flows and their max-min fair rates over time.

    Max-min rates are separable: flows that share no link (directly or through
    a chain of flows) do not affect each other's rates. A start or an end
    therefore re-rates only the connected component of flows and links it
    touches; every other flow keeps its rate, and with it its end time. A
    flow's bytes are therefore settled only when its rate changes (bytes left
    at the change, then a constant rate), and end times wait in a heap, so an
    event costs the size of the component it touches, not the number of
    active flows. The result equals a global recomputation at every event up
    to rounding (one multiply-subtract per rate change instead of one per
    event), unless two components' bottleneck shares lie within the 1e-12 tie
    tolerance of :func:`max_min_rates`, where the global loop would freeze
    both at the smaller.
    """

    def __init__(self, capacity_Bps: Sequence[float]) -> None:
        self.capacity_Bps = tuple(capacity_Bps)
        self._flows: dict[int, _Flow] = {}
        self._finite: dict[tuple[int, ...], tuple[int, ...]] = {}
        """Per route (links), its finite-capacity links, worked out once."""
        self._on_link: dict[int, dict[int, None]] = {}
        """Active flows crossing each finite-capacity link (insertion-ordered sets)."""
        self._touched: list[int] = []
        """Flows started, and finite links of flows ended, since the last re-rating."""
        self._touched_links: list[int] = []
        self._now = 0.0
        self._dirty = False
        self._shared = False
        """Whether the last component (:meth:`_component`) had a link carrying two flows or
        more: re-rated by :func:`_filled`, else by :func:`_alone`."""
        self._ends: list[tuple[float, int, list[int]]] = []
        """(end time, first flow id, flow ids) of every active flow: the flows one
        re-rating gave the same end, one after another, share an entry; a flow that ended or
        changed rate since is stale there and skipped (lazy deletion)."""
        self.bytes_on_link: dict[int, float] = {}
        """Bytes carried by each link (index) by the flows that have ended; absent: none."""
        self.recomputations = 0
        """How many times max-min rates were recomputed (for a component)."""
        self.rerated_flows = 0
        """Flows whose rate was recomputed, summed over recomputations."""

    @property
    def active(self) -> int:
        return len(self._flows)

    def _advance(self, now: float) -> None:
        self._now = now

    def _component(self) -> dict[int, tuple[int, ...]]:
        """The flows whose max-min rates may have changed: every flow connected, through
        shared finite links, to a flow started or ended since the last re-rating; each with
        its finite-capacity links. :attr:`_shared`: whether a link of them carries more
        than one."""
        flows, on_link = self._flows, self._on_link
        comp: dict[int, tuple[int, ...]] = {}
        seen_links: set[int] = set()
        shared = False
        stack = list(self._touched_links)
        for fid in self._touched:
            flow = flows.get(fid)
            if flow is not None and fid not in comp:
                comp[fid] = flow.finite
                stack.extend(flow.finite)
        # links already seen when pushed are skipped when popped: the same visiting order
        # as filtering them out at the push
        while stack:
            link = stack.pop()
            if link in seen_links:
                continue
            seen_links.add(link)
            users = on_link.get(link, ())
            if len(users) > 1:
                shared = True
            for fid in users:
                if fid not in comp:
                    finite = comp[fid] = flows[fid].finite
                    stack.extend(finite)
        self._touched.clear()
        self._touched_links.clear()
        self._shared = shared
        return comp

    def _rerate(self, now: float) -> None:
        """Re-rate the touched component; a flow whose rate changes settles the bytes it
        moved at its old rate up to ``now`` and gets a new end time."""
        comp = self._component()
        rates = ((_filled if self._shared else _alone)(comp, self.capacity_Bps) if comp
                 else {})
        self.recomputations += 1
        self.rerated_flows += len(comp)
        self._now = now
        flows, ends, push, inf = self._flows, self._ends, heapq.heappush, math.inf
        group: list[int] = []
        at = None  # the end of the flows in group, the latest entry
        for fid, rate in rates.items():
            flow = flows[fid]
            old = flow.rate_Bps
            if rate == old:
                continue  # same rate from the same bytes: the same end time
            # _bytes_left, inline (once per re-rated flow)
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
            if end == at:  # another flow of the latest entry's end: one entry (a TP ring's)
                group.append(fid)
            else:
                group, at = [fid], end
                push(ends, (end, fid, group))

    def start(self, now: float, flow_id: int, links: tuple[int, ...], nbytes: float) -> None:
        """A flow of ``nbytes`` over ``links`` begins transmitting at ``now``.

        Rates are not recomputed until :meth:`refresh`, so that many flows
        starting at the same instant (one step of a collective) cost one
        recomputation. Until then the new flow moves no bytes; as no simulated
        time passes before the refresh, the result is exact.
        """
        self._now = now
        finite = self._finite.get(links)
        if finite is None:
            cap = self.capacity_Bps
            finite = self._finite[links] = tuple([link for link in links if cap[link] < math.inf])
        nbytes = float(nbytes)
        self._flows[flow_id] = _Flow(links, nbytes, finite, 0.0, math.inf, nbytes, now)
        self._attach(flow_id, finite)
        self._dirty = True

    def _attach(self, fid: int, finite: tuple[int, ...]) -> None:
        """Flow ``fid`` now crosses the finite links ``finite``; re-rate it."""
        on_link = self._on_link
        for link in finite:
            users = on_link.get(link)
            if users is None:
                on_link[link] = {fid: None}
            else:
                users[fid] = None
        self._touched.append(fid)

    def _detach(self, fid: int, finite: tuple[int, ...]) -> None:
        """Flow ``fid`` no longer crosses ``finite``; re-rate the flows left on them."""
        on_link, touched = self._on_link, self._touched_links
        for link in finite:
            users = on_link.get(link)
            if users is None or fid not in users:
                continue  # a link the route crosses twice: left at its first crossing
            del users[fid]
            if not users:
                del on_link[link]
            touched.append(link)

    def refresh(self, now: float) -> None:
        """Recompute max-min rates if flows started since the last recomputation."""
        if self._dirty:
            self._rerate(now)
            self._dirty = False

    def next_end_s(self) -> float:
        """Time the earliest active flow ends at current rates (inf if none)."""
        ends, flows = self._ends, self._flows
        while ends:
            end, _, group = ends[0]
            for fid in group:
                flow = flows.get(fid)
                if flow is not None and flow.end_s == end:
                    return end
            heapq.heappop(ends)  # stale: its flows ended or changed rate
        return math.inf

    def set_capacity(self, now: float, capacity_Bps: Mapping[int, float]) -> None:
        """From ``now`` on, links (by index) carry the given bandwidths: a link degraded (or
        restored) in the middle of transfers.

        Every flow moves its bytes at its old rate up to ``now``; then the flows crossing
        a changed link, and every flow sharing links with them, are re-rated, exactly as
        if they had all started at ``now`` with the bytes they have left. A failed link
        (bandwidth 0) is not a capacity: its flows must be rerouted, so it is refused, as
        is a change to or from an infinite (unconstrained) link.
        """
        cap = list(self.capacity_Bps)
        for link, bps in capacity_Bps.items():
            if not (0 < bps < math.inf and math.isfinite(cap[link])):
                raise ValueError(f"link {link}: bandwidth {cap[link]} -> {bps} B/s; only a "
                                 "finite, positive bandwidth can change to another")
            cap[link] = float(bps)
            self._touched_links.append(link)
        self.capacity_Bps = tuple(cap)
        self._dirty = True
        self.refresh(now)

    def crossing(self, links: Iterable[int]) -> list[int]:
        """The active flows (ids, sorted) that cross any of ``links`` (finite or not)."""
        wanted = set(links)
        return sorted([fid for fid, flow in self._flows.items()
                       if not wanted.isdisjoint(flow.links)])

    def reroute(self, now: float, new_links: Mapping[int, tuple[int, ...]]) -> None:
        """From ``now`` on, flows (by id) cross new links: moved off a failed link in the
        middle of their transfer.

        Each flow keeps the bytes it has left at ``now`` (moved at its old rate until
        then); the links it leaves and the links it joins are re-rated with every flow
        sharing them, exactly as if the moved flows had started at ``now`` on their new
        links with the bytes they have left. The bytes already moved count as carried by
        the old links (:attr:`bytes_on_link`), the rest by the new ones.
        """
        cap, flows = self.capacity_Bps, self._flows
        carried = self.bytes_on_link
        for fid, links in new_links.items():
            flow = flows[fid]
            left = _bytes_left(flow, now)
            moved = flow.nbytes - left
            for link in flow.links:
                carried[link] = carried.get(link, 0.0) + moved
            flow.nbytes = left
            self._detach(fid, flow.finite)
            finite = tuple([link for link in links if cap[link] < math.inf])
            flow.links, flow.finite = links, finite
            self._attach(fid, finite)
        self._dirty = True
        self.refresh(now)

    def finish_due(self, now: float) -> list[int]:
        """Remove and return (sorted) the flows that have ended by ``now``; re-rate the rest."""
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
        carried, on_link, touched = self.bytes_on_link, self._on_link, self._touched_links
        for fid in done:
            flow = flows.pop(fid)
            nbytes = flow.nbytes
            for link in flow.links:
                carried[link] = carried.get(link, 0.0) + nbytes
            for link in flow.finite:  # _detach, inline (once per flow)
                users = on_link.get(link)
                if users is None or fid not in users:
                    continue  # a link the route crosses twice: left at its first crossing
                del users[fid]
                if users:  # a link left without flows has none to re-rate
                    touched.append(link)
                else:
                    del on_link[link]
        if done or self._dirty:
            self._rerate(now)
            self._dirty = False
        else:
            self._advance(now)
        return done


def makespan_alone_s(
    flows: Sequence[tuple[float, tuple[int, ...], float]], capacity_Bps: Sequence[float]
) -> float | None:
    """:func:`makespan_s` of ``flows`` where no finite-capacity link carries two of them (nor
    one twice), without the flow network; None where one does (then time them by
    :func:`makespan_s`).

    Alone on its links, a flow is rated once, when it starts, and keeps its rate: it
    touches no other flow, so no start or end re-rates it (:meth:`FlowNetwork._component`
    holds the flows started at one instant, each on its own links, and an ended flow leaves
    no flow on its links). Its rate is then :func:`_alone`'s over the flows started at its
    instant (its smallest capacity, or a smaller one of that instant within the tie
    tolerance; infinite on no finite link), and it ends at ``start + nbytes / rate`` (its
    start where the rate is infinite), the very operations :meth:`FlowNetwork._rerate`
    does. The makespan is the last instant :func:`makespan_s`'s loop reaches: the latest
    start, or the latest end ``last``. The loop's end events happen at end times (the
    earliest left), each finishing every end within :data:`_REL_EPS` of it, so ``last``
    is an event's instant unless some earlier end ``e`` has ``last <= e + |e| * eps`` (an
    event at ``e`` could finish it); then :func:`_alone_replay` replays the loop on the end
    times. Capacities that are not positive, and starts or sizes that are not finite, fall
    back (the flow network never ends such a flow). ``tests/test_network_alone.py`` holds
    it, and the replay, to :func:`makespan_s`.
    """
    inf = math.inf
    seen: set[int] = set()
    smallest: list[float | None] = []  # per flow (None: never started)
    for _, links, nbytes in flows:
        if not (nbytes > 0 and links):
            smallest.append(None)
            continue
        least = inf
        for link in links:
            c = capacity_Bps[link]
            if c < inf:  # a finite link (FlowNetwork.start's test)
                if link in seen:
                    return None
                seen.add(link)
                c = float(c)
                if not c > 0:
                    return None
                if c < least:
                    least = c
        smallest.append(least)
    # each flow's end, its start batch's shares; the loop's last instant is the latest
    # start or the latest end, unless an earlier end's event could finish the latest
    # (within the tie tolerance of it): then the loop decides
    batches: dict[float, list[int]] = {}
    top = 0.0  # end = max(end, now) over the starts, in the loop's order
    for i, (start, _, nbytes) in enumerate(flows):
        if not (-inf < start < inf and -inf < nbytes < inf):
            return None  # the flow network's loop never ends on these: not this one's
        if start > top:
            top = start
        if smallest[i] is not None:
            got = batches.get(start)
            if got is None:
                batches[start] = [i]
            else:
                got.append(i)
    ends: list[float] = []
    for now, batch in batches.items():
        share_of = _shares([smallest[i] for i in batch])  # type: ignore[misc]
        for i in batch:
            rate = share_of[smallest[i]]  # type: ignore[index]
            ends.append(now if rate == inf else now + float(flows[i][2]) / rate)
    if ends:
        last = max(ends)
        for e in ends:
            if e < last and last <= e + abs(e) * _REL_EPS:
                return _alone_replay(flows, smallest)
        if last > top:
            top = last
    return top


def _alone_replay(flows: Sequence[tuple[float, tuple[int, ...], float]],
                  smallest: list[float | None]) -> float:
    """:func:`makespan_s`'s event loop on the end times of :func:`makespan_alone_s`'s flows
    (``smallest``: each one's smallest finite capacity, None where it never starts)."""
    inf = math.inf
    pending = sorted((start, i) for i, (start, _, _) in enumerate(flows))
    ends: list[float] = []
    push, pop = heapq.heappush, heapq.heappop
    n, k, end = len(pending), 0, 0.0
    while k < n or ends:
        t_start = pending[k][0] if k < n else inf
        t_end = ends[0] if ends else inf
        if t_start <= t_end:
            now = t_start
            batch: list[int] = []
            while k < n and pending[k][0] <= now:
                i = pending[k][1]
                if smallest[i] is not None:
                    batch.append(i)
                if now > end:  # end = max(end, now)
                    end = now
                k += 1
            if batch:
                share_of = _shares([smallest[i] for i in batch])  # type: ignore[misc]
                for i in batch:
                    rate = share_of[smallest[i]]  # type: ignore[index]
                    push(ends, now if rate == inf else now + float(flows[i][2]) / rate)
        else:
            now = t_end
            limit = now + abs(now) * _REL_EPS
            while ends and ends[0] <= limit:
                pop(ends)
            if now > end:
                end = now
    return end


def _shares(smallest: Iterable[float]) -> dict[float, float]:
    """Per smallest capacity of a lone flow's route, its max-min share, as :func:`_alone`
    rates the flows it meets at once: capacities within the tie tolerance of a round's share
    take it; a flow on no finite link (inf) keeps inf."""
    values = sorted(set(smallest))
    share_of = {math.inf: math.inf}
    k = 0
    while k < len(values) and values[k] < math.inf:
        share = values[k]
        within = share * (1 + _REL_EPS)
        while k < len(values) and values[k] <= within:
            share_of[values[k]] = share
            k += 1
    return share_of


def makespan_s(
    flows: Sequence[tuple[float, tuple[int, ...], float]], capacity_Bps: Sequence[float]
) -> float:
    """When the last of ``flows`` ends if each ``(start_s, links, nbytes)`` starts at start_s.

    A pure event loop over :class:`FlowNetwork` (no SimPy), for timing one
    step of a collective in isolation.
    """
    net = FlowNetwork(capacity_Bps)
    pending = sorted((start, i) for i, (start, _, _) in enumerate(flows))
    now, k, end = 0.0, 0, 0.0
    while k < len(pending) or net.active:
        t_start = pending[k][0] if k < len(pending) else math.inf
        t_end = net.next_end_s()
        if t_start <= t_end:
            now = t_start
            while k < len(pending) and pending[k][0] <= now:
                _, i = pending[k]
                _, links, nbytes = flows[i]
                if nbytes > 0 and links:
                    net.start(now, i, links, nbytes)
                end = max(end, now)
                k += 1
            net.refresh(now)
        else:
            now = t_end
            if net.finish_due(now):
                end = max(end, now)
    return end
