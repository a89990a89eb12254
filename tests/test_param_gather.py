"""``parallel.overlap_param_gather`` (Megatron-LM ``--overlap-param-gather``): ZeRO-1/2's
parameter all-gather moves from after the optimizer step to each stage's first forward of
the step, layer by layer; the settings Megatron refuses are refused."""

from __future__ import annotations

import copy

import pytest

from base.errors import ConfigError
from sim import api
from sim.experiment import build_experiment
from workloads.program import Collective

BASE = {"name": "pg", "model": {"preset": "llama2-13b", "num_layers": 4, "seq_length": 2048},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
        "parallel": {"tp": 2, "pp": 2, "sequence_parallel": True, "overlap_grad_reduce": True},
        "training": {"micro_batch_size": 1, "num_microbatches": 4}}


def _exp(**parallel) -> dict:
    data = copy.deepcopy(BASE)
    data["parallel"].update(parallel)
    return data


def _dp_gathers(result: api.Result) -> list[Collective]:
    return [i for i in result.program.instructions
            if isinstance(i, Collective) and i.kind == "dp" and i.op == "all_gather"]


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
def test_gathers_move_into_the_first_forwards(fidelity: str) -> None:
    """Without it one all-gather per pipeline rank follows the optimizer; with it each layer
    (and the head) of a stage is gathered before the stage's first forward reaches it, the
    same bytes in all, and the step is no longer for it (the gathers overlap compute)."""
    off = api.simulate(build_experiment(_exp()), fidelity=fidelity)
    on = api.simulate(build_experiment(_exp(overlap_param_gather=True)), fidelity=fidelity)
    assert {g.name for g in _dp_gathers(off)} == {"param all_gather"}
    names = {g.name for g in _dp_gathers(on)}
    assert names == {"0F0 L0 params all_gather", "0F0 L1 params all_gather",
                     "1F0 L2 params all_gather", "1F0 L3 params all_gather",
                     "1F0 head params all_gather"}
    assert sum(g.nbytes for g in _dp_gathers(on)) == pytest.approx(
        sum(g.nbytes for g in _dp_gathers(off)))
    assert on.stats["step_time_s"] < off.stats["step_time_s"]
    assert on.stats["exposed_comm_s"]["dp"] < off.stats["exposed_comm_s"]["dp"]


def test_collapsed_reference_and_full_agree() -> None:
    exp = build_experiment(_exp(overlap_param_gather=True))
    collapsed = api.simulate(exp, fidelity="collapsed").stats["step_time_s"]
    assert api.simulate(exp, fidelity="collapsed", reference=True).stats["step_time_s"] == \
        collapsed
    assert api.simulate(exp, fidelity="full").stats["step_time_s"] == pytest.approx(
        collapsed, rel=5e-3)


def test_without_data_parallelism_nothing_changes() -> None:
    one = {"cluster": {"preset": "dgx-h100", "num_gpus": 4}}
    a = api.simulate(build_experiment(_exp() | one)).stats
    b = api.simulate(build_experiment(_exp(overlap_param_gather=True) | one)).stats
    assert a == b


@pytest.mark.parametrize("parallel", [
    {"overlap_param_gather": True, "overlap_grad_reduce": False},
    {"overlap_param_gather": True, "zero_stage": 0},
    {"overlap_param_gather": True, "zero_stage": 3},
])
def test_refused_as_megatron_refuses_it(parallel: dict) -> None:
    with pytest.raises(ConfigError, match="parallel.overlap_param_gather"):
        build_experiment(_exp(**parallel))
