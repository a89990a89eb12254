"""The sweep's framework (Aleph Alpha's ``scaling``) as the validation models it: its
pipeline split, its sequence-parallel GEMM inputs, its unfused cross-entropy backward."""

from __future__ import annotations

from dataclasses import replace

import pytest

from base.errors import ConfigError
from sim.validate import FRAMEWORK, HAGEMANN_SWEEP, Row, load_rows
from workloads.costs import split_layers
from workloads.frameworks import FRAMEWORKS, apply_framework, stage_layers
from workloads.models import PRESETS
from workloads.schedules import BACKWARD, FORWARD, Op
from workloads.transformer import TransformerCosts

DATA = HAGEMANN_SWEEP
SCALING = FRAMEWORKS[FRAMEWORK]


def framework_stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """The sweep's framework's pipeline split."""
    return stage_layers(SCALING, layers, pp)


@pytest.mark.parametrize(("layers", "pp", "split"), [
    (60, 4, (15, 16, 16, 13)),      # 63 items: 16, 16, 16, 15
    (40, 2, (21, 19)),              # 43 items: 22, 21
    (40, 4, (10, 11, 11, 8)),       # 43 items: 11, 11, 11, 10
    (80, 8, (10, 11, 11, 10, 10, 10, 10, 8)),
    (60, 16, (3,) + (4,) * 14 + (1,)),
    (40, 1, (40,)),
])
def test_framework_split_is_uniform_over_embedding_layers_norm_and_head(
        layers: int, pp: int, split: tuple[int, ...]) -> None:
    """l + 3 items (embedding, l layers, final norm, head) split uniformly, remainder to the
    first stages; the first stage gives one slot to the embedding, the last two to norm and
    head."""
    got = framework_stage_layers(layers, pp)
    assert got == split
    assert sum(got) == layers
    items = [n + (s == 0) + 2 * (s == pp - 1) for s, n in enumerate(got)] if pp > 1 else [layers]
    if pp > 1:
        assert max(items) - min(items) <= 1 and items == sorted(items, reverse=True)


def test_framework_split_without_a_layer_on_a_stage_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="without a transformer layer"):
        framework_stage_layers(3, 4)  # 6 items: 2, 2, 1, 1 -> the last stage has none


def test_sweep_rows_use_the_framework_split() -> None:
    from sim.experiment import build_experiment

    rows = load_rows(DATA)
    row = next(r for r in rows if r.model == "llama-30b" and r.pp == 4)
    assert row.experiment()["training"]["framework"] == "scaling"
    assert build_experiment(row.experiment()).costs.stage_layers == (15, 16, 16, 13)
    flat = next(r for r in rows if r.pp == 1)
    assert build_experiment(flat.experiment()).costs.stage_layers == (
        PRESETS[flat.model].num_layers,)
    # Megatron-LM's even split on the same row
    megatron = dict(row.experiment(), training={**row.experiment()["training"],
                                                "framework": "megatron"})
    assert build_experiment(megatron).costs.stage_layers == (15, 15, 15, 15)


def _costs(model=None, **kw) -> TransformerCosts:
    base = dict(micro_batch_size=2, tp=4, dp=2, stage_layers=split_layers(40, 2))
    base.update(kw)
    return TransformerCosts(model or PRESETS["llama-13b"], **base)


def test_sp_with_gathered_gemm_inputs_keeps_four_sbh_unsplit() -> None:
    """Megatron SP divides all 8·s·b·h of replicated activations by t; with the GEMMs saving
    their gathered inputs, 4·s·b·h of them (QKV and first MLP inputs) stay whole:
    4·(1 − 1/t)·s·b·h more a layer."""
    sbh = 2 * 2048 * 5120
    megatron = _costs(sequence_parallel=True)
    gathered = _costs(sequence_parallel=True, sp_saves_gathered_input=True)
    assert (gathered.layer_activation_bytes() - megatron.layer_activation_bytes()
            == pytest.approx(4 * (1 - 1 / 4) * sbh))
    # no SP: nothing is gathered, the flag changes nothing
    assert (_costs(sp_saves_gathered_input=True).layer_activation_bytes()
            == _costs().layer_activation_bytes())
    assert SCALING.sp_saves_gathered_input is True


