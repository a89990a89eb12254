"""What a single run reuses (issue 22, "a lean single run"): schedules built once per
(name, p, m, v, k), clusters once per description, collective timings once per cluster;
all shared read-only, in bounded caches, and giving the results of fresh ones."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import simulate
from sim.commtime import CollectiveTimer
from sim.config import parse_config
from sim.experiment import Experiment
from topologies.build import _CLUSTERS, CLUSTER_CACHE, build_cluster
from topologies.placement import Placement, coordinate_columns
from workloads.costs import ComputeSeg
from workloads.lowering.groups import replica_pairs
from workloads.lowering.opcosts import op_facts
from workloads.lowering.order import final_ops, topological, topological_ops, unit_sort
from workloads.memory import op_alloc_free
from workloads.registry import SCHEDULE_CACHE, SCHEDULES, built_schedule
from workloads.schedules import (
    BACKWARD,
    ENCODER_BACKWARD,
    WEIGHT_GRAD,
    unit_order,
    unit_spans,
    unit_times,
)

GPT = {
    "name": "t",
    "model": {"preset": "gpt3-1.3b", "seq_length": 2048},
    "cluster": {"preset": "dgx-a100-80g", "num_gpus": 32},
    "parallel": {"tp": 2, "pp": 4, "dp": 4},
    "training": {"micro_batch_size": 1, "global_batch_size": 64},
}


def test_a_schedule_is_built_once_and_shared_read_only() -> None:
    a = built_schedule("interleaved", 4, 8, 2, 1)
    assert built_schedule("interleaved", 4, 8, 2, 1) is a
    assert built_schedule.cache_info().maxsize == SCHEDULE_CACHE
    assert isinstance(a.rank_ops, tuple) and all(isinstance(ops, tuple) for ops in a.rank_ops)
    op = a.rank_ops[0][0]
    with pytest.raises(TypeError):
        a.groups[op] = ()  # type: ignore[index]
    with pytest.raises(TypeError):
        unit_times(a)[op] = (0.0, 0.0)  # type: ignore[index]
    order, fields = topological(a, fields=True)
    assert isinstance(order, tuple) and fields is not None
    ops, start, end = unit_spans(a)
    assert list(unit_times(a).items()) == list(zip(ops, zip(start, end, strict=True),
                                                   strict=True))
    for array in [*fields, unit_order(a)[0], start, end]:  # type: ignore[index]
        with pytest.raises(ValueError):
            array[0] = 1
    # the list callers get is theirs
    ops = topological(a)[0]
    mine = topological_ops(a)
    mine.reverse()
    assert topological(a)[0] == ops


def test_experiments_share_the_cluster_and_its_graph_is_frozen() -> None:
    a, b = Experiment.from_dict(GPT), Experiment.from_dict({**GPT, "name": "u"})
    assert a.cluster is b.cluster
    assert a.cluster in _CLUSTERS.values() and len(_CLUSTERS) <= CLUSTER_CACHE
    with pytest.raises(nx.NetworkXError):
        a.cluster.graph.add_edge("x", "y")
    changed = a.cluster.with_link_changes({(0, "host0/nvswitch"): 0.5})
    assert changed is not a.cluster and changed.memo == {}
    changed.graph.add_edge("x", "y")  # a changed cluster is a copy of its own


def test_a_description_that_does_not_hash_is_built_each_time() -> None:
    cfg = parse_config({**GPT, "cluster": {"topology": "torus2d", "dims": [2, 2],
                                           "num_gpus": 4, "link_bandwidth_GBps": 100.0},
                        "parallel": {"pp": 4}}).cluster
    with pytest.raises(TypeError):
        hash(cfg)
    assert build_cluster(cfg) is not build_cluster(cfg)


def test_a_shared_timer_gives_the_results_of_a_fresh_one() -> None:
    """The cluster's own timer, warmed by other layouts first, times like a fresh one."""
    layouts = [{"tp": 2, "pp": 4, "dp": 4}, {"tp": 4, "pp": 2, "dp": 4},
               {"tp": 1, "pp": 4, "dp": 8}, {"tp": 2, "pp": 4, "dp": 4}]
    for parallel in layouts:
        exp = Experiment.from_dict({**GPT, "parallel": parallel})
        shared = simulate(exp, fidelity="collapsed")
        fresh = simulate(exp, fidelity="collapsed", collective_timer=CollectiveTimer(exp.cluster))
        assert shared.stats_json() == fresh.stats_json()
    assert CollectiveTimer.shared(exp.cluster) is CollectiveTimer.shared(exp.cluster)


