"""Blocks of lanes completed in one step (:mod:`sim.lanes`, :meth:`sim.engine._Run._stepper`)
against one by one: :func:`sim.lanes.lane_blocks` equals its loop on random DAGs, and runs
with and without stepping are identical (statistics as ``stats.json`` writes them, the
timeline's records, every instruction's times bit for bit and the engine's counters) on
random experiments and on a TP-8 GPT-3 run where nearly every instruction is stepped."""

from __future__ import annotations

from array import array
from dataclasses import replace

import pytest
from conftest import observed_full_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import experiments, link_changes

from sim.experiment import Experiment, build_experiment
from sim.lanes import MAX_LANES, lane_blocks, lane_blocks_reference


@st.composite
def dags(draw: st.DrawFn) -> tuple[array, array, array]:
    """Templates and successor lists, with lane-shifted blocks planted (so that both
    outcomes occur): runs of one template whose successors are the run's first's shifted,
    some broken at one place, some lists unsorted, repeated or long."""
    n = draw(st.integers(0, 60))
    tpl = [draw(st.integers(0, 3)) for _ in range(n)]
    lists = [draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=6)) if n else []
             for _ in range(n)]
    for _ in range(draw(st.integers(0, 4)) if n > 4 else 0):
        size = draw(st.integers(2, 6))
        b = draw(st.integers(0, max(n - size, 0)))
        heads = sorted(set(draw(st.lists(st.integers(0, n - 1), max_size=3))))
        heads = [h for h in heads if h + size <= n]
        for k in range(min(size, n - b)):
            tpl[b + k] = tpl[b]
            lists[b + k] = [h + k for h in heads]
            for h in heads:
                tpl[h + k] = tpl[h]
        if draw(st.booleans()) and heads:  # one place broken
            lists[b + size // 2 if b + size // 2 < n else b] = heads[::-1]
    first = array("q", [0])
    for successors in lists:
        first.append(first[-1] + len(successors))
    return array("i", tpl), array("i", [s for x in lists for s in x]), first


@settings(max_examples=400, derandomize=True, deadline=None)
@given(dags())
def test_lane_blocks_equal_the_reference(dag: tuple[array, array, array]) -> None:
    assert lane_blocks(*dag) == lane_blocks_reference(*dag)


def test_lane_blocks_cut_long_runs() -> None:
    """A run longer than :data:`MAX_LANES` is cut into blocks of at most that many."""
    n = MAX_LANES + 10
    tpl = array("i", [0] * n + [1] * n)
    succ = array("i", range(n, 2 * n))
    first = array("q", list(range(n + 1)) + [n] * n)
    out = lane_blocks(tpl, succ, first)
    assert out == lane_blocks_reference(tpl, succ, first)
    assert out[0] == out[n] == MAX_LANES and out[MAX_LANES] == out[n + MAX_LANES] == 10
    assert sum(1 for x in out if x) == 4  # the lanes, and their successors (none after)


@settings(max_examples=60, derandomize=True, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(experiments())
def test_stepped_lanes_equal_one_by_one(data: dict) -> None:
    """Random experiments (every schedule, stragglers, mixed GPUs, link faults): the same
    statistics, records, times and counters with blocks of lanes stepped and without."""
    exp = build_experiment(data)
    changes = link_changes(exp)
    stepped = observed_full_run(exp, changes)
    assert stepped[:3] == observed_full_run(exp, changes, stepping=False)[:3]


@pytest.mark.parametrize("tp", [2, 8])
def test_stepped_tp_groups_equal_one_by_one(tp: int) -> None:
    """GPT-3 175B on DGX A100 with TP ``tp``: nearly every block of TP lanes is stepped, and
    the run is the one without stepping, byte for byte (the pipeline sends beside the
    compute). With the default profile's blocking sends (Megatron-LM's 1F1B exchange: a
    ``pp wait`` and a ``pp recv`` a message on every lane) the same run both ways, somewhat
    fewer instructions stepped (89.6% and 89.8%)."""
    exp = Experiment.from_dict({
        "name": "lanes", "model": {"preset": "gpt3-175b"},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": tp * 8 * 2},
        "parallel": {"tp": tp, "pp": 8, "dp": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 16}})
    blocked = observed_full_run(exp, [])
    assert blocked[:3] == observed_full_run(exp, [], stepping=False)[:3]
    exp = replace(exp, costs=replace(exp.costs, pp_send_blocking=False))
    stepped = observed_full_run(exp, [])
    assert stepped[:3] == observed_full_run(exp, [], stepping=False)[:3]
    assert stepped[3][0] * tp > 0.9 * stepped[2][1]  # most instructions in stepped blocks
