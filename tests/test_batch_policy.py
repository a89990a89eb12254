"""Adaptive batch sizes (sim/batch_policy.py, Lau et al. 2025's norm test) over --steps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from base.errors import ConfigError
from sim.batch_policy import load_curve, policy_schedule, steps_to_tokens
from sim.config import BatchPolicyConfig, StatisticCurve
from sim.experiment import Experiment
from sim.faults_run import simulate_run

SEQ = 256


def _exp(policy: dict | None, tmp: Path | None = None, **training: Any) -> Experiment:
    """A small transformer, 4-way DP, micro-batches of 2 (batches in multiples of 8)."""
    data = {
        "model": {"preset": "gpt3-1.3b", "seq_length": SEQ, "num_layers": 2},
        "cluster": {"topology": "switch", "num_gpus": 4, "link_bandwidth_GBps": 10},
        "parallel": {"zero_stage": 0},
        "training": {"micro_batch_size": 2, "global_batch_size": 8, **training},
    }
    if policy is not None:
        data["training"]["batch_policy"] = policy
    if tmp is None:
        return Experiment.from_dict(data)
    import yaml
    path = tmp / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return Experiment.from_yaml(path)


def _no_policy_key(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k != "batch_policy"}


def test_a_constant_policy_is_the_fixed_batch_exactly() -> None:
    fixed = simulate_run(_exp(None), 50).stats
    constant = simulate_run(_exp({"rule": "constant"}), 50).stats
    assert _no_policy_key(constant) == fixed
    assert constant["batch_policy"]["schedule"] == [[0, 8]]


def test_the_norm_test_grows_the_batch_to_the_statistic_over_eta_squared() -> None:
    """b' = ceil(T/η²), rounded up to micro_batch·dp = 8, never shrinking, capped."""
    policy = BatchPolicyConfig(eta=0.5, statistic=StatisticCurve(initial=1.0, exponent=1.0),
                               test_interval=10, max_global_batch_size=300)
    curve = load_curve(policy.statistic, None)
    schedule = policy_schedule(policy, curve, 8, 8, 100, 100)
    expected, batch = [], 8
    for step in range(0, 100, 10):
        want = min(296, max(batch, math.ceil(4 * (1 + step) / 8) * 8))
        if want != batch or step == 0:
            expected.append([step, want])
            batch = want
    assert schedule == expected
    assert schedule[1] == [10, 48]  # 4·11 = 44 sequences, rounded up to 48
    assert schedule[-1][1] == 296  # the cap, rounded down to a multiple of 8


def test_a_run_replays_the_policy_as_a_batch_schedule() -> None:
    """The policy's run equals the same schedule given as training.global_batch_schedule."""
    policy = {"eta": 0.5, "statistic": {"initial": 4.0, "exponent": 1.0}, "test_interval": 5}
    run = simulate_run(_exp(policy), 12).stats
    schedule = run["batch_policy"]["schedule"]
    assert schedule == [[0, 16], [5, 96], [10, 176]]
    replay = simulate_run(_exp(None, global_batch_schedule=schedule), 12).stats
    assert _no_policy_key(run) == replay


def test_a_target_token_count_ends_the_run_early(tmp_path: Path) -> None:
    (tmp_path / "noise.csv").write_text("step,var_over_grad_norm2\n0,2\n3,40\n")
    policy = {"eta": 1.0, "statistic": {"csv": "noise.csv"}, "target_tokens": 200 * SEQ}
    run = simulate_run(_exp(policy, tmp_path), 1000).stats
    # 3 steps of 8 sequences, then 40 a step: 24 + 40·5 >= 200 after 8 steps
    assert run["batch_policy"]["schedule"] == [[0, 8], [3, 40]]
    assert run["batch_policy"]["steps_run"] == 8
    assert run["batch_policy"]["tokens"] == (24 + 40 * 5) * SEQ
    fixed = simulate_run(_exp({"rule": "constant", "target_tokens": 200 * SEQ}), 1000).stats
    assert fixed["batch_policy"]["steps_run"] == 25
    assert run["time_to_train_s"] < fixed["time_to_train_s"]


def test_steps_to_tokens_counts_from_the_schedule() -> None:
    assert steps_to_tokens([[0, 8], [3, 40]], 1, 24, 10) == 3
    assert steps_to_tokens([[0, 8], [3, 40]], 1, 25, 10) == 4
    with pytest.raises(ConfigError, match=r"target_tokens=1000: --steps 10 train only 304"):
        steps_to_tokens([[0, 8], [3, 40]], 1, 1000, 10)


@pytest.mark.parametrize(("csv", "message"), [
    (None, "file does not exist"),
    ("step,value\n", "needs a header line and at least one row"),
    ("step,value\n1,2\n", "line 2: the first row must be step 0, got 1"),
    ("step,value\n0,2\n0,3\n", "line 3: step 0 does not increase"),
    ("step,value\n0,-1\n", "line 2: value -1.0 must be positive and finite"),
    ("step,value\n0,nan\n", "line 2: value nan must be positive and finite"),
    ("step,value\n0,x\n", "line 2 '0,x' is not step,value"),
])
def test_bad_statistic_files_are_errors_naming_the_line(tmp_path: Path, csv: str | None,
                                                         message: str) -> None:
    if csv is not None:
        (tmp_path / "noise.csv").write_text(csv)
    with pytest.raises(ConfigError) as info:
        _exp({"statistic": {"csv": "noise.csv"}}, tmp_path)
    assert str(info.value).startswith("training.batch_policy.statistic.csv='noise.csv': ")
    assert message in str(info.value)


@pytest.mark.parametrize(("policy", "training", "message"), [
    ({}, {}, "training.batch_policy.statistic: required by rule 'norm_test'"),
    ({"statistic": {"initial": 1.0, "csv": "x.csv"}}, {},
     "training.batch_policy.statistic: give either csv or initial"),
    ({"rule": "constant"}, {"global_batch_schedule": [[0, 8]]},
     "training.batch_policy: not with training.global_batch_schedule"),
    ({"eta": 0}, {}, "training.batch_policy.eta: input should be greater than 0"),
    ({"rule": "doubling"}, {}, "training.batch_policy.rule: input should be"),
])
def test_bad_policies_are_errors_naming_the_key(policy: dict, training: dict,
                                                message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _exp(policy, **training)
    assert str(info.value).startswith(message)


def test_a_cap_below_the_initial_batch_and_a_runaway_policy_are_errors() -> None:
    with pytest.raises(ConfigError, match="max_global_batch_size=4: below the initial"):
        simulate_run(_exp({"statistic": {"initial": 1.0}, "max_global_batch_size": 4}), 10)
    with pytest.raises(ConfigError, match="changes the batch more than 100 times"):
        simulate_run(_exp({"statistic": {"initial": 1.0, "exponent": 1.0}, "eta": 0.1}), 1000)


def test_a_statistic_that_overflows_is_capped_or_an_error() -> None:
    policy = BatchPolicyConfig(statistic=StatisticCurve(initial=1e300, exponent=10.0),
                               max_global_batch_size=1024)
    curve = load_curve(policy.statistic, None)
    assert policy_schedule(policy, curve, 8, 8, 100, 100) == [[0, 1024]]
    with pytest.raises(ConfigError, match="asks for a batch of 1e.302 sequences at step 0"):
        policy_schedule(policy.model_copy(update={"max_global_batch_size": None}), curve, 8,
                        8, 100, 100)
