"""Multimodal models (issue 23): an encoder feeding the LLM, schedules encoder-first and optimus.

A checker over simulated timelines: a micro-batch's encoder forward (every piece, on every
rank) ends before its LLM forward starts on the first stage, and its encoder backward
starts after its LLM backward there; over random experiments (:mod:`strategies`) at full
fidelity. With an encoder that costs nothing, optimus is plain 1F1B. Memory counts the
encoder's weights and activations. Every new key refuses bad values.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import experiments

from base.errors import ConfigError, ScheduleError
from sim.api import simulate
from sim.experiment import Experiment, build_experiment
from sim.timeline import COMPUTE_STREAM, Timeline
from workloads.encoders import ENCODER_PRESETS
from workloads.registry import SCHEDULES
from workloads.schedules import (
    BACKWARD,
    ENCODER_BACKWARD,
    ENCODER_FORWARD,
    FORWARD,
    EncoderLayout,
    Op,
    list_schedule,
    one_f_one_b,
    validate,
)
from workloads.schedules_multimodal import EncoderPlan, encoder_first, optimus

EXAMPLE = Path(__file__).resolve().parents[1] / "workloads" / "examples" / "optimus-vit-llm.yaml"
MULTIMODAL = ("encoder-first", "optimus")


def _op_intervals(timeline: Timeline, gpu: int) -> dict[Op, tuple[float, float]]:
    """Each pipeline op's (start, end) on ``gpu``'s compute stream: from its first span (named
    by the op) to the last span before the next op's."""
    out: dict[Op, list[float]] = {}
    current = None
    spans = sorted((s for s in timeline.spans if s.gpu == gpu and s.stream == COMPUTE_STREAM),
                   key=lambda s: s.start_s)
    for span in spans:
        if span.kind == "opt":
            current = None
            continue
        try:
            current = Op.parse(span.name)
            out[current] = [span.start_s, span.end_s]
        except ScheduleError:
            if current is not None:
                out[current][1] = span.end_s
    return {op: (a, b) for op, (a, b) in out.items()}


def check_encoder_dependencies(exp: Experiment, timeline: Timeline) -> int:
    """Assert, on every pipeline replica (a TP lane and DP index), that micro-batch m's
    encoder forward pieces all end before F(0, m) starts and its encoder backward pieces
    all start after B(0, m) ends; the number of pairs checked."""
    sched, placement = exp.schedule, exp.placement
    assert sched.encoder is not None
    eps, checked = 1e-12, 0
    for t in range(placement.degree("tp")):
        for d in range(placement.degree("dp")):
            ranks = [_op_intervals(timeline, placement.gpu(tp=t, dp=d, pp=r))
                     for r in range(sched.num_ranks)]
            for m in range(sched.num_microbatches):
                f0 = ranks[0][Op(0, FORWARD, m)]
                b0 = ranks[0][Op(0, BACKWARD, m)]
                for r, ops in enumerate(ranks):
                    for c in range(sched.encoder.pieces):
                        e = ops[Op(r, ENCODER_FORWARD, m, c)]
                        g = ops[Op(r, ENCODER_BACKWARD, m, c)]
                        assert e[1] <= f0[0] + eps, f"{r}E{m}.{c} ends after 0F{m} starts"
                        assert g[0] >= b0[1] - eps, f"{r}G{m}.{c} starts before 0B{m} ends"
                        assert g[0] >= e[1] - eps, f"{r}G{m}.{c} before its forward"
                        checked += 3
    return checked


