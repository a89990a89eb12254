"""PyTorch's async TP (torchtitan's ``enable_async_tensor_parallel``) as the
``fsdp-compile`` profile runs ``parallel.tp_comm_overlap`` (:mod:`sim.tpoverlap`, the data
file's ``[symmetric_memory]``), and torchao's fp8 TP all-gathers (``tp_all_gather_fp8``)."""

from __future__ import annotations

import tomllib

import pytest
from conftest import segment_timer

from base.errors import ConfigError
from sim import api
from sim.commtime import CollectiveTimer
from sim.experiment import build_experiment
from sim.tpoverlap import (
    DATA_FILE,
    SYMM_MEM_STREAMS,
    Method,
    chunked,
    exposed_s,
    lowering_costs,
    pipelined_s,
    symm_mem_method,
    symm_mem_reduce_bytes,
)
from workloads.costs import ComputeSeg
from workloads.frameworks import FRAMEWORKS
from workloads.layer_work import TP_OVERLAP_GEMMS
from workloads.lowering.groups import tp_groups
from workloads.program import Collective

RING = Method("ring_exchange", 0, 1, False)
FUSED = {"attn all-gather", "attn reduce-scatter", "mlp all-gather", "mlp reduce-scatter",
         "attn bwd all-gather", "mlp bwd all-gather"}
"""What Inductor's micro-pipeline pass fuses with a matmul: every all-gather feeding a
matmul and the forward reduce-scatters of one matmul's output; not the backward
reduce-scatters of the summed input gradients."""


def _exp(overlap: bool, tp: int = 4, framework: str = "fsdp-compile",
         precision: str = "bf16") -> dict:
    return {"name": "atp", "model": {"preset": "llama2-13b", "num_layers": 4,
                                     "seq_length": 4096},
            "cluster": {"preset": "dgx-h100", "num_gpus": tp},
            "parallel": {"tp": tp, "sequence_parallel": True, "tp_comm_overlap": overlap},
            "training": {"micro_batch_size": 1, "num_microbatches": 1,
                         "framework": framework, "precision": precision}}


def test_data_names_the_fused_patterns_with_their_source() -> None:
    data = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))["symmetric_memory"]
    assert "micro_pipeline_tp" in data["source"] and "_pipelined_all_gather" in data["source"]
    fused = {name for name, (_, layer) in TP_OVERLAP_GEMMS.items()
             if symm_mem_method(layer) is not None}
    assert fused == FUSED
    assert all(symm_mem_method(layer) in (RING, None) for _, layer in TP_OVERLAP_GEMMS.values())
    assert symm_mem_method("qkv_wgrad") is None and symm_mem_method("fc1_wgrad") is None
    # the stacked partials read (one output's bytes), their sum written (1/tp of it)
    assert symm_mem_reduce_bytes(8.0, 4) == pytest.approx(10.0)


def test_profiles() -> None:
    assert FRAMEWORKS["fsdp-compile"].tp_overlap == "symmetric-memory"
    assert FRAMEWORKS["fsdp"].tp_overlap == "none"
    assert FRAMEWORKS["megatron"].tp_overlap == "userbuffers"
    assert "_micro_pipeline_tp" in FRAMEWORKS["fsdp-compile"].source("tp_overlap")
    assert "Async TP requires" in FRAMEWORKS["fsdp"].source("tp_overlap")
    assert FRAMEWORKS["fsdp"].tp_all_gather_fp8 and FRAMEWORKS["fsdp-compile"].tp_all_gather_fp8
    assert FRAMEWORKS["megatron"].tp_all_gather_fp8  # Transformer Engine: fp8 ln_out gathered
    assert "eab345c" in FRAMEWORKS["fsdp"].source("tp_all_gather_fp8")
    assert "ln_out_dtype" in FRAMEWORKS["megatron"].source("tp_all_gather_fp8")


def test_eager_torchtitan_refuses_it() -> None:
    with pytest.raises(ConfigError, match="Async TP requires --training.compile"):
        build_experiment(_exp(True, framework="fsdp"))


