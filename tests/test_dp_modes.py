"""Parameter servers, local SGD and bounded staleness (sim/dpmodes.py): closed forms on a
latency-free switch, and H = 1 / S = 0 equal to synchronous data parallelism exactly."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import ConfigError
from sim.api import simulate
from sim.experiment import Experiment
from sim.faults_run import simulate_run
from workloads.multistep import is_dp_comm, without_dp

B = 10e9
"""Link bandwidth of the test switch, B/s."""
G = 100e6
"""Gradient bytes per worker (synthetic grad_MB = 100)."""


def _exp(workers: int, *, servers: int = 0, forward_ms: float = 1.0, backward_ms: float = 2.0,
         training: dict | None = None, parallel: dict | None = None, **top: Any) -> Experiment:
    """``workers`` DP replicas (two micro-batches each) on a latency-free switch of B/s
    links, plus ``servers`` parameter servers."""
    par: dict[str, Any] = {"zero_stage": 0, **(parallel or {})}
    if servers:
        par.update(dp_mode="parameter_server", ps_servers=servers)
    return Experiment.from_dict({
        "model": {"synthetic": {"forward_ms": forward_ms, "backward_ms": backward_ms,
                                "grad_MB": G / 1e6}},
        "cluster": {"topology": "switch", "num_gpus": workers + servers,
                    "link_bandwidth_GBps": B / 1e9, "link_latency_us": 0,
                    "collective_launch_us": 0},
        "parallel": par,
        "training": {"global_batch_size": 2 * workers, **(training or {})},
        **top,
    })


def _compute_s(forward_ms: float = 1.0, backward_ms: float = 2.0) -> float:
    return 2 * (forward_ms + backward_ms) * 1e-3


# ----------------------------------------------------------------------- parameter servers

@pytest.mark.parametrize(("workers", "servers"), [(2, 1), (4, 1), (4, 2), (8, 2), (2, 4)])
def test_parameter_server_step_is_compute_plus_push_and_pull_at_the_nic_bound(
        workers: int, servers: int) -> None:
    """Synchronous PS: each server's link carries W/K of a gradient in (pushes) and out
    (pulls), each worker's its gradient: push, then pull, at max(1, W/K)·G/B each."""
    res = simulate(_exp(workers, servers=servers))
    nic = max(1.0, workers / servers) * G / B
    assert res.stats["step_time_s"] == pytest.approx(_compute_s() + 2 * nic, rel=1e-9)
    assert res.stats["layout"]["dp"] == workers
    assert res.stats["num_gpus"] == workers + servers


@pytest.mark.parametrize(("workers", "servers", "forward_ms"), [
    (4, 1, 1.0), (8, 2, 1.0), (4, 2, 30.0), (2, 2, 1.0)])
def test_asynchronous_parameter_server_period_is_max_of_compute_and_nic_bound(
        workers: int, servers: int, forward_ms: float) -> None:
    """With enough staleness, pushes of one step overlap the pulls of the step before
    (full-duplex links) and compute: the period is max(compute, K servers' NIC bound)."""
    res = simulate(_exp(workers, servers=servers, forward_ms=forward_ms,
                        training={"max_staleness": 3}))
    nic = max(1.0, workers / servers) * G / B
    assert res.stats["step_time_s"] == pytest.approx(max(_compute_s(forward_ms), nic), rel=1e-9)


def test_a_parameter_server_saturates_where_ring_all_reduce_does_not() -> None:
    """At one server the PS's communication grows with the workers; the ring's stays
    2(W-1)/W·G/B."""
    ps = [simulate(_exp(w, servers=1)).stats["step_time_s"] for w in (2, 4, 8)]
    ring = [simulate(_exp(w)).stats["step_time_s"] for w in (2, 4, 8)]
    assert ps == pytest.approx([_compute_s() + 2 * w * G / B for w in (2, 4, 8)], rel=1e-9)
    assert ring == pytest.approx([_compute_s() + 2 * (w - 1) / w * G / B for w in (2, 4, 8)],
                                 rel=1e-9)


def test_parameter_server_pushes_and_pulls_are_flows_to_the_last_ranks() -> None:
    res = simulate(_exp(4, servers=2))
    sends = [ins for ins in res.program.instructions if is_dp_comm(ins)]
    assert len(sends) == 2 * 4 * 2  # a push and a pull per worker and server
    assert {ins.dst for ins in sends if "push" in ins.name} == {4, 5}
    assert {ins.gpu for ins in sends if "pull" in ins.name} == {4, 5}
    assert res.program.simulated_gpus == (0, 1, 2, 3)


