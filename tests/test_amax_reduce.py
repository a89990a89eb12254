"""FP8 delayed scaling's blocking amax all-reduce (sim/amaxreduce.py): one all-reduce over the
amax reduction group at each model chunk's forward end and backward end, timed by the
collective timer, charged where Transformer Engine blocks on it."""

from __future__ import annotations

import pytest

from sim import amaxreduce
from sim.api import simulate
from sim.commtime import CollectiveTimer
from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import Experiment
from workloads.costs import CommSeg
from workloads.frameworks import FRAMEWORKS
from workloads.schedules import BACKWARD, FORWARD, Op


def _exp(reduction: str | None, precision: str = "fp8", tp: int = 2, dp: int = 8,
         pp: int = 1, cp: int = 1, m: int = 4) -> Experiment:
    """GPT-3 175B's blocks on 4 layers over two DGX H100 servers (TP 2 x DP 8 by default)."""
    training = {"micro_batch_size": 1, "global_batch_size": m * dp, "precision": precision}
    if reduction is not None:
        training["fp8_amax_reduction"] = reduction
    return Experiment.from_dict({
        "name": "amax", "model": {"preset": "gpt3-175b", "num_layers": 4, "seq_length": 512},
        "cluster": {"preset": "dgx-h100", "num_gpus": tp * dp * pp * cp},
        "parallel": {"tp": tp, "dp": dp, "pp": pp, "cp": cp,
                     "sequence_parallel": tp > 1},
        "training": training})


def test_groups_are_a_stages_tp_dp_cp_ranks_or_each_replicas_tp_cp_ranks() -> None:
    exp = _exp("tp-dp-cp", tp=2, dp=4, cp=2)
    (whole,) = amaxreduce.amax_groups(exp, "tp-dp-cp")
    assert sorted(whole) == sorted(g for g in range(16)
                                   if exp.placement.coords(g)["pp"] == 0)
    per_replica = amaxreduce.amax_groups(exp, "tp-cp")
    assert len(per_replica) == 4 and all(len(g) == 4 for g in per_replica)
    assert {exp.placement.coords(g)["dp"] for g in per_replica[1]} == {1}


def test_the_setting_overrides_the_framework_and_only_delayed_fp8_blocks() -> None:
    assert amaxreduce.reduction(_exp(None)) == FRAMEWORKS["megatron"].fp8_amax_reduction
    assert FRAMEWORKS["megatron"].fp8_amax_reduction == "tp-dp-cp"
    assert FRAMEWORKS["megatron-core-r0.8"].fp8_amax_reduction == "tp-cp"
    assert FRAMEWORKS["nemo1-te-layer"].fp8_amax_reduction == "none"
    assert FRAMEWORKS["fsdp"].fp8_amax_reduction == "none"
    assert amaxreduce.reduction(_exp("none")) == "none"
    assert amaxreduce.reduction(_exp("tp-dp-cp", precision="bf16")) == "none"
    for precision in ("bf16", "fp8-current"):
        exp = _exp("tp-dp-cp", precision=precision)
        assert amaxreduce.lowering_costs(exp, exp.costs, CollectiveTimer(exp.cluster)) \
            is exp.costs
    for name in ("megatron", "megatron-core-r0.8", "nemo-launcher", "nemo1-te-layer"):
        assert "transformer_engine" in FRAMEWORKS[name].source("fp8_amax_reduction") or \
            "TE" in FRAMEWORKS[name].source("fp8_amax_reduction")


def test_each_chunk_pass_ends_with_one_all_reduce_of_its_amaxes_at_the_timers_time() -> None:
    """Forward: 3 float32 a GEMM, 4 GEMMs a layer; backward 2 a GEMM; each timed by the
    collective timer on the stage's 16 GPUs."""
    exp = _exp("tp-dp-cp")
    timer = CollectiveTimer(exp.cluster)
    costs = amaxreduce.lowering_costs(exp, exp.costs, timer)
    (group,) = amaxreduce.amax_groups(exp, "tp-dp-cp")
    fwd = timer("all_reduce", (group,), 4.0 * 3 * 4 * 4)
    bwd = timer("all_reduce", (group,), 4.0 * 2 * 4 * 4)
    assert costs.fp8_amax_reduce_s == ((fwd, bwd),)
    assert 5e-6 < fwd < 1e-4 and 5e-6 < bwd < 1e-4  # latency-bound: microseconds
    for kind, t, nbytes in ((FORWARD, fwd, 192.0), (BACKWARD, bwd, 128.0)):
        segs = costs.op_segments(Op(0, kind, 0), False)
        (last,) = [s for s in segs if isinstance(s, CommSeg) and s.label == "fp8 amax all-reduce"]
        assert (last.duration_s, last.nbytes, last.op) == (t, nbytes, "all_reduce")


def test_without_a_pipeline_the_step_grows_by_both_all_reduces_every_micro_batch() -> None:
    """pp 1: the m micro-batches' forwards and backwards run back to back on each GPU, so
    the step is longer by exactly m x (forward + backward all-reduce)."""
    m = 4
    base = simulate(_exp("none", m=m), fidelity="collapsed").stats["step_time_s"]
    exp = _exp("tp-dp-cp", m=m)
    new = simulate(exp, fidelity="collapsed").stats["step_time_s"]
    (fwd, bwd), = amaxreduce.lowering_costs(exp, exp.costs,
                                            CollectiveTimer(exp.cluster)).fp8_amax_reduce_s
    assert new - base == pytest.approx(m * (fwd + bwd), rel=1e-6)
    tp_only = simulate(_exp("tp-cp", m=m), fidelity="collapsed").stats["step_time_s"]
    assert base < tp_only < new  # two GPUs on one NVSwitch: less latency than 16 on two servers


def test_corpus_rows_state_their_versions_reduction() -> None:
    """MLPerf v3.0 (TE 0.8 defaults) blocks over TP x DP; the NeMo 24.07 container's rows over
    TP x CP; the MXFP8 rows of Megatron-Bridge have no amax reduction."""
    v30 = load_source(CORPUS_DIR / "mlperf_training_v30_gpt3.csv")
    assert {r.get("fp8_amax_reduction") for r in v30.rows} == {"tp-dp-cp"}
    nemo = load_source(CORPUS_DIR / "nemo2412_fp8.csv")
    assert {r.get("fp8_amax_reduction") for r in nemo.rows} == {"tp-cp"}
    bridge = load_source(CORPUS_DIR / "megatron_bridge_perf.csv")
    assert {r.get("fp8_amax_reduction") for r in bridge.rows
            if r.get("precision") == "fp8"} == {"none"}
    row = v30.rows[0]
    assert row.experiment()["training"]["fp8_amax_reduction"] == "tp-dp-cp"
