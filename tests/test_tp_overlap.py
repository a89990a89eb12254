"""TP communication overlap (``parallel.tp_comm_overlap``, :mod:`sim.tpoverlap`): the
pipelined pair's closed forms, the step they give end to end, and the settings refused."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest
from conftest import segment_timer

from base.errors import ConfigError
from sim import api
from sim.commtime import CollectiveTimer
from sim.experiment import build_experiment
from sim.tpoverlap import (
    DATA_FILE,
    NCCL_BESIDE,
    Method,
    chunked,
    compute_streams,
    lowering_costs,
    method_of,
    pipelined_s,
    sm_count,
)
from workloads.layer_work import SP_REGATHER_GEMMS, TP_OVERLAP_GEMMS
from workloads.lowering.groups import tp_groups
from workloads.program import Collective

PIPE = Method("pipeline", 4, 16, True)
RING = Method("ring_exchange", 0, 1, False)
BULK = Method("bulk", 1, 16, True)


def test_closed_forms() -> None:
    """n = 4 chunks: g'/n + (n - 1) max(g'/n, c/n) + c/n with g' = g S/(S - k); the ring
    exchange hides all of c while g'/t >= c/(t - 1) (the first chunk is local); bulk is
    max(c, g')."""
    s = 132
    slow = 132 / 116
    assert pipelined_s(PIPE, 1.0, 4.0, 8, s) == pytest.approx(
        4 * slow / 4 + 3 * max(4 * slow / 4, 1 / 4) + 1 / 4)
    assert pipelined_s(PIPE, 8.0, 4.0, 8, s) == pytest.approx(4 * slow / 4 + 3 * 2 + 2)
    assert pipelined_s(RING, 1.0, 4.0, 4, s) == pytest.approx(4.0)
    assert pipelined_s(RING, 6.0, 4.0, 4, s) == pytest.approx(3 * 2 + 1)
    assert pipelined_s(BULK, 1.0, 4.0, 4, s) == pytest.approx(4 * slow)
    assert pipelined_s(BULK, 9.0, 4.0, 4, s) == pytest.approx(9.0)
    for m in (PIPE, RING, BULK):  # never faster than the GEMM alone or the collective alone
        for c, g in ((0.1, 5.0), (5.0, 0.1), (1.0, 1.0)):
            t = pipelined_s(m, c, g, 8, s)
            assert t >= max(c, g) - 1e-12 and t <= c + g * slow + 1e-12


def test_data_is_transformer_engines_defaults_with_sources() -> None:
    data = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))
    assert "initialize_ub" in data["source"]
    for table in ("layers", "sms"):
        assert f"{table}_source" in data[table]
    for name, m in data["methods"].items():
        assert f"{name}_source" in m
    assert method_of("qkv_fprop") == RING and method_of("proj_fprop") == PIPE
    assert method_of("fc1_wgrad") == BULK
    assert {layer for _, layer in TP_OVERLAP_GEMMS.values()} <= set(data["layers"]) - {
        "layers_source"}
    assert sm_count("H100") == 132 and sm_count("A100-80GB") == 108 and sm_count("MI300X") is None
    assert "compute_streams_source" in data and compute_streams() == 3


