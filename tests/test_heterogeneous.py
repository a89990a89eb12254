"""Heterogeneous clusters: mixed GPU types, per-rank timing and memory, balanced stages.

Closed forms for 1F1B with per-stage costs t_i = F_i + B_i per micro-batch (each
stage timed on its own GPU type by the device model), m micro-batches, p stages:

* slow last stage: micro-batch 0 crosses every stage (Σ t_i), then the last stage
  runs its other m - 1 micro-batches back to back: step = Σ t_i + (m - 1) max t_i
  (as for a straggler, tests/test_idle.py), plus stage 0's optimizer step, which
  ends the step.
* slow first stage (p warm-up forwards, then B, F pairs): with D = Σ_{i>0} t_i the
  round trip of a micro-batch behind stage 0, B_0 can start at A = max(p F_0, F_0 + D);
  stage 0 then runs m - p (B, F) pairs back to back (no B arrives late when
  D <= (p - 1) t_0), and its last backward waits max((p - 1) B_0, D) after its last
  forward: step = A + (m - p) t_0 + max((p - 1) B_0, D) + B_0 + stage 0's optimizer.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from test_collapse import EXACT, MESH, assert_agree

from base.errors import ConfigError
from sim.api import load_experiment, simulate
from sim.calibration import default_profile
from sim.cli import main
from sim.device import work_timer
from sim.experiment import Experiment, build_experiment
from topologies.hardware import GPUS
from topologies.placement import Placement, mixed_pipeline_ranks
from topologies.presets import SERVERS, mixed_server_cluster, server_cluster
from workloads.costs import ComputeSeg
from workloads.schedules import Op, list_schedule

EXAMPLE = Path(__file__).resolve().parents[1] / "workloads" / "examples" / "hetero-a100-h100.yaml"
FAST = {"topology": "switch", "link_bandwidth_GBps": 1e9, "link_latency_us": 0.0}
"""Links so fast that pipeline messages take picoseconds: the step is compute only."""


def pipeline(order: tuple[str, ...], layers: int = 24, m: int = 8,
             layers_per_stage: Any = None) -> dict:
    """A 2048-wide transformer on one GPU per stage, GPU types in stage order."""
    data: dict[str, Any] = {
        "name": "hetero",
        "model": {"name": "t", "num_layers": layers, "hidden_size": 2048,
                  "num_attention_heads": 16, "ffn_hidden_size": 8192, "vocab_size": 32000,
                  "seq_length": 2048},
        "cluster": {"num_gpus": len(order), **FAST,
                    "nodes": [{"gpu": g, "count": 1} for g in order]},
        "parallel": {"pp": len(order)},
        "training": {"micro_batch_size": 1, "num_microbatches": m},
    }
    if layers_per_stage is not None:
        data["parallel"]["layers_per_stage"] = layers_per_stage
    return data


def stage_costs(exp: Experiment) -> list[tuple[float, float, float]]:
    """(F, B, optimizer) seconds of each stage on its own GPU (device model, own profile)."""
    out = []
    for s in range(exp.schedule.num_stages):
        spec = exp.cluster.gpu_of(exp.placement.gpu(pp=s))
        timer = work_timer(spec, default_profile(spec.name), "flash2")

        def t(kind: str, s: int = s, timer: Any = timer) -> float:
            return sum(timer(seg) for seg in exp.costs.op_segments(Op(s, kind, 0), False)
                       if isinstance(seg, ComputeSeg))

        out.append((t("F"), t("B"), timer(exp.costs.optimizer_segment((s,)))))
    return out


H3_A1 = ("H100", "H100", "H100", "A100-80GB")


def test_slow_last_stage_sets_the_step_by_the_closed_form() -> None:
    exp = build_experiment(pipeline(H3_A1))
    assert exp.costs.stage_layers == (6, 6, 6, 6)
    costs = stage_costs(exp)
    t = [f + b for f, b, _ in costs]
    # the A100 stage is the bottleneck; stage 0's backward adds the embedding's dense gradient
    # into main_grad (Megatron-LM's embedding_grad_bytes, workloads/frameworks.toml)
    assert t[3] > 2.5 * t[0] and t[0] > t[1] == t[2]
    m = 8
    closed = sum(t) + (m - 1) * max(t) + costs[0][2]
    stats = simulate(exp).stats
    assert stats["step_time_s"] == pytest.approx(closed, rel=1e-8)
    assert stats["gpu"] == "3x H100 + 1x A100-80GB"
    # every GPU's dense peak counts in the MFU denominator
    mean_peak = (3 * GPUS["H100"].peak_bf16_flops + GPUS["A100-80GB"].peak_bf16_flops) / 4
    flops = exp.model_flops_per_step
    assert stats["mfu"] == pytest.approx(flops / stats["step_time_s"] / 4 / mean_peak, rel=1e-12)


@pytest.fixture
def a100_fit_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GPU on the A100 fit's fractions of its own peak, so that an H100 is exactly
    989/312 times an A100 and the closed form's regime (stage 0 alone the slowest, by a
    margin) does not move with the per-GPU profiles of sim.gpu_profiles."""
    import sim.api
    import sim.experiment
    import sim.partition
    from sim.calibration import A100_HAGEMANN

    for module in (sim.api, sim.experiment, sim.partition, sys.modules[__name__]):
        monkeypatch.setattr(module, "default_profile", lambda name: A100_HAGEMANN)


