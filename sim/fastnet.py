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
from collections.abc import Mapping

from sim.network import _REL_EPS, FlowNetwork, _filled, _Flow

_new_flow = _Flow.__new__


class FastFlowNetwork(FlowNetwork):
    """:class:`FlowNetwork` with a faster start, component and re-rating of lone flows (see
    the module)."""

    def __init__(self, capacity_Bps: tuple[float, ...] | list[float]) -> None:
        super().__init__(capacity_Bps)
        self._joined = False
        """Whether a flow started since the last re-rating joined a link other flows cross."""
        self._least: dict[tuple[int, ...], float | None] = {}
        """Per route's finite links, its smallest capacity; None: it crosses a link twice."""

    def start(self, now: float, flow_id: int, links: tuple[int, ...], nbytes: float) -> None:
        self._now = now
        finite = self._finite.get(links)
        if finite is None:
            cap = self.capacity_Bps
            finite = self._finite[links] = tuple([link for link in links if cap[link] < math.inf])
        nbytes = float(nbytes)
        flow = _new_flow(_Flow)
        flow.links = links
        flow.remaining_bytes = nbytes
        flow.finite = finite
        flow.rate_Bps = 0.0
        flow.end_s = math.inf
        flow.nbytes = nbytes
        flow.since_s = now
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

    def _attach(self, fid: int, finite: tuple[int, ...]) -> None:
        self._joined = True  # a reroute: the walk finds its component
        super()._attach(fid, finite)

    def set_capacity(self, now: float, capacity_Bps: Mapping[int, float]) -> None:
        self._least.clear()
        self._joined = True
        super().set_capacity(now, capacity_Bps)

    def _rerate(self, now: float) -> None:
        if self._joined or self._touched_links:
            self._joined = False
            super()._rerate(now)
            return
        flows = self._flows
        comp: dict[int, _Flow] = {}
        for fid in self._touched:
            flow = flows.get(fid)
            if flow is not None:
                comp[fid] = flow
        self._touched.clear()
        self._shared = False
        rates = self._alone_rates(comp)
        self.recomputations += 1
        self.rerated_flows += len(comp)
        self._now = now
        ends, push, inf = self._ends, heapq.heappush, math.inf
        group: list[int] = []
        at = None  # the end of the flows in group, the latest entry
        for fid, flow in comp.items():  # the reference's loop (FlowNetwork._rerate)
            rate = rates[fid]
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

    def _alone_rates(self, comp: dict[int, _Flow]) -> dict[int, float]:
        """:func:`sim.network._alone` of flows each alone on its links, the smallest capacity
        of each route looked up (worked out at its first use)."""
        least_of, cap = self._least, self.capacity_Bps
        smallest: dict[int, float] = {}
        for fid, flow in comp.items():
            finite = flow.finite
            least = least_of.get(finite, -1.0)
            if least == -1.0:
                least = least_of[finite] = _least(finite, cap)
            if least is None:  # a link twice: it shares
                return _filled({f: fl.finite for f, fl in comp.items()}, cap)
            smallest[fid] = least
        values = sorted(set(smallest.values()))
        if len(values) == 1:  # one share (or none finite): every flow's
            return dict.fromkeys(smallest, values[0])
        share_of = {math.inf: math.inf}
        k = 0
        while k < len(values) and values[k] < math.inf:
            share = values[k]
            within = share * (1 + _REL_EPS)
            while k < len(values) and values[k] <= within:
                share_of[values[k]] = share
                k += 1
        return {fid: share_of[least] for fid, least in smallest.items()}


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