def test_chunks_on_concurrent_streams_run_as_groups() -> None:
    """TE issues chunk GEMMs round-robin on 3 streams: a TP-8 ring exchange's 8 chunks run
    as 8/3 groups of 3 rows-chunks each (not 8 serial small GEMMs), and a 4-way pipeline's
    as 4/3; a group is slower per FLOP than the whole GEMM and faster than a lone chunk."""
    exp = build_experiment(_exp(True, tp=8) | {"cluster": {"preset": "dgx-h100",
                                                           "num_gpus": 8}})

    compute_s = segment_timer(exp)
    timer = CollectiveTimer(exp.cluster)
    groups = tp_groups(exp.placement, 0)
    exposed = dict(lowering_costs(exp, compute_s, timer).tp_comm_exposed_s)
    gemms = exp.costs.tp_overlap_gemms()
    nbytes = 2 * 4096 * 5120
    for name, n, method in (("attn all-gather", 8, RING), ("mlp reduce-scatter", 4, PIPE)):
        gemm = gemms[TP_OVERLAP_GEMMS[name][0]]
        op = "all_gather" if name.endswith("all-gather") else "reduce_scatter"
        g = n / 3 * compute_s(chunked(gemm, n / 3))
        assert compute_s(gemm) < g < n * compute_s(chunked(gemm, n))
        assert exposed[name] == pytest.approx(
            pipelined_s(method, timer(op, groups, nbytes), g, 8, 132) - compute_s(gemm))


def test_transformer_engine_1x_keeps_every_sm_for_the_gemms() -> None:
    """training.framework megatron-core-r0.8 (TE 1.x: set_sm_margin 0 for every method) times
    the pipelined and bulk pairs with the GEMM on all 132 SMs, so each of their collectives
    adds less than under Megatron-LM's TE 2.x margin; the ring exchanges, which take no
    margin under either, add the same."""
    exposed = {}
    for fw in ("megatron", "megatron-core-r0.8"):
        data = _exp(True, tp=8) | {"cluster": {"preset": "dgx-h100", "num_gpus": 8},
                                   "training": {"micro_batch_size": 1, "num_microbatches": 1,
                                                "framework": fw}}
        exp = build_experiment(data)

        compute_s = segment_timer(exp)
        exposed[fw] = dict(lowering_costs(exp, compute_s,
                                          CollectiveTimer(exp.cluster)).tp_comm_exposed_s)
    te2, te1 = exposed["megatron"], exposed["megatron-core-r0.8"]
    for name, (_, layer) in TP_OVERLAP_GEMMS.items():
        if method_of(layer).sm_margin:
            assert te1[name] < te2[name], name
        else:
            assert te1[name] == pytest.approx(te2[name]), name


def test_backward_gathers_saved_inputs_again_beside_the_dgrad_gemm() -> None:
    """Megatron's sequence parallelism saves the QKV and FC1 GEMMs' s/t input shards and
    all-gathers them again in the backward beside the input-gradient GEMM: each adds
    max(c, g + 0.189·min(c, g)) - g (NCCL beside it, slowing it:
    sim.contention) or TE's bulk pair (userbuffers), two a layer; a framework
    that saves the gathered input (the sweep's ``scaling``) has none, nor has a run without
    sequence parallelism."""
    for overlap in (False, True):
        exp = build_experiment(_exp(overlap, tp=8) | {"cluster": {"preset": "dgx-h100",
                                                                  "num_gpus": 8}})

        compute_s = segment_timer(exp)
        timer = CollectiveTimer(exp.cluster)
        c = timer("all_gather", tp_groups(exp.placement, 0), 2 * 4096 * 5120)
        exposed = dict(lowering_costs(exp, compute_s, timer).tp_comm_exposed_s)
        gemms = exp.costs.tp_overlap_gemms()
        for name, (gemm, layer) in SP_REGATHER_GEMMS.items():
            g = compute_s(gemms[gemm])
            method = method_of(layer) if overlap else NCCL_BESIDE
            assert exposed[name] == pytest.approx(pipelined_s(method, c, g, 8, 132) - g)
            assert exposed[name] >= 0
        names = [i.name for i in api.simulate(exp).program.instructions
                 if isinstance(i, Collective) and "input all-gather" in i.name and i.gpu == 0]
        # two a layer, one micro-batch, four layers; and the output layer's (_head_tp)
        assert len([n for n in names if " L" in n]) == 2 * 4
        assert [n for n in names if " L" not in n] == ["0B0 head bwd input all-gather"]
    for changes in ({"training": {"micro_batch_size": 1, "num_microbatches": 1,
                                  "framework": "scaling"}},
                    {"parallel": {"tp": 4, "sequence_parallel": False}}):
        exp = build_experiment(_exp(False) | changes)
        assert not any("input all-gather" in i.name for i in api.simulate(exp).program.instructions
                       if isinstance(i, Collective))


