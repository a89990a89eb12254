"""ZeRO-3/FSDP, overlapped DP gradient buckets: closed forms on an α-β cluster.

The cluster is a full mesh (every ordered GPU pair has a private link) with no
latency and no launch cost, and ring algorithms forced, so a collective over
n GPUs of a buffer of S bytes takes exactly the α-β time of REFERENCES.md
with α = 0: all-reduce 2(n − 1)/n · S/B, reduce-scatter and all-gather
(n − 1)/n · S/B.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from base.errors import ConfigError
from sim.api import Result, simulate
from sim.experiment import Experiment, build_experiment
from workloads.costs import BF16, GradReady, ParamGather
from workloads.program import Collective, Compute
from workloads.schedules import Op

BANDWIDTH_Bps = 100e9
MESH = {"topology": "full-mesh", "link_bandwidth_GBps": BANDWIDTH_Bps / 1e9,
        "link_latency_us": 0.0, "collective_launch_us": 0.0,
        "collectives": {"all_reduce": "ring", "reduce_scatter": "ring", "all_gather": "ring"}}


def data(tp: int = 1, pp: int = 3, dp: int = 2, *, layers: int = 6, m: int = 3,
         **parallel: Any) -> dict:
    """GPT-3 1.3B shapes with ``layers`` layers, sequence 1024, micro-batch 1, fp16 (the
    cost model's 2-byte gradients, which the megatron profile keeps under fp16 only: the
    closed forms below count them)."""
    return {
        "name": "par",
        "model": {"preset": "gpt3-1.3b", "num_layers": layers, "seq_length": 1024},
        "cluster": MESH | {"num_gpus": tp * pp * dp},
        "parallel": {"tp": tp, "pp": pp, "dp": dp} | parallel,
        "training": {"micro_batch_size": 1, "global_batch_size": dp * m, "precision": "fp16"},
    }


def run(d: dict, fidelity: str = "full") -> Result:
    return simulate(build_experiment(d), fidelity=fidelity)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def exposed_dp_s(result: Result, gpu: int) -> float:
    """Time GPU ``gpu`` spends in DP collectives while its compute stream is idle."""
    spans = [s for s in result.timeline.spans if s.gpu == gpu]
    comm = _union([(s.start_s, s.end_s) for s in spans if s.kind == "dp"])
    busy = _union([(s.start_s, s.end_s) for s in spans if s.stream == "compute"])
    hidden = sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in busy)
    return sum(b - a for a, b in comm) - hidden


def layer_grad_bytes(exp: Experiment) -> float:
    return BF16 * exp.model.layer_params() / exp.placement.degree("tp")


# ----------------------------------------------------------------------------- buckets


def every_stage_bucketed(exp: Experiment) -> Experiment:
    """``exp`` with every pipeline stage cut into buckets (PyTorch DDP's way), not only stage 0
    as Megatron-core's DDP, the default profile's (``grad_buckets_stage0_only``)."""
    return replace(exp, costs=replace(exp.costs, grad_buckets_stage0_only=False))


def test_overlapped_buckets_leave_only_the_last_bucket_exposed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Middle stage of pp = 3 (layers only, 2 per stage), one layer's gradients per bucket,
    comm faster than a layer's backward, every stage bucketed: without overlap the whole
    stage's all-reduce, 2(d − 1)/d · k·G/B, is exposed; with it only the last bucket's,
    2(d − 1)/d · G/B. The step is shorter for it with the overlap free; with the compute
    the buckets slow (sim.contention, 0.189 of each layer's all-reduce on every stage's last
    backward, in series across the pipeline) it is longer here by at most those charges."""
    base = data(zero_stage=0)
    exp = build_experiment(base)
    g, d, k = layer_grad_bytes(exp), 2, 2
    bucket_MB = g / 1e6
    plain = run(base)
    over = simulate(every_stage_bucketed(build_experiment(
        data(zero_stage=0, overlap_grad_reduce=True, grad_bucket_MB=bucket_MB))),
        fidelity="full")
    middle = exp.placement.gpu(pp=1)
    ar = 2 * (d - 1) / d * g / BANDWIDTH_Bps
    assert exposed_dp_s(plain, middle) == pytest.approx(k * ar, rel=1e-9)
    assert exposed_dp_s(over, middle) == pytest.approx(ar, rel=1e-9)
    # one all-reduce per layer of the last micro-batch's backward, none at the step end
    buckets = [i for i in over.program.instructions
               if isinstance(i, Collective) and i.kind == "dp" and i.gpu == middle]
    assert [i.nbytes for i in buckets] == pytest.approx([g] * k)
    charges = sum(i.duration_s for i in over.program.instructions
                  if isinstance(i, Compute) and i.name.endswith("dp overlap"))
    assert 0 < over.stats["step_time_s"] - plain.stats["step_time_s"] < charges
    from sim import api
    monkeypatch.setattr(api, "fsdp_lowering_costs", lambda exp, costs, compute_s, timer: costs)
    free = simulate(every_stage_bucketed(build_experiment(
        data(zero_stage=0, overlap_grad_reduce=True, grad_bucket_MB=bucket_MB))),
        fidelity="full")
    assert exposed_dp_s(free, middle) == pytest.approx(ar, rel=1e-9)
    assert free.stats["step_time_s"] < plain.stats["step_time_s"]


def test_megatron_buckets_only_stage_0() -> None:
    """Megatron-core's DDP buckets only pipeline rank 0's first model chunk:
    megatron/core/distributed/distributed_data_parallel.py ``DistributedDataParallel.__init__``
    sets ``self.bucket_size = None`` when ``get_pipeline_model_parallel_rank() > 0`` or
    ``disable_bucketing`` (megatron/training/training.py ``get_model``:
    ``disable_bucketing=(model_chunk_idx > 0)``), and a bucket_size of None puts the chunk's
    parameters in one bucket (param_and_grad_buffer.py), reduced once the chunk's last
    backward has readied them all. So under the default profile (megatron) stage 0 is
    reduced layer by layer while every other stage is one collective of all its gradients
    after its last backward, exposed whole on the middle stage (2(d − 1)/d · k·G/B, as
    without overlap); with interleaving, rank 0's second chunk too."""
    exp = build_experiment(data(zero_stage=0, overlap_grad_reduce=True,
                                grad_bucket_MB=layer_grad_bytes(build_experiment(data())) / 1e6))
    assert exp.costs.grad_buckets_stage0_only
    r = simulate(exp, fidelity="full")
    g, d, k = layer_grad_bytes(exp), 2, 2
    middle = exp.placement.gpu(pp=1)
    buckets = [i for i in r.program.instructions
               if isinstance(i, Collective) and i.kind == "dp" and i.gpu == middle]
    assert [i.nbytes for i in buckets] == pytest.approx([k * g])
    assert exposed_dp_s(r, middle) == pytest.approx(2 * (d - 1) / d * k * g / BANDWIDTH_Bps,
                                                     rel=1e-9)
    first = [i.nbytes for i in r.program.instructions
             if isinstance(i, Collective) and i.kind == "dp" and i.gpu == 0]
    assert len(first) > 1 and max(first) <= g * (1 + 1e-9)  # stage 0: layer by layer
    stages = {i.name.split(" grad ")[0] for i in r.program.instructions
              if isinstance(i, Collective) and i.kind == "dp" and i.gpu == 0}
    assert stages == {"stage0"}
    inter = build_experiment(data(pp=2, layers=8, m=4, zero_stage=0, overlap_grad_reduce=True,
                                  grad_bucket_MB=g / 1e6, vpp=2) | {"schedule": "interleaved"})
    ops = [i for i in simulate(inter, fidelity="full").program.instructions
           if isinstance(i, Collective) and i.kind == "dp" and i.gpu == 0]
    rank0_chunk1 = [i for i in ops if i.name.startswith("stage2 ")]
    assert len(rank0_chunk1) == 1 and rank0_chunk1[0].nbytes == pytest.approx(
        inter.costs.grad_bytes(2))
    assert len([i for i in ops if i.name.startswith("stage0 ")]) > 1


def test_overlapped_reduce_scatter_under_zero1_and_step_saving() -> None:
    """ZeRO-1: buckets are reduce-scattered ((d − 1)/d · S/B each); the step shortens by the
    part of the last stage's reduction that the overlap hides."""
    exp = build_experiment(data(pp=1, layers=4))
    g, d = layer_grad_bytes(exp), 2
    over = run(data(pp=1, layers=4, overlap_grad_reduce=True, grad_bucket_MB=g / 1e6))
    ops = [i for i in over.program.instructions if isinstance(i, Collective) and i.gpu == 0]
    kinds = [i.op for i in ops]
    assert kinds.count("reduce_scatter") >= 4 and kinds[-1] == "all_gather"
    plain = run(data(pp=1, layers=4))
    rs_whole = (d - 1) / d * exp.costs.grad_bytes(0) / BANDWIDTH_Bps
    saved = plain.stats["step_time_s"] - over.stats["step_time_s"]
    assert 0 < saved < rs_whole


def test_small_buckets_split_a_layer_and_sum_to_the_stage() -> None:
    exp = build_experiment(data(pp=1, layers=2))
    total = exp.costs.grad_bytes(0)
    r = run(data(pp=1, layers=2, overlap_grad_reduce=True, grad_bucket_MB=10.0))
    rs = [i.nbytes for i in r.program.instructions
          if isinstance(i, Collective) and i.gpu == 0 and i.op == "reduce_scatter"]
    assert all(n <= 10e6 + 1e-6 for n in rs)
    assert sum(rs) == pytest.approx(total, rel=1e-12)


def test_overlap_off_is_todays_program() -> None:
    """The default keeps one gradient collective per stage after its last backward."""
    plain = run(data())
    explicit = run(data(overlap_grad_reduce=False))
    assert plain.stats == explicit.stats
    dp = [i for i in plain.program.instructions if isinstance(i, Collective) and i.kind == "dp"]
    assert {i.name.split(" grad ")[0] for i in dp if " grad " in i.name} == {
        "stage0", "stage1", "stage2"}


# ----------------------------------------------------------------------------- ZeRO-3


def test_zero3_memory_per_gpu_matches_the_formula() -> None:
    """Middle stage (k layers of L parameters on a TP rank, no embedding or head): ZeRO-3
    holds 16·k·L/d of sharded model state (Rajbhandari et al. 2020) instead of ZeRO-0's
    16·k·L, plus the gathered working set during a backward: the layer computed and the
    one prefetched (2 x 2L bytes) and the layer's unreduced gradient (2L)."""
    for tp in (1, 2):
        z0 = run(data(tp=tp, zero_stage=0))
        z3 = run(data(tp=tp, zero_stage=3))
        exp = z3.experiment
        lp = exp.model.layer_params() / tp
        k, d = 2, 2
        middle = exp.placement.gpu(pp=1)
        expected = 16 * k * lp / d - 16 * k * lp + 3 * BF16 * lp
        diff = z3.timeline.peak_memory_bytes(middle) - z0.timeline.peak_memory_bytes(middle)
        assert diff == pytest.approx(expected, rel=1e-12)
        costs = exp.costs
        assert costs.static_bytes((1,)) == pytest.approx(16 * k * lp / d, rel=1e-12)
        assert costs.zero3_working_bytes(Op(1, "F", 0)) == pytest.approx(2 * BF16 * lp)
        assert costs.zero3_working_bytes(Op(1, "B", 0)) == pytest.approx(3 * BF16 * lp)
        assert costs.zero3_working_bytes(Op(1, "W", 0)) == pytest.approx(BF16 * lp)


def test_zero3_moves_three_times_the_parameters_per_micro_batch() -> None:
    """Per micro-batch a stage all-gathers its parameters forward and backward and
    reduce-scatters its gradients: 3Ψ (Rajbhandari et al. 2020, sec. 7.2); nothing at
    the step end but the optimizer."""
    r = run(data(zero_stage=3))
    exp, m = r.experiment, 3
    middle = exp.placement.gpu(pp=1)
    ops = [i for i in r.program.instructions if isinstance(i, Collective) and i.gpu == middle]
    psi = exp.costs.grad_bytes(1)
    ag = sum(i.nbytes for i in ops if i.op == "all_gather")
    rs = sum(i.nbytes for i in ops if i.op == "reduce_scatter")
    assert ag == pytest.approx(2 * m * psi, rel=1e-12)
    assert rs == pytest.approx(m * psi, rel=1e-12)
    opt = next(i for i in r.program.instructions if isinstance(i, Compute) and i.kind == "opt"
               and i.gpu == middle)
    assert opt.id > max(i.id for i in ops)


def test_zero3_gathers_one_layer_ahead_and_hides_them() -> None:
    """Each gather starts only when the piece two before it has ended (one layer ahead), and
    with comm faster than compute every forward layer after the op's first starts the moment
    the previous one ends (its gather is hidden). Checked on the first forward: the head's
    h x V gather is longer than a layer's forward here, and in later forwards the second
    gather queues behind the previous backward's embedding reduce-scatter on the one DP
    stream, so those wait by design."""
    r = run(data(pp=1, layers=4, m=2, zero_stage=3))
    spans = sorted((s for s in r.timeline.spans if s.gpu == 0), key=lambda s: s.start_s)
    fwd = [s for s in spans if s.kind == "F" and s.name != "logits+loss"]
    first = fwd[0]
    by_op: dict[int, list] = {}
    for s in fwd:
        by_op.setdefault(s.mb, []).append(s)
    for pieces in [by_op[0]]:
        for a, b in zip(pieces, pieces[1:], strict=False):
            assert b.start_s == pytest.approx(a.end_s, abs=1e-12)
    gathers = [s for s in spans if s.kind == "dp" and "all_gather" in s.name]
    assert gathers[0].start_s == 0.0 and first.start_s == pytest.approx(gathers[0].end_s)
    # the second gather overlaps the first layer's forward
    assert gathers[1].start_s < first.end_s


def test_zero3_marked_segments_carry_every_gradient_once() -> None:
    exp = build_experiment(data(pp=2, zero_stage=3))
    costs = exp.costs
    for stage in (0, 1):
        segs = costs.op_segments(Op(stage, "B", 0), False, markers=True)
        ready = sum(s.nbytes for s in segs if isinstance(s, GradReady))
        assert ready == pytest.approx(costs.grad_bytes(stage), rel=1e-12)
        fwd = costs.op_segments(Op(stage, "F", 0), False, markers=True)
        assert sum(isinstance(s, ParamGather) for s in fwd) == 3 + stage  # layers (+ head)
    assert not any(isinstance(s, (GradReady, ParamGather))
                   for s in costs.op_segments(Op(0, "B", 0), False))


@pytest.mark.parametrize("schedule,vpp", [("zb-h1", 1), ("interleaved", 2)])
def test_zero3_and_buckets_run_with_split_and_interleaved_schedules(schedule: str,
                                                                    vpp: int) -> None:
    for extra in ({"zero_stage": 3}, {"overlap_grad_reduce": True}):
        d = data(tp=1, pp=2, dp=2, layers=4, m=4, vpp=vpp, **extra) | {"schedule": schedule}
        stats = run(d).stats
        assert stats["step_time_s"] > 0 and stats["exposed_comm_s"]["dp"] > 0


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("key,value,needle", [
    ("grad_bucket_MB", 0, "parallel.grad_bucket_MB"),
    ("grad_bucket_MB", -5.0, "parallel.grad_bucket_MB"),
    ("overlap_grad_reduce", "yes", "parallel.overlap_grad_reduce"),
])
def test_bad_values_name_the_key(key: str, value: Any, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_experiment(data(**{key: value}))


def test_zero3_needs_a_transformer() -> None:
    d = {"model": {"synthetic": {"forward_ms": 1, "backward_ms": 2}},
         "cluster": {"preset": "ideal", "num_gpus": 2},
         "parallel": {"dp": 2, "zero_stage": 3}, "training": {"num_microbatches": 2}}
    with pytest.raises(ConfigError, match="zero_stage=3"):
        build_experiment(d)


# ----------------------------------------------------------------------------- CP


def cp_data(cp: int, *, tp: int = 1, pp: int = 1, dp: int = 1, layers: int = 2,
            seq: int = 4096, bandwidth_GBps: float = BANDWIDTH_Bps / 1e9, m: int = 2,
            **parallel: Any) -> dict:
    d = data(tp=tp, pp=pp, dp=dp, layers=layers, m=m, cp=cp, **parallel)
    d["model"]["seq_length"] = seq
    d["cluster"] = d["cluster"] | {"num_gpus": tp * cp * pp * dp,
                                   "link_bandwidth_GBps": bandwidth_GBps}
    return d


def _work(costs: Any, op: Op) -> tuple[float, float]:
    """(GEMM FLOPs, attention-core FLOPs) of an op's segments, ring blocks included."""
    from workloads.costs import ComputeSeg, RingAttention
    gemm = core = 0.0
    for seg in costs.op_segments(op, False):
        if isinstance(seg, RingAttention):
            core += seg.steps * seg.block.attn_flops
            gemm += seg.steps * seg.block.flops
        elif isinstance(seg, ComputeSeg):
            gemm += seg.flops
            core += seg.attn_flops
    return gemm, core


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_divides_flops_and_activations(cp: int) -> None:
    """Each CP rank does 1/cp of the GEMMs and of the causal attention (load-balanced split)
    and keeps 1/cp of the activations; parameters (and so ZeRO's model state over dp·cp)
    are not split by CP."""
    one = build_experiment(cp_data(1)).costs
    many = build_experiment(cp_data(cp)).costs
    for kind in ("F", "B"):
        g1, c1 = _work(one, Op(0, kind, 0))
        gc, cc = _work(many, Op(0, kind, 0))
        assert gc == pytest.approx(g1 / cp, rel=1e-12)
        assert cc == pytest.approx(c1 / cp, rel=1e-12)
    assert many.layer_activation_bytes() == pytest.approx(one.layer_activation_bytes() / cp,
                                                          rel=1e-12)
    assert many.activation_bytes_per_mb(0) == pytest.approx(one.activation_bytes_per_mb(0) / cp,
                                                            rel=1e-12)
    assert many.stage_params(0) == one.stage_params(0)
    assert many.bytes_per_param() == pytest.approx(4 + 12 / cp)  # ZeRO-1 over dp·cp = cp


@pytest.mark.parametrize("cp,bandwidth_GBps", [(2, 100.0), (4, 100.0), (4, 2.0)])
def test_ring_attention_closed_form(cp: int, bandwidth_GBps: float) -> None:
    """Ring attention of one layer forward: cp blocks of compute T_b; pass j (K/V of a
    chunk, 2·2·(s/cp)·kv bytes at B) leaves when pass j − 1 arrived, so the core takes
    T_b + (cp − 1)·max(T_b, T_pass) (α = 0)."""
    r = run(cp_data(cp, layers=1, m=1, bandwidth_GBps=bandwidth_GBps))
    model = r.experiment.model
    t_pass = 2 * 2 * (model.seq_length / cp) * model.kv_dim / (bandwidth_GBps * 1e9)
    blocks = sorted((s for s in r.timeline.spans if s.gpu == 0 and s.kind == "F"
                     and s.name == "L0 core"), key=lambda s: s.start_s)
    assert len(blocks) == cp
    t_b = blocks[0].end_s - blocks[0].start_s
    ring_s = blocks[-1].end_s - blocks[0].start_s
    assert ring_s == pytest.approx(t_b + (cp - 1) * max(t_b, t_pass), rel=1e-9)
    passes = [s for s in r.timeline.spans if s.gpu == 0 and s.kind == "cp"
              and s.stream.startswith("send") and "L0 ring" in s.name]
    assert len(passes) == cp - 1


def test_cp_backward_passes_carry_kv_and_their_gradients() -> None:
    r = run(cp_data(2, layers=1, m=1))
    model = r.experiment.model
    kv = 2 * 2 * (model.seq_length / 2) * model.kv_dim
    from workloads.program import Send
    sends = [i for i in r.program.instructions if isinstance(i, Send) and i.kind == "cp"
             and i.gpu == 0]
    assert sorted(i.nbytes for i in sends) == pytest.approx([kv, 2 * kv])


def test_cp_gradients_reduce_over_dp_times_cp() -> None:
    r = run(cp_data(2, dp=2))
    dp_ops = [i for i in r.program.instructions if isinstance(i, Collective) and i.kind == "dp"]
    assert dp_ops and all(len(i.group) == 4 for i in dp_ops)


@pytest.mark.parametrize("change,needle", [
    ({"training": {"micro_batch_size": 1, "global_batch_size": 2, "attention": "fused"}},
     "flash"),
    ({"model": {"preset": "gpt3-1.3b", "num_layers": 2, "seq_length": 1022}}, "2\\*cp"),
])
def test_cp_refusals_name_the_key(change: dict, needle: str) -> None:
    d = cp_data(2) | change
    with pytest.raises(ConfigError, match=needle) as exc:
        build_experiment(d)
    assert "parallel.cp=2" in str(exc.value)


# ----------------------------------------------------------------------------- MoE / EP


def moe_data(ep: int, *, dp: int = 4, tp: int = 1, pp: int = 1, layers: int = 2,
             capacity_factor: float | None = None, **parallel: Any) -> dict:
    moe: dict[str, Any] = {"num_experts": 8, "top_k": 2}
    if capacity_factor is not None:
        moe["capacity_factor"] = capacity_factor
    d = data(tp=tp, pp=pp, dp=dp, layers=layers, m=2, ep=ep, **parallel)
    d["model"] = {"preset": "llama-7b", "num_layers": layers, "seq_length": 1024, "moe": moe,
                  "ffn_hidden_size": 4096}
    return d


def test_mixtral_parameters_and_model_flops() -> None:
    """Mixtral 8x7B: 46.7B parameters, 12.9B active (Jiang et al. 2024); MFU counts
    6·N_active + 12·l·h·s per token."""
    from workloads.models import PRESETS
    m = PRESETS["mixtral-8x7b"]
    l, h, f, V, kv = 32, 4096, 14336, 32000, 1024
    layer = 2 * h * h + 2 * h * kv + 8 * 3 * h * f + 8 * h + 2 * h
    assert m.num_params() == l * layer + 2 * V * h + h
    assert m.active_params() == m.num_params() - l * 6 * 3 * h * f
    assert m.num_params() / 1e9 == pytest.approx(46.7, abs=0.05)
    assert m.active_params() / 1e9 == pytest.approx(12.9, abs=0.05)
    assert m.model_flops_per_token() == 6 * m.active_params() + 12 * l * h * m.seq_length


@pytest.mark.parametrize("capacity_factor", [None, 1.5, 0.5])
def test_expert_flops_follow_tokens_times_top_k(capacity_factor: float | None) -> None:
    """Forward GEMM FLOPs of a MoE layer minus the dense model's attention: router
    2·n·h·E plus experts 2·n·k·c·h·f_e·3 (SwiGLU; buffers padded to capacity c, so c < 1
    computes fewer rows: the dropped copies)."""
    moe = build_experiment(moe_data(2, capacity_factor=capacity_factor)).costs
    dense = build_experiment(data(pp=1, dp=4, layers=2) | {
        "model": {"preset": "llama-7b", "num_layers": 2, "seq_length": 1024,
                  "ffn_hidden_size": 4096}}).costs
    n, h, f, k, E = 1024, 4096, 4096, 2, 8
    c = capacity_factor or 1.0
    attn, _ = dense._gemms()
    _, experts = moe._gemms()
    assert experts.flops == pytest.approx(2 * n * h * E + 2 * n * k * c * h * f * 3, rel=1e-12)
    assert moe._gemms()[0].flops == attn.flops


def test_all_to_alls_per_layer_and_their_alpha_beta_time() -> None:
    """Two all-to-alls forward and two backward per layer and micro-batch, b·s·k·h bf16
    each per GPU, over EP groups of ep consecutive DP ranks; pairwise on the α = 0 mesh,
    every pair's S/ep at once over its own link: S/(ep·B)."""
    ep, layers, m = 4, 2, 2
    r = run(moe_data(ep, dp=4, layers=layers))
    a2a = [i for i in r.program.instructions if isinstance(i, Collective) and i.kind == "ep"
           and i.gpu == 0]
    nbytes = 2 * 1024 * 2 * 4096
    assert len(a2a) == 4 * layers * m
    assert all(i.nbytes == nbytes and i.group == (0, 1, 2, 3) and i.op == "all_to_all"
               for i in a2a)
    spans = [s for s in r.timeline.spans if s.gpu == 0 and s.kind == "ep"]
    for s in spans:
        assert s.end_s - s.start_s == pytest.approx(nbytes / (ep * BANDWIDTH_Bps), rel=1e-9)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_moe_dispatch_bytes_per_rank_scale_as_one_over_tp_under_sp(tp: int) -> None:
    """Megatron-core's all-to-all dispatcher sends the s/t tokens a TP rank holds under SP:
    b·s·k·h/t bf16 per GPU; without SP every TP rank still sends all b·s·k·h."""
    def a2a_bytes(sp: bool) -> set[float]:
        r = run(moe_data(2, dp=2, tp=tp, sequence_parallel=sp))
        return {i.nbytes for i in r.program.instructions
                if isinstance(i, Collective) and i.op == "all_to_all"}
    full = 2 * 1024 * 2 * 4096
    assert a2a_bytes(True) == {full / tp}
    if tp > 1:
        assert a2a_bytes(False) == {full}


@pytest.mark.parametrize("zero", [0, 1])
def test_moe_model_state_shards_experts_over_ep(zero: int) -> None:
    """Each GPU holds E/ep experts; ZeRO shards dense state over dp and expert state over
    the dp/ep replicas of the same experts; expert gradients are reduced over those."""
    ep, dp = 2, 4
    costs = build_experiment(moe_data(ep, dp=dp, zero_stage=zero)).costs
    m = costs.model
    experts = 2 * m.layer_expert_params() / ep
    dense = 2 * (m.layer_params() - m.layer_expert_params()) + m.embedding_params() \
        + m.head_params()
    bpp = {0: lambda d: 16.0, 1: lambda d: 4 + 12 / d}[zero]
    assert costs.static_bytes((0,)) == pytest.approx(bpp(dp) * dense + bpp(dp // ep) * experts,
                                                     rel=1e-12)
    r = run(moe_data(ep, dp=dp, zero_stage=zero))
    groups = {i.group for i in r.program.instructions
              if isinstance(i, Collective) and i.kind == "dp" and "expert" in i.name}
    assert groups == {(0, 2), (1, 3)}


@pytest.mark.parametrize("change,needle", [
    ({"parallel": {"dp": 4, "ep": 3}}, "parallel.ep=3"),
    ({"parallel": {"dp": 4, "ep": 2, "placement": "ep-tp-cp-dp-pp"}}, "'ep' may only"),
])
def test_ep_refusals_name_the_key(change: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build_experiment(moe_data(2) | change)


def test_overlapped_buckets_reduce_experts_over_their_replicas() -> None:
    """With ep > 1 the buckets of the last backward hold dense gradients (over the DP
    group) and expert gradients (over the replicas with the same experts), each summing to
    the stage's share; nothing is left for the step end."""
    d = moe_data(2, dp=4, overlap_grad_reduce=True, grad_bucket_MB=50.0)
    r = run(d)
    costs = r.experiment.costs
    ops = [i for i in r.program.instructions if isinstance(i, Collective) and i.kind == "dp"
           and i.gpu == 0 and i.op == "reduce_scatter"]
    dense = [i for i in ops if "expert" not in i.name]
    expert = [i for i in ops if "expert" in i.name]
    assert all("bucket" in i.name for i in ops)
    assert sum(i.nbytes for i in dense) == pytest.approx(costs.grad_bytes(0), rel=1e-12)
    assert sum(i.nbytes for i in expert) == pytest.approx(costs.expert_grad_bytes(0),
                                                          rel=1e-12)
    assert {i.group for i in expert} == {(0, 2)} and {i.group for i in dense} == {(0, 1, 2, 3)}


def test_zero3_with_experts_gathers_and_scatters_them_over_their_replicas() -> None:
    """ZeRO-3 with ep > 1: each layer's dense parameters are gathered over the DP group and
    its E/ep experts over the dp/ep replicas holding them, per micro-batch forward and
    backward (2·m each), gradients reduce-scattered the same way (m); the working set
    counts the experts: F = 2·(P_dense + P_experts), B = 3·(P_dense + P_experts)."""
    ep, dp, m, layers = 2, 4, 2, 2
    r = run(moe_data(ep, dp=dp, layers=layers, zero_stage=3))
    costs = r.experiment.costs
    ops = [i for i in r.program.instructions if isinstance(i, Collective) and i.kind == "dp"
           and i.gpu == 0]
    experts = [i for i in ops if "experts" in i.name]
    assert {i.group for i in experts} == {(0, 2)}
    expert_layer = costs.expert_grad_bytes(0) / layers
    assert sum(i.nbytes for i in experts if i.op == "all_gather") == pytest.approx(
        2 * m * layers * expert_layer, rel=1e-12)
    assert sum(i.nbytes for i in experts if i.op == "reduce_scatter") == pytest.approx(
        m * layers * expert_layer, rel=1e-12)
    model = costs.model
    dense_layer = BF16 * (model.layer_params() - model.layer_expert_params())
    assert costs.static_bytes((0,)) == pytest.approx(
        16 / dp * (costs.stage_params(0) - costs.stage_expert_params(0))
        + 16 / (dp // ep) * costs.stage_expert_params(0), rel=1e-12)
    # one layer per unit on a middle stage
    mid = build_experiment(moe_data(ep, dp=dp, pp=3, layers=6, zero_stage=3)).costs
    unit = dense_layer + expert_layer
    assert mid.zero3_working_bytes(Op(1, "F", 0)) == pytest.approx(2 * unit, rel=1e-12)
    assert mid.zero3_working_bytes(Op(1, "B", 0)) == pytest.approx(3 * unit, rel=1e-12)


def test_ep_needs_moe_and_top_k_fits() -> None:
    with pytest.raises(ConfigError, match="parallel.ep=2: expert parallelism needs"):
        build_experiment(data(pp=1, dp=4, ep=2))
    bad = moe_data(2)
    bad["model"]["moe"] = {"num_experts": 2, "top_k": 3}
    with pytest.raises(ConfigError, match="model.moe.top_k=3"):
        build_experiment(bad)
    ok = build_experiment(moe_data(2, placement="tp-cp-ep-dp-pp"))
    assert ok.placement == build_experiment(moe_data(2)).placement


# ----------------------------------------------------------------------------- uneven stages


def test_user_layer_split_like_llama3() -> None:
    """[3, 4, 4, 3]: first and last stages one layer fewer (Llama 3); the memory and work
    of each stage follow its layers."""
    d = data(pp=4, dp=1, layers=14, m=8, layers_per_stage=[3, 4, 4, 3])
    exp = build_experiment(d)
    assert exp.costs.stage_layers == (3, 4, 4, 3)
    assert exp.costs.activation_bytes_per_mb(1) == pytest.approx(
        4 * exp.costs.layer_activation_bytes())
    r = run(d)
    spans = [s for s in r.timeline.spans if s.kind == "F" and s.mb == 0]
    per_stage = {s.stage: 0.0 for s in spans}
    for s in spans:
        per_stage[s.stage] += s.end_s - s.start_s
    assert per_stage[1] == pytest.approx(per_stage[2], rel=1e-12)
    assert per_stage[0] == pytest.approx(per_stage[1] * 3 / 4, rel=1e-9)


@pytest.mark.parametrize("split,needle", [
    ([4, 4, 4], "3 entries, but the pipeline has pp\\*vpp = 4"),
    ([4, 4, 4, 4], "sums to 16, not model.num_layers = 14"),
    ([5, 0, 5, 4], "at least one layer"),
])
def test_bad_layer_splits_name_the_key(split: list[int], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as exc:
        build_experiment(data(pp=4, dp=1, layers=14, m=8, layers_per_stage=split))
    assert "parallel.layers_per_stage=" in str(exc.value)


def test_end_stages_without_layers_like_llama3() -> None:
    """Llama 3's split (Dubey et al. 2024, sec. 3.3.2): the first model chunk holds only the
    embedding and the last only the output head, so pp*vpp may exceed the layers by two.
    The empty chunks run (full and collapsed agree, the reference engine too) and hold
    less than a chunk with a layer."""
    d = data(pp=2, dp=1, layers=6, m=4, vpp=4, layers_per_stage=[0, 1, 1, 1, 1, 1, 1, 0])
    d["schedule"] = "interleaved"
    exp = build_experiment(d)
    assert exp.costs.stage_layers == (0, 1, 1, 1, 1, 1, 1, 0)
    assert exp.costs.activation_bytes_per_mb(0) < exp.costs.activation_bytes_per_mb(2)
    full = simulate(exp).stats
    assert full == simulate(exp, reference=True).stats
    assert simulate(exp, fidelity="collapsed").stats["step_time_s"] == pytest.approx(
        full["step_time_s"], rel=1e-9)
    with pytest.raises(ConfigError, match="first stage without layers"):
        build_experiment(d | {"parallel": d["parallel"] | {"overlap_grad_reduce": True}})
    with pytest.raises(ConfigError, match=r"pp\*vpp = 2\*8 = 16 exceeds"):
        build_experiment(d | {"parallel": d["parallel"] | {"vpp": 8}}
                         | {"model": d["model"] | {"num_layers": 13}})


def test_layer_split_with_interleaving_counts_chunks() -> None:
    d = data(pp=2, dp=1, layers=8, m=4, vpp=2, layers_per_stage=[1, 3, 3, 1])
    d["schedule"] = "interleaved"
    assert build_experiment(d).costs.stage_layers == (1, 3, 3, 1)
    assert run(d).stats["step_time_s"] > 0


@pytest.mark.parametrize("ep", [1, 2])
def test_routing_imbalance_loads_the_busiest_ep_rank(ep: int) -> None:
    """Dropless with ep > 1, the busiest EP rank computes and receives ι times the balanced
    rows (expert GEMMs, all-to-all bytes, routed activations); with ep = 1 every expert is
    local and the imbalance changes nothing; a capacity factor pads every buffer to c."""
    def costs(**moe: Any):
        d = moe_data(ep)
        d["model"]["moe"].update(moe)
        return build_experiment(d).costs

    n, h, f, k, E, iota = 1024, 4096, 4096, 2, 8, 1.3
    base, skew = costs(), costs(routing_imbalance=iota)
    rows = iota if ep > 1 else 1.0
    _, experts = skew._gemms()
    assert experts.flops == pytest.approx(2 * n * h * E + 2 * n * k * rows * h * f * 3,
                                          rel=1e-12)
    assert skew._expert_rows == pytest.approx(n * k * rows, rel=1e-12)
    grow = skew.layer_activation_bytes() - base.layer_activation_bytes()
    assert (grow > 0) == (ep > 1)
    padded = costs(capacity_factor=1.5, routing_imbalance=iota)
    assert padded._gemms()[1].flops == costs(capacity_factor=1.5)._gemms()[1].flops
    if ep > 1:
        r = run(moe_data(ep) | {"model": moe_data(ep)["model"] | {
            "moe": {"num_experts": 8, "top_k": 2, "routing_imbalance": iota}}})
        a2a = [i for i in r.program.instructions if isinstance(i, Collective)
               and i.kind == "ep" and i.gpu == 0]
        assert a2a and all(i.nbytes == pytest.approx(2 * n * k * iota * h, rel=1e-12)
                           for i in a2a)


def test_routing_imbalance_below_one_is_rejected() -> None:
    d = moe_data(2)
    d["model"]["moe"]["routing_imbalance"] = 0.9
    with pytest.raises(ConfigError, match="routing_imbalance"):
        build_experiment(d)


@pytest.mark.parametrize(("capacity", "pad", "imbalance", "rows"), [
    (None, True, 1.3, 1.3),    # dropless: the busiest rank's routed copies
    (1.25, True, 1.3, 1.25),   # padded to capacity whatever the routing
    (0.5, True, 1.0, 0.5),     # padded to a capacity below the routed copies: the rest dropped
    (1.25, False, 1.3, 1.25),  # dropping without padding: capped at capacity
    (1.5, False, 1.3, 1.3),    # ... or the routed copies, if fewer
    (0.8, False, 1.0, 0.8),
])
def test_moe_all_to_all_bytes_follow_megatron_cores_dispatcher(
        capacity: float | None, pad: bool, imbalance: float, rows: float) -> None:
    """Megatron-core's all-to-all dispatcher: dropless, every rank's tokens·k copies (the
    busiest rank receiving imbalance × that); with a capacity factor c, capacity·E =
    c·tokens·k rows when padded, else the copies kept, min(c, imbalance) at the busiest."""
    d = moe_data(2, dp=2, capacity_factor=capacity)
    d["model"]["moe"] |= {"pad_to_capacity": pad, "routing_imbalance": imbalance}
    r = run(d)
    got = {i.nbytes for i in r.program.instructions
           if isinstance(i, Collective) and i.op == "all_to_all"}
    assert len(got) == 1 and got.pop() == pytest.approx(rows * 2 * 1024 * 2 * 4096)


def test_hierarchical_all_to_all_for_moe_from_the_cluster_override() -> None:
    """``cluster.collectives.all_to_all: hierarchical`` runs the MoE dispatch and combine
    intra-server first: with EP groups of 8 across servers of 4 it differs from pairwise."""
    def ep_comm(algo: str) -> float:
        d = moe_data(8, dp=16)
        d["cluster"] = {"topology": "switch", "num_gpus": 16, "gpus_per_node": 4,
                        "link_bandwidth_GBps": 25, "nvlink_bandwidth_GBps": 300,
                        "collectives": {"all_to_all": algo}}
        return run(d).stats["exposed_comm_s"]["ep"]

    flat, hier = ep_comm("pairwise"), ep_comm("hierarchical")
    assert flat > 0 and hier > 0 and flat != hier


def _dp_collectives(r: Result, gpu: int) -> dict[str, list[Collective]]:
    """GPU ``gpu``'s DP collectives of the step, by kind."""
    out: dict[str, list[Collective]] = {}
    for i in r.program.instructions:
        if isinstance(i, Collective) and i.gpu == gpu and i.kind == "dp":
            out.setdefault(i.op, []).append(i)
    return out


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_fsdp_under_pp_gathers_and_reduces_once_a_step(fidelity: str, schedule: str,
                                                       vpp: int) -> None:
    """torchtitan's FSDP2 under PP (``zero3_unsharded_under_pp``: no reshard after forward,
    no gradient sync until the last backward): each stage all-gathers its units once, in its
    first forward, and reduce-scatters them once, after its final op's compute; per op
    (the flag off) it gathers in every forward and backward and reduces every backward."""
    m = 4
    d = data(pp=2, dp=2, layers=4, m=m, vpp=vpp, zero_stage=3) | {"schedule": schedule}
    d["training"] |= {"framework": "fsdp", "precision": "bf16"}
    exp = build_experiment(d)
    assert exp.costs.zero3_once_per_step
    per_op = replace(exp, costs=replace(exp.costs, zero3_unsharded_under_pp=False))
    rank1 = exp.placement.gpu(pp=1)
    once = simulate(exp, fidelity=fidelity)
    every = simulate(per_op, fidelity=fidelity)
    mine = [s for s, r in enumerate(exp.schedule.stage_rank) if r == 1]
    split = exp.schedule.split_backward
    units = {s: sum(isinstance(g, ParamGather)
                    for g in exp.costs.op_segments(Op(s, "F", 0), split, markers=True))
             for s in mine}
    ready = {s: [g for g in exp.costs.op_segments(Op(s, "W" if split else "B", 0), split,
                                                  markers=True)
                 if isinstance(g, GradReady)] for s in mine}
    got, base = _dp_collectives(once, rank1), _dp_collectives(every, rank1)
    assert len(got["all_gather"]) == sum(units.values())
    assert len(got["reduce_scatter"]) == sum(len(v) for v in ready.values())
    assert sum(i.nbytes for i in got["reduce_scatter"]) == pytest.approx(
        sum(g.nbytes for v in ready.values() for g in v), rel=1e-12)
    assert len(base["all_gather"]) > m * sum(units.values())  # forward and backward
    assert len(base["reduce_scatter"]) == m * len(got["reduce_scatter"])
    # gathered in the first forward of each stage, reduced after its final op's compute
    for s in mine:
        assert {i.mb for i in got["all_gather"] if i.stage == s} == {0}
        assert {i.mb for i in got["reduce_scatter"] if i.stage == s} == {m - 1}
    assert sum(i.nbytes for v in got.values() for i in v) < sum(
        i.nbytes for v in base.values() for i in v) / (m - 1)


def test_fsdp_under_pp_final_backward_reduces_after_its_compute() -> None:
    """The final backward's markers: no gathers, every GradReady after its compute (the
    copy-in of the reduce-scatter with it), and the other ops without FSDP's copies."""
    d = data(pp=2, dp=2, layers=4, m=2, zero_stage=3)
    d["training"] |= {"framework": "fsdp", "precision": "bf16"}
    costs = build_experiment(d).costs
    segs = costs.op_segments(Op(1, "B", 0), False, markers=True)
    assert not any(isinstance(s, ParamGather) for s in segs)
    first = next(k for k, s in enumerate(segs) if isinstance(s, GradReady))
    assert all(isinstance(s, GradReady) for s in segs[first:])
    # every backward: no copies, the unsharded gradients accumulated in fp32 (2 + 4 + 4 bytes
    # a parameter); the final one adds the copy-in of the fp32 gradients (4 + 4)
    flag_off = replace(costs, zero3_unsharded_under_pp=False)
    layer = costs._layer_params_tp

    def moved(segs: tuple) -> float:
        return sum(s.elementwise_bytes for s in segs if not isinstance(s, GradReady))

    plain = moved(costs.op_segments(Op(1, "B", 0), False))
    per_op = moved(flag_off.op_segments(Op(1, "B", 0), False))
    assert plain - per_op == pytest.approx(10 * costs.stage_params(1) - 2 * (4 + 6) * layer)
    assert moved(segs) - plain == pytest.approx(2 * 8 * layer)