def test_unsplit_cross_entropy_backward_holds_two_fp32_logit_buffers() -> None:
    """Last stage, vocabulary-parallel loss: one fp32 b·s·V/t buffer forward and backward.
    Gathered logits with torch's cross_entropy: 4·b·s·V forward, 8·b·s·V backward. The
    backward's layer phase (one layer's gradients) comes after the loss's and uses the
    6·b·s·V/t bytes of stashed logits the loss's backward freed: the larger phase counts."""
    bsv = 2 * 2048 * 128_000
    model = replace(PRESETS["llama-13b"], vocab_size=128_000)
    split = _costs(model=model, vocab_parallel_loss=True)
    gathered = _costs(model=model, vocab_parallel_loss=False)
    layer = split.layer_activation_bytes()
    fwd, bwd = Op(1, FORWARD, 0), Op(1, BACKWARD, 0)
    assert split.transient_bytes(fwd) == pytest.approx(4 * bsv / 4)
    assert split.transient_bytes(bwd) == pytest.approx(max(4 * bsv / 4, layer - 6 * bsv / 4))
    assert gathered.transient_bytes(fwd) == pytest.approx(4 * bsv)
    assert gathered.transient_bytes(bwd) == pytest.approx(8 * bsv)
    # not the last stage: no loss buffers, the layer's gradients only
    assert gathered.transient_bytes(Op(0, FORWARD, 0)) == 0.0
    assert gathered.transient_bytes(Op(0, BACKWARD, 0)) == pytest.approx(layer)


def test_last_stage_backward_counts_the_larger_of_its_loss_and_layer_phases() -> None:
    """A small vocabulary with full recomputation and a score matrix (unfused attention):
    the layer phase (two layers' activations) exceeds the loss phase and the stashed
    logits it frees, so the transient is 2·layer − 6·b·s·V/t; the sum of both phases
    (the old count) is larger than either."""
    model = replace(PRESETS["llama-13b"], vocab_size=32_000)
    costs = _costs(model=model, recompute="full", attention="unfused")
    bsv_t = 2 * 2048 * 32_000 / 4
    layer = replace(costs, recompute="none").layer_activation_bytes()
    bwd = costs.transient_bytes(Op(1, BACKWARD, 0))
    assert 2 * layer - 6 * bsv_t > 4 * bsv_t  # the layer phase is the larger one here
    assert bwd == pytest.approx(2 * layer - 6 * bsv_t)
    assert bwd < 2 * layer + 4 * bsv_t


def test_buffered_stage_output_stays_through_the_layer_phase() -> None:
    """scaling's pipeline buffer keeps the last stage's own bf16 logits through its backward
    (only receiving a next stage's gradient takes them out): the layer phase frees the fp32
    logits only, 2·b·s·V/t more than Megatron's count; the loss phase is unchanged; the
    profile sets it whatever the micro-batch count."""
    model = replace(PRESETS["llama-13b"], vocab_size=32_000)
    costs = _costs(model=model, recompute="full", attention="unfused")
    buffered = replace(costs, stage_output_buffered=True)
    bsv_t = 2 * 2048 * 32_000 / 4
    layer = replace(costs, recompute="none").layer_activation_bytes()
    assert buffered.transient_bytes(Op(1, BACKWARD, 0)) == pytest.approx(2 * layer - 4 * bsv_t)
    assert (buffered.transient_bytes(Op(1, FORWARD, 0))
            == pytest.approx(costs.transient_bytes(Op(1, FORWARD, 0))))
    loss_bound = _costs(model=replace(model, vocab_size=128_000))
    assert (replace(loss_bound, stage_output_buffered=True).transient_bytes(Op(1, BACKWARD, 0))
            == pytest.approx(loss_bound.transient_bytes(Op(1, BACKWARD, 0))))
    for m in (1, 8):
        assert apply_framework(costs, SCALING, m).stage_output_buffered is True
    assert apply_framework(costs, FRAMEWORKS["megatron"], 8).stage_output_buffered is False