def _final_ops_loop(schedule):  # noqa: ANN001, ANN202 - the plain loop, the reference
    last_kind = WEIGHT_GRAD if schedule.split_backward else BACKWARD
    kinds = {last_kind} if schedule.encoder is None else {last_kind, ENCODER_BACKWARD}
    out = {}
    for ops in schedule.rank_ops:
        for op in ops:
            if op.kind in kinds:
                out[op.stage] = op
    return out


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_final_ops_equal_the_plain_loop(name: str) -> None:
    """:func:`final_ops` scans each rank from both ends; the plain loop over every op finds
    the same ops in the same order."""
    tried = 0
    for p, m, v in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 5, 8, 16), (1, 2, 3)):
        try:
            sched = SCHEDULES[name](p, m, v, 2)
        except Exception:  # noqa: BLE001, S112 - arguments the schedule refuses
            continue
        assert list(final_ops(sched).items()) == list(_final_ops_loop(sched).items())
        assert final_ops(sched) is final_ops(sched)  # kept on the schedule, read-only
        with pytest.raises(TypeError):
            final_ops(sched)[0] = None  # type: ignore[index]
        tried += 1
    assert tried > 0


@settings(max_examples=150, deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.integers(1, 9), m=st.integers(1, 16),
       v=st.integers(1, 3), k=st.integers(1, 3), seed=st.integers(0, 2**16),
       mix=st.sampled_from(("none", "shuffle", "move")))
def test_final_ops_on_the_codes_are_the_loops(name: str, p: int, m: int, v: int, k: int,
                                              seed: int, mix: str) -> None:
    """:func:`final_ops` on validation's codes of the ops (the stages' runs of final-kind
    ops, :func:`workloads.lowering.order._final_ops_coded`) finds the plain loop's ops in
    its order, for schedules of every kind, also with a rank's ops shuffled or ops moved to
    another rank (a stage on two ranks: the later rank's op, in the earlier one's place);
    and it takes the codes wherever validation kept them (schedules without an encoder)."""
    import random

    from workloads.lowering import order
    from workloads.schedules import _rank_coded

    try:
        schedule = SCHEDULES[name](p, m, v, k)
    except Exception:  # noqa: BLE001 - arguments the schedule refuses
        return
    rng = random.Random(seed)
    ranks = [list(ops) for ops in schedule.rank_ops]
    if mix == "shuffle":
        rng.shuffle(ranks[rng.randrange(len(ranks))])
    elif mix == "move" and len(ranks) > 1:
        for _ in range(rng.randrange(1, 6)):
            a, b = rng.sample(range(len(ranks)), 2)
            if ranks[a]:
                op = ranks[a].pop(rng.randrange(len(ranks[a])))
                ranks[b].insert(rng.randrange(len(ranks[b]) + 1), op)
    changed = replace(schedule, rank_ops=tuple(tuple(ops) for ops in ranks))
    coded = _rank_coded(changed)
    loop = list(_final_ops_loop(changed).items())
    assert list(order._final_ops(changed).items()) == loop
    if coded is not None:
        assert list(order._final_ops_coded(changed, coded).items()) == loop
    assert list(final_ops(replace(changed)).items()) == loop