def test_fused_collectives_are_ring_exchanges_the_rest_stay_nccl() -> None:
    """Each fused pair as a ring exchange of tp chunk GEMMs, two at once, beside its
    collective alone; a fused reduce-scatter adds its local sum of the stacked partials."""
    exp = build_experiment(_exp(True))
    compute_s = segment_timer(exp)
    timer = CollectiveTimer(exp.cluster)
    groups = tp_groups(exp.placement, 0)
    costs = exp.costs
    exposed = dict(exposed_s(costs, compute_s, lambda op, n: timer(op, groups, n), 132,
                             kind="symmetric-memory"))
    assert set(exposed) == FUSED
    gemms = costs.tp_overlap_gemms()
    nbytes = 2 * 4096 * 5120
    for name in FUSED:
        gemm, _ = TP_OVERLAP_GEMMS[name]
        op = "all_gather" if name.endswith("all-gather") else "reduce_scatter"
        groups_at_once = 4 / SYMM_MEM_STREAMS
        g = groups_at_once * compute_s(chunked(gemms[gemm], groups_at_once))
        want = pipelined_s(RING, timer(op, groups, nbytes), g, 4, 132) - compute_s(gemms[gemm])
        if op == "reduce_scatter":
            want += compute_s(ComputeSeg("sum", elementwise_bytes=nbytes * (1 + 1 / 4)))
        assert exposed[name] == pytest.approx(want)


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
def test_step_is_the_blocking_step_less_what_the_fused_pairs_hide(fidelity: str) -> None:
    """One GPU's chain: overlap shortens the step by sum(c - exposed) over the six fused
    collectives of each layer; the two backward reduce-scatters stay as they were."""
    base_exp, ov_exp = build_experiment(_exp(False)), build_experiment(_exp(True))
    base = api.simulate(base_exp, fidelity=fidelity)
    ov = api.simulate(ov_exp, fidelity=fidelity)
    timer = CollectiveTimer(ov_exp.cluster)
    groups = tp_groups(ov_exp.placement, 0)
    exposed = dict(lowering_costs(ov_exp, segment_timer(ov_exp), timer).tp_comm_exposed_s)
    assert set(exposed) == FUSED
    nbytes = 2 * 4096 * 5120
    hidden = 4 * sum(timer("all_gather" if name.endswith("all-gather") else "reduce_scatter",
                           groups, nbytes) - exposed[name] for name in FUSED)
    assert hidden > 0
    assert ov.stats["step_time_s"] == pytest.approx(base.stats["step_time_s"] - hidden,
                                                    rel=1e-6)
    if fidelity == "collapsed":  # the collapsed lowering times every collective itself
        return
    timed = [i.name.split(" ", 2)[2] for i in ov.program.instructions
             if isinstance(i, Collective) and i.kind == "tp" and i.duration_s is None
             and i.gpu == 0 and i.name.split(" ", 2)[1].startswith("L")]  # the layers'
    assert sorted(timed) == 4 * ["attn bwd reduce-scatter"] + 4 * ["mlp bwd reduce-scatter"]


@pytest.mark.parametrize("framework", ["fsdp-compile", "megatron", "nemo-launcher"])
def test_fp8_tp_all_gathers_move_one_byte(framework: str) -> None:
    """torchao and Transformer Engine cast before they gather (both the input and the
    output gradient); the reduce-scatters stay bf16; bf16 keeps 2 bytes."""
    def tp_bytes(framework: str, precision: str) -> dict[str, float]:
        exp = build_experiment(_exp(False, framework=framework, precision=precision))
        return {i.name.split(" ", 2)[2]: i.nbytes for i in api.simulate(exp).program.instructions
                if isinstance(i, Collective) and i.kind == "tp" and i.gpu == 0
                and " L0 " in i.name}

    bsh = 4096 * 5120
    fp8 = tp_bytes(framework, "fp8")
    assert {fp8[n] for n in fp8 if n.endswith("all-gather")} == {bsh}
    assert {fp8[n] for n in fp8 if n.endswith("reduce-scatter")} == {2 * bsh}
    assert set(tp_bytes(framework, "bf16").values()) == {2 * bsh}


def test_transformer_engine_overlap_times_fp8_all_gathers() -> None:
    """Under userbuffers (Megatron's profile, fp8) every overlapped all-gather is timed on
    the fp8 copy (b·s·h bytes), every reduce-scatter on bf16 (2·b·s·h), and each pair's
    exposed time is the method's pipelined pair on those bytes less the whole GEMM."""
    exp = build_experiment(_exp(True, framework="megatron", precision="fp8"))
    compute_s = segment_timer(exp)
    timer = CollectiveTimer(exp.cluster)
    groups = tp_groups(exp.placement, 0)
    moved: dict[str, set[float]] = {"all_gather": set(), "reduce_scatter": set()}

    def collective_s(op: str, nbytes: float) -> float:
        moved[op].add(nbytes)
        return timer(op, groups, nbytes)

    exposed = dict(exposed_s(exp.costs, compute_s, collective_s, 132, kind="userbuffers"))
    bsh = 4096 * 5120
    assert moved == {"all_gather": {bsh}, "reduce_scatter": {2 * bsh}}
    bf16 = build_experiment(_exp(True, framework="megatron", precision="bf16"))
    base = dict(exposed_s(bf16.costs, segment_timer(bf16),
                          lambda op, n: timer(op, groups, n), 132, kind="userbuffers"))
    # the fp8 GEMMs are shorter, the gathers half the bytes: each exposed time differs
    assert set(exposed) == set(base) and all(exposed[k] != base[k] for k in exposed
                                                if k.endswith("all-gather"))
