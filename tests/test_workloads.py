"""Model shapes, costs and lowering of transformer workloads."""

from __future__ import annotations

from collections import Counter

import pytest

from sim import simulate
from sim.experiment import build_experiment
from workloads.costs import split_layers
from workloads.models import PRESETS
from workloads.program import Collective, Compute, Send


@pytest.mark.parametrize("name", ["gpt3-175b", "gpt3-1.3b", "gpt3-6.7b"])
def test_gpt_params_match_closed_form(name: str) -> None:
    """N = 12lh²(1 + 13/(12h) + (V + s)/(12lh)) (REFERENCES.md) plus the final layernorm (2h)."""
    m = PRESETS[name]
    l, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.seq_length
    closed = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert m.num_params() == pytest.approx(closed + 2 * h, rel=1e-12)


@pytest.mark.parametrize(("name", "billions"), [("gpt3-175b", 174.6), ("llama-13b", 13.0),
                                                ("llama-65b", 65.3), ("llama2-70b", 69.0),
                                                ("llama3-405b", 405.8), ("llama3-8b", 8.03)])
def test_preset_sizes(name: str, billions: float) -> None:
    assert PRESETS[name].num_params() / 1e9 == pytest.approx(billions, rel=5e-3)


def test_split_layers_is_even_and_complete() -> None:
    assert split_layers(24, 4) == (6, 6, 6, 6)
    assert split_layers(10, 4) == (3, 3, 2, 2)
    assert sum(split_layers(126, 16)) == 126


def _exp(**parallel) -> dict:
    par = {"tp": 2, "pp": 2, "dp": 2} | parallel
    return {
        "model": {"preset": "gpt3-1.3b", "num_layers": 4},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
        "parallel": par,
        "training": {"micro_batch_size": 1, "global_batch_size": 8},
    }


def test_lowering_inserts_megatron_tp_pp_and_dp_communication() -> None:
    exp = build_experiment(_exp())
    result = simulate(exp)
    instrs = result.program.instructions
    m, layers_per_stage, tp = 4, 2, 2
    tp_ops = Counter(i.op for i in instrs if isinstance(i, Collective) and i.kind == "tp")
    # 2 all-reduces forward + 2 backward per layer per micro-batch, on every GPU of the group;
    # and per micro-batch the embedding's forward one on the first stage's 4 GPUs and the
    # head's backward one on the last stage's 4
    assert tp_ops["all_reduce"] == 4 * layers_per_stage * m * 8 + 2 * m * 4
    sends = [i for i in instrs if isinstance(i, Send)]
    # activations forward and gradients backward across one stage boundary, per TP rank, per DP
    assert len(sends) == 2 * m * tp * 2
    dp_ops = Counter(i.op for i in instrs if isinstance(i, Collective) and i.kind == "dp")
    assert dp_ops == {"reduce_scatter": 8, "all_gather": 8}  # ZeRO-1: RS grads, AG params
    assert sum(isinstance(i, Compute) and i.kind == "opt" for i in instrs) == 8


def test_dp_gradient_reduction_waits_for_the_last_backward() -> None:
    result = simulate(build_experiment(_exp(zero_stage=0)))
    spans = result.timeline.spans
    for gpu in range(8):
        last_b = max(s.end_s for s in spans if s.gpu == gpu and s.kind == "B")
        dp = [s for s in spans if s.gpu == gpu and s.kind == "dp"]
        assert len(dp) == 1 and dp[0].name.endswith("all_reduce")
        assert dp[0].start_s >= last_b - 1e-12
        opt = [s for s in spans if s.gpu == gpu and s.kind == "opt"]
        assert opt[0].start_s >= dp[0].end_s - 1e-12


def test_single_gpu_has_no_bubble_and_no_communication() -> None:
    data = _exp(tp=1, pp=1, dp=1) | {"cluster": {"preset": "dgx-a100-80g", "num_gpus": 1}}
    stats = simulate(build_experiment(data)).stats
    assert stats["bubble_fraction"] == pytest.approx(0.0, abs=1e-12)
    assert all(v == 0 for v in stats["exposed_comm_s"].values())


