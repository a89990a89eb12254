"""``CollectiveTimer.offset_pairs_s`` (a pipeline message's pairs by their offsets, a kept
shape's timing found without the pairs) beside its reference, the timer called on the
pairs themselves: the same float on every call, on clusters whose servers are all twins,
twins in classes (an oversubscribed fat-tree, a degraded NIC), not interchangeable (mixed
GPUs) or routed by hash ECMP (never shifted)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.commtime import CollectiveTimer
from topologies.cluster import Cluster
from topologies.graphs import Fabric, fat_tree
from topologies.hardware import GPUS
from topologies.presets import mixed_server_cluster, server_cluster

MiB = 2.0 ** 20


def _clusters() -> dict[str, Cluster]:
    base = server_cluster("dgx-a100-80g", 64)
    return {
        "crossbar": base,
        "fat-tree 2:1": server_cluster("dgx-a100-80g", 128, Fabric(
            kind="fat-tree", gpus_per_leaf=16, oversubscription=2.0)),
        "degraded nic": base.with_link_changes({("host2/nic1", "fabric"): 0.25}),
        "mixed": mixed_server_cluster([("dgx-a100-80g", 2), ("dgx-h100", 2)]),
        "hash ecmp": Cluster("hash-ecmp", fat_tree(16, 25e9, 1e-6, gpus_per_leaf=8,
                                                   oversubscription=4.0),
                             GPUS["A100-80GB"], 1, ecmp="hash"),
    }


CLUSTERS = _clusters()


@st.composite
def _messages(draw: st.DrawFn) -> tuple[str, tuple[int, ...], list[tuple[int, int, float]]]:
    """A cluster, one layout's replica offsets (TP lanes inside a DP stride, as a
    placement's, or a random set) and a sequence of messages between pipeline ranks."""
    name = draw(st.sampled_from(sorted(CLUSTERS)))
    n = CLUSTERS[name].num_gpus
    pp = draw(st.sampled_from([2, 4, 8]))
    span = n // pp  # GPUs per pipeline rank
    if draw(st.booleans()):
        tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= span]))
        dp = draw(st.integers(1, span // tp))
        offsets = tuple(t + tp * d for d in range(dp) for t in range(tp))
    else:
        offsets = tuple(sorted(draw(st.sets(st.integers(0, span - 1), min_size=1,
                                            max_size=min(span, 16)))))
    count = draw(st.integers(1, 12))
    messages = []
    for _ in range(count):
        src = draw(st.integers(0, pp - 1))
        dst = draw(st.integers(0, pp - 1).filter(lambda r, s=src: r != s))
        nbytes = draw(st.sampled_from([64e3, 16 * MiB]))
        messages.append((src * span, dst * span, nbytes))
    return name, offsets, messages


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_messages())
def test_offset_pairs_equal_the_timer_on_the_pairs(case) -> None:
    """Every message's time by offsets equals the timer's on its pairs (one timer asked the
    pairs in the same order, and a fresh timer's own timing of them, no reuse), bit for
    bit; and messages found by offsets are the pairs' kept shapes' (reuse happened where
    the servers allow it)."""
    name, offsets, messages = case
    cluster = CLUSTERS[name]
    fast, plain = CollectiveTimer(cluster), CollectiveTimer(cluster)
    for k, (a, b, nbytes) in enumerate(messages):
        pairs = tuple((a + o, b + o) for o in offsets)
        # half the messages with the caller's pairs (a kept tuple), half built by the timer
        given = (lambda p=pairs: p) if k % 2 else None
        got = fast.offset_pairs_s("send", offsets, a, b, nbytes, given)
        assert got == plain("send", pairs, nbytes), (name, a, b)
        assert got == CollectiveTimer(cluster)._time("send", pairs, nbytes), (name, a, b)
        # asked again (the kept entry found, or the pairs' own cache)
        assert fast.offset_pairs_s("send", offsets, a, b, nbytes) == got


def test_offsets_reuse_the_shape_across_pipeline_ranks() -> None:
    """On twin servers the second and later rank pairs as far apart are found by offsets:
    the timer times the first pair only (one timing cached, none translated)."""
    cluster = CLUSTERS["crossbar"]
    timer = CollectiveTimer(cluster)
    offsets = tuple(range(4))
    times = {timer.offset_pairs_s("send", offsets, 16 * p, 16 * (p + 1), 16 * MiB)
             for p in range(3)}
    assert len(times) == 1
    assert timer.size == 1 and timer.reused == 0
