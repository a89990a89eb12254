"""torchao's Float8 weights as torchtitan runs them: each Float8Linear's own weight cast at
every forward (and its backward transpose), or with FSDP2's float8 all-gather
(``training.fp8_param_gather``) the weights gathered in fp8 and only transposed backward."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest

from base.errors import ConfigError
from sim.api import simulate
from sim.calibration import default_profile
from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import Experiment, build_experiment
from workloads.costs import ParamGather, split_layers
from workloads.frameworks import FRAMEWORKS, apply_framework
from workloads.models import PRESETS
from workloads.schedules import BACKWARD, FORWARD, Op
from workloads.transformer import TransformerCosts


def _costs(name: str, dp: int = 2, tp: int = 1, **kw) -> TransformerCosts:
    model = replace(PRESETS["llama3-8b"], num_layers=4, seq_length=2048)
    base = TransformerCosts(model, 1, tp, dp, split_layers(4, 1), sequence_parallel=tp > 1,
                            zero_stage=3, precision="fp8", fp8_speedup=2.0, **kw)
    return apply_framework(base, FRAMEWORKS[name], 1)


def _flat(pair: tuple[tuple[float, float], tuple[float, float]]) -> tuple[float, ...]:
    return (*pair[0], *pair[1])


def _weights(c: TransformerCosts) -> tuple[float, float]:
    m = c.model
    return m.attention_params() / c.tp, m.mlp_params() / c.tp


def test_torchtitans_profiles_cast_their_weights_and_megatrons_do_not() -> None:
    for name in ("fsdp", "fsdp-compile"):
        profile = FRAMEWORKS[name]
        assert profile.fp8_weight_casts == "float8-linear"
        assert "eab345c" in profile.source("fp8_weight_casts")
        assert "preprocess_addmm" in profile.source("fp8_weight_casts")
    assert FRAMEWORKS["megatron"].fp8_weight_casts == "step"


@pytest.mark.parametrize("tp", [1, 2])
def test_weight_casts_compiled_eager_and_gathered_in_fp8(tp: int) -> None:
    """Compiled: amax (2) and the row- and column-major cast (5) a weight element forward,
    nothing backward (torchao's roofline); eager: the cast with its amax (5) forward, the
    fp8 transpose (2) backward; gathered in fp8: nothing forward, the transpose backward."""
    compiled, eager = _costs("fsdp-compile", tp=tp), _costs("fsdp", tp=tp)
    attn, mlp = _weights(compiled)
    assert _flat(compiled._fp8_weight_cast_pair()) == pytest.approx((7 * attn, 7 * mlp, 0, 0))
    assert _flat(eager._fp8_weight_cast_pair()) == pytest.approx(
        (5 * attn, 5 * mlp, 2 * attn, 2 * mlp))
    for c in (compiled, eager):
        gathered = replace(c, fp8_param_gather=True)
        assert _flat(gathered._fp8_weight_cast_pair()) == pytest.approx(
            (0, 0, 2 * attn, 2 * mlp))


def test_no_weight_casts_without_fp8_the_flag_or_a_sharded_gather() -> None:
    c = _costs("fsdp-compile")
    none = ((0.0, 0.0), (0.0, 0.0))
    assert replace(c, precision="bf16")._fp8_weight_cast_pair() == none
    assert replace(c, fp8_weight_casts="none")._fp8_weight_cast_pair() == none
    # one shard: nothing is gathered, each Float8Linear casts its own weight again
    alone = replace(c, dp=1, fp8_param_gather=True)
    assert not alone._fp8_gathered
    assert alone._fp8_weight_cast_pair() == c._fp8_weight_cast_pair()


def test_the_weight_bytes_enter_forward_and_backward_once_each() -> None:
    """The forward's weight cast is not doubled into the backward: the backward carries the
    weights' own bytes in its place."""
    for name in ("fsdp", "fsdp-compile"):
        for gathered in (False, True):
            on = replace(_costs(name), fp8_param_gather=gathered)
            off = replace(on, fp8_weight_casts="none")
            (fa, fm), (ba, bm) = on._fp8_weight_cast_pair()
            fwd_on, fwd_off = on._elementwise_forward(), off._elementwise_forward()
            assert fwd_on[0] - fwd_off[0] == pytest.approx(fa)
            assert fwd_on[1] - fwd_off[1] == pytest.approx(fm)
            back_on = on._elementwise_backward()
            back_off = off._elementwise_backward()
            assert back_on[0] - back_off[0] == pytest.approx(ba)
            assert back_on[1] - back_off[1] == pytest.approx(bm)


def test_fp8_gathers_move_the_linear_weights_in_one_byte() -> None:
    """The layer's all-gathers (forward and backward), its working set and the copy-out:
    linear weights 1 byte, the two norms 2."""
    c = _costs("fsdp-compile", tp=2)
    g = replace(c, fp8_param_gather=True)
    m = c.model
    linear = (m.attention_params() + m.mlp_params()) / 2
    norms = 2 * m.norm_params / 2
    assert c._layer_gather_bytes == pytest.approx(2 * (linear + norms))
    assert g._layer_gather_bytes == pytest.approx(linear + 2 * norms)
    for op in (Op(0, FORWARD, 0), Op(0, BACKWARD, 0)):
        gathers = [s for s in g.op_segments(op, False, True) if isinstance(s, ParamGather)
                   and s.label.startswith("L") and s.label != "L0 params"]  # L0: + embedding
        assert gathers and all(s.nbytes == pytest.approx(g._layer_gather_bytes)
                               for s in gathers)
        assert g.zero3_working_bytes(op) < c.zero3_working_bytes(op)
    copy = c.zero3_gather_copy_bytes
    for backward in (False, True):
        before = c._zero3_copies("L", backward)[0].elementwise_bytes
        after = g._zero3_copies("L", backward)[0].elementwise_bytes
        assert before - after == pytest.approx(copy / 2 * linear)


def test_fp8_param_gather_is_refused_where_nothing_is_gathered_in_fp8() -> None:
    base = {"name": "f", "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 4},
            "cluster": {"preset": "grand-teton-h100", "num_gpus": 8},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 3},
            "training": {"micro_batch_size": 1, "global_batch_size": 8,
                         "framework": "fsdp-compile", "fp8_param_gather": True}}
    with pytest.raises(ConfigError, match=r"fp8_param_gather.*'bf16'"):
        build_experiment(base)
    base["training"]["precision"] = "fp8"
    exp = Experiment.from_dict(base)
    assert exp.costs.fp8_param_gather and exp.costs._fp8_gathered
    base["parallel"]["zero_stage"] = 1
    with pytest.raises(ConfigError, match=r"fp8_param_gather.*zero_stage 3 \(got 1\)"):
        build_experiment(base)