def _exp(overlap: bool, tp: int = 4, **parallel) -> dict:
    return {"name": "ov", "model": {"preset": "llama2-13b", "num_layers": 4, "seq_length": 4096},
            "cluster": {"preset": "dgx-h100", "num_gpus": tp},
            "parallel": {"tp": tp, "sequence_parallel": True, "tp_comm_overlap": overlap}
            | parallel,
            "training": {"micro_batch_size": 1, "num_microbatches": 1}}


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
def test_step_is_the_blocking_step_less_what_the_pipelines_hide(fidelity: str) -> None:
    """One GPU's chain (one stage, one micro-batch): every TP collective is on the critical
    path, so overlap shortens the step by sum(c - exposed) over the 8 collectives of each
    layer, c the collective alone (the collapsed timer, which the full run's NVLink flows
    match here)."""
    base_exp, ov_exp = build_experiment(_exp(False)), build_experiment(_exp(True))
    base = api.simulate(base_exp, fidelity=fidelity)
    ov = api.simulate(ov_exp, fidelity=fidelity)
    timer = CollectiveTimer(ov_exp.cluster)
    groups = tp_groups(ov_exp.placement, 0)

    compute_s = segment_timer(ov_exp)
    exposed = dict(lowering_costs(ov_exp, compute_s, timer).tp_comm_exposed_s)
    blocking = dict(lowering_costs(base_exp, compute_s, timer).tp_comm_exposed_s)
    head = {"head bwd input all-gather"}  # the output layer's, NCCL beside it in both
    assert set(exposed) == set(TP_OVERLAP_GEMMS) | set(SP_REGATHER_GEMMS) | head
    assert set(blocking) == set(SP_REGATHER_GEMMS) | head  # second all-gathers beside NCCL
    assert exposed["head bwd input all-gather"] == blocking["head bwd input all-gather"]
    nbytes = 2 * 4096 * 5120
    hidden = 4 * sum(timer("all_gather" if name.endswith("all-gather") else "reduce_scatter",
                           groups, nbytes) - exposed[name] for name in TP_OVERLAP_GEMMS)
    hidden += 4 * sum(blocking[name] - exposed[name] for name in SP_REGATHER_GEMMS)
    assert hidden > 0
    assert ov.stats["step_time_s"] == pytest.approx(base.stats["step_time_s"] - hidden,
                                                    rel=1e-6)


def test_full_and_collapsed_agree_and_default_is_unchanged() -> None:
    exp = build_experiment(_exp(True, tp=8) | {"cluster": {"preset": "dgx-h100",
                                                           "num_gpus": 16}})
    full = api.simulate(exp, fidelity="full").stats["step_time_s"]
    assert api.simulate(exp, fidelity="collapsed").stats["step_time_s"] == pytest.approx(
        full, rel=1e-9)
    off = build_experiment(_exp(False))
    assert all((i.duration_s is None) != ("input all-gather" in i.name)
               for i in api.simulate(off).program.instructions
               if isinstance(i, Collective) and i.kind == "tp")


def test_without_tp_nothing_changes() -> None:
    one = {"cluster": {"preset": "dgx-h100", "num_gpus": 1}}
    a = api.simulate(build_experiment(_exp(False, tp=1) | one)).stats
    b = api.simulate(build_experiment(_exp(True, tp=1) | one)).stats
    assert a == b


