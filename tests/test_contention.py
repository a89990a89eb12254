"""One contention rule for every collective the engine overlaps with compute
(:mod:`sim.contention`): the data, Megatron's bucketed DP collectives
(:mod:`sim.fsdpoverlap`), the context-parallel ring (:mod:`sim.cpoverlap`) and NCCL's
all-to-all under the MoE overlap (:mod:`sim.a2aoverlap`)."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest
from conftest import segment_timer

from sim import api
from sim.a2aoverlap import sm_share
from sim.commtime import CollectiveTimer
from sim.contention import DATA_FILE, charge, compute_slowdown, mechanism, share
from sim.cpoverlap import lowering_costs as cp_lowering_costs
from sim.cpoverlap import ring_overlap_s
from sim.experiment import build_experiment
from sim.fsdpoverlap import with_contention
from workloads.costs import ComputeSeg, RingAttention
from workloads.program import Compute
from workloads.schedules import BACKWARD, FORWARD, Op


def test_every_overlapped_collective_has_a_mechanism_with_its_source() -> None:
    data = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))
    assert "2507.03114" in data["compute_slowdown_source"]
    assert "enqueue.cc" in data["collectives"]["collectives_source"]
    for key, how in data["collectives"].items():
        if key.endswith("_source"):
            continue
        assert how in ("nccl", "sm_kernels", "copy_engine"), key
        if how == "sm_kernels":
            with pytest.raises(ValueError):
                share(key)
        else:
            assert share(key) == (compute_slowdown() if how == "nccl" else 0.0)
    assert mechanism("tp_ring_exchange") == "copy_engine"
    assert charge("grad_bucket", 2.0, 1.0) == pytest.approx(compute_slowdown())
    assert charge("grad_bucket", 0.5, 1.0) == pytest.approx(0.5 * compute_slowdown())
    assert charge("tp_ring_exchange", 1.0, 1.0) == 0.0


def _megatron(**parallel) -> dict:
    return {"name": "dp", "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 4},
            "cluster": {"preset": "dgx-h100", "num_gpus": 16},
            "parallel": {"tp": 2, "pp": 2, "dp": 4, "zero_stage": 1,
                         "overlap_grad_reduce": True, "overlap_param_gather": True} | parallel,
            "training": {"micro_batch_size": 1, "global_batch_size": 16}}


def test_megatron_buckets_charge_the_last_backward_and_the_first_forward_only() -> None:
    """overlap_grad_reduce: each layer of the step's last backward on a bucketed stage (stage
    0 under Megatron-core's DDP) loses s·min(c_rs, g_bwd); overlap_param_gather: each layer
    of stage 0's first forward s·min(c_ag, g_fwd); no other op, and nothing without them."""
    exp = build_experiment(_megatron())
    compute_s = segment_timer(exp)
    forward, backward, _, _ = exp.costs.zero3_layer_work()
    g_f = sum(compute_s(x) for x in forward if isinstance(x, ComputeSeg))
    g_b = sum(compute_s(x) for x in backward if isinstance(x, ComputeSeg))
    s = compute_slowdown()
    for c in (1e-5, 10.0):
        out = with_contention(exp.costs, compute_s, lambda op, nbytes, c=c: c)
        assert out.dp_overlap_s == pytest.approx((s * min(c, g_f), s * min(c, g_b)))
        assert out.zero3_overlap_s == (0.0, 0.0)
    out = with_contention(exp.costs, compute_s, lambda op, nbytes: 1e-3)
    marked = [x.label for x in out.op_segments(Op(0, BACKWARD, 0), False, markers=True)]
    assert sum(label.endswith("dp overlap") for label in marked) == 2  # stage 0's 2 layers
    assert not any("dp overlap" in x.label for x in out.op_segments(Op(0, BACKWARD, 0), False))
    last = [x.label for x in out.op_segments(Op(1, BACKWARD, 0), False, markers=True)]
    assert not any("dp overlap" in label for label in last)  # one bucket: waited for whole
    first = [x.label for x in out.op_segments(Op(0, FORWARD, 0), False, markers=True)]
    assert sum(label.endswith("dp overlap") for label in first) == 2
    off = replace(exp.costs, overlap_grad_reduce=False, overlap_param_gather=False)
    assert with_contention(off, compute_s, lambda op, n: 1.0) is off
    no_gather = with_contention(replace(exp.costs, overlap_param_gather=False), compute_s,
                                lambda op, n: 1e-3)
    assert no_gather.dp_overlap_s[0] == 0.0 < no_gather.dp_overlap_s[1]


