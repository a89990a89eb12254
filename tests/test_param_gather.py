"""``parallel.overlap_param_gather`` (Megatron-LM ``--overlap-param-gather``): ZeRO-1/2's
parameter all-gather moves from after the optimizer step to each stage's first forward of
the step, as Megatron-core r0.8.0 does it: stage 0 bucket by bucket (here layer by layer),
every other stage as one bucket, each rank's all-gathers one chain dispatched from the
step's start; the settings Megatron refuses are refused."""

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
        "training": {"micro_batch_size": 1, "num_microbatches": 4, "precision": "fp16"}}
"""fp16: Megatron-LM's 2-byte gradients, so the step-end all-gather (dp_wire_bytes) moves the
parameters' 2 bytes as the per-layer gathers do (under bf16 the profile's 3 averages the fp32
reduce-scatter and the bf16 all-gather of its two step-end collectives)."""


def _exp(**parallel) -> dict:
    data = copy.deepcopy(BASE)
    data["parallel"].update(parallel)
    return data


def _dp_gathers(result: api.Result) -> list[Collective]:
    return [i for i in result.program.instructions
            if isinstance(i, Collective) and i.kind == "dp" and i.op == "all_gather"]


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
def test_gathers_move_into_the_first_forwards(fidelity: str) -> None:
    """Without it one all-gather per pipeline rank follows the optimizer; with it stage 0's
    layers are gathered one by one as its first forward reaches them, and stage 1 (like
    every stage after the first) is gathered whole: Megatron-core buckets pipeline rank
    0's first model chunk only (megatron/core/distributed/distributed_data_parallel.py,
    DistributedDataParallel.__init__: bucket_size = None on pipeline ranks above 0). The
    same bytes in all, and the step is no longer for it (the gathers overlap compute)."""
    off = api.simulate(build_experiment(_exp()), fidelity=fidelity)
    on = api.simulate(build_experiment(_exp(overlap_param_gather=True)), fidelity=fidelity)
    assert {g.name for g in _dp_gathers(off)} == {"param all_gather"}
    names = {g.name for g in _dp_gathers(on)}
    assert names == {"0F0 L0 params all_gather", "0F0 L1 params all_gather",
                     "1F0 stage1 params all_gather"}
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


def _gather_spans(result: api.Result, stage: int) -> list:
    return sorted((s for s in result.timeline.spans
                   if s.stream == "dp" and s.stage == stage and "params all_gather" in s.name),
                  key=lambda s: s.start_s)


def _first_forward(result: api.Result, stage: int) -> tuple[float, float]:
    """(start, end) of the stage's first forward (its compute spans, one per piece)."""
    spans = [s for s in result.timeline.spans
             if s.stream == "compute" and s.kind == "F" and s.stage == stage and s.mb == 0]
    return min(s.start_s for s in spans), max(s.end_s for s in spans)


def test_later_stages_gather_from_the_step_start() -> None:
    """A stage after the first does not wait for its input to gather: its one bucket's
    all-gather is dispatched at the step's start (megatron/core/optimizer/distrib_optimizer.py
    DistributedOptimizer.zero_grad dispatches handle 0 before the forward-backward), so it
    runs while stage 0's first forward is still gathering, on other GPUs."""
    res = api.simulate(build_experiment(_exp(overlap_param_gather=True)), fidelity="collapsed")
    (whole,) = _gather_spans(res, 1)
    assert whole.start_s == 0.0
    assert whole.start_s < _first_forward(res, 0)[1] <= _first_forward(res, 1)[0]


def test_interleaved_chunks_chain_their_gathers() -> None:
    """Interleaved (vpp 2): a rank's second model chunk is one bucket, its all-gather
    dispatched when the first chunk's forward waits for its last bucket
    (DistributedOptimizer._finish_param_sync_helper dispatches handle i + 1), so it is under
    way before that chunk's first forward ends, not when the second chunk's starts."""
    data = _exp(overlap_param_gather=True, vpp=2)
    data["model"]["num_layers"] = 8
    data["schedule"] = "interleaved"
    res = api.simulate(build_experiment(data), fidelity="collapsed")
    assert [s.name for s in _gather_spans(res, 2)] == ["2F0 stage2 params all_gather"]
    (chunk1,) = _gather_spans(res, 2)  # rank 0's second chunk
    assert chunk1.start_s < _first_forward(res, 0)[1]
    (rank1_chunk1,) = _gather_spans(res, 3)
    (rank1_chunk0,) = _gather_spans(res, 1)
    assert rank1_chunk0.end_s <= rank1_chunk1.start_s < _first_forward(res, 1)[1]