def test_memory_model_zero_stages_and_activations() -> None:
    """Static bytes follow ZeRO's 16 / 4+12/d / 2+14/d bytes per parameter with 2-byte
    gradients (Megatron-LM's under fp16), 18 / 6+12/d with its fp32 ones under bf16."""
    def exp(zero: int, precision: str = "fp16"):
        d = _exp(zero_stage=zero)
        d["training"] = d["training"] | {"precision": precision}
        return build_experiment(d)

    exp0, exp1, exp2 = exp(0), exp(1), exp(2)
    n = exp0.costs.stage_params(0)
    assert exp0.costs.static_bytes((0,)) == pytest.approx(16 * n)
    assert exp1.costs.static_bytes((0,)) == pytest.approx((4 + 12 / 2) * n)
    assert exp2.costs.static_bytes((0,)) == pytest.approx((2 + 14 / 2) * n)
    assert exp(0, "bf16").costs.static_bytes((0,)) == pytest.approx(18 * n)
    assert exp(1, "bf16").costs.static_bytes((0,)) == pytest.approx((6 + 12 / 2) * n)


def test_activation_memory_korthikanti() -> None:
    """GPT layer, TP t, no SP: sbh(10 + 24/t + 5as/(ht)) bytes (Korthikanti et al. 2022)."""
    data = _exp() | {"training": {"micro_batch_size": 1, "global_batch_size": 8,
                                  "attention": "unfused"}}
    costs = build_experiment(data).costs
    m = costs.model
    s, h, a, t = m.seq_length, m.hidden_size, m.num_attention_heads, 2
    expected = s * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert costs.layer_activation_bytes() == pytest.approx(expected)
    sp = build_experiment(data | {"parallel": {"tp": 2, "pp": 2, "dp": 2,
                                               "sequence_parallel": True}}).costs
    assert sp.layer_activation_bytes() == pytest.approx(s * h * (34 + 5 * a * s / h) / t)
    full = build_experiment(data | {"training": {"global_batch_size": 8,
                                                 "recompute": "full"}}).costs
    assert full.layer_activation_bytes() == pytest.approx(2 * s * h)


def test_more_tensor_parallelism_is_not_free() -> None:
    """TP across servers (tp=16 on 8-GPU nodes) is slower than TP inside a server.

    NCCL-like channels use all eight NICs of a server (8 x 22.5 GB/s against 210 GB/s
    of NVLink), and on two servers auto takes the tree, which sends half the ring's bytes
    through the NICs (NCCL maintainers, NVIDIA/nccl issue 946), so the gap is small; the
    network's latency still makes it measurably slower."""
    base = {"model": {"preset": "gpt3-1.3b", "num_layers": 2}, "training": {"global_batch_size": 2}}
    inside = simulate(build_experiment(base | {"cluster": {"preset": "dgx-a100-80g",
                                                           "num_gpus": 8},
                                               "parallel": {"tp": 8}})).stats
    across = simulate(build_experiment(base | {"cluster": {"preset": "dgx-a100-80g",
                                                           "num_gpus": 16},
                                               "parallel": {"tp": 16}})).stats
    assert across["exposed_comm_s"]["tp"] > 1.03 * inside["exposed_comm_s"]["tp"]


def test_badly_placed_tp_group_is_slower_and_reported() -> None:
    """TP spread across servers (placement dp-cp-tp-pp) is slower than TP inside one.

    With 16 micro-batches per replica TP traffic dominates; with very few the
    spread placement can win, because it keeps the DP group inside one server.
    """
    data = {"model": {"preset": "gpt3-1.3b", "num_layers": 4},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
            "parallel": {"tp": 2, "dp": 8},
            "training": {"global_batch_size": 128}}
    good = simulate(build_experiment(data)).stats
    bad_data = data | {"parallel": {"tp": 2, "dp": 8, "placement": "dp-cp-tp-pp"}}
    bad = simulate(build_experiment(bad_data)).stats
    assert good["placement"]["tp_servers"] == 1 and bad["placement"]["tp_servers"] == 2
    assert good["placement"]["tp_group_of_gpu0"] == [0, 1]
    assert bad["placement"]["tp_group_of_gpu0"] == [0, 8]
    assert bad["step_time_s"] > 1.1 * good["step_time_s"]
    assert bad["exposed_comm_s"]["tp"] > 3 * good["exposed_comm_s"]["tp"]