def test_fp8_gathers_shorten_the_step_of_a_float8_fsdp_run() -> None:
    """The same compiled Float8 FSDP run: casting every weight at every forward costs more
    than gathering it in fp8 and transposing it backward; without weight casts at all it
    is shorter than either."""
    run = {"name": "f", "model": {"preset": "llama3-8b", "seq_length": 4096, "num_layers": 4},
           "cluster": {"preset": "grand-teton-h100", "num_gpus": 8},
           "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 3},
           "training": {"micro_batch_size": 2, "global_batch_size": 16, "precision": "fp8",
                        "recompute": "none", "framework": "fsdp-compile"}}
    own = Experiment.from_dict(run)
    run["training"]["fp8_param_gather"] = True
    gathered = Experiment.from_dict(run)
    bare = replace(gathered, costs=replace(gathered.costs, fp8_weight_casts="none"))
    profile = default_profile(own.cluster.gpu.name)
    step = [simulate(e, profile, fidelity="collapsed").stats["step_time_s"]
            for e in (own, gathered, bare)]
    assert step[0] > step[1] > step[2]


def test_torchtitans_float8_rows_gather_in_fp8_and_say_why() -> None:
    source = load_source(CORPUS_DIR / "torchtitan_llama31.csv")
    for row in source.rows:
        fp8 = row.get("precision") == "fp8"
        assert (row.get("fp8_param_gather") == "true") == fp8
        assert ("enable_fsdp_float8_all_gather" in row.get("assumed")) == fp8
        assert row.experiment()["training"].get("fp8_param_gather", False) == fp8


def test_a_corpus_row_with_a_bad_fp8_param_gather_is_refused(tmp_path) -> None:
    with (CORPUS_DIR / "torchtitan_llama31.csv").open(newline="", encoding="utf-8") as fh:
        head, first, *_ = csv.reader(fh)
    at = head.index("fp8_param_gather")
    assert first[at] == ""  # the eager bf16 row leaves the optional column empty
    first[at] = "yes"
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([head, first])
    with pytest.raises(ConfigError, match=r"row 2: fp8_param_gather='yes': expected true or false"):
        load_source(bad)
