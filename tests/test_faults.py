"""Faults: validation, stragglers and fidelity, seeded draws, Young/Daly goodput, link faults."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import yaml
from conftest import synthetic_experiment

from base.errors import ConfigError
from sim.api import simulate
from sim.cli import main
from sim.experiment import build_experiment
from sim.faults import (
    batch_segments,
    simulate_failures,
    straggler_slowdowns,
    young_daly_goodput,
    young_daly_interval_s,
)
from sim.faults_config import FaultsConfig, GpuFailures
from sim.faults_run import simulate_run

MS = 1e-3


def _with_faults(faults: dict, p: int = 4, m: int = 8, **kw) -> dict:
    data = synthetic_experiment(p, m, forward_ms=1.0, backward_ms=2.0, **kw)
    data["faults"] = faults
    return data


@pytest.mark.parametrize(("faults", "message"), [
    ({"stragglers": [{"gpu": 1, "slowdown": 0.5}]},
     r"faults.stragglers.0.slowdown: input should be greater than or equal to 1, got 0.5"),
    ({"stragglers": [{"gpu": 9, "slowdown": 1.5}]},
     r"faults.stragglers\[0\].gpu=9: the cluster has 4 GPUs"),
    ({"stragglers": [{"gpu": 1, "slowdown": 1.5}, {"gpu": 1, "slowdown": 2.0}]},
     r"faults.stragglers\[1\].gpu=1 is listed twice"),
    ({"stragglrs": []}, r"unknown key 'faults.stragglrs' \(did you mean 'stragglers'\?\)"),
    ({"random_stragglers": {"count": 2, "fraction": 0.5, "slowdown": 1.2}},
     r"faults.random_stragglers: give exactly one of 'fraction' or 'count'"),
    ({"random_stragglers": {"count": 2}},
     r"faults.random_stragglers: give exactly one of 'slowdown', 'slowdown_range'"),
    ({"random_stragglers": {"count": 9, "slowdown": 1.2}},
     r"faults.random_stragglers.count=9 exceeds the cluster's 4 GPUs"),
    ({"random_stragglers": {"count": 1, "slowdown_range": [1.5, 1.2]}},
     r"faults.random_stragglers.slowdown_range=\[1.5, 1.2\]"),
    ({"random_stragglers": {"fraction": 1.5, "slowdown": 1.2}},
     r"faults.random_stragglers.fraction: input should be less than or equal to 1, got 1.5"),
])
def test_bad_straggler_config(faults: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate(build_experiment(_with_faults(faults)))


@pytest.mark.parametrize(("failures", "message"), [
    ({"checkpoint_interval_steps": 10}, r"give exactly one of 'mtbf_hours', 'gpu_mtbf_hours'"),
    ({"mtbf_hours": 1.0, "times_s": [1.0], "checkpoint_interval_steps": 10},
     r"got \['mtbf_hours', 'times_s'\]"),
    ({"mtbf_hours": -1.0, "checkpoint_interval_steps": 10},
     r"faults.gpu_failures.mtbf_hours: input should be greater than 0, got -1.0"),
    ({"mtbf_hours": 1.0}, r"faults.gpu_failures.checkpoint_interval_steps: required key"),
    ({"times_s": [-2.0], "checkpoint_interval_steps": 1}, r"times_s=\[-2.0\]: times must be"),
])
def test_bad_failure_config(failures: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate_run(build_experiment(_with_faults({"gpu_failures": failures})), 10)


def test_cli_reports_bad_faults_in_one_line(tmp_path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_with_faults({"stragglers": [{"gpu": 7, "slowdown": 1.2}]})))
    assert main(["run", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: faults.stragglers[0].gpu=7") and err.count("\n") == 1
    path.write_text(yaml.safe_dump(_with_faults({"link_faults": [{"link": ["gpu0"]}]})))
    assert main(["run", str(path), "--steps", "3"]) == 2
    assert capsys.readouterr().err.startswith("error: faults.link_faults[0].link=['gpu0']")


@pytest.mark.parametrize(("faults", "message"), [
    ({"link_faults": [{"link": ["gpu0", "nowhere"], "failed": True}]},
     "error: faults.link_faults[0]: cluster ideal: no node 'nowhere'"),
    ({"link_faults": [{"link": ["gpu0", "gpu1"], "at_s": 1e9, "failed": True}]},
     "error: faults.link_faults[0]: cluster ideal: no link ['gpu0', 'gpu1']"),
    ({"link_faults": [{"link": ["gpu0", "switch"], "at_s": 1.0}]},
     "error: faults.link_faults[0]: give bandwidth_factor or failed: true"),
    ({"preemptions": [{"node": 4, "at_s": 1e9, "policy": "stall"}]},
     "error: faults.preemptions[0].node=4: the cluster has 4 servers (0..3)"),
    ({"preemptions": [{"node": 0, "policy": "rebalance", "replacement_s": 5.0}]},
     "error: faults.preemptions[0].replacement_s=5.0: only used with policy 'stall'"),
])
def test_faults_naming_what_the_cluster_lacks_are_errors_with_or_without_steps(
        tmp_path, capsys: pytest.CaptureFixture, faults: dict, message: str) -> None:
    """A fault on a link or server the cluster does not have is a mistake in the file whether
    or not the run plays the faults (``--steps``) and however late it would strike."""
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_with_faults(faults)))
    for extra in ([], ["--steps", "3"]):
        assert main(["run", str(path), "--json", *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1


def test_stragglers_force_full_fidelity() -> None:
    data = _with_faults({"stragglers": [{"gpu": 5, "slowdown": 1.3}]}, p=4, m=4)
    data["cluster"]["num_gpus"] = 128  # dp = 32: auto would collapse without the straggler
    data["training"] = {"num_microbatches": 4}
    exp = build_experiment(data)
    stats = simulate(exp).stats
    assert stats["fidelity"] == "full"
    assert simulate(exp.with_changes({"faults": None})).stats["fidelity"] == "collapsed"
    # the slow GPU's pipeline is the bottleneck: 1F1B with one stage 30% slower
    assert stats["step_time_s"] > (4 + 4 - 1) * 3 * MS
    with pytest.raises(ConfigError, match=r"fidelity='collapsed': faults.stragglers on GPUs \[5\]"):
        simulate(exp, fidelity="collapsed")


def test_random_stragglers_are_seeded() -> None:
    def draw(seed: int, **kw) -> dict[int, float]:
        spec = {"count": 3, "slowdown_range": [1.1, 1.5], "seed": seed, **kw}
        return straggler_slowdowns(FaultsConfig.model_validate({"random_stragglers": spec}), 64)

    a, b, c = draw(1), draw(1), draw(2)
    assert a == b and a != c and len(a) == 3
    assert all(1.1 <= f <= 1.5 for f in a.values())
    frac = straggler_slowdowns(FaultsConfig.model_validate(
        {"random_stragglers": {"fraction": 0.1, "slowdown": 1.25, "seed": 0}}), 64)
    assert len(frac) == 6 and set(frac.values()) == {1.25}
    logn = straggler_slowdowns(FaultsConfig.model_validate(
        {"random_stragglers": {"count": 4, "slowdown_lognormal": {"median": 1.2, "sigma": 0.1},
                               "seed": 5}}), 8)
    assert len(logn) == 4 and all(f >= 1 for f in logn.values())
    both = straggler_slowdowns(FaultsConfig.model_validate(
        {"stragglers": [{"gpu": 0, "slowdown": 2.0}],
         "random_stragglers": {"count": 4, "slowdown": 1.5, "seed": 0}}), 4)
    assert both[0] == 3.0  # every GPU drawn; GPU 0 gets the product


def test_same_seed_same_bytes_different_seed_different_output() -> None:
    def run(seed: int) -> str:
        faults = {"random_stragglers": {"count": 1, "slowdown_range": [1.1, 1.9], "seed": seed},
                  "gpu_failures": {"mtbf_hours": 0.002, "checkpoint_interval_steps": 5,
                                   "checkpoint_write_s": 0.01, "restart_s": 0.05, "seed": seed}}
        return simulate_run(build_experiment(_with_faults(faults)), 500).stats_json()

    assert run(3) == run(3)
    assert run(3) != run(4)
    assert json.loads(run(3))["stragglers"] != json.loads(run(4))["stragglers"]


def test_failures_at_given_times_exact_accounting() -> None:
    """Steps of 1 s, checkpoint every 10 steps (1 s to write), restart 5 s, failure at 15.5 s:
    the second interval loses 4.5 s of work and pays the restart, then is redone."""
    spec = GpuFailures(times_s=[15.5], checkpoint_interval_steps=10, checkpoint_write_s=1.0,
                       restart_s=5.0)
    run = simulate_failures([(1.0, 20)], spec, 8)
    assert (run.useful_s, run.checkpoint_s, run.lost_work_s, run.restart_s) == (20, 1, 4.5, 5)
    assert run.time_to_train_s == 30.5 and run.failures == 1
    assert run.goodput == pytest.approx(20 / 30.5)
    assert simulate_failures([(1.0, 20)], None, 8).goodput == 1.0


def test_goodput_matches_young_daly() -> None:
    """Many seeded long runs: mean goodput within 1% of the first-order expectation
    (Young 1974; Daly 2006) for MTBF 5.6 h, checkpoints every 1000 s of work costing
    60 s, restarts of 300 s; the Young/Daly interval is sqrt(2 δ M) - δ."""
    step_s, interval = 10.0, 100
    mtbf_h = 20000 / 3600
    goodputs = []
    for seed in range(60):
        spec = GpuFailures(mtbf_hours=mtbf_h, checkpoint_interval_steps=interval,
                           checkpoint_write_s=60.0, restart_s=300.0, seed=seed)
        goodputs.append(simulate_failures([(step_s, 20_000)], spec, 1024).goodput)
    expected = young_daly_goodput(step_s * interval, 60.0, 300.0, 20000.0)
    assert expected == pytest.approx(0.9042, abs=1e-4)
    assert statistics.fmean(goodputs) == pytest.approx(expected, rel=0.01)
    assert statistics.pstdev(goodputs) > 0  # the seeds differ
    young = (2 * 60 * 20000) ** 0.5  # Young 1974; Daly 2006 refines it
    x = 60 / (2 * 20000)
    assert young_daly_interval_s(60.0, 20000.0) == pytest.approx(
        young * (1 + x ** 0.5 / 3 + x / 9) - 60)
    assert young_daly_interval_s(60.0, 20.0) == 20.0  # δ >= 2M: checkpoint every MTBF
    per_gpu = GpuFailures(gpu_mtbf_hours=mtbf_h * 1024, checkpoint_interval_steps=interval,
                          checkpoint_write_s=60.0, restart_s=300.0, seed=0)
    job = GpuFailures(mtbf_hours=mtbf_h, checkpoint_interval_steps=interval,
                      checkpoint_write_s=60.0, restart_s=300.0, seed=0)
    assert simulate_failures([(step_s, 2000)], per_gpu, 1024).time_to_train_s == pytest.approx(
        simulate_failures([(step_s, 2000)], job, 1024).time_to_train_s, rel=1e-12)


def test_run_with_failures_reports_lost_work() -> None:
    faults = {"gpu_failures": {"times_s": [0.5, 2.0], "checkpoint_interval_steps": 10,
                               "checkpoint_write_s": 0.1, "restart_s": 1.0}}
    stats = simulate_run(build_experiment(_with_faults(faults)), 100).stats
    step = 11 * 3 * MS
    assert stats["useful_work_s"] == pytest.approx(100 * step)
    assert stats["failures"] == 2 and stats["restart_s"] == 2.0
    assert stats["time_to_train_s"] == pytest.approx(
        stats["useful_work_s"] + stats["checkpoint_s"] + stats["lost_work_s"] + 2.0)
    assert stats["goodput"] == pytest.approx(stats["useful_work_s"] / stats["time_to_train_s"])
    idle = stats["idle_breakdown_run_s"]
    assert idle["failure"] == pytest.approx(stats["time_to_train_s"] - stats["useful_work_s"])
    assert idle["idle_s"] == pytest.approx(stats["time_to_train_s"] - 100 * 8 * 3 * MS)


def _fabric(topology: dict, faults: list | None = None) -> dict:
    data = {"name": "links",
            "model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 2.0, "p2p_MB": 16.0,
                                    "grad_MB": 100.0}},
            "cluster": topology, "parallel": {"pp": 2}, "training": {"num_microbatches": 4}}
    if faults is not None:
        data["faults"] = {"link_faults": faults}
    return data


def test_link_failure_on_a_fat_tree_costs_bandwidth_not_correctness() -> None:
    tree = {"topology": "fat-tree", "num_gpus": 8, "link_bandwidth_GBps": 10.0, "gpus_per_leaf": 2}
    clean = simulate_run(build_experiment(_fabric(tree)), 10).stats
    cut = simulate_run(build_experiment(_fabric(tree, [
        {"link": ["leaf0", "spine0"], "at_s": 0.05, "failed": True}])), 10).stats
    half = simulate_run(build_experiment(_fabric(tree, [
        {"link": ["leaf0", "spine0"], "at_s": 0.0, "bandwidth_factor": 0.5}])), 10).stats
    step = clean["step_time_s"]
    assert cut["time_to_train_s"] > clean["time_to_train_s"] == pytest.approx(10 * step)
    # strikes 0.05 s in, in the middle of the second step: that step reroutes its flows then
    # (here after its last pipeline sends: it is no slower); the 8 after it run on the
    # failed cluster, where pipeline sends share the surviving spine
    segs = cut["run_segments"]
    assert [r["steps"] for r in segs] == [1, 1, 8] and segs[1]["mid_step_faults"] == 1
    assert segs[1]["step_time_s"] == pytest.approx(step)
    assert segs[2]["step_time_s"] > step
    assert half["time_to_train_s"] >= clean["time_to_train_s"]


def test_link_failures_that_partition_a_ring_are_reported() -> None:
    ring = {"topology": "ring", "num_gpus": 4, "link_bandwidth_GBps": 10.0}
    one = simulate_run(build_experiment(_fabric(ring, [
        {"link": ["gpu0", "gpu1"], "at_s": 0.0, "failed": True}])), 3).stats
    assert one["time_to_train_s"] > 0  # a ring survives one cut (the long way round)
    with pytest.raises(ConfigError, match=r"faults.link_faults: .*partition"):
        simulate_run(build_experiment(_fabric(ring, [
            {"link": ["gpu0", "gpu1"], "at_s": 0.0, "failed": True},
            {"link": ["gpu2", "gpu3"], "at_s": 0.0, "failed": True}])), 3)
    with pytest.raises(ConfigError, match=r"faults.link_faults"):
        simulate_run(build_experiment(_fabric(ring, [{"link": ["gpu0", "gpu2"],
                                                      "failed": True}])), 3)


def test_batch_segments() -> None:
    assert batch_segments(None, 8, 5) == ((0, 5, 8),)
    assert batch_segments([[0, 4], [3, 8], [10, 16]], 8, 6) == ((0, 3, 4), (3, 3, 8))
    with pytest.raises(ConfigError, match=r"--steps=0"):
        batch_segments(None, 8, 0)


def _preempted(preemptions: list, placement: str = "tp-cp-pp-dp") -> dict:
    """Two DGX servers, pp = 2 inside each server (placement pp before dp), dp = 8."""
    return {"name": "preempt", "model": {"synthetic": {"forward_ms": 1.0, "backward_ms": 2.0}},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
            "parallel": {"pp": 2, "placement": placement},
            "training": {"global_batch_size": 32}, "faults": {"preemptions": preemptions}}


def test_preemption_notice_and_step_boundaries() -> None:
    """A notice that outlasts the step in flight lets it finish (the change applies at the
    boundary, nothing lost); a preemption at a step boundary loses nothing either."""
    step = simulate_run(build_experiment(_preempted([])), 10).stats["step_time_s"]
    k = math.floor(0.5 / step)
    rest = (k + 1) * step - 0.5  # what the step in flight at 0.5 s has left
    for notice, steps_before, lost in ((rest * 1.01, k + 1, 0.0), (rest * 0.99, k, 0.5 - k * step)):
        stats = simulate_run(build_experiment(_preempted(
            [{"node": 1, "at_s": 0.5, "policy": "rebalance", "notice_s": notice}])), 100).stats
        assert stats["run_segments"][0]["steps"] == steps_before
        assert stats["preemption_lost_s"] == pytest.approx(lost, abs=1e-12)
    at_boundary = simulate_run(build_experiment(_preempted(
        [{"node": 1, "at_s": 0.0, "policy": "rebalance"}])), 10).stats
    assert at_boundary["preemption_lost_s"] == 0.0
    assert [r["dp"] for r in at_boundary["run_segments"]] == [4]


def test_preemption_rebalance_and_stall() -> None:
    """SWARM-style preemption (Ryabinin et al. 2023): ``rebalance`` goes on with the DP
    replicas left (same global batch, twice the micro-batches each), the step in flight
    at ``at_s`` lost and rerun; ``stall`` waits."""
    clean = simulate_run(build_experiment(_preempted([])), 100).stats
    step = clean["step_time_s"]
    assert step == pytest.approx((4 + 1) * 3 * MS, rel=0.01)  # m = 32 / 8 = 4 per pipeline
    rebalanced = simulate_run(build_experiment(_preempted(
        [{"node": 1, "at_s": 0.5, "policy": "rebalance"}])), 100).stats
    before, after = rebalanced["run_segments"]
    assert (before["dp"], after["dp"]) == (8, 4)
    assert before["steps"] == math.floor(0.5 / step) and before["steps"] + after["steps"] == 100
    assert after["step_time_s"] == pytest.approx((8 + 1) * 3 * MS, rel=0.01)  # m = 8
    lost = 0.5 - before["steps"] * step  # the step in flight at 0.5 s, from its start
    assert rebalanced["preemption_lost_s"] == pytest.approx(lost, rel=1e-9) and lost > 0
    assert rebalanced["time_to_train_s"] == pytest.approx(
        before["steps"] * before["step_time_s"] + after["steps"] * after["step_time_s"] + lost)
    assert rebalanced["idle_breakdown_run_s"]["failure"] == pytest.approx(lost)
    stalled = simulate_run(build_experiment(_preempted(
        [{"node": 1, "at_s": 0.5, "policy": "stall", "replacement_s": 30.0}])), 100).stats
    assert stalled["time_to_train_s"] == pytest.approx(clean["time_to_train_s"] + 30.0)
    assert stalled["preemption_stall_s"] == 30.0
    assert stalled["goodput"] == pytest.approx(clean["time_to_train_s"] / (
        clean["time_to_train_s"] + 30.0))
    assert stalled["idle_breakdown_run_s"]["failure"] == pytest.approx(30.0)


@pytest.mark.parametrize(("preemptions", "placement", "message"), [
    ([{"node": 1, "policy": "rebalance"}], "tp-cp-dp-pp",
     r"faults.preemptions\[0\]: policy 'rebalance' needs a DP replica left, but servers \[1\]"),
    ([{"node": 5, "policy": "stall"}], "tp-cp-pp-dp",
     r"faults.preemptions\[0\].node=5: the cluster has 2 servers"),
    ([{"node": 1, "policy": "rebalance", "replacement_s": 5.0}], "tp-cp-pp-dp",
     r"faults.preemptions\[0\].replacement_s=5.0: only used with policy 'stall'"),
    ([{"node": 1, "policy": "pause"}], "tp-cp-pp-dp", r"faults.preemptions.0.policy"),
])
def test_bad_preemptions(preemptions: list, placement: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate_run(build_experiment(_preempted(preemptions, placement)), 10)
