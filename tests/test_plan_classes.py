"""The engine's collective plans shared by class (:meth:`sim.engine._Run._plan_for`: a new
group's plan that of an earlier group of its class, relabelled, through
:meth:`sim.commtime.CollectiveTimer._plans`) against planning every group with
:func:`sim.selection.collective_plan` (:attr:`sim.engine._Run.share_plans` False, the
reference): the same statistics, records, every instruction's three times bit for bit and the
engine's counters, on random experiments (every schedule, stragglers, mixed GPUs, link
faults, cluster shapes), and on GPT-3 175B, where every plan the run made equals
``collective_plan``'s of its spec and most were shared."""

from __future__ import annotations

import pytest
from conftest import engine_switch, observed_full_run
from hypothesis import HealthCheck, given, settings
from strategies import experiments, link_changes

from sim import engine
from sim.experiment import Experiment, build_experiment
from sim.selection import collective_plan


def _observed(exp: Experiment, changes: list, share: bool) -> tuple:
    with engine_switch("share_plans", share):
        return observed_full_run(exp, changes)


@settings(max_examples=40, derandomize=True, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(experiments())
def test_shared_plans_equal_planning_each_group(data: dict) -> None:
    """Random experiments: the same statistics, records, times and counters either way."""
    exp = build_experiment(data)
    changes = link_changes(exp)
    assert _observed(exp, changes, True) == _observed(exp, changes, False)


@pytest.mark.parametrize(("cluster", "most"), [
    ({"preset": "dgx-a100-80g"}, True),
    ({"preset": "dgx-h100"}, True),
    ({"preset": "dgx-a100-80g", "topology": "fat-tree", "gpus_per_leaf": 16,
      "oversubscription": 2.0}, False),
])
def test_shared_plans_on_gpt3(cluster: dict, most: bool, monkeypatch: pytest.MonkeyPatch
                              ) -> None:
    """GPT-3 175B, TP 8, PP 4, DP 4 on 128 GPUs: the same run either way; every plan the run
    kept equals ``collective_plan``'s of its spec, and on one crossbar of servers (every
    server a twin of every other) most were another group's relabelled."""
    exp = Experiment.from_dict({
        "name": "classes", "model": {"preset": "gpt3-175b"},
        "cluster": {**cluster, "num_gpus": 128},
        "parallel": {"tp": 8, "pp": 4, "dp": 4},
        "training": {"micro_batch_size": 1, "global_batch_size": 16}})
    runs: list[engine._Run] = []
    made = engine._Run.__init__

    def kept(self: engine._Run, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)  # type: ignore[arg-type]
        runs.append(self)

    monkeypatch.setattr(engine._Run, "__init__", kept)
    ours = _observed(exp, [], True)
    run = runs[-1]
    shared = sum(timer.shared_plans for timer in run._timers.values())
    assert shared > len(run._plans) // 2 if most else shared >= 0
    for spec, plan in run._plans.items():
        assert plan == collective_plan(run.cluster, *spec[:4], None, spec[4])
    assert ours == _observed(exp, [], False)