@pytest.mark.usefixtures("a100_fit_everywhere")
def test_balanced_split_reaches_its_closed_form(monkeypatch: pytest.MonkeyPatch) -> None:
    # the closed form's regime (stage 0 alone the slowest): without the embedding's dense
    # gradient that Megatron-LM's stage 0 adds into main_grad each micro-batch
    # (embedding_grad_bytes), which moves one layer off stage 0, (7, 8, 8, 1), and makes the
    # middle stages the slowest (test_balanced_split_is_the_best_integer_split keeps it)
    from dataclasses import replace

    from workloads.frameworks import FRAMEWORKS
    monkeypatch.setitem(FRAMEWORKS, "megatron",
                        replace(FRAMEWORKS["megatron"], embedding_grad_bytes=None))
    even = simulate(build_experiment(pipeline(H3_A1))).stats["step_time_s"]
    exp = build_experiment(pipeline(H3_A1, layers_per_stage="balanced"))
    # the A100 keeps one layer (and the output head), the H100s share the rest
    assert exp.costs.stage_layers == (8, 8, 7, 1)
    costs = stage_costs(exp)
    t = [f + b for f, b, _ in costs]
    assert max(t) == t[0]  # stage 0 is now the slowest
    p, m = 4, 8
    f0, b0, opt0 = costs[0]
    d = sum(t[1:])
    assert d <= (p - 1) * t[0]
    closed = max(p * f0, f0 + d) + (m - p) * t[0] + max((p - 1) * b0, d) + b0 + opt0
    step = simulate(exp).stats["step_time_s"]
    assert step == pytest.approx(closed, rel=1e-8)
    assert step < 0.55 * even


@pytest.mark.parametrize("order", [H3_A1, ("A100-80GB", "H100", "H100", "A100-40GB"),
                                   ("H100", "A100-80GB", "B200")])
@pytest.mark.parametrize("layers", [7, 10])
def test_balanced_split_is_the_best_integer_split(order: tuple[str, ...], layers: int) -> None:
    """Against every split of the layers (each stage >= 1): none has a faster slowest stage;
    the stage costs come from real splits here, not from the balancer's probes."""
    p = len(order)
    exp = build_experiment(pipeline(order, layers, layers_per_stage="balanced"))
    best = min(max(f + b for f, b, _ in stage_costs(build_experiment(
        pipeline(order, layers, layers_per_stage=list(split)))))
        for split in itertools.product(range(1, layers), repeat=p) if sum(split) == layers)
    got = max(f + b for f, b, _ in stage_costs(exp))
    assert got == pytest.approx(best, rel=1e-12)
    # and the simulated step is the list schedule of those costs (exact oracle)
    costs = stage_costs(exp)
    ends = list_schedule(exp.schedule, lambda op: costs[op.stage][0 if op.kind == "F" else 1])
    oracle = max(end + costs[op.stage][2] for op, (_, end) in ends.items() if op.kind == "B"
                 and op.mb == exp.num_microbatches - 1)
    assert simulate(exp).stats["step_time_s"] == pytest.approx(oracle, rel=1e-8)