@pytest.mark.parametrize("schedule", MULTIMODAL)
def test_the_timeline_never_breaks_an_encoder_dependency(schedule: str) -> None:
    """Random multimodal experiments (synthetic or transformer LLM, synthetic or tiny ViT
    encoder, encoder tp/pp/pieces, DGX and explicit clusters), simulated at full fidelity:
    the checker finds every encoder/LLM dependency kept."""
    @settings(max_examples=15, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(experiments(collapsible=True, schedule=schedule))
    def kept(data: dict[str, Any]) -> None:
        assume("encoder" in data["model"])
        exp = build_experiment(data)
        assert check_encoder_dependencies(exp, simulate(exp, fidelity="full").timeline) > 0

    kept()


def test_the_checker_finds_a_broken_dependency() -> None:
    """The checker fails on a timeline whose LLM forward starts before the encoder's end."""
    exp = build_experiment(_synthetic(4, 6, 1, 2, forward_ms=1.0))
    timeline = simulate(exp, fidelity="full").timeline
    first = next(s for s in timeline.spans if s.name == "0F2")
    early = first._replace(start_s=0.0)
    broken = Timeline(timeline.num_gpus, tuple(early if s == first else s for s in timeline.spans),
                      timeline.flows, timeline.memory, timeline.gpu_names)
    with pytest.raises(AssertionError, match="ends after 0F2 starts"):
        check_encoder_dependencies(exp, broken)


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(p=st.integers(1, 6), m=st.integers(1, 10), stages=st.sampled_from([1, 2, 3]),
       pieces=st.integers(1, 4), f=st.floats(0.1, 3.0), b=st.floats(0.1, 6.0),
       e=st.floats(0.0, 2.0), g=st.floats(0.0, 4.0))
def test_builders_keep_the_rule_for_any_costs(p: int, m: int, stages: int, pieces: int,
                                               f: float, b: float, e: float, g: float) -> None:
    """Both builders give valid schedules (every op once, no deadlock) whose symbolic run
    keeps the encoder/LLM dependencies; optimus is never slower than encoder-first there
    with one encoder stage (it fills bubbles only where the LLM op could not start
    anyway), and at most 5% with an encoder pipeline (a greedy heuristic)."""
    assume(p % stages == 0)
    plan = EncoderPlan(EncoderLayout(stages, pieces), ((f, b),) * p, ((e, g),) * p)
    cost = {FORWARD: f, BACKWARD: b, ENCODER_FORWARD: e, ENCODER_BACKWARD: g}
    ends = {}
    for build in (encoder_first, optimus):
        sched = build(p, m, plan)
        validate(sched)
        times = list_schedule(sched, lambda op: cost[op.kind])
        for mb in range(m):
            for r in range(p):
                for c in range(pieces):
                    assert times[Op(r, ENCODER_FORWARD, mb, c)][1] <= times[Op(0, FORWARD, mb)][0]
                    assert times[Op(r, ENCODER_BACKWARD, mb, c)][0] >= times[Op(0, BACKWARD,
                                                                                 mb)][1]
        ends[build.__name__] = max(end for _, end in times.values())
    slack = 1.0 if stages == 1 else 1.05
    assert ends["optimus"] <= slack * ends["encoder_first"] + 1e-9


@pytest.mark.parametrize(("p", "m", "stages", "pieces"),
                         [(1, 3, 1, 1), (4, 8, 1, 2), (4, 8, 2, 3), (3, 7, 3, 1), (6, 4, 2, 2)])
def test_a_zero_cost_encoder_makes_optimus_plain_1f1b(p: int, m: int, stages: int,
                                                        pieces: int) -> None:
    """An encoder that costs nothing (no time, no bytes) on the ideal network: the same
    step time and LLM spans as 1F1B without an encoder, exactly; and in the symbolic run
    the same intervals of every LLM op."""
    with_encoder = build_experiment(_synthetic(p, m, stages, pieces, forward_ms=0.0,
                                               backward_ms=0.0, cluster="ideal"))
    plain = _synthetic(p, m, stages, pieces, cluster="ideal")
    del plain["model"]["encoder"], plain["parallel"]["encoder"]
    plain["schedule"] = "1f1b"
    a, b = simulate(with_encoder), simulate(build_experiment(plain))
    assert a.stats["step_time_s"] == b.stats["step_time_s"]
    llm = {FORWARD, BACKWARD}

    def spans(result: Any) -> list[tuple]:
        return sorted((s.gpu, s.name, s.start_s, s.end_s) for s in result.timeline.spans
                      if s.kind in llm)

    assert spans(a) == spans(b)
    plan = EncoderPlan(EncoderLayout(stages, pieces), ((1.0, 2.0),) * p, ((0.0, 0.0),) * p)
    cost = {FORWARD: 1.0, BACKWARD: 2.0, ENCODER_FORWARD: 0.0, ENCODER_BACKWARD: 0.0}
    times = list_schedule(optimus(p, m, plan), lambda op: cost[op.kind])
    base = list_schedule(one_f_one_b(p, m), lambda op: cost[op.kind])
    assert {op: t for op, t in times.items() if op.kind in llm} == base


def test_the_example_is_faster_with_optimus() -> None:
    """workloads/examples/optimus-vit-llm.yaml: schedule optimus gives a shorter step than
    encoder-first, with the same memory for the same model state."""
    exp = Experiment.from_yaml(EXAMPLE)
    assert exp.config.schedule == "optimus"
    fast = simulate(exp)
    slow = simulate(exp.with_changes({"schedule": "encoder-first"}))
    assert fast.stats["step_time_s"] < 0.95 * slow.stats["step_time_s"]
    assert fast.program.static_bytes == slow.program.static_bytes


def test_memory_holds_the_encoders_weights_and_activations() -> None:
    """Static memory per GPU grows by the encoder's model state (16 bytes a parameter under
    ZeRO 0, its stage's layers over tp_e), and encoder-first's peak by at least that plus
    every micro-batch's encoder stash, held from the first forward to the last backward."""
    data = {"name": "mm", "model": {"preset": "gpt3-1.3b", "seq_length": 512, "num_layers": 8,
                                    "encoder": {"preset": "vit-l-16"}},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
            "parallel": {"tp": 2, "pp": 2, "zero_stage": 0, "encoder": {"pieces": 4}},
            "training": {"micro_batch_size": 2, "global_batch_size": 16},
            "schedule": "encoder-first"}
    exp = build_experiment(data)
    plain = copy.deepcopy(data)
    del plain["model"]["encoder"], plain["parallel"]["encoder"]
    plain["schedule"] = "1f1b"
    base = build_experiment(plain)
    vit = ENCODER_PRESETS["vit-l-16"]
    a, b = simulate(exp, fidelity="full"), simulate(base, fidelity="full")
    weights = 16 * vit.num_layers * vit.layer_params() / 2
    for g in range(8):
        assert a.program.static_bytes[g] - b.program.static_bytes[g] == pytest.approx(weights)
    stash = sum(exp.costs.encoder_stash_bytes(Op(0, ENCODER_FORWARD, 0, c)) for c in range(4))
    m = exp.num_microbatches
    gib = 2 ** 30
    assert stash > 0
    extra = a.stats["peak_memory_gib"] - b.stats["peak_memory_gib"]
    assert extra * gib >= weights + m * stash - 1.0


def test_lowering_refuses_its_fast_path_for_encoder_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The columnar lowering handles F, B and W only: a multimodal schedule takes the op loop
    where a collapsed lowering of the same LLM without the encoder takes the fast path."""
    import workloads.lowering as lowering

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the columnar fast path ran")

    data = _synthetic(4, 6, 2, 2, forward_ms=1.0)
    monkeypatch.setattr(lowering, "lower_collapsed", refuse)
    result = simulate(build_experiment(data), fidelity="collapsed")
    assert any(s.kind == ENCODER_FORWARD for s in result.timeline.spans)
    del data["model"]["encoder"], data["parallel"]["encoder"]
    data["schedule"] = "1f1b"
    with pytest.raises(AssertionError, match="fast path ran"):
        simulate(build_experiment(data), fidelity="collapsed")


def test_multimodal_schedules_without_an_encoder_are_1f1b() -> None:
    """Without an encoder (what sim search and the registry's generic callers build) both
    multimodal schedules are 1F1B's ops under their own name."""
    for name in MULTIMODAL:
        sched = SCHEDULES[name](4, 8)
        assert sched.name == name and sched.encoder is None
        assert sched.rank_ops == one_f_one_b(4, 8).rank_ops


def test_the_encoder_op_text_form_parses_back() -> None:
    op = Op(2, ENCODER_FORWARD, 5, 1)
    assert str(op) == "2E5.1" and Op.parse("2E5.1") == op
    assert Op.parse("0G3.0") == Op(0, ENCODER_BACKWARD, 3, 0)


def _synthetic(p: int, m: int, stages: int, pieces: int, forward_ms: float = 0.5,
               backward_ms: float = 1.0, cluster: str = "dgx-a100-80g") -> dict[str, Any]:
    """A synthetic LLM with a synthetic encoder, schedule optimus, one GPU per rank."""
    return {"name": "mm", "model": {
                "synthetic": {"forward_ms": 1.0, "backward_ms": 2.0, "activation_MB": 10.0,
                              "p2p_MB": 0.0},
                "encoder": {"synthetic": {"forward_ms": forward_ms, "backward_ms": backward_ms,
                                          "activation_MB": 0.0, "output_MB": 0.0}}},
            "cluster": {"preset": cluster, "num_gpus": p},
            "parallel": {"pp": p, "encoder": {"pp": stages, "pieces": pieces}},
            "training": {"num_microbatches": m}, "schedule": "optimus"}


_VIT = {"name": "mm", "model": {"preset": "gpt3-1.3b", "seq_length": 512, "num_layers": 8,
                                "encoder": {"preset": "vit-b-16"}},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8},
        "parallel": {"tp": 2, "pp": 4}, "training": {"global_batch_size": 8},
        "schedule": "optimus"}


@pytest.mark.parametrize(("changes", "message"), [
    ({"schedule": "1f1b"}, "schedule '1f1b' has no place for an encoder"),
    ({"model.encoder": None, "parallel.encoder": {"pp": 1}}, "parallel.encoder: the model has"),
    ({"parallel.encoder": {"tp": 3}}, "parallel.encoder.tp=3: must be 1 or the LLM's tp=2"),
    ({"parallel.encoder": {"pp": 3}}, "parallel.encoder.pp=3 does not divide parallel.pp=4"),
    ({"parallel.encoder": {"dp": 3}}, "parallel.encoder.dp=3"),
    ({"parallel.encoder": {"pieces": 13}}, "parallel.encoder.pieces=13 exceeds the 12 layers"),
    ({"parallel.encoder": {"pieces": 0}}, "parallel.encoder.pieces"),
    ({"model.encoder.preset": "vit-zz"}, "unknown encoder 'vit-zz'"),
    ({"model.encoder.image_size": 224}, "model.encoder.patch_size: needed"),
    ({"model.encoder.image_size": 225, "model.encoder.patch_size": 16},
     "image_size=225 is not a multiple of patch_size=16"),
    ({"model.encoder.tokens_per_sample": 10, "model.encoder.image_size": 224,
      "model.encoder.patch_size": 16}, "not both"),
    ({"model.encoder.tokens_per_sample": 0}, "model.encoder.tokens_per_sample"),
    ({"model.encoder": {"num_layers": 4}}, "model.encoder.hidden_size: required"),
    ({"model.encoder": {"num_layers": 4, "hidden_size": 100, "num_attention_heads": 3,
                        "ffn_hidden_size": 64, "tokens_per_sample": 4}},
     "hidden_size=100 is not divisible"),
    ({"model.encoder": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                        "ffn_hidden_size": 64}}, "model.encoder.tokens_per_sample: required"),
    ({"model.encoder.synthetic": {"forward_ms": 1, "backward_ms": 1}},
     "model.encoder.preset: not used with a synthetic encoder"),
    ({"model.encoder": {"synthetic": {"forward_ms": -1, "backward_ms": 1}}},
     "model.encoder.synthetic.forward_ms"),
    ({"parallel.encoder": {"tp": 0}}, "parallel.encoder.tp"),
    ({"model.encoder.patch_size": 0, "model.encoder.image_size": 224},
     "model.encoder.patch_size"),
    ({"model.encoder": {"synthetic": {"forward_ms": 1, "backward_ms": 1, "output_MB": -2}}},
     "model.encoder.synthetic.output_MB"),
    ({"model.encoder.layers": 3}, "model.encoder.layers"),
    ({"parallel.cp": 2, "parallel.pp": 2}, "parallel.cp=2: not supported with model.encoder"),
    ({"parallel.zero_stage": 3}, "parallel.zero_stage=3: not supported with model.encoder"),
    ({"parallel.overlap_grad_reduce": True}, "parallel.overlap_grad_reduce=True: not supported"),
])
def test_bad_multimodal_input_is_refused(changes: dict[str, Any], message: str) -> None:
    from sim.config import set_dotted

    data: Any = copy.deepcopy(_VIT)
    for key, value in changes.items():
        data = set_dotted(data, key, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_experiment(data)


def test_compare_defaults_to_the_multimodal_schedules(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    """``sim compare`` of a model with an encoder runs encoder-first and optimus unless told
    otherwise (the LLM-only schedules have no place for the encoder)."""
    import json

    import yaml

    from sim.cli import main

    path = tmp_path / "mm.yaml"
    path.write_text(yaml.safe_dump(_synthetic(4, 6, 1, 2)), encoding="utf-8")
    assert main(["compare", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["schedules"]
    assert [row["schedule"] for row in rows] == list(MULTIMODAL)
    assert rows[1]["step_time_s"] < rows[0]["step_time_s"]


def test_search_refuses_a_multimodal_model() -> None:
    """``sim search`` enumerates LLM layouts only; a model with an encoder is refused by name."""
    from sim.search.space import SearchContext

    with pytest.raises(ConfigError, match="model.encoder: sim search does not search"):
        SearchContext.build(copy.deepcopy(_VIT))