def test_final_ops_of_a_built_schedule_take_the_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A built (validated) schedule without an encoder keeps its ops' codes, and
    :func:`final_ops` reads them, not the ops one by one (Megatron 1T's layout, smaller)."""
    from workloads.lowering import order

    def loop(schedule):  # noqa: ANN001, ANN202
        raise AssertionError("the op loop")

    schedule = replace(built_schedule("interleaved", 8, 32, 2, 1))  # (nothing kept)
    assert schedule.__dict__.get("_rank_coded") is None
    expected = list(_final_ops_loop(schedule).items())
    built = built_schedule("interleaved", 8, 32, 2, 1)
    built.__dict__.pop("_final_ops", None)
    monkeypatch.setattr(order, "_final_ops", loop)
    assert list(final_ops(built).items()) == expected


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_op_counts_equal_the_plain_count(name: str) -> None:
    """:attr:`Schedule.op_counts` counts on validation's arrays; counting the ops one by one
    (the reference) gives the same counts."""
    tried = 0
    for p, m, v, k in itertools.product((1, 2, 3, 4), (1, 2, 3, 8), (1, 2), (1, 2)):
        try:
            sched = SCHEDULES[name](p, m, v, k)
        except Exception:  # noqa: BLE001, S112 - arguments the schedule refuses
            continue
        plain = Counter((op.stage, op.kind, op.seq) for ops in sched.rank_ops for op in ops)
        assert dict(sched.op_counts) == dict(plain)
        tried += 1
    assert tried > 0


def test_equal_cost_models_are_shared_with_their_segments() -> None:
    """Experiments with the same costs get one cost model (:func:`interned`), so its
    segments are worked out once; they equal those of a fresh, equal model."""
    a, b = Experiment.from_dict(GPT), Experiment.from_dict({**GPT, "name": "u"})
    assert a.costs is b.costs
    other = Experiment.from_dict({**GPT, "parallel": {"tp": 4, "pp": 4, "dp": 2}})
    assert other.costs is not a.costs
    fresh = replace(a.costs)
    assert fresh == a.costs and fresh is not a.costs
    for op, markers in itertools.product(topological_ops(a.schedule), (False, True)):
        segs = a.costs.op_segments(op, False, markers)
        assert a.costs.op_segments(op, False, markers) is segs
        assert fresh.op_segments(op, False, markers) == segs


@pytest.mark.parametrize("split", [False, True])
def test_op_facts_are_kept_on_the_cost_model_and_equal_fresh_ones(split: bool) -> None:
    """An op's segments, compute count and memory (:func:`op_facts`) are worked out once per
    cost model and equal the plain computation on a fresh, equal model."""
    costs = Experiment.from_dict(GPT).costs
    fresh = replace(costs)
    for op in {op._replace(mb=0) for op in topological_ops(built_schedule("1f1b", 4, 8, 1, 1))}:
        facts = op_facts(costs, op, split)
        assert op_facts(costs, op, split) is facts
        segs = fresh.op_segments(op, split)
        assert facts == (segs, sum(isinstance(x, ComputeSeg) for x in segs),
                         *op_alloc_free(fresh, op, split))


@pytest.mark.parametrize("changes", [{}, {"recompute": "full"}, {"recompute": "selective"},
                                     {"recompute": "full", "recompute_num_layers": 1}])
def test_transient_bytes_keep_a_layers_working_memory(changes: dict) -> None:
    """A stage's ops' transient memory reads one layer's activations without recomputation
    kept on the cost model (:meth:`ActivationMemory._unrecomputed_layer_bytes`): the same bytes as
    a fresh copy of each run's costs, with ``recompute`` none, gives."""
    costs = replace(Experiment.from_dict(GPT).costs, **changes)
    for op in {op._replace(mb=0) for op in topological_ops(built_schedule("1f1b", 4, 8, 1, 1))}:
        runs = costs._runs(op.stage)
        assert max(c._unrecomputed_layer_bytes() for c, _ in runs) == max(
            replace(c, recompute="none").layer_activation_bytes() for c, _ in runs)
        assert costs.transient_bytes(op) == replace(costs).transient_bytes(op)


@pytest.mark.parametrize("order", ["tp-cp-dp-pp", "pp-dp-cp-tp", "dp-tp-pp-cp"])
def test_placement_tables_equal_the_coordinates(order: str) -> None:
    """The per-placement tables a run reads (every GPU's coordinates, a pipeline message's
    GPU pairs) equal :meth:`Placement.coords` and :meth:`Placement.gpu` GPU by GPU."""
    pl = Placement.from_order(order, tp=2, cp=2, dp=3, pp=4)
    columns = coordinate_columns(pl)
    assert coordinate_columns(Placement.from_order(order, tp=2, cp=2, dp=3, pp=4)) is columns
    for g in range(pl.num_gpus):
        assert {dim: columns[dim][g] for dim in columns} == pl.coords(g)
    for src, dst in [(0, 1), (2, 1), (3, 0)]:
        assert replica_pairs(pl, src, dst) == tuple(
            (pl.gpu(tp=u, cp=c, dp=e, pp=src), pl.gpu(tp=u, cp=c, dp=e, pp=dst))
            for c in range(2) for e in range(3) for u in range(2))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(order=st.permutations(["tp", "cp", "dp", "pp"]), tp=st.integers(1, 6),
       cp=st.integers(1, 3), dp=st.integers(1, 6), pp=st.integers(1, 6))
def test_coordinate_columns_are_the_coords(order: list[str], tp: int, cp: int, dp: int,
                                           pp: int) -> None:
    """:func:`coordinate_columns` (each dimension's column as one period repeated) gives
    :meth:`Placement.coords` of every GPU, its dimensions in the placement's order."""
    pl = Placement.from_order("-".join(order), tp=tp, cp=cp, dp=dp, pp=pp)
    columns = coordinate_columns(pl)
    assert list(columns) == [dim for dim, _ in pl.sizes]
    assert all(len(column) == pl.num_gpus for column in columns.values())
    for g in range(pl.num_gpus):
        assert {dim: columns[dim][g] for dim in columns} == pl.coords(g)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5), st.integers(0, 40),
                          st.sampled_from([0.0, 0.0, 0.0, 0.5, -1.0])), max_size=40))