def test_balanced_on_a_uniform_cluster_gives_the_head_stage_fewer_layers() -> None:
    exp = build_experiment(pipeline(("H100",) * 4, layers=24, layers_per_stage="balanced"))
    layers = exp.costs.stage_layers
    assert sum(layers) == 24 and layers[-1] < 6 and max(layers) - min(layers[:-1]) <= 1


def test_explicit_layers_per_stage_still_work_and_bad_strings_are_errors() -> None:
    exp = build_experiment(pipeline(H3_A1, layers_per_stage=[9, 9, 5, 1]))
    assert exp.costs.stage_layers == (9, 9, 5, 1)
    with pytest.raises(ConfigError, match=r"parallel.layers_per_stage='fast'.*'balanced'"):
        build_experiment(pipeline(H3_A1, layers_per_stage="fast"))


def test_balanced_with_interleaved_stages_splits_each_ranks_layers_over_its_chunks() -> None:
    data = pipeline(("H100", "A100-80GB"), layers=16, m=4, layers_per_stage="balanced")
    data["parallel"]["vpp"] = 2
    data["schedule"] = "interleaved"
    exp = build_experiment(data)
    layers = exp.costs.stage_layers  # stages 0, 2 on the H100, 1, 3 on the A100
    assert sum(layers) == 16 and layers[0] + layers[2] > layers[1] + layers[3]
    assert abs(layers[0] - layers[2]) <= 1


# ---------------------------------------------------------------------------- memory


def _memory(order: tuple[str, ...], mb: int) -> dict:
    return simulate(build_experiment({
        "model": {"preset": "gpt3-2.7b", "seq_length": 2048},
        "cluster": {"num_gpus": len(order), "topology": "switch", "link_bandwidth_GBps": 50.0,
                    "nodes": [{"gpu": g, "count": 1} for g in order]},
        "parallel": {"pp": len(order)},
        "training": {"micro_batch_size": mb, "num_microbatches": 8},
    })).stats


CAP40, CAP80 = (GPUS[n].hbm_capacity_gib for n in ("A100-40GB", "A100-80GB"))


def _first_mb(stage: int) -> tuple[int, list[float]]:
    """The smallest micro-batch whose peak on ``stage`` overflows 40 GB (uniform 80 GB run),
    with the per-stage peaks (1F1B: stage 0 holds the most activations)."""
    for mb in range(1, 17):
        peaks = _memory(("A100-80GB",) * 4, mb)["peak_memory_per_stage_gib"]
        if peaks[stage] > CAP40:
            return mb, peaks
    raise AssertionError("no micro-batch size overflows 40 GB")


def test_oom_only_on_the_small_memory_gpu() -> None:
    """Two A100-40GBs, on the first and the last stage: only the first overflows."""
    mb, peaks = _first_mb(0)
    assert CAP40 < peaks[0] < CAP80 and peaks[3] < CAP40
    stats = _memory(("A100-40GB", "A100-80GB", "A100-80GB", "A100-40GB"), mb)
    assert stats["peak_memory_per_stage_gib"] == peaks  # memory does not depend on the GPU
    assert stats["oom"] and stats["oom_gpus"] == [0]
    assert stats["memory_capacity_gib"] == CAP40  # GPU 0 has the largest peak
    assert not _memory(("A100-80GB",) * 4, mb)["oom"]


def test_oom_of_a_gpu_that_is_not_the_largest_peak() -> None:
    """The largest peak (stage 0) fits its 80 GB GPU, a smaller one overflows a 40 GB GPU:
    one capacity for all would have missed it."""
    mb, peaks = _first_mb(1)
    assert peaks[0] < CAP80
    stats = _memory(("A100-80GB", "A100-40GB", "A100-80GB", "A100-80GB"), mb)
    assert stats["oom"] and stats["oom_gpus"] == [1]
    assert stats["peak_memory_gib"] < stats["memory_capacity_gib"] == CAP80


# ---------------------------------------------------------------------------- collapse


