"""sim.budget: the memory it charges a run against what the run takes.

The charges per instruction are measured (``benchmarks/budget.py``, ``sim/data/budget.toml``);
here a run the budget admits is simulated in a fresh process and its peak resident memory
above what it held before the simulation must stay under the budget's estimate, for each
representation the run may hold its program in.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT

from sim import budget


def _gpt_1_3b(global_batch: int) -> dict:
    return {"name": "budget", "model": {"preset": "gpt3-1.3b", "seq_length": 2048},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": 128},
            "parallel": {"tp": 2, "pp": 4, "dp": 16},
            "training": {"micro_batch_size": 1, "global_batch_size": global_batch}}


@pytest.mark.parametrize(("case", "representation"), [("175b-256", "packed"),
                                                      ("1.3b-128-x2", "tuples"),
                                                      ("1.3b-128-local-sgd", "packed +copy")])
def test_an_admitted_run_takes_less_than_its_estimate(case: str, representation: str) -> None:
    """Cases of ``benchmarks/budget.py``: GPT-3 175B, TP8 PP8 DP4 on 256 A100, one step
    (~230,000 instructions, ~69 MB at 300 B; measured ~190 B); GPT-3 1.3B, TP2 PP4 DP16 on
    128, two steps of 32 micro-batches (~483,000, ~242 MB at 500 B; measured ~415 B), and
    local SGD, one step of 32 and its copy without DP (~242,000, ~193 MB at 800 B;
    measured ~525 B)."""
    out = subprocess.run([sys.executable, "benchmarks/budget.py", "--case", case],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["representation"] == representation
    assert row["estimated"] * row["charge"] <= budget.MAX_PROGRAM_BYTES
    assert 0 < row["bytes_per_instruction"] <= row["charge"], row


def test_the_charges_are_the_data_files() -> None:
    with budget.DATA_FILE.open("rb") as fh:
        data = tomllib.load(fh)
    for rep in budget.REPRESENTATIONS:
        assert budget.BYTES_PER_INSTRUCTION[rep] == data[rep]["bytes_per_instruction"]
        assert (budget.ZERO3_BYTES_PER_INSTRUCTION[rep]
                == data[rep]["zero3_bytes_per_instruction"])
    # every measured run is under the charge the tables give it
    for row in data["measured"]:
        rep, *rest = row["representation"].split()
        table = (budget.ZERO3_BYTES_PER_INSTRUCTION if "zero3" in rest
                 else budget.BYTES_PER_INSTRUCTION)
        charge = table[rep] + (table["tuples"] if "+copy" in rest else 0)
        assert row["bytes_per_instruction"] <= row["charged"] == charge, row


def test_one_step_is_packed_and_the_rest_named_tuples() -> None:
    from sim.experiment import Experiment

    exp = Experiment.from_dict(_gpt_1_3b(64))
    one, two = budget.estimate(exp, 1), budget.estimate(exp, 2)
    assert one.representation("full") == "packed"
    assert one.representation("full", packs=False) == "tuples"  # reference; sim.jobs
    assert one.representation("collapsed") == "tuples"
    assert two.representation("full") == "tuples"
    assert one.charge("full") < two.charge("full")
    zero3 = budget.estimate(exp.with_changes({"parallel.zero_stage": 3}), 1)
    assert zero3.zero3 and zero3.charge("full") > one.charge("full")
    local = budget.estimate(exp.with_changes({"parallel.zero_stage": 0,
                                              "training.sync_every": 4}), 1)
    assert local.copies and local.representation("full") == "packed"
    assert local.charge("full") == one.charge("full") + two.charge("full")


def _counted_by_op_segments(exp: object) -> float:
    """:func:`sim.budget._op_instructions` on the cost model's named segments (its
    reference: the fast path counts a transformer's unnamed ones, :meth:`op_work`)."""
    from sim.budget import RingAttention  # as the budget reads them
    from workloads.schedules import Op

    sched, costs = exp.schedule, exp.costs  # type: ignore[attr-defined]
    total = 0.0
    for (stage, kind, seq), ops in sched.op_counts.items():
        segs = costs.op_segments(Op(stage, kind, 0, seq), sched.split_backward, markers=True)
        total += ops * (sum(2 * seg.steps if isinstance(seg, RingAttention) else 1
                            for seg in segs) + 2)
    return total


@pytest.mark.parametrize("path", sorted((ROOT / "workloads" / "examples").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_the_instruction_count_is_that_of_the_named_segments(path: object) -> None:
    """Every bundled example: the budget's count of the op instructions from unnamed layers
    equals the count from the named segments, float for float."""
    import yaml

    from sim.experiment import Experiment

    data = yaml.safe_load(path.read_text(encoding="utf-8"))  # type: ignore[attr-defined]
    if "model" not in data or "jobs" in data:  # a cluster file, a file of several jobs
        pytest.skip("not a single experiment")
    exp = Experiment.from_yaml(path)  # type: ignore[arg-type]
    assert budget._op_instructions(exp) == _counted_by_op_segments(exp)