@pytest.mark.parametrize("change,match", [
    ({"parallel": {"tp": 4, "sequence_parallel": False, "tp_comm_overlap": True}},
     "only when sequence parallelism is enabled"),
    ({"model": {"preset": "mixtral-8x7b", "num_layers": 2, "seq_length": 1024}},
     "mixture-of-experts"),
    ({"cluster": {"topology": "switch", "num_gpus": 4, "gpus_per_node": 4, "gpu": "MI300X",
                  "link_bandwidth_GBps": 100.0}}, "no SM count"),
])
def test_refused_where_not_modelled(change: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_experiment(_exp(True) | change)


def test_jobs_sharing_a_cluster_refuse_it() -> None:
    """Several jobs' collectives must meet on the network; a fixed-time TP collective would
    not (sim.jobs)."""
    import yaml
    from conftest import ROOT

    from sim.jobs import build_jobs, simulate_jobs

    data = yaml.safe_load((ROOT / "workloads" / "examples" / "two-jobs-shared-fabric.yaml")
                          .read_text(encoding="utf-8"))
    data["jobs"][0]["parallel"] |= {"sequence_parallel": True, "tp_comm_overlap": True}
    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        simulate_jobs(build_jobs(data))


def test_search_refuses_it() -> None:
    from sim.search.space import SearchContext

    data = _exp(True) | {"cluster": {"preset": "dgx-h100", "num_gpus": 8}}
    data["training"] = {"micro_batch_size": 1, "global_batch_size": 16}
    with pytest.raises(ConfigError, match="sim search does not search with it"):
        SearchContext.build(data)


def test_async_input_gradient_reduce_scatter_beside_the_wgrad_gemm_when_turned_on() -> None:
    """``sp_async_grad_reduce_scatter`` (off in every shipped profile but nemo-launcher-2022,
    docs/contention.md):
    without userbuffers the QKV / FC1 input gradient's reduce-scatter runs beside the
    weight-gradient GEMM, slowing it by NCCL's share (sim.contention): it adds
    max(c, g + s·min(c, g)) - g, more than zero."""
    from sim.contention import compute_slowdown
    from sim.tpoverlap import with_overlap

    exp = build_experiment(_exp(False, tp=8) | {"cluster": {"preset": "dgx-h100",
                                                            "num_gpus": 8}})
    assert not exp.costs.sp_async_grad_reduce_scatter  # the megatron profile's: off

    compute_s = segment_timer(exp)
    timer = CollectiveTimer(exp.cluster)
    groups = tp_groups(exp.placement, 0)
    costs = replace(exp.costs, sp_async_grad_reduce_scatter=True)
    exposed = dict(with_overlap(costs, "H100", compute_s,
                                lambda op, nbytes: timer(op, groups, nbytes),
                                overlap=False).tp_comm_exposed_s)
    r = timer("reduce_scatter", groups, 2 * 4096 * 5120)
    gemms = costs.tp_overlap_gemms()
    s = compute_slowdown()
    for name in ("attn bwd reduce-scatter", "mlp bwd reduce-scatter"):
        g = compute_s(gemms[TP_OVERLAP_GEMMS[name][0]])
        assert exposed[name] == pytest.approx(max(r, g + s * min(r, g)) - g)
        assert exposed[name] > 0


def test_non_sp_input_gradient_all_reduce_beside_the_wgrad_gemm() -> None:
    """The megatron profile's ``tp_async_grad_all_reduce`` (Megatron-LM's
    ColumnParallelLinearWithAsyncAllreduce): without sequence parallelism the QKV / FC1 input
    gradient's all-reduce runs beside the weight-gradient GEMM and adds max(c, g +
    s·min(c, g)) - g; the forward all-reduces and every profile without it keep blocking."""
    from sim.contention import compute_slowdown
    from sim.tpoverlap import all_reduces_beside, with_overlap

    data = _exp(False, tp=8, sequence_parallel=False) | {"cluster": {"preset": "dgx-h100",
                                                                     "num_gpus": 8}}
    exp = build_experiment(data)
    assert exp.costs.tp_async_grad_all_reduce and all_reduces_beside(exp.costs)
    compute_s = segment_timer(exp)
    timer = CollectiveTimer(exp.cluster)
    groups = tp_groups(exp.placement, 0)
    exposed = dict(with_overlap(exp.costs, "H100", compute_s,
                                lambda op, nbytes: timer(op, groups, nbytes),
                                overlap=False).tp_comm_exposed_s)
    assert set(exposed) == {"attn bwd all-reduce", "mlp bwd all-reduce", "head bwd all-reduce"}
    c = timer("all_reduce", groups, 2 * 4096 * 5120)
    gemms = exp.costs.tp_overlap_gemms()
    s = compute_slowdown()
    for name, gemm in (("attn bwd all-reduce", "qkv"), ("mlp bwd all-reduce", "fc1")):
        g = compute_s(gemms[gemm])
        assert exposed[name] == pytest.approx(max(c, g + s * min(c, g)) - g)
        assert 0 < exposed[name] < c
    g = compute_s(exp.costs.head_gemm())  # the output layer's, beside its own wgrad GEMM
    assert exposed["head bwd all-reduce"] == pytest.approx(max(c, g + s * min(c, g)) - g)
    blocking = build_experiment(data | {"training": data["training"]
                                        | {"framework": "deepspeed"}})
    assert not all_reduces_beside(blocking.costs)
    sp = build_experiment(_exp(False, tp=8) | {"cluster": {"preset": "dgx-h100",
                                                           "num_gpus": 8}})
    assert not all_reduces_beside(sp.costs)


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
def test_non_sp_async_all_reduce_shortens_the_step(fidelity: str) -> None:
    """One stage, one micro-batch: the step with the backward all-reduces beside the wgrad
    GEMMs is shorter than with them blocking by (c - exposed) per layer and block."""
    from sim.tpoverlap import lowering_costs

    data = _exp(False, tp=8, sequence_parallel=False) | {"cluster": {"preset": "dgx-h100",
                                                                     "num_gpus": 8}}
    exp = build_experiment(data)
    off = replace(exp, costs=replace(exp.costs, tp_async_grad_all_reduce=False))
    on_s = api.simulate(exp, fidelity=fidelity).stats["step_time_s"]
    off_s = api.simulate(off, fidelity=fidelity).stats["step_time_s"]
    timer = CollectiveTimer(exp.cluster)
    groups = tp_groups(exp.placement, 0)
    exposed = dict(lowering_costs(exp, segment_timer(exp), timer).tp_comm_exposed_s)
    c = timer("all_reduce", groups, 2 * 4096 * 5120)
    saved = 4 * sum(c - e for name, e in exposed.items() if name != "head bwd all-reduce")
    saved += c - exposed["head bwd all-reduce"]  # the output layer's, once
    assert off_s - on_s == pytest.approx(saved, rel=0.02)


def test_costs_with_exposed_times_are_one_object_per_pairs() -> None:
    """Lowering the same experiment twice gives the same costs object (so the folds the first
    run kept on it are found again), equal to a fresh replace; other exposed times another."""
    from base.replaced import replaced
    from sim.tpoverlap import lowering_costs

    data = _exp(False, tp=8, sequence_parallel=False) | {"cluster": {"preset": "dgx-h100",
                                                                     "num_gpus": 8}}
    exp = build_experiment(data)
    timer = CollectiveTimer(exp.cluster)
    first = lowering_costs(exp, segment_timer(exp), timer)
    assert first is not exp.costs and first.tp_comm_exposed_s
    assert lowering_costs(exp, segment_timer(exp), timer) is first
    assert first == replace(exp.costs, tp_comm_exposed_s=first.tp_comm_exposed_s)
    other = tuple((name, s * 2) for name, s in first.tp_comm_exposed_s)
    assert replaced(exp.costs, tp_comm_exposed_s=other) is not first
    assert replaced(exp.costs, tp_comm_exposed_s=other).tp_comm_exposed_s == other
