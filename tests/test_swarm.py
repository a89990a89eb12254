"""SWARM parallelism (parallel.swarm): pools, stochastic wiring, rebalancing, preemptions."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from conftest import ROOT

from base.errors import ConfigError
from sim.api import simulate
from sim.experiment import build_experiment
from sim.faults_run import simulate_run
from sim.swarm import (
    AWAY,
    PeerEvent,
    Swarm,
    after_event,
    draw_peer_events,
    members,
    rebalanced,
    simulate_swarm,
    wire,
)
from workloads.program import Send

EXAMPLE = ROOT / "workloads" / "examples" / "swarm-preemptible.yaml"


def _pipeline(pp: int = 4, schedule: str = "1f1b", model: dict | None = None,
              gpus: list[dict] | None = None) -> dict:
    """A fixed pipeline of ``pp`` GPUs (dp = 1) on a slow switch."""
    return {
        "name": "pipe",
        "model": model or {"synthetic": {"forward_ms": 20.0, "backward_ms": 40.0,
                                         "p2p_MB": 2.0, "grad_MB": 10.0}},
        "cluster": {"topology": "switch", "num_gpus": pp, "link_bandwidth_GBps": 0.02,
                    "link_latency_us": 25000.0, "nodes": gpus or [{"gpu": "T4", "count": pp}]},
        "parallel": {"pp": pp},
        "training": {"global_batch_size": 8},
        "schedule": schedule,
    }


def _swarm(pools: list[int], **swarm) -> dict:
    data = _pipeline(len(pools))
    data["cluster"] = {**data["cluster"], "num_gpus": sum(pools),
                       "nodes": [{"gpu": "T4", "count": sum(pools)}]}
    data["parallel"] = {"pp": len(pools), "swarm": {"pools": pools, **swarm}}
    return data


TRANSFORMER = {"preset": "gpt3-1.3b", "seq_length": 512}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("model", [None, TRANSFORMER])
def test_one_peer_per_stage_is_the_fixed_pipeline(schedule: str, model: dict | None) -> None:
    fixed = _pipeline(4, schedule, model)
    swarm = copy.deepcopy(fixed)
    swarm["parallel"]["swarm"] = {"pools": [1, 1, 1, 1], "seed": 3}
    a, b = simulate(build_experiment(fixed)), simulate(build_experiment(swarm))
    assert b.stats["step_time_s"] == a.stats["step_time_s"]
    assert b.program.instructions == a.program.instructions
    assert b.stats["peak_memory_gib"] == a.stats["peak_memory_gib"]


def test_wiring_frequencies_converge_to_throughput_weights() -> None:
    weights = {0: 1.0, 1: 2.0, 2: 5.0, 3: 1.0, 4: 3.0}
    pools = [(0, 1, 2), (3, 4)]
    paths = wire(pools, lambda p, s: weights[p], 40_000, seed=11)
    for s, pool in enumerate(pools):
        counts = Counter(path[s] for path in paths)
        total = sum(weights[p] for p in pool)
        for p in pool:
            assert counts[p] / len(paths) == pytest.approx(weights[p] / total, abs=0.01)
    assert wire(pools, lambda p, s: weights[p], 50, seed=11) == paths[:50]


def test_wiring_weights_are_measured_throughputs_of_mixed_gpus() -> None:
    data = _swarm([2, 2])
    data["model"] = TRANSFORMER
    data["cluster"]["nodes"] = [{"gpu": "T4", "count": 1}, {"gpu": "A100-80GB", "count": 1},
                                {"gpu": "T4", "count": 2}]
    data["training"] = {"global_batch_size": 400}
    exp = build_experiment(data)
    swarm = Swarm.of(exp)
    t4, a100 = swarm.throughput(0, 0), swarm.throughput(1, 0)
    assert a100 > 2 * t4
    runs = simulate_swarm(exp, swarm=swarm).stats["swarm"]["microbatches_per_peer"]
    assert runs[1] / (runs[0] + runs[1]) == pytest.approx(a100 / (a100 + t4), abs=0.05)
    assert runs[2] + runs[3] == 400


def test_rebalancing_evens_identical_pools() -> None:
    """Identical peers and stages: 3 of stage 2's peers gone, 9 peers in 4 stages end in
    pools of floor(9/4) and ceil(9/4), moved from the best-provisioned stage first."""
    def one(p: int, s: int) -> float:
        return 1.0

    stage_of = (0, 0, 0, 1, 1, 1, AWAY, AWAY, AWAY, 3, 3, 3)
    after = rebalanced(stage_of, 4, one)
    assert [len(pool) for pool in members(after, 4)] == [2, 2, 2, 3]
    assert after == (2, 0, 0, 2, 1, 1, AWAY, AWAY, AWAY, 3, 3, 3)
    assert rebalanced(after, 4, one) == after  # no move raises the lowest pool any more
    # a rejoining peer joins the thinnest pool (the lowest-numbered on a tie)
    back = after_event(after, (0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3), PeerEvent(5.0, 7, True),
                       4, one, rebalance=True)
    assert back[7] == 0 and [len(pool) for pool in members(back, 4)] == [3, 2, 2, 3]
    # without rebalancing, a peer leaves and rejoins its own stage only
    gone = after_event(after, after, PeerEvent(1.0, 9, False), 4, one, rebalance=False)
    assert gone[9] == AWAY and gone[:9] == after[:9]


def test_rebalancing_weighs_throughput() -> None:
    """A fast peer (4x) alone in stage 0 against three slow ones in stage 1: moving a slow
    peer to stage 0 lowers the minimum (stage 1 to 2) and is not made; losing the fast peer
    empties stage 0 and one slow peer moves."""
    speed = {0: 4.0, 1: 1.0, 2: 1.0, 3: 1.0}

    def rate(p: int, s: int) -> float:
        return speed[p]

    assert rebalanced((0, 1, 1, 1), 2, rate) == (0, 1, 1, 1)
    assert rebalanced((AWAY, 1, 1, 1), 2, rate) == (AWAY, 0, 1, 1)


def test_activation_compression_divides_pipeline_bytes() -> None:
    plain = simulate(build_experiment(_swarm([2, 2])))
    packed = simulate(build_experiment(_swarm([2, 2], activation_compression=2.0)))
    sizes = {i.nbytes for i in plain.program.instructions if isinstance(i, Send)}
    half = {i.nbytes for i in packed.program.instructions if isinstance(i, Send)}
    assert sizes == {2e6} and half == {1e6}
    assert packed.stats["step_time_s"] < plain.stats["step_time_s"]


def test_preemption_draws_are_seeded_and_extend() -> None:
    short = draw_peer_events(2.0, 300.0, 5, 8, 3600.0)
    long = draw_peer_events(2.0, 300.0, 5, 8, 7200.0)
    assert short == [e for e in long if e.at_s <= 3600.0]
    assert short != draw_peer_events(2.0, 300.0, 6, 8, 3600.0)
    for p in range(8):
        mine = [e for e in long if e.peer == p]
        assert [e.joins for e in mine] == [k % 2 == 1 for k in range(len(mine))]


def _run(rate: float | None, rebalance: bool = True, steps: int = 100) -> dict:
    data = _swarm([3, 3, 3, 3], rebalance=rebalance)
    data["model"] = {"synthetic": {"forward_ms": 2000.0, "backward_ms": 4000.0,
                                   "p2p_MB": 2.0, "grad_MB": 10.0}}
    data["training"] = {"global_batch_size": 12}
    if rate is not None:
        data["faults"] = {"preemption_rate_per_hour": rate, "rejoin_s": 300.0,
                          "preemption_seed": 2}
    return simulate_run(build_experiment(data), steps).stats


def test_throughput_degrades_gracefully_with_the_preemption_rate() -> None:
    speeds = [_run(rate)["time_to_train_s"] for rate in (None, 1.0, 4.0, 8.0)]
    assert speeds == sorted(speeds) and speeds[0] < speeds[-1]
    busy = _run(8.0)
    assert busy["swarm_run"]["peer_preemptions"] > 10
    assert {tuple(r["pools"]) for r in busy["run_segments"]} > {(3, 3, 3, 3)}


def test_without_rebalancing_an_empty_pool_waits() -> None:
    stats = _run(4.0, rebalance=False)
    assert stats["swarm_run"]["pool_empty_wait_s"] > 0
    assert stats["time_to_train_s"] > _run(4.0)["time_to_train_s"]


def test_runs_are_deterministic() -> None:
    from sim.cli import main

    outs = []
    for _ in range(2):
        exp = build_experiment(_swarm([2, 3, 2]) | {
            "faults": {"preemption_rate_per_hour": 30.0, "rejoin_s": 60.0}})
        outs.append(simulate_run(exp, 200).stats_json())
    assert outs[0] == outs[1]
    assert main(["run", str(EXAMPLE), "--json"]) == 0


@pytest.mark.parametrize(("change", "message"), [
    ({"parallel": {"pp": 2, "swarm": {"pools": [1, 2, 1]}}},
     "parallel.swarm.pools=[1, 2, 1]: 3 pools, but parallel.pp=2"),
    ({"parallel": {"pp": 2, "swarm": {"pools": [1, 2]}}},
     "parallel.swarm.pools=[1, 2] add up to 3 peers, not cluster.num_gpus = 4"),
    ({"parallel": {"pp": 2, "swarm": {"pools": [4, 0]}}}, "every stage needs at least one peer"),
    ({"parallel": {"pp": 2, "tp": 2, "swarm": {"pools": [2, 2]}}}, "parallel.tp=2"),
    ({"parallel": {"pp": 2, "dp": 2, "swarm": {"pools": [2, 2]}}}, "parallel.dp=2"),
    ({"parallel": {"pp": 2, "swarm": {"pools": [2, 2], "activation_compression": 0.5}}},
     "parallel.swarm.activation_compression: input should be greater than or equal to 1"),
    ({"parallel": {"pp": 2}, "faults": {"preemption_rate_per_hour": 1.0}},
     "faults.preemption_rate_per_hour=1: drawn preemptions strike the peers of parallel.swarm"),
    ({"parallel": {"pp": 2, "swarm": {"pools": [2, 2]}},
      "faults": {"preemptions": [{"node": 0, "policy": "stall"}]}},
     "faults.preemptions: not used with parallel.swarm"),
    ({"parallel": {"pp": 2, "swarm": {"pools": [2, 2]}}, "schedule": "zb-h2"},
     "schedule='zb-h2': its steps overlap"),
])
def test_bad_swarms_are_errors_naming_the_key(change: dict, message: str) -> None:
    data = _pipeline(4) | change
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_experiment(data)


def test_collapsed_fidelity_is_an_error() -> None:
    with pytest.raises(ConfigError, match="fidelity='collapsed': parallel.swarm"):
        simulate(build_experiment(_swarm([2, 2])), fidelity="collapsed")