@pytest.mark.parametrize(("changes", "message"), [
    ({"parallel": {"ps_servers": 2}},
     "parallel.ps_servers=2: only used with parallel.dp_mode: parameter_server"),
    ({"servers": 1, "parallel": {"zero_stage": 1}},
     "parallel.dp_mode='parameter_server': needs parallel.zero_stage: 0"),
    ({"servers": 1, "parallel": {"overlap_grad_reduce": True}},
     "parallel.dp_mode='parameter_server': not with parallel.overlap_grad_reduce"),
    ({"servers": 1, "training": {"sync_every": 4}},
     "training.sync_every=4: not with parallel.dp_mode: parameter_server"),
    ({"training": {"sync_every": 4}, "parallel": {"zero_stage": 1}},
     "training.sync_every=4: needs parallel.zero_stage: 0"),
    ({"training": {"max_staleness": 2}, "parallel": {"zero_stage": 2}},
     "training.max_staleness=2: needs parallel.zero_stage: 0"),
    ({"training": {"max_staleness": 2, "sync_every": 4}},
     "training.max_staleness=2: not with training.sync_every=4"),
    ({"training": {"sync_every": 0}}, "training.sync_every: input should be greater than"),
    ({"training": {"max_staleness": 17}}, "training.max_staleness: input should be less than"),
    ({"training": {"tokens_factor": 0}}, "training.tokens_factor: input should be greater"),
    ({"parallel": {"dp_mode": "gossip"}}, "parallel.dp_mode: input should be 'allreduce' or"),
    ({"servers": 1, "faults": {"preemptions": [{"node": 0, "at_s": 1.0, "policy": "rebalance"}]}},
     "faults.preemptions[0]: policy 'rebalance' is not supported with parallel.dp_mode"),
])
def test_bad_dp_modes_are_errors_naming_the_key(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _exp(4, **changes)
    assert str(info.value).startswith(message)


def test_parameter_servers_need_a_worker_left_and_full_fidelity() -> None:
    with pytest.raises(ConfigError, match=r"parallel.ps_servers=4: .* only cluster.num_gpus=4"):
        Experiment.from_dict({"model": {"synthetic": {"forward_ms": 1, "backward_ms": 1}},
                              "cluster": {"topology": "switch", "num_gpus": 4,
                                          "link_bandwidth_GBps": 1},
                              "parallel": {"zero_stage": 0, "dp_mode": "parameter_server",
                                           "ps_servers": 4},
                              "training": {"global_batch_size": 4}})
    with pytest.raises(ConfigError, match="fidelity='collapsed': parallel.dp_mode"):
        simulate(_exp(4, servers=1), fidelity="collapsed")


# ----------------------------------------------------------------------- local SGD

def _same_stats(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if k != "name"} == {
        k: v for k, v in b.items() if k != "name"}


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
def test_sync_every_one_is_synchronous_data_parallelism_exactly(fidelity: str) -> None:
    plain = _exp(4, parallel={"tp": 1})
    h1 = _exp(4, training={"sync_every": 1, "max_staleness": 0, "tokens_factor": 1.0})
    _same_stats(simulate(plain, fidelity=fidelity).stats, simulate(h1, fidelity=fidelity).stats)
    _same_stats(simulate_run(plain, 30).stats, simulate_run(h1, 30).stats)


@pytest.mark.parametrize("sync_every", [2, 10, 500])
def test_local_sgd_step_is_the_cycle_mean(sync_every: int) -> None:
    """H - 1 local steps (compute only) and one step with the ring all-reduce."""
    res = simulate(_exp(4, training={"sync_every": sync_every}))
    comm = 2 * 3 / 4 * G / B
    assert res.stats["local_step_time_s"] == pytest.approx(_compute_s(), rel=1e-12)
    assert res.stats["sync_step_time_s"] == pytest.approx(_compute_s() + comm, rel=1e-12)
    assert res.stats["step_time_s"] == pytest.approx(_compute_s() + comm / sync_every, rel=1e-9)
    assert res.stats["exposed_comm_s"]["dp"] == pytest.approx(comm / sync_every, rel=1e-9)
    run = simulate_run(_exp(4, training={"sync_every": sync_every}), 10 * sync_every)
    assert run.stats["time_to_train_s"] == pytest.approx(
        10 * sync_every * res.stats["step_time_s"], rel=1e-9)


def test_local_sgd_on_a_transformer_drops_only_dp_communication() -> None:
    from conftest import EXAMPLE
    exp = Experiment.from_yaml(EXAMPLE).with_changes({"parallel.zero_stage": 0})
    program = simulate(exp).program
    local = without_dp(program)
    assert not any(is_dp_comm(ins) for ins in local.instructions)
    kept = [ins for ins in program.instructions if not is_dp_comm(ins)]
    assert [(i.gpu, i.name) for i in local.instructions] == [(i.gpu, i.name) for i in kept]
    assert all(d < ins.id for ins in local.instructions for d in ins.deps)
    res = simulate(exp.with_changes({"training.sync_every": 8}))
    assert res.stats["local_step_time_s"] < res.stats["sync_step_time_s"]


def test_tokens_factor_stretches_the_run() -> None:
    base = simulate_run(_exp(4, training={"sync_every": 10}), 100).stats
    more = simulate_run(_exp(4, training={"sync_every": 10, "tokens_factor": 1.25}), 100).stats
    assert more["steps"] == 100 and more["steps_run"] == 125 and "steps_run" not in base
    assert more["time_to_train_s"] == pytest.approx(1.25 * base["time_to_train_s"], rel=1e-9)


# ----------------------------------------------------------------------- bounded staleness

@pytest.mark.parametrize(("staleness", "forward_ms"), [(1, 1.0), (2, 1.0), (1, 20.0)])
def test_stale_all_reduce_overlaps_the_next_steps(staleness: int, forward_ms: float) -> None:
    """Without a barrier the ring all-reduce of step k runs under step k+1's compute."""
    res = simulate(_exp(4, forward_ms=forward_ms, training={"max_staleness": staleness}))
    comm = 2 * 3 / 4 * G / B
    assert res.stats["step_time_s"] == pytest.approx(max(_compute_s(forward_ms), comm),
                                                     rel=1e-9)
    assert res.stats["steps_simulated"] == 2 * staleness + 3


def test_staleness_bounds_how_far_a_fast_worker_runs_ahead() -> None:
    """A straggler twice as slow sets the pace; a fast worker starts step k + S + 1 only
    after the slowest has finished step k, and does run ahead up to there."""
    for staleness in (1, 3):
        res = simulate(_exp(4, forward_ms=20.0, training={"max_staleness": staleness},
                            faults={"stragglers": [{"gpu": 3, "slowdown": 2.0}]}))
        assert res.stats["step_time_s"] == pytest.approx(2 * _compute_s(20.0), rel=1e-9)

        fast_f, slow_b = (sorted((s for s in res.timeline.spans if s.gpu == g and s.kind == k),
                                 key=lambda s: s.start_s) for g, k in ((0, "F"), (3, "B")))
        starts = [fast_f[2 * k].start_s for k in range(res.steps)]  # two micro-batches a step
        ends = [slow_b[2 * k + 1].end_s for k in range(res.steps)]
        for k in range(res.steps - staleness - 1):
            assert starts[k + staleness + 1] >= ends[k] - 1e-12
        assert any(starts[k + staleness] < ends[k] for k in range(res.steps - staleness))


# ----------------------------------------------------------------------- fast paths

@pytest.mark.parametrize("changes", [
    {"servers": 2}, {"servers": 1, "training": {"max_staleness": 2}},
    {"training": {"sync_every": 7}}, {"training": {"max_staleness": 1}},
    {"training": {"max_staleness": 2}, "parallel": {"overlap_grad_reduce": True}}])
def test_the_reference_paths_give_the_same_stats(changes: dict) -> None:
    """simulate(exp) equals simulate(exp, reference=True) in every DP mode."""
    exp = _exp(4, **changes)
    assert simulate(exp).stats == simulate(exp, reference=True).stats


def test_local_sgd_collapsed_equals_full_on_a_symmetric_layout() -> None:
    exp = _exp(4, training={"sync_every": 5})
    full, collapsed = (simulate(exp, fidelity=f).stats for f in ("full", "collapsed"))
    for key in ("step_time_s", "sync_step_time_s", "local_step_time_s"):
        assert collapsed[key] == pytest.approx(full[key], rel=1e-9)


def test_the_summary_shows_the_cycle_and_the_stretched_run() -> None:
    from sim.cli.run import summary_table
    stats = simulate_run(_exp(4, training={"sync_every": 10, "tokens_factor": 1.25}), 100).stats
    text = summary_table(stats)
    rows = {line[:20].strip(): line[21:] for line in text.splitlines()}
    assert rows["local SGD"] == "sync every 10 steps: sync step 21.000 ms, local step 6.000 ms"
    assert rows["steps run"] == "125 (tokens_factor 1.25)"
    assert "local SGD" not in summary_table(simulate_run(_exp(4), 100).stats)
