"""The flow network's fast path (:class:`sim.fastnet.FastFlowNetwork`) against its reference
(:class:`sim.network.FlowNetwork`): driven by the same random starts (alone on their links,
joining others', on unconstrained links only; several at once as a bundle, started one by
one in the reference), ends, capacity changes and reroutes, both give the same rates, end
times, bytes left, finished flows, bytes per link and counters, bit for bit, after every
step."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fastnet import FastFlowNetwork
from sim.network import FlowNetwork

LINKS = 8


def _state(net: FlowNetwork) -> tuple:
    """What the network holds, a bundle's flows each on its own."""
    if isinstance(net, FastFlowNetwork):
        flows_of, on_link = net.flows_by_id()
    else:
        flows_of = net._flows
        on_link = {link: list(users) for link, users in net._on_link.items()}
    flows = {fid: (f.links, f.finite, f.rate_Bps, f.end_s, f.remaining_bytes, f.since_s,
                   f.nbytes) for fid, f in flows_of.items()}
    return (flows, on_link, dict(net.bytes_on_link), net.recomputations, net.rerated_flows,
            net.next_end_s(), net.active)


_route = st.one_of(st.lists(st.integers(0, LINKS - 1), min_size=0, max_size=4, unique=True),
                   st.lists(st.integers(0, LINKS - 1), min_size=2, max_size=4))
"""A route: links it crosses once each, or one that may cross a link twice (it shares that
link with itself)."""
_step = st.one_of(
    st.tuples(st.just("start"), st.lists(st.tuples(_route, st.sampled_from(
        [1.0, 3.0, 1e6, 2.5e8, 7.0e9])), min_size=1, max_size=6)),
    st.tuples(st.just("bundle"), st.tuples(st.lists(_route, min_size=1, max_size=4),
                                           st.sampled_from([1.0, 2.5e8, 7.0e9]), st.just([]))),
    st.tuples(st.just("bundle"), st.tuples(  # routes on disjoint links: most take a bundle
        st.permutations(list(range(LINKS))).flatmap(lambda order: st.lists(
            st.integers(1, 3), min_size=1, max_size=4).map(lambda sizes: [
                order[sum(sizes[:k]):sum(sizes[:k + 1])] for k in range(len(sizes))])),
        st.sampled_from([1.0, 2.5e8, 7.0e9]), st.lists(_route, max_size=1))),
    st.tuples(st.just("crossing"), st.lists(st.integers(0, LINKS - 1), max_size=3)),
    st.tuples(st.just("finish"), st.just(None)),
    st.tuples(st.just("idle"), st.floats(0.0, 1e-3)),
    st.tuples(st.just("capacity"), st.dictionaries(st.integers(0, LINKS - 1),
                                                   st.sampled_from([1e9, 2e9, 3e9, 5e10]),
                                                   max_size=2)),
    st.tuples(st.just("reroute"), st.lists(st.tuples(st.integers(0, 50), _route), max_size=2)),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([1e9, 1e9, 1e9, 2e9, 1e9 * (1 + 1e-13), 4e10, math.inf]),
                min_size=LINKS, max_size=LINKS),
       st.lists(_step, min_size=1, max_size=25))
def test_fast_network_equals_reference(capacity: list[float], steps: list) -> None:
    ref, fast = FlowNetwork(capacity), FastFlowNetwork(capacity)
    now, fid = 0.0, 0
    for what, arg in steps:
        if what == "finish":  # to the next end
            if ref.next_end_s() == math.inf:
                continue
            now = ref.next_end_s()
        elif what == "idle":
            now += arg
        done = []
        for net in (ref, fast):
            if what == "start":
                for k, (links, nbytes) in enumerate(arg):
                    net.start(now, fid + k, tuple(links), nbytes)
                net.refresh(now)
            elif what == "bundle":  # one bundle in the fast network where it can take them
                routes, nbytes = tuple(tuple(links) for links in arg[0]), arg[1]
                if net is ref or not fast.start_bundle(now, fid, routes, nbytes):
                    for k, links in enumerate(routes):
                        net.start(now, fid + k, links, nbytes)
                for k, links in enumerate(arg[2]):  # then flows that may join its links
                    net.start(now, fid + len(routes) + k, tuple(links), 3.0)
                net.refresh(now)
            elif what == "crossing":
                done.append(net.crossing(arg))
            elif what in ("finish", "idle"):
                done.append(net.finish_due(now))
            elif what == "capacity":
                finite = {link: bps for link, bps in arg.items() if math.isfinite(capacity[link])}
                if finite:
                    net.set_capacity(now, finite)
            else:
                moves = {f: tuple(links) for f, links in arg if f in net._flows}
                if moves:
                    net.reroute(now, moves)
        if what == "start":
            fid += len(arg)
        elif what == "bundle":
            fid += len(arg[0]) + len(arg[2])
        if done:
            assert done[0] == done[1]
        assert _state(fast) == _state(ref)
    while ref.active:  # run both out
        end = ref.next_end_s()
        assert fast.next_end_s() == end
        assert fast.finish_due(end) == ref.finish_due(end)
        assert _state(fast) == _state(ref)