def test_collapsed_equals_full_on_a_mixed_full_mesh() -> None:
    """One GPU type per pipeline rank (H100, H100, A100, H100): the collapsed run times each
    rank's representative on its own GPU, so it agrees with the full run exactly."""
    mesh = {**MESH, "nodes": [{"gpu": "H100", "count": 8}, {"gpu": "A100-80GB", "count": 4},
                              {"gpu": "H100", "count": 4}]}
    exp = Experiment.from_dict({
        "name": "mixed-mesh", "model": {"preset": "gpt3-1.3b", "num_layers": 8,
                                        "seq_length": 1024},
        "cluster": {"num_gpus": 16, **mesh}, "parallel": {"tp": 2, "pp": 4, "dp": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 16}})
    assert mixed_pipeline_ranks(exp.placement, exp.cluster.gpu_of) == ()
    assert_agree(exp, EXACT, skip=("exposed_pp", "exposed_dp"))
    # rank 0 is an H100: a collapse that timed every rank on it would match all-H100
    uniform = exp.with_changes({"cluster.nodes": [{"gpu": "H100", "count": 16}]})
    assert (simulate(uniform, fidelity="collapsed").stats["step_time_s"]
            < 0.97 * simulate(exp, fidelity="collapsed").stats["step_time_s"])


def test_collapsed_equals_full_on_mixed_dgx_servers() -> None:
    """TP = 8 fills each server, one server per stage: A100, H100, H100, A100 servers."""
    exp = Experiment.from_dict({
        "name": "mixed-dgx", "model": {"preset": "gpt3-1.3b", "num_layers": 8,
                                       "seq_length": 1024},
        "cluster": {"num_gpus": 32, "nodes": [{"preset": "dgx-a100-80g", "count": 1},
                                              {"preset": "dgx-h100", "count": 2},
                                              {"preset": "dgx-a100-80g", "count": 1}]},
        "parallel": {"tp": 8, "pp": 4}, "training": {"micro_batch_size": 1,
                                                     "global_batch_size": 8}})
    assert_agree(exp, EXACT, skip=("exposed_pp",))


def test_pipeline_ranks_of_mixed_gpus_are_never_collapsed() -> None:
    """DP replicas on different GPU types: one GPU cannot stand for its pipeline rank."""
    data = pipeline(("H100", "A100-80GB", "H100", "A100-80GB"), layers=4, m=2)
    data["parallel"] = {"pp": 2, "dp": 2, "placement": "tp-cp-dp-pp"}
    data["training"] = {"micro_batch_size": 1, "global_batch_size": 4}
    exp = build_experiment(data)
    assert mixed_pipeline_ranks(exp.placement, exp.cluster.gpu_of) == (0, 1)
    with pytest.raises(ConfigError, match=r"pipeline ranks \[0, 1\] mix GPU types"):
        simulate(exp, fidelity="collapsed")
    assert simulate(exp).stats["fidelity"] == "full"


def test_mixed_pipeline_ranks_is_pure_placement_logic() -> None:
    pl = Placement.from_order("tp-cp-dp-pp", tp=2, cp=1, dp=2, pp=2)
    assert mixed_pipeline_ranks(pl, lambda g: "x") == ()
    assert mixed_pipeline_ranks(pl, lambda g: g == 5) == (1,)
    assert mixed_pipeline_ranks(pl, lambda g: g % 2) == (0, 1)


# ---------------------------------------------------------------------------- cluster


def test_mixed_servers_keep_their_own_links_and_gpus() -> None:
    c = mixed_server_cluster([("dgx-a100-80g", 2), ("dgx-h100", 2)])
    assert c.heterogeneous and c.num_gpus == 32
    assert [c.gpu_of(r).name for r in (0, 15, 16, 31)] == ["A100-80GB"] * 2 + ["H100"] * 2
    a100, h100 = SERVERS["dgx-a100-80g"], SERVERS["dgx-h100"]
    assert c.bottleneck_Bps(c.route(0, 1)) == pytest.approx(300e9 * a100.nvlink_efficiency)
    assert c.bottleneck_Bps(c.route(16, 17)) == pytest.approx(450e9 * h100.nvlink_efficiency)
    assert c.bottleneck_Bps(c.route(16, 24)) == pytest.approx(h100.nic_Bps * h100.nic_efficiency)
    assert c.bottleneck_Bps(c.route(0, 24)) == pytest.approx(a100.nic_Bps * a100.nic_efficiency)
    assert not c.nvls_capable(c.nvswitch_of(0)) and c.nvls_capable(c.nvswitch_of(16))
    assert c.gpu_types == (GPUS["A100-80GB"], GPUS["H100"])
    assert "16x A100-80GB + 16x H100" in repr(c)
    changed = c.with_link_changes(degraded={("host0/nic0", "fabric"): 0.5})
    assert changed.gpus == c.gpus
    # the H100 half alone is built as the dgx-h100 preset builds it
    h = server_cluster("dgx-h100", 16)
    assert h.bottleneck_Bps(h.route(0, 8)) == c.bottleneck_Bps(c.route(16, 24))