@pytest.mark.parametrize("fidelity", ["collapsed", "full"])
def test_megatron_step_is_longer_by_the_charges(fidelity: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    exp = build_experiment(_megatron())
    result = api.simulate(exp, fidelity=fidelity)
    names = [i.name for i in result.program.instructions
             if isinstance(i, Compute) and i.gpu == 0 and i.name.endswith("dp overlap")]
    if fidelity == "full":  # (collapsed, folded into the op's compute)
        assert len(names) == 2 + 2  # stage 0's last backward and first forward, 2 layers each
    monkeypatch.setattr(api, "fsdp_lowering_costs", lambda exp, costs, compute_s, timer: costs)
    without = api.simulate(exp, fidelity=fidelity)
    assert result.stats["step_time_s"] > without.stats["step_time_s"]


def _cp(gathered: bool = False) -> dict:
    return {"name": "cp", "model": {"preset": "llama3-8b", "seq_length": 8192, "num_layers": 2},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
            "parallel": {"tp": 2, "pp": 1, "dp": 1, "cp": 4},
            "training": {"micro_batch_size": 1, "global_batch_size": 1,
                         "framework": "llama3" if gathered else "megatron"}}


def test_ring_passes_charge_the_attention_blocks_beside_them() -> None:
    """Ring CP: cp − 1 passes, each beside a block: (cp − 1)·s·min(c_pass, g_block), forward
    and backward (whose passes carry dK/dV too), emitted once after each ring; all-gather CP
    has no passes and no charge."""
    exp = build_experiment(_cp())
    assert not exp.costs.cp_kv_all_gather
    compute_s = segment_timer(exp)
    s = compute_slowdown()
    fwd, bwd = ring_overlap_s(exp.costs, compute_s, lambda nbytes: nbytes * 1e-12)
    forward, backward, _, _ = exp.costs.zero3_layer_work()
    rings = [[x for x in segs if isinstance(x, RingAttention)][-1] for segs in (forward, backward)]
    assert rings[1].nbytes == 2 * rings[0].nbytes
    for got, ring in zip((fwd, bwd), rings, strict=True):
        assert got == pytest.approx(3 * s * min(ring.nbytes * 1e-12, compute_s(ring.block)))
    real = cp_lowering_costs(exp, exp.costs, compute_s, CollectiveTimer(exp.cluster))
    assert 0 < real.cp_overlap_s[0] < real.cp_overlap_s[1]
    labels = [x.label for x in real.op_segments(Op(0, FORWARD, 0), False)]
    assert sum("cp overlap" in label for label in labels) == 2  # one a layer
    full = api.simulate(exp, fidelity="full").stats["step_time_s"]
    assert api.simulate(exp, fidelity="collapsed").stats["step_time_s"] == pytest.approx(
        full, rel=0.02)
    gathered = build_experiment(_cp(gathered=True))
    if gathered.costs.cp_kv_all_gather:
        assert cp_lowering_costs(gathered, gathered.costs, compute_s,
                                 CollectiveTimer(gathered.cluster)) is gathered.costs


def test_nccl_all_to_all_takes_nccls_share_under_the_moe_overlap() -> None:
    assert sm_share("alltoall", "H100") == pytest.approx(compute_slowdown())
    assert sm_share("flex", "H100") == pytest.approx(20 / 132)
