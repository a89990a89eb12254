"""A packed full program's compute ops timed once per work (:meth:`sim.engine._Run._compute_times`
keeps each (duration, total) per its template's ``rest`` value) against timing each
template's op (:attr:`sim.engine._Run.memo_work` False, the reference): the same statistics,
records, every instruction's three times bit for bit and the engine's counters, on random
experiments (every schedule, stragglers, mixed GPUs, link faults) and on a GPT-3 175B run,
where the memo times far fewer ops than there are compute templates."""

from __future__ import annotations

import pytest
from conftest import engine_switch, observed_full_run
from hypothesis import HealthCheck, given, settings
from strategies import experiments, link_changes

from sim import engine
from sim.experiment import Experiment, build_experiment


def _observed(exp: Experiment, changes: list, memo: bool) -> tuple:
    with engine_switch("memo_work", memo):
        return observed_full_run(exp, changes)[:3]


@settings(max_examples=40, derandomize=True, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(experiments())
def test_work_memo_equals_per_template(data: dict) -> None:
    """Random experiments: the same statistics, records, times and counters either way."""
    exp = build_experiment(data)
    changes = link_changes(exp)
    assert _observed(exp, changes, True) == _observed(exp, changes, False)


@pytest.mark.parametrize("blocking", [True, False])
def test_work_memo_on_gpt3(blocking: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-3 175B, TP 8, PP 4, DP 2 (with and without Megatron-LM's blocking sends, whose
    waits are compute ops of their own templates): the same run either way, and the memo
    makes fewer ops (sends and ops timed: ``PackedInstructions._make``) than the reference."""
    from dataclasses import replace

    exp = Experiment.from_dict({
        "name": "memo", "model": {"preset": "gpt3-175b"},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 64},
        "parallel": {"tp": 8, "pp": 4, "dp": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 8}})
    if not blocking:
        exp = replace(exp, costs=replace(exp.costs, pp_send_blocking=False))
    calls = {True: 0, False: 0}
    memo = [True]
    made = engine.PackedInstructions._make

    def counted(self: object, i: int) -> object:
        calls[memo[0]] += 1
        return made(self, i)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.PackedInstructions, "_make", counted)
    ours = _observed(exp, [], True)
    memo[0] = False
    theirs = _observed(exp, [], False)
    assert ours == theirs
    assert calls[True] < calls[False]
