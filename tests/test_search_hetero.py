"""``sim search`` on mixed-GPU clusters and with ``parallel.layers_per_stage: balanced``.

The oracle is brute force: every enumerated layout simulated, the best feasible one
taken by the search's own ranking (throughput, then less memory, then the key). The
search, which rejects layouts by its memory bound and prunes by its throughput bounds,
must find the same best layout with the same figures, and every bound must hold against
the simulation of every layout (memory bound at most the simulated peak, a layout the
bound rejects really overflows some GPU, throughput bounds at least the simulated one).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from sim.experiment import build_experiment
from sim.search import (
    Evaluation,
    Evaluator,
    Layout,
    Screener,
    SearchContext,
    cp_min_tokens,
    enumerate_layouts,
    parse_pins,
    search,
)
from topologies.hardware import GPUS

MODEL = {"preset": "gpt3-1.3b", "num_layers": 8, "seq_length": 1024}
A100_H100 = {"num_gpus": 16, "nodes": [{"preset": "dgx-a100-80g", "count": 1},
                                       {"preset": "dgx-h100", "count": 1}]}
H100_A100 = {"num_gpus": 16, "nodes": [{"preset": "dgx-h100", "count": 1},
                                       {"preset": "dgx-a100-80g", "count": 1}]}
UNIFORM = {"preset": "dgx-a100-80g", "num_gpus": 16}


def _data(cluster: dict, balanced: bool = False) -> dict:
    data: dict[str, Any] = {"name": "hetero-search", "model": dict(MODEL),
                            "cluster": json.loads(json.dumps(cluster)),
                            "training": {"global_batch_size": 32}}
    if balanced:
        data["parallel"] = {"layers_per_stage": "balanced"}
    return data


PINS = parse_pins(["tp=1|2|8,pp=1|2|4,mbs=1|2,zero=1,sp=false,recompute=none,"
                   "schedule=1f1b|zb-h1|interleaved"])
"""About 40 layouts: pipelines across the two servers (pp >= 2), inside them (tp 8), and
DP across both GPU types (pp 1: invalid when collapsed)."""

CASES = {
    "A100+H100 servers": (_data(A100_H100), "collapsed"),
    "H100+A100 servers": (_data(H100_A100), "collapsed"),
    "uniform, balanced split": (_data(UNIFORM, balanced=True), "collapsed"),
    "A100+H100 servers, balanced split": (_data(A100_H100, balanced=True), "collapsed"),
}


def _rank_key(ev: Evaluation) -> tuple[float, float, str]:
    assert ev.stats is not None
    return (-ev.stats["tokens_per_s"], ev.stats["peak_memory_gib"], ev.key)


@cache
def _brute_force(case: str) -> tuple[list[tuple[Layout, Evaluation]], Screener]:
    data, fidelity = CASES[case]
    ctx = SearchContext.build(data)
    evaluator = Evaluator(ctx.data, ctx.global_batch_size, fidelity, None)
    screener = Screener(ctx, None, comm=fidelity == "collapsed",
                        collapsed_only=fidelity == "collapsed")
    return [(lay, evaluator(lay)) for lay in enumerate_layouts(ctx, PINS)], screener


@pytest.mark.parametrize("case", sorted(CASES))
def test_search_best_is_the_brute_force_best(case: str) -> None:
    results, _ = _brute_force(case)
    feasible = sorted((ev for _, ev in results if ev.status == "ok"), key=_rank_key)
    assert len(feasible) >= 20, "the oracle needs many feasible layouts"
    assert {2, 4} <= {lay.pp for lay, ev in results if ev.status == "ok"}
    data, fidelity = CASES[case]
    found = search(data, pins=PINS, top=2, fidelity=fidelity)
    assert found.best is not None
    assert found.best.layout.key == feasible[0].key
    assert found.best.stats == feasible[0].stats
    assert found.top(2)[1].layout.key == feasible[1].key  # the top K stay exact
    assert found.simulated < len(results)  # and the bounds spared simulations


@pytest.mark.parametrize("case", sorted(CASES))
def test_bounds_hold_on_every_layout(case: str) -> None:
    results, screener = _brute_force(case)
    slack = 1 + 1e-9
    for layout, ev in results:
        screened = screener.screen(layout)
        judged = screener.judge(screened) if screened.status == "ok" else screened
        if ev.status == "invalid":  # collapsed cannot stand for ranks that mix GPU types
            assert judged.status == "invalid", (layout.key, ev.error)
            continue
        assert ev.status in ("ok", "oom"), (layout.key, ev.error)
        assert judged.status in ("ok", "memory"), (layout.key, judged.reason)
        stats = ev.stats
        assert stats is not None
        assert judged.memory_bound_gib <= stats["peak_memory_gib"] * slack, layout.key
        if judged.status == "memory":
            assert stats["oom"], f"{layout.key}: rejected by the memory bound but fits"
            continue
        assert stats["tokens_per_s"] <= judged.tokens_bound * slack, layout.key
        assert stats["tokens_per_s"] <= screened.tokens_bound * slack, layout.key


def test_mixed_pipeline_ranks_are_invalid_when_collapsed_and_simulated_in_full_on_auto() -> None:
    """pp = 1 spreads DP over both servers: a collapsed run cannot stand one GPU for the
    rank. ``--fidelity auto`` (full fidelity on 16 GPUs) simulates it, and its bound
    holds with each rank timed on its fastest GPU type."""
    data = _data(A100_H100)
    pins = parse_pins(["tp=8,pp=1,mbs=2,zero=1,sp=false,recompute=none"])
    collapsed = search(data, pins=pins, top=1)
    assert collapsed.counts == {"invalid": 1}
    assert "mix GPU types" in collapsed.rows[0].error
    auto = search(data, pins=pins, top=1, fidelity="auto", prune=False)
    assert auto.best is not None and auto.best.figure("fidelity") == "full"
    assert auto.best.figure("tokens_per_s") <= auto.best.tokens_bound * (1 + 1e-9)


# ---------------------------------------------------------------------------- memory per GPU

BIG_SMALL = {"num_gpus": 2, "topology": "switch", "link_bandwidth_GBps": 100,
             "link_latency_us": 1.0,
             "nodes": [{"gpu": "A100-80GB", "count": 1}, {"gpu": "A100-40GB", "count": 1}]}


def _two_stage(nodes: list[dict]) -> dict:
    """GPT-3 6.7B over two pipeline stages, no DP: about 54 GB of model state per stage."""
    cluster = {**BIG_SMALL, "nodes": nodes}
    return {"name": "big-small", "model": {"preset": "gpt3-6.7b", "seq_length": 1024},
            "cluster": cluster, "parallel": {"pp": 2, "tp": 1},
            "training": {"global_batch_size": 8}}


LAYOUT = Layout(tp=1, pp=2, dp=1, zero_stage=0, micro_batch_size=1)


def test_a_layout_that_fits_the_big_gpus_but_not_the_small_ones_is_rejected() -> None:
    big = [{"gpu": "A100-80GB", "count": 2}]
    mixed = [{"gpu": "A100-80GB", "count": 1}, {"gpu": "A100-40GB", "count": 1}]
    verdicts = {}
    for name, nodes in (("big", big), ("mixed", mixed)):
        ctx = SearchContext.build(_two_stage(nodes))
        screener = Screener(ctx, None, comm=False)
        screened = screener.screen(LAYOUT)
        assert screened.status == "ok"  # the average stage fits the biggest GPU
        verdicts[name] = screener.judge(screened)
        ev = Evaluator(ctx.data, ctx.global_batch_size, "full", None)(LAYOUT)
        assert ev.stats is not None
        verdicts[name + " simulated"] = ev
    assert verdicts["big"].status == "ok" and not verdicts["big simulated"].stats["oom"]
    assert verdicts["mixed"].status == "memory"
    cap40 = GPUS["A100-40GB"].hbm_capacity_bytes / 2**30
    stats = verdicts["mixed simulated"].stats
    assert stats["oom"] and stats["oom_gpus"] == [1]  # the 40 GB GPU of the last stage
    assert cap40 < verdicts["mixed"].memory_bound_gib <= stats["peak_memory_gib"] * (1 + 1e-9)
    # the search never simulates it: the memory bound rejects it
    found = search(_two_stage(mixed), pins=parse_pins(["tp=1,pp=2,mbs=1,zero=0,sp=false,"
                                                       "recompute=none,schedule=1f1b"]),
                   top=1, fidelity="full")
    assert found.counts == {"memory": 1} and found.simulated == 0


# ---------------------------------------------------------------------------- details

def test_balanced_split_in_the_bounds_is_the_one_the_simulation_runs() -> None:
    data = _data(A100_H100, balanced=True)
    ctx = SearchContext.build(data)
    evaluator = Evaluator(ctx.data, ctx.global_batch_size, "collapsed", None)
    seen = set()
    for layout in enumerate_layouts(ctx, PINS):
        if layout.pp == 1:
            continue
        split = ctx.costs_for(layout, layout.pp * layout.vpp).stage_layers
        assert split == evaluator.experiment(layout).costs.stage_layers, layout.key
        seen.add(split)
    assert len(seen) > 2  # not the even split everywhere: the H100 stages take more layers


def test_cp_threshold_on_a_mixed_cluster_is_the_gpu_type_that_hides_most() -> None:
    """Fewer tokens per rank hide the K/V passes on A100 (312 TFLOP/s over 300 GB/s) than on
    H100 (989 over 450): on a mixed cluster CP degrees are kept down to the A100's."""
    a100 = cp_min_tokens(SearchContext.build(_data(UNIFORM)))
    mixed = cp_min_tokens(SearchContext.build(_data(A100_H100)))
    h100 = cp_min_tokens(SearchContext.build(_data({"preset": "dgx-h100", "num_gpus": 16})))
    assert mixed == a100 < h100