def test_uniform_clusters_are_not_heterogeneous() -> None:
    exp = build_experiment(pipeline(("H100",) * 4))
    c = exp.cluster
    assert not c.heterogeneous and c.gpus == (GPUS["H100"],) * 4 and c.gpu_of(3) is c.gpu
    stats = simulate(exp).stats
    assert stats["gpu"] == "H100" and "oom_gpus" not in stats


def test_gpu_groups_on_an_explicit_switch_get_their_gpus_nvlink() -> None:
    exp = build_experiment({
        "model": {"preset": "gpt3-1.3b"},
        "cluster": {"num_gpus": 16, "topology": "switch", "gpus_per_node": 4,
                    "link_bandwidth_GBps": 25.0,
                    "nodes": [{"gpu": "A100-80GB", "count": 2}, {"gpu": "H100", "count": 2}]},
        "parallel": {"tp": 4, "pp": 4}, "training": {"global_batch_size": 8}})
    c = exp.cluster
    assert c.bottleneck_Bps(c.route(0, 1)) == GPUS["A100-80GB"].nvlink_bandwidth_Bps
    assert c.bottleneck_Bps(c.route(8, 9)) == GPUS["H100"].nvlink_bandwidth_Bps
    assert c.bottleneck_Bps(c.route(0, 8)) == 25e9


def test_mixed_sites_number_servers_across_sites() -> None:
    exp = build_experiment({
        "model": {"preset": "gpt3-1.3b"},
        "cluster": {"num_gpus": 32, "sites": 2, "wan_bandwidth_Mbps": 10000.0,
                    "wan_latency_ms": 5.0,
                    "nodes": [{"preset": "dgx-a100-80g", "count": 2},
                              {"preset": "dgx-h100", "count": 2}]},
        "parallel": {"tp": 8, "pp": 4}, "training": {"global_batch_size": 8}})
    c = exp.cluster
    assert c.gpu_of(15).name == "A100-80GB" and c.gpu_of(16).name == "H100"
    assert c.nvls_capable(c.nvswitch_of(16)) and not c.nvls_capable(c.nvswitch_of(0))


BASE = {"model": {"preset": "gpt3-1.3b"}, "training": {"global_batch_size": 8}}
A2H2 = [{"preset": "dgx-a100-80g", "count": 2}, {"preset": "dgx-h100", "count": 2}]


