"""Host waits of dropless MoE layers (sim/hostwait.py): the parts' host times from NVIDIA's
DeepSeek-V3 measurement, the wait max(0, H - G) per part not in a CUDA graph, and where the
lowering runs it."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
import yaml

from base.errors import ConfigError
from sim import api, hostwait
from sim.corpus import CORPUS_DIR, load_source
from sim.experiment import Experiment, build_experiment
from workloads.costs import ComputeSeg
from workloads.frameworks import FRAMEWORKS, load_profiles

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "workloads" / "examples" / "deepseek-v3-cuda-graphs.yaml"
FULL_SCOPE = ["attn", "moe_router", "moe_preprocess"]


def _example(**training) -> dict:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["model"]["hf_config"] = str(CORPUS_DIR / "hf_configs" / "deepseek-v3.json")
    data["training"].update(training)
    return data


def _step(data: dict) -> float:
    return api.simulate(Experiment.from_dict(data), fidelity="collapsed").stats["step_time_s"]


def test_savings_are_the_measured_step_times_per_layer_pass() -> None:
    """(T_before - T_after) / layer passes, T = tokens per GPU x FLOPs per token / TFLOP/s:
    the routed experts' is the write-up's "at least 10%" over 970.01 TFLOP/s."""
    data = tomllib.loads(hostwait.DATA_FILE.read_text())
    m = data["measurement"]
    step = m["tokens_per_gpu"] * m["flops_per_token"] / 970.01e12
    saved = hostwait.measured_savings_s()
    assert saved["routed_experts"] == pytest.approx(step * (1 - 1 / 1.1) / m["layer_passes"],
                                                     rel=1e-6)
    assert set(saved) == set(hostwait.PARTS) and all(v > 0 for v in saved.values())
    assert m["layer_passes"] == 64 * 8 + 7 * 2
    for part in hostwait.PARTS:
        assert len(data["parts"][part]["source"]) > 100


def test_host_times_are_the_measured_layouts_gpu_times_plus_the_savings() -> None:
    host = dict(hostwait.host_times())
    saved = hostwait.measured_savings_s()
    assert all(host[p] > saved[p] for p in hostwait.PARTS)
    # the attention (MLA) and routed experts take milliseconds of GPU time a layer pass
    assert 5e-3 < host["attention"] - saved["attention"] < 20e-3
    assert hostwait.graph_scope_of("routed_experts") == ()
    assert set(hostwait.graph_scope_of("attention")) == set(FULL_SCOPE)


def _times(attention: float, shared: float, routed: float) -> hostwait.PartTimes:
    """Part times split 1:2 between forward and backward."""
    parts = {"attention": attention, "shared_experts": shared, "routed_experts": routed}
    return hostwait.PartTimes(tuple((p, t / 3) for p, t in parts.items()),
                              tuple((p, 2 * t / 3) for p, t in parts.items()))


def test_waits_are_the_host_time_beyond_the_gpu_time_of_each_part_not_captured() -> None:
    host = dict(hostwait.host_times())
    fast = _times(0.5 * host["attention"], 0.5 * host["shared_experts"],
                  0.5 * host["routed_experts"])
    fwd, bwd = hostwait.waits(fast, [])
    assert fwd + bwd == pytest.approx(0.5 * sum(host.values()))
    assert bwd == pytest.approx(2 * fwd)  # split as the GPU time is
    graphed = sum(hostwait.waits(fast, FULL_SCOPE))
    assert graphed == pytest.approx(0.5 * host["routed_experts"])
    router_only = sum(hostwait.waits(fast, ["moe_router"]))  # the shared experts captured
    assert router_only == pytest.approx(0.5 * (host["attention"] + host["routed_experts"]))
    slow = _times(2 * host["attention"], 2 * host["shared_experts"], 2 * host["routed_experts"])
    assert hostwait.waits(slow, []) == (0.0, 0.0)  # the CPU keeps ahead


def test_the_lowering_runs_the_wait_in_each_moe_layer_after_the_dispatch() -> None:
    exp = Experiment.from_dict(_example(cuda_graph_scope=[]))
    costs = hostwait.lowering_costs(exp, exp.costs, _timer(exp))
    fwd, bwd = costs.moe_host_wait_s
    assert 0 < fwd < bwd
    for backward, first, wait_s in ((False, "moe mlp dispatch", fwd),
                                    (True, "moe mlp bwd combine grad", bwd)):
        segs = costs.moe_layer_segments(backward)
        labels = [getattr(s, "label", "") for s in segs]
        at = labels.index(first) + 1
        assert isinstance(segs[at], ComputeSeg) and segs[at].label.endswith("host wait")
        assert segs[at].duration_s == wait_s
    assert not any("host wait" in getattr(s, "label", "")
                   for s in exp.costs.moe_layer_segments(False))


def _timer(exp: Experiment):
    from sim.calibration import default_profile
    from sim.device import work_timer

    return work_timer(exp.cluster.gpu, default_profile(exp.cluster.gpu.name),
                      exp.config.training.attention)


def test_cuda_graphs_and_a_framework_without_the_sync_wait_less() -> None:
    eager = _step(_example(cuda_graph_scope=[]))
    graphed = _step(_example(cuda_graph_scope=FULL_SCOPE))
    assert eager > graphed and math.isfinite(eager)
    costs = Experiment.from_dict(_example()).costs
    unsynced = hostwait.lowering_costs(
        Experiment.from_dict(_example(framework="megatron")), costs, lambda s: 1.0)
    assert unsynced.moe_host_wait_s == (0.0, 0.0)


def test_a_dense_model_or_the_default_framework_is_unchanged() -> None:
    dense = {"name": "d", "model": {"preset": "llama3-8b", "num_layers": 4, "seq_length": 2048},
             "cluster": {"preset": "dgx-h100", "num_gpus": 8}, "parallel": {"tp": 8},
             "training": {"micro_batch_size": 1, "global_batch_size": 4,
                          "framework": "megatron-bridge"}}
    exp = Experiment.from_dict(dense)
    assert hostwait.lowering_costs(exp, exp.costs, _timer(exp)) is exp.costs
    assert not FRAMEWORKS["megatron"].moe_host_sync
    assert FRAMEWORKS["megatron-bridge"].moe_host_sync


def test_a_table_leaving_moe_host_sync_out_has_none_and_a_bad_value_is_refused() -> None:
    base = (Path(hostwait.__file__).parents[1] / "workloads" / "frameworks.toml").read_text()
    profiles = load_profiles(base)
    assert not profiles["fsdp"].moe_host_sync
    with pytest.raises(ValueError, match="moe_host_sync"):
        load_profiles(base + '\n[odd]\ninherits = "megatron"\nmoe_host_sync = 1\n'
                      'moe_host_sync_source = "' + "x" * 50 + '"\n')


@pytest.mark.parametrize("scope", [["moe_preprocess"], ["attn", "attn"], ["mlp"]])
def test_a_bad_graph_scope_is_a_config_error(scope: list[str]) -> None:
    with pytest.raises(ConfigError, match="cuda_graph_scope"):
        build_experiment(_example(cuda_graph_scope=scope))


def test_the_corpus_column_gives_the_recipes_graph_scope() -> None:
    rows = {r.run: r for r in load_source(CORPUS_DIR / "megatron_bridge_perf.csv").rows}
    pp8 = rows["deepseek-v3-256gpu-b200-pp8"].experiment()
    assert pp8["training"]["cuda_graph_scope"] == FULL_SCOPE
    assert "cuda_graph_scope" not in rows["deepseek-v3-256gpu-b200-pp16"].experiment()["training"]
    other = load_source(CORPUS_DIR / "nemo2412_fp8.csv")  # a file without the column
    assert all(r.get("cuda_graph_scope") == "" for r in other.rows)