def test_ops_hold_transient_working_memory_while_they_run() -> None:
    """A backward holds one layer of activation gradients (two layers with full recomputation)
    while it runs; the last stage also holds one fp32 buffer of the loss (its fp32 logits are
    stashed activations, not counted twice); the peak sees it."""
    from workloads.schedules import Op

    exp = build_experiment(_exp())
    costs = exp.costs
    layer = costs.layer_activation_bytes()
    assert costs.transient_bytes(Op(0, "F", 0)) == 0.0
    assert costs.transient_bytes(Op(0, "B", 0)) == pytest.approx(layer)
    m = costs.model
    softmax = 4 * m.seq_length * m.vocab_size / 2  # fp32, b = 1, t = 2
    assert costs.transient_bytes(Op(1, "F", 0)) == pytest.approx(softmax)
    logits = 6 * m.seq_length * m.vocab_size / 2  # bf16 logits and their fp32 copy
    assert costs.activation_bytes_per_mb(1) == pytest.approx(
        costs.activation_bytes_per_mb(0) + logits)
    full = build_experiment(_exp() | {"training": {"global_batch_size": 8,
                                                   "recompute": "full"}}).costs
    assert full.transient_bytes(Op(0, "B", 0)) == pytest.approx(2 * layer)
    # lowering allocates it at the op's start and frees it at its end
    program = simulate(exp, fidelity="full").program
    b_ops = [i for i in program.instructions if isinstance(i, Compute) and i.kind == "B"
             and i.stage == 0 and i.alloc_bytes]
    assert b_ops and all(i.alloc_bytes == pytest.approx(layer) for i in b_ops)