@pytest.mark.parametrize(("cluster", "message"), [
    ({"num_gpus": 24, "nodes": A2H2},
     r"cluster.nodes: 2x dgx-a100-80g \+ 2x dgx-h100 servers of 8 GPUs = 32 GPUs != "
     r"cluster.num_gpus = 24"),
    ({"num_gpus": 32, "nodes": [{"preset": "dgx-a100", "count": 4}]},
     r"cluster.nodes\[0\].preset: unknown server preset 'dgx-a100'; choose one of"),
    ({"num_gpus": 8, "topology": "ring", "link_bandwidth_GBps": 10.0,
      "nodes": [{"gpu": "A100-80GB", "count": 4}, {"gpu": "H300", "count": 4}]},
     r"cluster.nodes\[1\].gpu: unknown GPU 'H300'; choose one of"),
    ({"num_gpus": 16, "nodes": [{"preset": "dgx-a100-80g", "count": 1},
                                {"gpu": "H100", "count": 8}]},
     r"cluster.nodes\[1\].gpu: groups mix 'preset' and 'gpu'"),
    ({"num_gpus": 8, "nodes": [{"gpu": "H100", "count": 8}]},
     r"cluster.nodes\[0\].gpu='H100': GPU groups need cluster.topology"),
    ({"num_gpus": 8, "nodes": [{"count": 1}]},
     r"cluster.nodes\[0\]: give one of 'preset' \(a server preset\) or 'gpu'.*neither"),
    ({"num_gpus": 32, "preset": "dgx-h100", "nodes": A2H2},
     r"cluster.preset: give the GPU types in cluster.nodes, not also"),
    ({"num_gpus": 80, "nodes": [{"preset": "gb200-nvl72", "count": 1},
                                {"preset": "dgx-h100", "count": 1}]},
     r"same GPUs per server, got gb200-nvl72: 72, dgx-h100: 8"),
    ({"num_gpus": 32, "nodes": []}, r"cluster.nodes: empty"),
    ({"num_gpus": 32, "nodes": [{"preset": "dgx-h100", "count": 0}]},
     r"cluster.nodes.0.count: input should be greater than 0"),
    ({"num_gpus": 32, "nodes": [{"preset": "dgx-h100", "count": 4, "gpus": 8}]},
     r"unknown key 'cluster.nodes.0.gpus'"),
    ({"num_gpus": 32, "sites": 3, "wan_bandwidth_Mbps": 1.0, "wan_latency_ms": 1.0,
      "nodes": A2H2}, r"cluster.sites=3 does not divide the 4 servers"),
    ({"num_gpus": 32, "topology": "ring", "nodes": A2H2},
     r"cluster.topology='ring' cannot join servers of cluster.nodes"),
])
def test_bad_node_groups_are_config_errors(cluster: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_experiment({**BASE, "cluster": cluster})


# ---------------------------------------------------------------------------- CLI


def test_example_runs_from_the_cli(capsys: pytest.CaptureFixture) -> None:
    assert main(["run", str(EXAMPLE), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["gpu"] == "16x A100-80GB + 16x H100"
    assert stats["num_gpus"] == 32 and not stats["oom"] and stats["oom_gpus"] == []
    exp = load_experiment(EXAMPLE)
    assert exp.config.parallel.layers_per_stage == "balanced"
    a100, h100 = exp.costs.stage_layers[:2], exp.costs.stage_layers[2:]
    assert min(h100) > max(a100)
    even = simulate(exp.with_changes({"parallel.layers_per_stage": None})).stats
    assert stats["step_time_s"] < even["step_time_s"]


def test_waiting_on_a_slower_gpu_type_is_straggler_time() -> None:
    """A slow last stage of another GPU type makes the others wait exactly as a straggler
    does (tests/test_idle.py): each faster stage keeps the bubble of the all-H100 pipeline,
    and what it idles beyond that, m times the slow stage's excess per micro-batch over the
    fastest type, is ``straggler``; the slow stage itself waits on nobody slower."""
    mixed_exp = build_experiment(pipeline(H3_A1))
    mixed = simulate(mixed_exp).stats["idle_breakdown"]["per_gpu_s"]
    uniform = simulate(build_experiment(pipeline(("H100",) * 4))).stats
    uniform = uniform["idle_breakdown"]["per_gpu_s"]
    slow = stage_costs(mixed_exp)[3]
    h100 = work_timer(GPUS["H100"], default_profile("H100"), "flash2")
    fast = [sum(h100(seg) for seg in mixed_exp.costs.op_segments(Op(3, kind, 0), False)
                if isinstance(seg, ComputeSeg)) for kind in ("F", "B")]
    excess = (slow[0] + slow[1]) - sum(fast)
    m = 8
    for g in ("0", "1", "2"):
        assert mixed[g]["bubble"] == pytest.approx(uniform[g]["bubble"], rel=1e-9)
        assert mixed[g]["straggler"] == pytest.approx(
            mixed[g]["idle_s"] - uniform[g]["idle_s"], rel=1e-9)
        assert mixed[g]["straggler"] == pytest.approx(m * excess, rel=1e-9)
    assert mixed["3"]["straggler"] == pytest.approx(0.0, abs=1e-15)