def test_kept_stage_outputs_hold_earlier_logits_on_the_last_stage_only() -> None:
    """The framework's pipeline buffers keep the previous micro-batch's bf16 logits on the
    last stage: 2·b·s·V/t more in its forward and backward, nothing on other stages;
    apply_framework drops them in a step of one micro-batch."""
    bsv_t = 2 * 2048 * 128_000 / 4
    model = replace(PRESETS["llama-13b"], vocab_size=128_000)
    plain = _costs(model=model)
    kept = _costs(model=model, kept_stage_outputs=1)
    for kind in (FORWARD, BACKWARD):
        assert (kept.transient_bytes(Op(1, kind, 0)) - plain.transient_bytes(Op(1, kind, 0))
                == pytest.approx(2 * bsv_t))
        assert kept.transient_bytes(Op(0, kind, 0)) == plain.transient_bytes(Op(0, kind, 0))
    assert SCALING.kept_stage_outputs == 1
    assert apply_framework(plain, SCALING, 8).kept_stage_outputs == 1
    assert apply_framework(plain, SCALING, 1).kept_stage_outputs == 0
    assert apply_framework(plain, SCALING, 8).sp_saves_gathered_input is True


def test_predict_applies_the_framework_to_sequence_parallel_rows() -> None:
    """A TP4 SP row simulated by the validation holds more than the same experiment with
    Megatron's SP (the gathered GEMM inputs) and takes longer (its DP collectives move 5
    instead of 2 bytes a parameter); applying the profile by hand gives the same numbers."""
    from dataclasses import replace as dc_replace

    from sim.api import simulate
    from sim.device import DeviceProfile
    from sim.experiment import build_experiment
    from sim.validate import predict

    row: Row = next(r for r in load_rows(DATA) if r.sequence_parallel and r.tp == 4
                    and r.pp == 2 and r.status == "ok")
    profile = DeviceProfile(fragmentation=0.0, reserved_bytes=0.0)
    ours = predict([row], profile)[0]
    data = row.experiment()
    megatron = {**data, "training": {**data["training"], "framework": "megatron"},
                "parallel": {**data["parallel"], "layers_per_stage": list(
                    framework_stage_layers(PRESETS[row.model].num_layers, row.pp))}}
    plain = simulate(build_experiment(megatron), profile, fidelity="collapsed")
    assert ours.peak_memory_gib > plain.stats["peak_memory_gib"] + 0.5
    assert ours.step_time_s > plain.stats["step_time_s"]
    exp = build_experiment(megatron)
    by_hand = simulate(dc_replace(exp, costs=apply_framework(exp.costs, SCALING,
                                                             exp.num_microbatches)),
                       profile, fidelity="collapsed").stats
    assert ours.step_time_s == by_hand["step_time_s"]
    assert ours.peak_memory_gib == by_hand["peak_memory_gib"]


def test_dp_wire_bytes_scale_the_step_end_collectives() -> None:
    """grad_bytes, which sizes the step-end reduce-scatter and all-gather, is dp_wire_bytes
    per parameter of the stage: 2 (bf16) by default, 5 for the sweep's fp32 all-reduce
    plus bf16 parameter all-gather (10 bytes a parameter over the two)."""
    plain = _costs()
    framework = _costs(dp_wire_bytes=SCALING.dp_wire_bytes)
    for stage in (0, 1):
        assert plain.grad_bytes(stage) == pytest.approx(2 * plain.stage_params(stage))
        assert framework.grad_bytes(stage) == pytest.approx(5 * plain.stage_params(stage))
    assert SCALING.dp_wire_bytes == 5.0
