"""``sim.network.makespan_alone_s`` (flows alone on their links, without the flow network)
against its reference ``sim.network.makespan_s``, bit for bit; and the collective timer's
``replicas_makespan_s`` against ``replicas_makespan_reference_s`` on random concurrent
collectives over the timer's test clusters."""

from __future__ import annotations

import math
import struct
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from sim import commtime
from sim.commtime import (
    CollectiveTimer,
    replicas_makespan_reference_s,
    replicas_makespan_s,
)
from sim.network import _alone_replay, makespan_alone_s, makespan_s
from tests.test_perf_commtime import _cluster, _timer_case


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


_CAPS = [1e9, 1e9 * (1 + 4e-13), 1e9 * (1 + 3e-12), 2.5e9, 25e9, 50e9, 100e9, math.inf]
"""Link capacities: equal ones, ones within and just outside the 1e-12 tie tolerance, and
unconstrained links."""
_STARTS = st.one_of(st.sampled_from([0.0, 1e-6, 2e-6, 3.5e-6, 1e-6 * (1 + 1e-13)]),
                    st.floats(0.0, 1e-3, allow_nan=False))
_BYTES = st.one_of(st.sampled_from([0, 0.0, 1, 1e3, 1e6, 256e6, 1e6 * (1 + 1e-13)]),
                   st.floats(1e-3, 1e9, allow_nan=False))


@st.composite
def _flows(draw: st.DrawFn, disjoint: bool) -> tuple[list, list[float]]:
    """Flows over a pool of links: each on links of its own (``disjoint``: the fast path's
    case, with the odd repeated or shared link drawn anyway) or on any links."""
    pool = draw(st.integers(1, 24))
    caps = draw(st.lists(st.sampled_from(_CAPS), min_size=pool, max_size=pool))
    n = draw(st.integers(1, 12))
    free = list(range(pool))
    flows = []
    for _ in range(n):
        k = draw(st.integers(0, 4))
        if disjoint and draw(st.integers(0, 9)) > 0:
            links = tuple(free[:k])
            del free[:k]
        else:
            links = tuple(draw(st.lists(st.integers(0, pool - 1), max_size=k)))
        flows.append((draw(_STARTS), links, draw(_BYTES)))
    return flows, caps


@st.composite
def _near_ties(draw: st.DrawFn) -> tuple[list, list[float]]:
    """Flows on links of their own whose ends lie within the tie tolerance of each other
    (starts, sizes and capacities a few 1e-13 apart), where the closed form replays."""
    start = draw(st.sampled_from([0.0, 1e-6, 3e-6]))
    nbytes = draw(st.sampled_from([1e3, 1e6, 64e6]))
    cap = draw(st.sampled_from([1e9, 25e9]))
    n = draw(st.integers(2, 8))
    flows, caps = [], []
    for i in range(n):
        tweak = draw(st.lists(st.integers(-3, 3), min_size=3, max_size=3))
        caps += [cap * (1 + tweak[2] * 1e-13), math.inf]
        flows.append((start * (1 + tweak[0] * 1e-13), (2 * i, 2 * i + 1),
                      nbytes * (1 + tweak[1] * 1e-13)))
    return flows, caps


@settings(max_examples=400, deadline=None, derandomize=True)
@given(case=st.one_of(_flows(True), _flows(False), _near_ties()))
def test_alone_equals_the_flow_network_bit_for_bit(case) -> None:
    """Where it answers, ``makespan_alone_s`` is ``makespan_s``'s float, bit for bit; it
    answers whenever no finite link carries two flows (or one twice)."""
    flows, caps = case
    fast = makespan_alone_s(flows, caps)
    finite = [x for _, links, nbytes in flows if nbytes > 0 and links
              for x in links if caps[x] < math.inf]
    assert (fast is not None) == (len(set(finite)) == len(finite))
    if fast is not None:
        want = makespan_s(flows, caps)
        assert _bits(fast) == _bits(want)
        # the replay of the loop, which the closed form falls back on near ties
        smallest = [min([float(caps[x]) for x in links if caps[x] < math.inf], default=math.inf)
                    if nbytes > 0 and links else None for _, links, nbytes in flows]
        assert _bits(_alone_replay(flows, smallest)) == _bits(want)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(template=st.lists(st.tuples(_STARTS, st.lists(st.integers(0, 5), max_size=3,
                                                     unique=True).map(tuple), _BYTES),
                         min_size=1, max_size=6),
       caps=st.lists(st.sampled_from(_CAPS), min_size=6, max_size=6),
       copies=st.integers(1, 5), share=st.booleans())
def test_replicas_equal_the_reference(template: list, caps: list[float], copies: int,
                                      share: bool) -> None:
    """Replicas of a group on links of their own (or sharing one link across groups):
    ``replicas_makespan_s`` is its reference's float, bit for bit."""
    groups = [[(start, tuple(6 * k + x for x in links), nbytes)
               for start, links, nbytes in template] for k in range(copies)]
    if share and copies > 1:
        groups[1] = [(s, (0, *links), b) for s, links, b in groups[1]]
    capacity = caps * copies
    assert _bits(replicas_makespan_s(groups, capacity)) == \
        _bits(replicas_makespan_reference_s(groups, capacity))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(_timer_case())
def test_timer_with_the_fast_path_equals_the_reference(case) -> None:
    """A collective timer (fresh, then one that met the groups shifted by half the cluster)
    gives the same float with its fast paths (shared plans' flows read through their maps,
    ``makespan_alone_s``) as the reference timer (every group planned, its flows built as
    written, the flow network alone), on the timer's test clusters (NVSwitch servers, shared
    NICs, oversubscribed and ECMP fabrics, rings and tori), five ops, strided, block or
    random groups."""
    spec, n, op, groups, nbytes = case
    cluster = _cluster(spec, n)
    algo = "pairwise" if op == "all_to_all" else "auto"
    shifted = tuple(tuple((r + n // 2) % n for r in g) for g in groups)

    def timings(share: bool) -> tuple[float, float]:
        timer = CollectiveTimer(cluster, algo, share_plans=share)
        first = timer(op, groups, nbytes)
        timer(op, shifted, nbytes)
        return first, CollectiveTimer(cluster, algo, share_plans=share)(op, shifted, nbytes)

    fast = timings(True)
    with mock.patch.object(commtime, "replicas_makespan_s", replicas_makespan_reference_s):
        slow = timings(False)
    assert [_bits(x) for x in fast] == [_bits(x) for x in slow], (op, groups)
