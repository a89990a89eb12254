"""A pipeline message's replica pairs (``workloads.lowering.groups.replica_pairs``: the two
pipeline ranks' first GPUs plus each replica's offset) against every pair's coordinates
mapped to GPUs one by one (the reference)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from topologies.placement import Placement
from workloads.lowering.groups import replica_coords, replica_pairs


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.permutations(["tp", "cp", "dp", "pp"]), st.integers(1, 4), st.integers(1, 2),
       st.integers(1, 4), st.integers(2, 4), st.data())
def test_replica_pairs_are_the_coordinates_gpus(dims, tp, cp, dp, pp, data) -> None:
    degree = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    placement = Placement(tuple((d, degree[d]) for d in dims))
    src = data.draw(st.integers(0, pp - 1))
    dst = data.draw(st.integers(0, pp - 1))
    want = tuple((placement.gpu(tp=u, cp=c, dp=e, pp=src),
                  placement.gpu(tp=u, cp=c, dp=e, pp=dst))
                 for c, e in replica_coords(placement) for u in range(tp))
    assert replica_pairs(placement, src, dst) == want