def test_unit_sort_is_the_lexsort(rows: list[tuple[int, int, int, float]]) -> None:
    """:func:`workloads.lowering.order.unit_sort` (one integer key where the times are whole
    numbers) orders as its reference, ``np.lexsort((start, ranks, end))``: drawn times with
    ties, some not whole or negative (then it is the lexsort itself)."""
    start = np.array([float(s) + (bump if k == 0 else 0.0) for k, (s, _, _, bump)
                      in enumerate(rows)])
    ranks = np.array([r for _, r, _, _ in rows], dtype=np.int64)
    end = np.array([float(e) for _, _, e, _ in rows])
    got = unit_sort(start, ranks, end, 6)
    assert got.tolist() == np.lexsort((start, ranks, end)).tolist()


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_topological_order_is_the_lexsort_of_the_symbolic_run(name: str) -> None:
    """The topological order (:func:`topological`, one key sort and a gather of the ops) is
    the symbolic run's ops sorted by (end, rank, start) with ``np.lexsort``, the reference."""
    for p, m, v in itertools.product((1, 2, 4), (1, 3, 8), (1, 2)):
        try:
            sched = SCHEDULES[name](p, m, v, 2)
        except Exception:  # noqa: BLE001, S112 - arguments the schedule refuses
            continue
        ops, start, end = unit_spans(sched)
        ranks = np.asarray(sched.stage_rank)[[op.stage for op in ops]]
        want = [ops[k] for k in np.lexsort((start, ranks, end)).tolist()]
        assert list(topological(sched)[0]) == want
        assert list(topological(sched, fields=True)[0]) == want