def _llama(tp: int = 1, mbs: int = 1, **extra) -> dict:
    return {"model": {"preset": "llama-13b", "num_layers": 2, "vocab_size": 128_000},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
            "parallel": {"tp": tp, "pp": 1, "dp": 8 // tp},
            "training": {"micro_batch_size": mbs, "global_batch_size": 8 * mbs} | extra}


def test_swiglu_activations_are_gate_up_and_product() -> None:
    """A LLaMA layer (fused RMSNorm, SwiGLU, flash attention, TP t, no SP) keeps, in s·b·h bytes:
    norm and GEMM inputs 8, Q, K, V 6/t, attention output 2/t, and of the MLP the gate and
    up projections' outputs and their product, 6·f/(h·t) (not silu(gate): the fused
    kernel recomputes it from the gate)."""
    for t in (1, 2):
        costs = build_experiment(_llama(tp=t)).costs
        m = costs.model
        s, h, f = m.seq_length, m.hidden_size, m.ffn_hidden_size
        expected = s * h * (8 + (6 + 2 + 6 * f / h) / t)
        assert costs.layer_activation_bytes() == pytest.approx(expected, rel=1e-12)
        # an eager RMSNorm keeps its input in fp32 (4) and its normalised output (2)
        # instead of its bf16 input (2): 4 more per norm, replicated across TP
        eager = build_experiment(_llama(tp=t, fused_norm=False)).costs
        assert eager.layer_activation_bytes() == pytest.approx(expected + 8 * s * h, rel=1e-12)


def test_gemm_shapes_are_the_real_matrix_shapes() -> None:
    """Each GEMM is timed at its own M x K x N: QKV n x h -> 3h/t, projection n x h/t -> h,
    gate/up n x h -> 2f/t, down n x f/t -> h, head n x h -> V/t; the efficiency curve
    sees the cube side (M·K·N)^(1/3)."""
    costs = build_experiment(_llama(tp=2)).costs
    m = costs.model
    n, h, f, V, t = m.seq_length, m.hidden_size, m.ffn_hidden_size, m.vocab_size, 2
    attn, mlp = costs._gemms()
    shapes = {"attn": [(n, h, 3 * h / t), (n, h / t, h)],
              "mlp": [(n, h, 2 * f / t), (n, f / t, h)]}
    for seg, name in ((attn, "attn"), (mlp, "mlp")):
        want = [((a * b * c) ** (1 / 3), 2 * a * b * c) for a, b, c in shapes[name]]
        assert [d for d, _ in seg.gemm_dims] == pytest.approx([d for d, _ in want])
        assert [x for _, x in seg.gemm_dims] == pytest.approx([x for _, x in want])
        assert seg.flops == pytest.approx(sum(x for _, x in want))
    head = costs._head(backward=False)
    assert len(head.gemm_dims) == 1
    assert head.gemm_dims[0] == pytest.approx(((n * h * V / t) ** (1 / 3), 2 * n * h * V / t))


def test_micro_batch_size_matters_more_for_thin_tp_shards() -> None:
    """With a shape-dependent GEMM efficiency, doubling the micro-batch shortens the GEMM
    time per token a little when the weights are whole and more when TP thins them
    (Hagemann et al.'s sweep: mbs 2 is no faster at TP1, 5-15% faster at TP8)."""
    from sim.device import DeviceProfile, compute_time_s
    from topologies.hardware import gpu_spec

    gpu = gpu_spec("A100-80GB")
    profile = DeviceProfile(gemm_half_dim=600.0)

    def per_token(tp: int, mbs: int) -> float:
        costs = build_experiment(_llama(tp=tp, mbs=mbs)).costs
        segs = costs._gemms()
        return sum(compute_time_s(gpu, profile, seg.flops, 0.0, gemm_dims=seg.gemm_dims)
                   for seg in segs) * tp / mbs

    gain_tp1 = per_token(1, 1) / per_token(1, 2) - 1
    gain_tp8 = per_token(8, 1) / per_token(8, 2) - 1
    assert 0 < gain_tp1 < 0.05
    assert gain_tp8 > 1.3 * gain_tp1


def test_gathered_logits_multiply_the_loss_memory_by_tp() -> None:
    """Without the vocabulary-parallel loss every TP rank holds all V logits: the last
    stage's stashed logits and the loss's working buffer grow t-fold, the layers do not."""
    from dataclasses import replace

    from workloads.schedules import Op

    costs = build_experiment(_llama(tp=4)).costs
    gathered = replace(costs, vocab_parallel_loss=False)
    m = costs.model
    n, V = m.seq_length, m.vocab_size
    layers = costs.stage_layers[0] * costs.layer_activation_bytes()
    assert costs.activation_bytes_per_mb(0) == pytest.approx(layers + 6 * n * V / 4)
    assert gathered.activation_bytes_per_mb(0) == pytest.approx(layers + 6 * n * V)
    assert gathered.transient_bytes(Op(0, "F", 0)) == pytest.approx(
        4 * costs.transient_bytes(Op(0, "F", 0)))
    assert gathered._head(False).elementwise_bytes == pytest.approx(
        4 * costs._head(False).elementwise_bytes)


def test_fragmentation_applies_to_dynamic_memory_only() -> None:
    """Peak = static state + (1 + fragmentation) x dynamic peak + reserved, per GPU."""
    from sim.device import DeviceProfile

    exp = build_experiment(_exp(pp=1, dp=4))  # one stage: every GPU holds the same state
    bare = simulate(exp, DeviceProfile(fragmentation=0.0, reserved_bytes=0.0))
    frag = simulate(exp, DeviceProfile(fragmentation=0.5, reserved_bytes=2**30)).stats
    static = max(bare.program.static_bytes)
    peak = bare.stats["peak_memory_gib"] * 2**30
    assert static > 0 and peak > static
    assert frag["peak_memory_gib"] * 2**30 == pytest.approx(
        static + 1.5 * (peak - static) + 2**30, rel=1e-9)
