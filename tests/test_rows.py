"""Rows of lane blocks (the DP replicas' copies of a TP group's block) completed in one step
(:mod:`sim.rows`) against block by block (:attr:`sim.engine._Run.rows` False, the
reference) and one by one (``stepping`` False): the same statistics as ``stats.json`` writes
them, the timeline's records, every instruction's three times bit for bit and the engine's
counters, on random experiments (every schedule, stragglers, mixed GPUs, link faults) and on
GPT-3 175B runs where nearly every block steps in a row, with and without a straggler or a
degraded link that makes the replicas differ."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import observed_full_run
from hypothesis import HealthCheck, given, settings
from strategies import experiments, link_changes

from sim.experiment import Experiment, build_experiment


@settings(max_examples=60, derandomize=True, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(experiments())
def test_rows_equal_block_by_block(data: dict) -> None:
    """Random experiments: the same statistics, records, times and counters with rows, block
    by block and one by one."""
    exp = build_experiment(data)
    changes = link_changes(exp)
    rows = observed_full_run(exp, changes, True, True)
    assert rows[:3] == observed_full_run(exp, changes, True, False)[:3]
    assert rows[:3] == observed_full_run(exp, changes, False, False)[:3]


def _gpt3(dp: int, **extra: object) -> Experiment:
    return Experiment.from_dict({
        "name": "rows", "model": {"preset": "gpt3-175b"},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 8 * 4 * dp},
        "parallel": {"tp": 8, "pp": 4, "dp": dp},
        "training": {"micro_batch_size": 1, "global_batch_size": 4 * dp}, **extra})


@pytest.mark.parametrize("dp", [2, 4])
def test_rows_of_gpt3_replicas(dp: int) -> None:
    """GPT-3 175B, TP 8, PP 4, DP ``dp``: nearly every block steps in a row of ``dp``, and
    the run is the one block by block and one by one, byte for byte (the pipeline sends
    beside the compute; with the default profile's blocking sends, Megatron-LM's 1F1B
    exchange, the same run all three ways, fewer blocks in rows)."""
    exp = _gpt3(dp)
    blocked = observed_full_run(exp, [], True, True)
    assert blocked[:3] == observed_full_run(exp, [], True, False)[:3] == observed_full_run(
        exp, [], False, False)[:3]
    exp = replace(exp, costs=replace(exp.costs, pp_send_blocking=False))
    rows = observed_full_run(exp, [], True, True)
    blocks = observed_full_run(exp, [], True, False)
    assert rows[:3] == blocks[:3] == observed_full_run(exp, [], False, False)[:3]
    assert rows[3][0] == blocks[3][0]  # the same blocks stepped, now in rows
    # most of them in rows (96.6% at DP 2, 97.5% at DP 4): the backward all-reduces of
    # fixed exposed times (tp_async_grad_all_reduce, sim.tpoverlap) end at one instant on
    # every replica and release their members as one list (73% while each ended alone)
    assert rows[3][1] * dp > 0.9 * rows[3][0]
    assert blocks[3][1] == 0


def test_rows_with_a_straggler() -> None:
    """A straggler: the timer reads the GPU, so no compute op starts in a row (rows that free
    only collective members or nothing still step), and the run is the reference's."""
    exp = _gpt3(4, faults={"stragglers": [{"gpu": 9, "slowdown": 1.25}]})
    rows = observed_full_run(exp, [], True, True)
    assert rows[:3] == observed_full_run(exp, [], True, False)[:3] \
        == observed_full_run(exp, [], False, False)[:3]


def test_rows_with_a_slow_link() -> None:
    """A link of one replica degraded mid-step: its collectives end later, its blocks leave
    the rows (unequal counters, ids no longer in rows), and the run is the reference's."""
    exp = _gpt3(4)
    links = [k for k, ends in enumerate(exp.cluster.links) if "gpu40" in ends]
    changes = [(0.05, {k: exp.cluster.link_bandwidth_Bps[k] * 0.25 for k in links})]
    rows = observed_full_run(exp, changes, True, True)
    assert rows[:3] == observed_full_run(exp, changes, True, False)[:3] \
        == observed_full_run(exp, changes, False, False)[:3]