def test_balanced_experiment_builds_as_sim_run_builds_it() -> None:
    """The example file of heterogeneous clusters searches without an error (it used to be
    refused), and its own layout's split matches sim run's."""
    data = _data(A100_H100, balanced=True)
    data["parallel"].update({"tp": 8, "pp": 2})
    ctx = SearchContext.build(data)
    layout = Layout(tp=8, pp=2, dp=1, zero_stage=1)
    expected = build_experiment({**data, "training": {"global_batch_size": 32,
                                                      "micro_batch_size": 1}})
    assert ctx.costs_for(layout, 2).stage_layers == expected.costs.stage_layers
    assert expected.costs.stage_layers[0] < expected.costs.stage_layers[1]  # H100s take more


# ---------------------------------------------------------------------------- cache keys

@pytest.mark.parametrize("preset", ["gpt3-1.3b", "mixtral-8x7b"])
def test_screener_cache_keys_hold_what_the_costs_depend_on(preset: str) -> None:
    """The screener shares op times across ZeRO stages and dp (``_work_shape``) and model
    state across micro-batch sizes, SP and recomputation (``_state_shape``): the cost model
    must not read them there."""
    from dataclasses import replace

    from sim.search.bounds import _state_shape, _work_shape
    from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op

    data = {"name": "keys", "model": {"preset": preset, "num_layers": 4},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
            "training": {"global_batch_size": 32}}
    ctx = SearchContext.build(data)
    ep = 2 if "ep=2" not in ctx.unsupported else 1
    base = ctx.costs_for(Layout(tp=2, pp=2, dp=4, ep=ep, zero_stage=1), 2)
    for zero, dp in ((0, 4), (2, 4), (3, 4), (1, 8), (3, 2)):
        other = replace(base, zero_stage=zero, dp=dp)
        assert _work_shape(other) == _work_shape(base)
        for stage in (0, 1):
            for kind in (FORWARD, BACKWARD, WEIGHT_GRAD):
                for split in (False, True):
                    op = Op(stage, kind, 0)
                    assert other.op_segments(op, split) == base.op_segments(op, split)
    for mbs, sp, rc in ((4, False, "none"), (1, True, "selective"), (2, False, "full")):
        other = replace(base, micro_batch_size=mbs, sequence_parallel=sp, recompute=rc)
        assert _state_shape(other) == _state_shape(base)
        for stages in ((0,), (1,), (0, 1)):
            assert other.static_bytes(stages) == base.static_bytes(stages)
            assert other.optimizer_segment(stages) == base.optimizer_segment(stages)
