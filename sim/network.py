"""Flow-level network state: max-min fair sharing of link bandwidth. Pure (no SimPy).

The engine owns time; it tells this object when flows start and asks when the
next one ends. Each flow crosses a set of links; concurrent flows share each
link's bandwidth max-min fairly (progressive filling, Bertsekas & Gallager,
*Data Networks*, 2nd ed., sec. 6.5.2), and rates are recomputed whenever a flow
starts or ends. Latency is not modelled here: the engine delays a flow's start
by its route latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_REL_EPS = 1e-12


@dataclass(slots=True)
class _Flow:
    links: tuple[int, ...]
    remaining_bytes: float
    rate_Bps: float = 0.0
    end_s: float = math.inf


def max_min_rates(
    flows: dict[int, tuple[int, ...]], capacity_Bps: Sequence[float]
) -> dict[int, float]:
    """Max-min fair rates for flows given by the links they cross.

    Progressive filling: repeatedly find the link whose remaining capacity split
    equally among its unfrozen flows is smallest, freeze those flows at that
    share, and remove their share from every link they cross. Flows that cross
    only infinite-capacity links (or none) get an infinite rate.
    """
    rates: dict[int, float] = {}
    users: dict[int, list[int]] = {}
    for fid, links in flows.items():
        for link in links:
            if math.isfinite(capacity_Bps[link]):
                users.setdefault(link, []).append(fid)
    remaining = {link: float(capacity_Bps[link]) for link in users}
    count = {link: len(fids) for link, fids in users.items()}
    while count:
        share = min(remaining[link] / n for link, n in count.items())
        bottlenecks = [
            link for link, n in count.items() if remaining[link] / n <= share * (1 + _REL_EPS)
        ]
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


class FlowNetwork:
    """Active flows and their max-min fair rates over time."""

    def __init__(self, capacity_Bps: Sequence[float]) -> None:
        self.capacity_Bps = tuple(capacity_Bps)
        self._flows: dict[int, _Flow] = {}
        self._now = 0.0
        self._dirty = False
        self.bytes_on_link = [0.0] * len(self.capacity_Bps)
        """Bytes carried by each link so far (for link-utilisation statistics)."""

    @property
    def active(self) -> int:
        return len(self._flows)

    def _advance(self, now: float) -> None:
        dt = now - self._now
        if dt > 0:
            for flow in self._flows.values():
                if math.isfinite(flow.rate_Bps):
                    moved = min(flow.remaining_bytes, flow.rate_Bps * dt)
                    flow.remaining_bytes -= moved
                    for link in flow.links:
                        self.bytes_on_link[link] += moved
        self._now = now

    def _rerate(self) -> None:
        rates = max_min_rates({fid: f.links for fid, f in self._flows.items()}, self.capacity_Bps)
        for fid, flow in self._flows.items():
            flow.rate_Bps = rates[fid]
            if flow.remaining_bytes <= 0 or math.isinf(flow.rate_Bps):
                flow.end_s = self._now
            else:
                flow.end_s = self._now + flow.remaining_bytes / flow.rate_Bps

    def start(self, now: float, flow_id: int, links: tuple[int, ...], nbytes: float) -> None:
        """A flow of ``nbytes`` over ``links`` begins transmitting at ``now``.

        Rates are not recomputed until :meth:`refresh`, so that many flows
        starting at the same instant (one step of a collective) cost one
        recomputation. Until then the new flow moves no bytes; as no simulated
        time passes before the refresh, the result is exact.
        """
        self._advance(now)
        self._flows[flow_id] = _Flow(links, float(nbytes))
        self._dirty = True

    def refresh(self, now: float) -> None:
        """Recompute max-min rates if flows started since the last recomputation."""
        if self._dirty:
            self._advance(now)
            self._rerate()
            self._dirty = False

    def next_end_s(self) -> float:
        """Time the earliest active flow ends at current rates (inf if none)."""
        return min((f.end_s for f in self._flows.values()), default=math.inf)

    def finish_due(self, now: float) -> list[int]:
        """Remove and return (sorted) the flows that have ended by ``now``; re-rate the rest."""
        self._advance(now)
        tol = abs(now) * _REL_EPS
        done = sorted(fid for fid, f in self._flows.items() if f.end_s <= now + tol)
        for fid in done:
            flow = self._flows.pop(fid)
            for link in flow.links:
                self.bytes_on_link[link] += flow.remaining_bytes
        if done or self._dirty:
            self._rerate()
            self._dirty = False
        return done


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
